//! What the user of `agentos top` picks: the view, the agents' order,
//! and the keys that pick them.

use super::terminal::Wake;

/// The agents' order: live ones first, then by this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Spawn order.
    Id,
    /// CPU %, busiest first.
    Cpu,
    /// Memory in use, largest first.
    Mem,
    /// Name, A to Z.
    Name,
    /// Restarts, most first.
    Restarts,
}

/// Which view is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pane {
    /// The agents: state, CPU, memory, restarts, tokens, EXEC runs.
    Agents,
    /// Background tasks: kind, state, age, label, last output.
    Tasks,
    /// MCP tool servers: state, tools, error.
    Servers,
}

impl Pane {
    fn next(self) -> Pane {
        match self {
            Pane::Agents => Pane::Tasks,
            Pane::Tasks => Pane::Servers,
            Pane::Servers => Pane::Agents,
        }
    }
}

/// What a key does in the live view, if anything.
pub fn apply_key(key: u8, sort: &mut SortKey, pane: &mut Pane) -> Wake {
    let new_sort = match key {
        b'c' => Some(SortKey::Cpu),
        b'm' => Some(SortKey::Mem),
        b'n' => Some(SortKey::Name),
        b'r' => Some(SortKey::Restarts),
        b'i' => Some(SortKey::Id),
        _ => None,
    };
    if let Some(new_sort) = new_sort {
        *sort = new_sort;
        *pane = Pane::Agents;
        return Wake::Redraw;
    }
    let new_pane = match key {
        b'a' => Pane::Agents,
        b't' => Pane::Tasks,
        b's' => Pane::Servers,
        b'\t' => pane.next(),
        _ => return Wake::Redraw,
    };
    *pane = new_pane;
    // A view's own figures come with the next sample.
    Wake::Refresh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_redraw_and_view_keys_fetch_the_view() {
        let (mut sort, mut pane) = (SortKey::Id, Pane::Tasks);
        assert_eq!(apply_key(b'm', &mut sort, &mut pane), Wake::Redraw);
        assert_eq!((sort, pane), (SortKey::Mem, Pane::Agents));
        assert_eq!(apply_key(b't', &mut sort, &mut pane), Wake::Refresh);
        assert_eq!(pane, Pane::Tasks);
        assert_eq!(apply_key(b'\t', &mut sort, &mut pane), Wake::Refresh);
        assert_eq!(pane, Pane::Servers);
        assert_eq!(apply_key(b'\t', &mut sort, &mut pane), Wake::Refresh);
        assert_eq!(pane, Pane::Agents);
        assert_eq!(apply_key(b'z', &mut sort, &mut pane), Wake::Redraw);
        assert_eq!(sort, SortKey::Mem, "an unknown key changes nothing");
    }
}
