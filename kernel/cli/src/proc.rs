//! `agentos proc`: programs run inside one of your sessions, beside its
//! interpreter (`run`), listed (`ps`), followed (`attach`) and signalled
//! (`kill`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;

use agentos_proto::payload::{
    ExecCall, OutputStream, ProcCall, ProcInput, ProcInputReply, ProcOutput, ProcOutputReply,
    ProcSignal, ProcSignalledReply, ProcStart, ProcStartedReply, ProcState, ProcessesReply,
    PtySize, Signal, MAX_PROC_CHUNK_BYTES,
};
use agentos_proto::Client;
use base64::Engine;

use crate::error::CliError;
use crate::raw::{ask_exec, Raw};

/// How long each follow request waits for output: well inside the
/// client's own timeout.
const FOLLOW_WAIT_MS: u64 = 10_000;

/// `agentos proc`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ProcCommand {
    /// Start a program in SESSION and print what it prints until it ends
    /// (exiting with its exit code, 128 + the signal if one ended it);
    /// with --bg, print its pid and leave it running
    Run(RunArgs),
    /// SESSION's processes: running ones, then those ended lately
    Ps {
        /// The session
        session: String,
    },
    /// Print what a process of SESSION has printed, and follow it until it
    /// ends (exiting as `run` does)
    Attach {
        /// The session
        session: String,
        /// The process's pid in the session
        pid: u32,
    },
    /// Send a signal to a process's group
    Kill {
        /// The session
        session: String,
        /// The process's pid in the session
        pid: u32,
        /// The signal: TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT
        #[arg(short, long, default_value = "TERM")]
        signal: String,
    },
}

/// `agentos proc run`'s options.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The session
    session: String,
    /// The program and its arguments (after `--`)
    #[arg(required = true, last = true)]
    command: Vec<String>,
    /// Leave it running: print its pid and return
    #[arg(long)]
    bg: bool,
    /// Give it this command's standard input
    #[arg(short, long, conflicts_with = "bg")]
    interactive: bool,
    /// Run it on a PTY (80x24, or $COLUMNS x $LINES): its output is one
    /// stream, as a terminal shows it
    #[arg(short, long)]
    tty: bool,
    /// The kernel kills it after SECS
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Where it starts (default: the session's home)
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// A variable of its environment, NAME=VALUE (repeat for more)
    #[arg(short, long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// A name to find it by
    #[arg(long)]
    tag: Option<String>,
}

pub fn proc(client: &mut Client, command: ProcCommand, json: bool) -> Result<ExitCode, CliError> {
    match command {
        ProcCommand::Run(args) => run(client, args, json),
        ProcCommand::Ps { session } => ps(client, session, json).map(|()| ExitCode::SUCCESS),
        ProcCommand::Attach { session, pid } => follow(client, &session, pid, json),
        ProcCommand::Kill {
            session,
            pid,
            signal,
        } => kill(client, session, pid, &signal, json).map(|()| ExitCode::SUCCESS),
    }
}

fn ask(client: &mut Client, call: ProcCall) -> Result<Raw, CliError> {
    ask_exec(
        client,
        &ExecCall::Proc(call),
        None::<fn(String) -> CliError>,
    )
}

fn run(client: &mut Client, args: RunArgs, json: bool) -> Result<ExitCode, CliError> {
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("--env {pair:?}: give NAME=VALUE")))?;
        env.insert(name.to_owned(), value.to_owned());
    }
    let start = ProcStart {
        session: args.session.clone(),
        argv: args.command,
        env,
        cwd: args.cwd,
        stdin: args.interactive && !args.tty,
        pty: args.tty.then(terminal_size),
        tag: args.tag,
        timeout_ms: args.timeout.map(|secs| secs.saturating_mul(1000)),
    };
    let raw = ask(client, ProcCall::Start(Box::new(start)))?;
    let started: ProcStartedReply = raw.decode()?;
    if args.bg {
        if json {
            raw.print()?;
        } else {
            println!("{}", started.pid);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.interactive {
        send_stdin(client, &args.session, started.pid, args.tty)?;
    }
    follow(client, &args.session, started.pid, json)
}

/// The size a PTY is given: the caller's terminal's, as the shell says
/// it (`COLUMNS`, `LINES`), else 80x24.
fn terminal_size() -> PtySize {
    let cells = |name: &str, default: u16| {
        let asked = std::env::var(name).ok().and_then(|v| v.parse::<u16>().ok());
        asked
            .filter(|&n| (1..=1000).contains(&n))
            .unwrap_or(default)
    };
    PtySize {
        cols: cells("COLUMNS", 80),
        rows: cells("LINES", 24),
    }
}

/// This command's standard input, to the process's, in parts; closed
/// after (a PTY's is not closed: its EOF character ends its input).
fn send_stdin(client: &mut Client, session: &str, pid: u32, pty: bool) -> Result<(), CliError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut stdin = std::io::stdin().lock();
    let mut buffer = vec![0u8; MAX_PROC_CHUNK_BYTES];
    loop {
        let read = stdin.read(&mut buffer)?;
        let input = ProcInput {
            session: session.to_owned(),
            pid: Some(pid),
            data: match (read, pty) {
                // Ctrl-D, as a terminal's EOF.
                (0, true) => engine.encode(b"\x04"),
                _ => engine.encode(&buffer[..read]),
            },
            eof: read == 0 && !pty,
            ..ProcInput::default()
        };
        let _: ProcInputReply = ask(client, ProcCall::Input(input))?.decode()?;
        if read == 0 {
            return Ok(());
        }
    }
}

/// Prints what process `pid` prints until it ends; its exit status.
fn follow(client: &mut Client, session: &str, pid: u32, json: bool) -> Result<ExitCode, CliError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut after = None;
    loop {
        let request = ProcOutput {
            session: session.to_owned(),
            pid: Some(pid),
            after,
            follow: true,
            wait_ms: Some(FOLLOW_WAIT_MS),
            ..ProcOutput::default()
        };
        let raw = ask(client, ProcCall::Output(request))?;
        let reply: ProcOutputReply = raw.decode()?;
        if json {
            // One reply per line, so that a follower reads them as they come.
            println!("{}", serde_json::to_string(&reply)?);
        }
        for chunk in &reply.chunks {
            let bytes = engine
                .decode(&chunk.data)
                .map_err(|err| CliError::Usage(format!("a chunk is not base64: {err}")))?;
            match (json, chunk.stream) {
                (true, _) => {}
                (false, OutputStream::Stderr) => std::io::stderr().write_all(&bytes)?,
                (false, OutputStream::Stdout | OutputStream::Pty) => {
                    std::io::stdout().write_all(&bytes)?
                }
            }
        }
        std::io::stdout().flush()?;
        if reply.dropped > 0 && !json {
            eprintln!(
                "agentos: {} bytes of its output were dropped",
                reply.dropped
            );
        }
        if reply.ended {
            let status = match (reply.end.exit_code, reply.end.signal) {
                (Some(code), _) => code,
                (None, Some(signal)) => 128 + signal,
                (None, None) => 1,
            };
            return Ok(ExitCode::from(u8::try_from(status & 0xff).unwrap_or(1)));
        }
        after = Some(reply.offset);
    }
}

fn ps(client: &mut Client, session: String, json: bool) -> Result<(), CliError> {
    let raw = ask(client, ProcCall::Processes { session })?;
    if json {
        return raw.print();
    }
    let reply: ProcessesReply = raw.decode()?;
    println!(
        "{:>7} {:<8} {:<10} {:>10} {:<21} COMMAND",
        "PID", "STATE", "TAG", "OUTPUT", "STARTED"
    );
    for process in &reply.processes {
        let state = match (process.state, process.end.exit_code, process.end.signal) {
            (ProcState::Running, _, _) => "running".to_owned(),
            (ProcState::Ended, Some(code), _) => format!("exit {code}"),
            (ProcState::Ended, None, Some(signal)) => format!("signal {signal}"),
            (ProcState::Ended, None, None) => "ended".to_owned(),
        };
        println!(
            "{:>7} {:<8} {:<10} {:>10} {:<21} {}",
            process.pid,
            state,
            process.tag.as_deref().unwrap_or("-"),
            process.offset,
            process.started_at,
            process.argv.join(" ")
        );
    }
    Ok(())
}

fn kill(
    client: &mut Client,
    session: String,
    pid: u32,
    signal: &str,
    json: bool,
) -> Result<(), CliError> {
    let name = signal.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    let signal: Signal = serde_json::from_value(serde_json::Value::String(name.clone()))
        .map_err(|_| CliError::Usage(format!("--signal {signal:?} is not one of TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT")))?;
    let call = ProcCall::Signal(ProcSignal {
        session,
        pid: Some(pid),
        signal,
        ..ProcSignal::default()
    });
    let raw = ask(client, call)?;
    if json {
        return raw.print();
    }
    let reply: ProcSignalledReply = raw.decode()?;
    match reply.signalled {
        true => println!("{name} sent to process {pid}"),
        false => println!("process {pid} had ended"),
    }
    Ok(())
}
