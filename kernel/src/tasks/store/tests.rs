//! The SQLite store opened for real: what outlives it, what it refuses at
//! start, and how private it keeps its files.

use std::fs::Permissions;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentos_proto::payload::TaskState;
use mio::Waker;
use serde_json::Value;

use super::private::{FILE, FILES, LOCK};
use super::schema::{open_connection, read_result, Loaded};
use super::seam::{StoredTask, Write};
use super::{SqliteStore, StoreError};

fn waker() -> Arc<Waker> {
    let poll = mio::Poll::new().unwrap();
    Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap())
}

fn record(id: &str, seq: u64, state: &str) -> StoredTask {
    StoredTask::for_tests(id, seq, state)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// Waits for the writer to have applied everything sent so far.
fn settle(store: &SqliteStore) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let connection = open_connection(store.path()).unwrap();
        let pending: i64 = connection
            .query_row("SELECT count(*) FROM tasks WHERE id = 'marker'", [], |r| {
                r.get(0)
            })
            .unwrap();
        if pending > 0 {
            return;
        }
    }
    panic!("the writer did not catch up");
}

#[test]
fn records_and_results_outlive_the_store_and_running_ones_end_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, Loaded { records, .. }) =
            SqliteStore::open(dir.path(), dir.path(), waker()).unwrap();
        assert!(records.is_empty());
        store.write(Write::Insert(record("t-a", 1, "queued")));
        store.write(Write::Insert(record("t-b", 2, "queued")));
        store.write(Write::Started {
            id: "t-b".into(),
            started_ms: 5,
        });
        store.write(Write::Output {
            id: "t-b".into(),
            output: "half way".into(),
        });
        store.write(Write::Insert(record("t-c", 3, "queued")));
        store.write(Write::Finished {
            id: "t-c".into(),
            state: TaskState::Completed,
            finished_ms: 9,
            result: Arc::new(b"{\"success\":true}".to_vec()),
            output: None,
        });
        store.write(Write::Insert(record("marker", 4, "queued")));
        settle(&store);
        // A second kernel is kept away while this one holds the store.
        let err = SqliteStore::open(dir.path(), dir.path(), waker()).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    }
    let (store, Loaded { records, .. }) =
        SqliteStore::open(dir.path(), dir.path(), waker()).unwrap();
    let states: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r.id.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            ("t-a", "queued"),
            ("t-b", "interrupted"),
            ("t-c", "completed"),
            ("marker", "queued")
        ]
    );
    assert_eq!(records[1].output.as_deref(), Some("half way"));
    let interrupted: Value =
        serde_json::from_slice(&read_result(store.path(), "t-b").unwrap().unwrap()).unwrap();
    assert_eq!(interrupted["code"], "interrupted");
    assert_eq!(interrupted["output"], "half way");
    assert_eq!(
        read_result(store.path(), "t-c").unwrap().unwrap(),
        b"{\"success\":true}"
    );
    assert_eq!(read_result(store.path(), "t-a").unwrap(), None);
}

#[test]
fn a_file_that_is_not_a_database_is_named_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE), vec![7u8; 4096]).unwrap();
    let err = SqliteStore::open(dir.path(), dir.path(), waker())
        .unwrap_err()
        .to_string();
    assert!(err.contains("tasks.db"), "{err}");
}

#[test]
fn a_new_store_and_its_sockets_chain_are_0700_and_its_files_0600_wal_and_shm_too() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("agentos");
    let dir = base.join("sockets").join("run_agentos.sock");
    let above = mode(root.path());
    let (store, _) = SqliteStore::open(&dir, &base, waker()).unwrap();
    for write in 0..50 {
        store.write(Write::Insert(StoredTask {
            request: "x".repeat(10_000),
            ..record(&format!("t-{write}"), write, "queued")
        }));
    }
    store.write(Write::Insert(record("marker", 99, "queued")));
    settle(&store);
    for path in [&base, &base.join("sockets"), &dir] {
        assert_eq!(mode(path), 0o700, "{}", path.display());
    }
    // SQLite makes the -wal and -shm lazily, with the database's mode.
    for name in FILES.iter().take(4) {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
    assert!(std::fs::metadata(dir.join("tasks.db-wal")).unwrap().len() > 400_000);
    // The parent the kernel did not choose is left as it was.
    assert_eq!(mode(root.path()), above);
}

#[test]
fn looser_modes_an_earlier_kernel_left_are_tightened_at_start() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("state");
    let (mut store, _) = SqliteStore::open(&dir, &dir, waker()).unwrap();
    store.close();
    drop(store);
    std::fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
    // An empty log SQLite would take as it is.
    std::fs::write(dir.join("tasks.db-wal"), b"").unwrap();
    for name in [LOCK, FILE, "tasks.db-wal"] {
        std::fs::set_permissions(dir.join(name), Permissions::from_mode(0o666)).unwrap();
    }
    let (_store, _) = SqliteStore::open(&dir, &dir, waker()).unwrap();
    assert_eq!(mode(&dir), 0o700);
    for name in [LOCK, FILE, "tasks.db-wal", "tasks.db-shm"] {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
}

#[test]
fn a_link_in_place_of_the_database_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join(FILE)).unwrap();
    let err = SqliteStore::open(&dir, &dir, waker())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tasks.db") && err.contains("not a regular file"),
        "{err}"
    );
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("!!! NOT TESTED: this needs root");
    false
}

#[test]
fn a_state_directory_of_another_user_is_refused_naming_it_and_its_owner() {
    if !is_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let was = mode(&dir);
    let err = SqliteStore::open(&dir, &dir, waker()).unwrap_err();
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    let err = err.to_string();
    assert!(
        err.contains(&dir.display().to_string()) && err.contains("uid 65534"),
        "{err}"
    );
    // Nothing was changed or made in it.
    assert_eq!(mode(&dir), was);
    assert!(!dir.join(LOCK).exists());
}

/// Opens `path` read-only as uid and gid 65534 in a child process: 0,
/// or the errno.
fn open_as_stranger(path: &Path) -> i32 {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the child only makes raw system calls (no allocation, no
    // lock another thread may hold) and leaves with _exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        // SAFETY: raw system calls on a path made before the fork.
        nix::unistd::ForkResult::Child => unsafe {
            let code = if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()) != 0
                || libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534) != 0
                || libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) != 0
            {
                255
            } else if libc::open(path.as_ptr(), libc::O_RDONLY) >= 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::_exit(code)
        },
        nix::unistd::ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => code,
            other => panic!("the stranger's process: {other:?}"),
        },
    }
}

#[test]
fn a_stranger_cannot_open_the_lock_or_the_database_even_where_they_were_left_open() {
    if !is_root() {
        return;
    }
    // A directory everyone may pass through, and a store an earlier
    // kernel left open to all: the stranger could take the lock.
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), Permissions::from_mode(0o755)).unwrap();
    let dir = root.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
    for name in [LOCK, FILE] {
        std::fs::write(dir.join(name), b"").unwrap();
        std::fs::set_permissions(dir.join(name), Permissions::from_mode(0o666)).unwrap();
    }
    assert_eq!(open_as_stranger(&dir.join(LOCK)), 0, "the setup is open");
    let (_store, _) = SqliteStore::open(&dir, &dir, waker()).unwrap();
    for name in [LOCK, FILE, "tasks.db-wal", "tasks.db-shm"] {
        assert_eq!(open_as_stranger(&dir.join(name)), libc::EACCES, "{name}");
    }
    // The same for a store made afresh.
    let fresh = root.path().join("fresh");
    let (_fresh, _) = SqliteStore::open(&fresh, &fresh, waker()).unwrap();
    assert_eq!(open_as_stranger(&fresh.join(LOCK)), libc::EACCES);
}

#[test]
fn a_row_whose_owner_or_kind_cannot_be_read_is_named_and_left_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = SqliteStore::open(dir.path(), dir.path(), waker()).unwrap();
        store.write(Write::Insert(record("marker", 4, "queued")));
        settle(&store);
    }
    let disk = open_connection(&dir.path().join(FILE)).unwrap();
    disk.execute_batch(
        "INSERT INTO tasks (id, seq, owner, kind, state, request, created_ms) \
         VALUES ('t-robot', 1, 'robot:1:2', 'exec', 'queued', '{}', 1), \
                ('t-nap', 2, 'user:0', 'nap', 'queued', '{}', 1);",
    )
    .unwrap();
    let (_store, loaded) = SqliteStore::open(dir.path(), dir.path(), waker()).unwrap();
    let ids: Vec<&str> = loaded.records.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["marker"]);
    let unreadable: Vec<(String, u64)> = loaded
        .unreadable
        .iter()
        .map(|row| (row.to_string(), row.seq()))
        .collect();
    assert!(
        unreadable[0].0.contains("t-robot") && unreadable[0].0.contains("\"robot:1:2\""),
        "{unreadable:?}"
    );
    assert!(
        unreadable[1].0.contains("t-nap") && unreadable[1].0.contains("\"nap\""),
        "{unreadable:?}"
    );
    assert_eq!(unreadable[0].1, 1);
    assert_eq!(unreadable[1].1, 2);
    let left: i64 = disk
        .query_row("SELECT count(*) FROM tasks", [], |row| row.get(0))
        .unwrap();
    assert_eq!(left, 3, "nothing is removed");
}

#[test]
fn a_database_made_before_versions_were_kept_gains_the_state_and_audit_tables_and_keeps_its_tasks()
{
    let dir = tempfile::tempdir().unwrap();
    {
        let disk = open_connection(&dir.path().join(FILE)).unwrap();
        disk.execute_batch(
            "CREATE TABLE tasks (id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, \
             owner TEXT NOT NULL, kind TEXT NOT NULL, label TEXT, state TEXT NOT NULL, \
             request TEXT NOT NULL, created_ms INTEGER NOT NULL, started_ms INTEGER, \
             finished_ms INTEGER, output TEXT, result BLOB);
             INSERT INTO tasks (id, seq, owner, kind, state, request, created_ms) \
             VALUES ('t-old', 1, 'user:0', 'exec', 'completed', '{}', 1);",
        )
        .unwrap();
    }
    let (_store, loaded) = SqliteStore::open(dir.path(), dir.path(), waker()).unwrap();
    let ids: Vec<&str> = loaded.records.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["t-old"]);
    let disk = open_connection(&dir.path().join(FILE)).unwrap();
    let version: i64 = disk
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 3);
    for table in ["state", "audit"] {
        let rows: i64 = disk
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(rows, 0, "{table}");
    }
}
