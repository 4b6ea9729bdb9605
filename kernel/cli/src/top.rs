//! `agentos top`: a live view of the agents, refreshed each second.
//!
//! Each refresh is one HELLO (for the header) and one LIST. An agent's
//! CPU % is the growth of its `cpu.usage_usec` between two refreshes over
//! the wall-clock time between them, so 100% is one core kept busy; the
//! first screen has no earlier sample and shows `-`. `--once`, or a
//! stdout or stdin that is not a terminal, takes two samples one interval
//! apart and prints the second as plain text, so that a script sees
//! measured CPU figures too.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    AgentState, CpuStats, ExecStats, HelloReply, Limits, LlmStats, MemoryStats,
};
use agentos_proto::{Client, Opcode};
use anyhow::{bail, Context};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};
use serde::Deserialize;

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
}

/// Runs the view until `q`, Ctrl-C or a terminating signal; or prints one
/// snapshot (see the module's documentation).
pub fn top(client: &mut Client, socket: &Path, args: TopArgs) -> anyhow::Result<()> {
    if !(args.interval >= 0.1 && args.interval <= 3600.0) {
        bail!("--interval must be between 0.1 and 3600 seconds");
    }
    let interval = Duration::from_secs_f64(args.interval);
    let interactive =
        !args.once && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !interactive {
        let first = Sample::take(client)?;
        std::thread::sleep(interval);
        let second = Sample::take(client)?;
        let view = View {
            socket,
            interval: None,
            width: usize::MAX,
            height: usize::MAX,
        };
        let mut out = std::io::stdout().lock();
        for line in view.render(Some(&first), &second) {
            writeln!(out, "{line}")?;
        }
        return Ok(());
    }
    live(client, socket, interval)
}

/// The interactive view.
fn live(client: &mut Client, socket: &Path, interval: Duration) -> anyhow::Result<()> {
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
    let mut current = Sample::take(client)?;
    loop {
        let (width, height) = terminal_size();
        let view = View {
            socket,
            interval: Some(interval),
            width,
            height,
        };
        draw(&view.render(previous.as_ref(), &current))?;
        match wait_for_key(current.at + interval, &stop, &resized)? {
            Wake::Quit => return Ok(()),
            Wake::Redraw => {}
            Wake::Refresh => {
                let next = Sample::take(client)?;
                previous = Some(std::mem::replace(&mut current, next));
            }
        }
    }
}

/// The fields of a LIST entry the view shows. They are read on their own,
/// not as `AgentInfo`, so that a kernel whose entries lack `exec` (or carry
/// more) is still shown.
#[derive(Debug, Deserialize)]
struct Entry {
    id: u32,
    name: String,
    state: String,
    restarts: u32,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    memory: MemoryStats,
    #[serde(default)]
    cpu: CpuStats,
    #[serde(default)]
    llm: LlmStats,
    #[serde(default)]
    exec: Option<ExecStats>,
}

impl Entry {
    /// Whether it has (or is about to have) processes using CPU.
    fn is_live(&self) -> bool {
        AgentState::LIVE
            .iter()
            .any(|live| live.as_str() == self.state)
    }
}

/// What the kernel said at one moment.
#[derive(Debug)]
struct Sample {
    /// When the LIST reply arrived.
    at: Instant,
    hello: HelloReply,
    agents: Vec<Entry>,
}

impl Sample {
    fn take(client: &mut Client) -> anyhow::Result<Sample> {
        let hello = client.hello()?;
        let mut agents: Vec<Entry> = client
            .call_json(Opcode::LIST, b"")
            .context("reading the LIST reply")?;
        let at = Instant::now();
        // Live agents first, each group in spawn order, so that rows keep
        // their places from one refresh to the next.
        agents.sort_by_key(|agent| (!agent.is_live(), agent.id));
        Ok(Sample { at, hello, agents })
    }
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
}

/// The table's header.
const COLUMNS: [&str; 8] = [
    "ID", "NAME", "STATE", "CPU%", "MEMORY", "RESTARTS", "TOKENS", "EXEC",
];

/// Header lines above the table's.
const HEADER_LINES: usize = 3;

impl View<'_> {
    /// The screen's lines for `now`, CPU % measured from `before`.
    fn render(&self, before: Option<&Sample>, now: &Sample) -> Vec<String> {
        let cpu: Vec<Option<f64>> = now
            .agents
            .iter()
            .map(|agent| {
                let earlier = before?
                    .agents
                    .iter()
                    .find(|e| e.id == agent.id && e.restarts == agent.restarts)?;
                if !agent.is_live() {
                    return None;
                }
                cpu_percent(
                    earlier.cpu.usage_usec,
                    agent.cpu.usage_usec,
                    now.at.saturating_duration_since(before?.at),
                )
            })
            .collect();

        let mut lines = vec![self.kernel_line(&now.hello), totals_line(now, &cpu)];
        lines.push(String::new());
        let name_width = now
            .agents
            .iter()
            .map(|agent| agent.name.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, 24);
        lines.push(table_row(COLUMNS.map(str::to_owned), name_width));
        let room = self.height.saturating_sub(HEADER_LINES + 1);
        for (shown, (agent, cpu)) in now.agents.iter().zip(&cpu).enumerate() {
            if shown + 1 == room && now.agents.len() > room {
                lines.push(format!("… {} more", now.agents.len() - shown));
                break;
            }
            lines.push(table_row(
                [
                    agent.id.to_string(),
                    cut(&agent.name, name_width),
                    agent.state.clone(),
                    cpu.map_or_else(|| "-".into(), |p| format!("{p:.1}")),
                    memory(agent.memory.current, agent.limits.memory),
                    agent.restarts.to_string(),
                    agent.llm.tokens.to_string(),
                    agent
                        .exec
                        .as_ref()
                        .map_or_else(|| "-".into(), |e| e.runs.to_string()),
                ],
                name_width,
            ));
        }
        if now.agents.is_empty() {
            lines.push("(no agents)".into());
        }
        lines.iter().map(|line| cut(line, self.width)).collect()
    }

    /// The first line: which kernel, where, and its LLM.
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
}

/// The second line: the agents' totals.
fn totals_line(now: &Sample, cpu: &[Option<f64>]) -> String {
    let live = now.agents.iter().filter(|agent| agent.is_live()).count();
    let measured: Vec<f64> = cpu.iter().flatten().copied().collect();
    let cpu_total = if measured.is_empty() && live > 0 {
        "-".to_owned()
    } else {
        // `fold` from 0.0: an empty `sum` of floats is -0.0.
        format!("{:.1}%", measured.iter().fold(0.0, |all, cpu| all + cpu))
    };
    let memory_total: u64 = now.agents.iter().map(|agent| agent.memory.current).sum();
    let tokens: u64 = now.agents.iter().map(|agent| agent.llm.tokens).sum();
    let runs: Vec<u64> = now
        .agents
        .iter()
        .filter_map(|agent| agent.exec.as_ref().map(|exec| exec.runs))
        .collect();
    // A kernel whose LIST has no `exec` says nothing about runs.
    let exec_runs = if runs.is_empty() && !now.agents.is_empty() {
        "-".to_owned()
    } else {
        runs.iter().sum::<u64>().to_string()
    };
    format!(
        "{} agent{}, {live} live · CPU {cpu_total} · memory {} · LLM tokens {tokens} · EXEC runs \
         {exec_runs}",
        now.agents.len(),
        if now.agents.len() == 1 { "" } else { "s" },
        human_size(memory_total)
    )
}

/// One line of the table, columns aligned.
fn table_row(cells: [String; 8], name_width: usize) -> String {
    let [id, name, state, cpu, memory, restarts, tokens, exec] = cells;
    format!(
        "{id:>6}  {name:<name_width$}  {state:<10} {cpu:>6} {memory:>15} {restarts:>8} \
         {tokens:>9} {exec:>6}"
    )
}

/// CPU % between two readings of `cpu.usage_usec` taken `wall` apart:
/// 100 is one core busy the whole time. `None` when the counter went back
/// (a new cgroup) or no time passed.
fn cpu_percent(before_usec: u64, after_usec: u64, wall: Duration) -> Option<f64> {
    let wall_usec = wall.as_secs_f64() * 1e6;
    if after_usec < before_usec || wall_usec <= 0.0 {
        return None;
    }
    Some((after_usec - before_usec) as f64 / wall_usec * 100.0)
}

/// `12.3M / 256M`, or `12.3M` with no limit.
fn memory(current: u64, limit: Option<u64>) -> String {
    match limit {
        Some(limit) => format!("{} / {}", human_size(current), human_size(limit)),
        None => human_size(current),
    }
}

/// Bytes in binary units as `top` writes them: `512B`, `12.3M`, `256M`, `1.5G`.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if value.fract() == 0.0 || value >= 100.0 {
        format!("{value:.0}{unit}")
    } else {
        format!("{value:.1}{unit}")
    }
}

/// `text` cut to `width` characters, the last one `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

/// The terminal in the view's mode: keys arrive one at a time and
/// unechoed, on the alternate screen with the cursor hidden. Dropping it
/// puts the terminal back as it was, whichever way the view ends (`q`, a
/// signal, an error from the kernel, a panic).
#[derive(Debug)]
struct Screen {
    saved: Termios,
}

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).context("reading the terminal's mode")?;
        let mut keys = saved.clone();
        // ISIG off too: Ctrl-C arrives as a key rather than as SIGINT, and
        // Ctrl-Z cannot stop the view with the terminal in its mode.
        keys.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        // The guard exists before the first change, so that a failure
        // half-way still undoes what was done.
        let screen = Screen { saved };
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &keys)
            .context("setting the terminal's mode")?;
        let mut out = std::io::stdout().lock();
        out.write_all(b"\x1b[?1049h\x1b[?25l\x1b[2J")?;
        out.flush()?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        // Errors are ignored: the terminal may be gone (SIGHUP), and there
        // is nothing else to do with it.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// Draws a frame over the last one: each line cleared to its end, the
/// rest of the screen cleared below. No newline after the last line, which
/// would scroll a full screen by one.
fn draw(lines: &[String]) -> std::io::Result<()> {
    let mut frame = String::from("\x1b[H");
    frame.push_str(&lines.join("\x1b[K\n"));
    frame.push_str("\x1b[K\x1b[J");
    let mut out = std::io::stdout().lock();
    out.write_all(frame.as_bytes())?;
    out.flush()
}

/// Columns and rows of the terminal on stdout (80x24 if it will not say).
fn terminal_size() -> (usize, usize) {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points at a live, writable `winsize` for the whole call.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    if rc == 0 && size.ws_col > 0 && size.ws_row > 0 {
        (usize::from(size.ws_col), usize::from(size.ws_row))
    } else {
        (80, 24)
    }
}

/// Why the wait between refreshes ended.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    /// `q`, Ctrl-C, end of input or a terminating signal.
    Quit,
    /// Time for the next sample.
    Refresh,
    /// The terminal changed size: draw the same sample again.
    Redraw,
}

/// Waits for a key, a signal or `deadline`, whichever comes first.
fn wait_for_key(
    deadline: Instant,
    stop: &AtomicBool,
    resized: &AtomicBool,
) -> anyhow::Result<Wake> {
    let stdin = std::io::stdin();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(Wake::Quit);
        }
        if resized.swap(false, Ordering::Relaxed) {
            return Ok(Wake::Redraw);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Wake::Refresh);
        }
        // Rounded up, so that the wait does not end a little early and spin.
        let timeout =
            PollTimeout::try_from(left + Duration::from_micros(999)).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, timeout) {
            // A signal: the flags say which.
            Err(Errno::EINTR) | Ok(0) => continue,
            Err(err) => return Err(err).context("waiting for a key"),
            Ok(_) => {}
        }
        let mut keys = [0u8; 64];
        let read = match nix::unistd::read(stdin.as_fd(), &mut keys) {
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            // The terminal went away.
            Err(_) | Ok(0) => return Ok(Wake::Quit),
            Ok(read) => read,
        };
        // q, Q, Ctrl-C (ISIG is off, so it arrives as 0x03), Ctrl-D.
        if keys[..read].iter().any(|key| b"qQ\x03\x04".contains(key)) {
            return Ok(Wake::Quit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u32, name: &str, state: &str, usage_usec: u64) -> Entry {
        let exec = if id == 1 {
            Some(ExecStats { runs: 3 })
        } else {
            None
        };
        Entry {
            id,
            name: name.into(),
            state: state.into(),
            restarts: 0,
            limits: Limits {
                memory: Some(256 << 20),
                ..Limits::default()
            },
            memory: MemoryStats {
                current: 12_900_000,
                peak: 0,
            },
            cpu: CpuStats {
                usage_usec,
                ..CpuStats::default()
            },
            llm: LlmStats {
                calls: 1,
                tokens: 40,
                queue_ms: 0,
            },
            exec,
        }
    }

    fn sample(at: Instant, agents: Vec<Entry>) -> Sample {
        let hello = serde_json::from_value(serde_json::json!({
            "success": true, "protocol_version": 1, "kernel_version": "0.1.0",
            "agent_id": 1000000,
            "features": {"think": false, "exec": true, "spawn": true, "cgroup": "v2"},
            "llm": {"provider": "none", "model": "", "ready": false, "calls": 0, "tokens": 0},
        }))
        .expect("a HELLO reply");
        Sample { at, hello, agents }
    }

    #[test]
    fn cpu_percent_is_usage_growth_over_wall_time_one_core_being_100() {
        let second = Duration::from_secs(1);
        assert_eq!(cpu_percent(1_000_000, 2_000_000, second), Some(100.0));
        assert_eq!(cpu_percent(0, 250_000, second / 2), Some(50.0));
        assert_eq!(cpu_percent(0, 3_000_000, second), Some(300.0));
        assert_eq!(cpu_percent(5, 4, second), None, "a counter that went back");
        assert_eq!(cpu_percent(0, 4, Duration::ZERO), None);
    }

    #[test]
    fn sizes_read_in_binary_units_like_top() {
        assert_eq!(human_size(512), "512B");
        assert_eq!(human_size(12_900_000), "12.3M");
        assert_eq!(human_size(256 << 20), "256M");
        assert_eq!(human_size(1536 << 20), "1.5G");
        assert_eq!(human_size(200_000_000), "191M");
        assert_eq!(memory(12_900_000, Some(256 << 20)), "12.3M / 256M");
        assert_eq!(memory(1 << 20, None), "1M");
    }

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
        assert_eq!(words(&lines[3]), COLUMNS);
        assert_eq!(
            words(&lines[4]),
            ["1", "burner", "running", "50.0", "12.3M", "/", "256M", "0", "40", "3"]
        );
        // New since the last sample: no CPU figure yet; no `exec` field: `-`.
        assert_eq!(
            words(&lines[5])[3..],
            ["-", "12.3M", "/", "256M", "0", "40", "-"]
        );
        // Ended: no CPU figure.
        assert_eq!(words(&lines[6])[2..4], ["killed", "-"]);
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
        };
        let lines = view.render(None, &now);
        assert_eq!(lines.len(), 8);
        assert!(
            lines.iter().all(|line| line.chars().count() <= 30),
            "{lines:?}"
        );
        assert!(lines[1].contains("CPU -"), "{lines:?}");
        assert_eq!(lines[7], "… 7 more");
    }

    #[test]
    fn list_entries_without_exec_or_with_unknown_fields_are_read() {
        let entries: Vec<Entry> = serde_json::from_str(
            r#"[{"id": 1, "name": "a", "state": "running", "restarts": 0, "limits": {},
                "memory": {"current": 1, "peak": 1}, "cpu": {"usage_usec": 5,
                "nr_throttled": 0, "throttled_usec": 0}, "llm": {"calls": 0, "tokens": 0},
                "boot": true},
               {"id": 2, "name": "b", "state": "exited", "restarts": 1, "limits": {},
                "memory": {"current": 0, "peak": 1}, "cpu": {"usage_usec": 5,
                "nr_throttled": 0, "throttled_usec": 0}, "llm": {"calls": 0, "tokens": 0},
                "exec": {"runs": 7}}]"#,
        )
        .expect("LIST entries");
        assert!(entries[0].exec.is_none());
        assert_eq!(entries[1].exec.as_ref().map(|e| e.runs), Some(7));
    }
}
