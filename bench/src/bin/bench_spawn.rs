//! `bench-spawn`: SPAWN latency (request to reply) of an isolated `/bin/true`
//! agent with cgroup limits, against `unshare --pid --net --mount --uts
//! --ipc --fork --mount-proc /bin/true` run in the same rounds, and a burst
//! of agents spawned at once. Prints figures and ratios; asserts nothing.

use std::process::Command;
use std::time::{Duration, Instant};

use agentos_bench::wire::{read_reply, Spawn};
use agentos_bench::{percentile, sibling, start_agentosd, verdict};
use agentos_proto::payload::{Limits, SpawnReply};
use agentos_proto::{Client, ErrorReply, Opcode};
use anyhow::{anyhow, bail, Context};
use clap::Parser;

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
    /// Pause before each paced SPAWN, so the kernel's warm pool has
    /// refilled (the steady state of agents started now and then)
    #[arg(long, default_value_t = 50)]
    pause_ms: u64,
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
        let body = Spawn::command(format!("bench-{serial}"), &["/bin/true"]).limits(Limits {
            memory: Some(64 << 20),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            max_pids: Some(16),
        });
        let payload = serde_json::to_vec(&body)?;
        let start = Instant::now();
        let reply = client.call(Opcode::SPAWN, &payload)?;
        let took = start.elapsed();
        read_reply(&reply.payload, |r: &SpawnReply| r.success)
            .map_err(|reply| anyhow!("SPAWN failed: {reply}"))?;
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
    // Three series, interleaved round by round so that drift on the host
    // touches them alike: SPAWN paced (a warm sandbox is waiting), SPAWN
    // back to back (the pool runs dry and sandboxes start cold), unshare.
    let pause = Duration::from_millis(args.pause_ms);
    let mut paced = Vec::new();
    let mut back_to_back = Vec::new();
    let mut unshares = Vec::new();
    for round in 0..args.rounds {
        for side in 0..3 {
            for _ in 0..args.per_round {
                match (side + round) % 3 {
                    0 => {
                        std::thread::sleep(pause);
                        paced.push(spawn_once(&mut client)?);
                    }
                    1 => back_to_back.push(spawn_once(&mut client)?),
                    _ => unshares.push(unshare_once()?),
                }
            }
            // Every series starts with the pool as the paced one finds it.
            std::thread::sleep(pause);
        }
    }
    for series in [&mut paced, &mut back_to_back, &mut unshares] {
        series.sort_unstable();
    }

    // The burst: every SPAWN sent before any reply is read.
    let start = Instant::now();
    let burst_limits = Limits {
        memory: Some(64 << 20),
        max_pids: Some(16),
        ..Limits::default()
    };
    for i in 0..args.burst {
        let body = Spawn::command(format!("burst-{i}"), &["/bin/sleep", "2"]).limits(burst_limits);
        client.send(Opcode::SPAWN, &serde_json::to_vec(&body)?)?;
    }
    let mut ok = 0;
    let mut failures = Vec::new();
    for _ in 0..args.burst {
        let reply = client.recv()?;
        match read_reply(&reply.payload, |r: &SpawnReply| r.success) {
            Ok(_) => ok += 1,
            Err(unexpected) => failures.push(
                serde_json::from_slice::<ErrorReply>(&reply.payload)
                    .map_or(unexpected.text, |refused| refused.error),
            ),
        }
    }
    let burst_time = start.elapsed();

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "bench-spawn: SPAWN of an isolated /bin/true (pid, net, mnt, uts, ipc namespaces, \
         new root, seccomp, cgroup limits) against unshare(1), {} of each series in {} \
         interleaved rounds",
        args.rounds * args.per_round,
        args.rounds
    );
    println!();
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9}",
        "", "p50 ms", "p99 ms", "p50 ratio", "p99 ratio"
    );
    let (u50, u99) = (percentile(&unshares, 0.5), percentile(&unshares, 0.99));
    let series = [
        (
            format!("SPAWN, {} ms apart (warm pool)", args.pause_ms),
            &paced,
        ),
        ("SPAWN, back to back".to_owned(), &back_to_back),
        ("unshare (baseline)".to_owned(), &unshares),
    ];
    for (label, samples) in series {
        let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
        println!(
            "{label:<34} {:>9.2} {:>9.2} {:>8.2}x {:>8.2}x",
            ms(p50),
            ms(p99),
            ms(p50) / ms(u50),
            ms(p99) / ms(u99)
        );
    }
    println!();
    println!(
        "target: SPAWN p50 <= unshare p50 -- warm pool {}, back to back {}",
        verdict(percentile(&paced, 0.5) <= u50),
        verdict(percentile(&back_to_back, 0.5) <= u50)
    );
    println!(
        "concurrent burst: {} of {} started in {:.0} ms -- {}{}",
        ok,
        args.burst,
        ms(burst_time),
        verdict(ok == args.burst),
        failures
            .first()
            .map(|f| format!(" (first failure: {f})"))
            .unwrap_or_default()
    );
    drop(client);
    kernel.stop();
    Ok(())
}
