//! `agentos hello`, `ping` and `metrics`: the kernel itself.

use std::path::Path;
use std::time::{Duration, Instant};

use agentos_proto::payload::MetricsReply;
use agentos_proto::{Client, Opcode};
use serde::Serialize;

use crate::error::CliError;
use crate::failure::usage;
use crate::format::print_json;

pub fn hello(client: &mut Client, json: bool) -> Result<(), CliError> {
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

/// `ping --json`: the round trips' figures, in microseconds.
#[derive(Debug, Serialize)]
struct PingFigures<'a> {
    count: usize,
    size: usize,
    socket: &'a Path,
    p50_us: f64,
    p99_us: f64,
    min_us: f64,
    max_us: f64,
}

pub fn ping(
    client: &mut Client,
    path: &Path,
    count: usize,
    size: usize,
    json: bool,
) -> Result<(), CliError> {
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
            return Err(CliError::AlteredEcho {
                index: i,
                len: echoed.len(),
            });
        }
    }
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    if json {
        let us = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
        return print_json(&PingFigures {
            count,
            size,
            socket: path,
            p50_us: us(pct(0.50)),
            p99_us: us(pct(0.99)),
            min_us: us(samples[0]),
            max_us: us(samples[samples.len() - 1]),
        });
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

/// `agentos metrics`: the text as it is (its JSON reply with --json).
pub fn metrics(client: &mut Client, json: bool) -> Result<(), CliError> {
    let reply: MetricsReply = client.call_json(Opcode::METRICS, b"")?;
    if json {
        print_json(&reply)
    } else {
        print!("{}", reply.text);
        Ok(())
    }
}
