"""TOOL through the Python SDK, against a real agentosd running PyPI's
mcp-server-time (installed into the project's .venv by scripts/setup)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentos import AgentOSClient, NotFound, ToolError
from conftest import REPO, kernel_with, log_of, wait_state

TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"


@pytest.fixture
def tool_kernel():
    if os.geteuid() != 0:
        print("!!! NOT TESTED: tool servers run confined as the sandbox user, which needs root")
        pytest.skip("needs root")
    if not TIME_SERVER.exists():
        pytest.fail(f"{TIME_SERVER} is not installed: run scripts/setup")
    with kernel_with(f'[mcp.servers.time]\ncommand = "{TIME_SERVER}"\n') as kernel:
        yield kernel


def ready(client: AgentOSClient) -> dict:
    deadline = time.monotonic() + 30
    while True:
        servers = client.tool_servers()
        states = {s["name"]: s["state"] for s in servers}
        if states.get("time") in ("ready", "failed"):
            return {"servers": servers, "tools": client.tools()}
        assert time.monotonic() < deadline, servers
        time.sleep(0.05)


def test_tools_search_and_call_through_the_sdk(tool_kernel):
    with AgentOSClient(tool_kernel.socket_path) as client:
        listing = ready(client)
        assert listing["servers"] == [{"name": "time", "state": "ready", "error": None, "tools": 2}]
        names = {(t["server"], t["name"]) for t in listing["tools"]}
        assert {("time", "get_current_time"), ("kernel", "list_agents"), ("llm", "think")} <= names

        found = client.search_tools("convert time zone", detail="full", limit=1)
        assert [t["name"] for t in found] == ["convert_time"]
        assert "properties" in found[0]["input_schema"]

        now = client.call_tool("time", "get_current_time", timezone="Europe/Paris")
        assert now["timezone"] == "Europe/Paris"
        assert client.call_tool("kernel", "list_agents") == []

        # The server's own complaint, as an error with its code.
        with pytest.raises(ToolError) as refused:
            client.call_tool("time", "get_current_time", timezone="Mars/Olympus")
        assert refused.value.code == "tool_error"
        assert "Mars/Olympus" in str(refused.value)
        with pytest.raises(NotFound) as missing:
            client.call_tool("time", "no_such_tool")
        assert missing.value.code == "not_found"


def test_a_run_calls_tools_without_importing_them(tool_kernel):
    with AgentOSClient(tool_kernel.socket_path) as client:
        ready(client)
        # Without the import line, as small models often write it.
        bare = client.exec('print(tools.time.get_current_time("UTC")["timezone"])')
        assert (bare["stdout"], bare["stderr"]) == ("UTC\n", ""), bare
        # The import still gives the same module, and the name is the run's
        # own to replace.
        same = client.exec("t = tools\nimport tools\nprint(t is tools)\ntools = 1\nprint(tools)")
        assert same["stdout"] == "True\n1\n", same


def test_a_dict_result_taken_for_text_says_which_keys_it_has(tool_kernel):
    with AgentOSClient(tool_kernel.socket_path) as client:
        ready(client)
        code = ('now = tools.time.get_current_time("UTC")\n'
                'print(isinstance(now, dict), now == dict(now), sorted(now) == sorted(dict(now)))\n'
                'now.splitlines()')
        ran = client.exec(code)
        assert ran["stdout"] == "True True True\n", ran
        assert ran["exit_code"] == 1, ran
        last = ran["stderr"].strip().splitlines()[-1]
        assert last.startswith("AttributeError: a tool's result is a dict, which has no "
                               "attribute 'splitlines': its keys are ['timezone'"), last


OWN_TOOLS_AGENT = """
from agentos import AgentOSClient
with AgentOSClient() as client:
    task = client.run("Use the time server and the kernel's tools.", max_iterations=1)
    print("STATE", task["state"])
"""


def test_a_prompt_loop_is_told_only_of_the_tools_its_owner_may_call(stub_model):
    """An agent held to one tool dispatches a prompt task: its THINK is
    told of that tool, never of those the agent may not call (as TOOL
    `list` would show it)."""
    if os.geteuid() != 0:
        print("!!! NOT TESTED: tool servers run confined as the sandbox user, which needs root")
        pytest.skip("needs root")
    scripts = Path(tempfile.mkdtemp(prefix="agentos-own-tools-"))
    scripts.chmod(0o755)
    script = scripts / "own_tools.py"
    script.write_text(OWN_TOOLS_AGENT)
    script.chmod(0o644)
    config = stub_model.config() + f'[mcp.servers.time]\ncommand = "{TIME_SERVER}"\n'
    try:
        with kernel_with(config) as kernel, AgentOSClient(kernel.socket_path) as client:
            ready(client)
            reply = client.spawn("held", script, python=sys.executable,
                                 permissions={"tools": ["time.get_current_time"]})
            info = wait_state(client, reply["id"], {"exited", "failed"}, timeout=60)
            log = log_of(kernel, "held", reply["id"])
            assert (info["state"], "STATE completed" in log) == ("exited", True), log
    finally:
        shutil.rmtree(scripts, ignore_errors=True)
    system = stub_model.requests[0]["messages"][0]["content"]
    assert "tools.time.get_current_time(" in system, system
    for hidden in ("convert_time", "list_agents", "llm.think"):
        assert hidden not in system, system


def runtime_with(tmp_path, tools: list[dict]):
    """The `tools` runtime module loaded over a catalog of `tools` (one
    server, `s`), its calls recorded instead of sent."""
    import importlib.util
    import json
    import shutil

    shutil.copy(REPO / "kernel" / "src" / "tools" / "runtime.py", tmp_path / "tools.py")
    catalog = {"servers": [{"name": "s", "description": "", "tools": tools}]}
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    spec = importlib.util.spec_from_file_location("tools_under_test", tmp_path / "tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = []
    module.call = lambda server, tool, **arguments: calls.append((server, tool, arguments))
    return module, calls


READ = {
    "name": "read_text_file", "python": "read_text_file", "description": "Read a file.",
    "input_schema": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string"}, "tail": {"type": "number"}, "head": {"type": "number"},
        "from": {"type": "string"}}},
    # As the kernel writes them: required first, then the rest in order.
    "parameters": [{"name": "path", "required": True}, {"name": "tail", "required": False},
                   {"name": "head", "required": False, "default": 10}],
    "signature": "tools.s.read_text_file(path, tail=None, head=10, **arguments)",
}


def test_positional_arguments_map_to_the_catalogs_order(tmp_path):
    import inspect

    tools, calls = runtime_with(tmp_path, [READ])
    read = tools.s.read_text_file
    read("/a.txt")
    read("/a.txt", 5)
    read("/a.txt", head=3)
    read(path="/a.txt", tail=None, **{"from": "x"})
    read("/a.txt", None, 2)
    assert [arguments for _, _, arguments in calls] == [
        {"path": "/a.txt"},
        {"path": "/a.txt", "tail": 5},
        {"path": "/a.txt", "head": 3},
        # None for an optional argument is "not given".
        {"path": "/a.txt", "from": "x"},
        {"path": "/a.txt", "head": 2},
    ]
    assert calls[0][:2] == ("s", "read_text_file")
    assert str(inspect.signature(read)) == (
        "(path: str, tail: float = None, head: float = 10, **arguments)")
    assert read.__doc__.startswith("tools.s.read_text_file(path, tail=None, head=10, **arguments)")

    calls.clear()
    with pytest.raises(TypeError) as too_many:
        read("/a.txt", 1, 2, 3)
    assert str(too_many.value) == ("tools.s.read_text_file(path, tail=None, head=10, **arguments)"
                                   " takes 3 positional arguments but 4 were given")
    with pytest.raises(TypeError) as twice:
        read("/a.txt", path="/b.txt")
    assert str(twice.value) == ("tools.s.read_text_file(path, tail=None, head=10, **arguments)"
                                " got multiple values for argument 'path'")
    assert calls == [], "a call that raises TypeError is never made"


def test_a_tool_without_parameters_in_its_catalog_still_takes_keywords(tmp_path):
    odd = {"name": "odd", "python": "odd", "input_schema": "not a schema"}
    tools, calls = runtime_with(tmp_path, [odd])
    tools.s.odd(x=1)
    assert calls == [("s", "odd", {"x": 1})]
    with pytest.raises(TypeError, match=r"tools\.s\.odd\(\.\.\.\) takes 0 positional arguments"):
        tools.s.odd(1)


def test_a_server_not_serving_is_named_with_its_last_error(tmp_path, monkeypatch):
    """A name not in the catalog is looked up in the kernel's TOOL list,
    which names only the servers the run's caller may use."""
    tools, _ = runtime_with(tmp_path, [READ])
    servers = [
        {"name": "time", "state": "failed", "tools": 0,
         "error": 'its command "uvx" is not on the kernel\'s PATH'},
        {"name": "keyed", "state": "starting", "tools": 0,
         "error": "it exited with status 1: key [secret] refused"},
        {"name": "slow", "state": "starting", "error": None, "tools": 0},
    ]
    asked = []

    def exchange(request):
        asked.append(request)
        return {"success": True, "tools": [], "servers": servers}

    monkeypatch.setattr(tools, "_exchange", exchange)
    expected = {
        "time": 'tool server `time` failed: its command "uvx" is not on the kernel\'s PATH',
        "keyed": "tool server `keyed` failed, and is starting again: it exited with status 1: "
                 "key [secret] refused",
        "slow": "tool server `slow` is starting; its tools are not listed yet",
    }
    for name, why in expected.items():
        with pytest.raises(tools.ToolError) as unserved:
            getattr(tools, name).get_current_time()
        assert (str(unserved.value), unserved.value.code) == (why, "unavailable")
    with pytest.raises(AttributeError, match="no tool server is called that"):
        tools.other
    assert tools.s.read_text_file, "a server in the catalog is never asked about"
    assert asked == [{"op": "list"}] * 4

    # Without a kernel connection there is nothing to ask.
    monkeypatch.undo()
    monkeypatch.delenv("AGENTOS_SOCKET_FD", raising=False)
    with pytest.raises(AttributeError, match="no tool server is called that"):
        tools.time


@pytest.fixture
def stub_model():
    from stub_model import StubModel

    model = StubModel(["four"])
    yield model
    model.close()


def test_a_runs_tools_take_positional_arguments_in_schema_order(stub_model):
    """llm.think's schema: `required` ["prompt"], properties prompt, system,
    max_tokens, temperature. Positions follow that order, in a real run."""
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        pytest.skip("needs root")
    code = """
import inspect, tools
print(inspect.signature(tools.llm.think))
print(tools.llm.think("what is 2+2?", "be brief", 7))
for call in (lambda: tools.llm.think("a", "b", 1, 0.5, "extra"),
             lambda: tools.llm.think("a", prompt="b")):
    try:
        call()
    except TypeError as err:
        print("TypeError:", err)
print(tools.llm.think(prompt="by name"))
"""
    with kernel_with(stub_model.config()) as kernel, AgentOSClient(kernel.socket_path) as client:
        run = client.exec(code, timeout_ms=60000)
    assert run["exit_code"] == 0, run
    lines = run["stdout"].splitlines()
    assert lines == [
        "(prompt: str, system: str = None, max_tokens: int = None, temperature: float = None)",
        "four",
        "TypeError: tools.llm.think(prompt, system=None, max_tokens=None, temperature=None)"
        " takes 4 positional arguments but 5 were given",
        "TypeError: tools.llm.think(prompt, system=None, max_tokens=None, temperature=None)"
        " got multiple values for argument 'prompt'",
        "four",
    ], run
    # Two calls reached the model, the positional one as keywords.
    assert len(stub_model.requests) == 2
    first = stub_model.requests[0]
    assert [m["content"] for m in first["messages"]] == ["be brief", "what is 2+2?"]
    assert first.get("max_tokens", first.get("max_completion_tokens")) == 7
    assert stub_model.requests[1]["messages"][-1]["content"] == "by name"
