//! A kernel that is not root: `agentosd` run as `nobody`, from a copy of
//! the binary that user may execute.

use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentos_proto::Client;

use crate::agents::shared_dir;
use crate::binaries::agentosd;
use crate::daemon::StopOnDrop;

/// A copy of one of our binaries that any user can execute, wherever the
/// workspace happens to live (its path may not be traversable by others).
/// Removed when dropped.
#[derive(Debug)]
pub struct WorldExecutable {
    _dir: tempfile::TempDir,
    /// Where the copy is.
    pub path: PathBuf,
}

impl WorldExecutable {
    /// Copies `binary` into a directory of its own that anyone may enter.
    pub fn copy_of(binary: &Path) -> WorldExecutable {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("agentos-bin-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join(binary.file_name().unwrap());
        fs::copy(binary, &path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        WorldExecutable { _dir: dir, path }
    }
}

/// The uid of `nobody`, which an unprivileged kernel runs as in tests.
pub const NOBODY: u32 = 65534;

/// A daemon run as `nobody` (needs root to start), serving `<dir>/k.sock`
/// from a directory it owns, where its log and its agents' logs go too.
/// Stopped on drop.
#[derive(Debug)]
pub struct UnprivilegedDaemon {
    /// The daemon's process.
    pub process: StopOnDrop,
    /// Its directory, owned by `nobody`.
    pub dir: tempfile::TempDir,
    /// The socket it serves.
    pub socket: PathBuf,
    _binary: WorldExecutable,
}

impl UnprivilegedDaemon {
    /// Starts it with no config and a clean environment, and waits until
    /// its socket accepts connections.
    pub fn start() -> UnprivilegedDaemon {
        use std::os::unix::process::CommandExt;
        let binary = WorldExecutable::copy_of(agentosd());
        let dir = shared_dir();
        let socket = dir.path().join("k.sock");
        nix::unistd::chown(
            dir.path(),
            Some(nix::unistd::Uid::from_raw(NOBODY)),
            Some(nix::unistd::Gid::from_raw(NOBODY)),
        )
        .unwrap();
        let log = dir.path().join("daemon.log");
        let process = StopOnDrop(
            Command::new(&binary.path)
                .arg("--socket")
                .arg(&socket)
                .env_clear()
                .env("AGENTOS_CONFIG", "/dev/null")
                .env("AGENTOS_AGENT_LOG_DIR", dir.path().join("logs"))
                .env("AGENTOS_STATE_DIR", dir.path().join("state"))
                .env("AGENTOS_LOG_LEVEL", "info")
                .stderr(fs::File::create(&log).unwrap())
                .uid(NOBODY)
                .gid(NOBODY)
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the unprivileged kernel did not start:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        UnprivilegedDaemon {
            process,
            dir,
            socket,
            _binary: binary,
        }
    }

    /// A client connection.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// Waits until agent `name` (`id`)'s log holds `until`; returns the log.
    pub fn agent_log_with(&self, name: &str, id: u64, until: &[&str]) -> String {
        let path = self
            .dir
            .path()
            .join("logs")
            .join(format!("{name}-{id}.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = fs::read_to_string(&path).unwrap_or_default();
            if until.iter().any(|u| log.contains(u)) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "agent {name} said no {until:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
