//! The CPU time each sandbox had used when its metrics were last read:
//! E2B reports CPU as a share of the sandbox's CPUs, so the face keeps
//! the last reading and reports what was used between two.

use std::collections::HashMap;
use std::time::Instant;

use agentos_proto::payload::DelegateName;

/// Sandboxes whose last reading is kept; past it the oldest is
/// forgotten (its next reading is then averaged since its start).
const MAX_SAMPLES: usize = 4096;

/// Which sandbox: its key's delegate and its id.
type SandboxKey = (DelegateName, String);

/// One reading: when, and the CPU time used by then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub at: Instant,
    pub cpu_usec: u64,
}

/// The last reading of each sandbox.
#[derive(Debug, Default)]
pub struct CpuSamples {
    last: HashMap<SandboxKey, Reading>,
}

impl CpuSamples {
    /// Keeps `now` as the sandbox's last reading and gives the one before
    /// it, if there was one since its interpreter started (a reading with
    /// more CPU time than `now`'s was of an earlier interpreter).
    pub fn swap(&mut self, delegate: DelegateName, id: &str, now: Reading) -> Option<Reading> {
        let key = (delegate, id.to_owned());
        if !self.last.contains_key(&key) && self.last.len() >= MAX_SAMPLES {
            let oldest = self.last.iter().min_by_key(|(_, reading)| reading.at);
            if let Some(oldest) = oldest.map(|(key, _)| key.clone()) {
                self.last.remove(&oldest);
            }
        }
        self.last
            .insert(key, now)
            .filter(|before| before.cpu_usec <= now.cpu_usec && before.at < now.at)
    }
}

/// The share of `cpus` CPUs, in percent, that `cpu_usec` of CPU time over
/// `wall_usec` of wall time amounts to (at most 100).
pub fn used_pct(cpu_usec: u64, wall_usec: u64, cpus: u32) -> f64 {
    let capacity = wall_usec as f64 * f64::from(cpus.max(1));
    if capacity <= 0.0 {
        return 0.0;
    }
    (cpu_usec as f64 * 100.0 / capacity).min(100.0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn delegate(name: &str) -> DelegateName {
        DelegateName::new(name).unwrap()
    }

    #[test]
    fn a_reading_gives_back_the_one_before_of_the_same_sandbox_only() {
        let mut samples = CpuSamples::default();
        let t0 = Instant::now();
        let first = Reading {
            at: t0,
            cpu_usec: 10,
        };
        assert_eq!(samples.swap(delegate("e2b.a"), "s1", first), None);
        // Another key's sandbox of the same id is another sandbox.
        assert_eq!(samples.swap(delegate("e2b.b"), "s1", first), None);
        let later = Reading {
            at: t0 + Duration::from_secs(1),
            cpu_usec: 20,
        };
        assert_eq!(samples.swap(delegate("e2b.a"), "s1", later), Some(first));
        // A woken sandbox's interpreter starts its count again.
        let woken = Reading {
            at: t0 + Duration::from_secs(2),
            cpu_usec: 5,
        };
        assert_eq!(samples.swap(delegate("e2b.a"), "s1", woken), None);
    }

    #[test]
    fn the_samples_kept_are_bounded_and_the_oldest_goes() {
        let mut samples = CpuSamples::default();
        let t0 = Instant::now();
        for n in 0..=MAX_SAMPLES {
            let at = t0 + Duration::from_millis(n as u64);
            samples.swap(
                delegate("e2b.a"),
                &format!("s{n}"),
                Reading { at, cpu_usec: 0 },
            );
        }
        assert_eq!(samples.last.len(), MAX_SAMPLES);
        let again = Reading {
            at: t0 + Duration::from_secs(60),
            cpu_usec: 0,
        };
        assert_eq!(
            samples.swap(delegate("e2b.a"), "s0", again),
            None,
            "s0 was forgotten"
        );
        assert!(samples.swap(delegate("e2b.a"), "s2", again).is_some());
    }

    #[test]
    fn the_share_is_of_all_the_sandboxes_cpus_and_at_most_all() {
        assert_eq!(used_pct(500_000, 1_000_000, 1), 50.0);
        assert_eq!(used_pct(500_000, 1_000_000, 2), 25.0);
        assert_eq!(used_pct(5_000_000, 1_000_000, 2), 100.0);
        assert_eq!(used_pct(1, 0, 2), 0.0);
    }
}
