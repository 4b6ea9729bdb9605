"""`agentos mcp`'s long work, end to end against a real agentosd: exec as
an MCP task (the Tasks extension, io.modelcontextprotocol/tasks) that is
followed and cancelled, a blocking exec that reports progress, a client's
cancellation reaching the kernel, and run_prompt.

PyPI's MCP client speaks the Tasks extension only on the 2026-07-28
revision; this server negotiates 2025-11-25, where the extension is
declared at initialize. The client here declares it there, and sends the
task-augmented tools/call and tasks/* through the client's own JSON-RPC
dispatcher, which returns results as they came."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from agentos import AgentOSClient, Opcode
from conftest import Kernel, binary, start_kernel
from test_mcp_server import HINTS, annotations_of, effective_hints

TASKS = "io.modelcontextprotocol/tasks"
INVALID_PARAMS = -32602


def server_parameters(kernel: Kernel) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(binary("agentos")), args=["--socket", kernel.socket_path, "mcp"]
    )


@contextlib.asynccontextmanager
async def tasks_session(kernel: Kernel) -> AsyncIterator[JSONRPCDispatcher]:
    """A session whose client declared the Tasks extension at initialize;
    yields the dispatcher that sends raw requests on it."""
    async with stdio_client(server_parameters(kernel)) as (read, write):
        dispatcher = JSONRPCDispatcher(read, write)
        session = ClientSession(dispatcher=dispatcher, extensions={TASKS: {}})
        async with session:
            init = await session.initialize()
            assert TASKS in (init.capabilities.extensions or {}), init.capabilities
            yield dispatcher


@contextlib.asynccontextmanager
async def plain_session(kernel: Kernel) -> AsyncIterator[ClientSession]:
    async with stdio_client(server_parameters(kernel)) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=120) as session:
            await session.initialize()
            yield session


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())


async def call(dispatcher: JSONRPCDispatcher, method: str, params: dict) -> dict:
    return await dispatcher.send_raw_request(method, params, {"timeout": 60})


async def task_until(
    dispatcher: JSONRPCDispatcher, task_id: str, done: Callable[[dict], bool], seconds: float = 60
) -> dict:
    """Polls tasks/get until `done` holds for the task."""
    deadline = time.monotonic() + seconds
    while True:
        task = await call(dispatcher, "tasks/get", {"taskId": task_id})
        if done(task):
            return task
        assert time.monotonic() < deadline, f"task {task_id} never got there: {task}"
        await asyncio.sleep(0.2)


def processes_with_argument(argument: str) -> list[int]:
    """Host pids of processes with `argument` as one of their arguments.
    The test runs as root: a sandbox's processes are in its /proc too."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            arguments = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in arguments:
            pids.append(int(entry))
    return pids


async def until_process(marker: str, present: bool, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while bool(processes_with_argument(marker)) != present:
        assert time.monotonic() < deadline, (
            f"a process with argument {marker} is {'still not' if present else 'still'} there"
        )
        await asyncio.sleep(0.1)


def sleeper(marker: str) -> dict:
    """An exec that prints, then sleeps as a process whose argument is
    `marker`, so the host can see whether it still runs."""
    return {"code": f"echo started; sleep {marker}", "language": "bash"}


def new_marker() -> str:
    return str(random.randint(100_000_000, 999_999_999))


def kernel_task(kernel: Kernel, task_id: str) -> dict:
    with AgentOSClient(kernel.socket_path) as client:
        listed = client.call_json(Opcode.TASK, {"op": "list", "limit": 50})
    return next(task for task in listed["tasks"] if task["task_id"] == task_id)


def test_a_task_augmented_exec_cancelled_mid_run_leaves_nothing_running(kernel):
    marker = new_marker()

    async def body():
        async with tasks_session(kernel) as dispatcher:
            handle = await call(
                dispatcher, "tools/call", {"name": "exec", "arguments": sleeper(marker)}
            )
            task_id = handle["taskId"]
            running = await task_until(
                dispatcher, task_id, lambda task: "started" in task.get("statusMessage", "")
            )
            await until_process(marker, present=True)
            ack = await call(dispatcher, "tasks/cancel", {"taskId": task_id})
            cancelled = await task_until(
                dispatcher, task_id, lambda task: task["status"] != "working"
            )
            await until_process(marker, present=False)
            return handle, running, ack, cancelled

    handle, running, ack, cancelled = run(body)
    assert handle["resultType"] == "task", handle
    assert handle["status"] == "working" and handle["taskId"].startswith("t-"), handle
    assert handle["pollIntervalMs"] > 0 and "createdAt" in handle
    assert running["status"] == "working" and running["statusMessage"] == "started\n", running
    assert ack.get("resultType", "complete") == "complete" and set(ack) <= {"resultType"}, ack
    assert cancelled["status"] == "cancelled" and "result" not in cancelled, cancelled
    # The MCP task is the kernel's task: the kernel has it cancelled.
    task = kernel_task(kernel, handle["taskId"])
    assert task["kind"] == "exec" and task["state"] == "cancelled", task


def test_a_task_augmented_exec_completes_with_its_structured_output(kernel):
    async def body():
        async with tasks_session(kernel) as dispatcher:
            handle = await call(
                dispatcher, "tools/call",
                {"name": "exec", "arguments": {"code": "print(6 * 7)"}},
            )
            done = await task_until(
                dispatcher, handle["taskId"], lambda task: task["status"] != "working"
            )
            failing = await call(
                dispatcher, "tools/call",
                {"name": "exec", "arguments": {"code": "exit 3", "language": "bash"}},
            )
            failed = await task_until(
                dispatcher, failing["taskId"], lambda task: task["status"] != "working"
            )
            return handle, done, failed

    handle, done, failed = run(body)
    assert handle["resultType"] == "task", handle
    assert done["taskId"] == handle["taskId"] and done["status"] == "completed", done
    result = done["result"]
    assert result["isError"] is False, result
    assert result["structuredContent"]["stdout"] == "42\n", result
    assert result["structuredContent"]["exit_code"] == 0
    assert result["content"] == [{"type": "text", "text": "42\n"}]
    # A run that fails ran: its result says how, as a blocking exec's does.
    assert failed["status"] == "completed", failed
    assert failed["result"]["structuredContent"]["exit_code"] == 3, failed
    assert kernel_task(kernel, handle["taskId"])["state"] == "completed"


def test_a_task_dispatched_by_tool_is_followed_as_an_mcp_task(kernel):
    async def body():
        async with tasks_session(kernel) as dispatcher:
            dispatched = await call(
                dispatcher, "tools/call",
                {"name": "task_dispatch", "arguments": {"code": "print('hi')"}},
            )
            task_id = dispatched["structuredContent"]["task_id"]
            return await task_until(dispatcher, task_id, lambda task: task["status"] != "working")

    done = run(body)
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"]["stdout"] == "hi\n", done


def test_a_blocking_exec_with_a_progress_token_reports_the_output_so_far(kernel):
    code = "echo first; sleep 2.5; echo second; sleep 2.5; echo third"
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def body():
        async with plain_session(kernel) as session:
            return await session.call_tool(
                "exec", {"code": code, "language": "bash"}, progress_callback=on_progress
            )

    result = run(body)
    assert not result.is_error, result
    assert result.structured_content["stdout"] == "first\nsecond\nthird\n", result
    messages = [message for _, message in progress]
    assert any(message and message.startswith("first\n") for message in messages), progress
    assert "first\nsecond\n" in messages, progress
    values = [value for value, _ in progress]
    assert values == sorted(set(values)), progress


@pytest.mark.parametrize("with_progress", [False, True], ids=["plain", "with-progress"])
def test_a_client_cancelling_a_blocking_exec_kills_its_run(kernel, with_progress):
    marker = new_marker()

    async def ignore(value: float, total: float | None, message: str | None) -> None:
        pass

    async def body():
        async with plain_session(kernel) as session:
            call_task = asyncio.create_task(
                session.call_tool(
                    "exec", sleeper(marker), progress_callback=ignore if with_progress else None
                )
            )
            await until_process(marker, present=True)
            # The client's dispatcher sends notifications/cancelled for a
            # call its caller abandons.
            call_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call_task
            await until_process(marker, present=False, seconds=15)
            # The server still serves.
            return await session.call_tool("exec", {"code": "print('after')"})

    after = run(body)
    assert after.structured_content["stdout"] == "after\n", after
    if with_progress:
        with AgentOSClient(kernel.socket_path) as client:
            listed = client.call_json(Opcode.TASK, {"op": "list", "kind": "exec"})
        assert [task["state"] for task in listed["tasks"]] == ["cancelled"], listed


@pytest.mark.parametrize("with_progress", [False, True], ids=["plain", "with-progress"])
def test_a_server_stopping_mid_call_leaves_nothing_running(kernel, with_progress):
    """The client closes the server's stdin with an exec under way and no
    cancellation: the server ends, and the run with it. (Raw JSON-RPC: an
    MCP client that leaves cancels its calls first.)"""
    marker = new_marker()
    server = subprocess.Popen(
        [binary("agentos"), "--socket", kernel.socket_path, "mcp"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    params: dict[str, Any] = {"name": "exec", "arguments": sleeper(marker)}
    if with_progress:
        params["_meta"] = {"progressToken": "p1"}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params},
    ]
    try:
        for message in messages:
            server.stdin.write(json.dumps(message).encode() + b"\n")
        server.stdin.flush()
        asyncio.run(until_process(marker, present=True))
        server.stdin.close()
        server.wait(timeout=30)
        asyncio.run(until_process(marker, present=False, seconds=15))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if with_progress:
        with AgentOSClient(kernel.socket_path) as client:
            listed = client.call_json(Opcode.TASK, {"op": "list", "kind": "exec"})
        assert [task["state"] for task in listed["tasks"]] == ["cancelled"], listed


def test_tasks_requests_about_unknown_ids_are_invalid_params(kernel):
    async def body():
        errors = {}
        async with tasks_session(kernel) as dispatcher:
            for name, task_id in {
                "unknown": "t-00000000000000000000",
                "empty": "",
                "path": "../../etc/passwd",
                "long": "t-" + "9" * 10_000,
            }.items():
                for method in ("tasks/get", "tasks/cancel"):
                    with pytest.raises(MCPError) as raised:
                        await call(dispatcher, method, {"taskId": task_id})
                    errors[name, method] = raised.value.error
            # Still serving.
            errors["status"] = await call(dispatcher, "tools/call", {"name": "status", "arguments": {}})
        return errors

    errors = run(body)
    status = errors.pop("status")
    assert status["isError"] is False, status
    for (name, method), error in errors.items():
        assert error.code == INVALID_PARAMS, (name, method, error)
        assert len(error.message) < 400, (name, method, error.message[:400])
    assert "not_found" in errors["unknown", "tasks/get"].message


# An agent that runs `agentos mcp` and asks it, through the Tasks
# extension, for a task by id; prints what each request got.
ASK_FOR_TASK = """\
import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

agentos, task_id = sys.argv[1], sys.argv[2]


async def main():
    # The client passes the server little of its environment: the agent's
    # socket is given by name.
    socket = os.environ["AGENTOS_SOCKET"]
    server = StdioServerParameters(command=agentos, args=["--socket", socket, "mcp"])
    async with stdio_client(server) as (read, write):
        dispatcher = JSONRPCDispatcher(read, write)
        extensions = {"io.modelcontextprotocol/tasks": {}}
        async with ClientSession(dispatcher=dispatcher, extensions=extensions) as session:
            await session.initialize()
            for method in ("tasks/get", "tasks/cancel"):
                try:
                    await dispatcher.send_raw_request(method, {"taskId": task_id}, {"timeout": 30})
                    print(method, "ANSWERED", flush=True)
                except MCPError as err:
                    print(method, err.error.code, err.error.message, flush=True)


asyncio.run(main())
print("DONE", flush=True)
"""


@contextlib.contextmanager
def agent_script(source: str) -> Iterator[tuple[Path, Path]]:
    """`source` as a script, and a copy of `agentos`, where an agent's
    sandbox can see them (it shows the script's directory)."""
    script_dir = Path(tempfile.mkdtemp(prefix="agentos-mcp-tasks-"))
    try:
        script_dir.chmod(0o755)
        script = script_dir / "script.py"
        script.write_text(source)
        script.chmod(0o644)
        agentos = script_dir / "agentos"
        shutil.copy(binary("agentos"), agentos)
        agentos.chmod(0o755)
        yield script, agentos
    finally:
        shutil.rmtree(script_dir, ignore_errors=True)


def test_another_callers_task_is_unknown_to_it(kernel):
    """An operator's task, asked for by an agent's own `agentos mcp`: the
    same answer as for a task that never was, and the task runs on."""
    with agent_script(ASK_FOR_TASK) as (script, agentos), AgentOSClient(
        kernel.socket_path
    ) as client:
        dispatched = client.call_json(
            Opcode.TASK,
            {"op": "dispatch", "kind": "exec",
             "request": {"code": "import time; time.sleep(120)"}},
        )
        task_id = dispatched["task_id"]
        texts = {}
        for asked in (task_id, "t-0000000000000000"):
            name = f"asker{len(texts)}"
            client.call_json(
                Opcode.SPAWN, {"name": name, "script": str(script), "args": [str(agentos), asked]}
            )
            texts[asked] = agent_log_until(client, name, "DONE")
        status = client.call_json(Opcode.TASK, {"op": "status", "task_id": task_id})
        client.call_json(Opcode.TASK, {"op": "cancel", "task_id": task_id})
    theirs = texts[task_id].replace(task_id, "ID")
    never_was = texts["t-0000000000000000"].replace("t-0000000000000000", "ID")
    assert f"tasks/get {INVALID_PARAMS} " in theirs and "not_found" in theirs, theirs
    assert f"tasks/cancel {INVALID_PARAMS} " in theirs, theirs
    assert "ANSWERED" not in theirs
    # Nothing tells the task apart from one that never was.
    assert theirs == never_was, (theirs, never_was)
    assert status["task"]["state"] == "running", status


# An agent that runs `agentos mcp` and calls exec with a progress token.
EXEC_WITH_PROGRESS = """\
import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def ignore(progress, total, message):
    pass


async def main():
    socket = os.environ["AGENTOS_SOCKET"]
    server = StdioServerParameters(command=sys.argv[1], args=["--socket", socket, "mcp"])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(
                "exec", {"code": "print(6 * 7)"}, progress_callback=ignore
            )
            print("ERROR" if result.is_error else "OK", result.content[0].text.strip(), flush=True)


asyncio.run(main())
print("DONE", flush=True)
"""


def test_a_caller_without_tasks_still_gets_its_exec_with_a_progress_token(kernel):
    """An agent that may not dispatch tasks asks for progress: the run
    runs as a plain EXEC."""
    with agent_script(EXEC_WITH_PROGRESS) as (script, agentos), AgentOSClient(
        kernel.socket_path
    ) as client:
        client.call_json(
            Opcode.SPAWN,
            {"name": "no-tasks", "script": str(script), "args": [str(agentos)],
             "permissions": {"task": False}},
        )
        text = agent_log_until(client, "no-tasks", "DONE")
    assert "OK 42" in text.splitlines(), text


def agent_log_until(client: AgentOSClient, name: str, line: str, seconds: float = 60) -> str:
    """The agent's log once it holds `line`."""
    deadline = time.monotonic() + seconds
    while True:
        text = client.call_json(Opcode.LOGS, {"name": name})["text"]
        if line in text.splitlines():
            return text
        assert time.monotonic() < deadline, f"agent {name} never printed {line}:\n{text}"
        time.sleep(0.2)


def test_tasks_methods_need_the_extension_declared(kernel):
    async def body():
        async with stdio_client(server_parameters(kernel)) as (read, write):
            dispatcher = JSONRPCDispatcher(read, write)
            async with ClientSession(dispatcher=dispatcher) as session:
                await session.initialize()
                with pytest.raises(MCPError) as raised:
                    await call(dispatcher, "tasks/get", {"taskId": "t-1"})
                # Without the extension a long exec is a blocking call.
                result = await session.call_tool("exec", {"code": "print(1)"})
                return raised.value.error, result

    error, result = run(body)
    # -32021: Missing required client capability, naming the extension.
    assert error.code == -32021 and TASKS in str(error.data), error
    assert result.structured_content["stdout"] == "1\n"


@pytest.fixture(scope="module")
def llm_kernel() -> Iterator[Kernel]:
    # One kernel for the module's run_prompt tests, so the model loads once.
    workdir = Path(tempfile.mkdtemp(prefix="agentos-mcp-llm-"))
    kernel = start_kernel(workdir, llm=True)
    yield kernel
    try:
        kernel.stop()
    except subprocess.TimeoutExpired:
        kernel.process.kill()
        kernel.process.wait()
    shutil.rmtree(workdir, ignore_errors=True)


def test_run_prompt_blocking_gives_the_loops_answer_and_rounds(llm_kernel):
    """The local model is tiny: its answers are checked for shape, never
    wording."""

    async def body():
        async with plain_session(llm_kernel) as session:
            listed = await session.list_tools()
            result = await session.call_tool(
                "run_prompt",
                {"prompt": "Use Python to compute 6 * 7 and print it.", "max_iterations": 2},
                read_timeout_seconds=600,
            )
            return listed, result

    listed, result = run(body)
    tool = next(tool for tool in listed.tools if tool.name == "run_prompt")
    assert tool.input_schema["required"] == ["prompt"]
    assert effective_hints(annotations_of(tool)) == HINTS["run_prompt"]
    # An object, which is all it says: the answer's fields are the result's.
    assert tool.output_schema == {"type": "object"}
    assert not result.is_error, result
    output = result.structured_content
    assert output["tokens"] > 0, output
    assert 1 <= len(output["iterations"]) <= 2, output
    for iteration in output["iterations"]:
        assert set(iteration) == {"code", "language", "stdout", "stderr", "exit_code"}, iteration
        assert iteration["language"] in ("python", "bash") and iteration["code"], iteration
    text = "".join(block.text for block in result.content if isinstance(block, types.TextContent))
    if output["answer"] is not None:
        assert text == output["answer"]
    else:
        assert text.startswith("(no answer"), text


def test_run_prompt_as_an_mcp_task_completes_with_the_loops_result(llm_kernel):
    async def body():
        async with tasks_session(llm_kernel) as dispatcher:
            handle = await call(
                dispatcher, "tools/call",
                {"name": "run_prompt",
                 "arguments": {"prompt": "Print 2 + 2 with Python.", "max_iterations": 1}},
            )
            done = await task_until(
                dispatcher, handle["taskId"], lambda task: task["status"] != "working",
                seconds=600,
            )
            return handle, done

    handle, done = run(body)
    assert handle["resultType"] == "task", handle
    assert done["status"] == "completed", done
    output = done["result"]["structuredContent"]
    assert output["tokens"] > 0 and len(output["iterations"]) <= 1, output
    assert kernel_task(llm_kernel, handle["taskId"])["kind"] == "prompt"
