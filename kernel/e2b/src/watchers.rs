//! The watchers made with `CreateWatcher`: each is a kernel watch, read
//! a call at a time with `GetWatcherEvents`, so the face remembers how
//! far each was read and the directory it watches (events are named
//! from it). A watcher the face does not know (made before it started)
//! is read from its oldest event kept.

use std::collections::HashMap;

use agentos_proto::payload::DelegateName;

/// Watchers remembered at most; the kernel holds at most 1024 watches.
const MAX_WATCHERS: usize = 1024;

/// Which watcher: its key's delegate, its sandbox, its watch.
type WatcherKey = (DelegateName, String, String);

#[derive(Debug)]
struct Watcher {
    read_to: u64,
    root: String,
    made: u64,
}

/// Every watcher's place.
#[derive(Debug, Default)]
pub struct Watchers {
    watchers: HashMap<WatcherKey, Watcher>,
    made: u64,
}

impl Watchers {
    /// A new watcher of `root`, read from its start; the oldest is
    /// forgotten past the bound.
    pub fn begin(&mut self, delegate: DelegateName, sandbox: &str, watch: &str, root: String) {
        if self.watchers.len() >= MAX_WATCHERS {
            if let Some(oldest) = self
                .watchers
                .iter()
                .min_by_key(|(_, watcher)| watcher.made)
                .map(|(key, _)| key.clone())
            {
                self.watchers.remove(&oldest);
            }
        }
        self.made += 1;
        let watcher = Watcher {
            read_to: 0,
            root,
            made: self.made,
        };
        self.watchers
            .insert((delegate, sandbox.to_owned(), watch.to_owned()), watcher);
    }

    /// Where the watcher's next read starts, and the directory it
    /// watches (`/`, naming events by their whole path, if unknown).
    pub fn place(&self, delegate: DelegateName, sandbox: &str, watch: &str) -> (u64, String) {
        self.watchers
            .get(&(delegate, sandbox.to_owned(), watch.to_owned()))
            .map_or((0, "/".to_owned()), |watcher| {
                (watcher.read_to, watcher.root.clone())
            })
    }

    /// The watcher was read up to `offset`.
    pub fn read_to(&mut self, delegate: DelegateName, sandbox: &str, watch: &str, offset: u64) {
        let key = (delegate, sandbox.to_owned(), watch.to_owned());
        if let Some(watcher) = self.watchers.get_mut(&key) {
            watcher.read_to = offset;
        }
    }

    pub fn end(&mut self, delegate: DelegateName, sandbox: &str, watch: &str) {
        self.watchers
            .remove(&(delegate, sandbox.to_owned(), watch.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_is_read_on_from_where_it_was_left_and_another_keys_is_apart() {
        let mut watchers = Watchers::default();
        let alice = DelegateName::new("e2b.alice").unwrap();
        let bob = DelegateName::new("e2b.bob").unwrap();
        watchers.begin(alice, "sb", "w-1", "/home/user".into());
        assert_eq!(watchers.place(alice, "sb", "w-1"), (0, "/home/user".into()));
        watchers.read_to(alice, "sb", "w-1", 7);
        assert_eq!(watchers.place(alice, "sb", "w-1").0, 7);
        assert_eq!(watchers.place(bob, "sb", "w-1"), (0, "/".into()));
        watchers.end(alice, "sb", "w-1");
        assert_eq!(watchers.place(alice, "sb", "w-1").0, 0);
        for n in 0..MAX_WATCHERS + 5 {
            watchers.begin(alice, "sb", &format!("w-{n}"), "/".into());
        }
        assert_eq!(watchers.watchers.len(), MAX_WATCHERS);
    }
}
