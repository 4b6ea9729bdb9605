//! `agentos`: the AgentOS command-line client.
//!
//! Every command takes `--json` (the protocol's reply, or a stable JSON
//! shape where the command makes several requests) and `--timeout SECS`
//! (how long the command waits for the kernel, and for what it waits on:
//! an agent to stop, a task to end). Exit codes: 0 ok, 1 the operation
//! failed, 2 the command line was wrong.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agentos_proto::payload::{DelegateName, DelegateReply, DelegateRequest};
use agentos_proto::socket_path::resolve_socket_path;
use agentos_proto::{Client, ClientError, Opcode};
use clap::{CommandFactory, Parser, Subcommand};

mod agents;
mod audit;
mod call;
mod e2b;
mod error;
mod events;
mod exec;
mod failure;
mod format;
mod fs;
mod input;
mod kernel;
mod kv;
mod logs;
mod mcp;
mod mcp_servers;
mod messages;
mod net;
mod nodes;
mod policy;
mod proc;
mod raw;
mod run;
mod sessions;
mod spawn;
mod task;
mod templates;
mod think;
mod tools;
mod top;
mod volumes;

use call::{call_tool, CallArgs};
use error::CliError;
use failure::usage;
use input::seconds;
use run::{run_prompt, RunArgs};
use task::{task, TaskCommand};
use tools::tools;

/// Talk to the AgentOS kernel.
#[derive(Debug, Parser)]
#[command(name = "agentos", version)]
struct Args {
    /// Kernel socket [default: $AGENTOS_SOCKET, /run/agentos/agentos.sock as root,
    /// else $XDG_RUNTIME_DIR/agentos/agentos.sock or /tmp/agentos-$UID/agentos.sock]
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// How long this command waits, in seconds: for the kernel's reply, and
    /// for what it waits on (an agent to stop or restart, a task to end)
    /// [default: 30; think 180; task wait and run 600; exec and call
    /// their own limit plus 30]
    #[arg(long, global = true, value_name = "SECS")]
    timeout: Option<f64>,
    /// Print machine-readable JSON: the kernel's reply, or for commands
    /// that make several requests a stable JSON shape
    #[arg(long, global = true)]
    json: bool,
    /// Act as the delegate principal NAME of your operator uid (DELEGATE):
    /// what the command creates is that delegate's, and it sees only that
    /// delegate's sessions and tasks
    #[arg(long, global = true, value_name = "NAME")]
    delegate: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the kernel's version, your identity and what the kernel provides
    Hello,
    /// Measure NOOP round trips
    Ping {
        /// Number of round trips
        #[arg(short = 'n', long, default_value_t = 1000)]
        count: usize,
        /// Payload bytes per NOOP
        #[arg(short, long, default_value_t = 0)]
        size: usize,
    },
    /// List live agents (-a: ended ones too)
    Ps(agents::PsArgs),
    /// Show agents' command, limits, permissions, network, isolation and
    /// restarts
    Inspect {
        /// Agent names, or ids
        #[arg(required = true)]
        agents: Vec<String>,
    },
    /// Start an agent: `agentos spawn [OPTIONS] NAME SCRIPT.py [ARGS...]`, or
    /// `agentos spawn [OPTIONS] NAME -- PROGRAM [ARGS...]`
    ///
    /// Options go before the script or program: everything after it is
    /// passed to it as its arguments.
    Spawn(spawn::SpawnArgs),
    /// Stop agents (SIGTERM to each one's tree, SIGKILL after the grace)
    /// and return once they have ended
    Stop(agents::StopArgs),
    /// Signal agents to stop (SIGTERM, SIGKILL after the grace); returns at
    /// once unless --wait
    Kill {
        #[command(flatten)]
        stop: agents::StopArgs,
        /// Return only once the agents have ended (within --timeout)
        #[arg(long)]
        wait: bool,
    },
    /// Stop agents and start them again (same spec, same id); returns once
    /// each runs again
    Restart(agents::StopArgs),
    /// Freeze agents where they stand (the cgroup freezer: no CPU, no
    /// signal handled) until `resume`; or a session's interpreter
    /// (--session), or hibernate it (--hibernate: globals saved, memory
    /// freed)
    Pause(agents::PauseArgs),
    /// Let paused agents go on; or wake a paused or hibernated session
    /// (--session)
    Resume(agents::FreezeArgs),
    /// Remove ended agents from the list (-f stops a live one first)
    Rm(agents::RmArgs),
    /// Print an agent's log: its last lines, and with -f what it writes
    /// next, until it ends
    Logs(logs::LogsArgs),
    /// Print events as they come: what happens to the agents you may see,
    /// your tasks' ends, CUSTOM events (until interrupted, or -n N)
    Events(events::EventsArgs),
    /// An agent's network policy and connection record; with --allow
    /// (or --cut), a new policy while it runs
    Net(net::NetArgs),
    /// The state store: keys with JSON values kept across restarts, your
    /// own or shared with your tree
    #[command(subcommand)]
    Kv(kv::KvCommand),
    /// Put a message in an agent's mailbox (SEND): `agentos send NAME
    /// '{"task": 1}'`; the message is JSON, or else a string
    Send(messages::SendArgs),
    /// The audit log entries you may read, oldest first: agents spawned,
    /// killed and ended, refusals, permission and network changes
    Audit(audit::AuditArgs),
    /// The kernel's metrics in the Prometheus text format, as
    /// `[metrics] listen` serves them (operators)
    Metrics,
    /// The fleet's nodes, this one marked `*`: each one's state, lease
    /// age, agents, runs, load, version and address; `drain NAME` stops a
    /// node taking new work, `undrain NAME` lets it (operators; needs
    /// `[fleet]`)
    Nodes {
        #[command(subcommand)]
        command: Option<nodes::NodesCommand>,
    },
    /// A live view of agents, tasks and tool servers, refreshed each
    /// second; its third line lists the keys, q quits
    Top(top::TopArgs),
    /// Ask the kernel's LLM: prints the answer, and its figures on stderr
    Think(think::ThinkArgs),
    /// Run code in a fresh, isolated sandbox: prints its output and exits
    /// with its exit code (128 + the signal if one ended it)
    Exec(exec::ExecArgs),
    /// Your EXEC sessions (interpreters and /workspace kept between runs,
    /// and with disks their packages); --close NAME ends one, files and all
    Sessions(sessions::SessionsArgs),
    /// Programs run inside one of your sessions, beside its interpreter:
    /// run (`-- CMD...`), ps, attach and kill
    #[command(subcommand)]
    Proc(proc::ProcCommand),
    /// A session's files, as its code sees them: ls, stat, cat, get, put,
    /// mkdir, mv and rm
    #[command(subcommand)]
    Fs(fs::FsCommand),
    /// Save a session's files (/workspace and its packages) as a named
    /// snapshot, with --state its globals too; `ls SESSION` lists them,
    /// `rm SESSION NAME` removes one
    Snapshot(sessions::SnapshotArgs),
    /// Put a session's files back as a snapshot had them, with a new
    /// interpreter (and the snapshot's globals); --into NEW makes a new
    /// session from it instead
    Restore(sessions::RestoreArgs),
    /// Templates: read-only Python environments built once (build, ls, rm)
    /// that runs and sessions start from (agentos exec --template NAME)
    #[command(subcommand)]
    Template(templates::TemplateCommand),
    /// Volumes: disks of a fixed size, yours by name (create, ls, rm),
    /// mounted into runs and agents (agentos exec --volume NAME:PATH[:ro])
    #[command(subcommand)]
    Volume(volumes::VolumeCommand),
    /// List the tools you may use and the tool servers' states; with
    /// words, search the tools for them (best first)
    Tools {
        /// Words to look for in tools' names and descriptions
        search: Vec<String>,
    },
    /// Call a tool: `agentos call SERVER.TOOL key=value ...` (values typed
    /// as the tool's input schema says); prints its result
    Call(CallArgs),
    /// The prompt-to-program loop: the LLM writes code, the kernel runs it
    /// and feeds back its output, until the LLM answers; prints the answer
    /// (the transcript with --json). --timeout is how long it follows the
    /// task (the task goes on)
    Run(RunArgs),
    /// Background tasks: dispatch, status, wait, list, cancel
    #[command(subcommand)]
    Task(TaskCommand),
    /// Serve MCP over stdin and stdout (or HTTP with --http): exec, think,
    /// spawn and more as tools for an MCP client, acting as you (`claude
    /// mcp add agentos -- agentos mcp`)
    Mcp(McpArgs),
    /// Serve E2B's sandbox API over the kernel, for E2B's SDKs (set
    /// E2B_API_URL and E2B_SANDBOX_URL to it); `agentos e2b keys add NAME`
    /// makes an API key
    E2b(e2b::E2bArgs),
    /// MCP servers for the kernel's config: `agentos mcp-servers import
    /// FILE` turns an MCP client's `mcpServers` JSON into `[mcp.servers]`
    /// entries
    #[command(subcommand)]
    McpServers(mcp_servers::McpServersCommand),
    /// Print a shell completion script: `agentos completion bash >
    /// /etc/bash_completion.d/agentos`
    Completion {
        /// The shell
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, clap::Args)]
struct McpArgs {
    /// Serve Streamable HTTP at ADDR (host:port, :port or port; port alone
    /// is 127.0.0.1) on path /mcp instead of stdio. Every request must
    /// carry a token; a non-loopback host needs one given
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// With --http: every request must carry `Authorization: Bearer` and
    /// the token in this file (mode 600); else the token in
    /// $AGENTOS_MCP_TOKEN, if set; else one the server keeps in
    /// ~/.config/agentos/mcp-token and serves its own user only with.
    /// Never on the command line, where `ps` shows it
    #[arg(long, value_name = "PATH", requires = "http")]
    token_file: Option<PathBuf>,
    /// With --http: a browser origin (scheme://host:port, port * for any)
    /// allowed besides localhost's; others get 403. Repeatable
    #[arg(long, value_name = "ORIGIN", requires = "http")]
    allow_origin: Vec<String>,
    /// With --http: a Host header value allowed besides localhost and the
    /// bound address (DNS rebinding guard). Repeatable
    #[arg(long, value_name = "HOST", requires = "http")]
    allow_host: Vec<String>,
    /// With --http, on a node of a fleet: the fleet's secret (mode 600,
    /// the same on every node), proving the forwards of tool calls whose
    /// session names another node (NAME@NODE); else $AGENTOS_FLEET_SECRET;
    /// else the face forwards nothing
    #[arg(long, value_name = "PATH", requires = "http")]
    fleet_secret_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    // Output piped into `head` ends quietly when the reader goes, as with
    // any command-line tool, rather than as a failed print.
    // SAFETY: setting a signal's disposition to the default touches no
    // memory of ours; nothing else runs yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(err) => failure::report(&err),
    }
}

fn run(args: Args) -> Result<ExitCode, CliError> {
    let json = args.json;
    if let Command::Completion { shell } = args.command {
        if json {
            return Err(usage(
                "completion prints a shell script; --json does not apply",
            ));
        }
        let mut command = Args::command();
        clap_complete::generate(shell, &mut command, "agentos", &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::McpServers(command) = args.command {
        if json {
            return Err(usage("mcp-servers prints TOML; --json does not apply"));
        }
        mcp_servers::mcp_servers(command)?;
        return Ok(ExitCode::SUCCESS);
    }
    let path = resolve_socket_path(args.socket.as_deref());
    if let Command::E2b(e2b_args) = args.command {
        if json || args.timeout.is_some() {
            return Err(usage(
                "e2b serves E2B's API; --json and --timeout do not apply",
            ));
        }
        e2b::e2b(e2b_args, &path)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Mcp(mcp_args) = args.command {
        if json || args.timeout.is_some() {
            return Err(usage(
                "mcp speaks MCP to its client; --json and --timeout do not apply",
            ));
        }
        let transport = match mcp_args.http {
            None => mcp::Transport::Stdio,
            Some(listen) => mcp::Transport::Http {
                options: mcp::HttpOptions {
                    listen,
                    token_file: mcp_args.token_file,
                    allow_origins: mcp_args.allow_origin,
                    allow_hosts: mcp_args.allow_host,
                },
                fleet_secret_file: mcp_args.fleet_secret_file,
            },
        };
        // Each tool call connects on its own, so an absent kernel is a
        // tool error the client sees, not a server that fails to start.
        mcp::serve(path, transport)?;
        return Ok(ExitCode::SUCCESS);
    }
    let run_timeout = match &args.command {
        Command::Exec(exec) => exec.run_timeout,
        Command::Call(call) => call.call_timeout,
        _ => None,
    };
    if let Some(secs) = run_timeout {
        seconds("the run's limit", secs)?;
    }
    // A command line that is wrong is said so whether a kernel runs or not.
    match &args.command {
        Command::Exec(exec) => {
            exec.check_code()?;
            exec.volumes.check("EXEC")?;
        }
        Command::Spawn(spawn) => spawn.volumes.check("SPAWN")?,
        _ => {}
    }
    // What the command waits on, when the flag leaves it to the command.
    let default_timeout = match &args.command {
        // A THINK may wait its turn in the kernel's queue and for a slow model.
        Command::Think(_) => 180.0,
        Command::Task(TaskCommand::Wait { .. }) | Command::Run(_) => 600.0,
        // The run's own limit, with room for its reply.
        Command::Exec(exec) => exec.run_timeout.map_or(60.0, |secs| secs + 30.0),
        Command::Template(templates::TemplateCommand::Build { build_timeout, .. }) => {
            build_timeout.map_or(templates::BUILD_WAIT.as_secs_f64(), |secs| secs + 60.0)
        }
        Command::Call(call) => call.call_timeout.map_or(3630.0, |secs| secs + 30.0),
        _ => 30.0,
    };
    let wait_for = seconds("--timeout", args.timeout.unwrap_or(default_timeout))?;
    let mut client = Client::connect(&path)?;
    // A command that waits on something asks the kernel in steps, each
    // well inside this.
    client.set_timeout(Some(wait_for + Duration::from_secs(5)))?;
    if let Some(name) = &args.delegate {
        let asked = serde_json::to_vec(&DelegateRequest {
            delegate: DelegateName::new(name).map_err(ClientError::Remote)?,
        })?;
        client.call_json::<DelegateReply>(Opcode::DELEGATE, &asked)?;
    }
    let client = &mut client;
    let done = match args.command {
        Command::Hello => kernel::hello(client, json),
        Command::Ping { count, size } => kernel::ping(client, &path, count, size, json),
        Command::Ps(ps_args) => agents::ps(client, ps_args, json),
        Command::Inspect { agents: names } => agents::inspect(client, &names, json),
        Command::Spawn(spawn_args) => spawn::spawn(client, spawn_args, json),
        Command::Stop(stop) => agents::stop(client, stop, true, wait_for, json),
        Command::Kill { stop, wait } => agents::stop(client, stop, wait, wait_for, json),
        Command::Restart(stop) => agents::restart(client, stop, wait_for, json),
        Command::Pause(agents::PauseArgs { freeze, hibernate }) => match freeze.session {
            Some(session) => sessions::freeze(client, session, true, hibernate, json),
            None => agents::freeze(client, freeze, true, json),
        },
        Command::Resume(freeze) => match freeze.session {
            Some(session) => sessions::freeze(client, session, false, false, json),
            None => agents::freeze(client, freeze, false, json),
        },
        Command::Rm(rm_args) => agents::rm(client, rm_args, wait_for, json),
        Command::Think(think_args) => think::think(client, think_args, json),
        Command::Exec(exec_args) => return exec::exec(client, exec_args, json),
        Command::Proc(command) => return proc::proc(client, command, json),
        Command::Fs(command) => fs::fs(client, command, json),
        Command::Sessions(sessions_args) => sessions::sessions(client, sessions_args, json),
        Command::Snapshot(snapshot_args) => sessions::snapshot(client, snapshot_args, json),
        Command::Restore(restore_args) => sessions::restore(client, restore_args, json),
        Command::Template(command) => templates::template(client, command, json),
        Command::Volume(command) => volumes::volume(client, command, json),
        Command::Tools { search } => tools(client, &search, json),
        Command::Call(call_args) => call_tool(client, call_args, json),
        Command::Task(command) => return task(client, command, wait_for, json),
        Command::Run(run_args) => return run_prompt(client, run_args, wait_for, json),
        Command::Top(top_args) => top::top(client, &path, top_args, json),
        Command::Logs(logs_args) => logs::logs(client, logs_args, json),
        Command::Events(events_args) => events::events(client, events_args, json),
        Command::Net(net_args) => net::net(client, net_args, json),
        Command::Kv(command) => kv::kv(client, command, json),
        Command::Send(send_args) => messages::send(client, send_args, json),
        Command::Metrics => kernel::metrics(client, json),
        Command::Nodes { command } => nodes::nodes(client, command, json),
        Command::Audit(audit_args) => audit::audit(client, audit_args, json),
        Command::Completion { .. } | Command::Mcp(_) | Command::E2b(_) | Command::McpServers(_) => {
            unreachable!("answered before connecting")
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}
