//! What a run is kept within: its timeout, its limits, its isolation from
//! other runs and the host, and what a hostile run tries on its kernel
//! socket.

use std::time::{Duration, Instant};

use agentos_test_support::{self as support, none_left, require_root, Daemon};
use serde_json::json;

use crate::exec;

#[test]
fn an_endless_run_is_killed_at_its_timeout_with_nothing_of_it_left() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let started = Instant::now();
    let reply = exec(
        &mut stream,
        json!({
            "code": "import subprocess\nsubprocess.Popen(['sleep', '313'])\nprint('looping', flush=True)\nwhile True: pass",
            "timeout_ms": 500,
        }),
    );
    let took = started.elapsed();
    assert_eq!(reply["timed_out"], true, "{reply}");
    assert_eq!(reply["success"], false);
    assert_eq!(reply["signal"], libc::SIGKILL);
    assert_eq!(reply["stdout"], "looping\n", "the output so far comes back");
    // Killed at its timeout, not left to loop: the bound is no measure
    // of how promptly (a loaded machine adds its own delay).
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    assert!(
        none_left("sleep 313", None, Duration::from_secs(1)),
        "the run's background process outlived it"
    );
}

#[test]
fn runs_never_see_each_others_files_processes_or_state() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let first = exec(
        &mut stream,
        json!({"code": "import subprocess, sys\nopen('/tmp/mine', 'w').write('1')\nopen('/workspace/mine', 'w').write('1')\nopen('relative', 'w').write('1')\nsubprocess.Popen(['sleep', '317'])\nsys.modules['left_over'] = sys\nprint('left')"}),
    );
    assert_eq!(first["stdout"], "left\n", "{first}");
    let second = exec(
        &mut stream,
        json!({"code": "import os, sys\nprint(os.path.exists('/tmp/mine'), os.path.exists('/workspace/mine'), os.path.exists('relative'), 'left_over' in sys.modules)\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getcwd())"}),
    );
    assert_eq!(
        second["stdout"], "False False False False\n[1] /workspace\n",
        "{second}"
    );
    assert!(
        none_left("sleep 317", None, Duration::from_secs(2)),
        "a run's process outlived it"
    );
}

#[test]
fn every_run_on_one_host_has_namespaces_of_its_own() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start_with("[exec]\nhosts = 1\n");
    let mut stream = daemon.raw();
    let namespaces = "import os\nprint(os.getpid(), *(os.stat(f'/proc/self/ns/{ns}').st_ino for ns in ('pid', 'net', 'mnt', 'ipc', 'uts')))";
    // Each in a session of its own, so all four are alive together: a
    // namespace's inode number is free again once it is gone.
    let seen: Vec<Vec<u64>> = (0..4)
        .map(|n| {
            let reply = exec(
                &mut stream,
                json!({"code": namespaces, "session": format!("s{n}")}),
            );
            let fields: Vec<u64> = reply["stdout"]
                .as_str()
                .unwrap_or_default()
                .split_whitespace()
                .map(|field| field.parse().unwrap())
                .collect();
            assert_eq!(fields.len(), 6, "{reply}");
            assert_eq!(fields[0], 1, "a run is PID 1 of its namespace: {reply}");
            fields
        })
        .collect();
    for kind in 1..6 {
        let mut inodes: Vec<u64> = seen.iter().map(|run| run[kind]).collect();
        inodes.sort_unstable();
        inodes.dedup();
        assert_eq!(
            inodes.len(),
            seen.len(),
            "namespace {kind} shared: {seen:?}"
        );
    }
}

#[test]
fn a_hostile_run_reaches_nothing_of_the_host() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let probe = r#"
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(what, action):
    try:
        action()
        print(what, 'REACHED')
    except OSError as err:
        print(what, 'denied', err.errno)
attempt('/root', lambda: os.listdir('/root'))
attempt('/etc/shadow', lambda: open('/etc/shadow').read(1) or (_ for _ in ()).throw(OSError(0, 'empty')))
attempt('/usr', lambda: open('/usr/agentos-probe', 'w'))
attempt('network', lambda: socket.create_connection(('1.1.1.1', 53), timeout=1))
print('unshare', libc.unshare(0x10000000), ctypes.get_errno())
print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())
print('setns', libc.setns(-1, 0), ctypes.get_errno())
status = open('/proc/self/status').read()
print([l.split()[1] for l in status.splitlines() if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))])
environ = open('/proc/1/environ', 'rb').read().decode()
print('environ', sorted(v.split('=')[0] for v in environ.split('\0') if v))
print('hosts', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
print('root', 0 in (os.getuid(), os.geteuid(), os.getgid(), os.getegid()))
"#;
    let reply = exec(&mut stream, json!({"code": probe}));
    let stdout = reply["stdout"].as_str().unwrap();
    assert!(!stdout.contains("REACHED"), "{stdout}\n{}", reply["stderr"]);
    for line in [
        "/root denied",
        "/etc/shadow denied",
        "/usr denied 30",
        "network denied",
        "unshare -1 1",
        "mount -1 1",
        // Refused by the filter (EPERM), not looked at (EBADF): the exec
        // host may setns, its runs may not.
        "setns -1 1",
        "['0000000000000000', '0000000000000000', '1']",
        "environ ['LANG', 'PATH']",
        "hosts [1]",
        "root False",
    ] {
        assert!(
            stdout.contains(line),
            "missing {line:?} in\n{stdout}\n{}",
            reply["stderr"]
        );
    }
}

/// Code that finds the socket its run child talks to the kernel on (not
/// its kernel connection, which the reactor serves like any other).
const FIND_SOCKET: &str = "import os, socket, stat\n\
    mine = int(os.environ.get('AGENTOS_SOCKET_FD', -1))\n\
    sock_fd = next(fd for fd in range(3, 256) if fd != mine and (lambda s: s is not None and stat.S_ISSOCK(s.st_mode))(\n\
        (lambda fd: os.fstat(fd) if os.path.exists(f'/proc/self/fd/{fd}') else None)(fd)))\n";

#[test]
fn a_run_flooding_its_kernel_socket_is_killed_and_the_kernel_stays_small() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    exec(&mut stream, json!({"code": "print(1)"}));
    let rss_before = daemon.rss_kib();
    let code = format!(
        "{FIND_SOCKET}chunk = b'x' * (1 << 20)\nfor _ in range(64):\n    os.write(sock_fd, chunk)\n"
    );
    let reply = exec(&mut stream, json!({"code": code, "timeout_ms": 20000}));
    assert_eq!(reply["signal"], libc::SIGKILL, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("kernel socket"),
        "{reply}"
    );
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    assert!(grown < 40 << 10, "the kernel grew by {grown} KiB");
    // Still serving.
    assert_eq!(
        exec(&mut stream, json!({"code": "print(2)"}))["stdout"],
        "2\n"
    );
}

#[test]
fn descriptors_a_run_sends_the_kernel_are_closed_not_kept() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    exec(&mut stream, json!({"code": "print(1)"}));
    let fds_before = support::settled_fd_count(&daemon);
    let code = format!(
        "{FIND_SOCKET}s = socket.socket(fileno=os.dup(sock_fd))\n\
         fds = [os.open('/dev/null', os.O_RDONLY) for _ in range(4)]\n\
         for _ in range(500):\n    socket.send_fds(s, [b'z'], fds)\nprint('sent')"
    );
    for session in [json!(null), json!("s")] {
        let reply = exec(&mut stream, json!({"code": code, "session": session}));
        assert!(
            reply["stdout"].as_str().unwrap_or("").contains("sent") || reply["error"].is_string(),
            "{reply}"
        );
    }
    exec(&mut stream, json!({"op": "close", "session": "s"}));
    let fds_after = support::settled_fd_count(&daemon);
    assert!(
        fds_after <= fds_before + 8,
        "the kernel holds {fds_after} descriptors, {fds_before} before"
    );
}

/// A run's limits, within its caller's, hold: memory (the OOM kill is
/// reported), processes and CPU — and one run's limits are not the next's.
#[test]
fn a_runs_limits_contain_memory_and_fork_bombs_and_a_busy_loop() {
    require_root!("EXEC (its isolation needs namespaces and cgroups)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let bomb = exec(
        &mut stream,
        json!({"code": "x = b'x' * (512 << 20)\nprint('survived')",
               "limits": {"memory": 64u64 << 20}}),
    );
    assert_eq!(bomb["oom_killed"], true, "{bomb}");
    assert_eq!(bomb["success"], false);
    assert_eq!(bomb["signal"], 9);
    assert!(
        bomb["error"].as_str().unwrap().contains("memory limit"),
        "{bomb}"
    );
    // Without asking, a run has EXEC's default memory limit (256 MiB).
    let default_bomb = exec(&mut stream, json!({"code": "x = b'x' * (1 << 30)"}));
    assert_eq!(default_bomb["oom_killed"], true, "{default_bomb}");
    // A process of the run killed for memory is reported too, while the
    // run itself goes on.
    let inner = exec(
        &mut stream,
        json!({"language": "bash",
               "code": "python3 -c 'x = b\"x\" * (512 << 20)'; echo \"after $?\"",
               "limits": {"memory": 64u64 << 20}}),
    );
    assert_eq!(inner["stdout"], "after 137\n", "{inner}");
    assert_eq!(inner["exit_code"], 0);
    assert_eq!(inner["oom_killed"], true);
    // In a session, an OOM kill is reported by the run it happened in only.
    let killer = concat!(
        "import subprocess\n",
        "print(subprocess.run(['python3', '-c', 'x = b\"x\" * (512 << 20)']).returncode)\n"
    );
    let first = exec(
        &mut stream,
        json!({"code": killer, "session": "oom", "limits": {"memory": 64u64 << 20}}),
    );
    assert_eq!(
        (first["stdout"].clone(), first["oom_killed"].clone()),
        (json!("-9\n"), json!(true)),
        "{first}"
    );
    let next = exec(&mut stream, json!({"code": "print(1)", "session": "oom"}));
    assert_eq!(
        (next["stdout"].clone(), next["oom_killed"].clone()),
        (json!("1\n"), json!(false)),
        "{next}"
    );
    // Processes: a run may hold `max_pids`, itself included. Forking stops
    // there with EAGAIN.
    let forks = exec(
        &mut stream,
        json!({"code": concat!(
                   "import os, time\n",
                   "started = 0\n",
                   "try:\n",
                   "    while True:\n",
                   "        if os.fork() == 0:\n",
                   "            time.sleep(30)\n",
                   "            os._exit(0)\n",
                   "        started += 1\n",
                   "except OSError as err:\n",
                   "    print(started, err.errno)\n"),
               "limits": {"max_pids": 8}}),
    );
    assert_eq!(forks["stdout"], "7 11\n", "{forks}");
    // A bash fork bomb is contained and answered at its timeout.
    let started = Instant::now();
    let fork_bomb = exec(
        &mut stream,
        json!({"language": "bash", "code": ":(){ :|:& };:; sleep 60",
               "timeout_ms": 2000, "limits": {"max_pids": 32}}),
    );
    assert_eq!(fork_bomb["timed_out"], true, "{fork_bomb}");
    assert!(started.elapsed() < Duration::from_secs(4));
    // CPU: a second of busy looping at a 10% quota gets about 0.1 s.
    let busy = concat!(
        "import time\n",
        "end = time.time() + 1\n",
        "while time.time() < end: pass\n",
        "print(round(time.process_time(), 2))\n"
    );
    let throttled = exec(
        &mut stream,
        json!({"code": busy, "limits": {"cpu_quota": 10000}}),
    );
    let cpu: f64 = throttled["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(cpu < 0.35, "a 10% quota let the run use {cpu} s in 1 s");
    // The next run is not held to the last one's limits.
    let free = exec(
        &mut stream,
        json!({"code": "x = b'x' * (100 << 20); print(len(x))"}),
    );
    assert_eq!(free["stdout"], "104857600\n", "{free}");
    // Nothing of the bombs is left, and the kernel still answers.
    assert!(none_left(
        "sleep 60",
        Some(daemon.pid()),
        Duration::from_secs(5)
    ));
    assert_eq!(
        exec(&mut stream, json!({"code": "print(1)"}))["stdout"],
        "1\n"
    );
}
