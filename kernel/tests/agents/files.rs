//! READ and WRITE: files in the caller's own view with the caller's own
//! rights — the host's for an operator, its sandbox's for an agent — and
//! what a hostile caller tries: a symlink or a hard link where a file is
//! expected, a FIFO, a device, a `/proc` file, a path out of its view.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use agentos_proto::{Client, Opcode};
use agentos_test_support::{act, request, require_root, shared_dir, Daemon};
use serde_json::{json, Value};

use super::{refused, reply};

const READ: u8 = 0x03;
const WRITE: u8 = 0x04;

fn read(client: &mut Client, path: &str) -> Value {
    request(client, Opcode::READ, &json!({"path": path}))
}

#[test]
fn an_operator_writes_appends_and_reads_back_making_missing_directories() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("made/on/the/way/note.txt");
    let path = file.to_str().unwrap();
    let wrote = request(
        &mut client,
        Opcode::WRITE,
        &json!({"path": path, "content": "one\n"}),
    );
    assert_eq!(wrote["success"], true, "{wrote}");
    assert_eq!(wrote["bytes_written"], 4, "{wrote}");
    let appended = request(
        &mut client,
        Opcode::WRITE,
        &json!({"path": path, "content": "two\n", "mode": "append"}),
    );
    assert_eq!(appended["bytes_written"], 4, "{appended}");
    let back = read(&mut client, path);
    assert_eq!(back["content"], "one\ntwo\n", "{back}");
    assert_eq!(back["size"], 8, "{back}");
    let replaced = request(
        &mut client,
        Opcode::WRITE,
        &json!({"path": path, "content": "3"}),
    );
    assert_eq!(replaced["success"], true, "{replaced}");
    assert_eq!(fs::read_to_string(&file).unwrap(), "3");
    let missing = read(
        &mut client,
        dir.path().join("nothing.txt").to_str().unwrap(),
    );
    refused(&missing, "not_found", "nothing.txt");
    // `..` after a directory that does not exist names no place to make.
    let dotdot = dir.path().join("absent/../../escape.txt");
    let wrote = request(
        &mut client,
        Opcode::WRITE,
        &json!({"path": dotdot.to_str().unwrap(), "content": "x"}),
    );
    refused(&wrote, "bad_request", "without `..`");
    assert!(!dir.path().join("absent").exists());
    let relative = read(&mut client, "relative.txt");
    refused(&relative, "bad_request", "absolute");
}

#[test]
fn only_regular_files_are_read_and_links_are_never_followed_at_the_end() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let secret = dir.path().join("secret.txt");
    fs::write(&secret, "secret").unwrap();
    let link = dir.path().join("link.txt");
    symlink(&secret, &link).unwrap();
    let binary = dir.path().join("binary");
    fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    for (path, naming) in [
        (fifo.to_str().unwrap(), "not a regular file"),
        ("/dev/zero", "not a regular file"),
        ("/proc/self/status", "/proc"),
        (link.to_str().unwrap(), "symlink"),
        (binary.to_str().unwrap(), "UTF-8"),
    ] {
        refused(&read(&mut client, path), "bad_request", naming);
    }
    let through_link = request(
        &mut client,
        Opcode::WRITE,
        &json!({"path": link.to_str().unwrap(), "content": "overwritten"}),
    );
    refused(&through_link, "bad_request", "symlink");
    assert_eq!(fs::read_to_string(&secret).unwrap(), "secret");
}

#[test]
fn a_hard_link_to_another_users_file_is_never_written_through() {
    require_root!("a file owned by another user");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs.txt");
    fs::write(&theirs, "theirs").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    fs::set_permissions(&theirs, fs::Permissions::from_mode(0o666)).unwrap();
    let planted = dir.path().join("planted.txt");
    fs::hard_link(&theirs, &planted).unwrap();
    assert_eq!(fs::metadata(&planted).unwrap().nlink(), 2);
    let wrote = request(
        &mut client,
        Opcode::WRITE,
        &json!({"path": planted.to_str().unwrap(), "content": "root was here"}),
    );
    refused(&wrote, "permission_denied", "hard links");
    assert_eq!(fs::read_to_string(&theirs).unwrap(), "theirs");
    // The kernel reads without its capabilities: even a root caller does
    // not read another user's private file through it.
    let private = dir.path().join("private.txt");
    fs::write(&private, "private").unwrap();
    std::os::unix::fs::chown(&private, Some(65534), Some(65534)).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
    refused(
        &read(&mut client, private.to_str().unwrap()),
        "permission_denied",
        "private.txt",
    );
}

#[test]
fn an_agent_reads_and_writes_in_its_own_view_and_nothing_of_the_hosts() {
    require_root!("a sandboxed agent's own view of the filesystem");
    let daemon = Daemon::start();
    let host_only = shared_dir();
    let host_file = host_only.path().join("host.txt");
    fs::write(&host_file, "the host's").unwrap();
    let host_path = host_file.to_str().unwrap();
    let (_, replies) = act(
        &daemon,
        "filer",
        json!({}),
        json!([
            [WRITE, {"path": "/workspace/sub/mine.txt", "content": "mine"}],
            [READ, {"path": "/workspace/sub/mine.txt"}],
            [READ, {"path": host_path}],
            [WRITE, {"path": "/workspace/../../etc/escape.txt", "content": "x"}],
            [READ, {"path": "/proc/1/environ"}],
        ]),
    );
    assert_eq!(reply(&replies, 0)["bytes_written"], 4, "{replies:?}");
    assert_eq!(reply(&replies, 1)["content"], "mine", "{replies:?}");
    assert_eq!(
        reply(&replies, 2)["success"],
        false,
        "the host's file: {replies:?}"
    );
    // `..` stays within the agent's root: /etc of its own view, which it
    // may not write.
    assert_eq!(reply(&replies, 3)["success"], false, "{replies:?}");
    assert!(!std::path::Path::new("/etc/escape.txt").exists());
    assert_eq!(reply(&replies, 4)["success"], false, "{replies:?}");
    let (_, denied) = act(
        &daemon,
        "no-files",
        json!({"permissions": {"read": false, "write": false}}),
        json!([[READ, {"path": "/etc/hostname"}], [WRITE, {"path": "/workspace/a", "content": ""}]]),
    );
    refused(reply(&denied, 0), "permission_denied", "read");
    refused(reply(&denied, 1), "permission_denied", "write");
}
