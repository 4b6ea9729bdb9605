//! The database: its schema, reading every task at start, applying
//! changes in one transaction, and reading a result back. Rows and their
//! columns become typed values here, and typed values columns.

use std::path::Path;
use std::time::Duration;

use agentos_proto::payload::{TaskKind, TaskState};
use rusqlite::{params, Connection, OptionalExtension};

use super::error::{ReadError, RowError, SaveError};
use super::seam::{now_ms, StoredResult, StoredTask, Write};
use crate::tasks::end::{interrupted, KERNEL_STOPPED};

/// How the database is used, set on every open.
const PRAGMAS: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
";

/// The schema's versions, oldest first: a database at version `n`
/// (`PRAGMA user_version`) gets the steps from `n` on, each in a
/// transaction with its new version. A database made before versions
/// were kept is at 0 and has the tasks table already (hence `IF NOT
/// EXISTS`).
const MIGRATIONS: [&str; 3] = [TASKS, STATE, AUDIT];

/// Version 1: the tasks.
const TASKS: &str = "
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

/// Version 2: the state store (`crate::state_store`), beside the tasks so
/// that one writer thread and one lock serve both. `space` is whose keys
/// they are (`agent:<id>`, `operator:<uid>`, `tree:<uid>`); `owner_uid`
/// whose quota they count against; `bytes` what they count.
const STATE: &str = "
CREATE TABLE IF NOT EXISTS state (
    space TEXT NOT NULL,
    key TEXT NOT NULL,
    owner_uid INTEGER NOT NULL,
    value TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    expires_ms INTEGER,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (space, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS state_owner ON state (owner_uid);
CREATE INDEX IF NOT EXISTS state_expiry ON state (expires_ms) WHERE expires_ms IS NOT NULL;
";

/// Version 3: the audit log (`crate::audit`). `principal` is who caused
/// an entry (its wire form); who may read it is in `tree_uid` (the
/// operator whose tree it is about), `by_uid` (the operator whose tree
/// caused it), `line` (the agent it is about and that
/// agent's ancestors, as `/1/5/9/`), `run` (the EXEC run that caused it)
/// and `boot` (the kernel that wrote it: agent ids and run numbers are
/// given again after a restart).
const AUDIT: &str = "
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time_ms INTEGER NOT NULL,
    category TEXT NOT NULL,
    event_type TEXT NOT NULL,
    agent_id INTEGER,
    agent_name TEXT,
    principal TEXT NOT NULL,
    success INTEGER NOT NULL,
    details TEXT NOT NULL,
    tree_uid INTEGER NOT NULL,
    by_uid INTEGER NOT NULL,
    line TEXT,
    run INTEGER,
    boot INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_tree ON audit (tree_uid, id);
CREATE INDEX IF NOT EXISTS audit_by ON audit (by_uid, id);
CREATE INDEX IF NOT EXISTS audit_boot ON audit (boot, id);
";

/// Brings the database's schema up to this kernel's version. A database
/// a newer kernel left is used as it is (its steps only add).
pub fn migrate(connection: &Connection) -> rusqlite::Result<()> {
    connection.execute_batch(PRAGMAS)?;
    let version: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let done = usize::try_from(version).unwrap_or(0);
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(done) {
        let transaction = connection.unchecked_transaction()?;
        transaction.execute_batch(sql)?;
        transaction.pragma_update(None, "user_version", step as i64 + 1)?;
        transaction.commit()?;
    }
    Ok(())
}

/// The tasks in the store, oldest first, and the rows that are none this
/// kernel can read.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every task that could be read.
    pub records: Vec<StoredTask>,
    /// Rows left in the store as they are.
    pub unreadable: Vec<RowError>,
}

pub fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open(path)?;
    connection.busy_timeout(Duration::from_secs(5))?;
    // A file that is not a database fails here, at start, not later.
    connection.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
    Ok(connection)
}

/// Ends the tasks the last kernel left running as `interrupted`, with the
/// output they had saved; returns their ids.
pub fn interrupt_running(connection: &Connection) -> rusqlite::Result<Vec<String>> {
    let running = connection
        .prepare("SELECT id, output FROM tasks WHERE state = 'running' ORDER BY seq")?
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    if running.is_empty() {
        return Ok(Vec::new());
    }
    let finished_ms = now_ms();
    // All or none: a kernel that fails here starts no more than it found.
    let transaction = connection.unchecked_transaction()?;
    for (id, output) in &running {
        let result = interrupted(KERNEL_STOPPED, output.as_deref().unwrap_or_default());
        transaction.execute(
            "UPDATE tasks SET state = ?2, finished_ms = ?3, result = ?4 WHERE id = ?1",
            params![id, TaskState::Interrupted.as_str(), finished_ms, result],
        )?;
    }
    transaction.commit()?;
    Ok(running.into_iter().map(|(id, _)| id).collect())
}

/// Every task's record (not its result), oldest first.
pub fn load(connection: &Connection) -> rusqlite::Result<Loaded> {
    let mut statement = connection.prepare(
        "SELECT id, seq, owner, kind, label, state, request, created_ms, started_ms, \
         finished_ms, output FROM tasks ORDER BY seq",
    )?;
    let rows = statement.query_map([], |row| {
        let id: String = row.get(0)?;
        let seq = row.get::<_, i64>(1)? as u64;
        let owner: String = row.get(2)?;
        let kind: String = row.get(3)?;
        let state: String = row.get(5)?;
        let owner = match owner.parse() {
            Ok(owner) => owner,
            Err(source) => return Ok(Err(RowError::Owner { id, seq, source })),
        };
        let Some(kind) = TaskKind::from_name(&kind) else {
            return Ok(Err(RowError::Kind { id, seq, kind }));
        };
        let state = TaskState::from_name(&state).unwrap_or_else(|| {
            log::warn!("tasks: task {id} has a state this kernel does not know ({state:?}): it is read as interrupted");
            TaskState::Interrupted
        });
        Ok(Ok(StoredTask {
            id,
            seq,
            owner,
            kind,
            label: row.get(4)?,
            state,
            request: row.get(6)?,
            created_ms: row.get(7)?,
            started_ms: row.get(8)?,
            finished_ms: row.get(9)?,
            output: row.get(10)?,
        }))
    })?;
    let mut loaded = Loaded::default();
    for row in rows {
        match row? {
            Ok(record) => loaded.records.push(record),
            Err(unreadable) => loaded.unreadable.push(unreadable),
        }
    }
    Ok(loaded)
}

/// Applies `writes` in one transaction; on failure rolls it back and says
/// why.
pub fn apply<'a>(
    connection: &Connection,
    writes: impl IntoIterator<Item = &'a Write>,
) -> Result<(), SaveError> {
    let applied = connection.execute_batch("BEGIN IMMEDIATE").and_then(|()| {
        for write in writes {
            apply_one(connection, write)?;
        }
        connection.execute_batch("COMMIT")
    });
    applied.map_err(|err| {
        let cause = cause_of(connection, err);
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
                    r.owner.to_string(),
                    r.kind.as_str(),
                    r.label,
                    r.state.as_str(),
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
                params![id, state.as_str(), finished_ms, result.as_slice(), output],
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

/// Why SQLite could not save, as the system said it: for I/O errors it
/// keeps the errno of the call that failed.
fn cause_of(connection: &Connection, err: rusqlite::Error) -> SaveError {
    match err.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => SaveError::DiskFull,
        Some(rusqlite::ErrorCode::SystemIoFailure | rusqlite::ErrorCode::CannotOpen) => {
            // SAFETY: the handle is this connection's, valid while it is
            // borrowed; sqlite3_system_errno only reads the errno SQLite
            // recorded for the failed call.
            let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(connection.handle()) };
            if errno == 0 {
                SaveError::Sqlite(err)
            } else {
                SaveError::Io {
                    sqlite: err,
                    errno: std::io::Error::from_raw_os_error(errno),
                }
            }
        }
        _ => SaveError::Sqlite(err),
    }
}

/// Reads a finished task's result back (on a worker: it may wait for the
/// disk).
pub fn read_result(path: &Path, id: &str) -> Result<StoredResult, ReadError> {
    let connection = open_connection(path).map_err(|source| ReadError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    connection
        .query_row(
            "SELECT result FROM tasks WHERE id = ?1",
            params![id],
            |row| row.get::<_, Option<Vec<u8>>>(0),
        )
        .optional()
        .map(Option::flatten)
        .map_err(|source| ReadError::Read {
            path: path.to_path_buf(),
            id: id.to_owned(),
            source,
        })
}
