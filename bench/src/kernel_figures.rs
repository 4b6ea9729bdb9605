//! What a benchmark reads from the kernel under test to say where time
//! went: a histogram from METRICS (as deltas over a phase), and the CPU
//! of the daemon, of the cgroups its exec hosts and runs live in, and of
//! the whole machine.

use std::io;
use std::num::ParseIntError;
use std::time::Duration;

use agentos_proto::payload::MetricsReply;
use agentos_proto::{Client, ClientError, Opcode};

use crate::wire::{read_reply, UnexpectedReply};

/// How often the kernel publishes its metrics: a phase's figures are read
/// at least this long after it ends.
pub const METRICS_PERIOD: Duration = Duration::from_millis(1_100);

/// Why a figure could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FigureError {
    /// The kernel could not be asked.
    #[error(transparent)]
    Kernel(#[from] ClientError),
    /// METRICS answered with something other than its reply.
    #[error("METRICS answered {0}")]
    Metrics(UnexpectedReply),
    /// A file of `/proc` could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// Why not.
        #[source]
        source: io::Error,
    },
    /// A file of `/proc` (named as `/proc/PID/stat`) is not laid out as
    /// Linux writes it.
    #[error("{0}")]
    Layout(&'static str),
    /// A count in a file of `/proc` is not a number.
    #[error(transparent)]
    Number(#[from] ParseIntError),
}

/// A Prometheus histogram's cumulative buckets: (upper bound in seconds,
/// observations at or below it), the last `+Inf`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(pub Vec<(f64, u64)>);

impl Buckets {
    /// Histogram `name`'s buckets in METRICS' text (none: empty).
    pub fn read(client: &mut Client, name: &str) -> Result<Buckets, FigureError> {
        let reply = client.call(Opcode::METRICS, b"")?;
        let reply: MetricsReply = read_reply(&reply.payload, |r: &MetricsReply| r.success)
            .map_err(FigureError::Metrics)?;
        Ok(Buckets::parse(&reply.text, name))
    }

    /// Histogram `name`'s buckets in Prometheus text.
    pub fn parse(text: &str, name: &str) -> Buckets {
        let prefix = format!("{name}_bucket{{le=\"");
        Buckets(
            text.lines()
                .filter_map(|line| {
                    let rest = line.strip_prefix(&prefix)?;
                    let (bound, count) = rest.split_once("\"} ")?;
                    let bound = if bound == "+Inf" {
                        f64::INFINITY
                    } else {
                        bound.parse().ok()?
                    };
                    Some((bound, count.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// The observations made since `before`.
    pub fn since(&self, before: &Buckets) -> Buckets {
        Buckets(
            self.0
                .iter()
                .map(|(bound, count)| {
                    let earlier = before
                        .0
                        .iter()
                        .find(|(b, _)| b == bound)
                        .map_or(0, |(_, c)| *c);
                    (*bound, count.saturating_sub(earlier))
                })
                .collect(),
        )
    }

    /// Observations in all.
    pub fn total(&self) -> u64 {
        self.0.last().map_or(0, |(_, count)| *count)
    }

    /// The share of observations above `bound` seconds (a bucket bound).
    pub fn share_above(&self, bound: f64) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let at_or_below = self
            .0
            .iter()
            .find(|(b, _)| *b >= bound)
            .map_or(total, |(_, c)| *c);
        (total - at_or_below) as f64 / total as f64
    }

    /// The bucket bound the `p` quantile falls at or below, in seconds.
    pub fn quantile_bound(&self, p: f64) -> f64 {
        let wanted = (self.total() as f64 * p).ceil() as u64;
        self.0
            .iter()
            .find(|(_, count)| *count >= wanted.max(1))
            .map_or(f64::NAN, |(bound, _)| *bound)
    }
}

/// CPU used so far, in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// By the daemon's own process.
    pub daemon: f64,
    /// In the cgroups of its exec hosts and runs.
    pub sandboxes: Option<f64>,
    /// By the whole machine (every CPU's busy time).
    pub machine: f64,
}

impl Cpu {
    /// The figures now for the daemon `pid`.
    pub fn now(pid: u32) -> Result<Cpu, FigureError> {
        Ok(Cpu {
            daemon: process_cpu(pid)?,
            sandboxes: sandboxes_cpu(pid),
            machine: machine_busy()?,
        })
    }

    /// What was used since `before`.
    pub fn since(&self, before: &Cpu) -> Cpu {
        Cpu {
            daemon: self.daemon - before.daemon,
            sandboxes: self.sandboxes.zip(before.sandboxes).map(|(a, b)| a - b),
            machine: self.machine - before.machine,
        }
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// The text of a file of `/proc`.
fn read_proc(path: String) -> Result<String, FigureError> {
    std::fs::read_to_string(&path).map_err(|source| FigureError::Read { path, source })
}

/// A process's user and system time.
fn process_cpu(pid: u32) -> Result<f64, FigureError> {
    let layout = || FigureError::Layout("/proc/PID/stat");
    let stat = read_proc(format!("/proc/{pid}/stat"))?;
    // The fields after the command, which may hold spaces, in parentheses.
    let rest = stat.rsplit_once(')').ok_or_else(layout)?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (Some(user), Some(system)) = (fields.get(11), fields.get(12)) else {
        return Err(layout());
    };
    let ticks: u64 = user.parse::<u64>()? + system.parse::<u64>()?;
    Ok(ticks as f64 / clock_ticks())
}

/// The CPU of the daemon's cgroups (`agentos/agentosd-PID`), where its
/// exec hosts and runs are: cgroup v1's cpuacct or v2's cpu.stat.
fn sandboxes_cpu(pid: u32) -> Option<f64> {
    let v1 = format!("/sys/fs/cgroup/cpuacct/agentos/agentosd-{pid}/cpuacct.usage");
    if let Ok(nanos) = std::fs::read_to_string(v1) {
        return Some(nanos.trim().parse::<f64>().ok()? / 1e9);
    }
    let v2 = format!("/sys/fs/cgroup/agentos/agentosd-{pid}/cpu.stat");
    let stat = std::fs::read_to_string(v2).ok()?;
    let micros = stat
        .lines()
        .find_map(|line| line.strip_prefix("usage_usec "))?;
    Some(micros.trim().parse::<f64>().ok()? / 1e6)
}

/// Every CPU's time outside idle and iowait, from /proc/stat.
fn machine_busy() -> Result<f64, FigureError> {
    let stat = read_proc("/proc/stat".to_owned())?;
    let line = stat
        .lines()
        .next()
        .ok_or(FigureError::Layout("/proc/stat"))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is
    // counted in user already).
    let busy: u64 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(index, _)| *index != 3 && *index != 4)
        .map(|(_, ticks)| ticks)
        .sum();
    Ok(busy as f64 / clock_ticks())
}

/// CPUs this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP agentos_exec_wait_seconds W.\n\
        # TYPE agentos_exec_wait_seconds histogram\n\
        agentos_exec_wait_seconds_bucket{le=\"0.0001\"} 6\n\
        agentos_exec_wait_seconds_bucket{le=\"0.001\"} 8\n\
        agentos_exec_wait_seconds_bucket{le=\"+Inf\"} 10\n\
        agentos_exec_wait_seconds_sum 0.5\n\
        agentos_exec_wait_seconds_count 10\n";

    #[test]
    fn a_histogram_is_read_and_its_share_and_quantiles_follow() {
        let now = Buckets::parse(TEXT, "agentos_exec_wait_seconds");
        assert_eq!(
            now,
            Buckets(vec![(0.0001, 6), (0.001, 8), (f64::INFINITY, 10)])
        );
        let before = Buckets(vec![(0.0001, 2), (0.001, 2), (f64::INFINITY, 2)]);
        let phase = now.since(&before);
        assert_eq!(phase.total(), 8);
        assert_eq!(phase.share_above(0.0001), 0.5);
        assert_eq!(phase.quantile_bound(0.5), 0.0001);
        assert_eq!(phase.quantile_bound(0.99), f64::INFINITY);
        assert!(Buckets::default().quantile_bound(0.5).is_nan());
    }
}
