//! The task store: one SQLite file (`tasks.db`) in the state directory,
//! so tasks and their results outlive the kernel process.
//!
//! The reactor never waits on it. At start the kernel reads every task's
//! record (not its result) once; afterwards every change goes to a writer
//! thread (`writer`) as a [`Write`], applied in batches, one transaction
//! each. A finished result the kernel no longer holds in memory is read
//! back by a worker ([`Store::read_back`]) on a connection of its own (WAL
//! mode lets readers and the writer work at once).
//!
//! A batch that cannot be saved (a full disk, an I/O error) is rolled
//! back, so the connection goes on. Its new tasks are [`Refused`], with
//! the cause: the kernel answers their dispatches with an error and
//! forgets them. Its other changes wait in memory and are saved later.
//!
//! The store is private (`private`), and a lock beside the database
//! keeps a second kernel away from it: two kernels would each take the
//! other's running tasks for interrupted ones.

mod database;
pub mod error;
mod private;
mod schema;
pub mod seam;
#[cfg(test)]
mod tests;
mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use mio::Waker;
use nix::fcntl::{Flock, FlockArg};

use database::Message;
pub use database::{answered, hand, Database, Transaction};
#[cfg(test)]
pub use error::RowError;
pub use error::StoreError;
use private::{
    create_private, keep_dir_private, keep_file_private, private_chain, FILE, FILES, FILE_MODE,
    LOCK,
};
pub use schema::Loaded;
use schema::{interrupt_running, load, migrate, open_connection, read_result};
pub use seam::{now_ms, ReadBack, Refused, Store, StoredTask, Write};
use writer::Writer;

/// The store in SQLite: the writer thread's channel, and the lock.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    /// `None` once closed.
    writes: Option<Sender<Message>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// How many of the writes sent are saved (see [`Store::applied`]).
    applied: Arc<AtomicU64>,
    /// New tasks the writer could not save.
    refused: Receiver<Refused>,
    /// Held for the kernel's life: the lock.
    _lock: Flock<File>,
}

impl SqliteStore {
    /// Opens (or makes) the store in `dir`: makes every directory from
    /// `private_from` down to `dir` private, and the store's files; takes
    /// its lock; makes the schema; ends tasks that were running as
    /// `interrupted` (naming them in the log); and returns every record,
    /// oldest first. After each batch it saves or refuses, the writer wakes
    /// the reactor with `waker` (replies that wait for a save go then).
    pub fn open(
        dir: &Path,
        private_from: &Path,
        waker: Arc<Waker>,
    ) -> Result<(SqliteStore, Loaded), StoreError> {
        // Directories first, outermost first: once they are private no one
        // else can swap the files in them while they are looked at.
        for (depth, path) in private_chain(private_from, dir).iter().enumerate() {
            // The outermost may be a link an operator made (to another
            // disk); below it the kernel made every directory itself.
            keep_dir_private(path, depth == 0)?;
        }
        for name in FILES {
            keep_file_private(&dir.join(name))?;
        }
        let lock_path = dir.join(LOCK);
        let lock = create_private(&lock_path).map_err(|source| StoreError::Lock {
            path: lock_path.clone(),
            source,
        })?;
        let lock =
            Flock::lock(lock, FlockArg::LockExclusiveNonblock).map_err(|_| StoreError::Locked {
                dir: dir.to_path_buf(),
                lock: lock_path,
            })?;
        let path = dir.join(FILE);
        // SQLite would make the database 0644 less the umask, and makes its
        // -wal and -shm with the database's mode: made 0600 here first, the
        // database gives its mode to them.
        create_private(&path).map_err(|source| StoreError::Private {
            path: path.clone(),
            mode: FILE_MODE,
            source,
        })?;
        let database = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let connection = open_connection(&path).map_err(database)?;
        migrate(&connection).map_err(database)?;
        let interrupted = interrupt_running(&connection).map_err(database)?;
        if !interrupted.is_empty() {
            log::warn!(
                "tasks: {} were running when the last kernel stopped and end interrupted: {}",
                interrupted.len(),
                interrupted.join(", ")
            );
        }
        let loaded = load(&connection).map_err(database)?;
        // WAL mode has made the -wal and -shm now, with the database's mode.
        for name in FILES {
            keep_file_private(&dir.join(name))?;
        }
        let (writes, received) = channel();
        let (refusals, refused) = channel();
        let applied = Arc::new(AtomicU64::new(0));
        let writer = Writer::new(connection, path.clone(), applied.clone(), refusals, waker);
        let writer =
            agentos_primitives::threads::spawn("agentos-task-store", move || writer.run(received))
                .map_err(|source| StoreError::Writer {
                    path: path.clone(),
                    source,
                })?;
        let store = SqliteStore {
            path,
            writes: Some(writes),
            writer: Some(writer),
            applied,
            refused,
            _lock: lock,
        };
        Ok((store, loaded))
    }

    /// Hands a change to the writer thread (it never blocks).
    pub fn write(&self, write: Write) {
        let sent = self
            .writes
            .as_ref()
            .is_some_and(|writes| writes.send(Message::Task(Box::new(write))).is_ok());
        if !sent {
            log::error!(
                "the task store's writer has stopped: changes to {} are lost",
                self.path.display()
            );
        }
    }

    /// Saves what is still waiting and stops the writer (blocks until it
    /// has). What it could not save is named in the log.
    pub fn close(&mut self) {
        if let Some(writes) = self.writes.take() {
            let _ = writes.send(Message::Stop);
        }
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }

    /// A handle on the database for another subsystem.
    pub fn database(&self) -> Option<Database> {
        self.writes.clone().map(Database::new)
    }

    /// The database file.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Store for SqliteStore {
    fn write(&mut self, write: Write) {
        SqliteStore::write(self, write);
    }

    fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    fn take_refused(&mut self) -> Vec<Refused> {
        self.refused.try_iter().collect()
    }

    fn read_back(&self, id: &str) -> ReadBack {
        let (path, id) = (self.path.clone(), id.to_owned());
        ReadBack::new(move || read_result(&path, &id))
    }

    fn close(&mut self) {
        SqliteStore::close(self);
    }
}
