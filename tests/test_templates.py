"""Templates against a real agentosd: an operator builds one (pip, in a run
whose network is the package index alone), runs and sessions start from
it, it is read-only, and it cannot be removed while a session uses it.
What a build may ask of pip is checked first: another index, a URL or an
editable install is refused by name. A kernel killed mid-build leaves no
template behind.

Packages come from the tests' stand-in index, as in test_session_disks.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from agentos import AgentOSClient
from agentos.errors import AgentOSError, BadRequest, Busy, NotFound
from conftest import detach_beneath, kernel_with, start_kernel
from test_session_disks import INDEX_HOST, has_root, index, run  # noqa: F401 (a fixture)


def template_config(index: str) -> str:
    return (
        "[exec]\n"
        "template_disk_bytes = 268435456\n"
        f'template_index_url = "http://{index}/simple/"\n'
        f'template_index_hosts = ["{INDEX_HOST}/32"]\n'
    )


def test_a_template_is_built_once_and_runs_and_sessions_start_from_it(index):
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
        # A session keeps what it was opened from.
        assert run(client, "print(1)", session="plain")["ok"]
        with pytest.raises(BadRequest) as kept:
            run(client, "print(1)", session="plain", template="probe")
        assert "opened from no template" in str(kept.value)
        with pytest.raises(Busy) as busy:
            client.remove_template("probe")
        assert "sessions s use it" in str(busy.value)
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
