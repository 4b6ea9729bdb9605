"""Volumes against a real agentosd: named disks a principal owns, with a
size the filesystem holds them to, mounted by name into runs, sessions and
agents, read-write or read-only; given to what a principal starts, never
wider than it has them; refused by name where they would go over the
kernel's or the system's places, or through a link a sandbox planted; and
lasting through a kernel killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from agentos import AgentOSClient
from agentos.errors import (
    AlreadyExists, BadRequest, LimitExceeded, NotFound, Unavailable,
)
from conftest import detach_beneath, kernel_with, log_of, start_kernel
from test_session_disks import fill_code

MIB = 1 << 20


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: volumes need a root kernel (loop devices, mounts)")
        return False
    return True


def run(client: AgentOSClient, code: str, *volumes: tuple, **fields) -> dict:
    """Runs `code` with `volumes`, each (name, path) or (name, path, read_only)."""
    fields.setdefault("timeout_ms", 60_000)
    return client.exec(code, "python", volumes=list(volumes), **fields)


@pytest.fixture
def script_dir() -> Iterator[Path]:
    """Where an agent's script lies for its sandbox to be given it (not
    /tmp: each sandbox has a /tmp of its own)."""
    directory = Path(tempfile.mkdtemp(prefix="agentos-volumes-", dir="/var/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def agent_output_line(kernel, client, name: str, code: str, script_dir: Path, **spawn):
    """Spawns an agent running `code`, which prints a JSON line and may go
    on; returns what the line says."""
    script = script_dir / f"{name}.py"
    script.write_text(code)
    script.chmod(0o644)
    spawned = client.spawn(name, script, python=sys.executable, **spawn)
    deadline = time.monotonic() + 60
    while not log_of(kernel, name, spawned["id"]).strip():
        assert time.monotonic() < deadline, log_of(kernel, name, spawned["id"])
        time.sleep(0.1)
    return json.loads(log_of(kernel, name, spawned["id"]).splitlines()[0])


def agent_output(kernel, client, name: str, code: str, script_dir: Path, **spawn) -> dict:
    """Spawns an agent running `code` (which prints one JSON line) and
    returns what it printed once it has ended."""
    script = script_dir / f"{name}.py"
    script.write_text(code)
    script.chmod(0o644)
    spawned = client.spawn(name, script, python=sys.executable, **spawn)
    deadline = time.monotonic() + 60
    while True:
        lines = [line for line in log_of(kernel, name, spawned["id"]).splitlines()
                 if line.startswith("{")]
        if lines:
            return json.loads(lines[-1])
        assert time.monotonic() < deadline, log_of(kernel, name, spawned["id"])
        time.sleep(0.1)


def test_a_volume_is_shared_by_runs_sessions_and_agents_and_read_only_holds(script_dir):
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        made = client.create_volume("data", bytes=32 * MIB)
        assert (made["volume"], made["bytes"], made["owned"]) == ("data", 32 * MIB, True), made
        wrote = run(client, textwrap.dedent("""
            open('/data/hello.txt', 'w').write('hello')
            for line in open('/proc/self/mountinfo'):
                if line.split()[4] == '/data':
                    print(line.split()[5])
            """), ("data", "/data"))
        assert wrote["ok"], wrote
        # Nothing on it runs as another user or reaches a device.
        options = wrote["stdout"].split()[-1].split(",")
        assert "nosuid" in options and "nodev" in options and "rw" in options, wrote
        # A session sees it read-only beneath /mnt; a run beneath its workspace.
        look = run(client, textwrap.dedent("""
            import errno, os
            print(open('/mnt/shared/hello.txt').read())
            try:
                open('/mnt/shared/new.txt', 'w')
            except OSError as err:
                print(errno.errorcode[err.errno])
            print(sorted(os.listdir('/mnt')))
            """), ("data", "/mnt/shared", True), session="reader")
        assert look["stdout"] == "hello\nEROFS\n['shared']\n", look
        beneath = run(client, "print(open('/workspace/d/hello.txt').read())",
                      ("data", "/workspace/d"), session="beneath")
        assert beneath["stdout"] == "hello\n", beneath
        # Outside a session, /workspace is the run's own, in memory.
        with pytest.raises(BadRequest) as outside:
            run(client, "print(1)", ("data", "/workspace/d"))
        assert "outside a session" in str(outside.value)
        # A run without it sees nothing there.
        bare = run(client, "import os; print(os.listdir('/data'))")
        assert bare["stdout"] == "[]\n", bare
        # An agent writes to it; what it wrote is there for the next run.
        agent = agent_output(kernel, client, "writer", textwrap.dedent("""
            import json
            options = [line.split()[5] for line in open('/proc/self/mountinfo')
                       if line.split()[4] == '/data']
            print(json.dumps({'read': open('/data/hello.txt').read(),
                              'wrote': open('/data/agent.txt', 'w').write('from agent'),
                              'options': sorted(set(options[-1].split(',')) & {'nosuid', 'nodev'})}),
                  flush=True)
            """), script_dir, volumes=[("data", "/data")])
        assert agent == {"read": "hello", "wrote": 10, "options": ["nodev", "nosuid"]}, agent
        after = run(client, "print(open('/data/agent.txt').read())", ("data", "/data"))
        assert after["stdout"] == "from agent\n", after
        listed = {v["volume"]: v for v in client.volumes()}
        assert listed["data"]["used_bytes"] > 0, listed
        # The session asked for the volume read-only: its runs ask the same.
        with pytest.raises(BadRequest) as other:
            run(client, "print(1)", session="reader")
        assert "volumes" in str(other.value)


def test_what_a_principal_is_given_it_passes_on_no_wider_and_its_own_end_with_it(script_dir):
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        client.create_volume("data", bytes=16 * MIB)
        assert run(client, "open('/data/f', 'w').write('shared')", ("data", "/data"))["ok"]
        client.create_volume("private", bytes=16 * MIB)
        out = agent_output(kernel, client, "given", textwrap.dedent("""
            import errno, json
            from agentos import AgentOSClient
            from agentos.errors import AgentOSError
            out = {}
            try:
                open('/data/x', 'w')
            except OSError as err:
                out['write'] = errno.errorcode[err.errno]
            def attempt(key, call):
                try:
                    out[key] = call()
                except AgentOSError as err:
                    out[key] = type(err).__name__
            with AgentOSClient() as k:
                out['listed'] = [(v['volume'], v['owned'], v['read_only']) for v in k.volumes()]
                attempt('widen', lambda: k.exec('print(1)', volumes=[('data', '/data')]))
                attempt('passed_on', lambda: k.exec(
                    "print(open('/data/f').read())", volumes=[('data', '/data', True)])['stdout'])
                attempt('not_given', lambda: k.exec('print(1)', volumes=[('private', '/data')]))
                attempt('remove', lambda: k.remove_volume('data'))
                attempt('same_name', lambda: k.create_volume('data', bytes=16 << 20))
                attempt('own', lambda: k.create_volume('mine', bytes=16 << 20)['owned'])
                attempt('own_used', lambda: k.exec(
                    "open('/data/m', 'w').write('m'); print('ok')",
                    volumes=[('mine', '/data')])['stdout'])
            print(json.dumps(out), flush=True)
            """), script_dir, volumes=[("data", "/data", True)], permissions={"exec": True})
        assert out == {
            "write": "EROFS",
            "listed": [["data", False, True]],
            "widen": "PermissionDenied",
            "passed_on": "shared\n",
            "not_given": "NotFound",
            "remove": "PermissionDenied",
            "same_name": "AlreadyExists",
            "own": True,
            "own_used": "ok\n",
        }, out
        # The agent's own volume went with it; the operator's stays.
        assert [v["volume"] for v in client.volumes()] == ["data", "private"]
        state = Path(kernel.log_path.parent / "state" / "volumes")
        deadline = time.monotonic() + 20
        while any(p.name.startswith("agent-") for p in state.iterdir()):
            assert time.monotonic() < deadline, list(state.iterdir())
            time.sleep(0.1)


def test_paths_and_names_are_refused_by_name_and_a_planted_link_is_not_followed():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        client.create_volume("data", bytes=16 * MIB)
        for path, word in [("/proc/x", "/proc"), ("/dev/shm", "devices"), ("/", "root"),
                           ("/run/agentos", "socket"), ("/data/../etc", ".."),
                           ("/workspace", "workspace itself"), ("/usr/lib", "outside"),
                           ("/etc", "outside"), ("/tmp/x", "scratch")]:
            with pytest.raises(BadRequest) as refused:
                run(client, "print(1)", ("data", path))
            assert word in str(refused.value) and "volumes" in str(refused.value), path
        with pytest.raises(BadRequest):
            run(client, "print(1)", ("data", "/data"), ("data", "/data/inner"))
        with pytest.raises(NotFound):
            run(client, "print(1)", ("nope", "/data"))
        with pytest.raises(BadRequest):
            client.spawn("bare", command=["/bin/true"], sandboxed=False, volumes=[("data", "/data")])
        with pytest.raises(AlreadyExists):
            client.create_volume("data")
        with pytest.raises(NotFound):
            client.remove_volume("nope")
        # A link a session planted where a volume would go is not followed.
        planted = run(client, "import os; os.symlink('/proc', '/workspace/link')", session="s")
        assert planted["ok"], planted
        ended = run(client, "while True: pass", session="s", timeout_ms=500)
        assert ended["timed_out"], ended
        with pytest.raises(Unavailable) as through:
            run(client, "print(1)", ("data", "/workspace/link/x"), session="s")
        assert "not a directory" in str(through.value)
        listed = run(client, "import os; print(os.readlink('/workspace/link'))", session="s")
        assert listed["stdout"] == "/proc\n", listed
        assert kernel.process.poll() is None


def test_a_volume_is_full_at_its_size_and_an_owners_disks_share_a_limit():
    if not has_root():
        return
    config = "[exec]\nsession_disk_bytes = 16777216\nowner_disk_bytes = 50331648\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        client.create_volume("small", bytes=16 * MIB)
        flood = run(client, fill_code("/data/flood"), ("small", "/data"))
        code, megabytes = flood["stdout"].split()
        assert code == "ENOSPC" and 8 <= int(megabytes) <= 16, flood
        assert run(client, "print(2)")["stdout"] == "2\n"
        # 16 MiB of volume and a 16 MiB session fit 48 MiB; 32 MiB more do not.
        assert run(client, "print(3)", session="one")["ok"]
        with pytest.raises(LimitExceeded) as refused:
            client.create_volume("big", bytes=32 * MIB)
        assert "exec.owner_disk_bytes" in str(refused.value)
        client.create_volume("fits", bytes=16 * MIB)
        with pytest.raises(LimitExceeded):
            run(client, "print(4)", session="two")
        assert client.remove_volume("fits") is True
        assert run(client, "print(5)", session="two")["ok"]


def test_a_volume_lasts_through_a_kernel_killed_with_sigkill():
    if not has_root():
        return
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    kernel = None
    try:
        kernel = start_kernel(workdir)
        with AgentOSClient(kernel.socket_path) as client:
            client.create_volume("kept", bytes=16 * MIB)
            assert run(client, "open('/data/f', 'w').write('kept')", ("kept", "/data"))["ok"]
        kernel.process.send_signal(signal.SIGKILL)
        kernel.process.wait(timeout=10)
        kernel = start_kernel(workdir)
        with AgentOSClient(kernel.socket_path) as client:
            assert [v["volume"] for v in client.volumes()] == ["kept"]
            deadline = time.monotonic() + 30
            while True:
                again = client.exec("print(open('/data/f').read())", "python",
                                    volumes=[("kept", "/data")], timeout_ms=60_000)
                if again["ok"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)  # the killed kernel's loop device lets go
            assert again["stdout"] == "kept\n", again
    finally:
        if kernel is not None:
            kernel.stop()
        detach_beneath(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_mcp_servers_exec_mounts_a_volume_by_name():
    if not has_root():
        return
    import asyncio

    from test_mcp_server import mcp_session, text_of

    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        client.create_volume("notes", bytes=16 * MIB)

        async def body():
            async with mcp_session(kernel.socket_path) as session:
                await session.initialize()
                wrote = await session.call_tool("exec", {
                    "code": "open('/data/n.txt', 'w').write('from mcp'); print('ok')",
                    "volumes": [{"name": "notes", "path": "/data"}]})
                refused = await session.call_tool("exec", {
                    "code": "print(1)", "volumes": [{"name": "notes", "path": "/proc"}]})
                return wrote, refused

        wrote, refused = asyncio.run(body())
        assert not wrote.is_error and text_of(wrote) == "ok\n", text_of(wrote)
        assert refused.is_error and "/proc" in text_of(refused), text_of(refused)
        read = run(client, "print(open('/data/n.txt').read())", ("notes", "/data", True))
        assert read["stdout"] == "from mcp\n", read


def test_an_agents_tree_shares_one_share_of_the_disk(script_dir):
    if not has_root():
        return
    child = script_dir / "child.py"
    child.write_text(textwrap.dedent("""
        import json
        from agentos import AgentOSClient
        from agentos.errors import AgentOSError
        with AgentOSClient() as k:
            try:
                k.create_volume("more", bytes=32 << 20)
                said = "made"
            except AgentOSError as err:
                said = type(err).__name__
        print(json.dumps(said), flush=True)
        """))
    child.chmod(0o644)
    parent = textwrap.dedent(f"""
        import json, sys, time
        from agentos import AgentOSClient
        with AgentOSClient() as k:
            made = k.create_volume("big", bytes=32 << 20)["bytes"]
            k.spawn("child", {str(child)!r}, python=sys.executable)
            print(json.dumps(made), flush=True)
            time.sleep(60)
        """)
    config = "[exec]\nsession_disk_bytes = 16777216\nowner_disk_bytes = 50331648\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        made = agent_output_line(kernel, client, "parent", parent, script_dir,
                                 permissions={"spawn": True})
        assert made == 32 * MIB
        children = [a for a in client.list_agents() if a["name"] == "child"]
        deadline = time.monotonic() + 30
        while not children or not log_of(kernel, "child", children[0]["id"]).strip():
            assert time.monotonic() < deadline, kernel.log()
            time.sleep(0.1)
            children = [a for a in client.list_agents() if a["name"] == "child"]
        # The child's disks count against its parent's tree: 32 MiB more
        # would pass the 48 MiB share.
        said = json.loads(log_of(kernel, "child", children[0]["id"]))
        assert said == "LimitExceeded", said
        # The operator's share is its own.
        client.create_volume("mine", bytes=32 * MIB)
        client.kill("parent", grace_ms=0)


def test_a_restarted_agent_keeps_what_it_was_given(script_dir):
    if not has_root():
        return
    code = textwrap.dedent("""
        import json, os, sys, time
        from agentos import AgentOSClient
        if not os.path.exists('/data/first'):
            open('/data/first', 'w').write('1')
            sys.exit(1)
        with AgentOSClient() as k:
            listed = [v['volume'] for v in k.volumes()]
            ran = k.exec("print(open('/data/first').read())",
                         volumes=[('data', '/data', True)])['stdout']
        print(json.dumps([listed, ran]), flush=True)
        time.sleep(60)
        """)
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        client.create_volume("data", bytes=16 * MIB)
        said = agent_output_line(kernel, client, "restarted", code, script_dir,
                                 volumes=[("data", "/data")], restart_policy="on-failure",
                                 permissions={"exec": True})
        assert said == [["data"], "1\n"], said
        client.kill("restarted", grace_ms=0)
