//! `bench-noop`: NOOP round trips through the Rust client
//! (`agentos_proto::Client`) against a running agentosd: one connection,
//! untimed warm-up calls, then each call timed alone. Prints the p50 and
//! p99 in microseconds on one line, as `bench/c/noop.c` does for the C
//! library, so `scripts/bench-c-sdk` can set them side by side. Asserts no
//! timing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentos_bench::percentile;
use agentos_proto::{Client, Opcode};
use anyhow::{bail, Context};
use clap::Parser;

/// Time NOOP round trips through the Rust client.
#[derive(Debug, Parser)]
#[command(name = "bench-noop")]
struct Args {
    /// The kernel's socket
    #[arg(long)]
    socket: PathBuf,
    /// Timed round trips
    #[arg(long, default_value_t = 20_000)]
    count: usize,
    /// NOOP payload bytes
    #[arg(long, default_value_t = 64)]
    payload: usize,
    /// Untimed round trips first
    #[arg(long, default_value_t = 2000)]
    warmup: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    let payload = vec![0x42u8; args.payload];
    let mut client = Client::connect(&args.socket)
        .with_context(|| format!("cannot connect to {}", args.socket.display()))?;
    for _ in 0..args.warmup {
        noop(&mut client, &payload)?;
    }
    let mut samples = Vec::with_capacity(args.count);
    for _ in 0..args.count {
        samples.push(noop(&mut client, &payload)?);
    }
    samples.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "p50_us={:.2} p99_us={:.2} count={} payload={}",
        us(percentile(&samples, 0.50)),
        us(percentile(&samples, 0.99)),
        args.count,
        args.payload
    );
    Ok(())
}

/// One NOOP, timed around the call alone; the echo is checked and the
/// reply dropped after the clock stops, as the C program does.
fn noop(client: &mut Client, payload: &[u8]) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let reply = client.call(Opcode::NOOP, payload)?;
    let took = start.elapsed();
    if reply.payload != payload {
        bail!("the reply is not the payload echoed");
    }
    Ok(took)
}
