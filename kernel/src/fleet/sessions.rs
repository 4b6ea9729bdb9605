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
//! under the owner's advisory lock, which publishing holds too
//! ([`contents`]). A claim leaves a note of the node that made it.

use std::fs;
use std::path::{Path, PathBuf};

use postgres::{Client, Transaction};

use super::contents;
use super::error::FleetError;
use super::tasks::{FleetOwner, CHANNEL};
use crate::exec::carried_template;
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
    /// Its environment and labels, as JSON.
    pub meta: Vec<u8>,
    /// The template it carries (JSON), whose image is among its contents.
    pub template: Option<Vec<u8>>,
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
    /// Its environment and labels, as published.
    pub meta: Vec<u8>,
    /// The template it carries, as published.
    pub template: Option<Vec<u8>>,
    /// The directory its contents were written to, each by its hash, as
    /// the database holds them: the store checks them.
    pub staging: PathBuf,
    pub generation: i64,
    pub node: String,
}

/// Whose a claimed publication is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This node's (now, or before).
    Won,
    /// Another's: the node that claimed it, if it was claimed rather than
    /// replaced or taken back.
    Lost(Option<String>),
    /// Nobody's yet: the fleet keeps it still (only a check says so).
    Kept,
}

/// What a node asks of the fleet about a session: `key` (the session as
/// the kernel knows it) comes back with the answer.
#[derive(Debug)]
pub enum SessionJob {
    Publish(Key, Publication),
    /// Fetches `owner`'s hibernated session `name` into `staging`, at
    /// most `max_bytes` of it: of its snapshot, and of the image of the
    /// template it carries.
    Fetch {
        key: Key,
        owner: FleetOwner,
        name: String,
        staging: PathBuf,
        max_bytes: (u64, u64),
        /// The templates this node has, whose images it needs not fetch.
        templates_here: Vec<String>,
    },
    /// Claims (or forgets) publication `generation` of a session; with
    /// `check`, only asks whose it is.
    Claim {
        key: Key,
        owner: FleetOwner,
        name: String,
        generation: i64,
        check: bool,
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
    /// Whether the claim was this node's.
    Claimed(Key, Result<Claim, FleetError>),
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
                max_bytes,
                templates_here,
            } => {
                let session = (&owner, name.as_str());
                let fetched =
                    client.and_then(|c| fetch(c, session, &staging, max_bytes, &templates_here));
                SessionNews::Fetched(key, fetched)
            }
            SessionJob::Claim {
                key,
                owner,
                name,
                generation,
                check,
            } => {
                let publication = (owner, name, generation);
                let claimed = client.and_then(|c| claim(c, node, &publication, check));
                SessionNews::Claimed(key, claimed)
            }
        }
    }
}

/// Publishes a session this node hibernated, with the contents it names,
/// in one transaction; a row of another node's of the same name stays as
/// it is (and what was sent with it is not kept).
fn publish(
    client: &mut Client,
    node: &str,
    publication: &Publication,
) -> Result<Option<i64>, FleetError> {
    let Publication { owner, name, .. } = publication;
    let manifest = fs::read(&publication.manifest)
        .map_err(|err| FleetError::Unavailable(format!("its manifest cannot be read: {err}")))?;
    let hashes: Vec<&str> = (publication.contents.iter())
        .map(|(hash, _)| hash.as_str())
        .collect();
    let bytes = i64::try_from(publication.bytes).unwrap_or(i64::MAX);
    let mut tx = owners_lock(client, owner)?;
    contents::upload(&mut tx, owner, &publication.contents)?;
    let published = tx.query_opt(
        "INSERT INTO agentos_sessions AS s
            (owner_user, owner_delegate, name, node, generation, manifest, hashes, bytes, meta,
             template)
         VALUES ($1, $2, $3, $4, nextval('agentos_session_generations'), $5, $6, $7, $8, $9)
         ON CONFLICT (owner_user, owner_delegate, name) DO UPDATE
            SET generation = EXCLUDED.generation, manifest = EXCLUDED.manifest,
                hashes = EXCLUDED.hashes, bytes = EXCLUDED.bytes, meta = EXCLUDED.meta,
                template = EXCLUDED.template, hibernated_at = now()
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
            &publication.meta,
            &publication.template,
        ],
    )?;
    if published.is_none() {
        // Another node's: nothing sent is kept.
        return Ok(None);
    }
    contents::remove_unnamed(&mut tx, owner)?;
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &SESSIONS_NOTE])?;
    tx.commit()?;
    Ok(published.map(|row| row.get(0)))
}

/// Writes `owner`'s hibernated session `name`'s contents into `staging`,
/// each under its hash, at most `max_bytes` together: of its snapshot's,
/// and of its template's image, unless this node has a template of that
/// name (`templates_here`: the image is not needed then); claims nothing.
fn fetch(
    client: &mut Client,
    (owner, name): (&FleetOwner, &str),
    staging: &Path,
    (max_bytes, max_template_bytes): (u64, u64),
    templates_here: &[String],
) -> Result<Option<Fetched>, FleetError> {
    let Some(row) = client.query_opt(
        "SELECT node, generation, manifest, hashes, meta, template FROM agentos_sessions
         WHERE owner_user = $1 AND owner_delegate = $2 AND name = $3",
        &[&owner.user, &owner.delegate, &name],
    )?
    else {
        return Ok(None);
    };
    let mut hashes: Vec<String> = row.get(3);
    let template: Option<Vec<u8>> = row.get(5);
    let carried = (template.as_deref().map(carried_template).transpose())
        .map_err(|err| FleetError::Unavailable(err.to_string()))?;
    let image = carried.filter(|t| !templates_here.contains(&t.name));
    if let Some(image) = &image {
        if !hashes.contains(&image.hash) {
            let why = "the image of the template it carries is not among its contents";
            return Err(FleetError::Unavailable(why.into()));
        }
    }
    let carried_hash = image.as_ref().map(|t| t.hash.clone());
    hashes.retain(|hash| Some(hash) != carried_hash.as_ref());
    let mut downloaded = contents::download(client, owner, &hashes, staging, max_bytes);
    if let (Ok(()), Some(image)) = (&downloaded, carried_hash) {
        let image = [image];
        downloaded = contents::download(client, owner, &image, staging, max_template_bytes);
    }
    if downloaded.is_err() {
        let _ = fs::remove_dir_all(staging);
    }
    downloaded?;
    Ok(Some(Fetched {
        manifest: row.get(2),
        meta: row.get(4),
        template,
        staging: staging.to_owned(),
        generation: row.get(1),
        node: row.get(0),
    }))
}

/// Takes publication `generation` of `owner`'s session `name` out of the
/// fleet (unless it only `check`s), and keeps a note of who took it, so
/// that a node that took it and did not hear so (its answer lost, the
/// node restarted) learns it later.
fn claim(
    client: &mut Client,
    node: &str,
    (owner, name, generation): &(FleetOwner, String, i64),
    check: bool,
) -> Result<Claim, FleetError> {
    let mut tx = owners_lock(client, owner)?;
    let took = if check {
        let kept = tx.query_opt(
            "SELECT 1 FROM agentos_sessions
             WHERE owner_user = $1 AND owner_delegate = $2 AND name = $3 AND generation = $4",
            &[&owner.user, &owner.delegate, &name, &generation],
        )?;
        if kept.is_some() {
            return Ok(Claim::Kept);
        }
        false
    } else {
        tx.execute(
            "DELETE FROM agentos_sessions
             WHERE owner_user = $1 AND owner_delegate = $2 AND name = $3 AND generation = $4",
            &[&owner.user, &owner.delegate, &name, &generation],
        )? == 1
    };
    let claim = if took {
        tx.execute(
            "INSERT INTO agentos_session_claims
                (owner_user, owner_delegate, name, generation, node)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            &[&owner.user, &owner.delegate, &name, generation, &node],
        )?;
        tx.execute(
            "DELETE FROM agentos_session_claims WHERE claimed_at < now() - interval '30 days'",
            &[],
        )?;
        contents::remove_unnamed(&mut tx, owner)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &SESSIONS_NOTE])?;
        Claim::Won
    } else {
        let by: Option<String> = tx
            .query_opt(
                "SELECT node FROM agentos_session_claims
                 WHERE owner_user = $1 AND owner_delegate = $2 AND name = $3 AND generation = $4",
                &[&owner.user, &owner.delegate, &name, generation],
            )?
            .map(|row| row.get(0));
        match by {
            Some(by) if by == node => Claim::Won,
            by => Claim::Lost(by),
        }
    };
    tx.commit()?;
    Ok(claim)
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
