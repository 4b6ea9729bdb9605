"""EXEC through the Python SDK and the CLI, against a real agentosd."""

from __future__ import annotations

import os
import subprocess

import pytest

from agentos import AgentOSClient, AgentOSError, BadRequest
from conftest import binary


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC's isolation needs namespaces, so root (CI runs as root)")
        return False
    return True


def test_exec_returns_the_run_and_failing_code_is_a_reply_not_an_exception(kernel):
    if not has_root():
        return
    with AgentOSClient(kernel.socket_path) as client:
        assert client.hello()["features"]["exec"] is True
        run = client.exec("print(6 * 7)")
        assert run["ok"] is True and "success" not in run
        assert (run["stdout"], run["stderr"], run["exit_code"]) == ("42\n", "", 0)
        failed = client.exec("raise ValueError('no')")
        assert failed["ok"] is False
        assert failed["exit_code"] == 1
        assert failed["error"] == "ValueError: no"
        bash = client.exec("echo $((40 + 2)); exit 3", language="bash")
        assert (bash["stdout"], bash["exit_code"]) == ("42\n", 3)
        timed = client.exec("while True: pass", timeout_ms=300)
        assert timed["timed_out"] is True and timed["signal"] == 9


def test_a_refused_run_raises_with_its_code(kernel):
    if not has_root():
        return
    with AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(BadRequest) as refused:
            client.exec("1", language="ruby")
        assert refused.value.code == "bad_request"
        assert "language" in str(refused.value)


def test_sessions_and_snapshots_through_the_sdk(kernel):
    if not has_root():
        return
    with AgentOSClient(kernel.socket_path) as client:
        client.exec("import os; open('notes.txt', 'w').write('v1'); os.symlink('/etc', 'l'); n = 1",
                    session="work")
        taken = client.snapshot("work", "v1")
        # Its files: notes.txt, and the session's environment beside.
        assert (taken["name"], taken["left_out"], taken["state"]) == ("v1", ["l"], False)
        assert taken["bytes"] >= 2
        client.exec("open('notes.txt', 'w').write('v2'); n = 2", session="work")
        assert [s["name"] for s in client.snapshots("work")] == ["v1"]
        assert client.restore("work", "v1") == []
        after = client.exec("print(open('notes.txt').read(), 'n' in globals())", session="work")
        assert after["stdout"] == "v1 False\n"
        assert [s["session"] for s in client.sessions()] == ["work"]
        assert client.close_session("work") is True
        with pytest.raises(AgentOSError) as gone:
            client.snapshots("work")
        assert gone.value.code == "not_found"


def test_a_thread_left_opening_files_does_not_end_its_session(kernel):
    # Between runs a session's interpreter swaps its output pipes: a thread
    # the code left going, opening files the while, must never be handed
    # the descriptors the next run's output goes to.
    if not has_root():
        return
    with AgentOSClient(kernel.socket_path) as client:
        churn = client.exec("import threading\n"
                            "def churn():\n"
                            "    while True:\n"
                            "        open('/workspace/churn', 'w').close()\n"
                            "threading.Thread(target=churn, daemon=True).start()",
                            session="churn")
        assert churn["ok"], churn
        for i in range(300):
            done = client.exec(f"print({i})", session="churn")
            assert (done["stdout"], done.get("fresh_interpreter")) == (f"{i}\n", None), (i, done)
        client.close_session("churn")


def test_the_cli_prints_the_output_and_exits_with_the_runs_code(kernel):
    if not has_root():
        return
    agentos = binary("agentos")
    result = subprocess.run(
        [agentos, "--socket", kernel.socket_path, "exec", "print('out'); import sys; "
         "print('err', file=sys.stderr); sys.exit(4)"],
        capture_output=True, text=True, timeout=30,
    )
    assert (result.stdout, result.returncode) == ("out\n", 4), result.stderr
    assert "err\n" in result.stderr
    piped = subprocess.run(
        [agentos, "--socket", kernel.socket_path, "exec", "--bash", "-"],
        input="echo from-stdin", capture_output=True, text=True, timeout=30,
    )
    assert (piped.stdout, piped.returncode) == ("from-stdin\n", 0), piped.stderr
