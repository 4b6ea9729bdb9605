//! `agentos sessions`, `snapshot` and `restore`: EXEC's sessions (an
//! interpreter and its `/workspace` kept between runs) and the snapshots of
//! their files.

use agentos_proto::{Client, Opcode};
use serde_json::{json, Value};

use crate::failure::remote;
use crate::format::{human_size, print_json};
use agentos_proto::ErrorCode;

/// `agentos snapshot`'s options.
#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The session
    session: String,
    /// The snapshot's name [default: snap- and the seconds since 1970]
    name: Option<String>,
    /// List the session's snapshots instead of taking one
    #[arg(short, long, conflicts_with = "name")]
    list: bool,
}

/// `agentos restore`'s options.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The session
    session: String,
    /// The snapshot to put back (agentos snapshot SESSION --list lists them)
    name: String,
}

/// One EXEC op; a refusal for an unknown session in the CLI's words.
fn exec_op(client: &mut Client, body: &Value, session: Option<&str>) -> anyhow::Result<Value> {
    client
        .call_json(Opcode::EXEC, &serde_json::to_vec(body)?)
        .map_err(|err| {
            let err = anyhow::Error::from(err);
            match (remote(&err).map(|r| r.code), session) {
                (Some(ErrorCode::NotFound), Some(session)) => anyhow::anyhow!(
                    "{} (agentos sessions lists yours)",
                    remote(&err).map_or("", |r| r.error.as_str())
                )
                .context(format!("session '{session}'")),
                _ => err,
            }
        })
}

pub fn sessions(client: &mut Client, json: bool) -> anyhow::Result<()> {
    let reply = exec_op(client, &json!({"op": "sessions"}), None)?;
    if json {
        return print_json(&reply);
    }
    let sessions = reply["sessions"].as_array().cloned().unwrap_or_default();
    println!(
        "{:<24} {:<21} {:<21} {:>6} {:>10}",
        "SESSION", "CREATED", "LAST USED", "RUNS", "WORKSPACE"
    );
    for session in &sessions {
        println!(
            "{:<24} {:<21} {:<21} {:>6} {:>10}",
            session["session"].as_str().unwrap_or("?"),
            session["created_at"].as_str().unwrap_or("?"),
            session["last_used_at"].as_str().unwrap_or("?"),
            session["runs"].as_u64().unwrap_or(0),
            human_size(session["workspace_bytes"].as_u64().unwrap_or(0)),
        );
    }
    if sessions.is_empty() {
        eprintln!("agentos: no sessions (agentos exec --session NAME CODE starts one)");
    }
    Ok(())
}

pub fn snapshot(client: &mut Client, args: SnapshotArgs, json: bool) -> anyhow::Result<()> {
    let session = args.session.as_str();
    if args.list {
        let body = json!({"op": "snapshots", "session": session});
        let reply = exec_op(client, &body, Some(session))?;
        if json {
            return print_json(&reply);
        }
        println!("{:<32} {:>10}  CREATED", "SNAPSHOT", "SIZE");
        for snapshot in reply["snapshots"].as_array().into_iter().flatten() {
            println!(
                "{:<32} {:>10}  {}",
                snapshot["name"].as_str().unwrap_or("?"),
                human_size(snapshot["bytes"].as_u64().unwrap_or(0)),
                snapshot["created_at"].as_str().unwrap_or("?"),
            );
        }
        return Ok(());
    }
    let name = args.name.unwrap_or_else(default_snapshot_name);
    let body = json!({"op": "snapshot", "session": session, "name": name});
    let reply = exec_op(client, &body, Some(session))?;
    if json {
        return print_json(&reply);
    }
    let snapshot = &reply["snapshot"];
    println!(
        "snapshot '{}' of session '{session}': {} (restore it with: agentos restore {session} {})",
        snapshot["name"].as_str().unwrap_or(&name),
        human_size(snapshot["bytes"].as_u64().unwrap_or(0)),
        snapshot["name"].as_str().unwrap_or(&name),
    );
    left_out(&reply);
    Ok(())
}

pub fn restore(client: &mut Client, args: RestoreArgs, json: bool) -> anyhow::Result<()> {
    let session = args.session.as_str();
    let body = json!({"op": "restore", "session": session, "name": args.name});
    let reply = exec_op(client, &body, Some(session))?;
    if json {
        return print_json(&reply);
    }
    println!(
        "session '{session}' restored from '{}': its /workspace is the snapshot's, its \
         interpreter new",
        args.name
    );
    left_out(&reply);
    Ok(())
}

/// Says which files a snapshot or restore did not carry.
fn left_out(reply: &Value) {
    let skipped: Vec<&str> = reply["left_out"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !skipped.is_empty() {
        eprintln!(
            "agentos: left out (not plain files): {}",
            skipped.join(", ")
        );
    }
}

/// `snap-` and the seconds since 1970: names that sort as they were taken.
fn default_snapshot_name() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("snap-{secs}")
}
