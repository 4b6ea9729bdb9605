//! The kernel's listening socket: its directory, its lock, its mode and
//! group, and its removal on shutdown.
//!
//! Start-up order matters:
//! 1. the parent directory exists with safe modes (the per-user fallback
//!    `/tmp/agentos-$UID` must be ours and 0700, or someone else could plant
//!    a socket clients would trust);
//! 2. an exclusive `flock` on `<socket>.lock` — two daemons starting at once
//!    cannot both decide the path is free;
//! 3. a socket file already at the path is probed: if a daemon answers we
//!    refuse to start, if nobody does it is stale and removed;
//! 4. bind under umask 0117, so the socket is 0660 from its first instant,
//!    then hand it to the configured group.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use mio::net::UnixListener;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use nix::sys::stat::{umask, Mode};
use nix::unistd::{chown, Gid, Group};

use agentos_proto::socket_path::{private_fallback_dir, SYSTEM_SOCKET};

/// Longest socket path the kernel accepts (`sun_path` is 108 bytes with NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another kernel already serves this path.
    #[error(
        "another agentosd is already serving {}; stop it first, or start this one \
         with a different --socket",
        path.display()
    )]
    AlreadyRunning {
        /// The socket path.
        path: PathBuf,
    },
    /// Something that is not a socket occupies the path.
    #[error("{} exists and is not a socket; remove it or choose another --socket", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// The path does not fit in a Unix socket address.
    #[error("socket path {} is {len} bytes; Unix sockets allow at most {MAX_SOCKET_PATH}", path.display())]
    PathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The private directory exists but is not safe to use.
    #[error(
        "{} is not safe for the socket: {reason}; remove it, or choose another --socket",
        dir.display()
    )]
    UnsafeDirectory {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The directory is one other users may write in, and the kernel was
    /// not told to accept that.
    #[error(
        "{} is not safe for the socket: {reason}. Use a directory of the kernel's own \
         (--socket /run/agentos/NAME.sock), or set allow_shared_socket_dir \
         (--allow-shared-socket-dir) to accept that risk",
        dir.display()
    )]
    SharedDirectory {
        /// The directory.
        dir: PathBuf,
        /// Who may write in it.
        reason: String,
    },
    /// The configured socket group does not exist.
    #[error("socket group {group:?} does not exist; create it or fix socket_group")]
    UnknownGroup {
        /// The configured name.
        group: String,
    },
    /// A filesystem or socket call failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> SocketError + 'a {
    move |source| SocketError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The bound, listening kernel socket. Dropping it removes the socket file
/// (if it is still ours) and its lock file.
#[derive(Debug)]
pub struct KernelSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
    lock_path: PathBuf,
    lock: Option<Flock<File>>,
    /// `(st_dev, st_ino)` of the socket file we created, so we never remove
    /// a file someone else put at the path.
    identity: (u64, u64),
    gid: u32,
}

impl KernelSocket {
    /// Prepares the directory, takes the lock, clears a stale socket and
    /// binds. `group` is a group name or numeric gid; `None` keeps the
    /// daemon's own group. A directory other users may write in (`/tmp`)
    /// is refused unless `shared_dir_allowed`: they could plant the
    /// socket, its `.lock` or its state directory `.d` there first.
    pub fn bind(
        path: &Path,
        group: Option<&str>,
        shared_dir_allowed: bool,
    ) -> Result<KernelSocket, SocketError> {
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(SocketError::PathTooLong {
                path: path.to_path_buf(),
                len,
            });
        }
        let gid = match group {
            Some(group) => resolve_group(group)?,
            None => Gid::effective(),
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        prepare_directory(&parent, gid)?;
        if !shared_dir_allowed {
            check_not_shared(&parent, gid)?;
        }

        let lock_path = with_suffix(path, ".lock");
        let lock = take_lock(&lock_path, path)?;
        clear_stale_socket(path)?;

        let listener = {
            // Bind under a umask that yields 0660, so there is no moment when
            // the socket is reachable by others. umask is process-wide; the
            // daemon binds before it starts any thread.
            let previous = umask(Mode::from_bits_truncate(0o117));
            let bound = UnixListener::bind(path);
            umask(previous);
            bound.map_err(io_error("cannot bind socket", path))?
        };
        if group.is_some() {
            chown(path, None, Some(gid)).map_err(|errno| SocketError::Io {
                action: "cannot give the socket to its group",
                path: path.to_path_buf(),
                source: errno.into(),
            })?;
        }
        let meta = fs::symlink_metadata(path).map_err(io_error("cannot stat socket", path))?;
        Ok(KernelSocket {
            listener: Some(listener),
            path: path.to_path_buf(),
            lock_path,
            lock: Some(lock),
            identity: (meta.dev(), meta.ino()),
            gid: gid.as_raw(),
        })
    }

    /// The listener, until [`close`](Self::close).
    pub fn listener(&mut self) -> Option<&mut UnixListener> {
        self.listener.as_mut()
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket's group: its members are operators.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// Stops listening and removes the socket and lock files. Idempotent.
    pub fn close(&mut self) {
        if self.listener.take().is_none() {
            return;
        }
        let ours = fs::symlink_metadata(&self.path)
            .map(|meta| (meta.dev(), meta.ino()) == self.identity)
            .unwrap_or(false);
        if ours {
            if let Err(err) = fs::remove_file(&self.path) {
                log::warn!("cannot remove socket {}: {err}", self.path.display());
            }
        }
        // Remove the lock file while still holding the lock, then release it.
        let _ = fs::remove_file(&self.lock_path);
        self.lock = None;
    }
}

impl Drop for KernelSocket {
    fn drop(&mut self) {
        self.close();
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

fn resolve_group(group: &str) -> Result<Gid, SocketError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(Gid::from_raw(gid));
    }
    match Group::from_name(group) {
        Ok(Some(found)) => Ok(found.gid),
        _ => Err(SocketError::UnknownGroup {
            group: group.to_owned(),
        }),
    }
}

/// Creates the socket's directory if missing. The per-user fallback under
/// /tmp is 0700 and must be owned by us; other directories we create are
/// 0750 and belong to the socket group, so its members can reach the socket.
/// Existing directories are left as they are, but for the fallback (which
/// is checked) and the system socket's `/run/agentos`, which is the
/// kernel's own: it gets the socket group again at each start, so one made
/// before the group existed does not lock the group's members out.
fn prepare_directory(dir: &Path, gid: Gid) -> Result<(), SocketError> {
    let euid = nix::unistd::geteuid().as_raw();
    let private = dir == private_fallback_dir(euid);
    match fs::symlink_metadata(dir) {
        Ok(meta) => {
            if private {
                check_private_dir(dir, &meta, euid)?;
            }
            let system = Path::new(SYSTEM_SOCKET).parent() == Some(dir);
            if system && meta.is_dir() && meta.uid() == euid && meta.gid() != gid.as_raw() {
                fs::set_permissions(dir, fs::Permissions::from_mode(0o750))
                    .map_err(io_error("cannot set mode of", dir))?;
                chown(dir, None, Some(gid)).map_err(|errno| SocketError::Io {
                    action: "cannot give the socket directory to its group",
                    path: dir.to_path_buf(),
                    source: errno.into(),
                })?;
            }
            Ok(())
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            if let Some(grandparent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(grandparent)
                    .map_err(io_error("cannot create directory", grandparent))?;
            }
            let mode = if private { 0o700 } else { 0o750 };
            match fs::DirBuilder::new().mode(mode).create(dir) {
                Ok(()) => {}
                // Lost a race with another creator: judge what is there now.
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    return prepare_directory(dir, gid);
                }
                Err(err) => return Err(io_error("cannot create directory", dir)(err)),
            }
            // The umask may have narrowed the mode; set it exactly.
            fs::set_permissions(dir, fs::Permissions::from_mode(mode))
                .map_err(io_error("cannot set mode of", dir))?;
            if !private && gid != Gid::effective() {
                chown(dir, None, Some(gid)).map_err(|errno| SocketError::Io {
                    action: "cannot give the socket directory to its group",
                    path: dir.to_path_buf(),
                    source: errno.into(),
                })?;
            }
            Ok(())
        }
        Err(err) => Err(io_error("cannot stat directory", dir)(err)),
    }
}

/// Refuses a socket directory that users other than the kernel's own
/// (and its socket group's, who are operators) may write in.
fn check_not_shared(dir: &Path, gid: Gid) -> Result<(), SocketError> {
    let meta = fs::metadata(dir).map_err(io_error("cannot stat directory", dir))?;
    let mode = meta.mode();
    let our_group = meta.gid() == gid.as_raw() || meta.gid() == Gid::effective().as_raw();
    let reason = if mode & 0o002 != 0 {
        format!("every user may write in it (mode {:o})", mode & 0o7777)
    } else if mode & 0o020 != 0 && !our_group {
        format!(
            "group {} may write in it (mode {:o})",
            meta.gid(),
            mode & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(SocketError::SharedDirectory {
        dir: dir.to_path_buf(),
        reason,
    })
}

fn check_private_dir(dir: &Path, meta: &fs::Metadata, euid: u32) -> Result<(), SocketError> {
    let unsafe_dir = |reason: String| SocketError::UnsafeDirectory {
        dir: dir.to_path_buf(),
        reason,
    };
    if !meta.file_type().is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    if meta.uid() != euid {
        return Err(unsafe_dir(format!(
            "it is owned by uid {}, not {euid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_dir(format!(
            "its mode is {:o}; it must be 0700",
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

fn take_lock(lock_path: &Path, socket: &Path) -> Result<Flock<File>, SocketError> {
    // A daemon stopping removes its lock file while still holding the lock.
    // If we opened that file just before, we could lock the removed inode
    // while a third daemon locks a fresh file at the path: both would think
    // they own the socket. So after locking, check that the file we hold is
    // still the one at the path, and start over if not.
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(lock_path)
            .map_err(io_error("cannot open lock file", lock_path))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            if errno == nix::errno::Errno::EWOULDBLOCK {
                SocketError::AlreadyRunning {
                    path: socket.to_path_buf(),
                }
            } else {
                SocketError::Io {
                    action: "cannot lock",
                    path: lock_path.to_path_buf(),
                    source: errno.into(),
                }
            }
        })?;
        let held = lock
            .metadata()
            .map_err(io_error("cannot stat lock file", lock_path))?;
        match fs::metadata(lock_path) {
            Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => return Ok(lock),
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_error("cannot stat lock file", lock_path)(err)),
        }
    }
}

/// Removes a socket file nobody answers on; refuses if a daemon answers or
/// if the path holds something else.
fn clear_stale_socket(path: &Path) -> Result<(), SocketError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_error("cannot stat", path)(err)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match probe(path) {
        // EAGAIN: a daemon owns it but its backlog is full — alive all the same.
        Ok(()) | Err(Errno::EAGAIN) => Err(SocketError::AlreadyRunning {
            path: path.to_path_buf(),
        }),
        Err(Errno::ECONNREFUSED) => {
            log::info!("removing stale socket {}", path.display());
            fs::remove_file(path).map_err(io_error("cannot remove stale socket", path))
        }
        Err(Errno::ENOENT) => Ok(()),
        Err(errno) => Err(io_error("cannot probe existing socket", path)(errno.into())),
    }
}

/// Connects to `path` without blocking: a live but stuck daemon must not
/// hang this one's start-up.
fn probe(path: &Path) -> Result<(), Errno> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_is_0660_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("k.sock");
        let socket = KernelSocket::bind(&path, None, false).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let dir_mode = fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o750);
        drop(socket);
        assert!(!path.exists());
        assert!(!with_suffix(&path, ".lock").exists());
    }

    #[test]
    fn second_bind_on_a_live_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.sock");
        let _first = KernelSocket::bind(&path, None, false).unwrap();
        let err = KernelSocket::bind(&path, None, false).unwrap_err();
        assert!(matches!(err, SocketError::AlreadyRunning { .. }), "{err}");
        assert!(path.exists(), "the live socket must survive");
    }

    #[test]
    fn a_directory_others_may_write_in_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
        let path = shared.join("k.sock");
        let err = KernelSocket::bind(&path, None, false).unwrap_err();
        assert!(matches!(err, SocketError::SharedDirectory { .. }), "{err}");
        assert!(err.to_string().contains("every user may write"), "{err}");
        assert!(
            err.to_string().contains("--allow-shared-socket-dir"),
            "{err}"
        );
        assert!(!path.exists() && !shared.join("k.sock.lock").exists());
        let _socket = KernelSocket::bind(&path, None, true).unwrap();
        std::os::unix::net::UnixStream::connect(&path).unwrap();
    }

    #[test]
    fn stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let _socket = KernelSocket::bind(&path, None, false).unwrap();
        std::os::unix::net::UnixStream::connect(&path).unwrap();
    }

    #[test]
    fn a_regular_file_at_the_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.sock");
        fs::write(&path, b"data").unwrap();
        let err = KernelSocket::bind(&path, None, false).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"data");
    }

    #[test]
    fn overlong_paths_are_refused_clearly() {
        let path = PathBuf::from(format!("/tmp/{}", "x".repeat(200)));
        let err = KernelSocket::bind(&path, None, false).unwrap_err();
        assert!(matches!(err, SocketError::PathTooLong { .. }), "{err}");
    }

    #[test]
    fn private_directory_must_be_ours_and_0700() {
        let dir = tempfile::tempdir().unwrap();
        let euid = nix::unistd::geteuid().as_raw();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let meta = fs::symlink_metadata(dir.path()).unwrap();
        let err = check_private_dir(dir.path(), &meta, euid).unwrap_err();
        assert!(err.to_string().contains("0700"), "{err}");
        let err = check_private_dir(dir.path(), &meta, euid + 1).unwrap_err();
        assert!(err.to_string().contains("owned by"), "{err}");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let meta = fs::symlink_metadata(dir.path()).unwrap();
        assert!(check_private_dir(dir.path(), &meta, euid).is_ok());
    }

    #[test]
    fn unknown_group_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = KernelSocket::bind(&dir.path().join("k.sock"), Some("no-such-group-x"), false)
            .unwrap_err();
        assert!(matches!(err, SocketError::UnknownGroup { .. }), "{err}");
    }
}
