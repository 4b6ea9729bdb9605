//! `agentos`: the AgentOS command-line client.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentos_proto::payload::AgentInfo;
use agentos_proto::socket_path::resolve_socket_path;
use agentos_proto::Client;
use anyhow::bail;
use clap::{Parser, Subcommand};

/// Talk to the AgentOS kernel.
#[derive(Debug, Parser)]
#[command(name = "agentos", version)]
struct Args {
    /// Kernel socket [default: $AGENTOS_SOCKET, /run/agentos/agentos.sock as root,
    /// else $XDG_RUNTIME_DIR/agentos/agentos.sock or /tmp/agentos-$UID/agentos.sock]
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Give up on a reply after this many seconds
    #[arg(long, global = true, value_name = "SECS", default_value_t = 30.0)]
    timeout: f64,
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
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("agentos: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let path = resolve_socket_path(args.socket.as_deref());
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    let mut client = Client::connect(&path)?;
    client.set_timeout(Some(Duration::from_secs_f64(args.timeout)))?;
    match args.command {
        Command::Hello { json } => hello(&mut client, json),
        Command::Ping { count, size } => ping(&mut client, &path, count, size),
        Command::Ps { json } => ps(&mut client, json),
    }
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
    let mut out = format!(
        "{:>7}  {:<20} {:>8}  {:<11} {:>8} {:>10} {:>10}\n",
        "ID", "NAME", "PID", "STATE", "RESTARTS", "UPTIME", "MEMORY"
    );
    for agent in agents {
        out.push_str(&format!(
            "{:>7}  {:<20} {:>8}  {:<11} {:>8} {:>10} {:>10}\n",
            agent.id,
            agent.name,
            agent
                .pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            agent.state.as_str(),
            agent.restarts,
            format!("{:.1}s", agent.uptime_ms as f64 / 1000.0),
            format!("{:.1}M", agent.memory.current as f64 / (1 << 20) as f64),
        ));
    }
    if agents.is_empty() {
        out.push_str("(no agents)\n");
    }
    out
}
