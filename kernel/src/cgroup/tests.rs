//! cgroup management against fake cgroupfs trees (v1 and v2, whatever the
//! host runs) and, as root on a v1 or v2 host, against the real one.

use std::fs;
use std::path::Path;

use super::*;

const LIMITS: CgroupLimits = CgroupLimits {
    memory: 50 << 20,
    cpu_quota: Some(10_000),
    cpu_period: 100_000,
    max_pids: 16,
};

/// What the kernel creates in a new cgroup directory, with default values.
fn populate(dir: &Path, files: &[(&str, &str)]) {
    fs::create_dir_all(dir).unwrap();
    for (name, value) in files {
        fs::write(dir.join(name), value).unwrap();
    }
}

const V2_FILES: [(&str, &str); 10] = [
    ("cgroup.controllers", "cpuset cpu io memory pids"),
    ("cgroup.subtree_control", ""),
    ("cgroup.procs", ""),
    ("memory.max", "max"),
    ("memory.swap.max", "max"),
    ("memory.current", "0"),
    ("memory.peak", "0"),
    ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"),
    ("cpu.max", "max 100000"),
    ("cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"),
];

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap().trim().to_owned()
}

#[test]
fn v2_delegates_controllers_and_writes_limits() {
    let root = tempfile::tempdir().unwrap();
    let agent = root.path().join("agentos/agentosd-42/w1");
    for dir in [
        root.path(),
        &root.path().join("agentos"),
        &root.path().join("agentos/agentosd-42"),
        &agent,
    ] {
        populate(dir, &V2_FILES);
    }
    fs::write(agent.join("pids.max"), "max").unwrap();
    let cgroups = Cgroups::fake_v2(root.path(), 42);
    assert_eq!(cgroups.version(), CgroupVersion::V2);
    cgroups.start().unwrap();
    for dir in [
        root.path(),
        &root.path().join("agentos"),
        &root.path().join("agentos/agentosd-42"),
    ] {
        assert_eq!(
            read(&dir.join("cgroup.subtree_control")),
            "+memory +cpu +pids"
        );
    }
    let cgroup = cgroups.create("w1", &LIMITS).unwrap();
    assert_eq!(cgroup.rel(), Path::new("agentos/agentosd-42/w1"));
    assert_eq!(read(&agent.join("memory.max")), (50u64 << 20).to_string());
    assert_eq!(read(&agent.join("memory.swap.max")), "0");
    assert_eq!(read(&agent.join("cpu.max")), "10000 100000");
    assert_eq!(read(&agent.join("pids.max")), "16");
    assert_eq!(cgroup.procs_files(), vec![agent.join("cgroup.procs")]);
}

#[test]
fn v2_stats_come_from_their_files() {
    let root = tempfile::tempdir().unwrap();
    let agent = root.path().join("agentos/agentosd-42/w1");
    populate(&agent, &V2_FILES);
    fs::write(agent.join("memory.current"), "1234\n").unwrap();
    fs::write(agent.join("memory.peak"), "5678\n").unwrap();
    fs::write(agent.join("memory.events"), "oom 3\noom_kill 2\n").unwrap();
    fs::write(
        agent.join("cpu.stat"),
        "usage_usec 900\nnr_periods 10\nnr_throttled 3\nthrottled_usec 77\n",
    )
    .unwrap();
    fs::write(agent.join("cgroup.procs"), "11\n12\n").unwrap();
    let cgroups = Cgroups::fake_v2(root.path(), 42);
    let cgroup = cgroups.make_agent_dirs("w1").unwrap();
    assert_eq!(
        cgroup.stats(),
        CgroupStats {
            memory_current: 1234,
            memory_peak: 5678,
            cpu_usage_usec: 900,
            nr_throttled: 3,
            throttled_usec: 77,
            oom_kills: 2,
            pids_current: 0,
            frozen: false,
        }
    );
    assert_eq!(cgroup.pids(), vec![11, 12]);
    fs::write(
        agent.join("memory.stat"),
        "anon 1000\nfile 234\nfile_mapped 9\n",
    )
    .unwrap();
    assert_eq!(cgroup.memory_cache(), 234);
    assert_eq!(cgroup.cpu_usage_usec(), 900);
    // v2's freezer is in every cgroup: its events say when it has stopped.
    fs::write(agent.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
    assert!(cgroup.stats().frozen);
}

#[test]
fn v1_writes_limits_in_each_controller_hierarchy() {
    let root = tempfile::tempdir().unwrap();
    let rel = Path::new("agentos/agentosd-42/w1");
    populate(
        &root.path().join("memory").join(rel),
        &[
            ("cgroup.procs", ""),
            ("memory.limit_in_bytes", "9223372036854771712"),
            ("memory.memsw.limit_in_bytes", "9223372036854771712"),
        ],
    );
    populate(
        &root.path().join("cpu").join(rel),
        &[
            ("cgroup.procs", ""),
            ("cpu.cfs_quota_us", "-1"),
            ("cpu.cfs_period_us", "100000"),
        ],
    );
    populate(
        &root.path().join("cpuacct").join(rel),
        &[("cgroup.procs", "")],
    );
    populate(
        &root.path().join("pids").join(rel),
        &[("cgroup.procs", ""), ("pids.max", "max")],
    );
    let cgroups = Cgroups::fake_v1(root.path(), 42);
    assert_eq!(cgroups.version(), CgroupVersion::V1);
    cgroups.start().unwrap();
    let cgroup = cgroups.create("w1", &LIMITS).unwrap();
    let memory = root.path().join("memory").join(rel);
    assert_eq!(
        read(&memory.join("memory.limit_in_bytes")),
        (50u64 << 20).to_string()
    );
    assert_eq!(
        read(&memory.join("memory.memsw.limit_in_bytes")),
        (50u64 << 20).to_string()
    );
    let cpu = root.path().join("cpu").join(rel);
    assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "10000");
    assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
    assert_eq!(
        read(&root.path().join("pids").join(rel).join("pids.max")),
        "16"
    );
    assert_eq!(cgroup.procs_files().len(), 4);
}

#[test]
fn v1_stats_convert_nanoseconds() {
    let root = tempfile::tempdir().unwrap();
    let rel = Path::new("agentos/agentosd-42/w1");
    populate(
        &root.path().join("memory").join(rel),
        &[
            ("memory.usage_in_bytes", "2048"),
            ("memory.max_usage_in_bytes", "4096"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
            ),
        ],
    );
    populate(
        &root.path().join("cpu").join(rel),
        &[(
            "cpu.stat",
            "nr_periods 40\nnr_throttled 30\nthrottled_time 5000000\n",
        )],
    );
    populate(
        &root.path().join("cpuacct").join(rel),
        &[("cpuacct.usage", "7000000")],
    );
    populate(&root.path().join("pids").join(rel), &[]);
    let cgroups = Cgroups::fake_v1(root.path(), 42);
    let cgroup = cgroups.make_agent_dirs("w1").unwrap();
    assert_eq!(
        cgroup.stats(),
        CgroupStats {
            memory_current: 2048,
            memory_peak: 4096,
            cpu_usage_usec: 7000,
            nr_throttled: 30,
            throttled_usec: 5000,
            oom_kills: 1,
            pids_current: 0,
            frozen: false,
        }
    );
    // The cache of the cgroup and what is below it.
    let stat = "cache 100\nrss 1948\ntotal_cache 1000\ntotal_rss 1048\n";
    fs::write(
        root.path().join("memory").join(rel).join("memory.stat"),
        stat,
    )
    .unwrap();
    assert_eq!(cgroup.memory_cache(), 1000);
    assert_eq!(cgroup.cpu_usage_usec(), 7000);
}

#[test]
fn instances_of_dead_daemons_are_removed_and_live_ones_kept() {
    let root = tempfile::tempdir().unwrap();
    populate(root.path(), &V2_FILES);
    populate(&root.path().join("agentos"), &V2_FILES);
    populate(&root.path().join("agentos/agentosd-42"), &V2_FILES);
    // A dead daemon's instance with an agent inside (empty directories, as
    // cgroupfs lets rmdir remove a cgroup whatever its interface files).
    fs::create_dir_all(root.path().join("agentos/agentosd-999999999/w9")).unwrap();
    fs::create_dir_all(root.path().join("agentos/not-an-instance")).unwrap();
    let cgroups = Cgroups::fake_v2(root.path(), 42);
    cgroups.start().unwrap();
    assert!(!root.path().join("agentos/agentosd-999999999").exists());
    assert!(root.path().join("agentos/agentosd-42").exists());
    assert!(root.path().join("agentos/not-an-instance").exists());
}

/// Kills and removes a real test cgroup even when an assertion fails.
struct RealCgroup {
    cgroups: Cgroups,
    cgroup: AgentCgroup,
}

impl Drop for RealCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            self.cgroup.kill_all();
            if self.cgroup.remove().is_ok() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.cgroups.shutdown();
    }
}

/// This host's cgroups, started — or `None`, said loudly, without root.
fn real_cgroups() -> Option<Cgroups> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "!!! NOT TESTED: creating real cgroups needs root; run the suite as root (CI does)"
        );
        return None;
    }
    let cgroups = match Cgroups::detect() {
        Ok(cgroups) => cgroups,
        Err(reason) => panic!("root, but no usable cgroups on this host: {reason}"),
    };
    cgroups.start().unwrap();
    Some(cgroups)
}

#[test]
fn real_cgroup_limits_a_process_and_is_removed_after_it() {
    let Some(cgroups) = real_cgroups() else {
        return;
    };
    let name = format!("unit-{}", std::process::id());
    let cgroup = cgroups.create(&name, &LIMITS).unwrap();
    let real = RealCgroup { cgroups, cgroup };
    // The process joins by itself, then allocates 20 MiB and spins a little,
    // so the figures come from work done inside the cgroup.
    let join: String = real
        .cgroup
        .procs_files()
        .iter()
        .map(|f| format!("echo 0 > {}; ", f.display()))
        .collect();
    let script = format!(
        "{join} exec python3 -c 'b = bytearray(20 << 20); sum(range(2_000_000)); \
         import time; time.sleep(30)'"
    );
    let mut child = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let stats = real.cgroup.stats();
        if stats.memory_current >= 20 << 20 || Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(real.cgroup.pids(), vec![child.id()]);
    assert!(stats.memory_current >= 20 << 20, "{stats:?}");
    assert!(stats.memory_peak >= stats.memory_current, "{stats:?}");
    assert!(stats.cpu_usage_usec > 0, "{stats:?}");
    assert_eq!(real.cgroup.oom_kills(), 0);
    let _watch = real.cgroup.watch_oom().unwrap();
    real.cgroup.kill_all();
    child.wait().unwrap();
    let instance_dirs = real.cgroups.backend.dirs(&real.cgroups.instance);
    drop(real);
    for dir in instance_dirs {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

#[test]
fn why_a_host_has_no_cgroups_is_one_sentence_for_degraded_reason() {
    let reasons = [
        (
            DetectError::NotRoot,
            "agentosd is not running as root, so it cannot create cgroups: memory, cpu and pids \
             limits are not enforced",
        ),
        (
            DetectError::Unreadable {
                path: "/proc/self/mountinfo".into(),
                source: io::Error::other("gone"),
            },
            "cannot read /proc/self/mountinfo: gone",
        ),
        (
            DetectError::MissingV2Controllers {
                mount: "/sys/fs/cgroup".into(),
                missing: vec!["memory", "pids"],
            },
            "cgroup v2 at /sys/fs/cgroup does not offer the memory, pids controller(s): limits \
             cannot be enforced",
        ),
        (
            DetectError::MissingV1Hierarchy { controller: "cpu" },
            "no cgroup v1 hierarchy with the cpu controller is mounted, and /sys/fs/cgroup is \
             not cgroup v2: limits cannot be enforced",
        ),
    ];
    for (reason, sentence) in reasons {
        assert_eq!(reason.to_string(), sentence);
    }
}

#[test]
fn real_memory_limits_can_be_raised_as_well_as_lowered() {
    let Some(cgroups) = real_cgroups() else {
        return;
    };
    let name = format!("unit-raise-{}", std::process::id());
    let small = CgroupLimits {
        memory: 64 << 20,
        ..LIMITS
    };
    let cgroup = cgroups.create(&name, &small).unwrap();
    let real = RealCgroup { cgroups, cgroup };
    let in_force = || real.cgroups.backend.memory_limit(real.cgroup.rel());
    assert_eq!(in_force(), Some(64 << 20));
    // v1 refuses a memory limit above the memory+swap one: raising must
    // write that one first.
    let big = CgroupLimits {
        memory: 256 << 20,
        ..LIMITS
    };
    real.cgroup.apply(&big).unwrap();
    assert_eq!(in_force(), Some(256 << 20));
    real.cgroup.apply(&small).unwrap();
    assert_eq!(in_force(), Some(64 << 20));
}
