//! What can go wrong with the store, each naming the file (and the task)
//! it is about.

use std::path::PathBuf;

use crate::tasks::owner::OwnerKeyError;

/// Why the store cannot be used: said once, at start-up, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The state directory cannot be made.
    #[error("cannot create the state directory {}: {source}", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A directory or file of the store belongs to another user, who could
    /// read the tasks or take the lock.
    #[error("{} belongs to {owner}, not to uid {uid} that agentosd runs as: the task store \
             must be agentosd's own (chown it, or give agentosd another tasks.state_dir)",
            path.display())]
    Foreign {
        /// The directory or file.
        path: PathBuf,
        /// Its owner: uid, and name when known.
        owner: String,
        /// The kernel's effective uid.
        uid: u32,
    },
    /// A directory or file of the store cannot be made private, or is not
    /// what it should be (a link, say).
    #[error("cannot make {} private (mode {mode:o}): {source}", path.display())]
    Private {
        /// The directory or file.
        path: PathBuf,
        /// The mode it should have.
        mode: u32,
        /// Why.
        source: std::io::Error,
    },
    /// Another kernel holds the store.
    #[error("another agentosd uses the task store in {} (its lock {} is held); give this one \
             its own tasks.state_dir", dir.display(), lock.display())]
    Locked {
        /// The state directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The database cannot be opened, read or written.
    #[error("the task store {} cannot be used: {source} (move it aside to start afresh)", path.display())]
    Database {
        /// The database file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// The lock file cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The writer thread cannot be started.
    #[error("cannot start the writer of the task store {}: {source}", path.display())]
    Writer {
        /// The database file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A row of the store this kernel cannot read as a task: it is left in
/// the store as it is, and not loaded.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    /// Its owner column names no owner.
    #[error("task {id} in the store has an owner this kernel cannot read: {source}")]
    Owner {
        /// The task's id.
        id: String,
        /// Its place in creation order.
        seq: u64,
        /// Why.
        source: OwnerKeyError,
    },
    /// Its kind is none this kernel knows.
    #[error("task {id} in the store is of a kind this kernel does not know: {kind:?}")]
    Kind {
        /// The task's id.
        id: String,
        /// Its place in creation order.
        seq: u64,
        /// The kind column.
        kind: String,
    },
}

impl RowError {
    /// The row's place in creation order, which no new task may take.
    pub fn seq(&self) -> u64 {
        match self {
            RowError::Owner { seq, .. } | RowError::Kind { seq, .. } => *seq,
        }
    }
}

/// Why a batch of changes could not be saved, as the system said it.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The disk is full. SQLite turns ENOSPC into SQLITE_FULL and keeps no
    /// errno for it (a short write is "full" too), so it is named here.
    #[error("{}", std::io::Error::from_raw_os_error(libc::ENOSPC))]
    DiskFull,
    /// An I/O error, with the errno SQLite kept for the call that failed.
    #[error("{sqlite}: {errno}")]
    Io {
        /// SQLite's error.
        sqlite: rusqlite::Error,
        /// The system's.
        errno: std::io::Error,
    },
    /// Any other failure, as SQLite says it.
    #[error("{0}")]
    Sqlite(rusqlite::Error),
}

/// Why a finished task's result could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The database cannot be opened.
    #[error("cannot open the task store {}: {source}", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// The task's row cannot be read.
    #[error("cannot read the result of task {id} from {}: {source}", path.display())]
    Read {
        /// The database file.
        path: PathBuf,
        /// The task's id.
        id: String,
        /// Why.
        source: rusqlite::Error,
    },
}
