"""What each AgentOSClient method sends and returns, against a fake kernel."""

from __future__ import annotations

import base64
import time

import pytest
from fake_kernel import fake_kernel, socket_dir  # noqa: F401  (fixtures)

from agentos import AgentOSClient, NotFound, ProtocolError, Timeout

RUN = {
    "success": True, "stdout": "42\n", "stderr": "", "exit_code": 0, "signal": None,
    "error": None, "duration_ms": 3, "timed_out": False, "oom_killed": False,
    "truncated": {"stdout": 0, "stderr": 0}, "tool_calls": 0, "tool_bytes": 0,
    "files": {"out.bin": base64.b64encode(b"\x00\xffdata").decode()}, "session": None,
}


def task(task_id: str, state: str, **extra) -> dict:
    return {"task_id": task_id, "kind": "exec", "label": None, "state": state,
            "created_at": "2026-11-26T08:00:00Z", "started_at": None,
            "finished_at": extra.pop("finished_at", None), "progress": None, **extra}


def test_exec_sends_files_as_base64_and_returns_collected_files_as_bytes(fake_kernel):
    fake = fake_kernel([RUN])
    with AgentOSClient(fake.path, timeout=5) as client:
        run = client.exec("print(42)", files={"a.csv": b"x,y\n1,2\n", "b.txt": "text"},
                          collect=["out.bin"], limits={"memory": "64M", "cpus": 0.5})
    [request] = fake.json_requests()
    assert request["files"] == {"a.csv": base64.b64encode(b"x,y\n1,2\n").decode(),
                                "b.txt": base64.b64encode(b"text").decode()}
    assert request["collect"] == ["out.bin"]
    # A run's period is the kernel's; its share goes as a quota alone.
    assert request["limits"] == {"memory": 64 << 20, "cpu_quota": 50_000}
    assert run["files"] == {"out.bin": b"\x00\xffdata"}
    assert run["ok"] is True and "success" not in run
    assert run["stdout"] == "42\n"


def test_a_collected_file_that_is_not_base64_is_a_protocol_error(fake_kernel):
    fake = fake_kernel([{**RUN, "files": {"out.bin": "not base64!"}}])
    with AgentOSClient(fake.path, timeout=5) as client:
        with pytest.raises(ProtocolError, match="out.bin"):
            client.exec("print(42)", collect=["out.bin"])


def test_code_that_fails_is_a_result_not_an_exception(fake_kernel):
    failed = {**RUN, "success": False, "exit_code": 1, "error": "ZeroDivisionError: x",
              "files": {}}
    fake = fake_kernel([failed])
    with AgentOSClient(fake.path, timeout=5) as client:
        run = client.exec("1/0")
    assert run["ok"] is False and run["exit_code"] == 1 and run["files"] == {}


def test_item_results_carry_no_success_key(fake_kernel):
    hello = {"success": True, "protocol_version": 1, "kernel_version": "0.1.0",
             "agent_id": 1_000_000, "features": {}}
    spawned = {"success": True, "id": 7, "name": "w", "pid": 42, "status": "running",
               "isolation": {}}
    killed = {"success": True, "killed": True, "id": 7}
    fake = fake_kernel([hello, spawned, killed])
    with AgentOSClient(fake.path, timeout=5) as client:
        results = [client.hello(), client.spawn("w", command=["/bin/true"],
                                                limits={"memory": "1G", "max_pids": 8}),
                   client.kill("w")]
    assert [{k: v for k, v in r.items()} for r in results] == [
        {k: v for k, v in reply.items() if k != "success"} for reply in (hello, spawned, killed)
    ]
    assert fake.json_requests()[1]["limits"] == {"memory": 1 << 30, "max_pids": 8}


def test_list_operations_return_lists(fake_kernel):
    listing = {"success": True, "tools": [{"server": "s", "name": "t"}],
               "servers": [{"name": "s", "state": "ready", "error": None, "tools": 1}]}
    fake = fake_kernel([[], listing, listing, {"success": True, "sessions": []},
                        {"success": True, "tasks": [task("t-2", "completed")], "next": "t-2"},
                        {"success": True, "tasks": [task("t-1", "queued")], "next": None}])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert client.list_agents() == []
        assert client.tools() == listing["tools"]
        assert client.tool_servers() == listing["servers"]
        assert client.sessions() == []
        assert [t["task_id"] for t in client.list_tasks(kind="exec")] == ["t-2", "t-1"]
    pages = fake.json_requests()[4:]
    assert pages[1]["before"] == "t-2" and pages[0]["kind"] == pages[1]["kind"] == "exec"


def test_list_tasks_stops_at_its_limit(fake_kernel):
    fake = fake_kernel([{"success": True, "tasks": [task("t-9", "queued")], "next": "t-9"}])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert [t["task_id"] for t in client.list_tasks(limit=1)] == ["t-9"]
    assert fake.json_requests() == [{"op": "list", "limit": 1}]


def test_logs_is_text_and_follow_logs_ends_with_the_agent(fake_kernel):
    def piece(text, offset, ended):
        return {"success": True, "id": 3, "name": "w", "state": "running", "text": text,
                "offset": offset, "ended": ended, "truncated": False}

    fake = fake_kernel([piece("a\n", 2, False), piece("a\n", 2, False), piece("", 2, False),
                        piece("b\n", 4, True)])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert client.logs("w", lines=5) == "a\n"
        assert list(client.follow_logs("w")) == ["a\n", "b\n"]
    requests = fake.json_requests()
    assert requests[0] == {"name": "w", "lines": 5}
    assert requests[2]["after"] == 2 and requests[2]["follow"] is True
    assert requests[3]["after"] == 2


def test_a_request_with_its_own_deadline_outwaits_the_client_timeout(fake_kernel):
    """EXEC with timeout_ms, THINK, and a task wait each answer after the
    client's socket timeout; none of them is cut short."""
    answer = {"success": True, "content": "4", "tokens": 1}
    fake = fake_kernel([("delay", 1.0, RUN), ("delay", 1.0, answer),
                        ("delay", 1.0, {"success": True, "task": task("t-1", "completed")})])
    with AgentOSClient(fake.path, timeout=0.3) as client:
        assert client.exec("import time; time.sleep(1)", timeout_ms=5_000)["ok"]
        assert client.think("2+2?")["content"] == "4"
        assert client.wait_task("t-1")["state"] == "completed"
        assert client.connected


def test_a_request_without_a_deadline_keeps_the_client_timeout(fake_kernel):
    fake = fake_kernel([("delay", 1.0, [])])
    with AgentOSClient(fake.path, timeout=0.3) as client:
        with pytest.raises(Timeout):
            client.list_agents()


def test_wait_task_polls_until_the_task_ends(fake_kernel):
    fake = fake_kernel([{"success": True, "task": task("t-1", "running")},
                        {"success": True, "task": task("t-1", "running")},
                        {"success": True, "task": task("t-1", "completed", result=RUN)}])
    with AgentOSClient(fake.path, timeout=5) as client:
        done = client.wait_task("t-1")
    assert done["state"] == "completed"
    assert done["result"]["ok"] is True and done["result"]["files"] == {"out.bin": b"\x00\xffdata"}
    assert len(fake.requests) == 3


def test_wait_task_raises_timeout_error_at_its_own_timeout(fake_kernel):
    def still_running(request):
        time.sleep(min(request["timeout_ms"], 200) / 1000)
        return {"success": True, "task": task("t-1", "running")}

    fake = fake_kernel([still_running] * 20)
    started = time.monotonic()
    with AgentOSClient(fake.path, timeout=5) as client:
        with pytest.raises(TimeoutError, match="still running"):
            client.wait_task("t-1", timeout=0.5)
    assert time.monotonic() - started < 3
    assert all(r["timeout_ms"] <= 500 for r in fake.json_requests())


def test_wait_task_for_a_task_not_yours_is_not_found(fake_kernel):
    fake = fake_kernel([{"success": False, "code": "not_found", "error": "no task t-x"}])
    with AgentOSClient(fake.path, timeout=5) as client:
        with pytest.raises(NotFound):
            client.wait_task("t-x")


def test_as_completed_yields_tasks_in_the_order_they_end(fake_kernel):
    rounds = iter([
        {"t-1": "running", "t-2": "completed", "t-3": "running"},
        {"t-1": "completed", "t-3": "running"},
        {"t-3": "failed"},
    ])
    states: dict = {}

    def answer(request):
        if not states or request["task_id"] not in states:
            states.clear()
            states.update(next(rounds))
        state = states.pop(request["task_id"])
        finished = "2026-11-26T08:00:01Z" if state != "running" else None
        return {"success": True, "task": task(request["task_id"], state, finished_at=finished)}

    fake = fake_kernel([answer] * 6)
    with AgentOSClient(fake.path, timeout=5) as client:
        ended = [(t["task_id"], t["state"]) for t in client.as_completed(["t-1", "t-2", "t-3"])]
    assert ended == [("t-2", "completed"), ("t-1", "completed"), ("t-3", "failed")]


def test_as_completed_waits_in_the_first_batch_only(fake_kernel):
    ids = [f"t-{i}" for i in range(40)]

    def answer(request):
        return {"success": True, "task": task(request["task_id"], "completed")}

    fake = fake_kernel([answer] * len(ids))
    with AgentOSClient(fake.path, timeout=5) as client:
        assert sorted(t["task_id"] for t in client.as_completed(ids)) == sorted(ids)
    waits = [r["timeout_ms"] for r in fake.json_requests()]
    assert waits == [250] * 32 + [0] * 8


def test_as_completed_raises_timeout_for_tasks_still_going(fake_kernel):
    def running(request):
        time.sleep(request["timeout_ms"] / 1000)
        return {"success": True, "task": task(request["task_id"], "running")}

    fake = fake_kernel([running] * 50)
    with AgentOSClient(fake.path, timeout=5) as client:
        with pytest.raises(TimeoutError, match="t-1"):
            list(client.as_completed(["t-1"], timeout=0.4))


def test_limits_are_checked_before_anything_is_sent(socket_dir):
    client = AgentOSClient(socket_dir / "none.sock")
    with pytest.raises(ValueError, match="unknown unit"):
        client.spawn("w", command=["/bin/true"], limits={"memory": "1.5G"})
    with pytest.raises(ValueError, match="not both"):
        client.exec("1", limits={"cpus": 1, "cpu_quota": 5000})
    with pytest.raises(ValueError, match="unknown limit"):
        client.exec("1", limits={"memroy": "1G"})
    assert not client.connected
