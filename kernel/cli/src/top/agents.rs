//! `agentos top`'s agents view: CPU %, memory against the limit,
//! restarts, LLM tokens and EXEC runs, in the order asked for.

use std::cmp::Reverse;
use std::time::Duration;

use serde::Serialize;

use super::keys::SortKey;
use super::panes::rows;
use super::sample::{Entry, Sample};
use crate::format::{cut, human_size};

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
pub const COLUMNS: [&str; 8] = [
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
    let ordered = ordered(now, cpu, sort);
    rows(&mut lines, ordered.len(), room, "(no agents)", |n| {
        let (agent, cpu) = ordered[n];
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

/// One agent's figures in `--json`.
#[derive(Debug, Serialize)]
pub struct Figures<'a> {
    id: u32,
    name: &'a str,
    state: &'a str,
    /// To a tenth of a percent; `null` before there are two samples.
    cpu_percent: Option<f64>,
    memory: u64,
    memory_limit: Option<u64>,
    restarts: u32,
    tokens: u64,
    /// `null` when the kernel's LIST says nothing of runs.
    exec_runs: Option<u64>,
}

/// `--json`: the agents' figures, in `sort`'s order.
pub fn figures<'a>(now: &'a Sample, cpu: &[Option<f64>], sort: SortKey) -> Vec<Figures<'a>> {
    ordered(now, cpu, sort)
        .into_iter()
        .map(|(agent, cpu)| Figures {
            id: agent.id,
            name: &agent.name,
            state: &agent.state,
            cpu_percent: cpu.map(|p| (p * 10.0).round() / 10.0),
            memory: agent.memory.current,
            memory_limit: agent.limits.memory,
            restarts: agent.restarts,
            tokens: agent.llm.tokens,
            exec_runs: agent.exec.as_ref().map(|e| e.runs),
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
    use std::time::Instant;

    use super::super::sample::fixtures::{entry, sample};
    use super::*;

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
        let figures = figures(&now, &cpu, SortKey::Cpu);
        assert_eq!(figures[0].name, "c-busy");
        assert_eq!(figures[0].cpu_percent, Some(80.0));
        assert_eq!(figures[3].cpu_percent, None);
    }
}
