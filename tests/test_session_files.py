"""Files in a session, against a real agentosd: EXEC `stat`, `list`,
`mkdir`, `move`, `remove`, `read` and `write` reach a session's files as
its code sees them (its disk, its mounts, the read-only system beneath),
as its own user. And what a hostile caller, run or process tries with
them: the host's files stay out of reach, sizes and paths are checked,
and a process of the session that lies in wait cannot stall the kernel.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import threading
import time

import pytest

from agentos import AgentOSClient
from agentos.connection import decode_json
from agentos.errors import (
    AlreadyExists,
    BadRequest,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from agentos.protocol import Opcode
from conftest import RUN_ASKS_KERNEL, binary, root_client, root_kernel, session_named

# A small disk, to be filled.
CONFIG = "[exec]\nsession_disk_bytes = 50331648\n"


@pytest.fixture(scope="module")
def kernel():
    yield from root_kernel("files in sessions", CONFIG)


@pytest.fixture
def client(kernel):
    yield from root_client(kernel)


@pytest.fixture
def session(client, request):
    yield from session_named(client, request)


def raw_exec(client: AgentOSClient, request: dict) -> dict:
    """EXEC with `request` as it is, its reply unraised."""
    return decode_json(client.call(Opcode.EXEC, request), Opcode.EXEC)


def shell(client, session, script: str) -> bytes:
    ran = client.run_process(session, ["/bin/sh", "-c", script])
    assert ran["exit_code"] == 0, ran
    return ran["stdout"]


def test_a_written_file_is_what_the_sessions_code_reads_and_stat_says_what_it_is(client, session):
    entry = client.file_write(session, "/home/user/notes/a.txt", b"hello\n", parents=True)
    assert entry["path"] == "/home/user/notes/a.txt" and entry["name"] == "a.txt", entry
    assert entry["type"] == "file" and entry["size"] == 6, entry
    assert entry["permissions"] == "-rw-r--r--" and entry["mode"] == 0o644, entry
    assert entry["owner"] == "nobody" and entry["modified_at"].endswith("Z"), entry
    assert shell(client, session, "cat /home/user/notes/a.txt") == b"hello\n"
    ran = client.exec("print(open('/home/user/notes/a.txt').read(), end='')", session=session)
    assert ran["stdout"] == "hello\n", ran
    shell(client, session, "ln -s notes/a.txt /home/user/link")
    link = client.file_stat(session, "/home/user/link")
    assert link["type"] == "symlink" and link["symlink_target"] == "notes/a.txt", link
    assert client.file_read(session, "/home/user/link")["data"] == b"hello\n"
    with pytest.raises(NotFound):
        client.file_stat(session, "/home/user/nothing")


def test_twenty_megabytes_go_up_and_come_back_the_same(client, session):
    data = os.urandom(20 << 20)
    client.upload(session, "/workspace/big.bin", data)
    assert hashlib.sha256(client.download(session, "/workspace/big.bin")).digest() == \
        hashlib.sha256(data).digest()
    summed = shell(client, session, "sha256sum /workspace/big.bin").split()[0].decode()
    assert summed == hashlib.sha256(data).hexdigest()
    # No partial file is left beside it.
    names = [e["name"] for e in client.file_list(session, "/workspace")["entries"]]
    assert names == ["big.bin"], names


def test_reads_and_writes_at_an_offset(client, session):
    client.file_write(session, "/tmp/f", b"0123456789")
    part = client.file_read(session, "/tmp/f", offset=3, length=4)
    assert part == {"data": b"3456", "offset": 3, "size": 10, "eof": False}, part
    assert client.file_read(session, "/tmp/f", offset=8)["eof"]
    assert client.file_read(session, "/tmp/f", offset=50) == \
        {"data": b"", "offset": 50, "size": 10, "eof": True}
    client.file_write(session, "/tmp/f", b"ab", offset=2, truncate=False)
    assert client.download(session, "/tmp/f") == b"01ab456789"
    # By default the file ends where the bytes do.
    client.file_write(session, "/tmp/f", b"xy", offset=4)
    assert client.download(session, "/tmp/f") == b"01abxy"


def test_mkdir_move_remove_and_list(client, session):
    assert client.file_mkdir(session, "/workspace/a/b", parents=True) is True
    assert client.file_mkdir(session, "/workspace/a/b", parents=True) is False
    with pytest.raises(NotFound):
        client.file_mkdir(session, "/workspace/x/y")
    client.file_write(session, "/workspace/a/b/c.txt", b"c")
    client.file_write(session, "/workspace/a/top.txt", b"t")
    with pytest.raises(AlreadyExists):
        client.file_mkdir(session, "/workspace/a/top.txt")
    one = client.file_list(session, "/workspace/a")
    assert [e["name"] for e in one["entries"]] == ["b", "top.txt"] and not one["truncated"], one
    two = client.file_list(session, "/workspace/a", depth=2)
    assert [e["path"] for e in two["entries"]] == \
        ["/workspace/a/b", "/workspace/a/top.txt", "/workspace/a/b/c.txt"], two
    # Across the session's disks' mounts, too.
    moved = client.file_move(session, "/workspace/a", "/tmp/a")
    assert moved["path"] == "/tmp/a" and moved["type"] == "dir", moved
    assert client.file_read(session, "/tmp/a/b/c.txt")["data"] == b"c"
    with pytest.raises(NotFound):
        client.file_stat(session, "/workspace/a")
    # A directory there is never moved into.
    client.file_mkdir(session, "/workspace/again")
    with pytest.raises(AlreadyExists):
        client.file_move(session, "/workspace/again", "/tmp/a")
    assert client.file_stat(session, "/workspace/again")["type"] == "dir"
    names = [e["name"] for e in client.file_list(session, "/tmp")["entries"]]
    assert not any(".agentos-move" in n for n in names), names
    # A file across to tmpfs, replacing one there.
    client.file_write(session, "/dev/shm/f", b"old")
    client.file_write(session, "/workspace/f", b"new")
    client.file_move(session, "/workspace/f", "/dev/shm/f")
    assert client.download(session, "/dev/shm/f") == b"new"
    with pytest.raises(NotFound):
        client.file_stat(session, "/workspace/f")
    assert client.file_remove(session, "/tmp/a") is True
    with pytest.raises(NotFound):
        client.file_remove(session, "/tmp/a")
    with pytest.raises(BadRequest, match="not a directory"):
        client.file_list(session, "/etc/hostname")


def test_a_list_stops_at_ten_thousand_entries(client, session):
    # Hard links: a small disk has fewer inodes than that.
    shell(client, session, "mkdir /tmp/many && cd /tmp/many && touch 0 && python3 -c "
                           "\"import os; [os.link('0', str(n)) for n in range(1, 12000)]\"")
    listed = client.file_list(session, "/tmp/many")
    assert listed["truncated"] and len(listed["entries"]) == 10_000, len(listed["entries"])


def test_metadata_is_kept_in_extended_attributes_and_replaced_whole(client, session):
    entry = client.file_write(session, "/workspace/m.txt", b"m", metadata={"owner": "alice", "k": "v 1"})
    assert entry["metadata"] == {"owner": "alice", "k": "v 1"}, entry
    assert shell(client, session,
                 "python3 -c \"import os; print(os.getxattr('/workspace/m.txt', 'user.e2b.owner').decode())\"") \
        == b"alice\n"
    entry = client.file_write(session, "/workspace/m.txt", b"m", metadata={"k": "2"})
    assert entry["metadata"] == {"k": "2"}, entry
    # Other code may set far more (on tmpfs, which takes it); what is
    # given back stays small.
    client.file_write(session, "/dev/shm/m.txt", b"m", metadata={"k": "2"})
    shell(client, session,
          "python3 -c \"import os; os.setxattr('/dev/shm/m.txt', 'user.e2b.zz', b'x' * 60000)\"")
    assert client.file_stat(session, "/dev/shm/m.txt")["metadata"] == {"k": "2"}


def test_the_read_only_system_and_the_template_cannot_be_written(client, session):
    for path in ("/usr/x", "/opt/template/x", "/etc/passwd"):
        with pytest.raises((PermissionDenied, NotFound)):
            client.file_write(session, path, b"x")
    with pytest.raises(PermissionDenied):
        client.file_remove(session, "/usr/bin/env")


def test_a_full_disk_is_limit_exceeded(client, session):
    shell(client, session, "dd if=/dev/zero of=/workspace/fill bs=1M 2>/dev/null; "
                           "dd if=/dev/zero of=/workspace/fill2 bs=4k 2>/dev/null; true")
    with pytest.raises(LimitExceeded):
        client.file_write(session, "/workspace/more", os.urandom(512 << 10))
    client.file_remove(session, "/workspace/fill")
    client.file_remove(session, "/workspace/fill2")
    client.file_write(session, "/workspace/more", b"room again")


def host_secret() -> bytes:
    with open("/etc/shadow", "rb") as shadow:
        return shadow.read()


@pytest.mark.parametrize("path", [
    "/etc/shadow",
    "/home/user/../../etc/shadow",
    "/workspace/../../../../etc/shadow",
    "/proc/self/root/etc/shadow",
    "/proc/1/root/etc/shadow",
])
def test_the_hosts_secrets_are_never_read(client, session, path):
    secret = host_secret()
    try:
        got = client.file_read(session, path)["data"]
    except (BadRequest, NotFound, PermissionDenied):
        return
    assert not secret or secret not in got, path


def test_a_symlink_made_in_the_session_resolves_inside_it(client, session, kernel):
    shell(client, session, "ln -s /etc/shadow /workspace/shadow; ln -s / /workspace/root")
    with pytest.raises((BadRequest, NotFound, PermissionDenied)):
        client.file_read(session, "/workspace/shadow")
    listed = client.file_list(session, "/workspace/root")
    names = {e["name"] for e in listed["entries"]}
    assert {"workspace", "home", "tmp"} <= names, names
    # The kernel's own directory (its socket, its state) is not there.
    with pytest.raises(NotFound):
        client.file_stat(session, os.path.dirname(kernel.socket_path))


def test_a_fifo_or_a_device_is_refused_not_waited_on(client, session):
    shell(client, session, "mkfifo /tmp/fifo")
    for path in ("/tmp/fifo", "/dev/zero", "/dev/urandom"):
        with pytest.raises(BadRequest, match="not a regular file"):
            client.file_read(session, path)
    with pytest.raises(BadRequest):
        client.file_write(session, "/tmp/fifo", b"x")
    assert client.file_stat(session, "/tmp/fifo")["type"] == "other"


def test_a_killed_steward_is_replaced_on_the_next_file_op(client, session):
    client.file_write(session, "/tmp/x", b"1")
    killer = client.run_process(session, ["/bin/sh", "-c", "sleep 0.2; kill -9 -1"])
    assert killer["exit_code"] == 0 or killer["reason"] == "its steward or its session ended"
    assert client.file_read(session, "/tmp/x")["data"] == b"1"


def test_a_session_of_someone_else_or_none_is_not_found_and_a_paused_one_unavailable(kernel, client, session):
    client.file_write(session, "/tmp/mine", b"mine")
    with AgentOSClient(kernel.socket_path) as other:
        other.delegate("someone-else")
        with pytest.raises(NotFound):
            other.file_read(session, "/tmp/mine")
        with pytest.raises(NotFound):
            other.file_write(session, "/tmp/theirs", b"x")
    with pytest.raises(NotFound):
        client.file_stat("no-such-session", "/tmp")
    client.pause_session(session)
    try:
        with pytest.raises(Unavailable, match="paused"):
            client.file_stat(session, "/tmp/mine")
    finally:
        client.resume_session(session)
    assert client.file_read(session, "/tmp/mine")["data"] == b"mine"


@pytest.mark.parametrize("request_fields", [
    {"op": "stat", "path": "relative"},
    {"op": "stat", "path": "/a\u0000b"},
    {"op": "stat", "path": "/" + "x" * 5000},
    {"op": "stat", "path": "/tmp", "follow": True},
    {"op": "list", "path": "/tmp", "depth": 0},
    {"op": "list", "path": "/tmp", "depth": 17},
    {"op": "read", "path": "/tmp/x", "length": 5 << 20},
    {"op": "read", "path": "/tmp/x", "offset": -1},
    {"op": "write", "path": "/tmp/x", "data": "!!not base64"},
    {"op": "write", "path": "/tmp/x", "data": "A" * (800 * 1024)},
    {"op": "write", "path": "/tmp/x", "data": "", "metadata": {"k": "line\nbreak"}},
    {"op": "write", "path": "/tmp/x", "data": "", "metadata": {"k" * 300: "v"}},
    {"op": "move", "from": "/tmp/x", "to": "relative"},
    {"op": "move", "from": "/tmp/x"},
    {"op": "mkdir", "path": "/tmp/d", "parents": "yes"},
])
def test_hostile_file_ops_are_refused(client, session, request_fields):
    reply = raw_exec(client, {"session": session, **request_fields})
    assert reply["success"] is False and reply["code"] == "bad_request", reply


def test_a_run_reaches_no_file_op_of_its_callers_session(client):
    session = "run-files"
    client.open_session(session, permissions={"exec": True})
    code = RUN_ASKS_KERNEL + (
        f"print(json.dumps([ask(0x02, {{'op': 'write', 'session': {session!r}, 'path': '/tmp/x', 'data': ''}}),\n"
        f"                  ask(0x02, {{'op': 'read', 'session': {session!r}, 'path': '/etc/hostname'}})]))\n")
    try:
        run = client.exec(code, "python", session=session, permissions={"exec": True})
        replies = json.loads(run["stdout"])
        for reply in replies:
            assert reply["success"] is False and reply["code"] in ("not_found", "permission_denied"), reply
        with pytest.raises(NotFound):
            client.file_stat(session, "/tmp/x")
    finally:
        client.close_session(session)


def test_the_wire_form_is_as_documented(client, session):
    data = base64.b64encode(b"doc").decode()
    written = raw_exec(client, {"op": "write", "session": session, "path": "/tmp/doc", "data": data})
    assert written["success"] is True and set(written) == {"success", "entry"}, written
    read = raw_exec(client, {"op": "read", "session": session, "path": "/tmp/doc"})
    assert read == {"success": True, "data": data, "offset": 0, "size": 3, "eof": True}, read
    removed = raw_exec(client, {"op": "remove", "session": session, "path": "/tmp/doc"})
    assert removed == {"success": True, "removed": True}, removed


def test_the_cli_puts_lists_prints_gets_moves_and_removes(kernel, client, session, tmp_path):
    def agentos(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        return subprocess.run([binary("agentos"), "--socket", kernel.socket_path, *args],
                              input=stdin, capture_output=True, timeout=60)

    put = agentos("fs", "put", session, "-", "/home/user/in/a.txt", stdin=b"from stdin\n")
    assert put.returncode == 0 and put.stdout.decode().endswith("/home/user/in/a.txt\n"), put
    listed = agentos("fs", "ls", session, "/home/user", "--depth", "2")
    assert b"/home/user/in/a.txt" in listed.stdout, listed
    assert agentos("fs", "cat", session, "/home/user/in/a.txt").stdout == b"from stdin\n"
    assert agentos("fs", "mv", session, "/home/user/in", "/tmp/in").returncode == 0
    local = tmp_path / "back.txt"
    assert agentos("fs", "get", session, "/tmp/in/a.txt", str(local)).returncode == 0
    assert local.read_bytes() == b"from stdin\n"
    again = agentos("fs", "mkdir", session, "/tmp/in")
    assert again.returncode != 0 and b"there already" in again.stderr, again
    assert agentos("fs", "mkdir", session, "/tmp/in", "-p").returncode == 0
    stat = json.loads(agentos("--json", "fs", "stat", session, "/tmp/in").stdout)
    assert stat["entry"]["type"] == "dir", stat
    assert agentos("fs", "rm", session, "/tmp/in").returncode == 0
    gone = agentos("fs", "cat", session, "/tmp/in/a.txt")
    assert gone.returncode != 0 and b"No such file" in gone.stderr, gone


def events_until(client, session, watch, wanted, after=None, within=20.0):
    """A watch's events, followed until one of `wanted` (type, path) has
    come: those seen, and the next offset."""
    seen, deadline = [], time.monotonic() + within
    while time.monotonic() < deadline:
        reply = client.file_events(session, watch, after=after, follow=True, wait_ms=2000)
        seen.extend(reply["events"])
        after = reply["offset"]
        if wanted in [(e["type"], e["path"]) for e in seen] or reply["ended"]:
            break
    return seen, after


def test_a_recursive_watch_sees_changes_in_a_directory_made_after_it(client, session):
    watch = client.file_watch(session, "/workspace", recursive=True)
    assert watch.startswith("w-"), watch
    client.file_mkdir(session, "/workspace/sub")
    # Once its making is seen, the new directory is watched too.
    seen, after = events_until(client, session, watch, ("create", "/workspace/sub"))
    assert ("create", "/workspace/sub") in [(e["type"], e["path"]) for e in seen], seen
    client.file_write(session, "/workspace/sub/a.txt", b"1")
    client.file_move(session, "/workspace/sub/a.txt", "/workspace/sub/b.txt")
    shell(client, session, "chmod 600 /workspace/sub/b.txt")
    client.file_remove(session, "/workspace/sub/b.txt")
    seen, _ = events_until(client, session, watch, ("remove", "/workspace/sub/b.txt"), after)
    happened = [(e["type"], e["path"]) for e in seen]
    for expected in [("create", "/workspace/sub/a.txt"), ("write", "/workspace/sub/a.txt"),
                     ("rename", "/workspace/sub/a.txt"), ("create", "/workspace/sub/b.txt"),
                     ("chmod", "/workspace/sub/b.txt"), ("remove", "/workspace/sub/b.txt")]:
        assert expected in happened, (expected, happened)
    assert seen[-1]["name"] == "b.txt", seen
    # A watch that is not recursive sees its own directory only.
    flat = client.file_watch(session, "/tmp")
    client.file_mkdir(session, "/tmp/d")
    client.file_write(session, "/tmp/d/x", b"x")
    client.file_write(session, "/tmp/y", b"y")
    seen, _ = events_until(client, session, flat, ("create", "/tmp/y"))
    paths = {e["path"] for e in seen}
    assert "/tmp/d" in paths and "/tmp/y" in paths and "/tmp/d/x" not in paths, seen


def test_a_follow_is_answered_when_a_change_comes_and_unwatch_ends_it(client, session, kernel):
    watch = client.file_watch(session, "/tmp")
    offset = client.file_events(session, watch)["offset"]
    got = {}

    def follow(name):
        with AgentOSClient(kernel.socket_path, timeout=60) as other:
            got[name] = other.file_events(session, watch, after=offset, follow=True, wait_ms=30_000)

    waiter = threading.Thread(target=follow, args=("first",))
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    client.file_write(session, "/tmp/now", b"now")
    waiter.join(20)
    assert time.monotonic() - started < 5, "answered as the change came"
    assert [e["path"] for e in got["first"]["events"]][:1] == ["/tmp/now"], got
    end = got["first"]["offset"]
    offset = end
    waiter = threading.Thread(target=follow, args=("second",))
    waiter.start()
    time.sleep(0.3)
    assert client.file_unwatch(session, watch) is True
    waiter.join(20)
    assert got["second"]["ended"] and got["second"]["events"] == [], got
    with pytest.raises(NotFound):
        client.file_events(session, watch)
    with pytest.raises(NotFound):
        client.file_unwatch(session, watch)


def test_a_session_has_at_most_16_watches_and_they_end_with_its_steward(client, session):
    watches = [client.file_watch(session, "/tmp") for _ in range(16)]
    assert len(set(watches)) == 16
    with pytest.raises(LimitExceeded, match="16"):
        client.file_watch(session, "/tmp")
    client.file_unwatch(session, watches.pop())
    watches.append(client.file_watch(session, "/workspace"))
    # Its steward killed, its watches have ended and gone.
    killer = client.run_process(session, ["/bin/sh", "-c", "sleep 0.2; kill -9 -1"])
    assert killer["exit_code"] == 0 or killer["reason"] == "its steward or its session ended"
    for watch in watches:
        with pytest.raises(NotFound):
            client.file_events(session, watch)
    assert client.file_watch(session, "/tmp").startswith("w-")


def test_a_watch_of_no_directory_or_someone_elses_is_refused(kernel, client, session):
    with pytest.raises(NotFound):
        client.file_watch(session, "/no/such/dir")
    client.file_write(session, "/tmp/file", b"x")
    with pytest.raises((BadRequest, NotFound)):
        client.file_watch(session, "/tmp/file")
    watch = client.file_watch(session, "/tmp")
    with AgentOSClient(kernel.socket_path) as other:
        other.delegate("someone-else")
        with pytest.raises(NotFound):
            other.file_events(session, watch)
        with pytest.raises(NotFound):
            other.file_unwatch(session, watch)
    for request_fields in ({"op": "events", "watch": "w 1"}, {"op": "events", "watch": watch, "wait_ms": 60_001},
                           {"op": "unwatch", "watch": ""}, {"op": "watch", "path": "/tmp", "recursive": 1}):
        reply = raw_exec(client, {"session": session, **request_fields})
        assert reply["success"] is False and reply["code"] == "bad_request", reply


def test_names_that_are_not_utf8_are_shown_not_fatal(client, session):
    watch = client.file_watch(session, "/workspace")
    shell(client, session, "python3 -c \"open(b'/workspace/bad\\\\xffname', 'w').close()\"")
    names = [e["name"] for e in client.file_list(session, "/workspace")["entries"]]
    assert "bad\ufffdname" in names, names
    seen, _ = events_until(client, session, watch, ("create", "/workspace/bad\ufffdname"))
    assert any(e["name"] == "bad\ufffdname" for e in seen), seen
    # The steward lives on: the session's processes with it.
    assert client.run_process(session, ["true"])["exit_code"] == 0
