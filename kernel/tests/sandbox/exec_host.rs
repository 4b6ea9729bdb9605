//! The exec host on its own: the zygote as the workload of a real sandbox
//! (the built agentosd's launcher and init), driven over its channel the
//! way the kernel drives it.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentos_kernel::exec::wire::{self, OrderOp, Ready, RunEnd, RunOrder};
use agentos_kernel::exec::zygote::{self, ExecHostSetup};
use agentos_kernel::sandbox::plan::{self, Shape};
use agentos_kernel::sandbox::{LaunchRequest, Launched, Launcher};
use agentos_test_support::{agentosd, is_root};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

const PYTHON: &str = "/usr/bin/python3";

/// A running exec host and the kernel's end of its channel.
struct Host {
    launched: Launched,
    /// Holds the lifeline: the host lives only as long as its launcher.
    _launcher: Launcher,
    channel: OwnedFd,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Host {
    fn start() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let profile = crate::sandbox_profile(dir.path());
        let setup = ExecHostSetup {
            python: PathBuf::from(PYTHON),
            ready_runs: 2,
            tmp_bytes: 8 << 20,
            workspace_bytes: 8 << 20,
            tools_dir: None,
        };
        let workload = zygote::workload(&setup);
        let log = dir.path().join("host.log");
        let log_file = fs::File::create(&log).unwrap();
        let spec = plan::sandbox(&profile, Shape::EXEC_HOST);
        let launcher = Launcher::new(agentosd()).unwrap();
        let launched = launcher
            .launch(LaunchRequest {
                spec,
                cgroup: None,
                map_to: None,
            })
            .unwrap();
        let (channel, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        launched
            .control
            .claim_with_channel(
                &plan::claim(Shape::EXEC_HOST, &workload),
                &log_file,
                Some(theirs.as_fd()),
            )
            .unwrap();
        drop(theirs);
        nix::sys::socket::send(
            channel.as_raw_fd(),
            &zygote::settings(&setup),
            nix::sys::socket::MsgFlags::empty(),
        )
        .unwrap();
        launched.control.start().unwrap();
        Host {
            launched,
            _launcher: launcher,
            channel,
            log,
            _dir: dir,
        }
    }

    /// Asks for one more run child (with no cgroup of its own) and waits
    /// up to ten seconds for it.
    fn next_ready(&mut self) -> Ready {
        wire::send_cgroup(self.channel.as_fd(), 0, &[]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match wire::receive_ready(self.channel.as_fd()) {
                Ok(Some(ready)) => return ready,
                Ok(None) => {
                    // What the host said on its way out comes just after.
                    std::thread::sleep(Duration::from_millis(500));
                    panic!(
                        "the host went away: {:?}\n{}",
                        self.launched.status.read_available().0,
                        self.log()
                    )
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(err) => panic!("{err}: {}", self.log()),
            }
            assert!(Instant::now() < deadline, "no run child: {}", self.log());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        crate::kill_and_reap(&self.launched);
    }
}

/// A prepared run child, with the pidfd it sends first.
fn claim(ready: Ready) -> (Ready, OwnedFd) {
    let pidfd = wire::receive_pidfd(ready.socket.as_fd())
        .unwrap()
        .expect("the run child went away before sending its pidfd");
    (ready, pidfd)
}

/// A sessionless order for `code`.
fn order(language: &str, code: &str) -> RunOrder {
    RunOrder {
        op: OrderOp::Run,
        code: code.into(),
        language: serde_json::from_value(language.into()).unwrap(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        cwd: None,
        files: BTreeMap::new(),
        collect: Vec::new(),
        max_file_bytes: 1 << 20,
        max_collect_bytes: 4 << 20,
        keep: false,
        on_disk: false,
        template: false,
        join: 0,
        trace: None,
        print_last_expression: false,
        skip_if_not_code: false,
        load_state: false,
    }
}

/// Runs `code` on a prepared child; returns stdout, stderr and its end.
fn run(ready: Ready, language: &str, code: &str) -> (String, String, RunEnd) {
    let (ready, _pidfd) = claim(ready);
    let mut socket = UnixStream::from(ready.socket);
    socket
        .write_all(&wire::frame(&order(language, code)))
        .unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buffer = Vec::new();
    let end = loop {
        if let Some(end) = wire::take_frame::<RunEnd>(&mut buffer) {
            break end.unwrap();
        }
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).unwrap();
        assert!(n > 0, "the run ended without saying how");
        buffer.extend_from_slice(&chunk[..n]);
    };
    let drain = |fd: OwnedFd| {
        let mut text = String::new();
        fs::File::from(fd).read_to_string(&mut text).unwrap();
        text
    };
    (drain(ready.stdout), drain(ready.stderr), end)
}

#[test]
fn the_zygote_hands_over_run_children_that_run_python_and_bash() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    let mut host = Host::start();
    let (stdout, stderr, end) = run(host.next_ready(), "python", "print(6 * 7)");
    assert_eq!((stdout.as_str(), stderr.as_str()), ("42\n", ""));
    assert_eq!(
        end,
        RunEnd {
            exit_code: 0,
            error: None,
            files: BTreeMap::new(),
            uncollected: Vec::new(),
            workspace_bytes: None,
            left_out: Vec::new(),
            not_code: None,
        }
    );
    let (stdout, stderr, end) = run(
        host.next_ready(),
        "python",
        "print('before')\nraise ValueError('no such thing')",
    );
    assert_eq!(stdout, "before\n");
    assert!(stderr.contains("Traceback"), "{stderr}");
    assert_eq!(end.exit_code, 1);
    assert_eq!(end.error.as_deref(), Some("ValueError: no such thing"));
    let (_, _, end) = run(host.next_ready(), "python", "import sys; sys.exit(3)");
    assert_eq!(end.exit_code, 3);
    let (stdout, _, end) = run(host.next_ready(), "bash", "echo $((2+3)); exit 4");
    assert_eq!((stdout.as_str(), end.exit_code), ("5\n", 4));
}

#[test]
fn every_run_child_is_a_fresh_interpreter_forked_for_it() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    let mut host = Host::start();
    let code = "import sys\nsys.left_by_first = True\nleaked = 'secret'\nprint('set')";
    let (first, _, _) = run(host.next_ready(), "python", code);
    let (second, _, _) = run(
        host.next_ready(),
        "python",
        "import sys\nprint('leaked' in globals(), hasattr(sys, 'left_by_first'))",
    );
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("set\n", "False False\n")
    );
}

#[test]
fn runs_see_none_of_each_others_files_or_processes() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    let mut host = Host::start();
    let leave = "open('/tmp/left', 'w').write('x')\nopen('/workspace/left', 'w').write('x')\n\
                 import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('left')";
    let (stdout, stderr, _) = run(host.next_ready(), "python", leave);
    assert_eq!(stdout, "left\n", "{stderr}");
    let look = "import os\n\
                print(os.path.exists('/tmp/left'), os.path.exists('/workspace/left'))\n\
                print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n\
                print(os.uname().nodename)";
    let (stdout, stderr, _) = run(host.next_ready(), "python", look);
    assert_eq!(stdout, "False False\n[1]\nrun\n", "{stderr}");
}

#[test]
fn a_run_has_no_privileges_and_the_whole_filter() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    let mut host = Host::start();
    let probe = "import ctypes, os\n\
                 libc = ctypes.CDLL(None, use_errno=True)\n\
                 status = open('/proc/self/status').read()\n\
                 print([l.split()[1] for l in status.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Seccomp:'))])\n\
                 print(libc.unshare(0x10000000), ctypes.get_errno() == 1)\n\
                 print(len(open('/proc/keys', 'rb').read(16)))\n\
                 try:\n    open('/proc/sys/kernel/hostname', 'w').write('x')\nexcept OSError as e:\n    print(e.errno)";
    let (stdout, stderr, _) = run(host.next_ready(), "python", probe);
    assert_eq!(
        stdout,
        "['0000000000000000', '0000000000000000', '0000000000000000', '1', '2']\n-1 True\n0\n30\n",
        "{stderr}"
    );
}

#[test]
fn killing_a_run_through_its_pidfd_ends_all_it_started() {
    if !is_root() {
        eprintln!("!!! NOT TESTED: sandboxes with a separate agent user need root; run the suite as root (CI does)");
        return;
    }
    let mut host = Host::start();
    let (ready, pidfd) = claim(host.next_ready());
    let mut socket = UnixStream::from(ready.socket);
    let spin = "import subprocess\nsubprocess.Popen(['sleep', '300'])\n\
                print('spinning', flush=True)\nwhile True: pass";
    socket
        .write_all(&wire::frame(&order("python", spin)))
        .unwrap();
    let mut stdout = fs::File::from(ready.stdout);
    let mut first = [0u8; 9];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"spinning\n");
    agentos_kernel::process::signal(pidfd.as_fd(), libc::SIGKILL).unwrap();
    // Every writer of the pipe is gone, the sleep included: EOF, at once.
    let started = Instant::now();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut end = Vec::new();
    socket.read_to_end(&mut end).unwrap();
    assert!(end.is_empty(), "a killed run said how it ended: {end:?}");
}
