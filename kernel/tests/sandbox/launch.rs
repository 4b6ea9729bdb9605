//! The sandbox mechanism on its own: launch a workload through the real
//! launcher and init (the built agentosd), and look at what it saw.

use std::fs;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentos_kernel::process;
use agentos_kernel::sandbox::plan::{self, Shape, Workload};
use agentos_kernel::sandbox::{LaunchRequest, Launcher, Status};
use agentos_test_support::{agentosd, is_root};

struct Run {
    statuses: Vec<Status>,
    log: String,
}

fn run_shell(script: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let log_path = dir.path().join("agent.log");
    let log = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&log_path)
        .unwrap();
    let workload = Workload {
        name: "probe".into(),
        program: PathBuf::from("/bin/sh"),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: None,
        script: None,
        binds: Vec::new(),
        socket: Some(socket),
    };
    let spec = plan::sandbox(&crate::sandbox_profile(dir.path()), Shape::DEFAULT);
    let launcher = Launcher::new(agentosd()).unwrap();
    let mut launched = launcher
        .launch(LaunchRequest {
            spec,
            cgroup: None,
            map_to: None,
        })
        .unwrap();
    launched
        .control
        .claim(&plan::claim(Shape::DEFAULT, &workload), &log)
        .unwrap();
    launched.control.start().unwrap();
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (mut new, closed) = launched.status.read_available();
        statuses.append(&mut new);
        if closed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox did not finish: {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Reap the init.
    process::wait(launched.pidfd.as_fd(), true);
    let mut log = String::new();
    fs::File::open(&log_path)
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    Run { statuses, log }
}

#[test]
fn a_sandboxed_shell_sees_only_its_own_world() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    let run = run_shell(
        "echo uid=$(id -u); echo host=$(hostname); ls /proc | grep -c '^[0-9]'; \
         cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; \
         grep CapEff /proc/self/status; ls /root 2>&1 | head -1; \
         touch /usr/x 2>&1 | head -1; echo ok > /workspace/f && cat /workspace/f; \
         cat /etc/shadow | wc -c; exit 3",
    );
    assert!(
        matches!(run.statuses.first(), Some(Status::Ready { .. })),
        "{:?}\n{}",
        run.statuses,
        run.log
    );
    assert_eq!(run.statuses.last(), Some(&Status::Exited(3)), "{}", run.log);
    let log = &run.log;
    assert!(log.contains("uid=65534"), "{log}");
    assert!(log.contains("host=agent-probe"), "{log}");
    assert!(log.contains("CapEff:\t0000000000000000"), "{log}");
    assert!(log.contains("Read-only file system"), "{log}");
    assert!(log.contains("\nok\n"), "{log}");
    let lines: Vec<&str> = log.lines().collect();
    // PID 1 (the init), the shell and its pipeline: nothing of the host.
    let pids: usize = lines[2].trim().parse().unwrap();
    assert!(pids <= 5, "{pids} processes visible:\n{log}");
    assert_eq!(lines[3], "lo", "interfaces:\n{log}");
    assert!(log.contains("/root': No such file"), "{log}");
    assert_eq!(
        lines.last().map(|l| l.trim()),
        Some("0"),
        "/etc/shadow must read as empty:\n{log}"
    );
}

#[test]
fn a_claims_channel_reaches_the_workload_alone() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("host.log");
    let log = fs::File::create(&log_path).unwrap();
    let socket = dir.path().join("agent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // The workload answers on its channel, closes it, and lingers: the
    // daemon's end must see the close while the sandbox still runs, so no
    // other process of the sandbox may hold a copy.
    let workload = Workload {
        name: "host".into(),
        program: PathBuf::from("/bin/sh"),
        argv: vec![
            "sh".into(),
            "-c".into(),
            "read line <&8; echo \"pong $line\" >&8; exec 8>&-; sleep 3".into(),
        ],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: None,
        script: None,
        binds: Vec::new(),
        socket: Some(socket),
    };
    let spec = plan::sandbox(&crate::sandbox_profile(dir.path()), Shape::DEFAULT);
    let launcher = Launcher::new(agentosd()).unwrap();
    let mut launched = launcher
        .launch(LaunchRequest {
            spec,
            cgroup: None,
            map_to: None,
        })
        .unwrap();
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    launched
        .control
        .claim_with_channel(
            &plan::claim(Shape::DEFAULT, &workload),
            &log,
            Some(theirs.as_fd()),
        )
        .unwrap();
    drop(theirs);
    launched.control.start().unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    ours.write_all(b"ping\n").unwrap();
    let mut reader = BufReader::new(ours.try_clone().unwrap());
    let mut line = String::new();
    let answered = reader.read_line(&mut line);
    let statuses = launched.status.read_available().0;
    let log = fs::read_to_string(&log_path).unwrap();
    assert!(answered.is_ok(), "{answered:?}\n{statuses:?}\n{log}");
    assert_eq!(line, "pong ping\n", "{statuses:?}\n{log}");
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    let (_, closed) = launched.status.read_available();
    assert!(
        !closed,
        "the channel closed only when the whole sandbox ended: someone else held it"
    );
    crate::kill_and_reap(&launched);
}
