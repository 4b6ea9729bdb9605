//! The task store: one SQLite file (`tasks.db`) in the state directory,
//! so tasks and their results outlive the kernel process.
//!
//! The reactor never waits on it. At start the kernel reads every task's
//! record (not its result) once; afterwards every change goes to a writer
//! thread as a [`Write`], applied in batches, one transaction each. A
//! finished result the kernel no longer holds in memory is read back by a
//! worker ([`read_result`]) on a connection of its own (WAL mode lets
//! readers and the writer work at once).
//!
//! A lock file beside the database keeps a second kernel away from it: two
//! kernels would each take the other's running tasks for interrupted ones.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;
use nix::fcntl::{Flock, FlockArg};
use rusqlite::{params, Connection, OptionalExtension};

/// The database's file name in the state directory.
const FILE: &str = "tasks.db";
/// The lock file's name.
const LOCK: &str = "agentosd.lock";

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
    /// Another kernel holds the store.
    #[error("another agentosd uses the task store in {} (its lock {} is held); give this one \
             its own tasks.state_dir", dir.display(), dir.join(LOCK).display())]
    Locked {
        /// The state directory.
        dir: PathBuf,
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
}

/// A task as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// `t-...`.
    pub id: String,
    /// Creation order.
    pub seq: u64,
    /// Whose it is (see `tasks::Owner::key`).
    pub owner: String,
    /// `exec`, `think` or `prompt`.
    pub kind: String,
    /// The owner's name for it.
    pub label: Option<String>,
    /// Its state's wire name.
    pub state: String,
    /// Its request, as dispatched.
    pub request: String,
    /// Unix times in milliseconds.
    pub created_ms: i64,
    /// When it started running.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
    /// What it had printed when last saved (the tail).
    pub output: Option<String>,
}

/// A change for the writer thread.
#[derive(Debug)]
pub enum Write {
    /// A new task.
    Insert(Record),
    /// A task started running.
    Started {
        /// Which.
        id: String,
        /// When.
        started_ms: i64,
    },
    /// A task finished: its state, end time, result and last output.
    Finished {
        /// Which.
        id: String,
        /// Its final state's wire name.
        state: String,
        /// When.
        finished_ms: i64,
        /// Its result (JSON).
        result: Arc<Vec<u8>>,
        /// The tail of its output, if it printed any.
        output: Option<String>,
    },
    /// What a running task has printed so far (kept for `interrupted`).
    Output {
        /// Which.
        id: String,
        /// The tail.
        output: String,
    },
    /// Tasks that have expired.
    Delete(Vec<String>),
}

/// The open store: the writer thread's channel, and what it held at start.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// `None` once closed.
    writes: Option<Sender<Write>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// How many writes the thread has saved (in the order they were sent).
    applied: Arc<AtomicU64>,
    /// Set when a batch could not be saved.
    failed: Arc<std::sync::atomic::AtomicBool>,
    /// Held for the kernel's life: the lock.
    _lock: Flock<File>,
}

impl Store {
    /// Opens (or makes) the store in `dir`: takes its lock, makes the
    /// schema, ends tasks that were running as `interrupted`, and returns
    /// every record, oldest first. After each batch it saves, the writer
    /// wakes the reactor with `waker` (replies that wait for a save go
    /// then).
    pub fn open(dir: &Path, waker: Arc<Waker>) -> Result<(Store, Vec<Record>), StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Directory {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock_path = dir.join(LOCK);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| StoreError::Lock {
                path: lock_path.clone(),
                source,
            })?;
        let lock =
            Flock::lock(lock, FlockArg::LockExclusiveNonblock).map_err(|_| StoreError::Locked {
                dir: dir.to_path_buf(),
            })?;
        let path = dir.join(FILE);
        let database = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let connection = open_connection(&path).map_err(database)?;
        connection.execute_batch(SCHEMA).map_err(database)?;
        connection
            .execute(
                "UPDATE tasks SET state = 'interrupted', finished_ms = ?1, \
                 result = CAST(json_object('success', json('false'), 'code', 'interrupted', \
                 'error', 'the kernel stopped while the task ran', \
                 'output', coalesce(output, '')) AS BLOB) \
                 WHERE state = 'running'",
                params![now_ms()],
            )
            .map_err(database)?;
        let records = load(&connection).map_err(database)?;
        let (writes, received) = channel();
        let thread_path = path.clone();
        let applied = Arc::new(AtomicU64::new(0));
        let counter = applied.clone();
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let failure = failed.clone();
        let writer = std::thread::Builder::new()
            .name("agentos-task-store".into())
            .spawn(move || {
                write_all(
                    connection,
                    &thread_path,
                    received,
                    &counter,
                    &failure,
                    &waker,
                )
            })
            .map_err(|err| StoreError::Lock {
                path: path.clone(),
                source: err,
            })?;
        Ok((
            Store {
                path,
                writes: Some(writes),
                writer: Some(writer),
                applied,
                failed,
                _lock: lock,
            },
            records,
        ))
    }

    /// Hands a change to the writer thread (it never blocks).
    pub fn write(&self, write: Write) {
        let sent = self
            .writes
            .as_ref()
            .is_some_and(|writes| writes.send(write).is_ok());
        if !sent {
            log::error!(
                "the task store's writer has stopped: changes to {} are lost",
                self.path.display()
            );
        }
    }

    /// Saves what is still waiting and stops the writer (blocks until it
    /// has).
    pub fn close(&mut self) {
        self.writes = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }

    /// Whether a batch has failed to save (logged): from then on nothing
    /// counts as saved.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// How many of the writes sent so far are saved: the count goes up
    /// after each batch is committed (and never for a batch that failed).
    pub fn applied(&self) -> Arc<AtomicU64> {
        self.applied.clone()
    }

    /// The database file, for workers that read results back.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT,
    state TEXT NOT NULL,
    request TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    started_ms INTEGER,
    finished_ms INTEGER,
    output TEXT,
    result BLOB
);
";

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open(path)?;
    connection.busy_timeout(Duration::from_secs(5))?;
    // A file that is not a database fails here, at start, not later.
    connection.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
    Ok(connection)
}

fn load(connection: &Connection) -> rusqlite::Result<Vec<Record>> {
    let mut statement = connection.prepare(
        "SELECT id, seq, owner, kind, label, state, request, created_ms, started_ms, \
         finished_ms, output FROM tasks ORDER BY seq",
    )?;
    let rows = statement.query_map([], |row| {
        Ok(Record {
            id: row.get(0)?,
            seq: row.get::<_, i64>(1)? as u64,
            owner: row.get(2)?,
            kind: row.get(3)?,
            label: row.get(4)?,
            state: row.get(5)?,
            request: row.get(6)?,
            created_ms: row.get(7)?,
            started_ms: row.get(8)?,
            finished_ms: row.get(9)?,
            output: row.get(10)?,
        })
    })?;
    rows.collect()
}

/// The writer thread: applies changes in batches until the kernel goes.
fn write_all(
    mut connection: Connection,
    path: &Path,
    writes: Receiver<Write>,
    applied: &AtomicU64,
    failure: &std::sync::atomic::AtomicBool,
    waker: &Waker,
) {
    // After a failed batch the count stops: what follows it is saved, but
    // counting on would call the failed writes saved too.
    let mut failed = false;
    while let Ok(first) = writes.recv() {
        let mut batch = vec![first];
        batch.extend(writes.try_iter());
        match apply(&mut connection, &batch) {
            Ok(()) if !failed => {
                applied.fetch_add(batch.len() as u64, Ordering::Release);
                let _ = waker.wake();
            }
            Ok(()) => {}
            Err(err) => {
                failed = true;
                failure.store(true, Ordering::Release);
                let _ = waker.wake();
                log::error!(
                    "the task store {} could not save {} change(s): {err}",
                    path.display(),
                    batch.len()
                );
            }
        }
    }
}

fn apply(connection: &mut Connection, batch: &[Write]) -> rusqlite::Result<()> {
    let transaction = connection.transaction()?;
    for write in batch {
        match write {
            Write::Insert(r) => {
                transaction.execute(
                    "INSERT OR REPLACE INTO tasks (id, seq, owner, kind, label, state, request, \
                     created_ms, started_ms, finished_ms, output) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    params![
                        r.id,
                        r.seq as i64,
                        r.owner,
                        r.kind,
                        r.label,
                        r.state,
                        r.request,
                        r.created_ms,
                        r.started_ms,
                        r.finished_ms,
                        r.output
                    ],
                )?;
            }
            Write::Started { id, started_ms } => {
                transaction.execute(
                    "UPDATE tasks SET state = 'running', started_ms = ?2 WHERE id = ?1",
                    params![id, started_ms],
                )?;
            }
            Write::Finished {
                id,
                state,
                finished_ms,
                result,
                output,
            } => {
                transaction.execute(
                    "UPDATE tasks SET state = ?2, finished_ms = ?3, result = ?4, \
                     output = coalesce(?5, output) WHERE id = ?1",
                    params![id, state, finished_ms, result.as_slice(), output],
                )?;
            }
            Write::Output { id, output } => {
                transaction.execute(
                    "UPDATE tasks SET output = ?2 WHERE id = ?1",
                    params![id, output],
                )?;
            }
            Write::Delete(ids) => {
                for id in ids {
                    transaction.execute("DELETE FROM tasks WHERE id = ?1", params![id])?;
                }
            }
        }
    }
    transaction.commit()
}

/// Reads a finished task's result back (on a worker: it may wait for the
/// disk).
pub fn read_result(path: &Path, id: &str) -> Result<Option<Vec<u8>>, String> {
    let connection = open_connection(path).map_err(|err| err.to_string())?;
    connection
        .query_row(
            "SELECT result FROM tasks WHERE id = ?1",
            params![id],
            |row| row.get::<_, Option<Vec<u8>>>(0),
        )
        .optional()
        .map(Option::flatten)
        .map_err(|err| err.to_string())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn waker() -> Arc<Waker> {
        let poll = mio::Poll::new().unwrap();
        Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap())
    }

    fn record(id: &str, seq: u64, state: &str) -> Record {
        Record {
            id: id.into(),
            seq,
            owner: "user:0".into(),
            kind: "exec".into(),
            label: None,
            state: state.into(),
            request: "{}".into(),
            created_ms: 1,
            started_ms: None,
            finished_ms: None,
            output: None,
        }
    }

    /// Waits for the writer to have applied everything sent so far.
    fn settle(store: &Store) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let connection = open_connection(store.path()).unwrap();
            let pending: i64 = connection
                .query_row("SELECT count(*) FROM tasks WHERE id = 'marker'", [], |r| {
                    r.get(0)
                })
                .unwrap();
            if pending > 0 {
                return;
            }
        }
        panic!("the writer did not catch up");
    }

    #[test]
    fn records_and_results_outlive_the_store_and_running_ones_end_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, records) = Store::open(dir.path(), waker()).unwrap();
            assert!(records.is_empty());
            store.write(Write::Insert(record("t-a", 1, "queued")));
            store.write(Write::Insert(record("t-b", 2, "queued")));
            store.write(Write::Started {
                id: "t-b".into(),
                started_ms: 5,
            });
            store.write(Write::Output {
                id: "t-b".into(),
                output: "half way".into(),
            });
            store.write(Write::Insert(record("t-c", 3, "queued")));
            store.write(Write::Finished {
                id: "t-c".into(),
                state: "completed".into(),
                finished_ms: 9,
                result: Arc::new(b"{\"success\":true}".to_vec()),
                output: None,
            });
            store.write(Write::Insert(record("marker", 4, "queued")));
            settle(&store);
            // A second kernel is kept away while this one holds the store.
            let err = Store::open(dir.path(), waker()).unwrap_err();
            assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        }
        let (store, records) = Store::open(dir.path(), waker()).unwrap();
        let states: Vec<(&str, &str)> = records
            .iter()
            .map(|r| (r.id.as_str(), r.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("t-a", "queued"),
                ("t-b", "interrupted"),
                ("t-c", "completed"),
                ("marker", "queued")
            ]
        );
        assert_eq!(records[1].output.as_deref(), Some("half way"));
        let interrupted: Value =
            serde_json::from_slice(&read_result(store.path(), "t-b").unwrap().unwrap()).unwrap();
        assert_eq!(interrupted["code"], "interrupted");
        assert_eq!(interrupted["output"], "half way");
        assert_eq!(
            read_result(store.path(), "t-c").unwrap().unwrap(),
            b"{\"success\":true}"
        );
        assert_eq!(read_result(store.path(), "t-a").unwrap(), None);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_named_at_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), vec![7u8; 4096]).unwrap();
        let err = Store::open(dir.path(), waker()).unwrap_err().to_string();
        assert!(err.contains("tasks.db"), "{err}");
    }
}
