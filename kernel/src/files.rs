//! Files a caller reads and writes through the kernel (READ, WRITE): in
//! the caller's own view and with the caller's own rights, never the
//! kernel's.
//!
//! Each request runs on a thread of its own that first becomes the caller
//! for the filesystem — its uid and gid (`setfsuid`, `setfsgid`), its
//! supplementary groups, and no capabilities — so the filesystem's own
//! checks decide, as they would for the caller. (These are raw system
//! calls: the C library's `setgroups` would change every thread of the
//! kernel.) The thread ends with the request, and its credentials with it.
//!
//! Paths are resolved beneath the caller's root (`openat2` with
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): a sandboxed agent's is its
//! sandbox's, whose symlinks cannot lead out of it. The last component is
//! never followed if it is a symlink (`O_NOFOLLOW`), only a regular file is
//! read or written (a FIFO, a device, a `/proc` file is refused), and a
//! file with other hard links is written only by its owner: a link another
//! user planted in a shared directory never turns a write into one on a
//! file the caller did not mean.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use agentos_proto::{ErrorCode, ErrorReply};
use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, mkdirat, FileStat, Mode, SFlag};

use crate::as_caller::{self, AsCaller};

/// What READ found: the text and its size.
pub struct FileText {
    /// The file's text.
    pub content: String,
    /// Its size in bytes.
    pub size: u64,
}

/// READ: the text of the regular file at `path` beneath `root`, at most
/// `max_bytes` long.
pub fn read(
    root: OwnedFd,
    path: String,
    who: AsCaller,
    max_bytes: u64,
) -> Result<FileText, ErrorReply> {
    as_caller::run("file-as-caller", "files", who, move || {
        let file = open_beneath(&root, Path::new(&path), OFlag::O_RDONLY, &path)?;
        let too_big = |size: u64| {
            ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!("READ {path}: {size} bytes; at most {max_bytes} are read"),
            )
        };
        let size = regular(&file, &path)?.st_size as u64;
        if size > max_bytes {
            return Err(too_big(size));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        File::from(file)
            .take(max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|err| io_failure("READ", &path, err))?;
        // It may have grown since it was measured.
        let size = bytes.len() as u64;
        if size > max_bytes {
            return Err(too_big(size));
        }
        let content = String::from_utf8(bytes).map_err(|_| {
            ErrorReply::new(
                ErrorCode::BadRequest,
                format!("READ {path}: it is not UTF-8 text, which READ gives"),
            )
        })?;
        Ok(FileText { content, size })
    })
}

/// WRITE: `content` into the regular file at `path` beneath `root`,
/// replacing what it held or after it (`append`), making missing parent
/// directories. Returns the bytes written.
pub fn write(
    root: OwnedFd,
    path: String,
    content: String,
    append: bool,
    who: AsCaller,
) -> Result<u64, ErrorReply> {
    let uid = who.uid;
    as_caller::run("file-as-caller", "files", who, move || {
        let target = Path::new(&path);
        let (parent, name) = match (target.parent(), target.file_name()) {
            (Some(parent), Some(name)) => (parent, name),
            _ => {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!("WRITE field `path`: {path:?} names no file"),
                ))
            }
        };
        let dir = make_dirs(&root, parent, &path)?;
        let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT;
        if append {
            flags |= OFlag::O_APPEND;
        }
        let file = openat2(
            &dir,
            name,
            OpenHow::new()
                .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
                .mode(Mode::from_bits_truncate(0o644))
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS),
        )
        .map_err(|errno| errno_failure("WRITE", &path, errno))?;
        let stat = regular(&file, &path)?;
        if stat.st_nlink > 1 && stat.st_uid != uid {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "WRITE {path}: the file has other hard links and belongs to uid {}; \
                     only its owner writes it through the kernel",
                    stat.st_uid
                ),
            ));
        }
        let mut file = File::from(file);
        if !append {
            file.set_len(0)
                .map_err(|err| io_failure("WRITE", &path, err))?;
        }
        file.write_all(content.as_bytes())
            .map_err(|err| io_failure("WRITE", &path, err))?;
        Ok(content.len() as u64)
    })
}

/// Opens `path` beneath `root` (`RESOLVE_IN_ROOT`), its last component not
/// followed if it is a symlink.
fn open_beneath(
    root: &OwnedFd,
    path: &Path,
    flags: OFlag,
    shown: &str,
) -> Result<OwnedFd, ErrorReply> {
    openat2(
        root,
        relative(path),
        OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
    .map_err(|errno| errno_failure("READ", shown, errno))
}

/// The directory `dir` beneath `root`, made with its missing parents.
fn make_dirs(root: &OwnedFd, dir: &Path, shown: &str) -> Result<OwnedFd, ErrorReply> {
    let open = |at: &OwnedFd, path: &Path, how: ResolveFlag| {
        openat2(
            at,
            path,
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(how),
        )
    };
    let in_root = ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    match open(root, relative(dir), in_root) {
        Ok(found) => return Ok(found),
        Err(Errno::ENOENT) => {}
        Err(errno) => return Err(errno_failure("WRITE", shown, errno)),
    }
    // Missing directories are made one name at a time, so their path must
    // be names alone: what `..` means depends on what it follows.
    let mut parts = Vec::new();
    for part in dir.components() {
        match part {
            Component::Normal(name) => parts.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!(
                        "WRITE {shown}: missing directories are made only along a path \
                         without `..`"
                    ),
                ))
            }
        }
    }
    // The longest part that exists (at least the root), then each missing
    // directory made in the last one: a name, never a path, so nothing is
    // followed.
    let (made, mut at) = (0..parts.len())
        .rev()
        .find_map(|len| {
            let prefix: PathBuf = parts[..len].iter().collect();
            open(root, relative(&prefix), in_root)
                .ok()
                .map(|found| (len, found))
        })
        .ok_or_else(|| errno_failure("WRITE", shown, Errno::ENOENT))?;
    for name in &parts[made..] {
        match mkdirat(&at, *name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(errno) => return Err(errno_failure("WRITE", shown, errno)),
        }
        at = open(
            &at,
            Path::new(name),
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS,
        )
        .map_err(|errno| errno_failure("WRITE", shown, errno))?;
    }
    Ok(at)
}

/// The status of the regular file `file`; anything else is refused.
fn regular(file: &OwnedFd, shown: &str) -> Result<FileStat, ErrorReply> {
    let stat = fstat(file).map_err(|errno| errno_failure("file", shown, errno))?;
    let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFREG {
        return Err(ErrorReply::new(
            ErrorCode::BadRequest,
            format!("{shown}: not a regular file; only regular files are read and written"),
        ));
    }
    // A file of /proc says 0 and holds more: refused as not what it says.
    if stat.st_size == 0 && is_procfs(file) {
        return Err(ErrorReply::new(
            ErrorCode::BadRequest,
            format!("{shown}: a /proc file; only regular files are read and written"),
        ));
    }
    Ok(stat)
}

fn is_procfs(file: &OwnedFd) -> bool {
    nix::sys::statfs::fstatfs(file)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
}

/// `path` without its leading `/`, for resolving beneath a root.
fn relative(path: &Path) -> &Path {
    let stripped = path.strip_prefix("/").unwrap_or(path);
    if stripped.as_os_str().is_empty() {
        Path::new(".")
    } else {
        stripped
    }
}

fn errno_failure(what: &str, path: &str, errno: Errno) -> ErrorReply {
    let code = match errno {
        Errno::ENOENT | Errno::ENOTDIR => ErrorCode::NotFound,
        Errno::EACCES | Errno::EPERM => ErrorCode::PermissionDenied,
        Errno::ELOOP => ErrorCode::BadRequest,
        Errno::EXDEV => ErrorCode::PermissionDenied,
        _ => ErrorCode::BadRequest,
    };
    let why = match errno {
        Errno::ELOOP => "it is a symlink, which is not followed".to_owned(),
        Errno::EXDEV => "it leads out of the caller's view".to_owned(),
        other => other.desc().to_lowercase(),
    };
    ErrorReply::new(code, format!("{what} {path}: {why}"))
}

fn io_failure(what: &str, path: &str, err: io::Error) -> ErrorReply {
    match err.raw_os_error() {
        Some(raw) => errno_failure(what, path, Errno::from_raw(raw)),
        None => ErrorReply::new(ErrorCode::Internal, format!("{what} {path}: {err}")),
    }
}
