//! `agentos sessions`, `snapshot` and `restore`: EXEC's sessions (an
//! interpreter and its `/workspace` kept between runs), the snapshots of
//! their files (and, with `--state`, their globals) and branches made from
//! them; and `agentos pause --session`, `resume --session`, which freeze,
//! hibernate and wake a session's interpreter.

use std::collections::BTreeMap;

use agentos_proto::payload::{
    ClosedReply, ExecCall, ExecRequest, Lifetime, LifetimeEnd, LifetimeReply, PauseRequest,
    RemovedReply, RestoredReply, SessionOpen, SessionOpenedReply, SessionPauseReply, SessionSetup,
    SessionState, SessionsReply, SnapshotReply, SnapshotsReply,
};
use agentos_proto::{Client, Opcode};
use clap::builder::TypedValueParser;

use crate::error::CliError;
use crate::format::human_size;
use crate::raw::{ask_exec, Raw};

/// `agentos sessions`' options.
#[derive(Debug, clap::Args)]
pub struct SessionsArgs {
    /// End this session: its interpreter, its files, its packages and its
    /// snapshots go
    #[arg(long, value_name = "SESSION", conflicts_with_all = ["open", "set_lifetime"])]
    close: Option<String>,
    /// Open this session without running code (EXEC `open`)
    #[arg(long, value_name = "SESSION", conflicts_with = "set_lifetime")]
    open: Option<String>,
    /// Give this session a new lifetime (--lifetime SECS), or none
    /// (--lifetime 0)
    #[arg(long, value_name = "SESSION", requires = "lifetime")]
    set_lifetime: Option<String>,
    /// With --open: the template it starts from
    #[arg(long, value_name = "TEMPLATE", requires = "open")]
    template: Option<String>,
    /// With --open: a label it is listed with, KEY=VALUE (repeat for more)
    #[arg(long = "label", value_name = "KEY=VALUE", requires = "open")]
    labels: Vec<String>,
    /// With --open or --set-lifetime: the kernel ends it after SECS (0:
    /// never)
    #[arg(long, value_name = "SECS")]
    lifetime: Option<u64>,
    /// What the end of its lifetime does: close (files and all) or
    /// hibernate
    #[arg(long, value_name = "END", requires = "lifetime", value_parser = lifetime_end())]
    then: Option<LifetimeEnd>,
}

/// `agentos snapshot`'s options: take one, or (`ls`, `rm`) list and
/// remove them. A session named `ls` or `rm` is snapshotted after `--`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: Option<SnapshotCommand>,
    /// The session
    #[arg(required = true)]
    session: Option<String>,
    /// The snapshot's name (one it has is replaced) [default: snap- and
    /// the seconds since 1970]
    name: Option<String>,
    /// Save the interpreter's globals too: those that pickle (modules by
    /// name); the rest are named on stderr
    #[arg(long)]
    state: bool,
    /// List the session's snapshots instead of taking one (as `ls`)
    #[arg(short, long, conflicts_with_all = ["name", "state"])]
    list: bool,
}

/// `agentos snapshot ls` and `rm`.
#[derive(Debug, clap::Subcommand)]
enum SnapshotCommand {
    /// List SESSION's snapshots, oldest first, and whether each keeps its
    /// globals
    Ls { session: String },
    /// Remove SESSION's snapshot NAME (closing the session removes them all)
    Rm { session: String, name: String },
}

/// `agentos restore`'s options.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The session the snapshot was taken of
    session: String,
    /// The snapshot to put back (agentos snapshot ls SESSION lists them)
    name: String,
    /// Make a new session NEW from the snapshot instead (a branch); SESSION
    /// stays as it is
    #[arg(long, value_name = "NEW")]
    into: Option<String>,
}

/// Asks the kernel for a session operation; its reply as sent. A refusal
/// for an unknown session, or snapshot, is said in the CLI's words.
fn ask(client: &mut Client, call: &ExecCall) -> Result<Raw, CliError> {
    match call {
        ExecCall::Restore { session, .. } | ExecCall::RemoveSnapshot { session, .. } => {
            let session = session.clone();
            let named = move |message| CliError::NoSuchSnapshot { session, message };
            ask_exec(client, call, Some(named))
        }
        ExecCall::Close { session }
        | ExecCall::Snapshots { session }
        | ExecCall::Snapshot { session, .. } => {
            ask_exec(client, call, Some(no_such_session(session.clone())))
        }
        _ => ask_exec(client, call, None::<fn(String) -> CliError>),
    }
}

/// How a `not_found` about `session` is said, given the kernel's words.
fn no_such_session(session: String) -> impl FnOnce(String) -> CliError {
    move |message| CliError::NoSuchSession { session, message }
}

pub fn sessions(client: &mut Client, args: SessionsArgs, json: bool) -> Result<(), CliError> {
    if args.lifetime.is_some() && args.open.is_none() && args.set_lifetime.is_none() {
        return Err(CliError::Usage(
            "--lifetime goes with --open SESSION or --set-lifetime SESSION".into(),
        ));
    }
    let lifetime = match (args.lifetime, args.then) {
        (Some(0), Some(_)) => {
            return Err(CliError::Usage(
                "--then says what ends a lifetime; --lifetime 0 gives none".into(),
            ))
        }
        (None | Some(0), _) => None,
        (Some(secs), then) => Some(Lifetime {
            ms: secs.saturating_mul(1000),
            then: then.unwrap_or_default(),
        }),
    };
    if let Some(session) = args.open {
        return open(client, session, args.template, args.labels, lifetime, json);
    }
    if let Some(session) = args.set_lifetime {
        let raw = ask(client, &ExecCall::Lifetime { session, lifetime })?;
        if json {
            return raw.print();
        }
        let reply: LifetimeReply = raw.decode()?;
        match reply.ends_at {
            Some(at) => println!("session '{}' ends at {at}", reply.session),
            None => println!("session '{}' has no lifetime", reply.session),
        }
        return Ok(());
    }
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
        println!(
            "session '{session}' closed: its interpreter, its files and its snapshots are gone"
        );
        return Ok(());
    }
    let raw = ask(client, &ExecCall::Sessions { usage: false })?;
    if json {
        return raw.print();
    }
    let reply: SessionsReply = raw.decode()?;
    println!(
        "{:<24} {:<10} {:<21} {:<21} {:>6} {:>10} {:>15}",
        "SESSION", "STATE", "CREATED", "LAST USED", "RUNS", "WORKSPACE", "DISK USED"
    );
    for session in &reply.sessions {
        let disk = match (session.disk_used_bytes, session.disk_bytes) {
            (Some(used), Some(size)) => format!("{}/{}", human_size(used), human_size(size)),
            (None, Some(size)) => format!("-/{}", human_size(size)),
            _ => "-".to_owned(),
        };
        println!(
            "{:<24} {:<10} {:<21} {:<21} {:>6} {:>10} {:>15}",
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

/// `--then`'s words.
fn lifetime_end() -> impl clap::builder::TypedValueParser<Value = LifetimeEnd> {
    clap::builder::PossibleValuesParser::new(["close", "hibernate"]).map(|end| match &*end {
        "hibernate" => LifetimeEnd::Hibernate,
        _ => LifetimeEnd::Close,
    })
}

/// `agentos sessions --open`.
fn open(
    client: &mut Client,
    session: String,
    template: Option<String>,
    labels: Vec<String>,
    lifetime: Option<Lifetime>,
    json: bool,
) -> Result<(), CliError> {
    let labels = labels
        .iter()
        .map(|label| match label.split_once('=') {
            Some((key, value)) => Ok((key.to_owned(), value.to_owned())),
            None => Err(CliError::Usage(format!(
                "--label {label:?}: give KEY=VALUE"
            ))),
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    let run = ExecRequest {
        session: Some(session),
        template,
        ..ExecRequest::default()
    };
    let setup = SessionSetup {
        // Without any, a stored session keeps its own.
        labels: (!labels.is_empty()).then_some(labels),
        lifetime,
        ..SessionSetup::default()
    };
    let raw = ask(
        client,
        &ExecCall::Open(Box::new(SessionOpen { run, setup })),
    )?;
    if json {
        return raw.print();
    }
    let reply: SessionOpenedReply = raw.decode()?;
    match reply.ends_at {
        Some(at) => println!("session '{}' opened; it ends at {at}", reply.session),
        None => println!("session '{}' opened", reply.session),
    }
    Ok(())
}

/// A session's state as the protocol spells it.
fn state_word(state: SessionState) -> &'static str {
    match state {
        SessionState::Running => "running",
        SessionState::Ready => "ready",
        SessionState::Paused => "paused",
        SessionState::Hibernated => "hibernated",
        SessionState::Stored => "stored",
    }
}

pub fn snapshot(client: &mut Client, args: SnapshotArgs, json: bool) -> Result<(), CliError> {
    let (session, name) = match (args.command, args.session) {
        (Some(SnapshotCommand::Ls { session }), _) => return list(client, session, json),
        (Some(SnapshotCommand::Rm { session, name }), _) => {
            return remove(client, session, name, json)
        }
        (None, Some(session)) if args.list => return list(client, session, json),
        (None, Some(session)) => (session, args.name),
        (None, None) => unreachable!("clap requires a session without a subcommand"),
    };
    let call = ExecCall::Snapshot {
        session: session.clone(),
        name: name.unwrap_or_else(default_snapshot_name),
        state: args.state,
    };
    let raw = ask(client, &call)?;
    if json {
        return raw.print();
    }
    let reply: SnapshotReply = raw.decode()?;
    let snapshot = &reply.snapshot;
    let globals = if snapshot.state {
        ", with its globals"
    } else {
        ""
    };
    println!(
        "snapshot '{}' of session '{session}': {}{globals} (restore it with: agentos restore \
         {session} {})",
        snapshot.name,
        human_size(snapshot.bytes),
        snapshot.name,
    );
    warn("left out (not plain files)", &reply.left_out);
    warn("globals not saved", &reply.not_saved);
    Ok(())
}

/// `agentos snapshot ls SESSION`: its snapshots, oldest first.
fn list(client: &mut Client, session: String, json: bool) -> Result<(), CliError> {
    let raw = ask(client, &ExecCall::Snapshots { session })?;
    if json {
        return raw.print();
    }
    let reply: SnapshotsReply = raw.decode()?;
    println!(
        "{:<32} {:>10}  {:<7}  CREATED",
        "SNAPSHOT", "SIZE", "GLOBALS"
    );
    for snapshot in &reply.snapshots {
        println!(
            "{:<32} {:>10}  {:<7}  {}",
            snapshot.name,
            human_size(snapshot.bytes),
            if snapshot.state { "kept" } else { "-" },
            snapshot.created_at,
        );
    }
    if reply.snapshots.is_empty() {
        eprintln!("agentos: no snapshots (agentos snapshot SESSION [NAME] takes one)");
    }
    Ok(())
}

/// `agentos snapshot rm SESSION NAME`.
fn remove(client: &mut Client, session: String, name: String, json: bool) -> Result<(), CliError> {
    let call = ExecCall::RemoveSnapshot {
        session: session.clone(),
        name: name.clone(),
    };
    let raw = ask(client, &call)?;
    if json {
        return raw.print();
    }
    let _: RemovedReply = raw.decode()?;
    println!("snapshot '{name}' of session '{session}' removed");
    Ok(())
}

pub fn restore(client: &mut Client, args: RestoreArgs, json: bool) -> Result<(), CliError> {
    let RestoreArgs {
        session,
        name,
        into,
    } = args;
    let branch = into.is_some();
    let call = ExecCall::Restore {
        session: session.clone(),
        name: name.clone(),
        into,
    };
    let raw = ask(client, &call)?;
    if json {
        return raw.print();
    }
    let reply: RestoredReply = raw.decode()?;
    let made = &reply.session;
    if branch {
        println!(
            "session '{made}' made from snapshot '{name}' of session '{session}': its files are \
             the snapshot's, and its first run starts with the snapshot's globals if it kept them"
        );
    } else {
        println!(
            "session '{made}' restored from '{name}': its files are the snapshot's, its \
             interpreter new (with the snapshot's globals if it kept them)"
        );
    }
    warn("globals not restored", &reply.left_out);
    Ok(())
}

/// `agentos pause --session` (PAUSE; `hibernate`: its globals saved and
/// its interpreter ended) and `resume --session` (RESUME).
pub fn freeze(
    client: &mut Client,
    session: String,
    pause: bool,
    hibernate: bool,
    json: bool,
) -> Result<(), CliError> {
    let request = PauseRequest {
        session: Some(session.clone()),
        hibernate,
        ..PauseRequest::default()
    };
    let opcode = if pause { Opcode::PAUSE } else { Opcode::RESUME };
    let named = Some(no_such_session(session.clone()));
    let raw = crate::raw::ask(client, opcode, &request, named)?;
    if json {
        return raw.print();
    }
    let reply: SessionPauseReply = raw.decode()?;
    let said = match reply.state {
        SessionState::Paused => format!(
            ": frozen, using no CPU, its run's time limit stopped (agentos resume --session \
             {session} lets it go on)"
        ),
        SessionState::Hibernated => format!(
            ": its globals saved and its interpreter ended (its next run, or agentos resume \
             --session {session}, brings it back)"
        ),
        SessionState::Ready => ": its interpreter waits for its next run".to_owned(),
        SessionState::Running | SessionState::Stored => String::new(),
    };
    println!(
        "session '{}' {}{said}",
        reply.session,
        state_word(reply.state)
    );
    warn("globals not saved (gone when it wakes)", &reply.not_saved);
    Ok(())
}

/// Says, on stderr, what an operation did not carry: files left out,
/// globals not saved or not restored.
fn warn(what: &str, names: &[String]) {
    if !names.is_empty() {
        eprintln!("agentos: {what}: {}", names.join(", "));
    }
}

/// `snap-` and the seconds since 1970: names that sort as they were taken.
fn default_snapshot_name() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("snap-{secs}")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        snapshot: SnapshotArgs,
    }

    fn parsed(args: &[&str]) -> Result<SnapshotArgs, clap::Error> {
        Line::try_parse_from(std::iter::once("snapshot").chain(args.iter().copied()))
            .map(|line| line.snapshot)
    }

    #[test]
    fn a_snapshot_is_taken_of_a_session_with_its_globals_if_asked() {
        let args = parsed(&["s1", "n1", "--state"]).expect("parsed");
        assert_eq!(args.session.as_deref(), Some("s1"));
        assert_eq!(args.name.as_deref(), Some("n1"));
        assert!(args.state && !args.list && args.command.is_none());
        let args = parsed(&["s1"]).expect("parsed");
        assert!(args.name.is_none() && !args.state);
        assert!(parsed(&[]).is_err(), "a session is needed");
    }

    #[test]
    fn ls_and_rm_are_subcommands_and_a_session_so_named_follows_dashes() {
        let args = parsed(&["rm", "s1", "n1"]).expect("parsed");
        assert!(matches!(
            args.command,
            Some(SnapshotCommand::Rm { ref session, ref name }) if session == "s1" && name == "n1"
        ));
        let args = parsed(&["ls", "s1"]).expect("parsed");
        assert!(matches!(
            args.command,
            Some(SnapshotCommand::Ls { ref session }) if session == "s1"
        ));
        assert!(
            parsed(&["rm", "s1"]).is_err(),
            "rm needs the snapshot's name"
        );
        let args = parsed(&["--", "rm", "n1"]).expect("parsed");
        assert!(args.command.is_none());
        assert_eq!(args.session.as_deref(), Some("rm"));
    }

    #[test]
    fn listing_takes_no_name_and_no_state() {
        assert!(parsed(&["s1", "--list"]).expect("parsed").list);
        assert!(parsed(&["s1", "n1", "--list"]).is_err());
        assert!(parsed(&["s1", "--list", "--state"]).is_err());
    }

    #[test]
    fn restore_branches_into_a_new_session_with_into() {
        #[derive(Parser)]
        struct Restore {
            #[command(flatten)]
            restore: RestoreArgs,
        }
        let args = Restore::try_parse_from(["restore", "s1", "n1", "--into", "b1"])
            .expect("parsed")
            .restore;
        assert_eq!(
            (
                args.session.as_str(),
                args.name.as_str(),
                args.into.as_deref()
            ),
            ("s1", "n1", Some("b1"))
        );
        assert!(Restore::try_parse_from(["restore", "s1"]).is_err());
    }
}
