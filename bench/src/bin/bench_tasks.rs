//! `bench-tasks`: TASK's figures — dispatch to running, cancel to nothing
//! left, trivial EXEC tasks dispatched and completed per second against
//! the same runs as plain EXEC requests in the same run (the baseline), and
//! the kernel's memory after ten thousand finished tasks. Prints figures
//! and ratios; asserts nothing.

use std::time::{Duration, Instant};

use agentos_bench::wire::{read_reply, Run};
use agentos_bench::{percentile, sibling, start_agentosd};
use agentos_proto::payload::{
    ExecReply, TaskCancelReply, TaskDispatch, TaskDispatchReply, TaskKind, TaskList, TaskListReply,
    TaskRef, TaskReply, TaskRequest, TaskState, TaskWait,
};
use agentos_proto::{Client, Opcode};
use anyhow::{anyhow, bail};
use clap::Parser;
use serde::de::DeserializeOwned;

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

/// Sends `request` and reads its reply as `T`, which `succeeded` says it
/// is.
fn call<T: DeserializeOwned>(
    client: &mut Client,
    request: &TaskRequest,
    succeeded: impl FnOnce(&T) -> bool,
) -> anyhow::Result<T> {
    let body = serde_json::to_vec(request)?;
    let reply = client.call(Opcode::TASK, &body)?;
    read_reply(&reply.payload, succeeded)
        .map_err(|reply| anyhow!("TASK {} failed: {reply}", String::from_utf8_lossy(&body)))
}

/// A dispatch of the EXEC run `run`.
fn exec_task(run: Run<'_>) -> anyhow::Result<TaskRequest> {
    Ok(TaskRequest::Dispatch(TaskDispatch::new(
        TaskKind::Exec,
        serde_json::to_value(run)?,
    )))
}

fn dispatch(client: &mut Client, code: &str) -> anyhow::Result<String> {
    let request = exec_task(Run::python(code).timeout_ms(120_000))?;
    let reply = call(client, &request, |r: &TaskDispatchReply| r.success)?;
    Ok(reply.task_id)
}

fn state(client: &mut Client, id: &str) -> anyhow::Result<TaskState> {
    let status = TaskRequest::Status(TaskRef {
        task_id: id.to_owned(),
    });
    Ok(call(client, &status, |r: &TaskReply| r.success)?.task.state)
}

/// Waits up to `timeout_ms` for task `id` to end.
fn wait(client: &mut Client, id: &str, timeout_ms: u64) -> anyhow::Result<TaskReply> {
    let wait = TaskRequest::Wait(TaskWait {
        task_id: id.to_owned(),
        timeout_ms: Some(timeout_ms),
    });
    call(client, &wait, |r: &TaskReply| r.success)
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
    wait(&mut client, &warm, 60_000)?;

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
        while state(&mut client, &id)? != TaskState::Running {}
        to_running.push(dispatched.elapsed());
        while holding(&marker) == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let cancelled = Instant::now();
        let cancel = TaskRequest::Cancel(TaskRef { task_id: id });
        call(&mut client, &cancel, |r: &TaskCancelReply| r.success)?;
        while holding(&marker) > 0 {}
        to_gone.push(cancelled.elapsed());
    }
    to_running.sort();
    to_gone.sort();

    // Throughput: trivial EXEC tasks, all dispatched at once then all
    // collected, against the same runs as EXEC requests, pipelined.
    let codes: Vec<String> = (0..args.tasks).map(|i| format!("print({i})")).collect();
    let mut pipe = Client::connect(&kernel.socket)?;
    pipe.set_timeout(Some(Duration::from_secs(300)))?;
    let started = Instant::now();
    for code in &codes {
        let body = exec_task(Run::python(code))?;
        pipe.send(Opcode::TASK, &serde_json::to_vec(&body)?)?;
    }
    let mut ids = Vec::new();
    for _ in 0..args.tasks {
        let reply = pipe.recv()?;
        let reply = read_reply(&reply.payload, |r: &TaskDispatchReply| r.success)
            .map_err(|reply| anyhow!("no task_id: {reply}"))?;
        ids.push(reply.task_id);
    }
    let dispatched = started.elapsed();
    for id in &ids {
        let done = wait(&mut client, id, 600_000)?;
        if done.task.state != TaskState::Completed {
            bail!("a trivial task did not complete: {:?}", done.task);
        }
    }
    let completed = started.elapsed();
    let baseline_started = Instant::now();
    for code in &codes {
        pipe.send(Opcode::EXEC, &serde_json::to_vec(&Run::python(code))?)?;
    }
    for _ in 0..args.tasks {
        let reply = pipe.recv()?;
        read_reply(&reply.payload, |r: &ExecReply| r.success)
            .map_err(|reply| anyhow!("a plain EXEC run failed: {reply}"))?;
    }
    let baseline = baseline_started.elapsed();

    // Memory after many finished tasks (THINK tasks fail at once here:
    // the benchmark's kernel has no LLM).
    let rss_before = kernel.rss_mib();
    let think = serde_json::to_vec(&TaskRequest::Dispatch(TaskDispatch::new(
        TaskKind::Think,
        "hi".into(),
    )))?;
    // In slices, so requests never wait behind more replies than the
    // connection may have in flight.
    for _ in 0..args.retained.div_ceil(100) {
        for _ in 0..100 {
            pipe.send(Opcode::TASK, &think)?;
        }
        for _ in 0..100 {
            pipe.recv()?;
        }
    }
    let list = TaskRequest::List(TaskList {
        limit: Some(1000),
        ..TaskList::default()
    });
    let listed = call(&mut client, &list, |r: &TaskListReply| r.success)?;
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
        listed.tasks.len()
    );
    drop(client);
    drop(pipe);
    kernel.stop();
    Ok(())
}
