//! `agentos top`: a live view of the agents, the tasks or the tool
//! servers, refreshed each second.
//!
//! Each refresh is one HELLO (for the header), one LIST (the agents'
//! totals, and the agents view), and in the tasks view one TASK list, in
//! the servers view one TOOL list. An agent's CPU % is the growth of its
//! `cpu.usage_usec` between two refreshes over the wall-clock time between
//! them, so 100% is one core kept busy; the first screen has no earlier
//! sample and shows `-`. `--once`, `--json`, or a stdout or stdin that is
//! not a terminal, takes two samples one interval apart and prints the
//! second, so that a script sees measured CPU figures too.
//!
//! Keys: `c` `m` `n` `r` `i` sort the agents by CPU, memory, name,
//! restarts or id; `a` `t` `s` show agents, tasks or servers, Tab the next
//! view; `q` quits.

mod agents;
mod panes;
mod terminal;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::HelloReply;
use agentos_proto::{Client, Opcode};
use anyhow::Context;
use serde_json::{json, Value};

use crate::failure::usage;
use agents::Entry;
use terminal::{draw, terminal_size, wait_for_key, Screen, Wake};

/// `agentos top`'s options.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Print one snapshot as plain text and exit, as when stdout is not a
    /// terminal; it samples twice, one interval apart, to measure CPU %
    #[arg(long)]
    once: bool,
    /// Seconds between refreshes
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    interval: f64,
    /// How the agents are ordered (keys c, m, n, r, i in the live view)
    #[arg(long, value_enum, default_value_t = SortKey::Id)]
    sort: SortKey,
    /// What to show (keys a, t, s and Tab in the live view)
    #[arg(long, value_enum, default_value_t = Pane::Agents)]
    view: Pane,
}

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
fn apply_key(key: u8, sort: &mut SortKey, pane: &mut Pane) -> Wake {
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

/// Runs the view until `q`, Ctrl-C or a terminating signal; or prints one
/// snapshot (see the module's documentation).
pub fn top(client: &mut Client, socket: &Path, args: TopArgs, json: bool) -> anyhow::Result<()> {
    if !(args.interval >= 0.1 && args.interval <= 3600.0) {
        return Err(usage("--interval must be between 0.1 and 3600 seconds"));
    }
    let interval = Duration::from_secs_f64(args.interval);
    let interactive =
        !args.once && !json && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if interactive {
        return live(client, socket, interval, args.sort, args.view);
    }
    let first = Sample::take(client, Pane::Agents)?;
    std::thread::sleep(interval);
    let second = Sample::take(client, args.view)?;
    let view = View {
        socket,
        interval: None,
        width: usize::MAX,
        height: usize::MAX,
        sort: args.sort,
        pane: args.view,
    };
    if json {
        return crate::format::print_json(&view.json(&first, &second));
    }
    let mut out = std::io::stdout().lock();
    for line in view.render(Some(&first), &second) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The interactive view.
fn live(
    client: &mut Client,
    socket: &Path,
    interval: Duration,
    mut sort: SortKey,
    mut pane: Pane,
) -> anyhow::Result<()> {
    // The handlers go in before the terminal changes mode: from then on a
    // SIGTERM, SIGHUP or SIGINT only sets the flag, and the view ends
    // through `Screen`'s drop, which puts the terminal back; without them
    // the default action would end the process with the terminal still in
    // the view's mode.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&stop))?;
    }
    let resized = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(libc::SIGWINCH, Arc::clone(&resized))?;

    let _screen = Screen::enter()?;
    let mut previous: Option<Sample> = None;
    let mut current = Sample::take(client, pane)?;
    loop {
        let (width, height) = terminal_size();
        let view = View {
            socket,
            interval: Some(interval),
            width,
            height,
            sort,
            pane,
        };
        draw(&view.render(previous.as_ref(), &current))?;
        let mut wake = wait_for_key(current.at + interval, &stop, &resized)?;
        if let Wake::Key(key) = wake {
            wake = apply_key(key, &mut sort, &mut pane);
        }
        match wake {
            Wake::Quit => return Ok(()),
            Wake::Redraw | Wake::Key(_) => {}
            Wake::Refresh => {
                let next = Sample::take(client, pane)?;
                previous = Some(std::mem::replace(&mut current, next));
            }
        }
    }
}

/// What the kernel said at one moment.
#[derive(Debug)]
struct Sample {
    /// When the LIST reply arrived.
    at: Instant,
    hello: HelloReply,
    agents: Vec<Entry>,
    /// The tasks view's: the TASK list reply's `tasks`.
    tasks: Vec<Value>,
    /// The servers view's: the TOOL list reply's `servers`.
    servers: Vec<Value>,
    /// The kernel's metrics text (METRICS), for an operator.
    metrics: Option<String>,
}

impl Sample {
    fn take(client: &mut Client, pane: Pane) -> anyhow::Result<Sample> {
        let hello = client.hello()?;
        let agents: Vec<Entry> = client
            .call_json(Opcode::LIST, b"")
            .context("reading the LIST reply")?;
        let at = Instant::now();
        let tasks = match pane {
            Pane::Tasks => tasks(client)?,
            _ => Vec::new(),
        };
        let servers = match pane {
            Pane::Servers => {
                let body = serde_json::to_vec(&json!({"op": "list"}))?;
                let reply: Value = client.call_json(Opcode::TOOL, &body)?;
                reply["servers"].as_array().cloned().unwrap_or_default()
            }
            _ => Vec::new(),
        };
        // Operators only: anyone else gets the line without figures.
        let metrics = client
            .call_json::<agentos_proto::payload::MetricsReply>(Opcode::METRICS, b"")
            .ok()
            .map(|reply| reply.text);
        Ok(Sample {
            at,
            hello,
            agents,
            tasks,
            servers,
            metrics,
        })
    }
}

/// The newest tasks: everyone's for an operator, else the caller's own.
fn tasks(client: &mut Client) -> anyhow::Result<Vec<Value>> {
    let everyone = json!({"op": "list", "limit": 100, "owner": "*"});
    let reply: Value = match client.call_json(Opcode::TASK, &serde_json::to_vec(&everyone)?) {
        Ok(reply) => reply,
        Err(agentos_proto::ClientError::Remote(_)) => {
            let own = json!({"op": "list", "limit": 100});
            client.call_json(Opcode::TASK, &serde_json::to_vec(&own)?)?
        }
        Err(err) => return Err(err.into()),
    };
    Ok(reply["tasks"].as_array().cloned().unwrap_or_default())
}

/// How a sample is laid out.
#[derive(Debug)]
struct View<'a> {
    socket: &'a Path,
    /// The refresh interval, when live.
    interval: Option<Duration>,
    /// Columns and rows available; lines and rows beyond are cut.
    width: usize,
    height: usize,
    sort: SortKey,
    pane: Pane,
}

/// The figures that matter most at a glance, from the kernel's metrics:
/// THINK's queue, EXEC's ready runs, tool calls and refused connections.
fn metrics_line(text: Option<&str>) -> String {
    let Some(text) = text else {
        return "metrics: for operators (agentos metrics)".to_owned();
    };
    // The sum of every series of `name` (whatever its labels), and of
    // those whose labels hold `label`.
    let sum = |name: &str, label: &str| -> f64 {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .filter(|(series, _)| {
                let bare = series.split('{').next().unwrap_or_default();
                bare == name && series.contains(label)
            })
            .filter_map(|(_, value)| value.parse::<f64>().ok())
            .sum()
    };
    format!(
        "THINK queued {}, EXEC ready {}, tool calls {}, connections refused {}",
        sum("agentos_think_queued", ""),
        sum("agentos_exec_ready_runs", ""),
        sum("agentos_tool_calls_total", ""),
        sum("agentos_network_connections_total", "verdict=\"refused\""),
    )
}

/// Header lines above a view's table.
const HEADER_LINES: usize = 4;

impl View<'_> {
    /// The screen's lines for `now`, CPU % measured from `before`.
    fn render(&self, before: Option<&Sample>, now: &Sample) -> Vec<String> {
        let cpu = agents::cpu_figures(before, now);
        let mut lines = vec![
            self.kernel_line(&now.hello),
            agents::totals_line(now, &cpu),
            metrics_line(now.metrics.as_deref()),
            self.keys_line(),
        ];
        let room = self.height.saturating_sub(HEADER_LINES);
        lines.extend(match self.pane {
            Pane::Agents => agents::table(now, &cpu, self.sort, room),
            Pane::Tasks => panes::tasks_table(&now.tasks, room),
            Pane::Servers => panes::servers_table(&now.servers, room),
        });
        lines
            .iter()
            .map(|line| crate::format::cut(line, self.width))
            .collect()
    }

    /// `--json`: the view's figures.
    fn json(&self, before: &Sample, now: &Sample) -> Value {
        match self.pane {
            Pane::Agents => {
                let cpu = agents::cpu_figures(Some(before), now);
                json!({"view": "agents", "agents": agents::json(now, &cpu, self.sort)})
            }
            Pane::Tasks => json!({"view": "tasks", "tasks": now.tasks}),
            Pane::Servers => json!({"view": "servers", "servers": now.servers}),
        }
    }

    /// The first line: which kernel, where, its LLM, and the keys.
    fn kernel_line(&self, hello: &HelloReply) -> String {
        let mut line = format!(
            "agentos top · kernel {} (protocol {}) at {}",
            hello.kernel_version,
            hello.protocol_version,
            self.socket.display()
        );
        match &hello.llm {
            Some(llm) if llm.provider == "none" => line.push_str(" · no LLM"),
            Some(llm) => line.push_str(&format!(
                " · LLM {} {} ({}), {} tokens in all",
                llm.provider,
                llm.model,
                if llm.ready { "ready" } else { "not ready" },
                llm.tokens
            )),
            None => {}
        }
        if let Some(interval) = self.interval {
            line.push_str(&format!(" · every {}s, q quits", interval.as_secs_f64()));
        }
        line
    }

    /// The third line, in the live view: what is shown, and the keys.
    fn keys_line(&self) -> String {
        if self.interval.is_none() {
            return String::new();
        }
        let shown = match self.pane {
            Pane::Agents => format!("agents by {}", format!("{:?}", self.sort).to_lowercase()),
            Pane::Tasks => "tasks, newest first".to_owned(),
            Pane::Servers => "tool servers".to_owned(),
        };
        format!("{shown} · keys: a t s (Tab) views; c m n r i sort agents")
    }
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
