//! The contents of the sessions the fleet keeps: each file's content once
//! per owner, by its BLAKE3 hash, in parts of at most [`PART_BYTES`], so
//! neither end ever holds more than a few parts of a large file in memory.
//! Contents are written in the transaction that publishes the session
//! naming them, under the owner's lock, as removing those no kept session
//! names is: all of a publication, or none of it.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use postgres::{Client, Transaction};

use super::error::FleetError;
use super::tasks::FleetOwner;
use crate::exec::is_hash;

/// The most bytes of a content one row holds.
pub const PART_BYTES: usize = 8 << 20;
/// The most bytes of parts one statement brings back.
const BATCH_BYTES: i64 = 32 << 20;

/// Sends to the fleet each of `contents` (a hash and the file holding it)
/// it does not hold yet.
pub fn upload(
    tx: &mut Transaction<'_>,
    owner: &FleetOwner,
    contents: &[(String, PathBuf)],
) -> Result<(), FleetError> {
    let hashes: Vec<&str> = contents.iter().map(|(hash, _)| hash.as_str()).collect();
    let kept: Vec<String> = tx
        .query(
            "SELECT hash FROM agentos_session_contents
             WHERE owner_user = $1 AND owner_delegate = $2 AND hash = ANY($3) AND part = 0",
            &[&owner.user, &owner.delegate, &hashes],
        )?
        .iter()
        .map(|row| row.get(0))
        .collect();
    // Parts go a batch at a time: many small files take few statements.
    let mut batch = Batch::default();
    for (hash, path) in contents.iter().filter(|(hash, _)| !kept.contains(hash)) {
        let unreadable =
            |err: std::io::Error| FleetError::Unavailable(format!("content {hash}: {err}"));
        let mut file = File::open(path).map_err(unreadable)?;
        let mut part = 0i32;
        loop {
            let mut bytes = Vec::new();
            (&mut file)
                .take(PART_BYTES as u64)
                .read_to_end(&mut bytes)
                .map_err(unreadable)?;
            if bytes.is_empty() && part > 0 {
                break;
            }
            let last = bytes.len() < PART_BYTES;
            batch.add(hash, part, bytes);
            if batch.bytes >= PART_BYTES {
                batch.send(tx, owner)?;
            }
            if last {
                break;
            }
            part += 1;
        }
    }
    batch.send(tx, owner)
}

/// Parts waiting to be sent together.
#[derive(Default)]
struct Batch {
    hashes: Vec<String>,
    parts: Vec<i32>,
    contents: Vec<Vec<u8>>,
    bytes: usize,
}

impl Batch {
    fn add(&mut self, hash: &str, part: i32, content: Vec<u8>) {
        self.bytes += content.len();
        self.hashes.push(hash.to_owned());
        self.parts.push(part);
        self.contents.push(content);
    }

    fn send(&mut self, tx: &mut Transaction<'_>, owner: &FleetOwner) -> Result<(), FleetError> {
        if self.hashes.is_empty() {
            return Ok(());
        }
        tx.execute(
            "INSERT INTO agentos_session_contents (owner_user, owner_delegate, hash, part, content)
             SELECT $1, $2, hash, part, content
             FROM unnest($3::text[], $4::int[], $5::bytea[]) AS sent(hash, part, content)
             ON CONFLICT DO NOTHING",
            &[
                &owner.user,
                &owner.delegate,
                &self.hashes,
                &self.parts,
                &self.contents,
            ],
        )?;
        *self = Batch::default();
        Ok(())
    }
}

/// Writes each of `hashes` of `owner`'s to a file of `staging` named by
/// it (made 0700, its files 0600): the store checks them. More than
/// `max_bytes` together, a name that is no hash, or a part missing, is
/// refused (the caller removes `staging`).
pub fn download(
    client: &mut Client,
    owner: &FleetOwner,
    hashes: &[String],
    staging: &Path,
    max_bytes: u64,
) -> Result<(), FleetError> {
    let refused = |why: String| Err(FleetError::Unavailable(why));
    let unwritable = |err: std::io::Error| {
        FleetError::Unavailable(format!("its contents cannot be written here: {err}"))
    };
    let parts = client.query(
        "SELECT hash, part, octet_length(content) FROM agentos_session_contents
         WHERE owner_user = $1 AND owner_delegate = $2 AND hash = ANY($3)
         ORDER BY hash, part",
        &[&owner.user, &owner.delegate, &hashes],
    )?;
    let mut next_part: HashMap<String, i32> = HashMap::new();
    let mut last_length: HashMap<String, i32> = HashMap::new();
    let mut lengths: HashMap<(String, i32), i32> = HashMap::new();
    let mut total = 0u64;
    let mut batches: Vec<(Vec<String>, Vec<i32>)> = vec![(Vec::new(), Vec::new())];
    let mut batch_bytes = 0i64;
    for row in &parts {
        let (hash, part, length): (String, i32, i32) = (row.get(0), row.get(1), row.get(2));
        if !is_hash(&hash) {
            return refused("it names a content that is no hash".into());
        }
        let expected = next_part.entry(hash.clone()).or_insert(0);
        if part != *expected {
            return refused(format!("content {hash} is missing a part"));
        }
        if part > 0 && last_length.get(&hash) != Some(&(PART_BYTES as i32)) {
            return refused(format!("content {hash} has a part cut short"));
        }
        *expected += 1;
        last_length.insert(hash.clone(), length);
        lengths.insert((hash.clone(), part), length);
        total += u64::try_from(length).unwrap_or(0);
        if total > max_bytes {
            return refused(format!("its contents are over {max_bytes} bytes"));
        }
        if batch_bytes + i64::from(length) > BATCH_BYTES && batch_bytes > 0 {
            batches.push((Vec::new(), Vec::new()));
            batch_bytes = 0;
        }
        batch_bytes += i64::from(length);
        if let Some((batch_hashes, batch_parts)) = batches.last_mut() {
            batch_hashes.push(hash);
            batch_parts.push(part);
        }
    }
    let mut wanted: Vec<&String> = hashes.iter().collect();
    wanted.sort_unstable();
    wanted.dedup();
    if wanted.len() != next_part.len() {
        return refused("the fleet's store is missing some of its contents".into());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(staging)
        .map_err(unwritable)?;
    for (batch_hashes, batch_parts) in batches.iter().filter(|(h, _)| !h.is_empty()) {
        let rows = client.query(
            "SELECT c.hash, c.part, c.content FROM agentos_session_contents c
             JOIN unnest($3::text[], $4::int[]) AS wanted(hash, part)
               ON c.hash = wanted.hash AND c.part = wanted.part
             WHERE c.owner_user = $1 AND c.owner_delegate = $2",
            &[&owner.user, &owner.delegate, batch_hashes, batch_parts],
        )?;
        if rows.len() != batch_hashes.len() {
            return refused("the fleet's store changed as it was read".into());
        }
        for row in rows {
            let (hash, part, bytes): (String, i32, &[u8]) = (row.get(0), row.get(1), row.get(2));
            let listed = lengths.get(&(hash.clone(), part)).copied();
            if listed != i32::try_from(bytes.len()).ok() {
                return refused(format!("content {hash} changed as it was read"));
            }
            let file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(staging.join(&hash))
                .map_err(unwritable)?;
            let offset = u64::try_from(part).unwrap_or(0) * PART_BYTES as u64;
            file.write_all_at(bytes, offset).map_err(unwritable)?;
        }
    }
    Ok(())
}

/// Removes `owner`'s contents that no kept session names.
pub fn remove_unnamed(tx: &mut Transaction<'_>, owner: &FleetOwner) -> Result<(), FleetError> {
    tx.execute(
        "DELETE FROM agentos_session_contents c
         WHERE c.owner_user = $1 AND c.owner_delegate = $2
           AND NOT EXISTS (
            SELECT 1 FROM agentos_sessions s
            WHERE s.owner_user = $1 AND s.owner_delegate = $2 AND s.hashes @> ARRAY[c.hash])",
        &[&owner.user, &owner.delegate],
    )?;
    Ok(())
}
