//! The exec hosts behind EXEC: the run children they prepare (with a shell
//! once bash runs come), many runs at once with the reactor still fast, a
//! host that crashes or never comes, and none left behind by a killed
//! kernel, and runs prepared in the background yet served on a busy host.

use std::fs;
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{self as support, none_left, processes_with, require_root, Daemon};
use serde_json::json;

use crate::exec;

#[test]
fn a_killed_kernel_leaves_no_exec_host_or_run_behind() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // A run still going when the kernel dies.
    support::send(
        &mut stream,
        Opcode::EXEC,
        json!({"code": "import subprocess, time\nsubprocess.Popen(['sleep', '331'])\ntime.sleep(60)"})
            .to_string()
            .as_bytes(),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes_with("sleep 331", None) == 0 {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kernel = Some(daemon.pid());
    assert!(
        processes_with("The exec host's interpreter", kernel) > 0,
        "no zygote found"
    );
    daemon.signal(libc::SIGKILL);
    assert!(
        none_left("sleep 331", None, Duration::from_secs(2)),
        "a run outlived the kernel"
    );
    assert!(
        none_left(
            "The exec host's interpreter",
            kernel,
            Duration::from_secs(2)
        ),
        "a zygote or run child outlived the kernel"
    );
}

#[test]
fn a_hundred_concurrent_runs_are_all_answered_while_noops_stay_fast() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let noops_done = std::sync::atomic::AtomicBool::new(false);
    let (answered, noop_p99) = std::thread::scope(|scope| {
        let runners: Vec<_> = (0..10)
            .map(|connection| {
                let daemon = &daemon;
                scope.spawn(move || {
                    let mut stream = daemon.raw();
                    stream
                        .set_read_timeout(Some(Duration::from_secs(60)))
                        .unwrap();
                    // Ten EXECs pipelined on the connection, answered in order.
                    for run in 0..10 {
                        let code = json!({"code": format!("print({connection} * 100 + {run})")});
                        support::send(&mut stream, Opcode::EXEC, code.to_string().as_bytes());
                    }
                    (0..10)
                        .filter(|run| {
                            let (_, reply) = support::recv_json(&mut stream);
                            reply["stdout"] == format!("{}\n", connection * 100 + run)
                        })
                        .count()
                })
            })
            .collect();
        let noops = scope.spawn(|| {
            let mut stream = daemon.raw();
            let mut latencies = Vec::new();
            while !noops_done.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                support::send(&mut stream, Opcode::NOOP, b"ping");
                support::recv(&mut stream);
                latencies.push(started.elapsed());
                std::thread::sleep(Duration::from_millis(2));
            }
            latencies.sort_unstable();
            latencies[latencies.len() * 99 / 100]
        });
        let answered: usize = runners.into_iter().map(|r| r.join().unwrap()).sum();
        noops_done.store(true, std::sync::atomic::Ordering::Relaxed);
        (answered, noops.join().unwrap())
    });
    assert_eq!(answered, 100, "every run answered, with its own output");
    // A reactor that waited on runs would take the hundred runs' time,
    // seconds. The bound is no measure of speed (benches measure that):
    // it leaves room for two cores busy with the runs and anything else
    // the machine runs.
    assert!(
        noop_p99 < Duration::from_millis(100),
        "NOOP p99 {noop_p99:?} meanwhile"
    );
    // Runs' cgroups serve run after run: a hundred runs leave a handful of
    // them, not a hundred.
    if !std::path::Path::new("/sys/fs/cgroup/memory").is_dir() {
        eprintln!("!!! NOT TESTED: run cgroups are counted on cgroup v1's memory hierarchy only");
        return;
    }
    let instance = format!("/sys/fs/cgroup/memory/agentos/agentosd-{}", daemon.pid());
    let run_cgroups = fs::read_dir(&instance)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("exec-run-"))
                .count()
        })
        .unwrap_or(0);
    assert!(
        (1..=48).contains(&run_cgroups),
        "{run_cgroups} run cgroups in {instance}"
    );
}

/// Pids of processes whose command line holds `marker`, in the cgroups of
/// the kernel with pid `kernel`.
fn pids_with(marker: &str, kernel: i32) -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|cgroups| cgroups.contains(&format!("agentosd-{kernel}/")))
        })
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

#[test]
fn a_crashed_exec_host_is_replaced_and_its_runs_are_answered() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    assert_eq!(
        exec(&mut stream, json!({"code": "print(1)"}))["stdout"],
        "1\n"
    );
    // A run in flight when its host dies.
    support::send(
        &mut stream,
        Opcode::EXEC,
        json!({"code": "import time\nprint('working', flush=True)\ntime.sleep(30)"})
            .to_string()
            .as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let zygote = *zygotes(daemon.pid()).first().expect("a zygote");
    // SAFETY: kill(2) on a process of the kernel under test.
    unsafe {
        libc::kill(zygote, libc::SIGKILL);
    }
    let (_, in_flight) = support::recv_json(&mut stream);
    assert_eq!(in_flight["success"], false, "{in_flight}");
    assert_eq!(in_flight["stdout"], "working\n", "{in_flight}");
    // Another host comes up, and runs work again.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let reply = exec(&mut stream, json!({"code": "print(2)", "timeout_ms": 5000}));
        if reply["stdout"] == "2\n" {
            break;
        }
        assert!(Instant::now() < deadline, "no new host: {reply}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_run_waiting_for_a_host_that_never_comes_is_answered_at_its_timeout() {
    require_root!("EXEC (its isolation needs namespaces)");
    // A "Python" that exits at once: the host never comes up.
    let daemon = Daemon::start_with("[exec]\npython = \"/bin/false\"\n");
    let mut stream = daemon.raw();
    let started = Instant::now();
    let reply = exec(&mut stream, json!({"code": "print(1)", "timeout_ms": 700}));
    let took = started.elapsed();
    assert_eq!(reply["timed_out"], true, "{reply}");
    assert_eq!(reply["code"], "timeout", "{reply}");
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn a_bash_run_takes_a_shell_started_before_it_came() {
    require_root!("EXEC (its isolation needs namespaces)");
    // Once bash runs come, every run prepared has a shell: Python runs
    // given one must stop it first.
    let daemon = Daemon::start_with("[exec]\nready_runs = 2\nready_shells = 2\n");
    let mut stream = daemon.raw();
    let first = exec(
        &mut stream,
        json!({"language": "bash", "code": "echo first"}),
    );
    assert_eq!(first["stdout"], "first\n", "{first}");
    for _ in 0..3 {
        let python = exec(&mut stream, json!({"code": "print(1)"}));
        assert_eq!(python["stdout"], "1\n", "{python}");
    }
    let script = concat!(
        "echo \"$BASH_EXECUTION_STRING\"\n",
        "pwd\n",
        "echo \"$X\"\n",
        "[ -S /proc/self/fd/$AGENTOS_SOCKET_FD ] && echo socket\n",
        "exit 3"
    );
    let request = json!({"language": "bash", "code": script, "cwd": "/tmp",
                         "env": {"X": "it's \"here\""}});
    // The shells start in the background: a run may come before one is.
    let mut bash = exec(&mut stream, request.clone());
    for _ in 0..50 {
        if bash["stdout"]
            .as_str()
            .unwrap()
            .starts_with(". /proc/self/fd/3")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        bash = exec(&mut stream, request.clone());
    }
    assert_eq!(
        bash["stdout"], ". /proc/self/fd/3\n/tmp\nit's \"here\"\nsocket\n",
        "a shell started before the run, given its directory, environment and connection: {bash}"
    );
    assert_eq!(bash["exit_code"], 3);
    // An environment bash cannot say is given to a shell started for it.
    let odd = exec(
        &mut stream,
        json!({"language": "bash", "code": "echo \"$BASH_EXECUTION_STRING\"", "env": {"A.B": "x"}}),
    );
    assert_eq!(odd["stdout"], "echo \"$BASH_EXECUTION_STRING\"\n", "{odd}");
}

#[test]
fn runs_are_prepared_at_background_priority_and_still_served_while_every_cpu_is_busy() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nhosts = 1\nready_runs = 1\n");
    let mut stream = daemon.raw();
    let nice = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))";
    let reply = exec(&mut stream, json!({"code": nice}));
    assert_eq!(
        reply["stdout"], "0\n",
        "a run runs at normal priority: {reply}"
    );
    let zygotes = zygotes(daemon.pid());
    assert_eq!(zygotes.len(), 1, "one zygote: {zygotes:?}");
    let run_cgroups = fs::read_dir(format!("/proc/{}/task", daemon.pid()))
        .unwrap()
        .flatten()
        .find(|task| {
            fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.starts_with("agentos-run-cg"))
        })
        .expect("the kernel's run-cgroup thread")
        .path();
    let run_cgroups = format!(
        "{}/task/{}",
        daemon.pid(),
        run_cgroups.file_name().unwrap().to_string_lossy()
    );
    for (what, task) in [
        ("the zygote", zygotes[0].to_string()),
        ("the run-cgroup thread", run_cgroups),
    ] {
        // Normal scheduling (policy 0, not the idle class's 5) at nice 10.
        assert_eq!(
            stat_field(&task, 41),
            0,
            "{what} is in the normal scheduling class"
        );
        assert_eq!(
            stat_field(&task, 19),
            10,
            "{what} works at background priority"
        );
    }
    // Every CPU kept busy twice over at normal priority: in the idle class
    // the zygote would never prepare the next run.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let _hogs = Hogs::start(2 * cpus);
    for _ in 0..3 {
        let started = Instant::now();
        let reply = exec(&mut stream, json!({"code": nice, "timeout_ms": 30000}));
        assert_eq!(reply["stdout"], "0\n", "{reply}");
        eprintln!("a run on a busy host answered in {:?}", started.elapsed());
    }
}

/// Field `index` (1-based, as proc(5) counts) of /proc/`task`/stat, where
/// `task` is a pid or `pid/task/tid`.
fn stat_field(task: &str, index: usize) -> i64 {
    read_stat_field(task, index).unwrap_or_else(|| panic!("/proc/{task}/stat is gone"))
}

/// [`stat_field`], or `None` once the process is gone (a run child that
/// exits while the test looks at it).
fn read_stat_field(task: &str, index: usize) -> Option<i64> {
    let stat = fs::read_to_string(format!("/proc/{task}/stat")).ok()?;
    // The command may hold spaces and parentheses: count after its last ')'.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(index - 3)?.parse().ok()
}

/// The exec hosts' zygotes: each is PID 1 of its own PID namespace, forked
/// by the process the sandbox's init started (which only waits for it);
/// the run children it forks hold the same source a generation further down.
fn zygotes(kernel: i32) -> Vec<i32> {
    pids_with("The exec host's interpreter", kernel)
        .into_iter()
        .filter(|pid| {
            parent_of(*pid)
                .and_then(parent_of)
                .and_then(|grandparent| fs::read(format!("/proc/{grandparent}/cmdline")).ok())
                .is_some_and(|c| String::from_utf8_lossy(&c).contains("__agentos-sandbox-init"))
        })
        .collect()
}

/// The parent of `pid`, or `None` if it is gone.
fn parent_of(pid: i32) -> Option<i32> {
    read_stat_field(&pid.to_string(), 4).map(|parent| parent as i32)
}

/// Shells spinning at normal priority, killed when dropped.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start(count: usize) -> Hogs {
        Hogs(
            (0..count)
                .map(|_| {
                    std::process::Command::new("/bin/sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}
