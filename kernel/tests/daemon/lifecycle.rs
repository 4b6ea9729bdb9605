//! The daemon's life: its socket (mode, lock, stale files, removal), who may
//! connect, signals, draining, and configuration errors.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{
    agentos, agentosd, assert_closed, assert_usable, is_root, recv_json, send, Daemon, StopOnDrop,
    WorldExecutable,
};

#[test]
fn socket_is_a_0660_socket_removed_on_sigterm() {
    let daemon = Daemon::start();
    let socket = daemon.socket.clone();
    let meta = fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let status = daemon.stop();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "socket left behind");
}

#[test]
fn sigint_and_sigquit_stop_cleanly_too() {
    for signal in [libc::SIGINT, libc::SIGQUIT] {
        let mut daemon = Daemon::start();
        daemon.signal(signal);
        assert!(
            daemon.wait(Duration::from_secs(10)).success(),
            "signal {signal}"
        );
        assert!(!daemon.socket.exists());
    }
}

#[test]
fn a_second_daemon_on_a_live_socket_refuses_to_start() {
    let first = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let mut second = Daemon::spawn_at(dir, first.socket.clone(), "");
    let status = second.wait(Duration::from_secs(10));
    assert!(!status.success());
    assert!(second.log().contains("already serving"), "{}", second.log());
    // The first is untouched.
    assert_usable(&mut first.raw());
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agentos.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "stale socket prepared");
    let daemon = Daemon::spawn_at(dir, socket.clone(), "");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(std::time::Instant::now() < deadline, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(daemon.log().contains("removing stale socket"));
    assert_usable(&mut daemon.raw());
}

#[test]
fn replies_in_flight_are_delivered_during_shutdown() {
    let mut daemon =
        Daemon::start_with("[debug]\ndefer_opcodes = [\"hello\"]\ndefer_delay_ms = 400\n");
    let mut stream = daemon.raw();
    send(&mut stream, Opcode::HELLO, b"");
    // Let the kernel take the request before the signal.
    std::thread::sleep(Duration::from_millis(100));
    daemon.signal(libc::SIGTERM);
    let (header, reply) = recv_json(&mut stream);
    assert_eq!(header.opcode, Opcode::HELLO);
    assert_eq!(reply["success"], true);
    assert_closed(&mut stream);
    assert!(daemon.wait(Duration::from_secs(10)).success());
    assert!(!daemon.socket.exists());
}

#[test]
fn idle_connections_do_not_delay_shutdown() {
    let mut daemon = Daemon::start_with("shutdown_grace_ms = 60000\n");
    let _idle: Vec<_> = (0..10).map(|_| daemon.raw()).collect();
    let started = std::time::Instant::now();
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(Duration::from_secs(10)).success());
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn invalid_configuration_exits_with_status_2_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    fs::write(&config, "max_request_bytes = 0\n").unwrap();
    let output = Command::new(agentosd())
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("max_request_bytes"), "{stderr}");
    assert!(!dir.path().join("s.sock").exists());
}

#[test]
fn users_outside_the_socket_group_are_refused_and_members_admitted() {
    if !is_root() {
        eprintln!(
            "!!! NOT TESTED: refusing non-operators needs root to run a client as another \
             user; run the suite as root (CI does)"
        );
        return;
    }
    let daemon = Daemon::start();
    let cli = WorldExecutable::copy_of(agentos());
    // Open the path up so the kernel's own check is what decides.
    fs::set_permissions(daemon.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&daemon.socket, fs::Permissions::from_mode(0o666)).unwrap();
    let as_user = |uid: u32, gid: u32| {
        Command::new(&cli.path)
            .args(["--socket"])
            .arg(&daemon.socket)
            .arg("hello")
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap()
    };
    // nobody:nogroup is neither root, the daemon's user, nor in its group.
    let stranger = as_user(65534, 65534);
    assert!(!stranger.status.success());
    let stderr = String::from_utf8_lossy(&stranger.stderr);
    // The CLI says it in its own words: the refusal, and that it is one.
    assert!(stderr.contains("not allowed"), "{stderr}");
    // The same uid with the socket's group (root's, gid 0) is an operator.
    let member = as_user(65534, 0);
    assert!(
        member.status.success(),
        "{}\nkernel log:\n{}",
        String::from_utf8_lossy(&member.stderr),
        daemon.log()
    );
    assert!(daemon.log().contains("refusing pid"));
}

#[test]
fn a_configured_socket_group_owns_the_socket() {
    if !is_root() {
        eprintln!(
            "!!! NOT TESTED: chown to another group needs root; run the suite as root (CI does)"
        );
        return;
    }
    let daemon = Daemon::start_with("socket_group = \"65534\"\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(&daemon.socket).unwrap().gid(), 65534);
    let reply = daemon.client().hello().unwrap();
    assert!(reply.success);
}

#[test]
fn an_unprivileged_daemon_serves_from_its_private_runtime_directory() {
    if !is_root() {
        eprintln!(
            "!!! NOT TESTED: running the daemon as another user needs root; run the suite \
             as root (CI does)"
        );
        return;
    }
    use std::os::unix::fs::MetadataExt;
    const NOBODY: u32 = 65534;
    let daemon_bin = WorldExecutable::copy_of(agentosd());
    let cli = WorldExecutable::copy_of(agentos());
    // No socket named anywhere and no XDG_RUNTIME_DIR: the protocol's rule
    // gives /tmp/agentos-65534/agentos.sock, for the daemon and clients alike.
    let dir = std::path::PathBuf::from(format!("/tmp/agentos-{NOBODY}"));
    let socket = dir.join("agentos.sock");
    let as_nobody = |program: &std::path::Path| {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("AGENTOS_CONFIG", "/dev/null")
            .uid(NOBODY)
            .gid(NOBODY);
        command
    };
    let mut daemon = StopOnDrop(
        as_nobody(&daemon_bin.path)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no socket at {}",
            socket.display()
        );
        assert!(daemon.0.try_wait().unwrap().is_none(), "daemon exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    let dir_meta = fs::metadata(&dir).unwrap();
    assert_eq!(dir_meta.uid(), NOBODY);
    assert_eq!(dir_meta.mode() & 0o777, 0o700);
    assert_eq!(fs::metadata(&socket).unwrap().mode() & 0o777, 0o660);

    let hello = as_nobody(&cli.path).arg("hello").output().unwrap();
    assert!(
        hello.status.success(),
        "{}",
        String::from_utf8_lossy(&hello.stderr)
    );
    assert!(String::from_utf8_lossy(&hello.stdout).contains("AgentOS kernel"));

    assert!(daemon.stop().success());
    assert!(!socket.exists());
    fs::remove_dir_all(&dir).unwrap();
}
