"""A sandbox's commands through `agentos e2b`, driven by E2B's own
Python SDK: envd's `process` service over Connect's JSON, onto the
kernel's processes in the sandbox's session. An E2B sandbox is one
machine: a server one command starts is there for the next."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Iterator, Optional

import pytest

from conftest import Kernel, root_kernel
from e2b_face import E2bFace, create, face, made  # noqa: F401

import e2b
from e2b import AuthenticationException, CommandExitException, PtySize, SandboxException


@pytest.fixture(scope="module")
def kernel() -> Iterator[Optional[Kernel]]:
    yield from root_kernel("E2B sandboxes' commands (processes in sessions)")


@pytest.fixture
def sandbox(face, made) -> e2b.Sandbox:
    return create(face, made, envs={"FROM_CREATE": "yes"})


def connect_call(face: E2bFace, sandbox_id: str, token: str, method: str, message: dict,
                 headers: Optional[dict] = None) -> tuple[int, dict]:
    """A unary Connect call by hand: its status and JSON body."""
    request = urllib.request.Request(
        f"{face.url}/process.Process/{method}", data=json.dumps(message).encode(),
        method="POST", headers={"Content-Type": "application/json",
                                "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983",
                                "X-Access-Token": token, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def test_a_command_runs_as_the_sandboxs_user_with_its_output_and_exit(sandbox):
    started = time.monotonic()
    result = sandbox.commands.run(
        "echo out; echo err >&2; pwd; echo $FROM_CREATE $MINE $USER $HOME $E2B_SANDBOX",
        envs={"MINE": "mine"})
    took = time.monotonic() - started
    assert result.exit_code == 0
    assert result.stdout == f"out\n/home/user\nyes mine user /home/user true\n", result
    assert result.stderr == "err\n"
    print(f"first command took {took * 1000:.0f} ms")
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo nope >&2; exit 3")
    assert failed.value.exit_code == 3 and "nope" in failed.value.stderr
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.commands.run("mkdir -p ~/sub")
    assert sandbox.commands.run("pwd", cwd="sub").stdout == "/home/user/sub\n"
    # `bash -l` reads /etc/profile, which sets PATH anew: the session's
    # own programs come first again.
    path = sandbox.commands.run("echo $PATH").stdout
    assert path.startswith("/home/user/.venv/bin:"), path


def test_output_streams_as_it_comes_and_a_later_command_reaches_a_server(sandbox):
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done",
                         on_stdout=lambda line: seen.append((time.monotonic() - started, line)))
    assert [line for _, line in seen] == ["1\n", "2\n", "3\n"], seen
    assert seen[-1][0] - seen[0][0] > 0.4, "each line came as it was printed"
    server = sandbox.commands.run("python3 -m http.server 8123", background=True, timeout=0)
    fetched = sandbox.commands.run(
        "for i in $(seq 50); do python3 -c \"import urllib.request;"
        "print(urllib.request.urlopen('http://localhost:8123').status)\" 2>/dev/null && exit 0;"
        " sleep 0.1; done; exit 1")
    assert fetched.stdout.strip() == "200"
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert listed[server.pid].cmd == "/bin/bash"
    assert listed[server.pid].args[-1] == "python3 -m http.server 8123"
    assert sandbox.commands.kill(server.pid) is True
    # A kill is sent, as envd's is: the process goes once it has died.
    deadline = time.monotonic() + 5
    while server.pid in {p.pid for p in sandbox.commands.list()}:
        assert time.monotonic() < deadline, "the killed server is still listed"
        time.sleep(0.05)
    assert sandbox.commands.kill(999999) is False


def test_input_is_written_then_closed_and_streamed(sandbox):
    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(cat.pid, "hello\n")
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "hello\n"
    counted = sandbox.commands.run("wc -c", background=True, stdin=True)
    sandbox.commands.stream_input(counted.pid, [b"ab", "cd", b"e" * 70000])
    sandbox.commands.close_stdin(counted.pid)
    assert counted.wait().stdout.strip() == "70004"


def test_connect_follows_a_running_command_from_now_and_a_timeout_kills_it(sandbox):
    ticking = sandbox.commands.run("for i in $(seq 30); do echo tick$i; sleep 0.2; done",
                                   background=True)
    time.sleep(0.7)
    again = sandbox.commands.connect(ticking.pid)
    first = []
    for stdout, _, _ in again:
        if stdout:
            first.append(stdout)
            break
    assert first and first[0] != "tick1\n", first
    again.disconnect()
    sandbox.commands.kill(ticking.pid)
    # A command's timeout is its process's (the SDK's stream ends at the
    # same time): it is killed even with no client following it.
    sleeper = sandbox.commands.run("sleep 30", background=True, timeout=1)
    sleeper.disconnect()
    deadline = time.monotonic() + 10
    while sleeper.pid in {p.pid for p in sandbox.commands.list()}:
        assert time.monotonic() < deadline, "the timeout did not kill it"
        time.sleep(0.1)
    with pytest.raises(CommandExitException) as killed:
        sandbox.commands.connect(sleeper.pid, timeout=10).wait()
    assert killed.value.exit_code == -1 and "signal: killed" in (killed.value.error or ""), \
        killed.value


def test_a_pty_runs_a_shell_that_takes_keys_and_a_new_size(sandbox):
    output = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    sandbox.pty.send_stdin(terminal.pid, b"stty size; echo $TERM\n")
    # The new size is given once the shell has answered at the old one.
    for _, _, pty in terminal:
        output.extend(pty or b"")
        if b"xterm-256color" in output:
            break
    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    terminal.wait(on_pty=output.extend)
    text = output.decode(errors="replace")
    assert "24 80" in text and "xterm-256color" in text and "40 120" in text, text


def test_users_tokens_and_keys_are_checked(face, made, sandbox):
    # The sandbox has one user: `root` and `user` are it, others unknown.
    assert sandbox.commands.run("whoami", user="root").exit_code == 0
    with pytest.raises(AuthenticationException):
        sandbox.commands.run("true", user="bob")
    # Another key's sandbox's token does not reach this one.
    bobs = create(face, made, key="bob")
    status, body = connect_call(face, sandbox.sandbox_id, bobs._envd_access_token, "List", {})
    assert status == 401, body
    status, body = connect_call(face, sandbox.sandbox_id, sandbox._envd_access_token, "List", {})
    assert status == 200 and "processes" in body, body
    status, body = connect_call(face, sandbox.sandbox_id, sandbox._envd_access_token,
                                "SendSignal", {"process": {"pid": 1}, "signal": "SIGNAL_SIGSTOP"})
    assert (status, body.get("code")) == (501, "unimplemented"), body
    status, body = connect_call(face, sandbox.sandbox_id, sandbox._envd_access_token,
                                "SendInput", {"process": {}})
    assert (status, body.get("code")) == (400, "invalid_argument"), body
    status, body = connect_call(face, sandbox.sandbox_id, sandbox._envd_access_token,
                                "Nope", {})
    assert status == 501, body


def test_a_paused_sandbox_runs_nothing_until_it_is_connected_again(face, sandbox):
    sandbox.pause()
    with pytest.raises(SandboxException):
        sandbox.commands.run("true")
    e2b.Sandbox.connect(sandbox.sandbox_id, api_key=face.keys["alice"])
    assert sandbox.commands.run("echo back").stdout == "back\n"


def raw_call(face: E2bFace, sandbox: e2b.Sandbox, method: str, body: bytes,
             content_type: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(
        f"{face.url}/process.Process/{method}", data=body, method="POST",
        headers={"Content-Type": content_type, "E2b-Sandbox-Id": sandbox.sandbox_id,
                 "E2b-Sandbox-Port": "49983", "X-Access-Token": sandbox._envd_access_token})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def end_stream_error(body: bytes) -> dict:
    """The error of a Connect stream's end message (the last envelope)."""
    offset, last = 0, None
    while offset + 5 <= len(body):
        flags, length = body[offset], int.from_bytes(body[offset + 1:offset + 5], "big")
        last = (flags, body[offset + 5:offset + 5 + length])
        offset += 5 + length
    assert last is not None and last[0] & 2, body
    return json.loads(last[1]).get("error", {})


def test_malformed_connect_requests_are_refused_in_connects_terms(face, sandbox):
    stream = "application/connect+json"
    start = json.dumps({"process": {"cmd": "true"}}).encode()
    cases = {
        "compressed": b"\x01" + len(start).to_bytes(4, "big") + start,
        "too long": b"\x00" + (5 << 20).to_bytes(4, "big") + b"{}",
        "cut short": b"\x00" + (100).to_bytes(4, "big") + b"{}",
        "not json": b"\x00" + (3).to_bytes(4, "big") + b"{x}",
        "empty": b"",
    }
    for name, body in cases.items():
        status, kind, answered = raw_call(face, sandbox, "Start", body, stream)
        assert (status, kind) == (200, stream), (name, status, answered)
        error = end_stream_error(answered)
        assert error.get("code") in ("invalid_argument", "resource_exhausted"), (name, error)
    status, kind, answered = raw_call(face, sandbox, "SendInput", b"x" * (5 << 20),
                                      "application/json")
    assert status == 400 and json.loads(answered)["code"] == "invalid_argument", answered
    status, _, answered = raw_call(face, sandbox, "SendInput", b"[1, 2",
                                   "application/json")
    assert status == 400, answered
    assert sandbox.commands.run("echo still").stdout == "still\n"


def test_a_command_flood_from_one_key_leaves_another_served(face, made, sandbox):
    import concurrent.futures

    flooding = create(face, made, key="bob")
    with concurrent.futures.ThreadPoolExecutor(max_workers=24) as pool:
        flood = [pool.submit(flooding.commands.run, "sleep 1; echo done") for _ in range(48)]
        time.sleep(0.3)
        started = time.monotonic()
        served = sandbox.commands.run("echo served")
        took = time.monotonic() - started
        results = []
        for future in flood:
            try:
                results.append(future.result().stdout)
            except Exception as err:  # the flood may meet its own caps
                results.append(type(err).__name__)
    assert served.stdout == "served\n"
    assert took < 5, f"another key's command took {took:.1f} s during the flood"
    assert results.count("done\n") >= 24, results
