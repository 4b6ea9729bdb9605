//! The task store: what a kill -9 or a clean stop leaves, results read back
//! from it, its pages and expiry, a full disk, and a store that is not a
//! database or not private.

use std::fs;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use agentos_proto::Opcode;
use agentos_test_support::{self as support, require_root, until, Daemon};
use serde_json::{json, Value};

use crate::{dispatch, status, task, wait};

#[test]
fn after_kill_9_finished_tasks_are_intact_queued_ones_run_and_running_ones_are_interrupted() {
    require_root!("EXEC (its isolation needs namespaces)");
    let config = "[tasks]\nmax_running_per_owner = 1\n";
    let mut daemon = Daemon::start_with(config);
    let mut stream = daemon.raw();
    let finished = dispatch(&mut stream, "exec", json!({"code": "print('before')"}));
    assert_eq!(wait(&mut stream, &finished, 30_000)["state"], "completed");
    let running = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(60)"}),
    );
    let queued: Vec<String> = (0..3)
        .map(|i| {
            dispatch(
                &mut stream,
                "exec",
                json!({"code": format!("print('queued {i}')")}),
            )
        })
        .collect();
    until("the long task prints", Duration::from_secs(20), || {
        status(&mut stream, &running)["progress"]["output"] == "started\n"
    });
    assert_eq!(status(&mut stream, &queued[0])["state"], "queued");
    // Its output is saved within a second of being printed.
    std::thread::sleep(Duration::from_millis(1500));
    daemon.signal(libc::SIGKILL);
    daemon.restart(config);
    let mut stream = daemon.raw();
    let before = wait(&mut stream, &finished, 1000);
    assert_eq!(before["state"], "completed");
    assert_eq!(before["result"]["stdout"], "before\n", "{before}");
    let interrupted = wait(&mut stream, &running, 1000);
    assert_eq!(interrupted["state"], "interrupted", "{interrupted}");
    assert_eq!(
        interrupted["result"]["output"], "started\n",
        "{interrupted}"
    );
    for (i, id) in queued.iter().enumerate() {
        let done = wait(&mut stream, id, 60_000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["result"]["stdout"], format!("queued {i}\n"));
    }
}

#[test]
fn ten_thousand_finished_tasks_are_paged_with_memory_bounded_and_expire() {
    // THINK tasks without an LLM fail at once: ten thousand finished tasks
    // in seconds.
    let daemon = Daemon::start_with("[tasks]\nretention_secs = 4\n");
    let mut stream = daemon.raw();
    let rss_before = daemon.rss_kib();
    let mut batch = Vec::new();
    let request = json!({"op": "dispatch", "kind": "think", "request": "hi"}).to_string();
    for _ in 0..10_000 {
        batch.extend(agentos_proto::encode_frame(
            Opcode::TASK,
            0,
            request.as_bytes(),
        ));
    }
    std::io::Write::write_all(&mut stream, &batch).unwrap();
    for _ in 0..10_000 {
        let (_, reply) = support::recv_json(&mut stream);
        assert_eq!(reply["success"], true, "{reply}");
    }
    let mut seen = 0;
    let mut before: Option<String> = None;
    loop {
        let mut request = json!({"op": "list", "limit": 1000});
        if let Some(before) = &before {
            request["before"] = json!(before);
        }
        let page = task(&mut stream, request);
        seen += page["tasks"].as_array().unwrap().len();
        match page["next"].as_str() {
            Some(next) => before = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, 10_000);
    let grown = daemon.rss_kib().saturating_sub(rss_before);
    eprintln!("10 000 finished tasks: RSS grew by {grown} KiB");
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
    // Expiry: past their retention, they are gone.
    until("finished tasks expire", Duration::from_secs(15), || {
        task(&mut stream, json!({"op": "list", "limit": 1}))["tasks"] == json!([])
    });
}

#[test]
fn tasks_running_at_a_clean_stop_end_interrupted_with_their_output_and_queued_ones_wait() {
    require_root!("EXEC (its isolation needs namespaces)");
    let config = "[tasks]\nmax_running_per_owner = 1\n";
    let mut daemon = Daemon::start_with(config);
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('halfway', flush=True)\nimport time\ntime.sleep(60)"}),
    );
    let queued = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('after the restart')"}),
    );
    until("the task prints", Duration::from_secs(20), || {
        status(&mut stream, &id)["progress"]["output"] == "halfway\n"
    });
    daemon.signal(libc::SIGTERM);
    daemon.restart(config);
    let mut stream = daemon.raw();
    let task = wait(&mut stream, &id, 1000);
    assert_eq!(task["state"], "interrupted", "{task}");
    assert_eq!(task["result"]["output"], "halfway\n", "{task}");
    // The queued one did not start while the kernel stopped: it runs now.
    let later = wait(&mut stream, &queued, 30_000);
    assert_eq!(later["state"], "completed", "{later}");
    assert_eq!(later["result"]["stdout"], "after the restart\n");
}

#[test]
fn results_that_left_memory_are_read_back_from_the_store() {
    require_root!("EXEC (its isolation needs namespaces)");
    // A cache of one byte: every result leaves memory once it is saved.
    let daemon = Daemon::start_with("[tasks]\nresult_cache_bytes = 1\n");
    let mut stream = daemon.raw();
    let id = dispatch(
        &mut stream,
        "exec",
        json!({"code": "print('kept on disk')"}),
    );
    assert_eq!(wait(&mut stream, &id, 30_000)["state"], "completed");
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..3 {
        let again = wait(&mut stream, &id, 1000);
        assert_eq!(again["result"]["stdout"], "kept on disk\n", "{again}");
    }
}

#[test]
fn a_task_store_that_is_not_a_database_stops_the_kernel_at_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("tasks.db"), vec![0x5a; 8192]).unwrap();
    let socket = dir.path().join("agentos.sock");
    let mut daemon = Daemon::spawn_at(dir, socket, "");
    let status = daemon.wait(Duration::from_secs(10));
    assert!(!status.success(), "{status}");
    let log = daemon.log();
    assert!(log.contains("tasks.db"), "{log}");
}

/// A tmpfs of a set size on a directory, unmounted when the test ends,
/// however it ends.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .unwrap();
        Tmpfs(dir.to_path_buf())
    }

    /// Gives it another size, keeping what it holds.
    fn resize(&self, size: &str) {
        nix::mount::mount(
            None::<&str>,
            &self.0,
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT,
            Some(format!("size={size}").as_str()),
        )
        .unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Detached: a daemon still holding files in it cannot keep it.
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Dispatches EXEC tasks running `code` until the store's disk is full:
/// the ids acknowledged, and the first refusal.
fn fill_the_disk(stream: &mut UnixStream, code: &str) -> (Vec<String>, Value) {
    let exec = json!({"op": "dispatch", "kind": "exec", "request": {"code": code}});
    let mut acknowledged = Vec::new();
    loop {
        let reply = task(stream, exec.clone());
        if reply["success"] != true {
            eprintln!(
                "{} dispatches acknowledged, then: {reply}",
                acknowledged.len()
            );
            return (acknowledged, reply);
        }
        acknowledged.push(reply["task_id"].as_str().unwrap().to_owned());
        assert!(acknowledged.len() < 100, "the disk never filled");
    }
}

/// A dispatch's refusal names the full disk.
fn assert_refused_for_a_full_disk(refused: &Value) {
    assert_eq!(refused["success"], false, "{refused}");
    assert_eq!(refused["code"], "unavailable", "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("No space left on device") && error.contains("not queued"),
        "{error}"
    );
    assert!(refused.get("task_id").is_none(), "{refused}");
}

/// A daemon whose state directory (AGENTOS_STATE_DIR, which a restart
/// keeps) is a tmpfs of `size`; the tmpfs goes when the test ends, after
/// the daemon.
fn daemon_on_a_tmpfs(size: &str) -> (Tmpfs, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir(&state).unwrap();
    let disk = Tmpfs::mount(&state, size);
    (disk, Daemon::start_in(dir, ""))
}

#[test]
fn on_a_full_disk_dispatches_are_refused_naming_the_cause_none_acknowledged_is_lost_and_room_brings_them_back(
) {
    require_root!("mounting a tmpfs, and EXEC (its isolation needs namespaces)");
    let (disk, mut daemon) = daemon_on_a_tmpfs("300k");
    let mut stream = daemon.raw();
    // A record of some 20 KiB each: the disk is full after a few.
    let code = format!("# {}\nprint('done')", "x".repeat(20 * 1024));
    let (acknowledged, first_refusal) = fill_the_disk(&mut stream, &code);
    assert!(acknowledged.len() >= 3, "{first_refusal}");
    // Every dispatch past the full disk is refused, naming the cause.
    assert_refused_for_a_full_disk(&first_refusal);
    for _ in 0..5 {
        let refused = task(
            &mut stream,
            json!({"op": "dispatch", "kind": "exec", "request": {"code": code}}),
        );
        assert_refused_for_a_full_disk(&refused);
    }
    // None acknowledged is lost: each runs to its end; none refused is
    // listed.
    for id in &acknowledged {
        let done = wait(&mut stream, id, 60_000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["result"]["stdout"], "done\n", "{done}");
    }
    let listed = task(&mut stream, json!({"op": "list", "limit": 1000}));
    let mut listed: Vec<String> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap().to_owned())
        .collect();
    listed.reverse();
    assert_eq!(listed, acknowledged);
    // Room again: dispatches succeed, with no restart.
    disk.resize("4m");
    let after = dispatch(&mut stream, "exec", json!({"code": code}));
    assert_eq!(wait(&mut stream, &after, 60_000)["state"], "completed");
    let log = daemon.log();
    assert!(log.contains("No space left on device"), "{log}");
    assert!(log.contains("saves again"), "{log}");
    // And what waited to be saved meanwhile (the ends of the tasks that
    // ran while the disk was full) is on disk: after a restart each task
    // is there, finished.
    daemon.signal(libc::SIGTERM);
    daemon.restart("");
    let mut stream = daemon.raw();
    for id in acknowledged.iter().chain([&after]) {
        let done = wait(&mut stream, id, 1000);
        assert_eq!(done["state"], "completed", "{done}");
        assert_eq!(done["result"]["stdout"], "done\n", "{done}");
    }
}

#[test]
fn a_kernel_stopped_on_a_full_disk_names_what_it_could_not_save_and_the_next_one_what_it_found() {
    require_root!("mounting a tmpfs, and EXEC (its isolation needs namespaces)");
    let (disk, mut daemon) = daemon_on_a_tmpfs("300k");
    let mut stream = daemon.raw();
    // Each result (40 KB printed) is larger than any record the full disk
    // still takes: the tasks' ends cannot be saved.
    let code = format!("# {}\nprint('y' * 40000)", "x".repeat(20 * 1024));
    let (acknowledged, refused) = fill_the_disk(&mut stream, &code);
    assert_refused_for_a_full_disk(&refused);
    for id in &acknowledged {
        assert_eq!(wait(&mut stream, id, 60_000)["state"], "completed");
    }
    daemon.signal(libc::SIGTERM);
    daemon.wait(Duration::from_secs(10));
    // The stopping kernel says, task by task, what is lost.
    let log = daemon.log();
    assert!(log.contains("before the kernel stopped"), "{log}");
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|id| log.contains(&format!("task {id}: not saved:")))
        .collect();
    assert!(!lost.is_empty(), "{log}");
    for id in &lost {
        assert!(
            log.contains(&format!(
                "task {id}: not saved: its start, its end (completed)"
            )) || log.contains(&format!("task {id}: not saved: its end (completed)")),
            "{log}"
        );
    }
    // The next kernel (with room) has each acknowledged task still: one
    // whose start was saved but not its end ends interrupted, named in
    // its log; one whose start was lost is queued again, and runs.
    disk.resize("4m");
    daemon.restart("");
    let mut stream = daemon.raw();
    let log = daemon.log();
    for id in &acknowledged {
        let task = wait(&mut stream, id, 60_000);
        match task["state"].as_str() {
            Some("interrupted") => assert!(
                log.contains("end interrupted") && log.contains(id.as_str()),
                "{id}: {log}"
            ),
            Some("completed") => {}
            _ => panic!("{task}"),
        }
    }
}

#[test]
fn the_task_store_is_private_whatever_the_umask_and_however_an_earlier_kernel_left_it() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| fs::metadata(path).unwrap().permissions().mode() & 0o7777;
    // A store left open to all: its directory and lock.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir(&state).unwrap();
    fs::set_permissions(&state, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(state.join("agentosd.lock"), b"").unwrap();
    fs::set_permissions(
        state.join("agentosd.lock"),
        fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    // The most permissive umask there is: nextest runs each test in a
    // process of its own, whose umask the daemon inherits.
    // SAFETY: umask(2) only sets the process's mask.
    let previous = unsafe { libc::umask(0) };
    let daemon = Daemon::start_in(dir, "");
    // SAFETY: as above.
    unsafe { libc::umask(previous) };
    let mut stream = daemon.raw();
    // Without an LLM a THINK task fails at once: records and a result are
    // written, so SQLite has made its -wal and -shm.
    let id = dispatch(&mut stream, "think", json!("hi"));
    assert_eq!(wait(&mut stream, &id, 10_000)["state"], "failed");
    assert_eq!(mode(&state), 0o700);
    for name in ["agentosd.lock", "tasks.db", "tasks.db-wal", "tasks.db-shm"] {
        assert_eq!(mode(&state.join(name)), 0o600, "{name}");
    }
    let log = daemon.log();
    assert!(
        log.contains(&format!("{} was mode 777; made 700", state.display())),
        "{log}"
    );
    assert!(
        log.contains("agentosd.lock was mode 666; made 600"),
        "{log}"
    );
}
