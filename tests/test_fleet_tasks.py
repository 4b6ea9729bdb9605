"""A fleet's tasks: dispatched on any node, claimed by a node with room,
seen, waited for and cancelled through any node; a node's death, a
partition and a database that goes away, with leases and fences deciding.
Each node runs in a network namespace of its own and reaches PostgreSQL
only through the harness's bridge."""

from __future__ import annotations

import time

import pytest
from agentos import AgentOSClient, AgentOSError
from fleet_harness import fleet, wait_for


def client_of(node, timeout: float = 60) -> AgentOSClient:
    return AgentOSClient(node.socket_path, timeout=timeout)


def dispatch(on, code: str, **fields) -> str:
    with client_of(on) as client:
        reply = client.call_json(0x13, {"op": "dispatch", "kind": "exec",
                                        "request": {"code": code}, **fields})
        return reply["task_id"]


def task_op(on, op: str, task_id: str, **fields) -> dict:
    with client_of(on) as client:
        return client.call_json(0x13, {"op": op, "task_id": task_id, **fields})


def test_a_task_dispatched_on_one_node_runs_on_another_and_is_seen_from_all():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        task_id = dispatch(n1, "print('hello from the fleet')", node="n2")
        done = task_op(n2, "wait", task_id, timeout_ms=30000)["task"]
        assert done["state"] == "completed", done
        assert done["node"] == "n2" and done["attempts"] == 1, done
        assert done["result"]["stdout"] == "hello from the fleet\n"
        # Through the other node too.
        seen = task_op(n1, "status", task_id)["task"]
        assert seen["state"] == "completed" and seen["node"] == "n2"
        with client_of(n1) as client:
            listed = client.call_json(0x13, {"op": "list", "fleet": True})
        assert [t["task_id"] for t in listed["tasks"]] == [task_id]


def running_on(nodes, task_id: str) -> str:
    """The node a running task runs on, once it runs."""
    def seen():
        task = task_op(nodes[0], "status", task_id)["task"]
        return task["state"] == "running" and task["node"]
    return wait_for(f"task {task_id} running", seen, timeout=30)


def test_a_task_whose_node_is_killed_is_finished_by_another_within_its_attempts():
    with fleet() as f:
        nodes = [f.node("n1"), f.node("n2")]
        by_name = {node.name: node for node in nodes}
        again = dispatch(nodes[0], "import time; time.sleep(3); print('ran')", max_attempts=2)
        once = dispatch(nodes[0], "import time; time.sleep(3); print('ran')", max_attempts=1,
                        node=running_on(nodes, again))
        victim = by_name[running_on(nodes, again)]
        assert running_on(nodes, once) == victim.name
        survivor = next(node for node in nodes if node is not victim)
        killed_at = time.monotonic()
        victim.kill()
        done = task_op(survivor, "wait", again, timeout_ms=60000)["task"]
        assert done["state"] == "completed", done
        assert done["node"] == survivor.name and done["attempts"] == 2, done
        assert done["result"]["stdout"] == "ran\n"
        # Not before the victim's lease (2 s) had run out.
        assert time.monotonic() - killed_at > 1.5
        ended = task_op(survivor, "wait", once, timeout_ms=30000)["task"]
        assert ended["state"] == "interrupted", ended
        assert "attempts are spent" in ended["result"]["error"], ended


def test_a_cut_off_node_cannot_record_a_result_for_work_another_node_took():
    with fleet() as f:
        nodes = [f.node("n1"), f.node("n2")]
        by_name = {node.name: node for node in nodes}
        task_id = dispatch(nodes[0], "import time; time.sleep(6); print('done')", max_attempts=2)
        cut = by_name[running_on(nodes, task_id)]
        other = next(node for node in nodes if node is not cut)
        cut.host.cut()
        try:
            done = task_op(other, "wait", task_id, timeout_ms=60000)["task"]
        finally:
            cut.host.mend()
        assert done["state"] == "completed" and done["node"] == other.name, done
        assert done["attempts"] == 2
        # Back in the fleet, the cut-off node's own run is fenced out: the
        # task stays as the other node finished it.
        wait_for("the cut-off node back", lambda: client_of(cut).hello()["features"]["fleet"],
                 timeout=30)
        wait_for("the cut-off node let go", lambda: "no longer this node's" in cut.kernel.log()
                 or "was not recorded" in cut.kernel.log(), timeout=30)
        time.sleep(1)
        after = task_op(cut, "status", task_id)["task"]
        assert after["state"] == "completed" and after["node"] == other.name, after


def test_a_task_is_cancelled_through_any_node_and_its_work_stops_where_it_runs():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        task_id = dispatch(n1, "import time; time.sleep(120)", node="n2")
        running_on([n1], task_id)
        assert task_op(n1, "cancel", task_id) == {"success": True, "cancelled": True}
        done = task_op(n2, "wait", task_id, timeout_ms=10000)["task"]
        assert done["state"] == "cancelled", done
        # On n2 the run itself has stopped.
        def stopped_on_n2():
            with client_of(n2) as client:
                local = client.call_json(0x13, {"op": "list"})["tasks"]
            return [t["state"] for t in local if t["task_id"] == task_id] == ["cancelled"]
        wait_for("the run stopped on n2", stopped_on_n2, timeout=15)
        assert task_op(n2, "cancel", task_id)["cancelled"] is False


def test_a_task_pinned_to_a_dead_node_waits_visibly_until_cancelled():
    with fleet() as f:
        n1 = f.node("n1")
        task_id = dispatch(n1, "print(1)", node="gone")
        time.sleep(1.5)
        task = task_op(n1, "status", task_id)["task"]
        assert task["state"] == "queued" and task["node"] == "gone", task
        assert "not live" in task["waiting_for"], task
        assert task_op(n1, "cancel", task_id)["cancelled"] is True
        assert task_op(n1, "status", task_id)["task"]["state"] == "cancelled"


def test_an_idempotency_key_answers_with_the_same_task():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        first = dispatch(n1, "print('once')", idempotency_key="job-7")
        again = dispatch(n2, "print('twice?')", idempotency_key="job-7")
        assert again == first
        other = dispatch(n1, "print('other')", idempotency_key="job-8")
        assert other != first
        done = task_op(n2, "wait", first, timeout_ms=30000)["task"]
        assert done["result"]["stdout"] == "once\n"


def test_one_delegates_fleet_tasks_are_not_found_by_another_on_any_node():
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        with client_of(n1) as alice:
            alice.delegate("alice")
            task_id = alice.call_json(0x13, {"op": "dispatch", "kind": "exec",
                                             "request": {"code": "print('mine')"}})["task_id"]
        with client_of(n2) as alice_there:
            alice_there.delegate("alice")
            done = alice_there.call_json(0x13, {"op": "wait", "task_id": task_id,
                                                "timeout_ms": 30000})["task"]
            assert done["result"]["stdout"] == "mine\n"
            listed = alice_there.call_json(0x13, {"op": "list", "fleet": True})["tasks"]
            assert [t["task_id"] for t in listed] == [task_id]
        with client_of(n2) as bob:
            bob.delegate("bob")
            for op in ("status", "wait", "cancel"):
                with pytest.raises(AgentOSError) as refused:
                    bob.call_json(0x13, {"op": op, "task_id": task_id})
                assert refused.value.code == "not_found", op
            assert bob.call_json(0x13, {"op": "list", "fleet": True})["tasks"] == []


def test_fleet_fields_are_refused_to_runs_and_without_a_fleet():
    from conftest import RUN_ASKS_KERNEL, kernel_with
    with fleet() as f:
        n1 = f.node("n1")
        code = RUN_ASKS_KERNEL + (
            "print(json.dumps([ask(0x13, {'op': 'dispatch', 'kind': 'exec', "
            "'request': {'code': 'print(1)'}, 'node': 'n1'}), "
            "ask(0x13, {'op': 'dispatch', 'kind': 'exec', "
            "'request': {'code': 'print(1)'}, 'max_attempts': 10}), "
            "ask(0x13, {'op': 'dispatch', 'kind': 'exec', "
            "'request': {'code': 'print(1)'}, 'idempotency_key': 'k' * 100}), "
            "ask(0x13, {'op': 'status', 'task_id': 't-fleet-' + '0' * 16}), "
            "ask(0x13, {'op': 'list', 'fleet': True})]))"
        )
        with client_of(n1) as client:
            run = client.exec(code, permissions={"task": True})
        import json
        answers = json.loads(run["stdout"])
        # A run's tasks are its node's: the fleet's fields are refused by
        # name, and a fleet task's id is no task of its own.
        assert [a.get("code") for a in answers] == (
            ["permission_denied"] * 3 + ["not_found", "permission_denied"]), answers
    with kernel_with() as alone:
        with AgentOSClient(alone.socket_path) as client:
            for fields, field in (({"node": "n1"}, "node"), ({"max_attempts": 2}, "max_attempts"),
                                  ({"idempotency_key": "k"}, "idempotency_key")):
                with pytest.raises(AgentOSError) as refused:
                    client.call_json(0x13, {"op": "dispatch", "kind": "exec",
                                            "request": {"code": "print(1)"}, **fields})
                assert refused.value.code == "unavailable"
                assert f"`{field}`" in str(refused.value)
            # max_attempts 1 is what every task has.
            client.call_json(0x13, {"op": "dispatch", "kind": "exec",
                                    "request": {"code": "print(1)"}, "max_attempts": 1})


def test_the_database_stopped_and_started_under_load_loses_nothing_acknowledged():
    import threading
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        acknowledged, refusals, stop = [], [], threading.Event()

        def dispatching(node):
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    acknowledged.append(dispatch(node, f"print({i})"))
                except AgentOSError as err:
                    if err.code == "busy":
                        # The owner's queue is full: back-pressure, not a refusal.
                        time.sleep(0.2)
                        continue
                    refusals.append(err)
                    time.sleep(0.05)
        threads = [threading.Thread(target=dispatching, args=(n,)) for n in (n1, n2)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.5)
            with client_of(n1) as client:
                client.open_session("mine")
                client.exec("x = 41", session="mine")
            f.postgres.stop()
            down_since = len(refusals)
            wait_for("a node out of the fleet",
                     lambda: not client_of(n1).hello()["features"]["fleet"], timeout=15)
            # Each node goes on with its own work: its session, a run.
            with client_of(n1) as client:
                assert client.exec("print(x + 1)", session="mine")["stdout"] == "42\n"
                assert client.exec("print('alone')")["stdout"] == "alone\n"
            wait_for("refusals while down", lambda: len(refusals) > down_since + 2, timeout=15)
            f.postgres.start()
            count = len(acknowledged)
            wait_for("dispatches again", lambda: len(acknowledged) > count + 5, timeout=30)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        assert refusals, "no dispatch was refused while the database was down"
        for err in refusals:
            assert err.code == "unavailable", err
            assert "database" in str(err), err
        assert len(acknowledged) > 10
        # Every acknowledged task ran and ended, its result recorded.
        for task_id in acknowledged:
            done = task_op(n2, "wait", task_id, timeout_ms=60000)["task"]
            assert done["state"] == "completed", done


def test_a_drained_node_takes_no_new_work_until_undrained():
    import subprocess
    from conftest import binary
    with fleet() as f:
        n1, n2 = f.node("n1"), f.node("n2")
        drained = subprocess.run([binary("agentos"), "--socket", n1.socket_path, "nodes",
                                  "drain", "n2"], capture_output=True, text=True)
        assert drained.returncode == 0, drained.stderr
        assert drained.stdout.strip() == "node n2 is draining: it takes no new work"
        with client_of(n2) as client:
            seen = {n["name"]: n for n in client.nodes()["nodes"]}
            assert seen["n2"]["draining"] and not seen["n1"]["draining"]
            with pytest.raises(AgentOSError) as refused:
                client.drain_node("nowhere")
            assert refused.value.code == "not_found"
        pinned = dispatch(n1, "print('on n2')", node="n2")
        anywhere = [dispatch(n2, f"print({i})") for i in range(4)]
        for task_id in anywhere:
            done = task_op(n2, "wait", task_id, timeout_ms=30000)["task"]
            assert done["state"] == "completed" and done["node"] == "n1", done
        waiting = task_op(n1, "status", pinned)["task"]
        assert waiting["state"] == "queued" and "draining" in waiting["waiting_for"], waiting
        with client_of(n1) as client:
            assert client.drain_node("n2", draining=False) == {"node": "n2", "draining": False}
        done = task_op(n1, "wait", pinned, timeout_ms=30000)["task"]
        assert done["state"] == "completed" and done["node"] == "n2", done


def test_forged_notifications_only_wake_nodes_up():
    """Any role may NOTIFY: a forged `cancel:` stops nothing, a forged
    `done:` answers no wait, a flood of `queued` claims nothing that is not
    queued."""
    with fleet() as f:
        n1 = f.node("n1")
        task_id = dispatch(n1, "import time; time.sleep(3); print('whole')")
        running_on([n1], task_id)
        forged = "".join(f"NOTIFY agentos_tasks, '{what}';"
                         for what in (f"cancel:{task_id}", f"done:{task_id}", "queued",
                                      "cancel:*", "done:", "x" * 7000))
        f.postgres.sql(forged, "agentos")
        early = task_op(n1, "wait", task_id, timeout_ms=1000)["task"]
        assert early["state"] == "running", early
        done = task_op(n1, "wait", task_id, timeout_ms=30000)["task"]
        assert done["state"] == "completed" and done["result"]["stdout"] == "whole\n", done


def test_hostile_task_fields_are_refused_by_name():
    with fleet() as f:
        n1 = f.node("n1")
        with client_of(n1) as client:
            for fields, named in (({"idempotency_key": "k" * 129}, "idempotency_key"),
                                  ({"idempotency_key": ""}, "idempotency_key"),
                                  ({"idempotency_key": "a\nb"}, "idempotency_key"),
                                  ({"node": "../n2"}, "node"),
                                  ({"node": "n" * 65}, "node"),
                                  ({"max_attempts": 0}, "max_attempts"),
                                  ({"max_attempts": 11}, "max_attempts"),
                                  ({"max_attempts": -1}, "max_attempts"),
                                  ({"fleet": True}, "fleet")):
                with pytest.raises(AgentOSError) as refused:
                    client.call_json(0x13, {"op": "dispatch", "kind": "exec",
                                            "request": {"code": "print(1)"}, **fields})
                assert refused.value.code == "bad_request", fields
                assert f"`{named}`" in str(refused.value), (fields, refused.value)
            # A session is its node's: a task naming one may not be sent elsewhere.
            with pytest.raises(AgentOSError) as refused:
                client.call_json(0x13, {"op": "dispatch", "kind": "exec", "node": "n2",
                                        "request": {"code": "print(1)", "session": "s1"}})
            assert refused.value.code == "bad_request" and "session" in str(refused.value)
            for task_id in ("t-fleet-" + "0" * 16, "t-fleet-../../x", "t-fleet-" + "9" * 300):
                for op in ("status", "cancel"):
                    with pytest.raises(AgentOSError) as refused:
                        client.call_json(0x13, {"op": op, "task_id": task_id})
                    assert refused.value.code in ("not_found", "bad_request"), (op, task_id)


def test_a_node_that_stops_cleanly_hands_its_tasks_over_at_once_and_never_reruns_them():
    with fleet() as f:
        nodes = [f.node("n1", lease_ms=10000), f.node("n2", lease_ms=10000)]
        by_name = {node.name: node for node in nodes}
        task_id = dispatch(nodes[0], "import time; time.sleep(2); print('ran')", max_attempts=2)
        stopping = by_name[running_on(nodes, task_id)]
        other = next(node for node in nodes if node is not stopping)
        stopped_at = time.monotonic()
        stopping.stop()
        took_over = wait_for("running elsewhere", lambda: (t := task_op(
            other, "status", task_id)["task"])["state"] in ("running", "completed")
            and t["node"] == other.name, timeout=30)
        # Well before its 10 s lease could have run out.
        assert time.monotonic() - stopped_at < 6, took_over
        assert "left the fleet" in stopping.kernels[-1].log() if stopping.kernels else True
        done = task_op(other, "wait", task_id, timeout_ms=30000)["task"]
        assert done["state"] == "completed" and done["attempts"] == 2, done
        # Started again, the node does not run its old copy.
        stopping.start()
        wait_for("back", stopping.is_joined, timeout=20)
        with client_of(stopping) as client:
            local = client.call_json(0x13, {"op": "list"})["tasks"]
        assert [t["state"] for t in local if t["task_id"] == task_id] in ([], ["interrupted"])
        time.sleep(1)
        assert task_op(other, "status", task_id)["task"]["node"] == other.name
