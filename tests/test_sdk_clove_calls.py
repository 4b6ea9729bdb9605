"""The Python SDK's calls for the Clove SDK's opcodes — permissions, files,
pause and resume, metrics, the state store, events — against a real agentosd, as
a user of the SDK meets them."""

from __future__ import annotations

import os
import time

import pytest

from agentos import AgentOSClient
from agentos.errors import BadRequest, LimitExceeded, NotFound, PermissionDenied

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
