"""TASK through the Python SDK and the CLI, against a real agentosd."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from agentos import AgentOSClient, AgentOSError
from conftest import binary


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC tasks need namespaces, so root (CI runs as root)")
        return False
    return True


def test_three_tasks_dispatched_work_goes_on_and_all_are_collected(kernel):
    if not has_root():
        pytest.skip("needs root")
    with AgentOSClient(kernel.socket_path, timeout=120) as client:
        ids = [
            client.dispatch("exec", {"code": f"import time\ntime.sleep(0.3)\nprint({i} * 7)"},
                            label=f"job {i}")
            for i in range(3)
        ]
        # Work goes on meanwhile: the connection answers other requests.
        assert client.echo("still here") == "still here"
        statuses = {client.task_status(i)["state"] for i in ids}
        assert statuses <= {"queued", "running", "completed"}
        results = [client.wait_task(i, timeout=60) for i in ids]
        assert [r["state"] for r in results] == ["completed"] * 3
        assert [r["result"]["stdout"] for r in results] == ["0\n", "7\n", "14\n"]
        assert [r["label"] for r in results] == ["job 0", "job 1", "job 2"]
        listed = client.list_tasks(kind="exec", limit=2)
        assert [t["task_id"] for t in listed] == [ids[2], ids[1]]
        assert [t["task_id"] for t in client.list_tasks(before=listed[-1]["task_id"])] == [ids[0]]
        assert [t["task_id"] for t in client.list_tasks()] == ids[::-1]


def test_cancel_and_errors_through_the_sdk(kernel):
    if not has_root():
        pytest.skip("needs root")
    with AgentOSClient(kernel.socket_path, timeout=60) as client:
        task = client.dispatch("exec", {"code": "while True:\n    pass", "timeout_ms": 60_000})
        deadline = time.monotonic() + 20
        while client.task_status(task)["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert client.cancel_task(task) is True
        assert client.task_status(task)["state"] == "cancelled"
        assert client.cancel_task(task) is False
        with pytest.raises(AgentOSError) as missing:
            client.task_status("t-0123456789abcdef")
        assert missing.value.code == "not_found"
        with pytest.raises(AgentOSError) as bad:
            client.dispatch("exec", {"code": 5})
        assert bad.value.code == "bad_request" and "request" in str(bad.value)


def test_the_cli_dispatches_waits_lists_and_cancels(kernel):
    if not has_root():
        pytest.skip("needs root")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([binary("agentos"), "--socket", kernel.socket_path, *args],
                              capture_output=True, text=True, timeout=120)

    dispatched = cli("task", "dispatch", "--label", "from the cli", "print(6 * 7)")
    assert dispatched.returncode == 0, dispatched.stderr
    task_id = dispatched.stdout.strip()
    assert task_id.startswith("t-")
    waited = cli("task", "wait", task_id)
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout == "42\n"
    listed = cli("task", "list")
    assert task_id in listed.stdout and "completed" in listed.stdout and "from the cli" in listed.stdout
    failing = cli("task", "dispatch", "raise SystemExit(3)")
    assert cli("task", "wait", failing.stdout.strip()).returncode == 1
    assert "had already ended" in cli("task", "cancel", task_id).stdout
    # An operator lists everyone's, each with its owner.
    everyone = cli("task", "list", "--owner", "*")
    assert everyone.returncode == 0, everyone.stderr
    assert "OWNER" in everyone.stdout.splitlines()[0]
    line = next(l for l in everyone.stdout.splitlines() if task_id in l)
    assert f"uid {os.geteuid()}" in line, everyone.stdout
    with AgentOSClient(kernel.socket_path) as client:
        listed = client.list_tasks(owner="*")
        assert {"kind": "operator", "uid": os.geteuid()} in [t["owner"] for t in listed]


def test_run_reports_a_loop_that_cannot_think(kernel):
    # This kernel has no LLM: the loop's first THINK is refused, and the
    # task says so rather than hanging or pretending.
    with AgentOSClient(kernel.socket_path, timeout=60) as client:
        task = client.run("What is 2+2?", max_iterations=2, label="no model")
        assert task["kind"] == "prompt" and task["label"] == "no model"
        assert task["state"] == "failed"
        assert task["result"]["code"] == "unavailable"
        assert "THINK" in task["result"]["error"]
    out = subprocess.run([binary("agentos"), "--socket", kernel.socket_path, "run", "2+2?"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "failed" in out.stderr and "THINK" in out.stderr


@pytest.fixture
def stub_model():
    from stub_model import StubModel

    model = StubModel([])
    yield model
    model.close()


def test_run_stops_a_model_that_repeats_failing_code_and_shows_tools_as_signatures(stub_model):
    if not has_root():
        return
    from conftest import kernel_with

    fence = "`" * 3
    failing = f"{fence}python\nimport tools\nprint(tools.llm.think('a', 'b', 1, 0.5, 'e'))\n{fence}"
    # The same block three times, the second with blank space around it.
    stub_model.answers = [failing, failing.replace("import", "\n\nimport"), failing]
    with kernel_with(stub_model.config()) as kernel, \
            AgentOSClient(kernel.socket_path, timeout=60) as client:
        task = client.run("ask the model", max_iterations=8)
    assert task["state"] == "failed", task
    result = task["result"]
    assert result["error"] == "the model repeated the same failing code 3 times in a row"
    ran, nudged = result["iterations"]
    assert "takes 4 positional arguments but 5 were given" in ran["stderr"]
    assert nudged["exit_code"] is None
    assert nudged["stderr"].startswith("not run: this exact code already failed with: TypeError")
    # Three THINKs: the code ran once; the second answer got a nudge.
    assert len(stub_model.requests) == 3
    system = stub_model.requests[0]["messages"][0]["content"]
    assert ("tools.llm.think(prompt, system=None, max_tokens=None, temperature=None)"
            "  # Ask the kernel's shared LLM") in system, system
    nudge = stub_model.requests[2]["messages"][-1]["content"]
    assert nudge.startswith("This exact code already failed with: TypeError: tools.llm.think("), nudge
