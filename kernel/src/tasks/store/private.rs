//! Keeping the store private: every directory on the way to it that the
//! kernel chose is 0700 and the kernel's own, and its files are 0600,
//! whatever the umask and however an earlier kernel left them. No one
//! else can read tasks, nor take the lock beside the database.

use std::fs::{DirBuilder, File, Metadata, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::StoreError;

/// The database's file name in the state directory.
pub const FILE: &str = "tasks.db";
/// The lock file's name.
pub const LOCK: &str = "agentosd.lock";
/// The files of the store: the lock, the database and those SQLite keeps
/// beside it (its write-ahead log, the log's index, a rollback journal).
pub const FILES: [&str; 5] = [
    LOCK,
    FILE,
    "tasks.db-wal",
    "tasks.db-shm",
    "tasks.db-journal",
];
/// Directories of the store: only the kernel's user may enter them.
const DIR_MODE: u32 = 0o700;
/// Files of the store: only the kernel's user may read or write them.
pub const FILE_MODE: u32 = 0o600;

/// The directories from `from` down to `dir`, outermost first (`dir`
/// alone unless `from` is above it).
pub fn private_chain(from: &Path, dir: &Path) -> Vec<PathBuf> {
    if !dir.starts_with(from) {
        return vec![dir.to_path_buf()];
    }
    let mut chain: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|path| *path != from)
        .map(Path::to_path_buf)
        .collect();
    chain.push(from.to_path_buf());
    chain.reverse();
    chain
}

/// Makes `dir` (with its parents) if it is missing, and keeps it private:
/// the kernel's own, mode 0700. A looser mode an earlier kernel left is
/// tightened, and the log says so. Unless `follow`, `dir` must be a
/// directory itself, not a link to one.
pub fn keep_dir_private(dir: &Path, follow: bool) -> Result<(), StoreError> {
    let directory = |source| StoreError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let made = match std::fs::symlink_metadata(dir) {
        Ok(_) => false,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
                .map_err(directory)?;
            true
        }
        Err(err) => return Err(directory(err)),
    };
    let metadata = if follow {
        std::fs::metadata(dir)
    } else {
        std::fs::symlink_metadata(dir)
    }
    .map_err(directory)?;
    if !metadata.is_dir() {
        return Err(StoreError::Private {
            path: dir.to_path_buf(),
            mode: DIR_MODE,
            source: std::io::Error::other("it is not a directory"),
        });
    }
    keep_private(dir, &metadata, DIR_MODE, made)
}

/// Keeps the store's file `path`, if there is one, private: the kernel's
/// own, mode 0600 (tightened, and logged, if an earlier kernel left it
/// looser). A link is refused: it would lead the kernel's writes elsewhere.
pub fn keep_file_private(path: &Path) -> Result<(), StoreError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StoreError::Private {
                path: path.to_path_buf(),
                mode: FILE_MODE,
                source,
            })
        }
    };
    if !metadata.is_file() {
        return Err(StoreError::Private {
            path: path.to_path_buf(),
            mode: FILE_MODE,
            source: std::io::Error::other("it is not a regular file"),
        });
    }
    keep_private(path, &metadata, FILE_MODE, false)
}

/// Refuses `path` if another user owns it; sets its `mode` if it has
/// another, saying so in the log unless the kernel has just `made` it
/// (then only the umask narrowed it).
fn keep_private(path: &Path, metadata: &Metadata, mode: u32, made: bool) -> Result<(), StoreError> {
    let uid = nix::unistd::geteuid().as_raw();
    if metadata.uid() != uid {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            owner: user_name(metadata.uid()),
            uid,
        });
    }
    let was = metadata.mode() & 0o7777;
    if was == mode {
        return Ok(());
    }
    std::fs::set_permissions(path, Permissions::from_mode(mode)).map_err(|source| {
        StoreError::Private {
            path: path.to_path_buf(),
            mode,
            source,
        }
    })?;
    if !made {
        log::warn!(
            "tasks: {} was mode {was:o}; made {mode:o}, so that only agentosd's user can reach \
             the task store",
            path.display()
        );
    }
    Ok(())
}

/// "uid 1000 (alice)", or "uid 1000" for a uid without a name.
fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

/// Opens `path`, creating it 0600 if it is missing, and makes it exactly
/// 0600 (creation is narrowed by the umask, so it is set again). A link
/// is not followed.
pub fn create_private(path: &Path) -> std::io::Result<File> {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if file.metadata()?.mode() & 0o7777 != FILE_MODE {
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}
