//! Where the kernel's socket lives. Every client and the daemon resolve it the
//! same way, in this order:
//!
//! 1. an explicit path (`--socket`, a constructor argument);
//! 2. the `AGENTOS_SOCKET` environment variable;
//! 3. `/run/agentos/agentos.sock` when running as root;
//! 4. `$XDG_RUNTIME_DIR/agentos/agentos.sock`;
//! 5. `/tmp/agentos-$UID/agentos.sock`.

use std::path::{Path, PathBuf};

/// The environment variable naming the socket.
pub const SOCKET_ENV: &str = "AGENTOS_SOCKET";
/// The system-wide socket used when running as root.
pub const SYSTEM_SOCKET: &str = "/run/agentos/agentos.sock";
/// The socket's file name inside its directory.
pub const SOCKET_FILE: &str = "agentos.sock";

/// Resolves the socket path from the process's environment and effective uid.
pub fn resolve_socket_path(explicit: Option<&Path>) -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    resolve_socket_path_with(
        explicit,
        std::env::var_os(SOCKET_ENV).map(PathBuf::from),
        euid,
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    )
}

/// The socket a process of this user gets when nothing names one: no
/// explicit path and no `AGENTOS_SOCKET` (steps 3 to 5). A kernel on any
/// other socket — named by `--socket` or by the variable alike — is not
/// the default kernel, so it keeps its state apart.
pub fn default_socket_path() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    resolve_socket_path_with(
        None,
        None,
        euid,
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    )
}

/// The resolution rule itself, with its inputs passed in.
///
/// ```
/// use std::path::{Path, PathBuf};
/// use agentos_proto::socket_path::resolve_socket_path_with;
/// assert_eq!(resolve_socket_path_with(None, None, 0, None), PathBuf::from("/run/agentos/agentos.sock"));
/// assert_eq!(
///     resolve_socket_path_with(None, None, 1000, Some("/run/user/1000".into())),
///     PathBuf::from("/run/user/1000/agentos/agentos.sock"),
/// );
/// assert_eq!(resolve_socket_path_with(None, None, 1000, None), PathBuf::from("/tmp/agentos-1000/agentos.sock"));
/// ```
pub fn resolve_socket_path_with(
    explicit: Option<&Path>,
    env_socket: Option<PathBuf>,
    euid: u32,
    xdg_runtime_dir: Option<PathBuf>,
) -> PathBuf {
    if let Some(path) = explicit.filter(|p| !p.as_os_str().is_empty()) {
        return path.to_path_buf();
    }
    if let Some(path) = env_socket.filter(|p| !p.as_os_str().is_empty()) {
        return path;
    }
    if euid == 0 {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    // The XDG spec says a relative XDG_RUNTIME_DIR is invalid and to be ignored.
    if let Some(dir) = xdg_runtime_dir.filter(|d| d.is_absolute()) {
        return dir.join("agentos").join(SOCKET_FILE);
    }
    private_fallback_dir(euid).join(SOCKET_FILE)
}

/// `/tmp/agentos-$UID`: the per-user directory used when nothing better is
/// available. Whoever creates it must make it mode 0700 and owned by `uid`.
pub fn private_fallback_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/agentos-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_beats_environment_beats_defaults() {
        let explicit = Path::new("/a.sock");
        assert_eq!(
            resolve_socket_path_with(Some(explicit), Some("/b.sock".into()), 0, None),
            PathBuf::from("/a.sock")
        );
        assert_eq!(
            resolve_socket_path_with(None, Some("/b.sock".into()), 0, None),
            PathBuf::from("/b.sock")
        );
    }

    #[test]
    fn empty_values_are_ignored() {
        assert_eq!(
            resolve_socket_path_with(Some(Path::new("")), Some("".into()), 0, None),
            PathBuf::from(SYSTEM_SOCKET)
        );
    }

    #[test]
    fn relative_xdg_runtime_dir_is_ignored() {
        assert_eq!(
            resolve_socket_path_with(None, None, 42, Some("run".into())),
            PathBuf::from("/tmp/agentos-42/agentos.sock")
        );
    }
}
