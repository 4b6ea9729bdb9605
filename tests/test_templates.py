"""Templates against a real agentosd: an operator builds one (pip, in a run
whose network is the package index alone), runs and sessions start from
it, as do agents; it is read-only, and it cannot be removed while a
session or an agent uses it.
What a build may ask of pip is checked first: another index, a URL or an
editable install is refused by name. A kernel killed mid-build leaves no
template behind.

Packages come from the tests' stand-in index, as in test_session_disks.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agentos import AgentOSClient
from agentos.errors import AgentOSError, BadRequest, Busy, NotFound
from conftest import detach_beneath, kernel_with, log_of, start_kernel, wait_state
from test_session_disks import INDEX_HOST, INSTALL_MS, has_root, index, run  # noqa: F401
from test_volumes import script_dir  # noqa: F401 (a fixture)


def template_config(index: str) -> str:
    return (
        "[exec]\n"
        "template_disk_bytes = 268435456\n"
        f'template_index_url = "http://{index}/simple/"\n'
        f'template_index_hosts = ["{INDEX_HOST}/32"]\n'
    )


def test_a_template_is_built_once_and_runs_sessions_and_agents_start_from_it(index, script_dir):
    if not has_root():
        return
    with kernel_with(template_config(index)) as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        built = client.build_template("probe", ["agentos-probe"])
        assert built["ok"], built
        assert "Successfully installed agentos-probe-1.0.0" in built["stdout"], built
        assert built["template"]["template"] == "probe", built
        assert built["template"]["packages"] == ["agentos-probe"], built
        assert [t["template"] for t in client.templates()] == ["probe"]
        # A run from it imports its packages; nothing in it can be changed.
        used = run(client, "import agentos_probe\nprint(agentos_probe.VALUE)\n"
                           "open('/opt/template/x', 'w')", template="probe")
        assert used["stdout"] == "from the stand-in index\n", used
        assert "Read-only file system" in used["error"], used
        # A session from it sees its packages as installed: pip adds none.
        session = run(client, "pip install --no-index agentos-probe 2>&1 | tail -1",
                      "bash", session="s", template="probe")
        assert "already satisfied" in session["stdout"], session
        # Its later runs, and programs started in it, have the template's
        # programs on their PATH without naming it.
        later = run(client, "echo $PATH", "bash", session="s")
        assert "/opt/template/bin" in later["stdout"].split(":"), later
        started = client.run_process("s", ["/bin/sh", "-c", "echo $PATH"])
        assert "/opt/template/bin" in started["stdout"].decode().split(":"), started
        # A session keeps what it was opened from.
        assert run(client, "print(1)", session="plain")["ok"]
        with pytest.raises(BadRequest) as kept:
            run(client, "print(1)", session="plain", template="probe")
        assert "opened from no template" in str(kept.value)
        # An agent from it runs its script with the template's python, and
        # its programs find the template's first on PATH.
        script = script_dir / "agent.py"
        script.write_text("import json, os, sys, agentos_probe\n"
                          "print(json.dumps([agentos_probe.VALUE, sys.prefix,"
                          " os.environ['PATH'].split(':')[0]]), flush=True)\n"
                          "import time; time.sleep(60)\n")
        script.chmod(0o644)
        agent = client.spawn("from-template", script, template="probe")
        deadline = time.monotonic() + 30
        while not log_of(kernel, "from-template", agent["id"]).strip():
            assert time.monotonic() < deadline, kernel.log()
            time.sleep(0.1)
        said = json.loads(log_of(kernel, "from-template", agent["id"]))
        assert said == ["from the stand-in index", "/opt/template", "/opt/template/bin"], said
        with pytest.raises(NotFound):
            client.spawn("no-such", script, template="nope")
        with pytest.raises(Busy) as busy:
            client.remove_template("probe")
        assert 'session "s"' in str(busy.value), busy.value
        assert f"agent {agent['id']}" in str(busy.value), busy.value
        client.kill("from-template", grace_ms=0)
        wait_state(client, agent["id"], {"killed", "exited", "failed"})
        assert client.close_session("s") is True
        assert client.remove_template("probe") is True
        assert client.remove_template("probe") is False
        with pytest.raises(NotFound):
            run(client, "print(1)", template="probe")


def test_a_build_asks_pip_for_named_packages_from_the_index_and_nothing_else(index):
    if not has_root():
        return
    with kernel_with(template_config(index)) as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        for packages, requirements, said in [
            (["git+https://example.com/x.git"], None, "URL"),
            (["-e ."], None, "editable"),
            ([], "agentos-probe\n-i https://evil.example/simple\n", "line 2: -i is refused"),
            ([], "--extra-index-url https://evil.example/simple\n", "another index"),
            ([], "-r /etc/shadow\n", "an included file"),
            ([], "./local-package\n", "starts with a package"),
        ]:
            with pytest.raises(BadRequest) as refused:
                client.build_template("bad", packages, requirements=requirements)
            assert said in str(refused.value), (packages, requirements, refused.value)
        # pip finding nothing is a build that failed, and leaves nothing.
        failed = client.build_template("missing", ["no-such-package-here"])
        assert not failed["ok"], failed
        assert "was not built" in failed["error"], failed
        assert "No matching distribution" in failed["stdout"] + failed["stderr"], failed
        assert client.templates() == []
        # A build reaches the index and nothing else: its network is
        # the configured index's hosts alone.
        escaped = client.build_template("escape", ["agentos-probe"], requirements=None)
        assert escaped["ok"], escaped
        assert escaped["network"]["refused"] == 0, escaped
        looked = run(client, "import urllib.request\n"
                             "urllib.request.urlopen('http://example.com', timeout=5)",
                     template="escape")
        assert not looked["ok"], looked


def test_a_kernel_killed_mid_build_leaves_no_template(index):
    if not has_root():
        return
    workdir = Path(tempfile.mkdtemp(prefix="agentos-test-"))
    kernel = start_kernel(workdir, template_config(index))
    try:
        building = workdir / "state" / "templates" / ".build-half"
        outcome: list = []

        def build() -> None:
            try:
                with AgentOSClient(kernel.socket_path) as client:
                    outcome.append(client.build_template("half", ["agentos-probe"]))
            except (AgentOSError, OSError) as err:
                outcome.append(err)

        thread = threading.Thread(target=build, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not building.exists():
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.005)
        kernel.process.kill()
        kernel.process.wait()
        thread.join(timeout=10)
        kernel = start_kernel(workdir, template_config(index))
        with AgentOSClient(kernel.socket_path) as client:
            assert client.templates() == [], outcome
            with pytest.raises(NotFound):
                run(client, "print(1)", template="half")
        deadline = time.monotonic() + 10
        while building.exists():
            assert time.monotonic() < deadline, "the half-built disk stayed"
            time.sleep(0.05)
    finally:
        kernel.stop()
        detach_beneath(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


def test_an_agent_builds_a_template_of_its_own_within_its_network(index, script_dir):
    if not has_root():
        return
    script = script_dir / "builder.py"
    script.write_text(textwrap.dedent("""
        import json, time
        from agentos import AgentOSClient
        from agentos.errors import AgentOSError
        out = {}
        with AgentOSClient() as k:
            try:
                built = k.build_template("mine", ["agentos-probe"])
                out["built"] = [built["ok"], built["template"]["shared"]]
                out["listed"] = [[t["template"], t["shared"]] for t in k.templates()]
                out["used"] = k.exec("import agentos_probe; print(agentos_probe.VALUE)",
                                     template="mine")["stdout"]
            except AgentOSError as err:
                out["error"] = f"{type(err).__name__}: {err}"
        print(json.dumps(out), flush=True)
        time.sleep(60)
        """))
    script.chmod(0o644)
    with kernel_with(template_config(index)) as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        builder = client.spawn("builder", script, python=sys.executable,
                               network={"allow": [f"{INDEX_HOST}/32"]},
                               permissions={"exec": True})
        deadline = time.monotonic() + INSTALL_MS / 1000
        while not log_of(kernel, "builder", builder["id"]).strip():
            assert time.monotonic() < deadline, kernel.log()
            time.sleep(0.2)
        said = json.loads(log_of(kernel, "builder", builder["id"]))
        assert said == {"built": [True, False], "listed": [["mine", False]],
                        "used": "from the stand-in index\n"}, said
        # It is the agent's alone.
        assert client.templates() == []
        with pytest.raises(NotFound):
            run(client, "print(1)", template="mine")
        # An agent whose network stops short of the index builds nothing.
        boxed = script_dir / "boxed.py"
        boxed.write_text(script.read_text().replace('"mine"', '"boxed"'))
        boxed.chmod(0o644)
        walled = client.spawn("walled", boxed, python=sys.executable,
                              permissions={"exec": True})
        while not log_of(kernel, "walled", walled["id"]).strip():
            assert time.monotonic() < deadline, kernel.log()
            time.sleep(0.2)
        refused = json.loads(log_of(kernel, "walled", walled["id"]))["error"]
        assert refused.startswith("PermissionDenied") and "network" in refused, refused
        # Its own templates end with it.
        client.kill("builder", grace_ms=0)
        templates = Path(kernel.log_path.parent / "state" / "templates")
        while any("@" in entry.name for entry in templates.iterdir()):
            assert time.monotonic() < deadline, list(templates.iterdir())
            time.sleep(0.1)
        client.kill("walled", grace_ms=0)


def test_templates_from_the_cli_and_the_mcp_servers_exec(index, script_dir):
    if not has_root():
        return
    import asyncio

    from test_cli import agentos
    from test_mcp_server import mcp_session, text_of

    with kernel_with(template_config(index)) as kernel:
        built = agentos(kernel, "template", "build", "clitpl", "--pip", "agentos-probe")
        assert built.returncode == 0, built.stderr
        listed = agentos(kernel, "template", "ls")
        assert "clitpl" in listed.stdout and "agentos-probe" in listed.stdout, listed.stdout
        used = agentos(kernel, "exec", "--template", "clitpl",
                       "import agentos_probe; print(agentos_probe.VALUE)")
        assert used.stdout == "from the stand-in index\n", used.stderr
        script = script_dir / "cli-agent.py"
        script.write_text("import agentos_probe\nprint(agentos_probe.VALUE, flush=True)\n")
        script.chmod(0o644)
        spawned = agentos(kernel, "spawn", "--template", "clitpl", "--json", "cli-agent",
                          str(script))
        assert spawned.returncode == 0, spawned.stderr
        agent = json.loads(spawned.stdout)["id"]
        deadline = time.monotonic() + 30
        while "from the stand-in index" not in log_of(kernel, "cli-agent", agent):
            assert time.monotonic() < deadline, log_of(kernel, "cli-agent", agent)
            time.sleep(0.1)

        async def body():
            async with mcp_session(kernel.socket_path) as session:
                await session.initialize()
                return await session.call_tool("exec", {
                    "code": "import agentos_probe; print(agentos_probe.VALUE)",
                    "template": "clitpl"})

        through_mcp = asyncio.run(body())
        assert text_of(through_mcp) == "from the stand-in index\n", text_of(through_mcp)
        with AgentOSClient(kernel.socket_path) as client:
            wait_state(client, agent, {"exited"})
        removed = agentos(kernel, "template", "rm", "clitpl")
        assert removed.returncode == 0, removed.stderr
        assert "clitpl" not in agentos(kernel, "template", "ls").stdout
