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
mod keys;
mod panes;
mod sample;
mod terminal;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use agentos_proto::payload::HelloReply;
use agentos_proto::Client;
use serde::Serialize;

use crate::error::CliError;
use crate::failure::usage;
use crate::format::print_json;
use crate::raw::Raw;
use keys::{apply_key, Pane, SortKey};
use sample::Sample;
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

/// Runs the view until `q`, Ctrl-C or a terminating signal; or prints one
/// snapshot (see the module's documentation).
pub fn top(client: &mut Client, socket: &Path, args: TopArgs, json: bool) -> Result<(), CliError> {
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
        return print_json(&view.figures(&first, &second));
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
) -> Result<(), CliError> {
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

/// `--json`'s figures: the view's name, and its agents' figures, or its
/// tasks or servers as the kernel sent them.
#[derive(Debug, Serialize)]
#[serde(tag = "view", rename_all = "lowercase")]
enum Figures<'a> {
    Agents { agents: Vec<agents::Figures<'a>> },
    Tasks { tasks: &'a [Raw] },
    Servers { servers: &'a [Raw] },
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
            Pane::Tasks => panes::tasks_table(&now.tasks.read, room),
            Pane::Servers => panes::servers_table(&now.servers.read, room),
        });
        lines
            .iter()
            .map(|line| crate::format::cut(line, self.width))
            .collect()
    }

    /// `--json`: the view's figures.
    fn figures<'a>(&self, before: &Sample, now: &'a Sample) -> Figures<'a> {
        match self.pane {
            Pane::Agents => {
                let cpu = agents::cpu_figures(Some(before), now);
                Figures::Agents {
                    agents: agents::figures(now, &cpu, self.sort),
                }
            }
            Pane::Tasks => Figures::Tasks {
                tasks: &now.tasks.sent,
            },
            Pane::Servers => Figures::Servers {
                servers: &now.servers.sent,
            },
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
    use std::time::Instant;

    use super::sample::fixtures::{entry, sample};
    use super::*;

    #[test]
    fn a_row_shows_cpu_memory_against_limit_tokens_and_exec_runs() {
        let start = Instant::now();
        let before = sample(start, vec![entry(1, "burner", "running", 1_000_000)]);
        let now = sample(
            start + Duration::from_secs(2),
            vec![
                entry(1, "burner", "running", 2_000_000),
                entry(2, "idle", "running", 0),
                entry(3, "gone", "killed", 9),
            ],
        );
        let view = View {
            socket: Path::new("/tmp/a.sock"),
            interval: None,
            width: usize::MAX,
            height: usize::MAX,
            sort: SortKey::Id,
            pane: Pane::Agents,
        };
        let lines = view.render(Some(&before), &now);
        assert!(
            lines[0].contains("kernel 0.1.0 (protocol 1) at /tmp/a.sock"),
            "{lines:?}"
        );
        assert_eq!(
            lines[1],
            "3 agents, 2 live · CPU 50.0% · memory 36.9M · LLM tokens 120 · EXEC runs 3"
        );
        let words = |line: &str| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(lines[2], "metrics: for operators (agentos metrics)");
        assert_eq!(words(&lines[4]), agents::COLUMNS);
        assert_eq!(
            words(&lines[5]),
            ["1", "burner", "running", "50.0", "12.3M", "/", "256M", "0", "40", "3"]
        );
        // New since the last sample: no CPU figure yet; no `exec` field: `-`.
        assert_eq!(
            words(&lines[6])[3..],
            ["-", "12.3M", "/", "256M", "0", "40", "-"]
        );
        // Ended: no CPU figure.
        assert_eq!(words(&lines[7])[2..4], ["killed", "-"]);
    }

    #[test]
    fn the_first_screen_has_no_cpu_figures_and_a_small_one_is_cut() {
        let now = sample(
            Instant::now(),
            (1..=10).map(|id| entry(id, "a", "running", 5)).collect(),
        );
        let view = View {
            socket: Path::new("/s"),
            interval: Some(Duration::from_secs(1)),
            width: 30,
            height: 8,
            sort: SortKey::Id,
            pane: Pane::Agents,
        };
        let lines = view.render(None, &now);
        assert_eq!(lines.len(), 8);
        assert!(
            lines.iter().all(|line| line.chars().count() <= 30),
            "{lines:?}"
        );
        assert!(lines[1].contains("CPU -"), "{lines:?}");
        assert_eq!(lines[7], "… 8 more");
    }
}
