//! Hibernated sessions the fleet keeps, so that one wakes on any node. A
//! node that hibernates an operator's or a delegate's session publishes
//! its snapshot (files and globals): the manifest as a row of
//! `agentos_sessions`, each content once per owner in
//! `agentos_session_contents`. A node that wakes it fetches it (its
//! contents' hashes are checked where they are stored), then claims the
//! row by its **generation**: only one claim of a publication succeeds, so
//! a session wakes on one node, and a node whose copy was claimed by
//! another knows it is no longer its own.
//!
//! Contents no row names are removed with the row that named them last,
//! under the owner's advisory lock, which publishing holds too.

use std::fs;
use std::path::PathBuf;

use postgres::{Client, Transaction};

use super::error::FleetError;
use super::tasks::{FleetOwner, CHANNEL};
use crate::identity::Principal;

/// A session as its node knows it: its owner, and its name.
pub type Key = (Principal, String);

/// The notification payload that says the hibernated sessions changed.
pub const SESSIONS_NOTE: &str = "sessions";

/// A hibernated session as the fleet lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hibernated {
    pub owner: FleetOwner,
    pub name: String,
    /// The node that hibernated it.
    pub node: String,
    /// Its publication: a claim names it.
    pub generation: i64,
}

/// A session's snapshot, as this node's store holds it, to publish.
#[derive(Debug)]
pub struct Publication {
    pub owner: FleetOwner,
    pub name: String,
    /// Its manifest's file.
    pub manifest: PathBuf,
    /// Each content it names, with the file that holds it.
    pub contents: Vec<(String, PathBuf)>,
    /// The bytes of its files.
    pub bytes: u64,
}

/// A hibernated session fetched from the fleet, not yet claimed.
#[derive(Debug)]
pub struct Fetched {
    /// Its manifest, as published.
    pub manifest: Vec<u8>,
    /// The directory its contents were written to, each by its hash, as
    /// the database holds them: the store checks them.
    pub staging: PathBuf,
    pub generation: i64,
    pub node: String,
}

/// What a node asks of the fleet about a session: `key` (the session as
/// the kernel knows it) comes back with the answer.
#[derive(Debug)]
pub enum SessionJob {
    Publish(Key, Publication),
    /// Fetches `owner`'s hibernated session `name` into `staging`.
    Fetch {
        key: Key,
        owner: FleetOwner,
        name: String,
        staging: PathBuf,
    },
    /// Claims (or forgets) publication `generation` of a session.
    Claim {
        key: Key,
        owner: FleetOwner,
        name: String,
        generation: i64,
    },
}

/// The fleet's answer to a [`SessionJob`].
#[derive(Debug)]
pub enum SessionNews {
    /// Published as `generation`, or why not (`None`: another node's
    /// session of that name is kept already).
    Published(Key, Result<Option<i64>, FleetError>),
    /// `None`: the fleet keeps no such session.
    Fetched(Key, Result<Option<Fetched>, FleetError>),
    /// Whether the claim was this node's: false when the publication was
    /// claimed by another node (or replaced) first.
    Claimed(Key, Result<bool, FleetError>),
    /// Every one the fleet keeps, or why they could not be listed.
    Listed(Result<Vec<Hibernated>, FleetError>),
}

impl SessionJob {
    /// Does the job on the database (or says why it could not).
    pub fn run(self, client: Result<&mut Client, FleetError>, node: &str) -> SessionNews {
        match self {
            SessionJob::Publish(key, publication) => {
                SessionNews::Published(key, client.and_then(|c| publish(c, node, &publication)))
            }
            SessionJob::Fetch {
                key,
                owner,
                name,
                staging,
            } => SessionNews::Fetched(key, client.and_then(|c| fetch(c, &owner, &name, staging))),
            SessionJob::Claim {
                key,
                owner,
                name,
                generation,
            } => SessionNews::Claimed(
                key,
                client.and_then(|c| claim(c, &owner, &name, generation)),
            ),
        }
    }
}

/// Publishes a session this node hibernated; a row of another node's of
/// the same name stays as it is.
fn publish(
    client: &mut Client,
    node: &str,
    publication: &Publication,
) -> Result<Option<i64>, FleetError> {
    let Publication { owner, name, .. } = publication;
    let manifest = fs::read(&publication.manifest)
        .map_err(|err| FleetError::Unavailable(format!("its manifest cannot be read: {err}")))?;
    let hashes: Vec<&str> = publication
        .contents
        .iter()
        .map(|(h, _)| h.as_str())
        .collect();
    let bytes = i64::try_from(publication.bytes).unwrap_or(i64::MAX);
    let mut tx = owners_lock(client, owner)?;
    let kept: Vec<String> = tx
        .query(
            "SELECT hash FROM agentos_session_contents
             WHERE owner_user = $1 AND owner_delegate = $2 AND hash = ANY($3)",
            &[&owner.user, &owner.delegate, &hashes],
        )?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for (hash, path) in &publication.contents {
        if kept.contains(hash) {
            continue;
        }
        let content = fs::read(path).map_err(|err| {
            FleetError::Unavailable(format!("content {hash} cannot be read: {err}"))
        })?;
        tx.execute(
            "INSERT INTO agentos_session_contents (owner_user, owner_delegate, hash, content)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            &[&owner.user, &owner.delegate, hash, &content],
        )?;
    }
    let published = tx.query_opt(
        "INSERT INTO agentos_sessions AS s
            (owner_user, owner_delegate, name, node, generation, manifest, hashes, bytes)
         VALUES ($1, $2, $3, $4, nextval('agentos_session_generations'), $5, $6, $7)
         ON CONFLICT (owner_user, owner_delegate, name) DO UPDATE
            SET generation = EXCLUDED.generation, manifest = EXCLUDED.manifest,
                hashes = EXCLUDED.hashes, bytes = EXCLUDED.bytes, hibernated_at = now()
            WHERE s.node = EXCLUDED.node
         RETURNING generation",
        &[
            &owner.user,
            &owner.delegate,
            name,
            &node,
            &manifest,
            &hashes,
            &bytes,
        ],
    )?;
    remove_unnamed_contents(&mut tx, owner)?;
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &SESSIONS_NOTE])?;
    tx.commit()?;
    Ok(published.map(|row| row.get(0)))
}

/// Writes `owner`'s hibernated session `name`'s contents into `staging`,
/// each under its hash; claims nothing.
fn fetch(
    client: &mut Client,
    owner: &FleetOwner,
    name: &str,
    staging: PathBuf,
) -> Result<Option<Fetched>, FleetError> {
    let mut tx = client.transaction()?;
    let Some(row) = tx.query_opt(
        "SELECT node, generation, manifest, hashes FROM agentos_sessions
         WHERE owner_user = $1 AND owner_delegate = $2 AND name = $3",
        &[&owner.user, &owner.delegate, &name],
    )?
    else {
        return Ok(None);
    };
    let hashes: Vec<String> = row.get(3);
    let unwritable = |err: std::io::Error| {
        FleetError::Unavailable(format!("its contents cannot be written here: {err}"))
    };
    fs::create_dir_all(&staging).map_err(unwritable)?;
    // Rows a few at a time: a session's contents may be large together.
    for chunk in hashes.chunks(16) {
        let contents = tx.query(
            "SELECT hash, content FROM agentos_session_contents
             WHERE owner_user = $1 AND owner_delegate = $2 AND hash = ANY($3)",
            &[&owner.user, &owner.delegate, &chunk],
        )?;
        if contents.len() != chunk.len() {
            return Err(FleetError::Unavailable(format!(
                "session {name:?} is missing contents in the fleet's store"
            )));
        }
        for content in contents {
            let hash: String = content.get(0);
            if !is_hash(&hash) {
                return Err(FleetError::Unavailable(format!(
                    "session {name:?} names a content that is no hash"
                )));
            }
            let bytes: &[u8] = content.get(1);
            fs::write(staging.join(&hash), bytes).map_err(unwritable)?;
        }
    }
    tx.commit()?;
    Ok(Some(Fetched {
        manifest: row.get(2),
        staging,
        generation: row.get(1),
        node: row.get(0),
    }))
}

/// Takes publication `generation` of the session out of the fleet.
fn claim(
    client: &mut Client,
    owner: &FleetOwner,
    name: &str,
    generation: i64,
) -> Result<bool, FleetError> {
    let mut tx = owners_lock(client, owner)?;
    let claimed = tx.execute(
        "DELETE FROM agentos_sessions
         WHERE owner_user = $1 AND owner_delegate = $2 AND name = $3 AND generation = $4",
        &[&owner.user, &owner.delegate, &name, &generation],
    )? == 1;
    if claimed {
        remove_unnamed_contents(&mut tx, owner)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &SESSIONS_NOTE])?;
    }
    tx.commit()?;
    Ok(claimed)
}

/// The hibernated sessions the fleet keeps.
pub fn list(client: &mut Client) -> Result<Vec<Hibernated>, FleetError> {
    let rows = client.query(
        "SELECT owner_user, owner_delegate, name, node, generation FROM agentos_sessions",
        &[],
    )?;
    Ok(rows
        .iter()
        .map(|row| Hibernated {
            owner: FleetOwner {
                user: row.get(0),
                delegate: row.get(1),
            },
            name: row.get(2),
            node: row.get(3),
            generation: row.get(4),
        })
        .collect())
}

/// A transaction holding `owner`'s lock on the fleet's store.
fn owners_lock<'c>(
    client: &'c mut Client,
    owner: &FleetOwner,
) -> Result<Transaction<'c>, FleetError> {
    let mut tx = client.transaction()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
        &[&owner.user, &owner.delegate],
    )?;
    Ok(tx)
}

fn remove_unnamed_contents(tx: &mut Transaction<'_>, owner: &FleetOwner) -> Result<(), FleetError> {
    tx.execute(
        "DELETE FROM agentos_session_contents c
         WHERE c.owner_user = $1 AND c.owner_delegate = $2 AND NOT EXISTS (
            SELECT 1 FROM agentos_sessions s
            WHERE s.owner_user = $1 AND s.owner_delegate = $2 AND c.hash = ANY(s.hashes))",
        &[&owner.user, &owner.delegate],
    )?;
    Ok(())
}

/// Whether `name` is a content's hash (BLAKE3, in hex), and so a plain
/// file name.
pub fn is_hash(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_hash_is_a_contents_name() {
        assert!(is_hash(&"ab".repeat(32)));
        assert!(!is_hash(&"AB".repeat(32)));
        assert!(!is_hash("../../etc/passwd"));
        assert!(!is_hash(&format!("{}/", "a".repeat(63))));
        assert!(!is_hash(""));
    }
}
