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
//! A batch that cannot be saved (a full disk, an I/O error) is rolled
//! back, so the connection goes on. Its new tasks are [`Refused`], with
//! the cause: the kernel answers their dispatches with an error and
//! forgets them. Its other changes (a start, output, an end, a removal)
//! are kept in memory, at most one of each kind per task, and saved with
//! the next batch, or alone every second until they are. What is still
//! unsaved when the kernel stops is named in the log.
//!
//! The store is private: every directory on the way to it that the kernel
//! chose is 0700 and the kernel's own, and its files are 0600, whatever
//! the umask and however an earlier kernel left them. No one else can
//! read tasks, nor take the lock beside the database, which keeps a
//! second kernel away from it: two kernels would each take the other's
//! running tasks for interrupted ones.

use std::collections::BTreeMap;
use std::fs::{DirBuilder, File, Metadata, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;
use nix::fcntl::{Flock, FlockArg};
use rusqlite::{params, Connection, OptionalExtension};

/// The database's file name in the state directory.
const FILE: &str = "tasks.db";
/// The lock file's name.
const LOCK: &str = "agentosd.lock";
/// The files of the store: the lock, the database and those SQLite keeps
/// beside it (its write-ahead log, the log's index, a rollback journal).
const FILES: [&str; 5] = [
    LOCK,
    FILE,
    "tasks.db-wal",
    "tasks.db-shm",
    "tasks.db-journal",
];
/// Directories of the store: only the kernel's user may enter them.
const DIR_MODE: u32 = 0o700;
/// Files of the store: only the kernel's user may read or write them.
const FILE_MODE: u32 = 0o600;
/// How often changes that could not be saved are tried again when no new
/// change comes to carry them.
const RETRY_EVERY: Duration = Duration::from_secs(1);

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

/// New tasks whose records could not be saved: they are not kept, and
/// their dispatches are answered with `cause`.
#[derive(Debug, PartialEq)]
pub struct Refused {
    /// Their ids.
    pub tasks: Vec<String>,
    /// Why, as the system said it (`No space left on device (os error 28)`).
    pub cause: String,
}

/// The open store: the writer thread's channel, and what it held at start.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// `None` once closed.
    writes: Option<Sender<Write>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// How many of the writes sent are saved (see [`Store::applied`]).
    applied: Arc<AtomicU64>,
    /// New tasks the writer could not save.
    refused: Receiver<Refused>,
    /// Held for the kernel's life: the lock.
    _lock: Flock<File>,
}

impl Store {
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
    ) -> Result<(Store, Vec<Record>), StoreError> {
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
        connection.execute_batch(SCHEMA).map_err(database)?;
        let interrupted = interrupt_running(&connection).map_err(database)?;
        if !interrupted.is_empty() {
            log::warn!(
                "tasks: {} were running when the last kernel stopped and end interrupted: {}",
                interrupted.len(),
                interrupted.join(", ")
            );
        }
        let records = load(&connection).map_err(database)?;
        // WAL mode has made the -wal and -shm now, with the database's mode.
        for name in FILES {
            keep_file_private(&dir.join(name))?;
        }
        let (writes, received) = channel();
        let (refusals, refused) = channel();
        let applied = Arc::new(AtomicU64::new(0));
        let writer = Writer::new(connection, path.clone(), applied.clone(), refusals, waker);
        let writer = std::thread::Builder::new()
            .name("agentos-task-store".into())
            .spawn(move || writer.run(received))
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
                refused,
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
    /// has). What it could not save is named in the log.
    pub fn close(&mut self) {
        self.writes = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }

    /// How many of the writes sent so far are saved: every write up to
    /// this count is on disk, but for new tasks reported [`Refused`]
    /// (always reported before the count passes them, so read the count
    /// first, then [`Store::take_refused`]).
    pub fn applied(&self) -> Arc<AtomicU64> {
        self.applied.clone()
    }

    /// New tasks the writer could not save since last asked.
    pub fn take_refused(&self) -> Vec<Refused> {
        self.refused.try_iter().collect()
    }

    /// The database file, for workers that read results back.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The directories from `from` down to `dir`, outermost first (`dir`
/// alone unless `from` is above it).
fn private_chain(from: &Path, dir: &Path) -> Vec<PathBuf> {
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
fn keep_dir_private(dir: &Path, follow: bool) -> Result<(), StoreError> {
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
fn keep_file_private(path: &Path) -> Result<(), StoreError> {
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
fn create_private(path: &Path) -> std::io::Result<File> {
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

/// Ends the tasks the last kernel left running as `interrupted`, with the
/// output they had saved; returns their ids.
fn interrupt_running(connection: &Connection) -> rusqlite::Result<Vec<String>> {
    let ids = connection
        .prepare("SELECT id FROM tasks WHERE state = 'running' ORDER BY seq")?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    connection.execute(
        "UPDATE tasks SET state = 'interrupted', finished_ms = ?1, \
         result = CAST(json_object('success', json('false'), 'code', 'interrupted', \
         'error', 'the kernel stopped while the task ran', \
         'output', coalesce(output, '')) AS BLOB) \
         WHERE state = 'running'",
        params![now_ms()],
    )?;
    Ok(ids)
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

/// A task's changes that could not be saved yet, at most one of each kind:
/// a later one replaces an earlier, so what waits stays bounded by the
/// number of tasks.
#[derive(Debug, Default)]
struct Unsaved {
    started: Option<Write>,
    output: Option<Write>,
    finished: Option<Write>,
    /// Its removal (which replaced whatever else waited).
    deleted: Option<Write>,
}

impl Unsaved {
    /// Its changes in the order they apply: the start, the output (which
    /// an end without output leaves as is), the end.
    fn writes(&self) -> impl Iterator<Item = &Write> {
        [&self.started, &self.output, &self.finished, &self.deleted]
            .into_iter()
            .flatten()
    }

    /// What it is, for the log: "its start, its end (completed)".
    fn describe(&self) -> String {
        self.writes()
            .map(|write| match write {
                Write::Started { .. } => "its start".to_owned(),
                Write::Output { .. } => "its latest output".to_owned(),
                Write::Finished { state, .. } => format!("its end ({state})"),
                Write::Delete(_) => "its removal".to_owned(),
                Write::Insert(_) => "its record".to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The writer thread: applies changes in batches until the kernel goes.
struct Writer {
    connection: Connection,
    path: PathBuf,
    /// Writes received so far (they are numbered in the order sent).
    received: u64,
    /// Every write up to this count is saved (or refused, if a new task's).
    applied: Arc<AtomicU64>,
    refusals: Sender<Refused>,
    waker: Arc<Waker>,
    /// Changes of batches that failed, by task: saved first in the next
    /// transaction, so a task's changes still apply in order.
    unsaved: BTreeMap<String, Unsaved>,
    /// Why saving fails, while it does.
    failing: Option<String>,
}

impl Writer {
    fn new(
        connection: Connection,
        path: PathBuf,
        applied: Arc<AtomicU64>,
        refusals: Sender<Refused>,
        waker: Arc<Waker>,
    ) -> Writer {
        Writer {
            connection,
            path,
            received: 0,
            applied,
            refusals,
            waker,
            unsaved: BTreeMap::new(),
            failing: None,
        }
    }

    /// Saves batches until the kernel closes the store; then tries once
    /// more what is still unsaved, and names in the log what is lost.
    fn run(mut self, writes: Receiver<Write>) {
        loop {
            let first = if self.unsaved.is_empty() {
                writes.recv().ok()
            } else {
                match writes.recv_timeout(RETRY_EVERY) {
                    Ok(write) => Some(write),
                    Err(RecvTimeoutError::Timeout) => {
                        self.save(Vec::new());
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => None,
                }
            };
            let Some(first) = first else {
                break;
            };
            let mut batch = vec![first];
            batch.extend(writes.try_iter());
            self.save(batch);
        }
        if !self.unsaved.is_empty() {
            self.save(Vec::new());
        }
        self.report_lost();
    }

    /// Saves `batch` (after what earlier batches left unsaved) in one
    /// transaction. If it fails, it is rolled back: its new tasks are
    /// refused, its other changes wait for the next try.
    fn save(&mut self, batch: Vec<Write>) {
        let through = self.received + batch.len() as u64;
        self.received = through;
        let before = self.applied.load(Ordering::Relaxed);
        match apply(&self.connection, &self.unsaved, &batch) {
            Ok(()) => {
                if let Some(cause) = self.failing.take() {
                    log::info!(
                        "the task store {} saves again (it could not: {cause}); {} task(s)' \
                         waiting changes are saved",
                        self.path.display(),
                        self.unsaved.len()
                    );
                }
                self.unsaved.clear();
                self.applied.store(through, Ordering::Release);
                if through > before {
                    let _ = self.waker.wake();
                }
            }
            Err(cause) => {
                let mut refused = Vec::new();
                for write in batch {
                    match write {
                        Write::Insert(record) => refused.push(record.id),
                        write => self.keep_unsaved(write),
                    }
                }
                if self.failing.as_ref() != Some(&cause) {
                    log::error!(
                        "the task store {} cannot save: {cause}; new tasks are refused, other \
                         changes are kept in memory and tried again every {}s",
                        self.path.display(),
                        RETRY_EVERY.as_secs()
                    );
                }
                if !refused.is_empty() {
                    log::warn!(
                        "tasks: not saved, so refused: {} ({cause})",
                        refused.join(", ")
                    );
                    // Sent before the count passes them (see Store::applied).
                    let _ = self.refusals.send(Refused {
                        tasks: refused,
                        cause: cause.clone(),
                    });
                    let _ = self.waker.wake();
                }
                self.failing = Some(cause);
            }
        }
    }

    /// Keeps a change of a failed batch, replacing an earlier one of its
    /// kind for its task.
    fn keep_unsaved(&mut self, write: Write) {
        match write {
            Write::Insert(_) => {}
            Write::Delete(ids) => {
                for id in ids {
                    let deleted = Some(Write::Delete(vec![id.clone()]));
                    self.unsaved.insert(
                        id,
                        Unsaved {
                            deleted,
                            ..Unsaved::default()
                        },
                    );
                }
            }
            Write::Started { ref id, .. } => {
                let id = id.clone();
                self.unsaved.entry(id).or_default().started = Some(write);
            }
            Write::Output { ref id, .. } => {
                let id = id.clone();
                self.unsaved.entry(id).or_default().output = Some(write);
            }
            Write::Finished { ref id, .. } => {
                let id = id.clone();
                self.unsaved.entry(id).or_default().finished = Some(write);
            }
        }
    }

    /// Says in the log which tasks' changes the kernel stops without.
    fn report_lost(&self) {
        let lost = self.lost();
        if lost.is_empty() {
            return;
        }
        log::error!(
            "the task store {} could not save the changes of {} task(s) before the kernel \
             stopped ({}); they are lost:",
            self.path.display(),
            lost.len(),
            self.failing.as_deref().unwrap_or("unknown cause")
        );
        for line in lost {
            log::error!("{line}");
        }
    }

    /// A line per task whose changes are still unsaved: "task t-…: not
    /// saved: its start, its end (completed)".
    fn lost(&self) -> Vec<String> {
        self.unsaved
            .iter()
            .map(|(id, unsaved)| format!("task {id}: not saved: {}", unsaved.describe()))
            .collect()
    }
}

/// Applies what waits from earlier batches, then `batch`, in one
/// transaction; on failure rolls it back and says why.
fn apply(
    connection: &Connection,
    unsaved: &BTreeMap<String, Unsaved>,
    batch: &[Write],
) -> Result<(), String> {
    let applied = connection.execute_batch("BEGIN IMMEDIATE").and_then(|()| {
        for write in unsaved.values().flat_map(Unsaved::writes).chain(batch) {
            apply_one(connection, write)?;
        }
        connection.execute_batch("COMMIT")
    });
    applied.map_err(|err| {
        let cause = cause_of(connection, &err);
        // A transaction left open would take in the next batch and fail it
        // too: the connection would never save again.
        if !connection.is_autocommit() {
            if let Err(err) = connection.execute_batch("ROLLBACK") {
                log::error!("the task store cannot roll a failed batch back: {err}");
            }
        }
        cause
    })
}

fn apply_one(connection: &Connection, write: &Write) -> rusqlite::Result<()> {
    match write {
        Write::Insert(r) => {
            connection.execute(
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
            connection.execute(
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
            connection.execute(
                "UPDATE tasks SET state = ?2, finished_ms = ?3, result = ?4, \
                 output = coalesce(?5, output) WHERE id = ?1",
                params![id, state, finished_ms, result.as_slice(), output],
            )?;
        }
        Write::Output { id, output } => {
            connection.execute(
                "UPDATE tasks SET output = ?2 WHERE id = ?1",
                params![id, output],
            )?;
        }
        Write::Delete(ids) => {
            for id in ids {
                connection.execute("DELETE FROM tasks WHERE id = ?1", params![id])?;
            }
        }
    }
    Ok(())
}

/// Why SQLite could not save, as the system said it. SQLite turns ENOSPC
/// into SQLITE_FULL and keeps no errno for it (a short write is "full"
/// too), so a full disk is named here; for other I/O errors it keeps the
/// errno of the call that failed.
fn cause_of(connection: &Connection, err: &rusqlite::Error) -> String {
    match err.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => {
            std::io::Error::from_raw_os_error(libc::ENOSPC).to_string()
        }
        Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::CannotOpen) => {
            // SAFETY: the handle is this connection's, valid while it is
            // borrowed; sqlite3_system_errno only reads the errno SQLite
            // recorded for the failed call.
            let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(connection.handle()) };
            if errno == 0 {
                err.to_string()
            } else {
                format!("{err}: {}", std::io::Error::from_raw_os_error(errno))
            }
        }
        _ => err.to_string(),
    }
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

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
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
            let (store, records) = Store::open(dir.path(), dir.path(), waker()).unwrap();
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
            let err = Store::open(dir.path(), dir.path(), waker()).unwrap_err();
            assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        }
        let (store, records) = Store::open(dir.path(), dir.path(), waker()).unwrap();
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
        let err = Store::open(dir.path(), dir.path(), waker())
            .unwrap_err()
            .to_string();
        assert!(err.contains("tasks.db"), "{err}");
    }

    #[test]
    fn a_new_store_and_its_sockets_chain_are_0700_and_its_files_0600_wal_and_shm_too() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("agentos");
        let dir = base.join("sockets").join("run_agentos.sock");
        let above = mode(root.path());
        let (store, _) = Store::open(&dir, &base, waker()).unwrap();
        for write in 0..50 {
            store.write(Write::Insert(Record {
                request: "x".repeat(10_000),
                ..record(&format!("t-{write}"), write, "queued")
            }));
        }
        store.write(Write::Insert(record("marker", 99, "queued")));
        settle(&store);
        for path in [&base, &base.join("sockets"), &dir] {
            assert_eq!(mode(path), 0o700, "{}", path.display());
        }
        // SQLite makes the -wal and -shm lazily, with the database's mode.
        for name in FILES.iter().take(4) {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
        assert!(std::fs::metadata(dir.join("tasks.db-wal")).unwrap().len() > 400_000);
        // The parent the kernel did not choose is left as it was.
        assert_eq!(mode(root.path()), above);
    }

    #[test]
    fn looser_modes_an_earlier_kernel_left_are_tightened_at_start() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let (mut store, _) = Store::open(&dir, &dir, waker()).unwrap();
        store.close();
        drop(store);
        std::fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
        // An empty log SQLite would take as it is.
        std::fs::write(dir.join("tasks.db-wal"), b"").unwrap();
        for name in [LOCK, FILE, "tasks.db-wal"] {
            std::fs::set_permissions(dir.join(name), Permissions::from_mode(0o666)).unwrap();
        }
        let (_store, _) = Store::open(&dir, &dir, waker()).unwrap();
        assert_eq!(mode(&dir), 0o700);
        for name in [LOCK, FILE, "tasks.db-wal", "tasks.db-shm"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
    }

    #[test]
    fn a_link_in_place_of_the_database_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(FILE)).unwrap();
        let err = Store::open(&dir, &dir, waker()).unwrap_err().to_string();
        assert!(
            err.contains("tasks.db") && err.contains("not a regular file"),
            "{err}"
        );
    }

    fn is_root() -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        eprintln!("!!! NOT TESTED: this needs root");
        false
    }

    #[test]
    fn a_state_directory_of_another_user_is_refused_naming_it_and_its_owner() {
        if !is_root() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let was = mode(&dir);
        let err = Store::open(&dir, &dir, waker()).unwrap_err();
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
        let err = err.to_string();
        assert!(
            err.contains(&dir.display().to_string()) && err.contains("uid 65534"),
            "{err}"
        );
        // Nothing was changed or made in it.
        assert_eq!(mode(&dir), was);
        assert!(!dir.join(LOCK).exists());
    }

    /// Opens `path` read-only as uid and gid 65534 in a child process: 0,
    /// or the errno.
    fn open_as_stranger(path: &Path) -> i32 {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the child only makes raw system calls (no allocation, no
        // lock another thread may hold) and leaves with _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            // SAFETY: raw system calls on a path made before the fork.
            nix::unistd::ForkResult::Child => unsafe {
                let code = if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()) != 0
                    || libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534) != 0
                    || libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) != 0
                {
                    255
                } else if libc::open(path.as_ptr(), libc::O_RDONLY) >= 0 {
                    0
                } else {
                    *libc::__errno_location()
                };
                libc::_exit(code)
            },
            nix::unistd::ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None)
            {
                Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
                other => panic!("the stranger's process: {other:?}"),
            },
        }
    }

    #[test]
    fn a_stranger_cannot_open_the_lock_or_the_database_even_where_they_were_left_open() {
        if !is_root() {
            return;
        }
        // A directory everyone may pass through, and a store an earlier
        // kernel left open to all: the stranger could take the lock.
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), Permissions::from_mode(0o755)).unwrap();
        let dir = root.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
        for name in [LOCK, FILE] {
            std::fs::write(dir.join(name), b"").unwrap();
            std::fs::set_permissions(dir.join(name), Permissions::from_mode(0o666)).unwrap();
        }
        assert_eq!(open_as_stranger(&dir.join(LOCK)), 0, "the setup is open");
        let (_store, _) = Store::open(&dir, &dir, waker()).unwrap();
        for name in [LOCK, FILE, "tasks.db-wal", "tasks.db-shm"] {
            assert_eq!(open_as_stranger(&dir.join(name)), libc::EACCES, "{name}");
        }
        // The same for a store made afresh.
        let fresh = root.path().join("fresh");
        let (_fresh, _) = Store::open(&fresh, &fresh, waker()).unwrap();
        assert_eq!(open_as_stranger(&fresh.join(LOCK)), libc::EACCES);
    }

    /// A writer on a database of its own that holds at most `pages` pages:
    /// past them SQLite fails as on a full disk.
    fn writer_with_room(
        dir: &Path,
        pages: u32,
    ) -> (Writer, Arc<AtomicU64>, Receiver<Refused>, Connection) {
        let path = dir.join(FILE);
        let connection = open_connection(&path).unwrap();
        connection.execute_batch(SCHEMA).unwrap();
        connection
            .pragma_update(None, "max_page_count", pages)
            .unwrap();
        let applied = Arc::new(AtomicU64::new(0));
        let (refusals, refused) = channel();
        let writer = Writer::new(connection, path.clone(), applied.clone(), refusals, waker());
        (writer, applied, refused, open_connection(&path).unwrap())
    }

    fn stored(reader: &Connection) -> Vec<(String, String, usize)> {
        reader
            .prepare("SELECT id, state, length(coalesce(output, '')) FROM tasks ORDER BY seq")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn a_batch_that_cannot_be_saved_refuses_its_new_tasks_and_its_other_changes_are_saved_later() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, applied, refused, reader) = writer_with_room(dir.path(), 4);
        writer.save(vec![Write::Insert(record("t-a", 1, "queued"))]);
        assert_eq!(applied.load(Ordering::Acquire), 1);
        // A large output does not fit: the batch is refused as a whole.
        let output = |n: usize| Write::Output {
            id: "t-a".into(),
            output: "o".repeat(n),
        };
        writer.save(vec![
            Write::Started {
                id: "t-a".into(),
                started_ms: 2,
            },
            output(10),
            output(100_000),
            Write::Insert(record("t-b", 2, "queued")),
        ]);
        assert_eq!(
            refused.try_recv().unwrap(),
            Refused {
                tasks: vec!["t-b".into()],
                cause: "No space left on device (os error 28)".into(),
            }
        );
        assert_eq!(applied.load(Ordering::Acquire), 1, "nothing more is saved");
        assert!(
            writer.connection.is_autocommit(),
            "no transaction is left open"
        );
        assert_eq!(stored(&reader), [("t-a".into(), "queued".into(), 0)]);
        // Tried again, alone or with the next batch, while there is no room:
        // still unsaved, kept once per kind per task, and refused again.
        writer.save(Vec::new());
        writer.save(vec![
            Write::Insert(record("t-c", 3, "queued")),
            output(100_001),
        ]);
        assert_eq!(refused.try_recv().unwrap().tasks, ["t-c"]);
        assert_eq!(writer.unsaved.len(), 1);
        assert_eq!(
            writer.lost(),
            ["task t-a: not saved: its start, its latest output"]
        );
        assert_eq!(applied.load(Ordering::Acquire), 1);
        // Room again: the next batch saves what waited first, then itself.
        writer
            .connection
            .pragma_update(None, "max_page_count", 1000)
            .unwrap();
        writer.save(vec![
            Write::Insert(record("t-d", 4, "queued")),
            Write::Finished {
                id: "t-a".into(),
                state: "completed".into(),
                finished_ms: 3,
                result: Arc::new(b"{}".to_vec()),
                output: None,
            },
        ]);
        assert!(refused.try_recv().is_err());
        assert_eq!(
            applied.load(Ordering::Acquire),
            9,
            "every write is accounted for"
        );
        assert!(writer.lost().is_empty());
        assert_eq!(
            stored(&reader),
            [
                ("t-a".into(), "completed".into(), 100_001),
                ("t-d".into(), "queued".into(), 0)
            ]
        );
    }

    #[test]
    fn changes_still_unsaved_are_saved_alone_once_there_is_room() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, applied, _refused, reader) = writer_with_room(dir.path(), 4);
        writer.save(vec![
            Write::Insert(record("t-a", 1, "queued")),
            Write::Insert(record("t-b", 2, "queued")),
        ]);
        writer.save(vec![
            Write::Delete(vec!["t-b".into()]),
            Write::Output {
                id: "t-a".into(),
                output: "o".repeat(100_000),
            },
        ]);
        assert_eq!(
            writer.lost(),
            [
                "task t-a: not saved: its latest output",
                "task t-b: not saved: its removal"
            ]
        );
        writer
            .connection
            .pragma_update(None, "max_page_count", 1000)
            .unwrap();
        writer.save(Vec::new());
        assert_eq!(applied.load(Ordering::Acquire), 4);
        assert_eq!(stored(&reader), [("t-a".into(), "queued".into(), 100_000)]);
    }
}
