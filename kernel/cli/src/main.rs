//! `agentos`: the AgentOS command-line client.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentos_proto::payload::{AgentInfo, KillRequest, SpawnReply, ThinkRequest};
use agentos_proto::socket_path::resolve_socket_path;
use agentos_proto::{Client, Opcode};
use anyhow::bail;
use clap::{Parser, Subcommand};

mod logs;
mod task;
mod tools;
mod top;

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
    /// Give up on a reply after this many seconds [default: 30, or 180 for think]
    #[arg(long, global = true, value_name = "SECS")]
    timeout: Option<f64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the kernel's version, your identity and what the kernel provides
    Hello {
        /// Print the raw JSON reply
        #[arg(long)]
        json: bool,
    },
    /// Measure NOOP round trips
    Ping {
        /// Number of round trips
        #[arg(short = 'n', long, default_value_t = 1000)]
        count: usize,
        /// Payload bytes per NOOP
        #[arg(short, long, default_value_t = 0)]
        size: usize,
    },
    /// List agents
    Ps {
        /// Print the LIST reply as JSON
        #[arg(long)]
        json: bool,
    },
    /// Start an agent: `agentos spawn [OPTIONS] NAME SCRIPT.py [ARGS...]`, or
    /// `agentos spawn [OPTIONS] NAME -- PROGRAM [ARGS...]`
    ///
    /// Options go before the script or program: everything after it is
    /// passed to it as its arguments.
    Spawn(SpawnArgs),
    /// Ask the kernel's LLM: prints the answer, and its figures on stderr
    Think(ThinkArgs),
    /// Run code in a fresh, isolated sandbox: prints its output and exits
    /// with its exit code (128 + the signal if one ended it)
    Exec(ExecArgs),
    /// List the tools you may use and the tool servers' states; with
    /// words, search the tools for them (best first)
    Tools {
        /// Words to look for in tools' names and descriptions
        search: Vec<String>,
        /// Print the TOOL reply as JSON
        #[arg(long)]
        json: bool,
    },
    /// Call a tool: `agentos call SERVER.TOOL key=value ...` (a value that
    /// is JSON is sent as JSON, anything else as a string); prints its result
    Call(CallArgs),
    /// The prompt-to-program loop: the LLM writes code, the kernel runs it
    /// and feeds back its output, until the LLM answers; prints the answer
    /// (the transcript with --json)
    Run(RunArgs),
    /// Background tasks: dispatch, status, wait, list, cancel
    #[command(subcommand)]
    Task(TaskCommand),
    /// A live view of the agents: state, CPU %, memory against its limit,
    /// restarts, LLM tokens, EXEC runs; refreshed each second, q quits
    Top(top::TopArgs),
    /// Print an agent's log: its last lines, and with -f what it writes
    /// next, until it ends
    Logs(logs::LogsArgs),
    /// Stop an agent (SIGTERM to its tree, SIGKILL after the grace)
    Kill {
        /// Agent name, or id
        agent: String,
        /// Milliseconds between SIGTERM and SIGKILL
        #[arg(long, value_name = "MS")]
        grace_ms: Option<u64>,
    },
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
    #[arg(long)]
    network: bool,
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
    /// Wall-clock limit for the run
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// Print the EXEC reply as JSON
    #[arg(long)]
    json: bool,
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
    /// Print the THINK reply as JSON
    #[arg(long)]
    json: bool,
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
        Err(err) => {
            eprintln!("agentos: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let path = resolve_socket_path(args.socket.as_deref());
    // A THINK may wait its turn in the kernel's queue and for a slow model.
    let default_timeout = match &args.command {
        Command::Think(_) => 180.0,
        // The run's own limit, with room for its reply.
        Command::Exec(exec) => exec.timeout_ms.map_or(60.0, |ms| ms as f64 / 1e3 + 30.0),
        Command::Call(call) => call.timeout_ms.map_or(3630.0, |ms| ms as f64 / 1e3 + 30.0),
        Command::Task(TaskCommand::Wait { timeout_ms, .. }) => *timeout_ms as f64 / 1e3 + 30.0,
        _ => 30.0,
    };
    let timeout = args.timeout.unwrap_or(default_timeout);
    if !(timeout > 0.0 && timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    let mut client = Client::connect(&path)?;
    client.set_timeout(Some(Duration::from_secs_f64(timeout)))?;
    let done = match args.command {
        Command::Hello { json } => hello(&mut client, json),
        Command::Ping { count, size } => ping(&mut client, &path, count, size),
        Command::Ps { json } => ps(&mut client, json),
        Command::Spawn(spawn_args) => spawn(&mut client, spawn_args),
        Command::Kill { agent, grace_ms } => kill(&mut client, &agent, grace_ms),
        Command::Think(think_args) => think(&mut client, think_args),
        Command::Exec(exec_args) => return exec(&mut client, exec_args),
        Command::Tools { search, json } => tools(&mut client, &search, json),
        Command::Call(call_args) => call_tool(&mut client, call_args),
        Command::Task(command) => return task(&mut client, command),
        Command::Run(run_args) => return run_prompt(&mut client, run_args),
        Command::Top(top_args) => top::top(&mut client, &path, top_args),
        Command::Logs(logs_args) => logs::logs(&mut client, logs_args),
    };
    done.map(|()| ExitCode::SUCCESS)
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

fn exec(client: &mut Client, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let code = words_or_stdin(&args.code)?;
    let mut request = serde_json::json!({
        "code": code,
        "language": if args.bash { "bash" } else { "python" },
    });
    if let Some(session) = args.session {
        request["session"] = session.into();
    }
    if let Some(timeout_ms) = args.timeout_ms {
        request["timeout_ms"] = timeout_ms.into();
    }
    let reply = client.call(Opcode::EXEC, &serde_json::to_vec(&request)?)?;
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    if let Some(code) = reply["code"].as_str() {
        bail!(
            "{} ({code})",
            reply["error"].as_str().unwrap_or("EXEC failed")
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else {
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

fn think(client: &mut Client, args: ThinkArgs) -> anyhow::Result<()> {
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(());
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

fn spawn(client: &mut Client, args: SpawnArgs) -> anyhow::Result<()> {
    let mut request = serde_json::json!({ "name": args.name });
    let (first, rest) = args
        .program
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("give a script or a program"))?;
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
            bail!("--cpus must be a positive number");
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
                .ok_or_else(|| anyhow::anyhow!("--env takes KEY=VALUE, not {pair:?}"))?;
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
    if args.no_sandbox {
        request["sandboxed"] = false.into();
    }
    let reply: SpawnReply = client.call_json(Opcode::SPAWN, &serde_json::to_vec(&request)?)?;
    println!(
        "agent {} ({}) {} as pid {}",
        reply.id,
        reply.name,
        reply.status.as_str(),
        reply.pid.map_or_else(|| "-".into(), |p| p.to_string())
    );
    let isolation = &reply.isolation;
    println!(
        "isolation: {}namespaces [{}], cgroup {}",
        if isolation.sandboxed {
            ""
        } else {
            "not sandboxed, "
        },
        isolation.namespaces.join(" "),
        isolation.cgroup.map_or("none", |v| v.as_str())
    );
    if let Some(reason) = &isolation.degraded_reason {
        println!("degraded: {reason}");
    }
    for warning in &reply.warnings {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// An agent named on the command line: a number is an id, anything else
/// a name (as `id` and `name` fields of a request).
fn id_or_name(agent: &str) -> (Option<u32>, Option<String>) {
    match agent.parse::<u32>() {
        Ok(id) => (Some(id), None),
        Err(_) => (None, Some(agent.to_owned())),
    }
}

fn kill(client: &mut Client, agent: &str, grace_ms: Option<u64>) -> anyhow::Result<()> {
    let (id, name) = id_or_name(agent);
    let reply = client.kill(&KillRequest { id, name, grace_ms })?;
    println!(
        "agent {} is being stopped",
        reply
            .id
            .map_or_else(|| agent.to_owned(), |id| id.to_string())
    );
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
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(());
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
) -> anyhow::Result<()> {
    if count == 0 {
        bail!("-n must be at least 1");
    }
    let payload = vec![0x5Au8; size];
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let start = Instant::now();
        let echoed = client.noop(&payload)?;
        samples.push(start.elapsed());
        if echoed != payload {
            bail!("NOOP {i} came back altered ({} bytes)", echoed.len());
        }
    }
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
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

fn ps(client: &mut Client, json: bool) -> anyhow::Result<()> {
    let agents = client.list()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&agents)?);
        return Ok(());
    }
    print!("{}", format_table(&agents));
    Ok(())
}

/// The `ps` table: one line per agent under a header.
fn format_table(agents: &[AgentInfo]) -> String {
    let mut out = table_row([
        "ID", "NAME", "PID", "STATE", "RESTARTS", "UPTIME", "MEMORY", "PEAK", "CPU", "EXIT",
    ]);
    let mib = |bytes: u64| format!("{:.1}M", bytes as f64 / (1 << 20) as f64);
    for agent in agents {
        let exit = match (agent.exit_code, agent.signal, agent.oom_killed) {
            (_, _, true) => "OOM".to_owned(),
            (Some(code), _, _) => code.to_string(),
            (None, Some(signal), _) => format!("sig{signal}"),
            (None, None, false) => "-".to_owned(),
        };
        out.push_str(&table_row([
            &agent.id.to_string(),
            &agent.name,
            &agent.pid.map_or_else(|| "-".into(), |p| p.to_string()),
            agent.state.as_str(),
            &agent.restarts.to_string(),
            &format!("{:.1}s", agent.uptime_ms as f64 / 1000.0),
            &mib(agent.memory.current),
            &mib(agent.memory.peak),
            &format!("{:.2}s", agent.cpu.usage_usec as f64 / 1e6),
            &exit,
        ]));
    }
    if agents.is_empty() {
        out.push_str("(no agents)\n");
    }
    out
}

/// One line of the `ps` table, columns aligned.
fn table_row(cells: [&str; 10]) -> String {
    let [id, name, pid, state, restarts, uptime, memory, peak, cpu, exit] = cells;
    format!(
        "{id:>7}  {name:<20} {pid:>8}  {state:<11} {restarts:>8} {uptime:>8} \
         {memory:>8} {peak:>8} {cpu:>8} {exit:>6}\n"
    )
}
