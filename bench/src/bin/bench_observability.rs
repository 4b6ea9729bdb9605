//! `bench-observability`: what metrics and tracing cost. Two kernels run
//! side by side, one plain and one with `[metrics] listen` and
//! `[tracing] otlp_endpoint` (pointing at a sink in this program that
//! answers every export at once); NOOP round trips and EXEC `print(1)`
//! are timed on both in many short alternating rounds, and their p50s
//! and p99s are set side by side, with the median of the rounds' own
//! on/off ratios. Then 1000
//! agents are spawned on the observed kernel and `GET /metrics` is timed.
//! Prints figures and ratios; asserts nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_bench::wire::{read_reply, Run, Spawn};
use agentos_bench::{percentile, sibling, start_agentosd_with, verdict, Server};
use agentos_primitives::threads;
use agentos_proto::payload::{ExecReply, KillReply, KillRequest, SpawnReply};
use agentos_proto::{Client, Opcode};
use anyhow::{anyhow, bail, Context};
use clap::Parser;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Benchmark the kernel with metrics and tracing on against it with them off.
#[derive(Debug, Parser)]
#[command(name = "bench-observability")]
struct Args {
    /// agentosd binary [default: next to this program]
    #[arg(long)]
    agentosd: Option<PathBuf>,
    /// Alternating rounds
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// NOOP round trips per round and kernel
    #[arg(long, default_value_t = 200)]
    noops: usize,
    /// EXEC runs per round and kernel
    #[arg(long, default_value_t = 10)]
    execs: usize,
    /// Pause before each EXEC, as bench-exec makes (the steady state of
    /// code run now and then)
    #[arg(long, default_value_t = 5)]
    pause_ms: u64,
    /// Agents alive while /metrics is scraped
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Timed scrapes of /metrics
    #[arg(long, default_value_t = 200)]
    scrapes: usize,
    /// Both kernels plain, to see how far apart two like kernels measure
    /// on this machine (no scrape test then)
    #[arg(long)]
    control: bool,
}

/// The largest difference, on vs off, the issue accepts.
const TARGET_RATIO: f64 = 1.03;
const NOOP_PAYLOAD: [u8; 64] = [0x42; 64];
/// The run timed: a fresh run of `print(1)`, as bench-exec times it.
const CODE: Run<'static> = Run::python("print(1)");
/// How many SPAWNs (and KILLs) are in flight on the connection at once.
const SPAWN_WINDOW: usize = 32;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("bench-observability needs root: EXEC's isolation does");
    }
    if args.rounds == 0 || args.noops == 0 || args.execs == 0 || args.scrapes == 0 {
        bail!("--rounds, --noops, --execs and --scrapes must be at least 1");
    }
    let agentosd = args.agentosd.clone().unwrap_or(sibling("agentosd")?);
    let sink = Sink::start()?;
    let metrics_at = free_port()?;
    // Both kernels take the same settings but for observability, and
    // room for the agents of the scrape test.
    let plain = format!(
        "[llm]\nprovider = \"none\"\n[agents]\nmax_agents = {}\n",
        args.agents.max(1024)
    );
    let observed = if args.control {
        plain.clone()
    } else {
        format!(
            "{plain}[metrics]\nlisten = \"{metrics_at}\"\n\
             [tracing]\notlp_endpoint = \"http://{}\"\n",
            sink.address
        )
    };
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let kernels = [
        start_agentosd_with(&agentosd, dirs[0].path(), &plain)?,
        start_agentosd_with(&agentosd, dirs[1].path(), &observed)?,
    ];
    let mut clients = [connect(&kernels[0])?, connect(&kernels[1])?];
    for (client, dir) in clients.iter_mut().zip(&dirs) {
        warm_up(client, dir.path())?;
    }

    // Many short rounds, alternating which kernel goes first, so drift
    // on the host (these machines are shared) touches both alike.
    let pause = Duration::from_millis(args.pause_ms);
    let mut noops: [Vec<Vec<Duration>>; 2] = Default::default();
    let mut execs: [Vec<Vec<Duration>>; 2] = Default::default();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let mut samples = Vec::with_capacity(args.noops);
            for _ in 0..args.noops {
                samples.push(noop(&mut clients[side])?);
            }
            noops[side].push(samples);
        }
        for side in order {
            let mut samples = Vec::with_capacity(args.execs);
            for _ in 0..args.execs {
                std::thread::sleep(pause);
                samples.push(exec(&mut clients[side])?);
            }
            execs[side].push(samples);
        }
    }

    let kernels_measured = if args.control {
        "two plain kernels (a control: \"on\" is plain too)"
    } else {
        "one kernel plain, one with [metrics] listen and [tracing] otlp_endpoint (a sink in \
         this program answering 200 at once)"
    };
    println!(
        "bench-observability: {kernels_measured}, side by side; \
         {} alternating rounds of {} NOOPs ({}-byte payload) and {} EXEC print(1) runs \
         {} ms apart on each",
        args.rounds,
        args.noops,
        NOOP_PAYLOAD.len(),
        args.execs,
        args.pause_ms
    );
    println!(
        "p50, p99: of all {} NOOPs and {} runs of a side",
        args.rounds * args.noops,
        args.rounds * args.execs
    );
    println!();
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11}",
        "", "p50 off", "p50 on", "p99 off", "p99 on", "p50 on/off", "p99 on/off"
    );
    let mut met = Vec::new();
    for (label, unit, series) in [
        ("NOOP", Unit::Micros, &noops),
        ("EXEC print(1), warm", Unit::Millis, &execs),
    ] {
        let [off, on] = [summary(&series[0]), summary(&series[1])];
        let (r50, r99) = (on.p50 / off.p50, on.p99 / off.p99);
        println!(
            "{label:<22} {:>10} {:>10} {:>10} {:>10} {:>10.3}x {:>10.3}x",
            unit.show(off.p50),
            unit.show(on.p50),
            unit.show(off.p99),
            unit.show(on.p99),
            r50,
            r99
        );
        met.push(format!(
            "{label} p50 {}, p99 {}",
            verdict(r50 <= TARGET_RATIO),
            verdict(r99 <= TARGET_RATIO)
        ));
    }
    if !args.control {
        println!("target: on within 3% of off -- {}", met.join("; "));
    }
    // A round's two sides ran moments apart, so their ratio is the least
    // touched by the host's drift.
    for (label, series) in [("NOOP", &noops), ("EXEC", &execs)] {
        let mut ratios: Vec<f64> = series[0]
            .iter()
            .zip(&series[1])
            .map(|(off, on)| quantile(on, 0.5) / quantile(off, 0.5))
            .collect();
        ratios.sort_unstable_by(f64::total_cmp);
        let at = |p: f64| ratios[((ratios.len() - 1) as f64 * p).round() as usize];
        println!(
            "  {label} p50 on/off round by round: median {:.3}x, middle half {:.3}x to {:.3}x",
            at(0.5),
            at(0.25),
            at(0.75)
        );
    }
    if args.control {
        println!("control: both kernels were plain; the ratios show this machine's noise");
        return Ok(());
    }
    // Tracing was really on: the observed kernel's runs reached the sink
    // (within the exporter's one-second flush), and its own counter says so.
    let spans_expected = (args.rounds * args.execs + WARM_UP_EXECS) as u64;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sink.spans.load(Ordering::Relaxed) < spans_expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1100));
    let (_, text) = scrape(metrics_at)?;
    let exported = metric(&text, "agentos_trace_spans_total{outcome=\"exported\"}");
    let dropped = metric(&text, "agentos_trace_spans_total{outcome=\"dropped\"}");
    let runs_counted = metric(&text, "agentos_exec_runs_total");

    println!(
        "tracing on: the sink took {} spans in {} requests ({} bytes); the kernel counts \
         {exported} exported, {dropped} dropped, {runs_counted} EXEC runs (/metrics)",
        sink.spans.load(Ordering::Relaxed),
        sink.requests.load(Ordering::Relaxed),
        sink.bytes.load(Ordering::Relaxed),
    );

    // The plain kernel is done; the scrape test has the machine to itself
    // but for the observed kernel and its agents.
    drop(clients);
    let [off_kernel, on_kernel] = kernels;
    off_kernel.stop();
    scrape_with_agents(&args, &on_kernel, metrics_at)?;
    on_kernel.stop();
    Ok(())
}

/// Untimed EXECs on each kernel before the rounds.
const WARM_UP_EXECS: usize = 20;

fn connect(kernel: &Server) -> anyhow::Result<Client> {
    let client = Client::connect(&kernel.socket)?;
    client.set_timeout(Some(Duration::from_secs(30)))?;
    Ok(client)
}

/// Waits for the kernel's EXEC host (it comes up in the background), then
/// runs untimed NOOPs and EXECs.
fn warm_up(client: &mut Client, dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while exec(client).is_err() {
        if Instant::now() > deadline {
            bail!("EXEC never answered; see {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..2000 {
        noop(client)?;
    }
    for _ in 1..WARM_UP_EXECS {
        std::thread::sleep(Duration::from_millis(5));
        exec(client)?;
    }
    Ok(())
}

/// One NOOP, timed around the call alone.
fn noop(client: &mut Client) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let reply = client.call(Opcode::NOOP, &NOOP_PAYLOAD)?;
    let took = start.elapsed();
    if reply.payload != NOOP_PAYLOAD {
        bail!("the reply is not the payload echoed");
    }
    Ok(took)
}

/// One EXEC of `print(1)`; how long until its reply.
fn exec(client: &mut Client) -> anyhow::Result<Duration> {
    let request = serde_json::to_vec(&CODE)?;
    let start = Instant::now();
    let reply = client.call(Opcode::EXEC, &request)?;
    let took = start.elapsed();
    read_reply(&reply.payload, |r: &ExecReply| r.stdout == "1\n")
        .map_err(|reply| anyhow!("EXEC failed: {reply}"))?;
    Ok(took)
}

/// A side's figures in seconds.
struct Summary {
    p50: f64,
    p99: f64,
}

/// The p50 and p99 of all the rounds' samples together.
fn summary(rounds: &[Vec<Duration>]) -> Summary {
    let all: Vec<Duration> = rounds.iter().flatten().copied().collect();
    Summary {
        p50: quantile(&all, 0.5),
        p99: quantile(&all, 0.99),
    }
}

/// The `p` quantile of unsorted samples, in seconds.
fn quantile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    percentile(&sorted, p).as_secs_f64()
}

#[derive(Clone, Copy)]
enum Unit {
    Micros,
    Millis,
}

impl Unit {
    fn show(self, seconds: f64) -> String {
        match self {
            Unit::Micros => format!("{:.1} µs", seconds * 1e6),
            Unit::Millis => format!("{:.3} ms", seconds * 1e3),
        }
    }
}

/// Spawns `args.agents` idle agents on `kernel`, waits until its metrics
/// count them, times `args.scrapes` scrapes of `/metrics`, and kills the
/// agents again.
fn scrape_with_agents(args: &Args, kernel: &Server, metrics_at: SocketAddr) -> anyhow::Result<()> {
    let mut client = connect(kernel)?;
    // Sandboxed (the default shape, which the warm pool prepares): an
    // unsandboxed agent's workload outlives its KILL (and the kernel),
    // where a sandboxed one ends with its PID namespace and cgroup.
    let started = Instant::now();
    let spawned = pipelined(
        &mut client,
        Opcode::SPAWN,
        args.agents,
        |i| Spawn::command(format!("idle-{i}"), &["/bin/sleep", "3600"]),
        |r: &SpawnReply| r.success,
    )?;
    let spawn_time = started.elapsed();
    if spawned < args.agents {
        bail!("only {spawned} of {} agents started", args.agents);
    }
    // The snapshot behind /metrics is taken once a second.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (_, text) = scrape(metrics_at)?;
        if metric(&text, "agentos_agents{state=\"running\"}") >= args.agents as f64 {
            break text;
        }
        if Instant::now() > deadline {
            bail!("/metrics never counted {} agents", args.agents);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut times = Vec::with_capacity(args.scrapes);
    let mut sizes = Vec::with_capacity(args.scrapes);
    for _ in 0..args.scrapes {
        let (took, text) = scrape(metrics_at)?;
        times.push(took);
        sizes.push(text.len());
    }
    times.sort_unstable();
    let series = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();

    let started = Instant::now();
    let killed = pipelined(
        &mut client,
        Opcode::KILL,
        args.agents,
        |i| KillRequest {
            name: Some(format!("idle-{i}")),
            grace_ms: Some(0),
            ..KillRequest::default()
        },
        |r: &KillReply| r.success,
    )?;
    let kill_time = started.elapsed();

    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!();
    println!(
        "scrape: {} GET /metrics over TCP (connect to end of answer) with {} agents alive \
         (running, by the metrics; spawned sandboxed in {:.1} s, {killed} killed \
         in {:.1} s after)",
        args.scrapes,
        args.agents,
        spawn_time.as_secs_f64(),
        kill_time.as_secs_f64()
    );
    println!(
        "  p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs; {} bytes, {series} series",
        us(percentile(&times, 0.5)),
        us(percentile(&times, 0.99)),
        us(percentile(&times, 1.0)),
        sizes.iter().max().copied().unwrap_or_default()
    );
    Ok(())
}

/// Sends `count` requests built by `request`, at most [`SPAWN_WINDOW`] in
/// flight, and reads every reply as `T`; how many `succeeded` says did.
fn pipelined<R: Serialize, T: DeserializeOwned>(
    client: &mut Client,
    opcode: Opcode,
    count: usize,
    request: impl Fn(usize) -> R,
    succeeded: impl Fn(&T) -> bool,
) -> anyhow::Result<usize> {
    let (mut sent, mut answered, mut ok) = (0, 0, 0);
    let mut first_failure = None;
    while answered < count {
        while sent < count && sent - answered < SPAWN_WINDOW {
            client.send(opcode, &serde_json::to_vec(&request(sent))?)?;
            sent += 1;
        }
        let reply = client.recv()?;
        answered += 1;
        match read_reply(&reply.payload, &succeeded) {
            Ok(_) => ok += 1,
            Err(failure) => {
                first_failure.get_or_insert(failure);
            }
        }
    }
    if let Some(reply) = first_failure {
        eprintln!("bench-observability: {opcode:?} failed: {reply}");
    }
    Ok(ok)
}

/// A free TCP port on loopback (free when asked; nothing else here binds).
fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// One `GET /metrics`, timed from connect to the end of the answer
/// (the kernel closes each connection); its body.
fn scrape(address: SocketAddr) -> anyhow::Result<(Duration, String)> {
    let start = Instant::now();
    let mut stream =
        TcpStream::connect(address).with_context(|| format!("cannot connect to {address}"))?;
    stream.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n").as_bytes())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let took = start.elapsed();
    let answer = String::from_utf8(answer)?;
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        bail!("not an HTTP answer: {answer:?}");
    };
    if !head.starts_with("HTTP/1.1 200 ") {
        bail!("GET /metrics: {head}");
    }
    Ok((took, body.to_owned()))
}

/// The sum of the samples of `series` in Prometheus text: a metric name
/// (every label set) or one name with its labels.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            let matches = name == series
                || (!series.contains('{')
                    && name
                        .strip_prefix(series)
                        .is_some_and(|r| r.starts_with('{')));
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        // An empty f64 sum is -0.
        .fold(0.0, |sum, value| sum + value)
}

/// An OTLP/HTTP trace receiver on loopback that answers every export 200
/// at once, counting what it got: requests, bytes and spans.
struct Sink {
    address: SocketAddr,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    spans: Arc<AtomicU64>,
}

impl Sink {
    /// Serves on a port of its own from a thread per connection, until
    /// the program ends.
    fn start() -> anyhow::Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let sink = Sink {
            address: listener.local_addr()?,
            requests: Arc::default(),
            bytes: Arc::default(),
            spans: Arc::default(),
        };
        let counts = [&sink.requests, &sink.bytes, &sink.spans].map(Arc::clone);
        threads::spawn("otlp-sink", move || {
            for stream in listener.incoming().flatten() {
                let counts = counts.clone();
                std::thread::spawn(move || {
                    let _ = receive(stream, &counts);
                });
            }
        })?;
        Ok(sink)
    }
}

/// Answers the exports on one keep-alive connection until it closes;
/// `counts` are requests, bytes and spans.
fn receive(mut stream: TcpStream, counts: &[Arc<AtomicU64>; 3]) -> anyhow::Result<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse())
            .transpose()?
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        let body = &buffer[head_end..head_end + length];
        counts[0].fetch_add(1, Ordering::Relaxed);
        counts[1].fetch_add(length as u64, Ordering::Relaxed);
        counts[2].fetch_add(count_spans(body).unwrap_or(0), Ordering::Relaxed);
        // An empty ExportTraceServiceResponse: everything accepted.
        stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
        )?;
        buffer.drain(..head_end + length);
    }
}

/// The spans in an OTLP `ExportTraceServiceRequest`: its `resource_spans`
/// (field 1), their `scope_spans` (2), and theirs `spans` (2), walked in
/// the protobuf wire format without decoding anything else.
fn count_spans(request: &[u8]) -> Option<u64> {
    let mut count = 0;
    for resource in embedded(request, 1)? {
        for scope in embedded(resource, 2)? {
            count += embedded(scope, 2)?.len() as u64;
        }
    }
    Some(count)
}

/// The length-delimited fields numbered `field` of a protobuf message.
fn embedded(message: &[u8], field: u64) -> Option<Vec<&[u8]>> {
    let mut found = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        match key & 7 {
            0 => {
                varint(message, &mut at)?;
            }
            1 => at += 8,
            2 => {
                let length = usize::try_from(varint(message, &mut at)?).ok()?;
                let value = message.get(at..at.checked_add(length)?)?;
                if key >> 3 == field {
                    found.push(value);
                }
                at += length;
            }
            5 => at += 4,
            _ => return None,
        }
    }
    (at == message.len()).then_some(found)
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_counted_through_resource_and_scope() {
        // resource_spans { resource {} scope_spans { scope {} spans {x} spans {y} } }
        let scope_spans = [0x0a, 0x00, 0x12, 0x01, 0x08, 0x12, 0x02, 0x08, 0x01];
        let mut resource_spans = vec![0x0a, 0x00, 0x12, scope_spans.len() as u8];
        resource_spans.extend_from_slice(&scope_spans);
        let mut request = vec![0x0a, resource_spans.len() as u8];
        request.extend_from_slice(&resource_spans);
        assert_eq!(count_spans(&request), Some(2));
        assert_eq!(count_spans(&request[..request.len() - 1]), None);
    }

    #[test]
    fn a_metric_is_summed_over_its_labels_or_read_for_one() {
        let text = "# TYPE agentos_agents gauge\nagentos_agents{state=\"running\"} 3\n\
                    agentos_agents{state=\"exited\"} 1\nagentos_agents_other 7\n";
        assert_eq!(metric(text, "agentos_agents"), 4.0);
        assert_eq!(metric(text, "agentos_agents{state=\"exited\"}"), 1.0);
    }
}
