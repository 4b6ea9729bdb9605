//! `bench-tasks`: TASK's figures — dispatch to running, cancel to nothing
//! left, trivial EXEC tasks dispatched and completed per second against
//! the same runs as plain EXEC requests in the same run (the baseline), and
//! the kernel's memory after ten thousand finished tasks. Prints figures
//! and ratios; asserts nothing.

use std::time::{Duration, Instant};

use agentos_bench::{percentile, sibling, start_agentosd};
use agentos_proto::{Client, Opcode};
use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Value};

/// Benchmark TASK.
#[derive(Debug, Parser)]
#[command(name = "bench-tasks")]
struct Args {
    /// agentosd binary [default: next to this program]
    #[arg(long)]
    agentosd: Option<std::path::PathBuf>,
    /// Tasks whose start and cancel are timed
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Trivial EXEC tasks (and as many plain EXEC runs) for the throughput
    #[arg(long, default_value_t = 400)]
    tasks: usize,
    /// Finished tasks kept for the memory figure
    #[arg(long, default_value_t = 10_000)]
    retained: usize,
}

fn call(client: &mut Client, body: Value) -> anyhow::Result<Value> {
    let reply = client.call(Opcode::TASK, &serde_json::to_vec(&body)?)?;
    let value: Value = serde_json::from_slice(&reply.payload)?;
    if value["success"] != true {
        bail!("TASK {body} failed: {value}");
    }
    Ok(value)
}

fn dispatch(client: &mut Client, code: &str) -> anyhow::Result<String> {
    let reply = call(
        client,
        json!({"op": "dispatch", "kind": "exec", "request": {"code": code, "timeout_ms": 120_000}}),
    )?;
    Ok(reply["task_id"].as_str().context("no task_id")?.to_owned())
}

fn state(client: &mut Client, id: &str) -> anyhow::Result<String> {
    let reply = call(client, json!({"op": "status", "task_id": id}))?;
    Ok(reply["task"]["state"].as_str().unwrap_or("?").to_owned())
}

/// Processes whose environment holds `marker`.
fn holding(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| std::fs::read(e.path().join("environ")).ok())
                .filter(|env| String::from_utf8_lossy(env).contains(marker))
                .count()
        })
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("bench-tasks needs root: EXEC's isolation does");
    }
    let agentosd = args.agentosd.clone().unwrap_or(sibling("agentosd")?);
    let dir = tempfile::tempdir()?;
    let kernel = start_agentosd(&agentosd, dir.path())?;
    let mut client = Client::connect(&kernel.socket)?;
    client.set_timeout(Some(Duration::from_secs(120)))?;
    // Warm the exec host.
    let warm = dispatch(&mut client, "print(1)")?;
    call(
        &mut client,
        json!({"op": "wait", "task_id": warm, "timeout_ms": 60_000}),
    )?;

    // Dispatch to running, and cancel to nothing of the task left.
    let mut to_running = Vec::new();
    let mut to_gone = Vec::new();
    for sample in 0..args.samples {
        let marker = format!("bench-task-{}-{sample}", std::process::id());
        let code = format!(
            "import os, subprocess\nsubprocess.Popen(['sleep', '300'], env={{'M': '{marker}'}})\n\
             while True:\n    pass"
        );
        let dispatched = Instant::now();
        let id = dispatch(&mut client, &code)?;
        while state(&mut client, &id)? != "running" {}
        to_running.push(dispatched.elapsed());
        while holding(&marker) == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let cancelled = Instant::now();
        call(&mut client, json!({"op": "cancel", "task_id": id}))?;
        while holding(&marker) > 0 {}
        to_gone.push(cancelled.elapsed());
    }
    to_running.sort();
    to_gone.sort();

    // Throughput: trivial EXEC tasks, all dispatched at once then all
    // collected, against the same runs as EXEC requests, pipelined.
    let request = |i: usize| json!({"code": format!("print({i})")});
    let mut pipe = Client::connect(&kernel.socket)?;
    pipe.set_timeout(Some(Duration::from_secs(300)))?;
    let started = Instant::now();
    for i in 0..args.tasks {
        let body = json!({"op": "dispatch", "kind": "exec", "request": request(i)});
        pipe.send(Opcode::TASK, body.to_string().as_bytes())?;
    }
    let mut ids = Vec::new();
    for _ in 0..args.tasks {
        let reply: Value = serde_json::from_slice(&pipe.recv()?.payload)?;
        ids.push(reply["task_id"].as_str().context("no task_id")?.to_owned());
    }
    let dispatched = started.elapsed();
    for id in &ids {
        let done = call(
            &mut client,
            json!({"op": "wait", "task_id": id, "timeout_ms": 600_000}),
        )?;
        if done["task"]["state"] != "completed" {
            bail!("a trivial task did not complete: {done}");
        }
    }
    let completed = started.elapsed();
    let baseline_started = Instant::now();
    for i in 0..args.tasks {
        pipe.send(Opcode::EXEC, request(i).to_string().as_bytes())?;
    }
    for _ in 0..args.tasks {
        let reply: Value = serde_json::from_slice(&pipe.recv()?.payload)?;
        if reply["success"] != true {
            bail!("a plain EXEC run failed: {reply}");
        }
    }
    let baseline = baseline_started.elapsed();

    // Memory after many finished tasks (THINK tasks fail at once here:
    // the benchmark's kernel has no LLM).
    let rss_before = kernel.rss_mib();
    let think = json!({"op": "dispatch", "kind": "think", "request": "hi"}).to_string();
    // In slices, so requests never wait behind more replies than the
    // connection may have in flight.
    for _ in 0..args.retained.div_ceil(100) {
        for _ in 0..100 {
            pipe.send(Opcode::TASK, think.as_bytes())?;
        }
        for _ in 0..100 {
            pipe.recv()?;
        }
    }
    let listed = call(&mut client, json!({"op": "list", "limit": 1000}))?;
    let rss_after = kernel.rss_mib();

    let per_second = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "bench-tasks: {} samples of start and cancel (an endless exec task with a child); {} \
         trivial exec tasks against {} plain EXEC runs; {} finished tasks kept",
        args.samples, args.tasks, args.tasks, args.retained
    );
    println!();
    println!(
        "dispatch -> running        p50 {:7.2} ms   p99 {:7.2} ms",
        ms(percentile(&to_running, 0.5)),
        ms(percentile(&to_running, 0.99))
    );
    println!(
        "cancel -> nothing left     p50 {:7.2} ms   p99 {:7.2} ms   (target 500 ms)",
        ms(percentile(&to_gone, 0.5)),
        ms(percentile(&to_gone, 0.99))
    );
    println!(
        "trivial exec tasks         {:7.0} dispatched/s   {:7.0} completed/s",
        per_second(args.tasks, dispatched),
        per_second(args.tasks, completed)
    );
    println!(
        "plain EXEC runs (baseline) {:7.0} completed/s   tasks at {:.2}x the baseline",
        per_second(args.tasks, baseline),
        baseline.as_secs_f64() / completed.as_secs_f64()
    );
    println!(
        "memory                     RSS {:.1} MiB before, {:.1} MiB after {} more finished \
         tasks (+{:.1} MiB); list of 1000 returned {}",
        rss_before,
        rss_after,
        args.retained,
        rss_after - rss_before,
        listed["tasks"].as_array().map_or(0, Vec::len)
    );
    drop(client);
    drop(pipe);
    kernel.stop();
    Ok(())
}
