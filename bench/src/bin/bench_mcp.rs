//! `bench-mcp`: `exec print(1)` through `agentos mcp` over stdio, driven
//! by a lean client here (JSON-RPC lines on the server's stdin), against
//! the same EXEC through the Rust client, interleaved in the same run on
//! the same daemon; and an MCP `ping`, which reaches the server and not
//! the kernel (the floor of the stdio round trip). Also the size of the
//! server's tools/list. Prints figures and ratios; asserts nothing.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use agentos_bench::wire::{read_reply, Run};
use agentos_bench::{percentile, sibling, start_agentosd, verdict};
use agentos_proto::payload::{ExecReply, HelloReply};
use agentos_proto::{Client, Opcode};
use anyhow::{anyhow, bail, Context};
use clap::Parser;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Benchmark `agentos mcp` against the Rust client.
#[derive(Debug, Parser)]
#[command(name = "bench-mcp")]
struct Args {
    /// agentosd binary [default: next to this program]
    #[arg(long)]
    agentosd: Option<PathBuf>,
    /// agentos binary [default: next to this program]
    #[arg(long)]
    agentos: Option<PathBuf>,
    /// EXECs measured each way
    #[arg(long, default_value_t = 1000)]
    runs: usize,
    /// Pause before each measured EXEC, so the host has prepared the next
    /// run (as bench-exec does)
    #[arg(long, default_value_t = 5)]
    pause_ms: u64,
}

/// The run timed each way.
const CODE: Run<'static> = Run::python("print(1)");

/// A JSON-RPC 2.0 request.
#[derive(Serialize)]
struct Request<'a, P> {
    jsonrpc: &'static str,
    id: u64,
    method: &'a str,
    params: P,
}

/// A JSON-RPC 2.0 notification (no answer comes).
#[derive(Serialize)]
struct Notification<'a> {
    jsonrpc: &'static str,
    method: &'a str,
}

/// A line the server writes: the response to a request (its `id`, and
/// `result` or `error`), or a notification of its own (no `id`).
#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<RpcError>,
}

/// A JSON-RPC error.
#[derive(Deserialize)]
struct RpcError {
    code: i64,
    message: String,
}

/// Parameters or arguments that are an empty object.
#[derive(Serialize)]
struct Empty {}

/// `initialize`'s parameters.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Initialize {
    protocol_version: &'static str,
    capabilities: Empty,
    client_info: ClientInfo,
}

/// Who the client is.
#[derive(Serialize)]
struct ClientInfo {
    name: &'static str,
    version: &'static str,
}

/// `tools/call`'s parameters.
#[derive(Serialize)]
struct ToolCall<A> {
    name: &'static str,
    arguments: A,
}

/// The `exec` tool's arguments.
#[derive(Serialize)]
struct ExecArguments {
    code: &'static str,
}

/// A tool's result, by the part a benchmark reads: its structured content.
#[derive(Deserialize)]
struct ToolResult<C> {
    #[serde(rename = "structuredContent")]
    structured_content: C,
}

/// What `exec` printed.
#[derive(Deserialize)]
struct Printed {
    stdout: String,
}

/// What `status` says of the kernel.
#[derive(Deserialize)]
struct KernelStatus {
    kernel_version: String,
}

/// `tools/list`'s result, by its number of tools.
#[derive(Deserialize)]
struct ToolList {
    tools: Vec<serde::de::IgnoredAny>,
}

/// `value` read as `T`, if it is one.
fn read_as<T: DeserializeOwned>(value: &Value) -> Option<T> {
    T::deserialize(value).ok()
}

/// How many bytes make a token, roughly, for English and JSON: the usual
/// approximation (no tokenizer of the model that reads the list is at
/// hand offline).
const BYTES_PER_TOKEN: f64 = 4.0;

/// `agentos mcp` as a child, spoken to in JSON-RPC lines.
struct McpServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    line: String,
}

impl McpServer {
    fn start(agentos: &std::path::Path, socket: &std::path::Path) -> anyhow::Result<McpServer> {
        let mut child = Command::new(agentos)
            .arg("--socket")
            .arg(socket)
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start agentos mcp")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut server = McpServer {
            child,
            stdin,
            stdout,
            next_id: 0,
            line: String::new(),
        };
        server.call(
            "initialize",
            Initialize {
                protocol_version: "2025-11-25",
                capabilities: Empty {},
                client_info: ClientInfo {
                    name: "bench-mcp",
                    version: "1",
                },
            },
        )?;
        server.send(&Notification {
            jsonrpc: "2.0",
            method: "notifications/initialized",
        })?;
        Ok(server)
    }

    fn send(&mut self, message: &impl Serialize) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.stdin.write_all(&line)?;
        self.stdin.flush()?;
        Ok(())
    }

    /// Sends a request and reads lines until its response; the response's
    /// `result` and the bytes of the line that carried it.
    fn call(&mut self, method: &str, params: impl Serialize) -> anyhow::Result<(Value, usize)> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&Request {
            jsonrpc: "2.0",
            id,
            method,
            params,
        })?;
        loop {
            self.line.clear();
            if self.stdout.read_line(&mut self.line)? == 0 {
                bail!("agentos mcp closed its stdout");
            }
            let message: Response = serde_json::from_str(&self.line)?;
            if message.id != Some(Value::from(id)) {
                continue;
            }
            if let Some(error) = message.error {
                bail!("{method} failed: {} (code {})", error.message, error.code);
            }
            return Ok((message.result.unwrap_or_default(), self.line.len()));
        }
    }

    fn exec(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let (result, _) = self.call(
            "tools/call",
            ToolCall {
                name: "exec",
                arguments: ExecArguments { code: CODE.code },
            },
        )?;
        let took = start.elapsed();
        let printed = read_as::<ToolResult<Printed>>(&result);
        if printed.is_none_or(|p| p.structured_content.stdout != "1\n") {
            bail!("exec through agentos mcp failed: {result}");
        }
        Ok(took)
    }

    fn status(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let (result, _) = self.call(
            "tools/call",
            ToolCall {
                name: "status",
                arguments: Empty {},
            },
        )?;
        let took = start.elapsed();
        let status = read_as::<ToolResult<KernelStatus>>(&result);
        if status.is_none_or(|s| s.structured_content.kernel_version.is_empty()) {
            bail!("status through agentos mcp failed: {result}");
        }
        Ok(took)
    }

    fn ping(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        self.call("ping", Empty {})?;
        Ok(start.elapsed())
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        // It holds no state the kernel keeps: ending it abruptly is safe.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One EXEC `print(1)` through the Rust client; how long until its reply.
fn exec_direct(client: &mut Client) -> anyhow::Result<Duration> {
    let request = serde_json::to_vec(&CODE)?;
    exec_timed_from(Instant::now(), client, &request)
}

/// The same on a connection of its own, as `agentos mcp` makes one per
/// call: the cost of connecting and being identified, on top.
fn exec_on_new_connection(socket: &std::path::Path) -> anyhow::Result<Duration> {
    let request = serde_json::to_vec(&CODE)?;
    let start = Instant::now();
    let mut client = Client::connect(socket)?;
    client.set_timeout(Some(Duration::from_secs(30)))?;
    exec_timed_from(start, &mut client, &request)
}

/// Sends the EXEC `request` of `print(1)` on `client`; the time from
/// `start` to its reply, once the reply is checked.
fn exec_timed_from(
    start: Instant,
    client: &mut Client,
    request: &[u8],
) -> anyhow::Result<Duration> {
    let reply = client.call(Opcode::EXEC, request)?;
    let took = start.elapsed();
    read_reply(&reply.payload, |r: &ExecReply| r.stdout == "1\n")
        .map_err(|reply| anyhow!("EXEC failed: {reply}"))?;
    Ok(took)
}

/// HELLO on a connection of its own, as `status` through `agentos mcp`
/// sends it: a request the kernel answers at once.
fn hello_on_new_connection(socket: &std::path::Path) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut client = Client::connect(socket)?;
    client.set_timeout(Some(Duration::from_secs(30)))?;
    let reply = client.call(Opcode::HELLO, b"")?;
    let took = start.elapsed();
    read_reply(&reply.payload, |r: &HelloReply| r.success)
        .map_err(|reply| anyhow!("HELLO failed: {reply}"))?;
    Ok(took)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("bench-mcp needs root: EXEC's isolation does");
    }
    let agentosd = args.agentosd.clone().unwrap_or(sibling("agentosd")?);
    let agentos = args.agentos.clone().unwrap_or(sibling("agentos")?);
    let dir = tempfile::tempdir()?;
    let kernel = start_agentosd(&agentosd, dir.path())?;
    let mut client = Client::connect(&kernel.socket)?;
    client.set_timeout(Some(Duration::from_secs(30)))?;
    // The host comes up in the background: wait for its first run.
    let deadline = Instant::now() + Duration::from_secs(20);
    while exec_direct(&mut client).is_err() {
        if Instant::now() > deadline {
            bail!("EXEC never answered; see {}", dir.path().display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut mcp = McpServer::start(&agentos, &kernel.socket)?;
    let (tools, tools_line_bytes) = mcp.call("tools/list", Empty {})?;
    let tool_count = read_as::<ToolList>(&tools).map_or(0, |list| list.tools.len());
    let tools_bytes = serde_json::to_vec(&tools)?.len();

    // Warm both paths (the server's runtime and threads, the pool).
    for _ in 0..50 {
        exec_direct(&mut client)?;
        mcp.exec()?;
    }
    // Interleaved, so both see the same machine.
    let pause = Duration::from_millis(args.pause_ms);
    let mut direct = Vec::with_capacity(args.runs);
    let mut through_mcp = Vec::with_capacity(args.runs);
    let mut ping = Vec::with_capacity(args.runs);
    let mut connecting = Vec::with_capacity(args.runs);
    let mut hello = Vec::with_capacity(args.runs);
    let mut status = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        std::thread::sleep(pause);
        direct.push(exec_direct(&mut client)?);
        std::thread::sleep(pause);
        connecting.push(exec_on_new_connection(&kernel.socket)?);
        std::thread::sleep(pause);
        through_mcp.push(mcp.exec()?);
        std::thread::sleep(pause);
        ping.push(mcp.ping()?);
        std::thread::sleep(pause);
        hello.push(hello_on_new_connection(&kernel.socket)?);
        std::thread::sleep(pause);
        status.push(mcp.status()?);
    }
    for series in [
        &mut direct,
        &mut connecting,
        &mut through_mcp,
        &mut ping,
        &mut hello,
        &mut status,
    ] {
        series.sort_unstable();
    }

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "bench-mcp: exec print(1) through agentos mcp over stdio (a lean JSON-RPC client) \
         against EXEC print(1) through the Rust client, {} of each interleaved {} ms apart, \
         one agentosd",
        args.runs, args.pause_ms
    );
    println!();
    println!(
        "{:<40} {:>9} {:>9} {:>14}",
        "", "p50 ms", "p99 ms", "p50 vs direct"
    );
    let direct_p50 = percentile(&direct, 0.5);
    for (label, samples) in [
        ("EXEC print(1), Rust client (baseline)", &direct),
        ("the same, a new connection each", &connecting),
        ("exec print(1) through agentos mcp", &through_mcp),
        ("MCP ping (server only, no kernel)", &ping),
        ("HELLO, a new connection each", &hello),
        ("status (HELLO) through agentos mcp", &status),
    ] {
        let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
        println!(
            "{label:<40} {:>9.3} {:>9.3} {:>13.2}x",
            ms(p50),
            ms(p99),
            ms(p50) / ms(direct_p50)
        );
    }
    let overhead_p50 = percentile(&through_mcp, 0.5).saturating_sub(direct_p50);
    let overhead_p99 = percentile(&through_mcp, 0.99).saturating_sub(percentile(&direct, 0.99));
    println!();
    println!(
        "overhead of agentos mcp: p50 {:.3} ms, p99 {:.3} ms; target p50 <= 0.3 ms {}",
        ms(overhead_p50),
        ms(overhead_p99),
        verdict(overhead_p50 <= Duration::from_micros(300))
    );
    println!(
        "tools/list: {tool_count} tools, {tools_bytes} bytes of JSON ({tools_line_bytes} with \
         the JSON-RPC envelope), about {:.0} tokens (bytes / {BYTES_PER_TOKEN})",
        tools_bytes as f64 / BYTES_PER_TOKEN
    );
    drop(mcp);
    drop(client);
    kernel.stop();
    Ok(())
}
