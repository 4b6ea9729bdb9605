//! Agents end to end against a real agentosd: SPAWN, KILL and LIST, their
//! logs, and what a hostile agent tries and must not get. (What the sandbox
//! keeps out is in the sandbox tests.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod control;
mod events;
mod files;
mod identity;
mod inheritance;
mod interpreter;
mod lifecycle;
mod logs;
mod messages;
mod metrics;
mod pause;
mod permissions;
mod recording;
mod state;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

const SPAWN: u8 = 0x10;

/// The `reply` of the `n`th request an actor made.
fn reply(replies: &[Value], n: usize) -> &Value {
    &replies[n]["reply"]
}

/// Asserts `reply` is a failure with `code` whose message says `naming`.
fn refused(reply: &Value, code: &str, naming: &str) {
    assert_eq!(reply["success"], false, "{reply}");
    assert_eq!(reply["code"], code, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains(naming),
        "the error must say {naming:?}: {error}"
    );
}

/// Every directory under `root`.
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = fs::read_dir(&dirs[i]) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        i += 1;
    }
    dirs
}
