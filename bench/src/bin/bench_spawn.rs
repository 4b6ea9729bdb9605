//! `bench-spawn`: SPAWN latency (request to reply) of an isolated `/bin/true`
//! agent with cgroup limits, against `unshare --pid --net --mount --uts
//! --ipc --fork --mount-proc /bin/true` run in the same rounds, and a burst
//! of agents spawned at once. Prints figures and ratios; asserts nothing.

use std::process::Command;
use std::time::{Duration, Instant};

use agentos_bench::{percentile, sibling, start_agentosd};
use agentos_proto::{Client, Opcode};
use anyhow::{bail, Context};
use clap::Parser;
use serde_json::json;

/// Benchmark SPAWN against unshare(1).
#[derive(Debug, Parser)]
#[command(name = "bench-spawn")]
struct Args {
    /// agentosd binary [default: next to this program]
    #[arg(long)]
    agentosd: Option<std::path::PathBuf>,
    /// Alternating rounds
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Spawns per round and side
    #[arg(long, default_value_t = 20)]
    per_round: usize,
    /// Agents in the concurrent burst
    #[arg(long, default_value_t = 100)]
    burst: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("bench-spawn needs root: the baseline (unshare) and cgroup limits both do");
    }
    let agentosd = args.agentosd.clone().unwrap_or(sibling("agentosd")?);
    let dir = tempfile::tempdir()?;
    let kernel = start_agentosd(&agentosd, dir.path())?;
    let mut client = Client::connect(&kernel.socket)?;
    client.set_timeout(Some(Duration::from_secs(30)))?;

    let mut serial = 0usize;
    let mut spawn_once = |client: &mut Client| -> anyhow::Result<Duration> {
        serial += 1;
        let body = json!({
            "name": format!("bench-{serial}"),
            "command": ["/bin/true"],
            "limits": {"memory": 64u64 << 20, "cpu_quota": 50_000, "cpu_period": 100_000, "max_pids": 16},
        });
        let payload = serde_json::to_vec(&body)?;
        let start = Instant::now();
        let reply = client.call(Opcode::SPAWN, &payload)?;
        let took = start.elapsed();
        let reply: serde_json::Value = serde_json::from_slice(&reply.payload)?;
        if reply["success"] != true {
            bail!("SPAWN failed: {reply}");
        }
        Ok(took)
    };
    let unshare_once = || -> anyhow::Result<Duration> {
        let start = Instant::now();
        let status = Command::new("unshare")
            .args([
                "--pid",
                "--net",
                "--mount",
                "--uts",
                "--ipc",
                "--fork",
                "--mount-proc",
                "/bin/true",
            ])
            .status()
            .context("cannot run unshare (util-linux)")?;
        let took = start.elapsed();
        if !status.success() {
            bail!("unshare failed: {status}");
        }
        Ok(took)
    };

    for _ in 0..5 {
        spawn_once(&mut client)?;
        unshare_once()?;
    }
    let mut spawns = Vec::new();
    let mut unshares = Vec::new();
    for round in 0..args.rounds {
        for side in [round % 2, 1 - round % 2] {
            for _ in 0..args.per_round {
                if side == 0 {
                    spawns.push(spawn_once(&mut client)?);
                } else {
                    unshares.push(unshare_once()?);
                }
            }
        }
    }
    spawns.sort_unstable();
    unshares.sort_unstable();

    // The burst: every SPAWN sent before any reply is read.
    let start = Instant::now();
    for i in 0..args.burst {
        let body = json!({"name": format!("burst-{i}"), "command": ["/bin/sleep", "2"],
                          "limits": {"memory": 64u64 << 20, "max_pids": 16}});
        client.send(Opcode::SPAWN, &serde_json::to_vec(&body)?)?;
    }
    let mut ok = 0;
    let mut failures = Vec::new();
    for _ in 0..args.burst {
        let reply: serde_json::Value = serde_json::from_slice(&client.recv()?.payload)?;
        if reply["success"] == true {
            ok += 1;
        } else {
            failures.push(reply["error"].to_string());
        }
    }
    let burst_time = start.elapsed();

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (s50, u50) = (ms(percentile(&spawns, 0.5)), ms(percentile(&unshares, 0.5)));
    let (s99, u99) = (
        ms(percentile(&spawns, 0.99)),
        ms(percentile(&unshares, 0.99)),
    );
    println!(
        "bench-spawn: {} SPAWNs of an isolated /bin/true (pid, net, mnt, uts, ipc namespaces, \
         new root, seccomp, cgroup limits) and {} unshare runs, in {} alternating rounds",
        spawns.len(),
        unshares.len(),
        args.rounds
    );
    println!();
    println!(
        "{:<22} {:>10} {:>10} {:>8}   target",
        "", "SPAWN", "unshare", "ratio"
    );
    println!(
        "{:<22} {:>10.2} {:>10.2} {:>7.2}x   <= 1.00x  {}",
        "latency p50 (ms)",
        s50,
        u50,
        s50 / u50,
        if s50 <= u50 { "met" } else { "MISSED" }
    );
    println!(
        "{:<22} {:>10.2} {:>10.2} {:>7.2}x",
        "latency p99 (ms)",
        s99,
        u99,
        s99 / u99
    );
    println!(
        "{:<22} {:>10}   {} of {} started in {:.0} ms{}",
        "concurrent burst",
        if ok == args.burst { "met" } else { "MISSED" },
        ok,
        args.burst,
        ms(burst_time),
        failures
            .first()
            .map(|f| format!(" (first failure: {f})"))
            .unwrap_or_default()
    );
    drop(client);
    kernel.stop();
    Ok(())
}
