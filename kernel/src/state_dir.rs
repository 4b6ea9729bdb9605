//! The kernel's state directory, `<socket>.d` beside its socket: agents'
//! sockets (`agents/`) and the staging directory sandbox roots are built
//! on (`sandbox-root/`). The socket is the kernel's (its lock is held), so
//! the directory is too: whatever an earlier kernel left there is stale.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::config::{Config, DEFAULT_CONFIG_PATH};

/// The state directory's parts, made fresh.
#[derive(Debug)]
pub struct StateDir {
    /// The directory itself (canonical: binds are made from paths with no
    /// symlink in them).
    pub root: PathBuf,
    /// Agents' sockets.
    pub doors: PathBuf,
    /// An empty directory to build sandbox roots on.
    pub staging: PathBuf,
    /// The `tools` package EXEC runs import, readable by them (it is
    /// their `/tools`).
    pub tools: PathBuf,
}

impl StateDir {
    /// Empties (or makes) the state directory of the kernel serving `socket`.
    pub fn fresh(socket: &Path) -> io::Result<StateDir> {
        let root = state_dir_of(socket);
        fresh_private_dir(&root)?;
        let root = std::fs::canonicalize(&root)?;
        let doors = root.join("agents");
        let staging = root.join("sandbox-root");
        for dir in [&doors, &staging] {
            fresh_private_dir(dir)?;
        }
        let tools = root.join("tools");
        fresh_dir(&tools, 0o755)?;
        Ok(StateDir {
            root,
            doors,
            staging,
            tools,
        })
    }

    /// Removes it all (shutdown).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Where the kernel serving `socket` keeps its state: `<socket>.d`, next to
/// the socket, so two kernels never share one.
pub fn state_dir_of(socket: &Path) -> PathBuf {
    let mut name = socket.as_os_str().to_os_string();
    name.push(".d");
    PathBuf::from(name)
}

/// The kernel's own files, which no sandbox may see even when they lie in
/// a directory bound into it: its config files, its socket and lock, its
/// state directory (other agents' sockets), the logs.
pub fn kernel_files(config: &Config, socket: &Path, state: &Path, logs: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from(DEFAULT_CONFIG_PATH)];
    files.extend(
        config
            .file
            .iter()
            .filter_map(|f| std::fs::canonicalize(f).ok()),
    );
    let socket_dir = socket
        .parent()
        .and_then(|dir| std::fs::canonicalize(dir).ok());
    if let (Some(dir), Some(name)) = (socket_dir, socket.file_name()) {
        files.push(dir.join(name));
        let mut lock = name.to_os_string();
        lock.push(".lock");
        files.push(dir.join(lock));
    }
    files.push(state.to_path_buf());
    files.extend(std::fs::canonicalize(logs).ok());
    files
}

/// Makes `dir` a new, empty directory only its owner may enter, removing
/// whatever was there.
fn fresh_private_dir(dir: &Path) -> io::Result<()> {
    fresh_dir(dir, 0o700)
}

/// Makes `dir` (with `mode`), empty.
fn fresh_dir(dir: &Path, mode: u32) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => log::info!("removed what an earlier kernel left in {}", dir.display()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => {
            return Err(io::Error::new(
                err.kind(),
                format!("cannot clear {}: {err}", dir.display()),
            ))
        }
    }
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(dir)
        .map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("cannot create {}: {err}", dir.display()),
            )
        })
}
