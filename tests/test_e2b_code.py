"""The code interpreter through `agentos e2b`, driven by E2B's own
`e2b-code-interpreter` SDK: contexts are Python processes of the
sandbox's session that keep their globals; an execution streams what the
code prints, shows and raises."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Iterator, Optional

import pytest

from conftest import Kernel, root_kernel
from e2b_face import E2bFace, e2b_face, face, made  # noqa: F401

from e2b import NotFoundException
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def kernel() -> Iterator[Optional[Kernel]]:
    yield from root_kernel("E2B's code interpreter (processes in sessions)")


@pytest.fixture
def sandbox(face, made) -> Sandbox:
    # `code-interpreter-v1` is the python-data template, which a test's
    # kernel has not built: the plain sandbox has Python all the same.
    made_now = Sandbox.create(template="base", api_key=face.keys["alice"])
    made.append((made_now.sandbox_id, face.keys["alice"]))
    return made_now


SHOWN = '''
class Shown:
    def _repr_html_(self):
        return "<b>shown</b>"
    def _repr_png_(self):
        return b"\\x89PNG fake"
    def __repr__(self):
        return "Shown()"
Shown()
'''


def test_code_keeps_its_globals_and_its_last_value_is_the_result(sandbox):
    started = time.monotonic()
    first = sandbox.run_code("x = 41\nprint('hi')\nx + 1")
    took = time.monotonic() - started
    print(f"first run_code (its context started) took {took * 1000:.0f} ms")
    assert first.text == "42" and first.logs.stdout == ["hi\n"], first
    assert first.error is None and first.execution_count == 1
    assert sandbox.run_code("x").text == "41"
    assert sandbox.run_code("y = 1").results == []
    shown = sandbox.run_code(SHOWN).results[0]
    assert shown.is_main_result and shown.text == "Shown()" and shown.html == "<b>shown</b>"
    assert shown.png == base64.b64encode(b"\x89PNG fake").decode(), shown.png
    assert sandbox.run_code("import os\nos.environ.get('FOO')", envs={"FOO": "bar"}).text \
        == "'bar'"
    assert sandbox.run_code("os.environ.get('FOO')").text is None


def test_output_errors_and_subprocesses_stream_as_they_come(sandbox):
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    execution = sandbox.run_code(
        "import sys, time, subprocess\n"
        "print('one', flush=True); time.sleep(0.5)\n"
        "print('two', file=sys.stderr)\n"
        "subprocess.run(['echo', 'from a child'])\n",
        on_stdout=lambda out: seen.append((time.monotonic() - started, out.line)))
    assert execution.logs.stdout == ["one\n", "from a child\n"], execution.logs
    assert execution.logs.stderr == ["two\n"]
    assert seen[1][0] - seen[0][0] > 0.3, "output came as it was printed"
    failed = sandbox.run_code("def f():\n    return 1/0\nf()")
    assert failed.error.name == "ZeroDivisionError" and failed.error.value == "division by zero"
    assert 'File "<cell>", line 2, in f' in failed.error.traceback
    big = sandbox.run_code("print('a' * 300000)\n'b' * 200000")
    assert len("".join(big.logs.stdout)) == 300001
    assert big.text == repr("b" * 200000)


def test_contexts_are_made_listed_restarted_and_removed(sandbox):
    sandbox.run_code("kept = 1")
    other = sandbox.create_code_context(cwd="/tmp")
    assert other.cwd == "/tmp" and other.language == "python"
    assert sandbox.run_code("import os; os.getcwd()", context=other).text == "'/tmp'"
    assert sandbox.run_code("'kept' in dir()", context=other).text == "False"
    listed = {c.id for c in sandbox.list_code_contexts()}
    assert other.id in listed and len(listed) == 2
    sandbox.run_code("mine = 2", context=other)
    sandbox.restart_code_context(other)
    assert sandbox.run_code("'mine' in dir()", context=other).text == "False"
    sandbox.remove_code_context(other)
    assert other.id not in {c.id for c in sandbox.list_code_contexts()}
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=other)
    assert sandbox.run_code("kept").text == "1"


def test_an_execution_given_up_is_interrupted_and_its_context_goes_on(sandbox):
    sandbox.run_code("state = 'alive'")
    with pytest.raises(Exception):
        sandbox.run_code("import time\nwhile True: time.sleep(0.1)", timeout=1)
    assert sandbox.run_code("state").text == "'alive'"


def test_a_bash_context_keeps_its_variables_and_directory_and_reports_exit_statuses(sandbox):
    first = sandbox.run_code("COLOUR=teal; cd /tmp; greet() { echo \"hi $1\"; }; echo made",
                             language="bash")
    assert (first.logs.stdout, first.error) == (["made\n"], None), first
    again = sandbox.run_code("greet you; echo $COLOUR $PWD; echo oops >&2", language="bash")
    assert "".join(again.logs.stdout) == "hi you\nteal /tmp\n", again
    assert again.logs.stderr == ["oops\n"], again
    failed = sandbox.run_code("ls /no/such/place", language="bash")
    assert (failed.error.name, failed.error.value) == ("", "2"), failed.error
    # Envs are for that execution alone; its stdin is empty, not the face's.
    envs = sandbox.run_code("echo $COLOUR $ONLY; cat", language="bash",
                            envs={"COLOUR": "red", "ONLY": "now"})
    assert envs.logs.stdout == ["red now\n"], envs
    kept = sandbox.run_code("echo ${COLOUR} ${ONLY-unset}", language="bash")
    assert kept.logs.stdout == ["teal unset\n"], kept
    # The Python context is another process, with none of it.
    assert sandbox.run_code("import os; os.environ.get('COLOUR')").text is None
    # An execution given up ends, not bash; `exit` ends bash, and the next
    # execution has a fresh one.
    with pytest.raises(Exception):
        sandbox.run_code("sleep 30", language="bash", timeout=1)
    assert sandbox.run_code("echo $COLOUR", language="bash").logs.stdout == ["teal\n"]
    ended = sandbox.run_code("exit 3", language="bash")
    assert "bash ended" in ended.error.value, ended.error
    fresh = sandbox.run_code("echo ${COLOUR-gone}", language="bash")
    assert fresh.logs.stdout == ["gone\n"], fresh
    context = sandbox.create_code_context(language="bash", cwd="/home/user")
    assert context.language == "bash"
    assert sandbox.run_code("pwd", context=context).logs.stdout == ["/home/user\n"]
    # A cell's own `break` or `continue` ends the cell, not bash.
    sandbox.run_code("KEPT=1; break", context=context)
    sandbox.run_code("continue", context=context)
    assert sandbox.run_code("echo $KEPT", context=context).logs.stdout == ["1\n"]
    # Removing the context ends its bash and what it left running.
    pids = sandbox.run_code("sleep 300 & echo $$ $!", context=context).logs.stdout[0].split()
    sandbox.remove_code_context(context)
    gone = sandbox.run_code(
        "import os, time\n"
        f"for _ in range(100):\n    if not any(os.path.exists(f'/proc/{{p}}') for p in {pids}): break\n"
        "    time.sleep(0.05)\n"
        f"[p for p in {pids} if os.path.exists(f'/proc/{{p}}')]")
    assert gone.text == "[]", gone


def interpreter_call(face: E2bFace, sandbox: Sandbox, method: str, path: str,
                     body: Optional[dict], headers: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(
        face.url + path, data=None if body is None else json.dumps(body).encode(),
        method=method, headers={"Content-Type": "application/json",
                                "E2b-Sandbox-Id": sandbox.sandbox_id,
                                "E2b-Sandbox-Port": "49999", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_tokens_languages_and_requests_are_checked(face, made, sandbox):
    other = Sandbox.create(template="base", api_key=face.keys["bob"])
    made.append((other.sandbox_id, face.keys["bob"]))
    for headers in ({}, {"E2B-Traffic-Access-Token": other.traffic_access_token},
                    {"X-Access-Token": other._envd_access_token},
                    {"E2B-Traffic-Access-Token": sandbox._envd_access_token}):
        status, _ = interpreter_call(face, sandbox, "GET", "/contexts", None, headers)
        assert status == 401, headers
    own = {"E2B-Traffic-Access-Token": sandbox.traffic_access_token}
    status, body = interpreter_call(face, sandbox, "POST", "/execute",
                                    {"code": "1", "language": "r"}, own)
    assert status == 400 and b"not supported" in body, body
    status, body = interpreter_call(face, sandbox, "POST", "/execute",
                                    {"code": "1", "language": "python", "context_id": "x"}, own)
    assert status == 400, body
    status, body = interpreter_call(face, sandbox, "DELETE", "/contexts/nope", None, own)
    assert (status, body) == (404, b"Context nope not found")
    status, body = interpreter_call(face, sandbox, "POST", "/execute", {"code": "6*7"}, own)
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert lines[-1] == {"type": "end_of_execution"}, lines
    assert {"type": "result", "text": "42", "is_main_result": True} in lines, lines


def test_code_interpreter_v1_is_python_data_and_a_figure_comes_back_as_png():
    import os

    from e2b_face import kernel_with_template

    if os.geteuid() != 0:
        pytest.skip("needs root")
    with kernel_with_template("python-data") as kernel, \
            e2b_face(kernel.socket_path, key_names=("alice",)) as data_face:
        sandbox = Sandbox.create(api_key=data_face.keys["alice"], api_url=data_face.url,
                                 sandbox_url=data_face.url)
        try:
            assert sandbox.get_info().template_id == "code-interpreter-v1"
            plotted = sandbox.run_code(
                "import pandas as pd, matplotlib.pyplot as plt\n"
                "frame = pd.DataFrame({'x': [1, 2, 3], 'y': [1, 4, 9]})\n"
                "frame.plot(x='x', y='y')\n"
                "frame")
            assert plotted.error is None, plotted.error
            table, figure = plotted.results[0], plotted.results[1]
            assert table.is_main_result and "<table" in (table.html or ""), table
            assert not figure.is_main_result
            assert base64.b64decode(figure.png).startswith(b"\x89PNG"), figure
            assert sandbox.run_code("import matplotlib.pyplot as plt\nplt.get_fignums()").text \
                == "[]", "figures shown are closed"
        finally:
            sandbox.kill()
