//! `agentos sessions`, `snapshot` and `restore`: EXEC's sessions (an
//! interpreter and its `/workspace` kept between runs) and the snapshots of
//! their files.

use agentos_proto::payload::{
    ClosedReply, ExecCall, RestoredReply, SessionState, SessionsReply, SnapshotReply,
    SnapshotsReply,
};
use agentos_proto::Client;

use crate::error::CliError;
use crate::format::human_size;
use crate::raw::{ask_exec, Raw};

/// `agentos sessions`' options.
#[derive(Debug, clap::Args)]
pub struct SessionsArgs {
    /// End this session: its interpreter, its files and its packages go
    #[arg(long, value_name = "SESSION")]
    close: Option<String>,
}

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

/// Asks the kernel for a session operation; its reply as sent. A refusal
/// for an unknown session is said in the CLI's words.
fn ask(client: &mut Client, call: &ExecCall) -> Result<Raw, CliError> {
    let session = match call {
        ExecCall::Close { session }
        | ExecCall::Snapshots { session }
        | ExecCall::Snapshot { session, .. }
        | ExecCall::Restore { session, .. } => Some(session),
        _ => None,
    };
    let named = session.map(|session| {
        |message| CliError::NoSuchSession {
            session: session.clone(),
            message,
        }
    });
    ask_exec(client, call, named)
}

pub fn sessions(client: &mut Client, args: SessionsArgs, json: bool) -> Result<(), CliError> {
    if let Some(session) = args.close {
        let raw = ask(
            client,
            &ExecCall::Close {
                session: session.clone(),
            },
        )?;
        if json {
            return raw.print();
        }
        let reply: ClosedReply = raw.decode()?;
        if !reply.closed {
            return Err(CliError::NoSuchSession {
                session,
                message: "there is no such session".into(),
            });
        }
        println!("session '{session}' closed: its interpreter and its files are gone");
        return Ok(());
    }
    let raw = ask(client, &ExecCall::Sessions)?;
    if json {
        return raw.print();
    }
    let reply: SessionsReply = raw.decode()?;
    println!(
        "{:<24} {:<8} {:<21} {:<21} {:>6} {:>10} {:>15}",
        "SESSION", "STATE", "CREATED", "LAST USED", "RUNS", "WORKSPACE", "DISK USED"
    );
    for session in &reply.sessions {
        let disk = match (session.disk_used_bytes, session.disk_bytes) {
            (Some(used), Some(size)) => format!("{}/{}", human_size(used), human_size(size)),
            (None, Some(size)) => format!("-/{}", human_size(size)),
            _ => "-".to_owned(),
        };
        println!(
            "{:<24} {:<8} {:<21} {:<21} {:>6} {:>10} {:>15}",
            session.session,
            state_word(session.state),
            session.created_at,
            session.last_used_at,
            session.runs,
            human_size(session.workspace_bytes),
            disk,
        );
    }
    if reply.sessions.is_empty() {
        eprintln!("agentos: no sessions (agentos exec --session NAME CODE starts one)");
    }
    Ok(())
}

/// A session's state as the protocol spells it.
fn state_word(state: SessionState) -> &'static str {
    match state {
        SessionState::Running => "running",
        SessionState::Ready => "ready",
        SessionState::Stored => "stored",
    }
}

pub fn snapshot(client: &mut Client, args: SnapshotArgs, json: bool) -> Result<(), CliError> {
    let session = args.session;
    if args.list {
        let raw = ask(client, &ExecCall::Snapshots { session })?;
        if json {
            return raw.print();
        }
        let reply: SnapshotsReply = raw.decode()?;
        println!("{:<32} {:>10}  CREATED", "SNAPSHOT", "SIZE");
        for snapshot in &reply.snapshots {
            println!(
                "{:<32} {:>10}  {}",
                snapshot.name,
                human_size(snapshot.bytes),
                snapshot.created_at,
            );
        }
        return Ok(());
    }
    let name = args.name.unwrap_or_else(default_snapshot_name);
    let call = ExecCall::Snapshot {
        session: session.clone(),
        name,
    };
    let raw = ask(client, &call)?;
    if json {
        return raw.print();
    }
    let reply: SnapshotReply = raw.decode()?;
    let snapshot = &reply.snapshot;
    println!(
        "snapshot '{}' of session '{session}': {} (restore it with: agentos restore {session} {})",
        snapshot.name,
        human_size(snapshot.bytes),
        snapshot.name,
    );
    left_out(&reply.left_out);
    Ok(())
}

pub fn restore(client: &mut Client, args: RestoreArgs, json: bool) -> Result<(), CliError> {
    let session = args.session.as_str();
    let call = ExecCall::Restore {
        session: session.to_owned(),
        name: args.name.clone(),
    };
    let raw = ask(client, &call)?;
    if json {
        return raw.print();
    }
    let reply: RestoredReply = raw.decode()?;
    println!(
        "session '{session}' restored from '{}': its /workspace is the snapshot's, its \
         interpreter new",
        args.name
    );
    left_out(&reply.left_out);
    Ok(())
}

/// Says which files a snapshot or restore did not carry.
fn left_out(skipped: &[String]) {
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
