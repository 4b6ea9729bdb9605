//! Task ids and boot numbers: random, so neither says anything about
//! other tasks or kernels.

use std::sync::atomic::{AtomicU64, Ordering};

/// `t-` and 64 random bits: ids say nothing about other tasks.
pub fn new_id() -> String {
    format!("t-{:016x}", random_u64())
}

/// What a fleet's task ids begin with: any node tells them from its own.
pub const FLEET_ID_PREFIX: &str = "t-fleet-";

/// A fleet's task id: [`FLEET_ID_PREFIX`] and 64 random bits.
pub fn new_fleet_id() -> String {
    format!("{FLEET_ID_PREFIX}{:016x}", random_u64())
}

/// 64 random bits. Should the pool fail, the clock and a counter keep ids
/// unique, if guessable, and the log says so.
pub fn random_u64() -> u64 {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 8];
    match crate::random::fill(&mut bytes) {
        Ok(()) => return u64::from_ne_bytes(bytes),
        Err(err) => log::error!("no random bytes ({err}): task ids fall back to the clock"),
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ FALLBACK.fetch_add(1, Ordering::Relaxed).rotate_left(32)
}
