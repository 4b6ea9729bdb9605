"""Agents through the Python SDK, and the example agents, against a real
agentosd."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentos import AgentOSClient, AgentOSError, AlreadyExists, NotFound
from conftest import REPO, log_of, wait_state

AGENTS = REPO / "agents"


def test_spawn_list_and_kill_through_the_sdk(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        reply = client.spawn("worker", AGENTS / "worker_agent.py", python=sys.executable,
                             limits={"memory": "128M"})
        assert "success" not in reply
        assert reply["status"] == "running"
        agent_id = reply["id"]
        assert 0 < agent_id < 1_000_000
        listed = {a["id"]: a for a in client.list_agents()}
        assert listed[agent_id]["name"] == "worker"
        assert listed[agent_id]["limits"]["memory"] == 128 << 20
        with pytest.raises(AlreadyExists) as duplicate:
            client.spawn("worker", AGENTS / "worker_agent.py", python=sys.executable)
        assert duplicate.value.code == "already_exists"
        time.sleep(1.5)
        killed = client.kill("worker", grace_ms=3000)
        assert killed == {"killed": True, "id": agent_id}
        info = wait_state(client, agent_id, {"killed"})
        # The worker handles SIGTERM and exits cleanly, saying so.
        assert info["exit_code"] == 0
        assert "stopping after" in log_of(kernel, "worker", agent_id)
        with pytest.raises(NotFound) as gone:
            client.kill(agent_id)
        assert gone.value.code == "not_found"



def test_kill_ends_an_unsandboxed_agents_whole_process_group(kernel):
    """Without a PID namespace, SIGKILL of the agent's init would leave its
    workload running: the kernel kills the workload's process group too."""
    marker = f"agentos-unsandboxed-{os.getpid()}-{time.monotonic_ns()}"
    # A shell and its child: the group, not just its leader.
    script = f"/usr/bin/python3 -c 'import time; time.sleep(3600)' {marker} & wait"

    def left() -> str:
        found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
        return found.stdout.strip()

    with AgentOSClient(kernel.socket_path) as client:
        spawned = client.spawn("loose", command=["/bin/sh", "-c", script], sandboxed=False)
        try:
            deadline = time.monotonic() + 10
            while not left():
                assert time.monotonic() < deadline, "the workload never started"
                time.sleep(0.05)
            assert client.kill(spawned["id"], grace_ms=0)["killed"]
            wait_state(client, spawned["id"], {"killed"})
            deadline = time.monotonic() + 5
            while left():
                assert time.monotonic() < deadline, f"still running after KILL: {left()}"
                time.sleep(0.05)
        finally:
            subprocess.run(["pkill", "-KILL", "-f", marker])

def test_hello_agent_talks_to_the_kernel_as_itself(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        reply = client.spawn("greeter", AGENTS / "hello_agent.py", python=sys.executable)
        info = wait_state(client, reply["id"], {"exited", "failed"})
        assert info["exit_code"] == 0, log_of(kernel, "greeter", reply["id"])
    log = log_of(kernel, "greeter", reply["id"])
    assert f"hello from agent {reply['id']} (greeter)" in log
    assert "echo: Hello!" in log


def test_relative_script_paths_are_made_absolute_by_the_sdk(kernel, monkeypatch):
    monkeypatch.chdir(AGENTS)
    with AgentOSClient(kernel.socket_path) as client:
        reply = client.spawn("relative", "hello_agent.py", python=sys.executable)
        assert reply["status"] == "running"


def test_missing_script_is_a_clear_error(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(AgentOSError) as err:
            client.spawn("nothing", "/no/such/agent.py")
    assert err.value.code == "not_found"
    assert "/no/such/agent.py" in err.value.message


def test_spawn_test_agent_runs_as_an_operator_script(kernel):
    env = dict(os.environ, AGENTOS_SOCKET=kernel.socket_path)
    out = subprocess.run([sys.executable, AGENTS / "spawn_test.py"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "duplicate refused: already_exists" in out.stdout
    assert "all killed" in out.stdout


def test_spawn_test_agent_runs_as_an_agent_spawning_children_from_its_own_view(kernel):
    """As an agent, it names its workers' script and interpreter by the paths
    it sees; the kernel resolves them in its view, and LIST shows it its
    workers, which it may kill."""
    with AgentOSClient(kernel.socket_path) as client:
        reply = client.spawn("orchestrator", AGENTS / "spawn_test.py", python=sys.executable,
                             permissions={"spawn": True})
        info = wait_state(client, reply["id"], {"exited", "failed"}, timeout=60)
        log = log_of(kernel, "orchestrator", reply["id"])
        assert info["exit_code"] == 0, log
        assert "duplicate refused: already_exists" in log
        assert "all killed" in log
        workers = [a for a in client.list_agents() if a["name"].startswith("worker-")]
        assert len(workers) == 3 and all(a["state"] == "killed" for a in workers), workers


def test_fault_isolation_demo_prints_its_table(kernel):
    if os.geteuid() != 0:
        print("!!! NOT TESTED: the fault isolation demo needs cgroups, so root (CI runs as root)")
        return
    env = dict(os.environ, AGENTOS_SOCKET=kernel.socket_path)
    out = subprocess.run([sys.executable, AGENTS / "fault_isolation_demo.py", "--seconds", "3"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    for expected in ("THROTTLED", "KILLED (OOM)", "CONTAINED", "RUNNING", "RESPONSIVE"):
        assert expected in out.stdout, out.stdout
