//! `agentos`: the AgentOS command-line client.
//!
//! Every command takes `--json` (the protocol's reply, or a stable JSON
//! shape where the command makes several requests) and `--timeout SECS`
//! (how long the command waits for the kernel, and for what it waits on:
//! an agent to stop, a task to end). Exit codes: 0 ok, 1 the operation
//! failed, 2 the command line was wrong.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentos_proto::payload::ThinkRequest;
use agentos_proto::socket_path::resolve_socket_path;
use agentos_proto::{Client, Opcode};
use clap::{CommandFactory, Parser, Subcommand};

mod agents;
mod failure;
mod format;
mod http_guard;
mod logs;
mod mcp;
mod net;
mod sessions;
mod task;
mod tools;
mod top;

use failure::usage;
use format::print_json;
use task::{run_prompt, task, RunArgs, TaskCommand};
use tools::{call_tool, tools, CallArgs};

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
    Spawn(SpawnArgs),
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
    /// Remove ended agents from the list (-f stops a live one first)
    Rm(agents::RmArgs),
    /// Print an agent's log: its last lines, and with -f what it writes
    /// next, until it ends
    Logs(logs::LogsArgs),
    /// An agent's network policy and connection record; with --allow
    /// (or --cut), a new policy while it runs
    Net(net::NetArgs),
    /// The kernel's metrics in the Prometheus text format, as
    /// `[metrics] listen` serves them (operators)
    Metrics,
    /// A live view of agents, tasks and tool servers, refreshed each
    /// second; its third line lists the keys, q quits
    Top(top::TopArgs),
    /// Ask the kernel's LLM: prints the answer, and its figures on stderr
    Think(ThinkArgs),
    /// Run code in a fresh, isolated sandbox: prints its output and exits
    /// with its exit code (128 + the signal if one ended it)
    Exec(ExecArgs),
    /// Your EXEC sessions (interpreters and /workspace kept between runs)
    Sessions,
    /// Save a session's /workspace as a named snapshot (--list: its
    /// snapshots)
    Snapshot(sessions::SnapshotArgs),
    /// Put a session's /workspace back as a snapshot had it, with a new
    /// interpreter
    Restore(sessions::RestoreArgs),
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
}

#[derive(Debug, clap::Args)]
struct SpawnArgs {
    /// Agent name ([A-Za-z0-9_.-], up to 64)
    name: String,
    /// A Python script (*.py) and its arguments, or a program and its
    /// arguments; options after it are its own
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<String>,
    /// Interpreter for the script
    #[arg(long, value_name = "PATH")]
    python: Option<String>,
    /// Memory limit: bytes, or with K, M or G
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// CPU share, in CPUs (0.1 = 10% of one CPU)
    #[arg(long, value_name = "CPUS")]
    cpus: Option<f64>,
    /// Process limit
    #[arg(long, value_name = "N")]
    max_pids: Option<u64>,
    /// never, on-failure or always
    #[arg(long, value_name = "POLICY")]
    restart: Option<String>,
    /// Environment variable for the agent (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory inside the sandbox
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Share the host network instead of loopback only
    #[arg(long, conflicts_with = "allow")]
    network: bool,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Run without namespaces or cgroup (operators only)
    #[arg(long)]
    no_sandbox: bool,
}

#[derive(Debug, clap::Args)]
struct ExecArgs {
    /// The code (its words are joined by spaces); `-` reads it from stdin
    #[arg(required = true, allow_hyphen_values = true)]
    code: Vec<String>,
    /// Run it in this session's interpreter and /workspace
    #[arg(short, long)]
    session: Option<String>,
    /// The code is bash, not Python
    #[arg(long)]
    bash: bool,
    /// The run's own wall-clock limit, in seconds, enforced by the kernel
    /// [default: the kernel's]; the global --timeout is how long this
    /// command waits for the reply
    #[arg(long, value_name = "SECS")]
    run_timeout: Option<f64>,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// A network policy given on the command line.
#[derive(Debug, clap::Args)]
struct PolicyArgs {
    /// Reach this through the kernel's egress proxy (host, *.domain or
    /// CIDR, each with an optional :port); repeat for more
    #[arg(long, value_name = "ENTRY")]
    allow: Vec<String>,
    /// With --allow: never reach this
    #[arg(long, value_name = "ENTRY", requires = "allow")]
    deny: Vec<String>,
}

impl PolicyArgs {
    /// The request's `network`, if a policy was given.
    fn to_json(&self) -> Option<serde_json::Value> {
        (!self.allow.is_empty())
            .then(|| serde_json::json!({"allow": self.allow, "deny": self.deny}))
    }
}

#[derive(Debug, clap::Args)]
struct ThinkArgs {
    /// The prompt (its words are joined by spaces); `-` reads it from stdin
    #[arg(required = true)]
    prompt: Vec<String>,
    /// A system instruction
    #[arg(long)]
    system: Option<String>,
    /// A model other than the kernel's default
    #[arg(long)]
    model: Option<String>,
    /// Upper bound on the answer's tokens
    #[arg(long, value_name = "N")]
    max_tokens: Option<u32>,
    /// Sampling temperature, 0 to 2
    #[arg(long)]
    temperature: Option<f64>,
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

/// Seconds as a positive duration, for a flag named `flag`.
fn seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    if !(secs > 0.0 && secs.is_finite() && secs < 1e9) {
        return Err(usage(format!(
            "{flag} must be a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
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
    let path = resolve_socket_path(args.socket.as_deref());
    if let Command::Mcp(mcp_args) = args.command {
        if json || args.timeout.is_some() {
            return Err(usage(
                "mcp speaks MCP to its client; --json and --timeout do not apply",
            ));
        }
        let transport = match mcp_args.http {
            None => mcp::Transport::Stdio,
            Some(listen) => mcp::Transport::Http(mcp::HttpOptions {
                listen,
                token_file: mcp_args.token_file,
                allow_origins: mcp_args.allow_origin,
                allow_hosts: mcp_args.allow_host,
            }),
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
    // What the command waits on, when the flag leaves it to the command.
    let default_timeout = match &args.command {
        // A THINK may wait its turn in the kernel's queue and for a slow model.
        Command::Think(_) => 180.0,
        Command::Task(TaskCommand::Wait { .. }) | Command::Run(_) => 600.0,
        // The run's own limit, with room for its reply.
        Command::Exec(exec) => exec.run_timeout.map_or(60.0, |secs| secs + 30.0),
        Command::Call(call) => call.call_timeout.map_or(3630.0, |secs| secs + 30.0),
        _ => 30.0,
    };
    let wait_for = seconds("--timeout", args.timeout.unwrap_or(default_timeout))?;
    let mut client = Client::connect(&path)?;
    // A command that waits on something asks the kernel in steps, each
    // well inside this.
    client.set_timeout(Some(wait_for + Duration::from_secs(5)))?;
    let client = &mut client;
    let done = match args.command {
        Command::Hello => hello(client, json),
        Command::Ping { count, size } => ping(client, &path, count, size, json),
        Command::Ps(ps_args) => agents::ps(client, ps_args, json),
        Command::Inspect { agents: names } => agents::inspect(client, &names, json),
        Command::Spawn(spawn_args) => spawn(client, spawn_args, json),
        Command::Stop(stop) => agents::stop(client, stop, true, wait_for, json),
        Command::Kill { stop, wait } => agents::stop(client, stop, wait, wait_for, json),
        Command::Restart(stop) => agents::restart(client, stop, wait_for, json),
        Command::Rm(rm_args) => agents::rm(client, rm_args, wait_for, json),
        Command::Think(think_args) => think(client, think_args, json),
        Command::Exec(exec_args) => return exec(client, exec_args, json),
        Command::Sessions => sessions::sessions(client, json),
        Command::Snapshot(snapshot_args) => sessions::snapshot(client, snapshot_args, json),
        Command::Restore(restore_args) => sessions::restore(client, restore_args, json),
        Command::Tools { search } => tools(client, &search, json),
        Command::Call(call_args) => call_tool(client, call_args, json),
        Command::Task(command) => return task(client, command, wait_for, json),
        Command::Run(run_args) => return run_prompt(client, run_args, wait_for, json),
        Command::Top(top_args) => top::top(client, &path, top_args, json),
        Command::Logs(logs_args) => logs::logs(client, logs_args, json),
        Command::Net(net_args) => net::net(client, net_args, json),
        Command::Metrics => metrics(client, json),
        Command::Completion { .. } | Command::Mcp(_) => unreachable!("answered before connecting"),
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// `agentos metrics`: the text as it is (its JSON reply with --json).
fn metrics(client: &mut Client, json: bool) -> anyhow::Result<()> {
    let reply: agentos_proto::payload::MetricsReply = client.call_json(Opcode::METRICS, b"")?;
    if json {
        print_json(&reply)
    } else {
        print!("{}", reply.text);
        Ok(())
    }
}

/// Text given as words on the command line (joined by spaces), or `-`
/// for all of stdin.
fn words_or_stdin(words: &[String]) -> std::io::Result<String> {
    if words == ["-"] {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
        Ok(text)
    } else {
        Ok(words.join(" "))
    }
}

fn exec(client: &mut Client, args: ExecArgs, json: bool) -> anyhow::Result<ExitCode> {
    let code = words_or_stdin(&args.code)?;
    let mut request = serde_json::json!({
        "code": code,
        "language": if args.bash { "bash" } else { "python" },
    });
    if let Some(session) = args.session {
        request["session"] = session.into();
    }
    if let Some(secs) = args.run_timeout {
        request["timeout_ms"] = ((secs * 1e3).round() as u64).into();
    }
    if let Some(policy) = args.policy.to_json() {
        request["network"] = policy;
    }
    let reply = client.call(Opcode::EXEC, &serde_json::to_vec(&request)?)?;
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    if json {
        print_json(&reply)?;
    }
    if reply.get("code").is_some() {
        let refusal: agentos_proto::ErrorReply = serde_json::from_value(reply)?;
        return Err(refusal.into());
    }
    if !json {
        print!("{}", reply["stdout"].as_str().unwrap_or_default());
        eprint!("{}", reply["stderr"].as_str().unwrap_or_default());
        let tool_calls = reply["tool_calls"].as_u64().unwrap_or(0);
        if tool_calls > 0 {
            // What programmatic tool calling saved: tool results stayed in
            // the sandbox, only the output came back.
            let returned = reply["stdout"].as_str().map_or(0, str::len)
                + reply["stderr"].as_str().map_or(0, str::len);
            eprintln!(
                "agentos: {tool_calls} tool calls brought {} bytes into the run; {returned} \
                 bytes came back",
                reply["tool_bytes"]
            );
        }
        if reply["timed_out"] == true {
            eprintln!(
                "agentos: {}",
                reply["error"].as_str().unwrap_or("timed out")
            );
        }
    }
    let status = match (reply["exit_code"].as_i64(), reply["signal"].as_i64()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    Ok(ExitCode::from(u8::try_from(status & 0xff).unwrap_or(1)))
}

fn think(client: &mut Client, args: ThinkArgs, json: bool) -> anyhow::Result<()> {
    let prompt = words_or_stdin(&args.prompt)?;
    let request = ThinkRequest {
        prompt: Some(prompt),
        system: args.system,
        model: args.model,
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        ..ThinkRequest::default()
    };
    let reply = client.think(&request)?;
    if json {
        return print_json(&reply);
    }
    println!("{}", reply.content.trim_end());
    eprintln!(
        "({} tokens, {}, {} ms queued, {} ms at the model)",
        reply.tokens,
        reply.model.as_deref().unwrap_or("unknown model"),
        reply.queue_ms.unwrap_or(0),
        reply.latency_ms.unwrap_or(0),
    );
    Ok(())
}

fn spawn(client: &mut Client, args: SpawnArgs, json: bool) -> anyhow::Result<()> {
    let mut request = serde_json::json!({ "name": args.name });
    let (first, rest) = args
        .program
        .split_first()
        .ok_or_else(|| usage("give a script or a program"))?;
    if first.ends_with(".py") {
        request["script"] = serde_json::json!(std::path::absolute(first)?);
        request["args"] = serde_json::json!(rest);
    } else {
        request["command"] = serde_json::json!(args.program);
    }
    let mut limits = serde_json::Map::new();
    if let Some(memory) = args.memory {
        limits.insert("memory".into(), memory.into());
    }
    if let Some(cpus) = args.cpus {
        if !(cpus > 0.0 && cpus.is_finite()) {
            return Err(usage("--cpus must be a positive number"));
        }
        limits.insert("cpu_period".into(), 100_000.into());
        limits.insert(
            "cpu_quota".into(),
            ((cpus * 100_000.0).round() as u64).into(),
        );
    }
    if let Some(pids) = args.max_pids {
        limits.insert("max_pids".into(), pids.into());
    }
    if !limits.is_empty() {
        request["limits"] = limits.into();
    }
    if let Some(policy) = args.restart {
        request["restart_policy"] = policy.into();
    }
    if !args.env.is_empty() {
        let mut env = serde_json::Map::new();
        for pair in &args.env {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| usage(format!("--env takes KEY=VALUE, not {pair:?}")))?;
            env.insert(key.into(), value.into());
        }
        request["env"] = env.into();
    }
    if let Some(python) = args.python {
        request["python"] = python.into();
    }
    if let Some(cwd) = args.cwd {
        request["cwd"] = cwd.into();
    }
    if args.network {
        request["network"] = true.into();
    }
    if let Some(policy) = args.policy.to_json() {
        request["network"] = policy;
    }
    if args.no_sandbox {
        request["sandboxed"] = false.into();
    }
    let reply: agentos_proto::payload::SpawnReply =
        client.call_json(Opcode::SPAWN, &serde_json::to_vec(&request)?)?;
    if json {
        return print_json(&reply);
    }
    for warning in &reply.warnings {
        eprintln!("warning: {warning}");
    }
    agents::print_spawned(&reply);
    Ok(())
}

/// Why a size on the command line cannot be read.
#[derive(Debug, thiserror::Error)]
enum BadSize {
    /// No number leads it.
    #[error("{0:?} is not a size (try 512M)")]
    NotANumber(String),
    /// Its unit is none of K, M, G.
    #[error("unknown unit in {0:?}: use K, M or G")]
    UnknownUnit(String),
    /// It does not fit in 64 bits.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// `512`, `64K`, `50M`, `2G` to bytes.
fn parse_size(text: &str) -> Result<u64, BadSize> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| BadSize::NotANumber(text.to_owned()))?;
    let unit = unit.to_ascii_uppercase();
    let scale: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(BadSize::UnknownUnit(text.to_owned())),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| BadSize::TooLarge(text.to_owned()))
}

fn hello(client: &mut Client, json: bool) -> anyhow::Result<()> {
    let reply = client.hello()?;
    if json {
        return print_json(&reply);
    }
    let features = &reply.features;
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    println!(
        "AgentOS kernel {} (protocol {})",
        reply.kernel_version, reply.protocol_version
    );
    println!("you are:   id {}", reply.agent_id);
    println!(
        "features:  think {}, exec {}, spawn {}, task {}, cgroup {}",
        yes_no(features.think),
        yes_no(features.exec),
        yes_no(features.spawn),
        yes_no(features.task),
        features.cgroup.map_or("none", |v| v.as_str())
    );
    if let Some(limits) = reply.limits {
        println!(
            "limits:    request {} bytes, reply {} bytes, {} requests in flight",
            limits.max_request_bytes, limits.max_reply_bytes, limits.max_in_flight
        );
    }
    if let Some(llm) = reply.llm {
        let state = match (llm.ready, llm.reason) {
            (true, _) => "ready".to_owned(),
            (false, reason) => reason.unwrap_or_else(|| "not ready".to_owned()),
        };
        println!(
            "llm:       {} {} ({state}; {} calls, {} tokens so far)",
            llm.provider, llm.model, llm.calls, llm.tokens
        );
    }
    Ok(())
}

fn ping(
    client: &mut Client,
    path: &std::path::Path,
    count: usize,
    size: usize,
    json: bool,
) -> anyhow::Result<()> {
    if count == 0 {
        return Err(usage("-n must be at least 1"));
    }
    let payload = vec![0x5Au8; size];
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let start = Instant::now();
        let echoed = client.noop(&payload)?;
        samples.push(start.elapsed());
        if echoed != payload {
            anyhow::bail!("NOOP {i} came back altered ({} bytes)", echoed.len());
        }
    }
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    if json {
        let us = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
        return print_json(&serde_json::json!({
            "count": count, "size": size, "socket": path,
            "p50_us": us(pct(0.50)), "p99_us": us(pct(0.99)),
            "min_us": us(samples[0]), "max_us": us(samples[samples.len() - 1]),
        }));
    }
    println!(
        "{count} NOOP round trips ({size} bytes) to {}: p50 {}, p99 {}, min {}, max {}",
        path.display(),
        micros(pct(0.50)),
        micros(pct(0.99)),
        micros(samples[0]),
        micros(samples[samples.len() - 1]),
    );
    Ok(())
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}
