"""Sessions paused and resumed against a real agentosd: PAUSE with
`{"session"}` freezes the session's interpreter with the cgroup freezer —
no CPU, its run's time limit standing still, its queued runs waiting —
RESUME lets it go on; its idle timeout and its owner's end still end it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agentos import AgentOSClient, Opcode
from agentos.errors import BadRequest, Busy, NotFound
from conftest import RUN_ASKS_KERNEL, kernel_with, log_of


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: pausing a session needs a root kernel (cgroup freezer)")
        return False
    return True


def pause(client: AgentOSClient, session: str, **fields) -> dict:
    return client.call_json(Opcode.PAUSE, {"session": session, **fields})


def resume(client: AgentOSClient, session: str) -> dict:
    return client.call_json(Opcode.RESUME, {"session": session})


def run(client: AgentOSClient, code: str, session: str = "s1", **fields) -> dict:
    fields.setdefault("timeout_ms", 60_000)
    return client.exec(code, "python", session=session, **fields)


def state_of(client: AgentOSClient, session: str) -> str:
    return next(s["state"] for s in client.sessions() if s["session"] == session)


def ticks(kernel) -> int:
    """What the session's ticking thread has counted (it writes the count to
    its workspace, which lies on the session's disk, mounted on the host)."""
    path = (Path(kernel.socket_path).parent / "state" / "sessions" / "uid-0" / "s1" / "mnt"
            / "workspace" / "ticks")
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return -1


def wait_for_ticks_past(kernel, count: int) -> None:
    """Waits (up to 30 s: a loaded host is slow) for the ticking thread to
    count past `count`."""
    deadline = time.monotonic() + 30
    while ticks(kernel) <= count:
        assert time.monotonic() < deadline, f"the thread did not tick past {count}"
        time.sleep(0.02)


TICKING = """
import threading, time
def tick():
    n = 0
    while True:
        n += 1
        with open('/workspace/ticks.new', 'w') as f:
            f.write(str(n))
        import os
        os.replace('/workspace/ticks.new', '/workspace/ticks')
        time.sleep(0.01)
threading.Thread(target=tick, daemon=True).start()
"""


def start_ticking(kernel, client: AgentOSClient) -> None:
    """Leaves a thread ticking in session `s1`, and waits for its first tick."""
    assert run(client, TICKING)["ok"]
    wait_for_ticks_past(kernel, 0)


def assert_stands_still(kernel, why: str) -> int:
    """Asserts the ticking thread does not tick for 0.5 s; where it stands."""
    frozen_at = ticks(kernel)
    time.sleep(0.5)
    assert ticks(kernel) == frozen_at, why
    return frozen_at


def test_a_paused_session_stands_still_and_its_runs_wait_until_resumed():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        start_ticking(kernel, client)
        paused = pause(client, "s1")
        assert paused == {"success": True, "session": "s1", "state": "paused"}
        assert state_of(client, "s1") == "paused"
        frozen_at = assert_stands_still(kernel, "a frozen thread ticked")
        # A run asked meanwhile waits for RESUME.
        result = {}
        other = AgentOSClient(kernel.socket_path)
        waiter = threading.Thread(target=lambda: result.update(run(other, "print('after')")))
        waiter.start()
        time.sleep(0.5)
        assert not result, "a run went through a paused session"
        assert resume(client, "s1") == {"success": True, "session": "s1", "state": "ready"}
        waiter.join(timeout=30)
        other.close()
        assert result["stdout"] == "after\n", result
        wait_for_ticks_past(kernel, frozen_at)


def test_a_paused_runs_time_limit_stands_still():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 1")["ok"]
        result = {}
        runner = AgentOSClient(kernel.socket_path)
        started = time.monotonic()
        worker = threading.Thread(target=lambda: result.update(
            run(runner, "import time; time.sleep(1.0); print('slept')", timeout_ms=2000)))
        worker.start()
        time.sleep(0.3)
        pause(client, "s1")
        time.sleep(2.5)
        resume(client, "s1")
        worker.join(timeout=30)
        runner.close()
        assert result["ok"] and result["stdout"] == "slept\n", result
        assert time.monotonic() - started > 2.5


def test_a_paused_session_still_ends_at_its_idle_timeout_and_with_its_close():
    if not has_root():
        return
    with kernel_with("[exec]\nsession_idle_secs = 1\n") as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 1")["ok"]
        pause(client, "s1")
        deadline = time.monotonic() + 10
        while state_of(client, "s1") != "stored":
            assert time.monotonic() < deadline, client.sessions()
            time.sleep(0.1)
        assert run(client, "print('x' in globals())")["stdout"] == "False\n"
        pause(client, "s1")
        assert client.close_session("s1") is True
        assert run(client, "print(1)", session="s2")["ok"], "the kernel goes on"


def test_pause_names_what_it_cannot_do():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(NotFound):
            pause(client, "nope")
        assert run(client, "x = 1")["ok"]
        with pytest.raises(BadRequest):
            client.call_json(Opcode.PAUSE, {"session": "s1", "name": "agent"})
        with pytest.raises(BadRequest):
            client.call_json(Opcode.PAUSE, {"session": "s1", "freeze": True})
        with pytest.raises(BadRequest):
            client.call_json(Opcode.RESUME, {"session": "s1", "hibernate": True})
        with pytest.raises(BadRequest) as agent:
            client.call_json(Opcode.PAUSE, {"name": "a1", "hibernate": True})
        assert "hibernate" in str(agent.value)
        # A run is a principal of its own: the operator's session is not
        # there for it to pause.
        tries = run(client, RUN_ASKS_KERNEL + """
print(ask(0x14, {"session": "s1"}).get("code"))
""", session="other", permissions={"exec": True})
        assert tries["stdout"] == "not_found\n", tries
        assert state_of(client, "s1") == "ready"


def test_a_hibernated_session_frees_its_interpreter_and_wakes_with_its_globals():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 42\nblob = bytes(10 << 20)\nimport json as j\n"
                           "import threading\nlock = threading.Lock()\n"
                           "import os\nprint(os.getpid())")["ok"]
        hibernated = pause(client, "s1", hibernate=True)
        assert hibernated["state"] == "hibernated", hibernated
        assert [n.split(":")[0] for n in hibernated["not_saved"]] == ["lock"], hibernated
        assert state_of(client, "s1") == "hibernated"
        # It is not one of the session's snapshots.
        assert client.call_json(Opcode.EXEC, {"op": "snapshots", "session": "s1"})["snapshots"] \
            == []
        with pytest.raises(BadRequest):
            pause(client, "s1")
        # The next run wakes it, with its globals.
        woke = run(client, "print(x, len(blob), j.dumps([1]))")
        assert woke["stdout"] == f"42 {10 << 20} [1]\n", woke
        assert state_of(client, "s1") == "ready"
        # RESUME wakes it too, saying what could not come back.
        pause(client, "s1", hibernate=True)
        resumed = resume(client, "s1")
        assert resumed == {"success": True, "session": "s1", "state": "ready"}, resumed
        assert run(client, "print(x)")["stdout"] == "42\n"


def test_hibernating_a_paused_session_and_runs_queued_behind_it():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 7")["ok"]
        pause(client, "s1")
        assert pause(client, "s1", hibernate=True)["state"] == "hibernated"
        assert run(client, "print(x)")["stdout"] == "7\n"


def test_a_refused_hibernation_leaves_a_paused_session_paused():
    # A hostile owner fills its room for waiting runs behind its paused
    # session, then asks to hibernate it: the refusal must not let the
    # session's processes go on.
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        start_ticking(kernel, client)
        pause(client, "s1")
        fillers = [AgentOSClient(kernel.socket_path) for _ in range(2)]
        try:
            for filler in fillers:
                for _ in range(128):
                    filler.send(Opcode.EXEC, {"code": "pass", "session": "s1",
                                              "timeout_ms": 120_000})
            # A run of another session is refused once the room is full.
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "the waiting runs never filled the room"
                try:
                    run(client, "pass", session="probe")
                except Busy:
                    break
                time.sleep(0.05)
            with pytest.raises(Busy):
                pause(client, "s1", hibernate=True)
            assert state_of(client, "s1") == "paused"
            assert_stands_still(kernel, "a refused hibernation let the session go on")
            resume(client, "s1")
            # Every one waited and ran, but those past the room.
            replies = [json.loads(filler.recv().payload) for filler in fillers
                       for _ in range(128)]
            ran = [r for r in replies if r.get("exit_code") == 0]
            assert all(r in ran or r.get("code") == "busy" for r in replies), replies
            assert len(ran) >= 200, len(ran)
        finally:
            for filler in fillers:
                filler.close()


def test_a_restore_queued_behind_a_hibernation_restores_its_snapshot():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 'snapshot'")["ok"]
        client.snapshot("s1", "n1", state=True)
        assert run(client, "x = 'later'")["ok"]
        # A slow run holds the session; a hibernation, then a restore, wait
        # behind it in its queue.
        runner, pauser = AgentOSClient(kernel.socket_path), AgentOSClient(kernel.socket_path)
        try:
            runner.send(Opcode.EXEC, {"code": "import time; time.sleep(1)", "session": "s1",
                                      "timeout_ms": 60_000})
            time.sleep(0.3)
            pauser.send(Opcode.PAUSE, {"session": "s1", "hibernate": True})
            time.sleep(0.2)
            assert client.restore("s1", "n1") == []
            assert json.loads(runner.recv().payload)["exit_code"] == 0
            assert json.loads(pauser.recv().payload)["state"] == "hibernated"
        finally:
            runner.close()
            pauser.close()
        assert run(client, "print(x)")["stdout"] == "snapshot\n"


def test_a_paused_runs_memory_limit_still_ends_it_once_it_goes_on():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        limits = {"memory": 96 << 20}
        assert run(client, "x = 1", limits=limits)["ok"]
        result = {}
        runner = AgentOSClient(kernel.socket_path)
        worker = threading.Thread(target=lambda: result.update(run(
            runner, "import time\nhog = []\nwhile True:\n"
                    "    hog.append(bytearray(4 << 20)); time.sleep(0.01)",
            limits=limits, timeout_ms=30_000)))
        worker.start()
        time.sleep(0.1)
        pause(client, "s1")
        time.sleep(0.5)
        assert not result, "a frozen run ended"
        resume(client, "s1")
        worker.join(timeout=60)
        runner.close()
        assert result["oom_killed"] is True, result


def test_a_paused_or_hibernated_session_ends_with_its_agent(tmp_path):
    if not has_root():
        return
    script_dir = Path(tempfile.mkdtemp(prefix="agentos-pause-", dir="/var/tmp"))
    script_dir.chmod(0o755)
    script = script_dir / "holder.py"
    script.write_text(textwrap.dedent("""
        import json, sys, time
        from agentos import AgentOSClient, Opcode
        with AgentOSClient() as k:
            k.exec("x = 1", session="frozen")
            k.exec("y = 2", session="asleep")
            paused = k.call_json(Opcode.PAUSE, {"session": "frozen"})
            slept = k.call_json(Opcode.PAUSE, {"session": "asleep", "hibernate": True})
            print(json.dumps([paused["state"], slept["state"]]), flush=True)
            time.sleep(600)
    """))
    script.chmod(0o644)
    try:
        with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
            agent = client.spawn("holder", script, permissions={"exec": True})
            deadline = time.monotonic() + 60
            while "paused" not in log_of(kernel, "holder", agent["id"]):
                assert time.monotonic() < deadline, log_of(kernel, "holder", agent["id"])
                time.sleep(0.1)
            assert '["paused", "hibernated"]' in log_of(kernel, "holder", agent["id"])
            sessions = Path(kernel.socket_path).parent / "state" / "sessions"
            assert (sessions / f"agent-{agent['id']}").exists()
            client.kill("holder", grace_ms=0)
            # Its sessions end with it: no frozen process is left behind,
            # and their disks and globals go.
            deadline = time.monotonic() + 20
            while (sessions / f"agent-{agent['id']}").exists() or frozen_cgroups():
                assert time.monotonic() < deadline, (list(sessions.iterdir()), frozen_cgroups())
                time.sleep(0.1)
            store = Path(kernel.socket_path).parent / "state" / "snapshots"
            assert not (store / f"agent-{agent['id']}").exists()
            assert run(client, "print(1)")["ok"], "the kernel goes on"
    finally:
        shutil.rmtree(script_dir, ignore_errors=True)


def frozen_cgroups() -> list[str]:
    """The freezer cgroups that stand frozen (or freezing) now."""
    root = Path("/sys/fs/cgroup/freezer")
    return [str(state.parent) for state in root.rglob("freezer.state")
            if state.parent != root and state.read_text().strip() != "THAWED"]


def test_an_idle_session_hibernates_with_idle_hibernate_secs():
    if not has_root():
        return
    config = "[exec]\nsession_idle_secs = 60\nidle_hibernate_secs = 1\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 'kept'")["ok"]
        deadline = time.monotonic() + 15
        while state_of(client, "s1") != "hibernated":
            assert time.monotonic() < deadline, client.sessions()
            time.sleep(0.1)
        assert run(client, "print(x)")["stdout"] == "kept\n"


def test_an_idle_session_that_cannot_hibernate_ends_its_interpreter_once():
    # Its globals do not fit its owner's room for snapshots: the idle
    # hibernation fails, and the interpreter ends as an idle one does
    # rather than be tried again every period.
    if not has_root():
        return
    config = ("[exec]\nsession_idle_secs = 60\nidle_hibernate_secs = 1\n"
              "snapshot_bytes = 1048576\n")
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "blob = bytes(4 << 20)")["ok"]
        deadline = time.monotonic() + 15
        while state_of(client, "s1") != "stored":
            assert time.monotonic() < deadline, client.sessions()
            time.sleep(0.1)
        time.sleep(2.5)
        assert kernel.log().count("could not hibernate") == 1, kernel.log()
        assert run(client, "print('blob' in globals())")["stdout"] == "False\n"


def test_an_idle_paused_session_hibernates_at_once():
    # Idle and paused, it is let go to hibernate (as PAUSE with `hibernate`
    # does), not left to hibernate the moment it is resumed.
    if not has_root():
        return
    config = "[exec]\nsession_idle_secs = 60\nidle_hibernate_secs = 1\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 'kept'")["ok"]
        pause(client, "s1")
        deadline = time.monotonic() + 15
        while state_of(client, "s1") != "hibernated":
            assert time.monotonic() < deadline, client.sessions()
            time.sleep(0.1)
        assert not frozen_cgroups()
        assert run(client, "print(x)")["stdout"] == "kept\n"


def test_a_hibernated_session_outlasts_its_idle_timeout_with_its_globals():
    # Idle, a session's interpreter ends; a hibernated one has none left to
    # end, and its globals wait on disk for its next run, however late.
    if not has_root():
        return
    with kernel_with("[exec]\nsession_idle_secs = 1\n") as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 'kept'")["ok"]
        assert pause(client, "s1", hibernate=True)["state"] == "hibernated"
        time.sleep(2.5)
        assert state_of(client, "s1") == "hibernated"
        assert run(client, "print(x)")["stdout"] == "kept\n"


def test_a_woken_session_that_runs_out_of_memory_ends_as_any_session_does():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        limits = {"memory": 96 << 20}
        assert run(client, "x = 'kept'", limits=limits)["ok"]
        assert pause(client, "s1", hibernate=True)["state"] == "hibernated"
        # The run that wakes it loads its globals, then eats its memory.
        woke = run(client, "print(x, flush=True)\nhog = []\nwhile True:\n"
                           "    hog.append(bytearray(4 << 20))", limits=limits)
        assert woke["oom_killed"] is True, woke
        assert woke["stdout"] == "kept\n", woke
        # Its interpreter is gone with what it held; the session goes on
        # with a fresh one on the same disk, and nothing is left frozen.
        assert state_of(client, "s1") in ("stored", "ready"), client.sessions()
        again = run(client, "print('x' in globals())", limits=limits)
        assert again["ok"], again
        assert not frozen_cgroups()
        assert run(client, "print(1)", session="s2")["ok"], "the kernel goes on"
