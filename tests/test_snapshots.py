"""Snapshots against a real agentosd: on disk in each owner's
content-addressed store (two snapshots differing by one file take about
the room of one), kept through a kernel killed with SIGKILL, with the
interpreter's globals if asked (pickled and unpickled only in the
sandbox), restored in place or into a new session (a branch), removed,
and held to their owner's room; hostile workspaces and damaged stores
restore plain files only, or nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from agentos import AgentOSClient, Opcode
from agentos.protocol import encode_frame
from agentos.errors import AgentOSError, AlreadyExists, BadRequest, LimitExceeded, NotFound
from conftest import RUN_ASKS_KERNEL, binary, detach_beneath, kernel_with, start_kernel

MIB = 1 << 20


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: snapshots need a root kernel (sessions' disks: loop devices)")
        return False
    return True


def ask(client: AgentOSClient, **request) -> dict:
    """An EXEC session op, as the protocol spells it."""
    return client.call_json(Opcode.EXEC, request)


def run(client: AgentOSClient, code: str, session: str = "s1", **fields) -> dict:
    result = client.exec(code, "python", session=session, timeout_ms=60_000, **fields)
    assert result["ok"], result
    return result


def printed(client: AgentOSClient, code: str, session: str = "s1") -> str:
    return run(client, code, session)["stdout"]


def store_of(kernel) -> Path:
    """The operator's (root's) store of snapshots."""
    return Path(kernel.socket_path).parent / "state" / "snapshots" / "uid-0"


def du(path: Path) -> int:
    """Bytes the files beneath `path` take; one the kernel removes while
    they are counted (an object no snapshot holds any more) counts none."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return total


def test_two_snapshots_differing_by_one_file_take_the_room_of_one():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, "import os\nopen('big.bin', 'wb').write(os.urandom(8 << 20))\n"
                    "open('small.txt', 'w').write('one')")
        first = ask(client, op="snapshot", session="s1", name="a")
        assert first["snapshot"]["bytes"] >= 8 * MIB
        one = du(store_of(kernel))
        run(client, "open('small.txt', 'w').write('two')")
        ask(client, op="snapshot", session="s1", name="b")
        two = du(store_of(kernel))
        assert one >= 8 * MIB
        assert two <= one * 1.05, (one, two)
        listed = ask(client, op="snapshots", session="s1")["snapshots"]
        assert [s["name"] for s in listed] == ["a", "b"]
        # Removing one leaves the other whole, and frees only its own file.
        assert ask(client, op="remove_snapshot", session="s1", name="a")["removed"] is True
        assert du(store_of(kernel)) >= 8 * MIB
        with pytest.raises(NotFound):
            ask(client, op="remove_snapshot", session="s1", name="a")
        run(client, "open('small.txt', 'w').write('three')")
        ask(client, op="restore", session="s1", name="b")
        assert printed(client, "print(open('small.txt').read(), len(open('big.bin', 'rb').read()))") \
            == f"two {8 * MIB}\n"
        # Closing the session removes its snapshots and their objects.
        assert client.close_session("s1") is True
        deadline = time.monotonic() + 10
        while du(store_of(kernel)) != 0:
            assert time.monotonic() < deadline, du(store_of(kernel))
            time.sleep(0.05)


def test_globals_are_kept_restored_and_named_when_they_cannot_be():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, "import json as j\nx = 42\nrows = [{'a': i} for i in range(1000)]\n"
                    "blob = bytes(10 << 20)\ndef f(): pass\n"
                    "import threading\nlock = threading.Lock()")
        taken = ask(client, op="snapshot", session="s1", name="n1", state=True)
        assert taken["snapshot"]["state"] is True
        not_saved = sorted(n.split(":")[0] for n in taken["not_saved"])
        assert not_saved == ["f", "lock"], taken["not_saved"]
        run(client, "x = 0\ndel rows")
        restored = ask(client, op="restore", session="s1", name="n1")
        assert restored == {"success": True, "session": "s1"} or restored["left_out"] == []
        assert printed(client, "print(x, len(rows), len(blob), j.dumps(1), 'f' in globals())") \
            == f"42 1000 {10 << 20} 1 False\n"
        # Without `state`, a restore restarts the interpreter bare.
        ask(client, op="snapshot", session="s1", name="bare")
        ask(client, op="restore", session="s1", name="bare")
        assert printed(client, "print('x' in globals())") == "False\n"


def test_a_pickle_is_loaded_only_inside_the_sandbox():
    if not has_root():
        return
    marker = Path(tempfile.gettempdir()) / f"agentos-pickle-ran-{os.getpid()}"
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, f"""
import os
class Loud:
    def __reduce__(self):
        return (os.system, ('touch {marker} /workspace/ran-here',))
loud = Loud()
""")
        ask(client, op="snapshot", session="s1", name="p", state=True)
        # Taking it ran nothing; restoring it runs the reduce in the
        # session's own interpreter, in its sandbox, never in the kernel.
        assert not marker.exists()
        ask(client, op="restore", session="s1", name="p")
        assert printed(client, "import os; print(os.path.exists('/workspace/ran-here'))") \
            == "True\n"
        assert not marker.exists(), "the pickle ran on the host"


def test_a_branch_is_a_new_session_and_the_original_goes_on():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, "open('f.txt', 'w').write('base')\nx = 1")
        ask(client, op="snapshot", session="s1", name="n1", state=True)
        branched = ask(client, op="restore", session="s1", name="n1", into="b1")
        assert branched["session"] == "b1"
        run(client, "open('f.txt', 'w').write('changed in b1')\nx = 2", session="b1")
        assert printed(client, "print(open('f.txt').read(), x)") == "base 1\n"
        assert printed(client, "print(open('f.txt').read(), x)", "b1") == "changed in b1 2\n"
        names = sorted(s["session"] for s in client.sessions())
        assert names == ["b1", "s1"]
        with pytest.raises(AlreadyExists) as exists:
            ask(client, op="restore", session="s1", name="n1", into="b1")
        assert "b1" in str(exists.value)
        with pytest.raises(NotFound):
            ask(client, op="restore", session="s1", name="missing", into="b2")
        with pytest.raises(BadRequest):
            ask(client, op="restore", session="s1", name="n1", into="../escape")
        with pytest.raises(BadRequest):
            ask(client, op="restore", session="s1", name="n1", into="b3", extra=1)
        # A branch's files and globals are its own: it starts with them even
        # once the session it came from is closed, its snapshots with it.
        ask(client, op="restore", session="s1", name="n1", into="b4")
        assert client.close_session("s1") is True
        assert printed(client, "print(open('f.txt').read(), x)", "b4") == "base 1\n"


def test_another_principals_snapshots_are_not_found():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, "open('secret.txt', 'w').write('mine')")
        ask(client, op="snapshot", session="s1", name="n1")
        # A run is a principal of its own: the operator's session and its
        # snapshots are not there for it, nor can it branch from them.
        tries = run(client, RUN_ASKS_KERNEL + """
for request in ({"op": "snapshots", "session": "s1"},
                {"op": "restore", "session": "s1", "name": "n1", "into": "mine"},
                {"op": "remove_snapshot", "session": "s1", "name": "n1"}):
    reply = ask(0x02, request)
    print(reply.get("code") or "allowed")
""", session="other", permissions={"exec": True})["stdout"]
        assert tries == "not_found\nnot_found\nnot_found\n", tries
        assert [s["name"] for s in ask(client, op="snapshots", session="s1")["snapshots"]] == ["n1"]


def test_a_hostile_workspace_restores_plain_files_only():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, """
import os
open('plain.txt', 'w').write('plain')
open('setuid', 'w').write('#!/bin/sh\\n')
os.chmod('setuid', 0o4755)
os.symlink('/etc/shadow', 'shadow')
os.symlink('/', 'root')
os.mkfifo('fifo')
os.link('plain.txt', 'hard.txt')
os.makedirs('deep/er')
open('deep/er/x', 'w').write('x')
""")
        taken = ask(client, op="snapshot", session="s1", name="h")
        assert sorted(taken["left_out"]) == ["fifo", "root", "shadow"]
        ask(client, op="restore", session="s1", name="h")
        listing = printed(client, """
import os, stat
for name in sorted(os.listdir('.')):
    st = os.lstat(name)
    print(name, stat.filemode(st.st_mode), st.st_nlink)
""")
        assert listing.splitlines() == [
            "deep drwxr-xr-x 3",
            "hard.txt -rw-r--r-- 1",
            "plain.txt -rw-r--r-- 1",
            "setuid -rwxr-xr-x 1",
        ], listing
        # Nothing of the store is reachable: restored files are copies.
        objects = store_of(kernel) / "objects"
        modes = {stat.S_IMODE(f.stat().st_mode) for f in objects.rglob("*") if f.is_file()}
        assert modes == {0o400}
        assert all(f.stat().st_nlink == 1 for f in objects.rglob("*") if f.is_file())


def test_a_damaged_snapshot_is_refused_by_name_and_nothing_changes():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, "open('a.txt', 'w').write('saved')")
        ask(client, op="snapshot", session="s1", name="good")
        ask(client, op="snapshot", session="s1", name="bad")
        run(client, "open('a.txt', 'w').write('now')\nkept = 7")
        # Flip a byte of the saved file's object (both snapshots hold it).
        objects = [f for f in (store_of(kernel) / "objects").rglob("*") if f.is_file()]
        target = next(f for f in objects if f.read_bytes() == b"saved")
        target.chmod(0o600)
        target.write_bytes(b"SAVED")
        with pytest.raises(AgentOSError) as refused:
            ask(client, op="restore", session="s1", name="bad", into="b1")
        assert "damaged" in str(refused.value) and "bad" in str(refused.value)
        assert "b1" not in [s["session"] for s in client.sessions()]
        with pytest.raises(AgentOSError) as refused:
            ask(client, op="restore", session="s1", name="bad")
        assert "damaged" in str(refused.value)
        assert printed(client, "print(open('a.txt').read())") == "now\n"
        # A manifest cut short is refused the same way.
        manifest = next((store_of(kernel) / "sessions").rglob("good.json"))
        manifest.write_bytes(manifest.read_bytes()[:40])
        with pytest.raises(AgentOSError) as refused:
            ask(client, op="restore", session="s1", name="good", into="b2")
        assert "damaged" in str(refused.value) and "good" in str(refused.value)


def test_a_snapshot_past_the_owners_room_is_refused_and_the_earlier_one_holds():
    if not has_root():
        return
    config = "[exec]\nsnapshot_bytes = 4194304\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        run(client, "import os\nopen('a.bin', 'wb').write(os.urandom(1 << 20))")
        ask(client, op="snapshot", session="s1", name="fits")
        held = du(store_of(kernel))
        run(client, "import os\nopen('b.bin', 'wb').write(os.urandom(6 << 20))")
        with pytest.raises(LimitExceeded) as over:
            ask(client, op="snapshot", session="s1", name="over")
        assert "exec.snapshot_bytes" in str(over.value)
        assert du(store_of(kernel)) == held, "what the refused one wrote is gone"
        assert [s["name"] for s in ask(client, op="snapshots", session="s1")["snapshots"]] \
            == ["fits"]
        ask(client, op="restore", session="s1", name="fits")
        assert printed(client, "import os; print(sorted(os.listdir('.')))") == "['a.bin']\n"


def test_snapshots_last_through_a_kernel_killed_and_a_half_taken_one_is_not_listed():
    if not has_root():
        return
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    kernel = None
    try:
        kernel = start_kernel(workdir, "[exec]\nsession_disk_bytes = 268435456\n")
        with AgentOSClient(kernel.socket_path) as client:
            run(client, "open('kept.txt', 'w').write('kept')\nx = 5")
            ask(client, op="snapshot", session="s1", name="whole", state=True)
            run(client, "import os\nfor i in range(24):\n"
                        "    open(f'f{i}.bin', 'wb').write(os.urandom(8 << 20))")
        # A raw client asks for a large snapshot; the kernel is killed once
        # it has stored the first of its files, with 23 still to read.
        objects = workdir / "state" / "snapshots" / "uid-0" / "objects"
        stored = len(list(objects.rglob("*")))
        with socket.socket(socket.AF_UNIX) as slow:
            slow.connect(kernel.socket_path)
            request = {"op": "snapshot", "session": "s1", "name": "half"}
            slow.sendall(encode_frame(Opcode.EXEC, json.dumps(request).encode()))
            deadline = time.monotonic() + 30
            while len(list(objects.rglob("*"))) <= stored:
                assert time.monotonic() < deadline, "the snapshot never began"
                time.sleep(0.002)
            kernel.process.send_signal(signal.SIGKILL)
            kernel.process.wait(timeout=10)
        kernel = start_kernel(workdir)
        with AgentOSClient(kernel.socket_path) as client:
            listed = ask(client, op="snapshots", session="s1")["snapshots"]
            assert [s["name"] for s in listed] == ["whole"], listed
            assert du(objects) < 1 * MIB, "the half-taken snapshot's objects are gone"
            deadline = time.monotonic() + 30
            while True:
                try:
                    ask(client, op="restore", session="s1", name="whole", into="again")
                    break
                except AgentOSError:
                    # The killed kernel's loop device lets go.
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            assert printed(client, "print(open('kept.txt').read(), x)", "again") == "kept 5\n"
    finally:
        if kernel is not None:
            kernel.stop()
        detach_beneath(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def test_snapshot_ops_name_what_they_miss():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(NotFound):
            ask(client, op="snapshot", session="nope", name="n")
        with pytest.raises(NotFound):
            ask(client, op="snapshots", session="nope")
        run(client, "x = 1")
        with pytest.raises(NotFound) as missing:
            ask(client, op="restore", session="s1", name="never")
        assert "never" in str(missing.value)
        with pytest.raises(BadRequest):
            ask(client, op="snapshot", session="s1", name="n", state="yes")
        with pytest.raises(BadRequest):
            ask(client, op="snapshot", session="s1", name="../../x")
        # A field another op takes is refused by name, never ignored: a
        # snapshot that was meant as a branch does not quietly overwrite.
        with pytest.raises(BadRequest) as misplaced:
            ask(client, op="snapshot", session="s1", name="n", into="b1")
        assert "`into`" in str(misplaced.value)
        with pytest.raises(BadRequest):
            ask(client, op="restore", session="s1", name="n", state=True)
        assert client.snapshots("s1") == []


def test_the_cli_and_the_sdk_snapshot_branch_pause_and_hibernate():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        agentos = [str(binary("agentos")), "--socket", kernel.socket_path]

        def cli(*args: str) -> subprocess.CompletedProcess:
            done = subprocess.run([*agentos, *args], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (args, done.stdout, done.stderr)
            return done

        run(client, "open('f.txt', 'w').write('v1')\nx = 1")
        taken = json.loads(cli("--json", "snapshot", "s1", "n1", "--state").stdout)
        assert (taken["snapshot"]["name"], taken["snapshot"]["state"]) == ("n1", True)
        assert "n1" in cli("snapshot", "ls", "s1").stdout
        made = json.loads(cli("--json", "restore", "s1", "n1", "--into", "b1").stdout)
        assert made["session"] == "b1"
        assert printed(client, "print(open('f.txt').read(), x)", "b1") == "v1 1\n"
        paused = json.loads(cli("--json", "pause", "--session", "s1").stdout)
        assert paused["state"] == "paused"
        assert json.loads(cli("--json", "resume", "--session", "s1").stdout)["state"] == "ready"
        asleep = json.loads(cli("--json", "pause", "--session", "s1", "--hibernate").stdout)
        assert asleep["state"] == "hibernated"
        assert "hibernated" in cli("sessions").stdout
        assert json.loads(cli("--json", "resume", "--session", "s1").stdout)["state"] == "ready"
        cli("snapshot", "rm", "s1", "n1")
        assert ask(client, op="snapshots", session="s1")["snapshots"] == []

        # The same through the SDK.
        snapshot = client.snapshot("s1", "n2", state=True)
        assert snapshot["state"] is True and snapshot["not_saved"] == []
        assert client.restore("s1", "n2", into="b2") == []
        assert client.pause_session("s1")["state"] == "paused"
        assert client.resume_session("s1")["state"] == "ready"
        assert client.pause_session("s1", hibernate=True)["state"] == "hibernated"
        assert printed(client, "print(x)") == "1\n"
        assert client.remove_snapshot("s1", "n2") is True
        assert printed(client, "print(open('f.txt').read(), x)", "b2") == "v1 1\n"
