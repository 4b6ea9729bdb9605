//! The audit log's transactions, run on the task store's writer thread
//! (see `tasks::store::Database`): typed entries become rows here, and
//! rows typed entries.

use std::time::{Duration, UNIX_EPOCH};

use agentos_proto::payload::{AuditCategory, AuditEntry, AuditLogReply, AuditLogRequest};
use agentos_proto::{ErrorCode, ErrorReply};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection};

use crate::clock::rfc3339;

/// Why a transaction failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// SQLite failed.
    #[error("the audit log's database failed: {0}")]
    Database(#[from] rusqlite::Error),
    /// A row is not one this kernel wrote (the file was changed by hand).
    #[error("an audit entry cannot be read: {0}")]
    Corrupt(String),
}

impl From<AuditError> for ErrorReply {
    fn from(err: AuditError) -> ErrorReply {
        ErrorReply::new(ErrorCode::Internal, err.to_string())
    }
}

/// An entry to write, with who may read it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// When (Unix milliseconds).
    pub time_ms: i64,
    /// What it is about.
    pub category: AuditCategory,
    /// What happened.
    pub event_type: &'static str,
    /// The agent it is about.
    pub agent_id: Option<u32>,
    /// That agent's name.
    pub agent_name: Option<String>,
    /// Who caused it, in its wire form (JSON).
    pub principal: String,
    /// Whether what was asked was done.
    pub success: bool,
    /// Its details, as JSON.
    pub details: String,
    /// The operator whose tree it is about.
    pub tree_uid: u32,
    /// The operator whose tree caused it.
    pub by_uid: u32,
    /// The agent it is about and that agent's ancestors, as `/1/5/9/`.
    pub line: Option<String>,
    /// The EXEC run that caused it.
    pub run: Option<u64>,
    /// The kernel that wrote it.
    pub boot: i64,
}

/// Who reads the log, and so which entries it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// An operator: the entries about its uid's tree or caused in it, of
    /// every kernel.
    Operator {
        /// Its uid.
        uid: u32,
    },
    /// An agent: the entries about itself and its descendants written by
    /// this kernel.
    Agent {
        /// Its id.
        id: u32,
        /// This kernel.
        boot: i64,
    },
    /// An EXEC run: the entries it caused itself.
    Run {
        /// Its number.
        number: u64,
        /// This kernel.
        boot: i64,
    },
}

/// The `line` column of an agent whose ancestors and itself are `line`.
pub fn line_of(line: &[u32]) -> String {
    let mut text = String::from("/");
    for id in line {
        text.push_str(&id.to_string());
        text.push('/');
    }
    text
}

/// Writes `row`, then removes the oldest entries beyond `max_entries`.
pub fn insert(connection: &Connection, row: &Row, max_entries: u64) -> Result<(), AuditError> {
    connection.execute(
        "INSERT INTO audit (time_ms, category, event_type, agent_id, agent_name, principal, \
         success, details, tree_uid, by_uid, line, run, boot) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params![
            row.time_ms,
            row.category.as_str(),
            row.event_type,
            row.agent_id,
            row.agent_name,
            row.principal,
            row.success,
            row.details,
            row.tree_uid,
            row.by_uid,
            row.line,
            row.run.map(|run| run as i64),
            row.boot,
        ],
    )?;
    trim(connection, max_entries)?;
    Ok(())
}

/// Removes the oldest entries beyond `max_entries`; returns how many.
pub fn trim(connection: &Connection, max_entries: u64) -> Result<usize, AuditError> {
    let keep = i64::try_from(max_entries).unwrap_or(i64::MAX);
    Ok(connection.execute(
        "DELETE FROM audit WHERE id <= \
         (SELECT id FROM audit ORDER BY id DESC LIMIT 1 OFFSET ?1)",
        params![keep],
    )?)
}

/// The entries `reader` may read that `request` asks for.
pub fn read(
    connection: &Connection,
    reader: Reader,
    request: &AuditLogRequest,
) -> Result<AuditLogReply, AuditError> {
    let mut sql = String::from(
        "SELECT id, time_ms, category, event_type, agent_id, agent_name, principal, success, \
         details FROM audit WHERE id > ?",
    );
    let mut values = vec![Value::Integer(
        i64::try_from(request.since_id).unwrap_or(i64::MAX),
    )];
    match reader {
        Reader::Operator { uid } => {
            sql.push_str(" AND (tree_uid = ? OR by_uid = ?)");
            values.push(Value::Integer(uid.into()));
            values.push(Value::Integer(uid.into()));
        }
        Reader::Agent { id, boot } => {
            sql.push_str(" AND boot = ? AND line LIKE ?");
            values.push(Value::Integer(boot));
            values.push(Value::Text(format!("%/{id}/%")));
        }
        Reader::Run { number, boot } => {
            sql.push_str(" AND boot = ? AND run = ?");
            values.push(Value::Integer(boot));
            values.push(Value::Integer(number as i64));
        }
    }
    if let Some(category) = request.category {
        sql.push_str(" AND category = ?");
        values.push(Value::Text(category.as_str().to_owned()));
    }
    if let Some(agent) = request.agent_id {
        sql.push_str(" AND agent_id = ?");
        values.push(Value::Integer(agent.into()));
    }
    // One more than asked says whether more follow.
    let limit = request.limit();
    sql.push_str(" ORDER BY id LIMIT ?");
    values.push(Value::Integer(i64::from(limit) + 1));
    let mut statement = connection.prepare(&sql)?;
    let rows = statement.query_map(params_from_iter(values), |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, String>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, Option<u32>>(4)?,
            row.get::<_, Option<String>>(5)?,
            row.get::<_, String>(6)?,
            row.get::<_, bool>(7)?,
            row.get::<_, String>(8)?,
        ))
    })?;
    let mut entries = Vec::new();
    for row in rows {
        let (id, time_ms, category, event_type, agent_id, agent_name, principal, success, details) =
            row?;
        let corrupt = |what: &str| AuditError::Corrupt(format!("entry {id}: {what}"));
        entries.push(AuditEntry {
            id: id as u64,
            timestamp: rfc3339(UNIX_EPOCH + Duration::from_millis(time_ms.max(0) as u64)),
            category: AuditCategory::from_name(&category)
                .ok_or_else(|| corrupt(&format!("category {category:?}")))?,
            event_type,
            agent_id,
            agent_name,
            principal: serde_json::from_str(&principal)
                .map_err(|err| corrupt(&format!("principal: {err}")))?,
            success,
            details: serde_json::from_str(&details)
                .map_err(|err| corrupt(&format!("details: {err}")))?,
        });
    }
    let more = entries.len() > limit as usize;
    entries.truncate(limit as usize);
    Ok(AuditLogReply {
        success: true,
        count: entries.len(),
        entries,
        more,
    })
}
