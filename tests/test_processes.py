"""Processes in a session, against a real agentosd: EXEC `start` runs a
program inside one of the caller's sessions, beside its interpreter
(same files, network, limits and uid); `output` reads or follows what it
prints, `input` writes to it, `signal` signals its group, `processes`
lists them. And what a hostile caller, run or process tries with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from agentos import AgentOSClient
from agentos.connection import decode_json
from agentos.protocol import Opcode
from agentos.errors import (
    AlreadyExists,
    BadRequest,
    LimitExceeded,
    NotFound,
    Unavailable,
)
from conftest import RUN_ASKS_KERNEL, binary, root_client, root_kernel


@pytest.fixture(scope="module")
def kernel():
    yield from root_kernel("processes in sessions")


@pytest.fixture
def client(kernel):
    yield from root_client(kernel)


@pytest.fixture
def session(client, request):
    name = request.node.name[:40].replace("[", "-").replace("]", "")
    client.open_session(name, env={"FROM_SESSION": "s", "BOTH": "session"})
    yield name
    client.close_session(name)


def test_a_program_runs_in_the_session_with_its_environment_exit_code_and_streams(client, session):
    assert client.hello()["features"]["processes"] is True
    ran = client.run_process(session, ["/bin/sh", "-c", "echo out; echo err >&2; echo $FROM_SESSION $BOTH $ASKED; pwd; exit 3"],
                             env={"BOTH": "asked", "ASKED": "a"})
    assert ran["exit_code"] == 3 and ran["signal"] is None, ran
    assert ran["stdout"] == b"out\ns asked a\n/home/user\n", ran
    assert ran["stderr"] == b"err\n", ran
    killed = client.run_process(session, ["/bin/sh", "-c", "kill -9 $$"])
    assert killed["exit_code"] is None and killed["signal"] == 9, killed
    there = client.run_process(session, ["pwd"], cwd="/tmp")
    assert there["stdout"] == b"/tmp\n", there
    listed = {p["pid"]: p for p in client.processes(session)}
    assert listed[ran["pid"]]["state"] == "ended" and listed[ran["pid"]]["exit_code"] == 3
    assert listed[ran["pid"]]["cwd"] == "/home/user" and listed[there["pid"]]["cwd"] == "/tmp"
    # Output keeps the order it was printed in, across streams.
    pid = client.start_process(session, ["/bin/sh", "-c", "echo 1; sleep 0.1; echo 2 >&2; sleep 0.1; echo 3"])["pid"]
    chunks, after = [], 0
    while True:
        reply = client.process_output(session, pid, after=after, follow=True)
        chunks += [(c["stream"], c["data"]) for c in reply["chunks"]]
        after = reply["offset"]
        if reply["ended"]:
            break
    assert chunks == [("stdout", b"1\n"), ("stderr", b"2\n"), ("stdout", b"3\n")], chunks


def test_a_background_server_is_reached_by_a_later_process_and_files_are_shared(client, session):
    server = client.start_process(session, ["python3", "-m", "http.server", "8321", "--bind", "127.0.0.1"],
                                  tag="web")
    fetch = ("import time, urllib.request\n"
             "for _ in range(100):\n"
             "    try:\n"
             "        print(urllib.request.urlopen('http://127.0.0.1:8321/').status); break\n"
             "    except OSError: time.sleep(0.05)\n")
    got = client.run_process(session, ["python3", "-c", fetch])
    assert got["stdout"] == b"200\n", got
    running = {p["pid"]: p for p in client.processes(session) if p["state"] == "running"}
    assert running[server["pid"]]["tag"] == "web", running
    with pytest.raises(AlreadyExists):
        client.start_process(session, ["sleep", "1"], tag="web")
    # A process's files are the session's, and its runs'.
    client.run_process(session, ["/bin/sh", "-c", "echo shared > /home/user/from-process"])
    run = client.exec("print(open('/home/user/from-process').read())", "python", session=session)
    assert run["stdout"] == "shared\n\n", run
    assert client.signal_process(session, server["pid"], "SIGTERM") is True
    ended = client.process_output(session, tag="web", after=10**9, follow=True)
    assert ended["ended"] and ended["signal"] == 15, ended
    with pytest.raises(NotFound):
        client.signal_process(session, server["pid"], "SIGKILL")


def test_input_reaches_stdin_and_eof_closes_it(client, session):
    pid = client.start_process(session, ["cat"], stdin=True)["pid"]
    assert client.send_input(session, pid, b"hello ") == 6
    assert client.send_input(session, pid, b"world\n", eof=True) == 6
    out = client.process_output(session, pid, follow=True)
    while not out["ended"]:
        out = client.process_output(session, pid, follow=True)
    assert b"".join(c["data"] for c in out["chunks"]) == b"hello world\n"
    assert out["exit_code"] == 0, out
    with pytest.raises(BadRequest, match="closed"):
        client.send_input(session, pid, b"more")
    deaf = client.start_process(session, ["sleep", "5"])["pid"]
    with pytest.raises(BadRequest, match="without `stdin`"):
        client.send_input(session, deaf, b"x")
    client.signal_process(session, deaf, "SIGKILL")


def test_the_kernel_kills_a_process_at_its_timeout(client, session):
    started = time.monotonic()
    ran = client.run_process(session, ["sleep", "30"], timeout_ms=300)
    assert ran["timed_out"] is True and ran["signal"] == 9 and ran["reason"] == "timeout", ran
    assert time.monotonic() - started < 10


def test_a_follow_is_answered_when_bytes_arrive_and_at_its_wait(client, session):
    pid = client.start_process(session, ["/bin/sh", "-c", "sleep 0.5; echo late; sleep 30"])["pid"]
    started = time.monotonic()
    reply = client.process_output(session, pid, follow=True, wait_ms=20_000)
    assert reply["chunks"][0]["data"] == b"late\n", reply
    assert time.monotonic() - started < 10
    started = time.monotonic()
    idle = client.process_output(session, pid, after=reply["offset"], follow=True, wait_ms=300)
    assert idle["chunks"] == [] and not idle["ended"], idle
    assert 0.25 < time.monotonic() - started < 10
    client.signal_process(session, pid, "SIGKILL")


def test_output_beyond_what_is_kept_is_dropped_and_counted(client, session):
    ran = client.start_process(session, ["head", "-c", "10000000", "/dev/zero"])
    reply = client.process_output(session, ran["pid"], follow=True)
    while not reply["ended"]:
        reply = client.process_output(session, ran["pid"], after=reply["offset"], follow=True)
    listed = [p for p in client.processes(session) if p["pid"] == ran["pid"]][0]
    assert listed["offset"] == 10_000_000, listed
    first = client.process_output(session, ran["pid"], after=0)
    kept = sum(len(c["data"]) for c in first["chunks"])
    assert first["dropped"] == listed["dropped"], {k: v for k, v in first.items() if k != "chunks"}
    # 256 KiB less what its chunks cost beyond their bytes.
    assert first["dropped"] + kept == 10_000_000 and 250 * 1024 < kept <= 256 * 1024, kept


def test_processes_outlive_their_connection_and_end_with_their_session(kernel, client, session):
    with AgentOSClient(kernel.socket_path) as other:
        pid = other.start_process(session, ["sleep", "60"])["pid"]
    running = [p for p in client.processes(session) if p["pid"] == pid]
    assert running and running[0]["state"] == "running", running
    answered = {}

    def follow():
        with AgentOSClient(kernel.socket_path, timeout=60) as waiter:
            answered["reply"] = waiter.process_output(session, pid, follow=True, wait_ms=30_000)

    waiter = threading.Thread(target=follow)
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    client.close_session(session)
    waiter.join(20)
    assert time.monotonic() - started < 10
    reply = answered["reply"]
    assert reply["ended"] and reply["reason"] == "its steward or its session ended", reply
    client.open_session(session)  # for the fixture to close


def test_a_process_whose_leader_left_a_child_on_its_output_can_still_be_killed(client, session):
    pid = client.start_process(session, ["/bin/sh", "-c", "sleep 1000 & echo started"])["pid"]
    reply = client.process_output(session, pid, follow=True)
    assert reply["chunks"] and not reply["ended"], reply
    time.sleep(0.3)
    running = [p for p in client.processes(session) if p["pid"] == pid][0]
    assert running["state"] == "running", running  # its output is still open
    assert client.signal_process(session, pid, "SIGKILL") is True
    ended = client.process_output(session, pid, after=reply["offset"], follow=True)
    assert ended["ended"] and ended["exit_code"] == 0, ended


def test_a_paused_sessions_time_does_not_count_against_a_processs_timeout(client, session):
    pid = client.start_process(session, ["sleep", "30"], timeout_ms=1500)["pid"]
    client.pause_session(session)
    time.sleep(2.0)
    client.resume_session(session)
    running = [p for p in client.processes(session) if p["pid"] == pid][0]
    assert running["state"] == "running", running
    started = time.monotonic()
    ended = client.process_output(session, pid, follow=True, wait_ms=10_000)
    while not ended["ended"]:
        ended = client.process_output(session, pid, after=ended["offset"], follow=True)
    assert ended["timed_out"] and ended["signal"] == 9, ended
    assert time.monotonic() - started < 5


def test_a_killed_steward_is_replaced_on_the_next_start(client, session):
    assert client.run_process(session, ["true"])["exit_code"] == 0
    # Everything of the sandbox's uid, the steward with it (once it has
    # said the killer started).
    killer = client.run_process(session, ["/bin/sh", "-c", "sleep 0.2; kill -9 -1"])
    assert killer["exit_code"] == 0 or killer["reason"] == "its steward or its session ended"
    again = client.run_process(session, ["/bin/sh", "-c", "echo back"])
    assert again["stdout"] == b"back\n", again


def test_a_session_of_someone_else_or_none_is_not_found_and_a_paused_one_unavailable(kernel, client, session):
    with AgentOSClient(kernel.socket_path) as other:
        other.delegate("someone-else")
        with pytest.raises(NotFound):
            other.start_process(session, ["true"])
        with pytest.raises(NotFound):
            other.processes(session)
    with pytest.raises(NotFound):
        client.start_process("no-such-session", ["true"])
    pid = client.start_process(session, ["sleep", "60"])["pid"]
    client.pause_session(session)
    try:
        with pytest.raises(Unavailable, match="paused"):
            client.start_process(session, ["true"])
        with pytest.raises(Unavailable, match="paused"):
            client.signal_process(session, pid, "SIGKILL")
    finally:
        client.resume_session(session)
    assert client.signal_process(session, pid, "SIGKILL")


def test_a_session_runs_at_most_64_processes_and_no_more_than_its_pids_limit(client, session):
    # The session's own cgroup stops it first: 64 pids by default, its
    # interpreter and steward among them.
    pids = []
    with pytest.raises(LimitExceeded, match="cannot start"):
        for _ in range(64):
            pids.append(client.start_process(session, ["sleep", "60"])["pid"])
    assert 50 < len(pids) < 64, len(pids)
    for pid in pids:
        client.signal_process(session, pid, "SIGKILL")
    roomy = session + "-roomy"
    client.open_session(roomy, limits={"max_pids": 200})
    try:
        # The kernel's own orders to it (a snapshot, its steward's start)
        # keep the limits it was opened with.
        client.snapshot(roomy, "s1")
        for _ in range(64):
            client.start_process(roomy, ["sleep", "60"])
        with pytest.raises(LimitExceeded, match="64"):
            client.start_process(roomy, ["sleep", "60"])
    finally:
        client.close_session(roomy)


def test_a_process_has_no_kernel_connection_and_cannot_reach_its_steward(client, session):
    probe = ("import os\n"
             "print(sorted(os.listdir('/proc/self/fd')))\n"
             "print('AGENTOS_SOCKET_FD' in os.environ)\n"
             "steward = [p for p in os.listdir('/proc') if p.isdigit() and p not in ('1', str(os.getpid()))\n"
             "           and open(f'/proc/{p}/stat').read().split()[3] == '1']\n"
             "for p in steward:\n"
             "    try: os.listdir(f'/proc/{p}/fd'); print('reached', p)\n"
             "    except PermissionError: print('refused')\n")
    ran = client.run_process(session, ["python3", "-c", probe])
    lines = ran["stdout"].decode().splitlines()
    assert lines[0] == "['0', '1', '2', '3']", ran  # 3: listdir's own
    assert lines[1] == "False", ran
    assert lines[2:] and all(line == "refused" for line in lines[2:]), ran


def read_until(client, session, pid, wanted: bytes, after: int = 0) -> tuple[bytes, int]:
    """What a process prints from `after` until `wanted` shows (or it ends)."""
    seen = b""
    deadline = time.monotonic() + 20
    while wanted not in seen and time.monotonic() < deadline:
        reply = client.process_output(session, pid, after=after, follow=True, wait_ms=2000)
        seen += b"".join(c["data"] for c in reply["chunks"])
        assert all(c["stream"] == "pty" for c in reply["chunks"]), reply
        after = reply["offset"]
        if reply["ended"]:
            break
    return seen, after


def test_a_process_on_a_pty_has_its_size_a_terminal_and_ctrl_c(client, session):
    shell = client.start_process(session, ["/bin/sh"], pty={"cols": 80, "rows": 24})
    pid = shell["pid"]
    listed = [p for p in client.processes(session) if p["pid"] == pid][0]
    assert listed["pty"] is True and listed["stdin"] is True, listed
    # (What is echoed is the line as typed: the markers are its results.)
    client.send_input(session, pid, b"stty size; tty -s && echo IS-A-$((1+1))-TTY\n")
    seen, after = read_until(client, session, pid, b"IS-A-2-TTY\r\n")
    assert b"24 80\r\n" in seen and b"IS-A-2-TTY\r\n" in seen, seen
    assert client.resize(session, pid, cols=120, rows=40)
    client.send_input(session, pid, b"stty size\n")
    seen, after = read_until(client, session, pid, b"40 120", after)
    assert b"40 120" in seen, seen
    # Ctrl-C reaches the foreground job through the terminal, not the shell.
    client.send_input(session, pid, b"sleep 30\n")
    time.sleep(0.3)
    started = time.monotonic()
    client.send_input(session, pid, b"\x03echo AFTER-$((2+2))\n")
    seen, after = read_until(client, session, pid, b"AFTER-4\r\n", after)
    assert b"AFTER-4\r\n" in seen and time.monotonic() - started < 10, seen
    with pytest.raises(BadRequest, match="EOF character"):
        client.send_input(session, pid, b"", eof=True)
    client.send_input(session, pid, b"exit 7\n")
    seen, after = read_until(client, session, pid, b"never", after)
    ended = client.process_output(session, pid, after=after, follow=True)
    assert ended["ended"] and ended["exit_code"] == 7, ended


def test_ptys_are_capped_per_owner_and_a_pipe_process_has_none_to_resize(client, session):
    plain = client.start_process(session, ["sleep", "30"])["pid"]
    with pytest.raises(BadRequest, match="no PTY"):
        client.resize(session, plain, cols=100, rows=30)
    on_ptys = [client.start_process(session, ["sleep", "30"], pty={"cols": 80, "rows": 24})["pid"]
               for _ in range(16)]
    with pytest.raises(LimitExceeded, match="PTY"):
        client.start_process(session, ["sleep", "30"], pty={"cols": 80, "rows": 24})
    for pid in on_ptys + [plain]:
        client.signal_process(session, pid, "SIGKILL")
    for pid in on_ptys:
        reply = client.process_output(session, pid, after=10**9, follow=True)
        while not reply["ended"]:
            reply = client.process_output(session, pid, after=reply["offset"], follow=True)
    # Ended, they no longer count.
    again = client.start_process(session, ["true"], pty={"cols": 80, "rows": 24})
    assert again["pid"] > 0


@pytest.mark.parametrize("request_fields, code", [
    ({"argv": []}, "bad_request"),
    ({"argv": ["a\u0000b"]}, "bad_request"),
    ({"argv": ["true"], "cwd": "relative"}, "bad_request"),
    ({"argv": ["true"], "code": "1"}, "bad_request"),
    ({"argv": ["true"], "tag": "x" * 129}, "bad_request"),
    ({"argv": ["true"], "env": {"AGENTOS_SOCKET_FD": "3"}}, "bad_request"),
    ({"argv": ["true"], "timeout_ms": 0}, "bad_request"),
    ({"argv": ["true"], "timeout_ms": 24 * 3600 * 1000 + 1}, "bad_request"),
    ({"argv": ["true"], "stdin": "yes"}, "bad_request"),
    ({"argv": "true"}, "bad_request"),
    ({"argv": ["x" * (600 * 1024)]}, "bad_request"),
    ({"argv": ["true"] * 5000}, "bad_request"),
    ({"argv": ["/no/such/program"]}, "not_found"),
    ({"argv": ["true"], "cwd": "/no/such/dir"}, "not_found"),
    ({"argv": ["/etc/passwd"]}, "permission_denied"),
    ({"argv": ["true"], "pty": {"cols": 0, "rows": 24}}, "bad_request"),
    ({"argv": ["true"], "pty": {"cols": 80, "rows": 5000}}, "bad_request"),
    ({"argv": ["true"], "pty": {"cols": 80}}, "bad_request"),
])
def test_hostile_starts_are_refused_by_name(client, session, request_fields, code):
    reply = raw_exec(client, {"op": "start", "session": session, **request_fields})
    assert reply["success"] is False and reply["code"] == code, reply


def test_an_offset_past_the_end_reads_from_the_end(client, session):
    ran = client.run_process(session, ["echo", "hi"])
    reply = client.process_output(session, ran["pid"], after=2**64 - 1)
    assert reply["chunks"] == [] and reply["offset"] == 3 and reply["ended"], reply


@pytest.mark.parametrize("request_fields", [
    {"op": "output", "pid": 0},
    {"op": "output", "pid": 4, "tag": "x"},
    {"op": "output"},
    {"op": "output", "pid": 4, "wait_ms": 60_001},
    {"op": "input", "pid": 4, "data": "!!not base64"},
    {"op": "input", "pid": 4, "data": "A" * (400 * 1024)},
    {"op": "signal", "pid": 4, "signal": "SIGSEGV"},
    {"op": "processes", "extra": 1},
    {"op": "resize", "pid": 4, "cols": 0, "rows": 10},
    {"op": "resize", "pid": 4, "cols": 10, "rows": 1001},
])
def test_hostile_process_ops_are_refused(client, session, request_fields):
    client.start_process(session, ["sleep", "5"], stdin=True)
    reply = raw_exec(client, {"session": session, **request_fields})
    assert reply["success"] is False and reply["code"] in ("bad_request", "not_found"), reply


def test_a_run_reaches_no_process_of_its_callers_session(client):
    session = "run-reaches"
    client.open_session(session, permissions={"exec": True})
    pid = client.start_process(session, ["sleep", "30"])["pid"]
    code = RUN_ASKS_KERNEL + (
        f"print(json.dumps([ask(0x02, {{'op': 'signal', 'session': {session!r}, 'pid': {pid}, 'signal': 'SIGKILL'}}),\n"
        f"                  ask(0x02, {{'op': 'start', 'session': {session!r}, 'argv': ['true']}})]))\n")
    try:
        run = client.exec(code, "python", session=session, permissions={"exec": True})
        replies = json.loads(run["stdout"])
        for reply in replies:
            assert reply["success"] is False and reply["code"] in ("not_found", "permission_denied"), reply
        alive = [p for p in client.processes(session) if p["pid"] == pid]
        assert alive[0]["state"] == "running", alive
    finally:
        client.close_session(session)


def test_a_run_asking_for_usage_sees_none_of_its_callers_sessions(client):
    # `usage` reads cgroups: a run asking for it, misspelling it or
    # sending it as a number learns nothing of its caller's sessions.
    session = "run-usage"
    client.open_session(session, permissions={"exec": True})
    code = RUN_ASKS_KERNEL + (
        "print(json.dumps([ask(0x02, {'op': 'sessions', 'usage': True}),\n"
        "                  ask(0x02, {'op': 'sessions', 'usages': True}),\n"
        "                  ask(0x02, {'op': 'sessions', 'usage': 1})]))\n")
    try:
        run = client.exec(code, "python", session=session, permissions={"exec": True})
        listed, misspelt, mistyped = json.loads(run["stdout"])
        assert listed["success"] is True and listed["sessions"] == [], listed
        for refused in (misspelt, mistyped):
            assert (refused["success"], refused["code"]) == (False, "bad_request"), refused
        mine = client.sessions(usage=True)
        assert [s["session"] for s in mine] == [session] and "usage" in mine[0], mine
    finally:
        client.close_session(session)


def raw_exec(client: AgentOSClient, request: dict) -> dict:
    """EXEC with `request` as it is, its reply unraised."""
    return decode_json(client.call(Opcode.EXEC, request), Opcode.EXEC)


def agentos(kernel, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([binary("agentos"), "--socket", kernel.socket_path, *args],
                          input=stdin, capture_output=True, text=True, timeout=60)


def test_the_cli_runs_lists_attaches_and_kills_processes(kernel, client, session):
    ran = agentos(kernel, "proc", "run", session, "--env", "X=1", "--",
                  "/bin/sh", "-c", "echo out $X $FROM_SESSION; echo err >&2; exit 4")
    assert (ran.returncode, ran.stdout, ran.stderr) == (4, "out 1 s\n", "err\n"), ran
    fed = agentos(kernel, "proc", "run", session, "-i", "--", "tr", "a-z", "A-Z", stdin="hello\n")
    assert (fed.returncode, fed.stdout) == (0, "HELLO\n"), fed
    bg = agentos(kernel, "proc", "run", session, "--bg", "--tag", "napper", "--", "sleep", "60")
    assert bg.returncode == 0, bg
    pid = int(bg.stdout)
    listed = agentos(kernel, "proc", "ps", session)
    assert "napper" in listed.stdout and "running" in listed.stdout, listed
    killed = agentos(kernel, "proc", "kill", session, str(pid), "-s", "KILL")
    assert killed.returncode == 0 and "SIGKILL sent" in killed.stdout, killed
    attached = agentos(kernel, "proc", "attach", session, str(pid))
    assert attached.returncode == 128 + 9, attached
    on_tty = agentos(kernel, "proc", "run", "-t", session, "--", "/bin/sh", "-c", "tty -s && stty size")
    assert (on_tty.returncode, on_tty.stdout) == (0, "24 80\n"), on_tty  # text mode reads \r\n as \n
    refused = agentos(kernel, "proc", "kill", session, str(pid), "-s", "SEGV")
    assert refused.returncode != 0 and "SEGV" in refused.stderr, refused
