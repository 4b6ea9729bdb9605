"""Sessions' disks against a real agentosd: each session's /workspace, home
(its own Python environment, pip's and npm's caches) and /tmp live on a
disk of its own under the state directory, so `pip install` and `npm
install` work in a session and last — across its runs, an idle or timed-out
interpreter, and a kernel killed with SIGKILL — until the session is
closed; a write past the disk's size is ENOSPC in the sandbox.

Packages come from the tests' stand-in index (tests/package_index_standin.py)
on the host's loopback, reached through the kernel's egress proxy as a
session's run would reach PyPI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from agentos import AgentOSClient
from agentos.errors import LimitExceeded
from conftest import Kernel, detach_beneath, kernel_with, log_of, start_kernel
from package_index_standin import serving

INDEX_HOST = "127.0.0.9"
# The run's network: the stand-in index and nothing else.
INDEX_ONLY = {"allow": [f"{INDEX_HOST}/32"]}
# A slow pip or npm on two busy cores.
INSTALL_MS = 180_000


def has_root() -> bool:
    if os.geteuid() != 0:
        print("!!! NOT TESTED: sessions' disks need a root kernel (loop devices, mounts)")
        return False
    return True


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    """The stand-in index's address, host:port."""
    with serving(f"{INDEX_HOST}:0") as address:
        yield address


def run(client: AgentOSClient, code: str, language: str = "python", **fields) -> dict:
    fields.setdefault("timeout_ms", INSTALL_MS)
    return client.exec(code, language, **fields)


def fill_code(path: str) -> str:
    """Code that appends to `path` until its disk is full — a MiB at a
    time, then smaller, to the last block — and prints the error's name
    and the MiB written."""
    return textwrap.dedent(f"""
        import errno
        written = 0
        for chunk in (1 << 20, 1 << 16, 1 << 12):
            try:
                with open({path!r}, 'ab') as sink:
                    while True:
                        sink.write(b'x' * chunk)
                        sink.flush()
                        written += chunk
            except OSError as err:
                code = errno.errorcode[err.errno]
        print(code, written >> 20)
        """)


def mounts_beneath(directory: Path) -> list[str]:
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split(" ")[4] for line in mounts]
    return [p for p in points if Path(p).is_relative_to(directory)]


def test_packages_installed_by_the_code_last_through_a_kernel_killed_with_sigkill(index):
    if not has_root():
        return
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    env = {"PIP_INDEX_URL": f"http://{index}/simple/"}
    kernel = start_kernel(workdir)
    try:
        with AgentOSClient(kernel.socket_path) as client:
            assert client.hello()["features"]["session_disks"] is True
            # pip, as a shell would run it: into the session's environment.
            pip = run(client, "pip install agentos-probe && echo $HOME $VIRTUAL_ENV $TMPDIR",
                      "bash", session="s1", env=env, network=INDEX_ONLY)
            assert pip["ok"], pip
            assert "Successfully installed agentos-probe-1.0.0" in pip["stdout"], pip
            assert "/home/user /home/user/.venv /tmp" in pip["stdout"], pip
            # Imported by the session's own interpreter, in its next run.
            imported = run(client, "import agentos_probe\nprint(agentos_probe.VALUE)\nx = 42",
                           session="s1", network=INDEX_ONLY)
            assert imported["stdout"] == "from the stand-in index\n", imported
            # `python -m pip`, from Python code, in another session.
            module = run(client, textwrap.dedent("""
                import subprocess, sys
                done = subprocess.run(["python", "-m", "pip", "install", "agentos-probe"],
                                      capture_output=True, text=True)
                print(done.returncode, done.stdout.strip().splitlines()[-1])
                import agentos_probe
                print(agentos_probe.__file__)
                """), session="s2", env=env, network=INDEX_ONLY)
            assert module["ok"], module
            assert module["stdout"].startswith("0 Successfully installed"), module
            assert "/home/user/.venv/lib/" in module["stdout"], module
            # npm, in /workspace, with its cache in the session's home.
            npm = run(client, f"cd /workspace && npm install --registry http://{index}/ "
                              "--no-audit --no-fund agentos-probe-npm >/dev/null && "
                              "node -e 'console.log(require(\"agentos-probe-npm\"))' && "
                              "test -d ~/.npm && echo cached",
                      "bash", session="s1", network=INDEX_ONLY)
            assert npm["ok"], npm
            assert npm["stdout"] == "from the stand-in registry\ncached\n", npm
            kept = run(client, "open('/workspace/notes.txt', 'w').write('kept')",
                       session="s1", network=INDEX_ONLY)
            assert kept["ok"], kept
        # The kernel dies without a word; its sessions' disks stay. (The
        # session opens again with what its next run asks: no network.)
        kernel.process.kill()
        kernel.process.wait()
        kernel = start_kernel(workdir)
        with AgentOSClient(kernel.socket_path) as client:
            listed = {s["session"]: s for s in client.sessions()}
            assert set(listed) == {"s1", "s2"}, listed
            assert listed["s1"]["state"] == "stored", listed
            assert listed["s1"]["disk_bytes"] == 64 << 20, listed
            after = run(client, textwrap.dedent("""
                import agentos_probe
                print(agentos_probe.VALUE, open('notes.txt').read(), 'x' in globals())
                """), session="s1")
            assert after["ok"], after
            assert after["stdout"] == "from the stand-in index kept False\n", after
            assert after.get("fresh_interpreter") is True, after
            again = run(client, "print('again')", session="s1")
            assert "fresh_interpreter" not in again, again
            node = run(client, "node -e 'console.log(require(\"agentos-probe-npm\"))'",
                       "bash", session="s1")
            assert node["stdout"] == "from the stand-in registry\n", node
            assert client.close_session("s1") is True
            assert client.close_session("s2") is True
            assert client.sessions() == []
        # Closed, a session's disk goes (on the disks' own thread, soon);
        # the one disk left mounted is the one made ahead for the next.
        sessions = workdir / "state" / "sessions"
        deadline = time.monotonic() + 10
        while any(sessions.glob("*/s*")) or mounts_beneath(sessions):
            assert time.monotonic() < deadline, (list(sessions.rglob("*")),
                                                 mounts_beneath(sessions))
            time.sleep(0.05)
        assert mounts_beneath(workdir / "state") == [str(workdir / "state" / "spare-disk" / "mnt")]
    finally:
        kernel.stop()
        detach_beneath(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_write_past_the_disk_is_enospc_in_the_sandbox_and_nothing_else_notices():
    if not has_root():
        return
    config = "[exec]\nsession_disk_bytes = 16777216\nowner_disk_bytes = 33554432\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        flood = run(client, fill_code("flood"), session="full")
        code, megabytes = flood["stdout"].split()
        assert code == "ENOSPC", flood
        assert 8 <= int(megabytes) <= 16, flood
        # The session, the kernel and another owner's work go on.
        assert run(client, "print(1)", session="full")["stdout"] == "1\n"
        assert run(client, "print(2)")["stdout"] == "2\n"
        listed = {s["session"]: s for s in client.sessions()}
        assert listed["full"]["disk_used_bytes"] <= listed["full"]["disk_bytes"], listed
        # Two disks fill the owner's share; a third is refused until one goes.
        assert run(client, "print(3)", session="second")["ok"]
        with pytest.raises(LimitExceeded) as refused:
            run(client, "print(4)", session="third")
        assert "exec.owner_disk_bytes" in str(refused.value)
        assert client.close_session("full") is True
        assert run(client, "import os; print(os.listdir('.'))", session="third")["stdout"] == "[]\n"


def test_an_idle_or_timed_out_interpreter_ends_and_its_files_stay():
    if not has_root():
        return
    with kernel_with("[exec]\nsession_idle_secs = 1\n") as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        assert run(client, "x = 1; open('kept.txt', 'w').write('kept')", session="s")["ok"]
        deadline = time.monotonic() + 20
        while client.sessions()[0]["state"] != "stored":
            assert time.monotonic() < deadline, client.sessions()
            time.sleep(0.2)
        after = run(client, "print('x' in globals(), open('kept.txt').read())", session="s")
        assert after["stdout"] == "False kept\n", after
        assert after.get("fresh_interpreter") is True, after
        timed = run(client, "y = 2\nwhile True: pass", session="s", timeout_ms=500)
        assert timed["timed_out"] is True, timed
        later = run(client, "print('y' in globals(), open('kept.txt').read())", session="s")
        assert later["stdout"] == "False kept\n", later
        assert later.get("fresh_interpreter") is True, later


def test_a_pth_file_that_exits_or_raises_leaves_the_session_usable():
    # The session's own code may write anything into its environment;
    # the next interpreter reads its .pth files as that python would.
    if not has_root():
        return
    with kernel_with("[exec]\nsession_idle_secs = 1\n") as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        hostile = ("import site, os\nsp = [p for p in site.getsitepackages() + __import__('sys').path "
                   "if p.endswith('/.venv/lib/python3.11/site-packages')][0]\n"
                   "open(os.path.join(sp, 'a_exit.pth'), 'w').write('import sys; sys.exit(3)\\n')\n"
                   "open(os.path.join(sp, 'b_raise.pth'), 'w').write('import nonexistent_module\\n')\n"
                   "print('planted')")
        assert run(client, hostile, session="s")["stdout"] == "planted\n"
        deadline = time.monotonic() + 20
        while client.sessions()[0]["state"] != "stored":
            assert time.monotonic() < deadline, client.sessions()
            time.sleep(0.2)
        again = run(client, "print(6 * 7)", session="s")
        assert again["stdout"] == "42\n" and again.get("fresh_interpreter") is True, again


def test_a_run_sees_its_own_sessions_disk_and_nothing_of_the_host_or_other_sessions():
    if not has_root():
        return
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        assert run(client, "open('secret.txt', 'w').write('mine')", session="a")["ok"]
        look = textwrap.dedent("""
            import json, os
            mounts = open('/proc/self/mountinfo').read()
            print(json.dumps({
                'files': os.listdir('/workspace'),
                'home': sorted(os.listdir('/home/user')),
                'host_paths': [line.split()[3] for line in mounts.splitlines()
                               if 'sessions' in line or 'disk.img' in line],
                'disk': [(line.split()[4], line.split()[5]) for line in mounts.splitlines()
                         if line.split(' - ')[1].startswith('ext4 ')
                         and line.split()[4] in ('/workspace', '/home/user', '/tmp')],
            }))
            """)
        other = json.loads(run(client, look, session="b")["stdout"])
        assert other["files"] == [], other
        assert other["home"] == [".profile", ".venv"], other
        assert other["host_paths"] == [], other
        assert sorted(point for point, _ in other["disk"]) == ["/home/user", "/tmp", "/workspace"]
        assert all("nosuid" in o and "nodev" in o for _, o in other["disk"]), other
        # A run without a session has no disk: its home is an empty
        # directory of the read-only root.
        bare = run(client, "import os\nprint(os.listdir('/home/user'))\n"
                           "open('/home/user/x', 'w')")
        assert bare["stdout"] == "[]\n", bare
        assert "Read-only file system" in bare["error"], bare


def test_pip_on_a_full_disk_fails_with_enospc_and_what_was_written_stays(index):
    if not has_root():
        return
    env = {"PIP_INDEX_URL": f"http://{index}/simple/", "PIP_NO_CACHE_DIR": "1"}
    config = "[exec]\nsession_disk_bytes = 16777216\n"
    with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
        kept = run(client, "import os\nwith open('kept.txt', 'w') as f:\n"
                           "    f.write('acknowledged'); f.flush(); os.fsync(f.fileno())",
                   session="s", network=INDEX_ONLY)
        assert kept["ok"], kept
        full = run(client, fill_code("/workspace/filler"), session="s", network=INDEX_ONLY)
        assert full["stdout"].split()[0] == "ENOSPC", full
        pip = run(client, "pip install agentos-probe 2>&1; echo exit=$?", "bash",
                  session="s", env=env, network=INDEX_ONLY)
        assert "exit=0" not in pip["stdout"], pip
        assert "No space left on device" in pip["stdout"], pip
        # The kernel, the session and what it had written go on.
        assert run(client, "print(2)")["stdout"] == "2\n"
        read = run(client, "print(open('kept.txt').read())", session="s", network=INDEX_ONLY)
        assert read["stdout"] == "acknowledged\n", read
        # Room made, the same install succeeds.
        again = run(client, "rm /workspace/filler && pip install agentos-probe >/dev/null && "
                            "python -c 'import agentos_probe; print(agentos_probe.VALUE)'",
                    "bash", session="s", env=env, network=INDEX_ONLY)
        assert again["stdout"] == "from the stand-in index\n", again
        assert kernel.process.poll() is None


def test_a_flood_of_installs_from_one_owner_leaves_another_served(index):
    if not has_root():
        return
    import concurrent.futures

    env = {"PIP_INDEX_URL": f"http://{index}/simple/"}
    config = ("[exec]\nsession_disk_bytes = 16777216\nowner_disk_bytes = 50331648\n"
              "max_running_per_owner = 2\n")
    scripts = Path(tempfile.mkdtemp(prefix="agentos-flood-", dir="/var/tmp"))
    scripts.chmod(0o755)
    other = scripts / "other.py"
    other.write_text(textwrap.dedent("""
        import json, time
        from agentos import AgentOSClient
        with AgentOSClient() as kernel:
            started = time.monotonic()
            served = [kernel.exec("print('served')", timeout_ms=120_000)["stdout"]
                      for _ in range(5)]
            print(json.dumps([served, time.monotonic() - started]), flush=True)
        """))
    other.chmod(0o644)
    try:
        with kernel_with(config) as kernel:
            def install(session: str) -> str:
                with AgentOSClient(kernel.socket_path) as flooder:
                    try:
                        done = run(flooder, "pip install agentos-probe >/dev/null && "
                                            f"cat /dev/zero > /workspace/fill; echo {session}",
                                   "bash", session=session, env=env, network=INDEX_ONLY)
                        return "ran" if done["stdout"].strip() == session else str(done)
                    except LimitExceeded:
                        return "refused"

            with concurrent.futures.ThreadPoolExecutor(8) as pool, \
                    AgentOSClient(kernel.socket_path) as client:
                flood = [pool.submit(install, f"f{i}") for i in range(8)]
                # Meanwhile an agent, another owner, has its runs served.
                agent = client.spawn("other", other, python=sys.executable,
                                     permissions={"exec": True})
                deadline = time.monotonic() + 120
                while not log_of(kernel, "other", agent["id"]).strip():
                    assert time.monotonic() < deadline, kernel.log()
                    time.sleep(0.1)
                outcomes = [f.result(timeout=INSTALL_MS / 1000) for f in flood]
            served, took = json.loads(log_of(kernel, "other", agent["id"]))
            assert served == ["served\n"] * 5, served
            # Three 16 MiB disks fill the 48 MiB share: the rest are refused.
            assert outcomes.count("ran") == 3, outcomes
            assert outcomes.count("refused") == 5, outcomes
            print(f"another owner's 5 runs took {took:.2f} s during the flood")
            assert kernel.process.poll() is None
    finally:
        shutil.rmtree(scripts, ignore_errors=True)


def test_pip_in_a_session_from_the_cli_and_the_mcp_servers_exec(index):
    if not has_root():
        return
    import asyncio

    from test_cli import agentos
    from test_mcp_server import mcp_session, text_of

    # Runs that name no network get the kernel's default: the index.
    config = f'[network]\ndefault_allow = ["{INDEX_HOST}/32"]\n'
    pip = f"pip install --quiet --index-url http://{index}/simple/ agentos-probe"
    with kernel_with(config) as kernel:
        installed = agentos(kernel, "exec", "--bash", "--session", "cli", pip)
        assert installed.returncode == 0, installed.stderr
        imported = agentos(kernel, "exec", "--session", "cli",
                           "import agentos_probe; print(agentos_probe.VALUE)")
        assert imported.stdout == "from the stand-in index\n", imported.stderr
        listed = agentos(kernel, "sessions")
        assert "cli" in listed.stdout, listed.stdout

        async def body():
            async with mcp_session(kernel.socket_path) as session:
                await session.initialize()
                code = ("import subprocess\n"
                        f"subprocess.run({pip.split()!r}, check=True)\n"
                        "import agentos_probe\nprint(agentos_probe.VALUE)")
                return await session.call_tool("exec", {"code": code, "session": "mcp"})

        through_mcp = asyncio.run(body())
        assert text_of(through_mcp) == "from the stand-in index\n", text_of(through_mcp)
