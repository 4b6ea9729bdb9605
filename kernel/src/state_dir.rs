//! The kernel's state directory, `<socket>.d` beside its socket: agents'
//! sockets (`agents/`), the staging directory sandbox roots are built
//! on (`sandbox-root/`) and EXEC's tools package (`tools/`). The socket is
//! the kernel's (its lock is held), so the directory is too: whatever an
//! earlier kernel left there is stale.
//!
//! A kernel running as root mounts a small tmpfs of its own on it, because
//! sandboxes are given files from here — an agent its socket, an exec host
//! the tools package — and a sandbox's mount table
//! (`/proc/self/mountinfo`, readable inside) shows for each bind where the
//! bound file lies *within its filesystem*. On the host's disk that is its
//! whole host path, `/srv/agentos.sock.d/agents/7.sock`, telling an agent
//! where the kernel keeps its socket and state; on the kernel's own tmpfs
//! it is `/agents/7.sock`, which names nothing on the host. A kernel that
//! cannot mount (not root) keeps a plain directory, and says so. A killed
//! kernel leaves its tmpfs mounted, like the rest of its state: the next
//! kernel on that socket detaches it before clearing the directory.

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
    /// The certificates sandboxes trust when the egress proxy intercepts
    /// some hosts (bound at `/run/agentos/ca-bundle.pem`).
    pub ca_bundle: PathBuf,
}

impl StateDir {
    /// Empties (or makes) the state directory of the kernel serving `socket`.
    pub fn fresh(socket: &Path) -> io::Result<StateDir> {
        let root = state_dir_of(socket);
        detach_tmpfs(&root);
        fresh_private_dir(&root)?;
        let root = std::fs::canonicalize(&root)?;
        mount_tmpfs(&root);
        let doors = root.join("agents");
        let staging = root.join("sandbox-root");
        for dir in [&doors, &staging] {
            fresh_private_dir(dir)?;
        }
        let tools = root.join("tools");
        fresh_dir(&tools, 0o755)?;
        Ok(StateDir {
            ca_bundle: root.join("ca-bundle.pem"),
            root,
            doors,
            staging,
            tools,
        })
    }

    /// Removes it all (shutdown).
    pub fn remove(&self) {
        detach_tmpfs(&self.root);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Options of the state directory's tmpfs: only the kernel enters it (as
/// the directory it covers), and it holds sockets and the tools package's
/// few text files — the cap only stops a runaway writer.
const TMPFS_OPTIONS: &str = "mode=0700,size=64m";

/// Mounts the kernel's own tmpfs on the (empty) state directory `root`;
/// without the right to mount, the directory stays as it is.
fn mount_tmpfs(root: &Path) {
    use nix::mount::{mount, MsFlags};
    // Its own name and nothing else: a sandbox's /proc/self/mounts shows it
    // as the source of every file bound from here.
    let mounted = mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(TMPFS_OPTIONS),
    );
    if let Err(errno) = mounted {
        let level = if nix::unistd::geteuid().is_root() {
            log::Level::Warn
        } else {
            log::Level::Info
        };
        log::log!(
            level,
            "cannot mount a tmpfs on {} ({errno}): agents' mount tables show where on the \
             host it lies",
            root.display()
        );
    }
}

/// Detaches what is mounted on `root` (the tmpfs of a kernel that was
/// killed, or this kernel's own at shutdown), so the directory below can
/// be cleared. Nothing mounted there, or no right to unmount: nothing to do.
fn detach_tmpfs(root: &Path) {
    use nix::mount::{umount2, MntFlags};
    // Each success takes one mount off the stack at `root`; the loop ends
    // at the directory itself (EINVAL), or when there is none (ENOENT).
    while umount2(root, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).is_ok() {}
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
/// state directory (other agents' sockets), the task store, the logs.
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
    // The task store's directory is made later, by the store; masked by
    // name, it is hidden even before it exists.
    let tasks = config.tasks.state_dir(socket);
    files.push(std::fs::canonicalize(&tasks).unwrap_or(tasks));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// tmpfs mounts at `path` in this thread's mount namespace.
    fn tmpfs_mounts_at(path: &Path) -> usize {
        let path = path.to_str().unwrap();
        std::fs::read_to_string("/proc/thread-self/mountinfo")
            .unwrap()
            .lines()
            .filter(|line| line.split(' ').nth(4) == Some(path) && line.contains(" - tmpfs "))
            .count()
    }

    #[test]
    fn the_tmpfs_a_killed_kernel_left_on_its_state_directory_is_cleared_by_the_next() {
        use nix::mount::{mount, MsFlags};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("!!! NOT TESTED: mounting a tmpfs needs root");
            return;
        }
        // A mount namespace of this thread's own: whatever the test leaves
        // mounted goes with it, and the host sees none of it.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
        let private = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
        mount(None::<&str>, "/", None::<&str>, private, None::<&str>).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("k.sock");
        let killed = StateDir::fresh(&socket).unwrap();
        assert_eq!(tmpfs_mounts_at(&killed.root), 1);
        std::fs::write(killed.doors.join("7.sock"), "").unwrap();
        // Killed: nothing removed, nothing unmounted.
        drop(killed);
        let next = StateDir::fresh(&socket).unwrap();
        assert_eq!(tmpfs_mounts_at(&next.root), 1, "the dead kernel's is gone");
        assert!(!next.doors.join("7.sock").exists());
        assert!(next.doors.is_dir() && next.staging.is_dir() && next.tools.is_dir());
        next.remove();
        assert_eq!(tmpfs_mounts_at(&next.root), 0);
        assert!(!next.root.exists());
    }
}
