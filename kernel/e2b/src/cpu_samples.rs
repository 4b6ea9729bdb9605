//! The CPU time each sandbox had used when its metrics were last read:
//! E2B reports CPU as a share of the sandbox's CPUs, so the face keeps
//! the last reading and reports what was used between two.

use std::collections::HashMap;

use agentos_proto::payload::DelegateName;

/// Sandboxes of one key whose last reading is kept; past it one is
/// forgotten (its next reading is then averaged since its start). A key's
/// readings never push out another's.
const MAX_SAMPLES_PER_KEY: usize = 1024;

/// One reading, as the kernel took it: how long the sandbox's
/// interpreter had run, and the CPU time it had used by then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub uptime_ms: u64,
    pub cpu_usec: u64,
}

impl Reading {
    /// The share of `cpus` CPUs, in percent, used since `before`; or,
    /// with none, since the interpreter started.
    pub fn used_pct(&self, before: Option<Reading>, cpus: u32) -> f64 {
        let before = before.unwrap_or(Reading {
            uptime_ms: 0,
            cpu_usec: 0,
        });
        let cpu = self.cpu_usec.saturating_sub(before.cpu_usec);
        let wall_usec = self.uptime_ms.saturating_sub(before.uptime_ms) * 1000;
        used_pct(cpu, wall_usec, cpus)
    }
}

/// The last reading of each key's sandboxes.
#[derive(Debug, Default)]
pub struct CpuSamples {
    last: HashMap<DelegateName, HashMap<String, Reading>>,
}

impl CpuSamples {
    /// Keeps `now` as the sandbox's last reading and gives the one before
    /// it, if that was of the same interpreter (a woken sandbox's starts
    /// its count again).
    pub fn swap(&mut self, delegate: DelegateName, id: &str, now: Reading) -> Option<Reading> {
        let mine = self.last.entry(delegate).or_default();
        if !mine.contains_key(id) && mine.len() >= MAX_SAMPLES_PER_KEY {
            let oldest = mine.iter().min_by_key(|(_, reading)| reading.uptime_ms);
            if let Some(oldest) = oldest.map(|(id, _)| id.clone()) {
                mine.remove(&oldest);
            }
        }
        mine.insert(id.to_owned(), now)
            .filter(|before| before.uptime_ms < now.uptime_ms && before.cpu_usec <= now.cpu_usec)
    }

    /// Sandbox `id` has ended: its reading goes.
    pub fn forget(&mut self, delegate: DelegateName, id: &str) {
        if let Some(mine) = self.last.get_mut(&delegate) {
            mine.remove(id);
            if mine.is_empty() {
                self.last.remove(&delegate);
            }
        }
    }
}

/// The share of `cpus` CPUs, in percent, that `cpu_usec` of CPU time over
/// `wall_usec` of wall time amounts to (at most 100).
fn used_pct(cpu_usec: u64, wall_usec: u64, cpus: u32) -> f64 {
    let capacity = wall_usec as f64 * f64::from(cpus.max(1));
    if capacity <= 0.0 {
        return 0.0;
    }
    (cpu_usec as f64 * 100.0 / capacity).min(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delegate(name: &str) -> DelegateName {
        DelegateName::new(name).unwrap()
    }

    fn at(uptime_ms: u64, cpu_usec: u64) -> Reading {
        Reading {
            uptime_ms,
            cpu_usec,
        }
    }

    #[test]
    fn a_reading_gives_back_the_one_before_of_the_same_interpreter_only() {
        let mut samples = CpuSamples::default();
        assert_eq!(samples.swap(delegate("e2b.a"), "s1", at(1000, 10)), None);
        // Another key's sandbox of the same id is another sandbox.
        assert_eq!(samples.swap(delegate("e2b.b"), "s1", at(1000, 10)), None);
        assert_eq!(
            samples.swap(delegate("e2b.a"), "s1", at(2000, 20)),
            Some(at(1000, 10))
        );
        // A woken sandbox's interpreter starts its count again, even one
        // that has used more CPU since.
        assert_eq!(samples.swap(delegate("e2b.a"), "s1", at(500, 90)), None);
        samples.forget(delegate("e2b.a"), "s1");
        assert_eq!(samples.swap(delegate("e2b.a"), "s1", at(900, 95)), None);
    }

    #[test]
    fn a_keys_samples_are_bounded_and_never_push_out_anothers() {
        let mut samples = CpuSamples::default();
        samples.swap(delegate("e2b.b"), "kept", at(1, 0));
        for n in 0..=MAX_SAMPLES_PER_KEY as u64 {
            samples.swap(delegate("e2b.a"), &format!("s{n}"), at(n + 1, 0));
        }
        assert_eq!(samples.last[&delegate("e2b.a")].len(), MAX_SAMPLES_PER_KEY);
        assert_eq!(
            samples.swap(delegate("e2b.a"), "s0", at(99_999, 0)),
            None,
            "s0 was forgotten"
        );
        assert!(samples.swap(delegate("e2b.b"), "kept", at(2, 0)).is_some());
    }

    #[test]
    fn the_share_is_of_all_the_sandboxes_cpus_and_at_most_all() {
        assert_eq!(at(1000, 500_000).used_pct(None, 1), 50.0);
        assert_eq!(
            at(2000, 1_000_000).used_pct(Some(at(1000, 500_000)), 2),
            25.0
        );
        assert_eq!(at(1000, 5_000_000).used_pct(None, 2), 100.0);
        assert_eq!(at(0, 1).used_pct(None, 2), 0.0);
    }
}
