//! `agentos top`'s agents view: CPU %, memory against the limit,
//! restarts, LLM tokens and EXEC runs, in the order asked for.

use std::cmp::Reverse;
use std::time::Duration;

use agentos_proto::payload::{AgentState, CpuStats, ExecStats, Limits, LlmStats, MemoryStats};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Sample, SortKey};
use crate::format::{cut, human_size};

/// The fields of a LIST entry the view shows. They are read on their own,
/// not as `AgentInfo`, so that a kernel whose entries lack `exec` (or carry
/// more) is still shown.
#[derive(Debug, Deserialize)]
pub struct Entry {
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

/// Each agent's CPU % in `now` (in LIST's order), measured from `before`:
/// `None` for an ended agent, or one not in `before` as the same run.
pub fn cpu_figures(before: Option<&Sample>, now: &Sample) -> Vec<Option<f64>> {
    now.agents
        .iter()
        .map(|agent| {
            let before = before?;
            let earlier = before
                .agents
                .iter()
                .find(|e| e.id == agent.id && e.restarts == agent.restarts)?;
            if !agent.is_live() {
                return None;
            }
            cpu_percent(
                earlier.cpu.usage_usec,
                agent.cpu.usage_usec,
                now.at.saturating_duration_since(before.at),
            )
        })
        .collect()
}

/// The agents with their CPU figures in `sort`'s order: live ones first.
fn ordered<'a>(
    now: &'a Sample,
    cpu: &[Option<f64>],
    sort: SortKey,
) -> Vec<(&'a Entry, Option<f64>)> {
    let mut rows: Vec<(&Entry, Option<f64>)> = now.agents.iter().zip(cpu.iter().copied()).collect();
    rows.sort_by(|(a, a_cpu), (b, b_cpu)| {
        let live = (!a.is_live()).cmp(&!b.is_live());
        let by_key = match sort {
            SortKey::Id => a.id.cmp(&b.id),
            SortKey::Cpu => b_cpu.unwrap_or(-1.0).total_cmp(&a_cpu.unwrap_or(-1.0)),
            SortKey::Mem => Reverse(a.memory.current).cmp(&Reverse(b.memory.current)),
            SortKey::Name => a.name.cmp(&b.name),
            SortKey::Restarts => Reverse(a.restarts).cmp(&Reverse(b.restarts)),
        };
        live.then(by_key).then(a.id.cmp(&b.id))
    });
    rows
}

/// The table's header.
const COLUMNS: [&str; 8] = [
    "ID", "NAME", "STATE", "CPU%", "MEMORY", "RESTARTS", "TOKENS", "EXEC",
];

/// The agents table, as many rows as `room` lines hold.
pub fn table(now: &Sample, cpu: &[Option<f64>], sort: SortKey, room: usize) -> Vec<String> {
    let name_width = now
        .agents
        .iter()
        .map(|agent| agent.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(4, 24);
    let mut lines = vec![table_row(COLUMNS.map(str::to_owned), name_width)];
    let rows = ordered(now, cpu, sort);
    super::panes::rows(&mut lines, rows.len(), room, "(no agents)", |n| {
        let (agent, cpu) = rows[n];
        table_row(
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
        )
    });
    lines
}

/// `--json`: the agents' figures, in `sort`'s order.
pub fn json(now: &Sample, cpu: &[Option<f64>], sort: SortKey) -> Vec<Value> {
    ordered(now, cpu, sort)
        .into_iter()
        .map(|(agent, cpu)| {
            json!({
                "id": agent.id, "name": agent.name, "state": agent.state,
                "cpu_percent": cpu.map(|p| (p * 10.0).round() / 10.0),
                "memory": agent.memory.current, "memory_limit": agent.limits.memory,
                "restarts": agent.restarts, "tokens": agent.llm.tokens,
                "exec_runs": agent.exec.as_ref().map(|e| e.runs),
            })
        })
        .collect()
}

/// The second line: the agents' totals.
pub fn totals_line(now: &Sample, cpu: &[Option<f64>]) -> String {
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use super::super::{Pane, View};
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
        Sample {
            at,
            hello,
            agents,
            tasks: Vec::new(),
            servers: Vec::new(),
            metrics: None,
        }
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
        assert_eq!(words(&lines[4]), COLUMNS);
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

    #[test]
    fn agents_sort_by_the_key_asked_live_ones_first() {
        let start = Instant::now();
        let mut heavy = entry(2, "b-heavy", "running", 0);
        heavy.memory.current = 900 << 20;
        heavy.restarts = 4;
        let mut ended = entry(4, "a-ended", "exited", 0);
        ended.memory.current = 999 << 20;
        let before = sample(
            start,
            vec![
                entry(1, "c-busy", "running", 0),
                entry(2, "b-heavy", "running", 0),
                entry(3, "d-idle", "running", 0),
            ],
        );
        let now = sample(
            start + Duration::from_secs(1),
            vec![
                entry(1, "c-busy", "running", 800_000),
                heavy,
                entry(3, "d-idle", "running", 10_000),
                ended,
            ],
        );
        let cpu = cpu_figures(Some(&before), &now);
        let names = |sort| -> Vec<String> {
            ordered(&now, &cpu, sort)
                .iter()
                .map(|(a, _)| a.name.clone())
                .collect()
        };
        assert_eq!(
            names(SortKey::Cpu),
            ["c-busy", "d-idle", "b-heavy", "a-ended"]
        );
        assert_eq!(
            names(SortKey::Mem),
            ["b-heavy", "c-busy", "d-idle", "a-ended"]
        );
        assert_eq!(
            names(SortKey::Name),
            ["b-heavy", "c-busy", "d-idle", "a-ended"]
        );
        assert_eq!(names(SortKey::Restarts)[0], "b-heavy");
        assert_eq!(
            names(SortKey::Id),
            ["c-busy", "b-heavy", "d-idle", "a-ended"]
        );
        let figures = json(&now, &cpu, SortKey::Cpu);
        assert_eq!(figures[0]["name"], "c-busy");
        assert_eq!(figures[0]["cpu_percent"], 80.0);
        assert_eq!(figures[3]["cpu_percent"], Value::Null);
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
