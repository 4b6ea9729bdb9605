"""Sessions' snapshots, branches, pause and hibernation: what snapshot,
restore, snapshots, remove_snapshot, pause_session and resume_session send
and return, against a fake kernel."""

from __future__ import annotations

import pytest
from fake_kernel import fake_kernel, socket_dir  # noqa: F401  (fixtures)

from agentos import AgentOSClient, AlreadyExists, NotFound, Opcode

TAKEN = {"name": "n1", "bytes": 4096, "created_at": "2026-11-29T08:00:00Z"}
WITH_STATE = {**TAKEN, "name": "n2", "state": True}


def test_a_snapshot_asks_for_globals_only_when_told_and_says_what_it_left(fake_kernel):
    fake = fake_kernel([
        {"success": True, "snapshot": TAKEN},
        {"success": True, "snapshot": WITH_STATE, "left_out": ["workspace/link"],
         "not_saved": ["conn: TypeError: cannot pickle 'socket' object"]},
    ])
    with AgentOSClient(fake.path, timeout=5) as client:
        plain = client.snapshot("s1", "n1")
        kept = client.snapshot("s1", "n2", state=True)
    assert fake.json_requests() == [
        {"op": "snapshot", "session": "s1", "name": "n1"},
        {"op": "snapshot", "session": "s1", "name": "n2", "state": True},
    ]
    # The wire leaves `state` out when false; the result says it.
    assert plain == {**TAKEN, "state": False, "left_out": [], "not_saved": []}
    assert kept == {**WITH_STATE, "left_out": ["workspace/link"],
                    "not_saved": ["conn: TypeError: cannot pickle 'socket' object"]}


def test_restore_replaces_or_branches_into_a_new_session(fake_kernel):
    fake = fake_kernel([
        {"success": True, "session": "s1", "left_out": ["f: AttributeError: gone"]},
        {"success": True, "session": "b1"},
        {"success": False, "code": "already_exists", "error": "session \"b1\" exists"},
    ])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert client.restore("s1", "n1") == ["f: AttributeError: gone"]
        assert client.restore("s1", "n1", into="b1") == []
        with pytest.raises(AlreadyExists):
            client.restore("s1", "n1", into="b1")
    assert fake.json_requests() == [
        {"op": "restore", "session": "s1", "name": "n1"},
        {"op": "restore", "session": "s1", "name": "n1", "into": "b1"},
        {"op": "restore", "session": "s1", "name": "n1", "into": "b1"},
    ]


def test_snapshots_say_whether_each_keeps_globals_and_one_is_removed_by_name(fake_kernel):
    fake = fake_kernel([
        {"success": True, "snapshots": [TAKEN, WITH_STATE]},
        {"success": True, "removed": True},
        {"success": False, "code": "not_found", "error": "session \"s1\" has no snapshot \"n9\""},
    ])
    with AgentOSClient(fake.path, timeout=5) as client:
        listed = client.snapshots("s1")
        assert client.remove_snapshot("s1", "n1") is True
        with pytest.raises(NotFound):
            client.remove_snapshot("s1", "n9")
    assert [(s["name"], s["state"]) for s in listed] == [("n1", False), ("n2", True)]
    assert fake.json_requests() == [
        {"op": "snapshots", "session": "s1"},
        {"op": "remove_snapshot", "session": "s1", "name": "n1"},
        {"op": "remove_snapshot", "session": "s1", "name": "n9"},
    ]


def test_a_session_is_paused_hibernated_and_resumed_by_pause_and_resume(fake_kernel):
    fake = fake_kernel([
        {"success": True, "session": "s1", "state": "paused"},
        {"success": True, "session": "s1", "state": "hibernated",
         "not_saved": ["gen: TypeError: cannot pickle 'generator' object"]},
        {"success": True, "session": "s1", "state": "ready"},
        {"success": False, "code": "not_found", "error": "no session \"s9\""},
    ])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert client.pause_session("s1") == {"session": "s1", "state": "paused",
                                              "not_saved": []}
        assert client.pause_session("s1", hibernate=True) == {
            "session": "s1", "state": "hibernated",
            "not_saved": ["gen: TypeError: cannot pickle 'generator' object"]}
        assert client.resume_session("s1") == {"session": "s1", "state": "ready",
                                               "not_saved": []}
        with pytest.raises(NotFound):
            client.resume_session("s9")
    assert [opcode for opcode, _ in fake.requests] == [
        Opcode.PAUSE, Opcode.PAUSE, Opcode.RESUME, Opcode.RESUME]
    assert fake.json_requests() == [
        {"session": "s1"},
        {"session": "s1", "hibernate": True},
        {"session": "s1"},
        {"session": "s9"},
    ]


def test_an_agent_is_still_paused_by_id_or_name(fake_kernel):
    paused = {"success": True, "id": 7, "name": "w", "state": "paused"}
    fake = fake_kernel([paused, {**paused, "state": "running"}])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert client.pause("w")["state"] == "paused"
        assert client.resume(7)["state"] == "running"
    assert fake.json_requests() == [{"name": "w"}, {"id": 7}]
