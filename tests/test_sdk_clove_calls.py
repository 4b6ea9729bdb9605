"""The Python SDK's calls for the Clove SDK's opcodes — permissions, files,
pause and resume, metrics, the state store, names and messages, events,
the audit log, record and replay, asynchronous EXEC — against a real
agentosd, as a user of the SDK meets them."""

from __future__ import annotations

import os
import time

import pytest

from agentos import AgentOSClient
from agentos.errors import AlreadyExists, BadRequest, LimitExceeded, NotFound, PermissionDenied

ROOT = os.geteuid() == 0


def test_permissions_only_lower_and_only_this_connection(kernel):
    with AgentOSClient(kernel.socket_path) as lowered, AgentOSClient(kernel.socket_path) as other:
        assert lowered.get_permissions()["permissions"]["level"] == "unrestricted"
        kept = lowered.set_permissions(level="readonly")["permissions"]
        assert kept["level"] == "readonly" and not kept["write"] and kept["read"]
        with pytest.raises(PermissionDenied, match="can_write"):
            lowered.set_permissions(permissions={"can_write": True})
        with pytest.raises(BadRequest, match="permissions.exec"):
            lowered.set_permissions(permissions={"exec": ["ls"]})
        with pytest.raises(PermissionDenied, match="write"):
            lowered.write_file("/tmp/never-written-by-a-readonly-connection", "x")
        assert other.get_permissions()["permissions"]["level"] == "unrestricted"


def test_files_are_written_appended_and_read_back(kernel, tmp_path):
    path = str(tmp_path / "deep" / "notes.txt")
    with AgentOSClient(kernel.socket_path) as client:
        assert client.write_file(path, "one\n")["bytes_written"] == 4
        assert client.write_file(path, "two\n", mode="append")["bytes_written"] == 4
        read = client.read_file(path)
        assert read["content"] == "one\ntwo\n" and read["size"] == 8
        with pytest.raises(NotFound):
            client.read_file(str(tmp_path / "missing.txt"))
        with pytest.raises(BadRequest, match="mode"):
            client.write_file(path, "x", mode="truncate")


@pytest.mark.skipif(not ROOT, reason="the cgroup freezer needs a kernel running as root")
def test_an_agent_is_paused_and_resumed_by_name(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        assert client.hello()["features"]["pause"] is True
        spawned = client.spawn("pausable", command=["/bin/sleep", "30"])
        assert client.pause("pausable")["state"] == "paused"
        states = {a["id"]: a["state"] for a in client.list_agents()}
        assert states[spawned["id"]] == "paused"
        assert client.resume(spawned["id"])["state"] == "running"
        with pytest.raises(NotFound):
            client.pause("no-such-agent")


def test_metrics_are_numbers_and_name_agents_never_paths(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        system = client.system_metrics()["metrics"]
        assert system["cpu"]["count"] >= 1 and len(system["cpu"]["load_avg"]) == 3
        assert system["memory"]["total"] > 0
        everyone = client.all_agent_metrics()
        assert everyone["count"] == len(everyone["agents"])
        with pytest.raises(BadRequest, match="never a path"):
            client.cgroup_metrics("../../sys")


def test_the_state_store_keeps_json_by_key_with_the_callers_own_first(kernel):
    value = {"message": "hello", "number": 123, "nested": {"a": [1, 2]}}
    with AgentOSClient(kernel.socket_path) as client, AgentOSClient(kernel.socket_path) as other:
        assert client.store("sdk:doc", value)["scope"] == "global"
        assert client.store("sdk:doc", "mine", scope="agent")["scope"] == "agent"
        # Another connection of the same uid is the same operator.
        own = other.fetch("sdk:doc")
        assert own["exists"] and own["value"] == "mine" and own["scope"] == "agent"
        assert other.fetch("sdk:doc", scope="global")["value"] == value
        assert client.list_keys(prefix="sdk:") == {
            "success": True, "keys": ["sdk:doc"], "count": 1, "truncated": False}
        assert client.delete_key("sdk:doc")["scope"] == "agent"
        assert client.fetch("sdk:doc")["value"] == value
        assert "expires_at" in client.store("sdk:brief", 1, ttl=0.2)
        time.sleep(0.3)
        assert client.fetch("sdk:brief") == {"success": True, "exists": False, "value": None}
        with pytest.raises(BadRequest, match="scope"):
            client.store("sdk:x", 1, scope="world")
        with pytest.raises(BadRequest, match="ttl"):
            client.store("sdk:x", 1, ttl=-5)
        deep: object = 1
        for _ in range(40):
            deep = [deep]
        with pytest.raises(LimitExceeded, match="32"):
            client.store("sdk:x", deep)


@pytest.mark.skipif(not ROOT, reason="EXEC's isolation needs namespaces, so root")
def test_an_async_exec_is_polled_once(kernel):
    import json
    import time

    with AgentOSClient(kernel.socket_path) as client:
        accepted = client.exec_async("print('later')", request_id=41)
        assert accepted["request_id"] == 41 and accepted["task_id"]
        deadline = time.monotonic() + 20
        found = []
        while not found and time.monotonic() < deadline:
            found = [r for r in client.poll_async()["results"] if r["request_id"] == 41]
            time.sleep(0.1)
        assert found, "the result never came"
        assert json.loads(found[0]["payload"])["stdout"] == "later\n"
        assert not [r for r in client.poll_async()["results"] if r["request_id"] == 41]


def test_a_recording_is_exported_and_replayed_as_its_caller(kernel):
    import json

    with AgentOSClient(kernel.socket_path) as client:
        assert client.start_recording(max_entries=50)["state"] == "RECORDING"
        client.store("replayed", {"n": 1})
        assert client.stop_recording()["entry_count"] == 1
        recording = client.get_recording_status(export=True)["recording"]
        assert json.loads(recording)[0]["opcode_name"] == "STORE"
        client.delete_key("replayed")
        assert client.start_replay(recording)["entries_replayed"] == 1
        assert client.fetch("replayed")["value"] == {"n": 1}
        assert client.get_replay_status()["state"] == "COMPLETED"


def test_connections_message_each_other_by_name_and_id(kernel):
    with AgentOSClient(kernel.socket_path) as main, AgentOSClient(kernel.socket_path) as other:
        me = main.register_name("sdk-main")
        assert me["name"] == "sdk-main" and me["agent_id"] >= 1_000_000
        with pytest.raises(AlreadyExists, match="sdk-main"):
            other.register_name("sdk-main")
        other_id = other.register_name("sdk-other")["agent_id"]
        assert main.send_message({"task": 1}, to_name="sdk-other")["delivered_to"] == other_id
        assert other.send_message({"answer": 2}, to=me["agent_id"])["success"]
        got = main.recv_messages(max_messages=10)
        assert got["count"] == 1 and got["remaining"] == 0
        message = got["messages"][0]
        assert message["from_id"] == message["from"] == other_id
        assert message["from_name"] == "sdk-other" and message["message"] == {"answer": 2}
        # The other connection, and any agent of this uid the suite left.
        assert main.broadcast({"event": "bye"})["delivered_count"] >= 1
        assert other.recv_messages()["messages"][-1]["message"] == {"event": "bye"}
        with pytest.raises(NotFound):
            main.send_message(1, to_name="nobody-here")
        with pytest.raises(LimitExceeded, match="message"):
            main.send_message("x" * 70_000, to=other_id)


def test_the_audit_log_records_a_spawn_and_a_kill_and_pages_forwards(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        config = client.set_audit_config(log_syscalls=False, max_entries=1000)["config"]
        assert config["max_entries"] == 1000 and config["log_security"] is True
        with pytest.raises(PermissionDenied, match="log_security"):
            client.set_audit_config(log_security=False)
        agent = client.spawn("sdk-audited", command=["/bin/sleep", "30"], sandboxed=False)
        client.kill(agent["id"])
        deadline = time.monotonic() + 10
        while True:
            lifecycle = client.get_audit_log(category="AGENT_LIFECYCLE", agent_id=agent["id"])
            kinds = [e["event_type"] for e in lifecycle["entries"]]
            if "AGENT_EXITED" in kinds or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert kinds == ["AGENT_SPAWNED", "AGENT_KILLED", "AGENT_EXITED"]
        assert all(e["agent_name"] == "sdk-audited" for e in lifecycle["entries"])
        first = client.get_audit_log(limit=2)
        assert first["count"] == 2 and first["more"] is True
        rest = client.get_audit_log(since_id=first["entries"][-1]["id"], limit=1000)
        ids = [e["id"] for e in first["entries"] + rest["entries"]]
        assert ids == sorted(set(ids)) and rest["more"] is False
        with pytest.raises(BadRequest, match="category"):
            client.get_audit_log(category="EVERYTHING")


def test_events_reach_subscribers_and_a_forged_kernel_event_is_refused(kernel):
    with AgentOSClient(kernel.socket_path) as client, AgentOSClient(kernel.socket_path) as other:
        assert client.subscribe(["AGENT_EXITED", "CUSTOM"])["subscribed"] == [
            "AGENT_EXITED", "CUSTOM"]
        assert other.subscribe(["job.done"])["subscribed"] == ["job.done"]
        assert client.emit_event("job.done", {"n": 1})["delivered_to"] == 2
        assert client.emit_event("other")["delivered_to"] == 1
        polled = other.poll_events()
        assert polled["count"] == 1 and polled["dropped"] == 0
        event = polled["events"][0]
        assert event["type"] == "CUSTOM" and event["custom_type"] == "job.done"
        assert event["data"] == {"n": 1, "custom_type": "job.done"}
        assert [e["custom_type"] for e in client.poll_events()["events"]] == ["job.done", "other"]
        with pytest.raises(PermissionDenied, match="AGENT_EXITED"):
            client.emit_event("AGENT_EXITED", {"agent_id": 1})
        assert client.unsubscribe(["CUSTOM"])["subscribed"] == ["AGENT_EXITED"]
        assert client.unsubscribe()["unsubscribed"] == ["AGENT_EXITED"]
        assert client.emit_event("job.done")["delivered_to"] == 1
        if ROOT:
            assert client.subscribe(["AGENT_SPAWNED", "AGENT_EXITED"])
            agent = client.spawn("sdk-brief", command=["/bin/sh", "-c", "exit 2"])
            deadline = time.monotonic() + 10
            seen: list = []
            while not any(e["type"] == "AGENT_EXITED" for e in seen):
                assert time.monotonic() < deadline, seen
                seen += client.poll_events(100)["events"]
                time.sleep(0.05)
            assert [e["type"] for e in seen] == ["AGENT_SPAWNED", "AGENT_EXITED"]
            assert seen[1]["data"]["agent_id"] == agent["id"]
            assert seen[1]["data"]["exit_code"] == 2
