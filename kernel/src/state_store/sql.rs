//! The state store's transactions, run on the task store's writer thread
//! (see `tasks::store::Database`): rows become typed replies here.

use std::time::{Duration, UNIX_EPOCH};

use agentos_proto::payload::{DeleteReply, FetchReply, KeysReply, StoreReply, MAX_KEYS_LISTED};
use agentos_proto::{ErrorCode, ErrorReply};
use rusqlite::{params, Connection, OptionalExtension};

use super::space::{Space, AGENT_SPACES};
use crate::clock::rfc3339;

/// Why a transaction failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The request is refused (a quota).
    #[error("{0}")]
    Refused(ErrorReply),
    /// SQLite failed.
    #[error("the state store's database failed: {0}")]
    Database(#[from] rusqlite::Error),
    /// A stored value is not JSON (the file was changed by hand).
    #[error("a stored value is not JSON: {0}")]
    Corrupt(#[from] serde_json::Error),
}

impl From<StateError> for ErrorReply {
    fn from(err: StateError) -> ErrorReply {
        match err {
            StateError::Refused(reply) => reply,
            other => ErrorReply::new(ErrorCode::Internal, other.to_string()),
        }
    }
}

/// What one owner may hold.
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    /// Keys.
    pub keys: u64,
    /// Bytes of keys and values.
    pub bytes: u64,
}

/// A key to store.
#[derive(Debug)]
pub struct NewEntry {
    /// Where.
    pub space: Space,
    /// Whose quota it counts against.
    pub owner_uid: u32,
    /// The key.
    pub key: String,
    /// The value, as JSON.
    pub value: String,
    /// When it expires (Unix milliseconds), if it does.
    pub expires_ms: Option<i64>,
}

/// Stores `entry` if its owner's quota has room for it (counting what it
/// replaces as freed); the owner's expired keys are removed first.
pub fn store(
    connection: &Connection,
    entry: NewEntry,
    quota: Quota,
    now_ms: i64,
) -> Result<StoreReply, StateError> {
    let transaction = connection.unchecked_transaction()?;
    transaction.execute(
        "DELETE FROM state WHERE owner_uid = ?1 AND expires_ms <= ?2",
        params![entry.owner_uid, now_ms],
    )?;
    let space = entry.space.to_string();
    let replaced: Option<i64> = transaction
        .query_row(
            "SELECT bytes FROM state WHERE space = ?1 AND key = ?2",
            params![space, entry.key],
            |row| row.get(0),
        )
        .optional()?;
    let (keys, bytes): (i64, i64) = transaction.query_row(
        "SELECT count(*), coalesce(sum(bytes), 0) FROM state WHERE owner_uid = ?1",
        params![entry.owner_uid],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    let size = (entry.key.len() + entry.value.len()) as i64;
    let keys_after = keys + i64::from(replaced.is_none());
    let bytes_after = bytes - replaced.unwrap_or(0) + size;
    let whose = format!("operator uid {}'s tree", entry.owner_uid);
    if keys_after > quota.keys as i64 {
        return Err(refused(format!(
            "{whose} holds {keys} keys in the state store, the most `state.max_keys_per_owner` \
             allows ({}); DELETE some first",
            quota.keys
        )));
    }
    if bytes_after > quota.bytes as i64 {
        return Err(refused(format!(
            "{whose} would hold {bytes_after} bytes in the state store, over \
             `state.max_bytes_per_owner` ({}); DELETE some first",
            quota.bytes
        )));
    }
    transaction.execute(
        "INSERT OR REPLACE INTO state (space, key, owner_uid, value, bytes, expires_ms, \
         updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            space,
            entry.key,
            entry.owner_uid,
            entry.value,
            size,
            entry.expires_ms,
            now_ms
        ],
    )?;
    transaction.commit()?;
    Ok(StoreReply {
        success: true,
        key: entry.key,
        scope: entry.space.scope(),
        expires_at: entry.expires_ms.map(time_of),
    })
}

/// `key` in the first of `spaces` that holds it unexpired.
pub fn fetch(
    connection: &Connection,
    spaces: &[Space],
    key: &str,
    now_ms: i64,
) -> Result<FetchReply, StateError> {
    for space in spaces {
        let found: Option<(String, Option<i64>)> = connection
            .query_row(
                "SELECT value, expires_ms FROM state WHERE space = ?1 AND key = ?2 \
                 AND (expires_ms IS NULL OR expires_ms > ?3)",
                params![space.to_string(), key, now_ms],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        if let Some((value, expires_ms)) = found {
            return Ok(FetchReply {
                success: true,
                exists: true,
                value: serde_json::from_str(&value)?,
                scope: Some(space.scope()),
                expires_at: expires_ms.map(time_of),
            });
        }
    }
    Ok(FetchReply {
        success: true,
        exists: false,
        value: serde_json::Value::Null,
        scope: None,
        expires_at: None,
    })
}

/// Deletes `key` from the first of `spaces` that holds it unexpired
/// (the one FETCH would have read).
pub fn delete(
    connection: &Connection,
    spaces: &[Space],
    key: &str,
    now_ms: i64,
) -> Result<DeleteReply, StateError> {
    for space in spaces {
        let deleted = connection.execute(
            "DELETE FROM state WHERE space = ?1 AND key = ?2 \
             AND (expires_ms IS NULL OR expires_ms > ?3)",
            params![space.to_string(), key, now_ms],
        )?;
        if deleted > 0 {
            return Ok(DeleteReply {
                success: true,
                deleted: true,
                scope: Some(space.scope()),
            });
        }
    }
    Ok(DeleteReply {
        success: true,
        deleted: false,
        scope: None,
    })
}

/// The unexpired keys of `spaces` that start with `prefix`, sorted, each
/// once, at most [`MAX_KEYS_LISTED`].
pub fn keys(
    connection: &Connection,
    spaces: &[Space],
    prefix: &str,
    now_ms: i64,
) -> Result<KeysReply, StateError> {
    let names: Vec<String> = spaces.iter().map(Space::to_string).collect();
    let (first, second) = match names.as_slice() {
        [one] => (one.as_str(), one.as_str()),
        [one, two, ..] => (one.as_str(), two.as_str()),
        [] => ("", ""),
    };
    let mut keys = connection
        .prepare(
            "SELECT DISTINCT key FROM state WHERE space IN (?1, ?2) \
             AND substr(key, 1, length(?3)) = ?3 \
             AND (expires_ms IS NULL OR expires_ms > ?4) ORDER BY key LIMIT ?5",
        )?
        .query_map(
            params![first, second, prefix, now_ms, MAX_KEYS_LISTED as i64 + 1],
            |row| row.get(0),
        )?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    let truncated = keys.len() > MAX_KEYS_LISTED;
    keys.truncate(MAX_KEYS_LISTED);
    Ok(KeysReply {
        success: true,
        count: keys.len(),
        keys,
        truncated,
    })
}

/// Removes every expired key; returns how many.
pub fn purge_expired(connection: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    connection.execute("DELETE FROM state WHERE expires_ms <= ?1", params![now_ms])
}

/// Removes the keys of `space`.
pub fn forget(connection: &Connection, space: Space) -> rusqlite::Result<usize> {
    connection.execute(
        "DELETE FROM state WHERE space = ?1",
        params![space.to_string()],
    )
}

/// Removes the own keys of every agent: at start, every agent is of an
/// earlier kernel (and its id may be given again).
pub fn forget_every_agent(connection: &Connection) -> rusqlite::Result<usize> {
    connection.execute(
        "DELETE FROM state WHERE substr(space, 1, length(?1)) = ?1",
        params![AGENT_SPACES],
    )
}

fn refused(message: String) -> StateError {
    StateError::Refused(ErrorReply::new(ErrorCode::LimitExceeded, message))
}

/// Unix milliseconds as the protocol writes times.
fn time_of(ms: i64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}
