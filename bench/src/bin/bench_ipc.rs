//! `bench-ipc`: NOOP latency and pipelined throughput of agentosd against a
//! minimal epoll echo server (`echo-baseline`), measured in the same run,
//! interleaved, so machine noise hits both alike. Prints figures and ratios;
//! asserts nothing.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentos_bench::{percentile, sibling, verdict, Server};
use agentos_proto::{encode_frame, Opcode, HEADER_LEN};
use anyhow::bail;
use clap::Parser;

/// Benchmark agentosd's request path against an epoll echo baseline.
#[derive(Debug, Parser)]
#[command(name = "bench-ipc")]
struct Args {
    /// agentosd binary [default: next to this program]
    #[arg(long)]
    agentosd: Option<PathBuf>,
    /// echo-baseline binary [default: next to this program]
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// NOOP payload bytes
    #[arg(long, default_value_t = 16)]
    payload: usize,
    /// Latency: alternating rounds per server
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Latency: round trips per round
    #[arg(long, default_value_t = 2000)]
    per_round: usize,
    /// Throughput: client connections
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Throughput: requests in flight per connection
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Throughput: seconds per run (three runs per server, alternating)
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let agentosd = args.agentosd.clone().unwrap_or(sibling("agentosd")?);
    let baseline = args.baseline.clone().unwrap_or(sibling("echo-baseline")?);
    let dir = tempfile::tempdir()?;

    let kernel = agentos_bench::start_agentosd(&agentosd, dir.path())?;
    let baseline_socket = dir.path().join("echo.sock");
    let mut command = Command::new(&baseline);
    command.arg(&baseline_socket);
    let echo = Server::start("baseline", command, baseline_socket)?;

    // Idle: started, answered one request, nothing else.
    round_trips(&kernel.socket, 1, args.payload)?;
    std::thread::sleep(Duration::from_millis(300));
    let idle_rss = kernel.rss_mib();

    let servers = [&kernel, &echo];
    let mut latency: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for (i, server) in servers.iter().enumerate() {
        round_trips(&server.socket, 2000, args.payload)?; // warm-up
        latency[i].clear();
    }
    for round in 0..args.rounds {
        for i in alternate(round) {
            latency[i].extend(round_trips(
                &servers[i].socket,
                args.per_round,
                args.payload,
            )?);
        }
    }

    let mut throughput: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let run_time = Duration::from_secs_f64(args.seconds);
    for round in 0..3 {
        for i in alternate(round) {
            throughput[i].push(pipelined(
                &servers[i].socket,
                args.clients,
                args.depth,
                run_time,
                args.payload,
            )?);
        }
    }
    let loaded_rss = kernel.rss_mib();

    // A crowd: a thousand clients connect, each sends one NOOP, and all
    // leave; then the servers are idle again.
    raise_fd_limit();
    let mut crowd_rss = [0.0; 2];
    for (i, server) in servers.iter().enumerate() {
        crowd_rss[i] = crowd(server, CROWD, args.payload)?;
    }
    std::thread::sleep(Duration::from_secs(2));
    let after_crowd = [kernel.rss_mib(), echo.rss_mib()];

    let [kernel_lat, echo_lat] = latency.map(|mut v| {
        v.sort_unstable();
        v
    });
    let [kernel_tput, echo_tput] = throughput.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (k50, e50) = (
        us(percentile(&kernel_lat, 0.50)),
        us(percentile(&echo_lat, 0.50)),
    );
    let (k99, e99) = (
        us(percentile(&kernel_lat, 0.99)),
        us(percentile(&echo_lat, 0.99)),
    );

    println!(
        "bench-ipc: NOOP with {} payload bytes; {} round trips per server in {} interleaved rounds; \
         throughput {} clients x {} in flight, median of 3 x {:.1}s runs",
        args.payload,
        args.rounds * args.per_round,
        args.rounds,
        args.clients,
        args.depth,
        args.seconds
    );
    println!();
    println!(
        "{:<26} {:>12} {:>12} {:>8}   target",
        "", kernel.name, echo.name, "ratio"
    );
    println!(
        "{:<26} {:>12.1} {:>12.1} {:>7.2}x   <= 1.25x  {}",
        "latency p50 (us)",
        k50,
        e50,
        k50 / e50,
        verdict(k50 / e50 <= 1.25)
    );
    println!(
        "{:<26} {:>12.1} {:>12.1} {:>7.2}x",
        "latency p99 (us)",
        k99,
        e99,
        k99 / e99
    );
    println!(
        "{:<26} {:>12.0} {:>12.0} {:>7.2}x   >= 0.80x  {}",
        "throughput (req/s)",
        kernel_tput,
        echo_tput,
        kernel_tput / echo_tput,
        verdict(kernel_tput / echo_tput >= 0.8)
    );
    println!(
        "{:<26} {:>12.1} {:>12} {:>8}   <= 15 MB  {}",
        "idle RSS (MiB)",
        idle_rss,
        "",
        "",
        verdict(idle_rss <= 15.0)
    );
    println!(
        "{:<26} {:>12.1} {:>12}",
        "RSS after load (MiB)", loaded_rss, ""
    );
    println!(
        "{:<26} {:>12.1} {:>12.1}",
        format!("RSS with {CROWD} clients"),
        crowd_rss[0],
        crowd_rss[1]
    );
    let growth = after_crowd[0] - idle_rss;
    println!(
        "{:<26} {:>12.1} {:>12.1} {:>7.2}x   <= idle + 2 MiB  {}",
        "RSS idle after (MiB)",
        after_crowd[0],
        after_crowd[1],
        after_crowd[0] / idle_rss,
        verdict(growth <= 2.0)
    );
    Ok(())
}

/// Clients in the crowd.
const CROWD: usize = 1000;

/// `clients` connections, each sending one NOOP and reading its reply;
/// returns the server's RSS while they are all connected, then closes them.
fn crowd(server: &Server, clients: usize, payload: usize) -> anyhow::Result<f64> {
    let frame = encode_frame(Opcode::NOOP, 0, &vec![0x42u8; payload]);
    let mut reply = vec![0u8; HEADER_LEN + payload];
    let mut streams = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut stream = UnixStream::connect(&server.socket)?;
        stream.write_all(&frame)?;
        streams.push(stream);
    }
    for stream in &mut streams {
        stream.read_exact(&mut reply)?;
    }
    Ok(server.rss_mib())
}

/// Raises this process's open-files limit to its hard limit (a crowd needs
/// a descriptor per client).
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Server order for a round: alternate who goes first.
fn alternate(round: usize) -> [usize; 2] {
    if round % 2 == 0 {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Sequential NOOP round trips on one connection, timing each.
fn round_trips(socket: &Path, count: usize, payload: usize) -> anyhow::Result<Vec<Duration>> {
    let mut stream = UnixStream::connect(socket)?;
    let frame = encode_frame(Opcode::NOOP, 0, &vec![0x42u8; payload]);
    let mut reply = vec![0u8; HEADER_LEN + payload];
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        stream.write_all(&frame)?;
        stream.read_exact(&mut reply)?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// `clients` connections each keeping `depth` NOOPs in flight for
/// `duration`; returns replies per second over all of them.
fn pipelined(
    socket: &Path,
    clients: usize,
    depth: usize,
    duration: Duration,
    payload: usize,
) -> anyhow::Result<f64> {
    let frame = encode_frame(Opcode::NOOP, 0, &vec![0x42u8; payload]);
    let start = Instant::now();
    let deadline = start + duration;
    let counts = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|_| scope.spawn(|| keep_in_flight(socket, &frame, depth, deadline)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
            })
            .collect::<anyhow::Result<Vec<u64>>>()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64())
}

/// One connection with `depth` requests in flight: every reply that comes
/// back is replaced by a new request until the deadline, then the rest are
/// drained. Replies are as long as requests, so whole frames are counted
/// by length.
fn keep_in_flight(
    socket: &Path,
    frame: &[u8],
    depth: usize,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let mut stream = UnixStream::connect(socket)?;
    let mut out = Vec::with_capacity(frame.len() * depth);
    for _ in 0..depth {
        out.extend_from_slice(frame);
    }
    stream.write_all(&out)?;
    let mut in_flight = depth;
    let mut done = 0u64;
    let mut partial = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while in_flight > 0 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            bail!("server closed the connection");
        }
        partial += n;
        let complete = partial / frame.len();
        partial %= frame.len();
        done += complete as u64;
        in_flight -= complete;
        if complete > 0 && Instant::now() < deadline {
            out.clear();
            for _ in 0..complete {
                out.extend_from_slice(frame);
            }
            stream.write_all(&out)?;
            in_flight += complete;
        }
    }
    Ok(done)
}
