//! The host's figures and a process's, read from `/proc`: what the Clove
//! SDK's metrics calls report. Reading is quick but is file I/O, so the
//! syscalls do it on a worker.

use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use agentos_proto::payload::{
    HostCpu, HostDisk, HostMemory, HostNetwork, ProcessCpu, ProcessMemory, ProcessMetrics,
    SystemMetrics,
};

/// Bytes in a sector of `/proc/diskstats`, whatever the device's own.
const SECTOR: u64 = 512;

/// The processors' busy and total time at the last reading, so the next
/// gives the share busy in between.
#[derive(Clone, Debug, Default)]
pub struct CpuSampler {
    last: Arc<Mutex<Option<CpuTimes>>>,
}

/// `/proc/stat`'s first line, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuSampler {
    /// The share of all processors busy since the previous call (the
    /// first: since boot), 0–100.
    fn percent(&self, now: CpuTimes) -> f64 {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let since = last.unwrap_or(CpuTimes { busy: 0, total: 0 });
        *last = Some(now);
        let total = now.total.saturating_sub(since.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * now.busy.saturating_sub(since.busy) as f64 / total as f64
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// The host's figures now.
pub fn system(sampler: &CpuSampler) -> SystemMetrics {
    let stat = read("/proc/stat");
    let memory = memory(&read("/proc/meminfo"));
    SystemMetrics {
        timestamp: now_ms(),
        cpu: HostCpu {
            percent: cpu_times(&stat).map_or(0.0, |now| sampler.percent(now)),
            count: stat
                .lines()
                .filter(|line| {
                    line.strip_prefix("cpu")
                        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
                })
                .count() as u64,
            load_avg: load_avg(&read("/proc/loadavg")),
        },
        memory,
        disk: disk(&read("/proc/diskstats"), |name| {
            Path::new("/sys/block").join(name).exists()
        }),
        network: network(&read("/proc/net/dev")),
    }
}

/// Process `pid`'s figures now, from the host's `/proc` (zeros if it is
/// gone).
pub fn process(pid: u32) -> ProcessMetrics {
    let stat = read(&format!("/proc/{pid}/stat"));
    let uptime_secs = read("/proc/uptime")
        .split_whitespace()
        .next()
        .and_then(|secs| secs.parse::<f64>().ok())
        .unwrap_or(0.0);
    process_from(&stat, uptime_secs, clock_ticks(), page_size())
}

fn read(path: &str) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

fn cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

fn load_avg(text: &str) -> [f64; 3] {
    let mut loads = text.split_whitespace().map(|n| n.parse().unwrap_or(0.0));
    [(); 3].map(|()| loads.next().unwrap_or(0.0))
}

fn memory(meminfo: &str) -> HostMemory {
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let total = kib("MemTotal");
    let available = kib("MemAvailable");
    let used = total.saturating_sub(available);
    HostMemory {
        total,
        available,
        used,
        percent: if total == 0 {
            0.0
        } else {
            100.0 * used as f64 / total as f64
        },
    }
}

/// Whole disks only (`is_disk`): a partition's figures are its disk's too.
/// Loop and RAM devices are not disks.
fn disk(diskstats: &str, is_disk: impl Fn(&str) -> bool) -> HostDisk {
    let mut total = HostDisk::default();
    for line in diskstats.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(name) = fields.get(2) else { continue };
        if name.starts_with("loop") || name.starts_with("ram") || !is_disk(name) {
            continue;
        }
        let number = |i: usize| {
            fields
                .get(i)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total.read_bytes += number(5) * SECTOR;
        total.write_bytes += number(9) * SECTOR;
    }
    total
}

fn network(net_dev: &str) -> HostNetwork {
    let mut total = HostNetwork::default();
    for line in net_dev.lines().skip(2) {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" {
            continue;
        }
        let counters: Vec<u64> = counters
            .split_whitespace()
            .map(|n| n.parse().unwrap_or(0))
            .collect();
        total.bytes_recv += counters.first().copied().unwrap_or(0);
        total.bytes_sent += counters.get(8).copied().unwrap_or(0);
    }
    total
}

fn process_from(stat: &str, uptime_secs: f64, ticks: u64, page: u64) -> ProcessMetrics {
    // The command name may hold spaces and parentheses: fields start after
    // the last ')', with the state, which is field 3.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return ProcessMetrics::default();
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (utime, stime) = (field(14), field(15));
    let ticks = ticks.max(1);
    let lived_secs = uptime_secs - field(22) as f64 / ticks as f64;
    let used_secs = (utime + stime) as f64 / ticks as f64;
    ProcessMetrics {
        cpu: ProcessCpu {
            percent: if lived_secs > 0.0 {
                100.0 * used_secs / lived_secs
            } else {
                0.0
            },
            time_user_ms: utime * 1000 / ticks,
            time_system_ms: stime * 1000 / ticks,
        },
        memory: ProcessMemory {
            rss: field(24) * page,
            vms: field(23),
        },
        threads: field(20),
    }
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a configuration value; it touches no memory.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: as above.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_is_the_busy_share_between_readings() {
        let stat = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\ncpu1 1 2 3 4\n";
        let first = cpu_times(stat).unwrap();
        assert_eq!(
            first,
            CpuTimes {
                busy: 200,
                total: 1000
            }
        );
        let sampler = CpuSampler::default();
        assert!((sampler.percent(first) - 20.0).abs() < 1e-9, "since boot");
        let later = CpuTimes {
            busy: 250,
            total: 1100,
        };
        assert!(
            (sampler.percent(later) - 50.0).abs() < 1e-9,
            "since the last"
        );
        assert_eq!(sampler.percent(later), 0.0, "no time between");
    }

    #[test]
    fn memory_load_disks_and_networks_are_read_as_numbers() {
        let memory = memory("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:  250 kB\n");
        assert_eq!(
            (memory.total, memory.available, memory.used),
            (1_024_000, 256_000, 768_000)
        );
        assert!((memory.percent - 75.0).abs() < 1e-9);
        assert_eq!(load_avg("0.50 1.25 2.00 1/100 42\n"), [0.5, 1.25, 2.0]);
        let diskstats = "   8       0 sda 10 0 4 0 20 0 8 0 0 0 0\n\
                            8       1 sda1 10 0 4 0 20 0 8 0 0 0 0\n\
                            7       0 loop0 10 0 4 0 20 0 8 0 0 0 0\n";
        let disk = disk(diskstats, |name| name == "sda");
        assert_eq!((disk.read_bytes, disk.write_bytes), (4 * 512, 8 * 512));
        let net_dev = "Inter-|   Receive\n face |bytes packets\n\
                           lo: 500 5 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n\
                         eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n";
        let network = network(net_dev);
        assert_eq!((network.bytes_recv, network.bytes_sent), (1000, 2000));
    }

    #[test]
    fn a_process_stat_is_read_past_a_name_with_spaces_and_parentheses() {
        // Fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime priority nice threads
        // itrealvalue starttime vsize rss
        let stat = "42 (a (b) c) S 1 42 42 0 -1 0 0 0 0 0 300 100 0 0 20 0 3 0 1000 8192 5";
        let metrics = process_from(stat, 30.0, 100, 4096);
        assert_eq!(metrics.cpu.time_user_ms, 3000);
        assert_eq!(metrics.cpu.time_system_ms, 1000);
        assert_eq!(metrics.threads, 3);
        assert_eq!((metrics.memory.rss, metrics.memory.vms), (5 * 4096, 8192));
        // 4 s of CPU over the 20 s since it started at 10 s.
        assert!((metrics.cpu.percent - 20.0).abs() < 1e-9);
        assert_eq!(process_from("", 1.0, 100, 4096), ProcessMetrics::default());
    }
}
