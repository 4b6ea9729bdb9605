"""Traces against a real agentosd: spans reach an OTLP/HTTP receiver (the
tests' own, decoding with PyPI's opentelemetry-proto) named and
attributed by the OpenTelemetry GenAI conventions, joining the trace a
request names, and never carrying prompt or answer text unless asked."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

import pytest

from agentos import AgentOSClient
from agentos.protocol import Opcode
from conftest import REPO, binary, kernel_with, log_of, wait_state
from stub_model import StubModel

ANSWER = "the answer is four"
PROMPT = "what is two and two, secretly"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Receiver(StubModel):
    """An OTLP/HTTP trace receiver and an OpenAI-compatible model, on
    loopback."""

    def __init__(self) -> None:
        self.spans: list = []
        super().__init__([ANSWER])

    def answer(self, path: str, headers, body: bytes) -> bytes:
        if path != "/v1/traces":
            return super().answer(path, headers, body)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        assert headers["Content-Type"] == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        return b""

    def wait_for(self, count: int, timeout: float = 10) -> list:
        deadline = time.monotonic() + timeout
        while len(self.spans) < count:
            assert time.monotonic() < deadline, f"{len(self.spans)} spans of {count}"
            time.sleep(0.05)
        return self.spans


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


def attributes(span) -> dict:
    values = {}
    for pair in span.attributes:
        kind = pair.value.WhichOneof("value")
        value = getattr(pair.value, kind)
        if kind == "array_value":
            value = [v.string_value for v in value.values]
        values[pair.key] = value
    return values


def config(receiver: Receiver, record_content: bool = False) -> str:
    return (f'[llm]\nprovider = "openai"\nbase_url = "{receiver.url}/v1"\n'
            f'api_key = "sk-test"\nmodel = "stub-model"\n'
            f'[tracing]\notlp_endpoint = "{receiver.url}"\n'
            f'record_content = {"true" if record_content else "false"}\n')


@contextlib.contextmanager
def echo_kernel(receiver: Receiver) -> Iterator[AgentOSClient]:
    """A kernel tracing to `receiver` with the echo MCP server ready (its
    tool answers with the traceparent its request carried)."""
    server = REPO / "tests" / "mcp_trace_echo.py"
    extra = (f'[mcp.servers.echo]\ncommand = "{sys.executable}"\nargs = ["{server}"]\n')
    with kernel_with(config(receiver) + extra) as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        deadline = time.monotonic() + 30
        while not any(s["name"] == "echo" and s["state"] == "ready"
                      for s in client.hello()["tool_servers"]):
            assert time.monotonic() < deadline, client.hello()["tool_servers"]
            time.sleep(0.1)
        yield client


def test_a_think_is_a_chat_span_in_the_callers_trace_without_its_text(receiver):
    with kernel_with(config(receiver)) as kernel, AgentOSClient(kernel.socket_path) as client:
        reply = client.call_json(Opcode.THINK, {"prompt": PROMPT, "trace": PARENT})
        assert reply["content"] == ANSWER
        [span] = receiver.wait_for(1)
    assert span.name == "chat stub-model"
    assert span.kind == 3  # CLIENT
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == "00f067aa0ba902b7"
    found = attributes(span)
    assert found["gen_ai.operation.name"] == "chat"
    assert found["gen_ai.provider.name"] == "openai"
    assert found["gen_ai.request.model"] == "stub-model"
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (9, 4)
    assert found["gen_ai.response.finish_reasons"] == ["stop"]
    assert found["agentos.think.queue_ms"] >= 0
    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    text = str(span)
    assert ANSWER not in text and PROMPT not in text


def test_content_is_recorded_only_when_asked(receiver):
    with kernel_with(config(receiver, record_content=True)) as kernel, \
            AgentOSClient(kernel.socket_path) as client:
        client.call_json(Opcode.THINK, {"prompt": PROMPT, "system": "be brief"})
        [span] = receiver.wait_for(1)
    found = attributes(span)
    # The conventions' JSON shapes: messages of parts.
    assert json.loads(found["gen_ai.output.messages"]) == [{
        "role": "assistant", "parts": [{"type": "text", "content": ANSWER}],
        "finish_reason": "stop"}]
    assert json.loads(found["gen_ai.input.messages"]) == [{
        "role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    assert json.loads(found["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "be brief"}]
    # Without a trace in the request the span starts one of its own.
    assert len(span.trace_id) == 16 and span.parent_span_id == b""


def test_a_tool_call_is_an_execute_tool_span_whose_context_reaches_the_server(receiver):
    with echo_kernel(receiver) as client:
        reply = client.call_json(Opcode.TOOL, {"op": "call", "server": "echo",
                                               "tool": "traceparent", "trace": PARENT})
        spans = receiver.wait_for(2)
    seen = reply["content"][0]["text"]
    by_name = {span.name: span for span in spans}
    span, mcp = by_name["execute_tool traceparent"], by_name["tools/call traceparent"]
    assert span.trace_id.hex() == mcp.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == "00f067aa0ba902b7"
    found = attributes(span)
    assert found["gen_ai.operation.name"] == "execute_tool"
    assert found["gen_ai.tool.name"] == "traceparent"
    # The MCP request is a client span of its own within the call.
    assert mcp.parent_span_id == span.span_id
    request = attributes(mcp)
    assert request["mcp.method.name"] == "tools/call"
    assert request["gen_ai.tool.name"] == "traceparent"
    assert request["network.transport"] == "pipe"
    assert int(request["jsonrpc.request.id"]) >= 0
    # The server's request carried the MCP span as its parent.
    assert seen == f"00-{TRACE_ID}-{mcp.span_id.hex()}-01", seen


def test_a_runs_tool_calls_join_its_span_through_traceparent(receiver):
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    with echo_kernel(receiver) as client:
        code = ("import os, tools\n"
                "print(os.environ['TRACEPARENT'])\n"
                "print(tools.echo.traceparent())\n")
        reply = client.call_json(Opcode.EXEC, {"code": code, "trace": PARENT})
        assert reply["success"], reply
        spans = receiver.wait_for(3)
    by_name = {span.name: span for span in spans}
    run, tool = by_name["exec python"], by_name["execute_tool traceparent"]
    mcp = by_name["tools/call traceparent"]
    assert run.trace_id.hex() == tool.trace_id.hex() == TRACE_ID
    assert run.parent_span_id.hex() == "00f067aa0ba902b7"
    assert tool.parent_span_id == run.span_id
    assert mcp.parent_span_id == tool.span_id
    environment, seen = reply["stdout"].split()
    assert environment == f"00-{TRACE_ID}-{run.span_id.hex()}-01"
    assert seen == f"00-{TRACE_ID}-{mcp.span_id.hex()}-01"
    assert attributes(run)["process.exit.code"] == 0
    assert attributes(run)["agentos.exec.queue_ms"] >= 0


def test_a_prompt_tasks_spans_nest_task_think_exec_tool(receiver):
    """The issue's chain: a prompt task, its THINKs and its EXEC run, and the
    run's tool call to an MCP server, one trace with the right parents."""
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    fence = "`" * 3
    receiver.answers = [
        f"{fence}python\nimport tools\nprint(tools.echo.traceparent())\n{fence}",
        "It is done.",
    ]
    with echo_kernel(receiver) as client:
        dispatched = client.call_json(Opcode.TASK, {
            "op": "dispatch", "kind": "prompt", "trace": PARENT,
            "request": {"prompt": "print the traceparent the echo tool sees"}})
        done = client.call_json(Opcode.TASK, {"op": "wait", "task_id": dispatched["task_id"],
                                              "timeout_ms": 60000},
                                deadline_ms=70000)
        assert done["task"]["state"] == "completed", done
        spans = receiver.wait_for(6)
    names = sorted(span.name for span in spans)
    assert names == ["chat stub-model", "chat stub-model", "exec python",
                     "execute_tool traceparent", "task prompt",
                     "tools/call traceparent"], names
    by_name = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [task] = by_name["task prompt"]
    [run] = by_name["exec python"]
    [tool] = by_name["execute_tool traceparent"]
    [mcp] = by_name["tools/call traceparent"]
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
    assert task.parent_span_id.hex() == "00f067aa0ba902b7"
    for chat in by_name["chat stub-model"]:
        assert chat.parent_span_id == task.span_id
    assert run.parent_span_id == task.span_id
    assert tool.parent_span_id == run.span_id
    assert mcp.parent_span_id == tool.span_id


def test_spawn_is_a_create_agent_span_and_an_agents_think_names_it(receiver):
    directory = tempfile.mkdtemp(prefix="agentos-tracing-", dir="/var/tmp")
    os.chmod(directory, 0o755)
    script = os.path.join(directory, "thinker.py")
    with open(script, "w") as file:
        file.write(
            "from agentos import AgentOSClient\n"
            "with AgentOSClient() as kernel:\n"
            "    print(kernel.think('hello')['content'], flush=True)\n"
        )
    os.chmod(script, 0o644)
    try:
        with kernel_with(config(receiver)) as kernel, \
                AgentOSClient(kernel.socket_path) as client:
            spawned = client.spawn("thinker", script, python=sys.executable,
                                   permissions={"think": True})
            wait_state(client, spawned["id"], {"exited", "failed"}, timeout=60)
            assert log_of(kernel, "thinker", spawned["id"]).strip() == ANSWER
            spans = receiver.wait_for(2)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    by_name = {span.name: span for span in spans}
    create, chat = by_name["create_agent thinker"], by_name["chat stub-model"]
    for span in (create, chat):
        found = attributes(span)
        assert found["gen_ai.agent.id"] == str(spawned["id"]), found
        assert found["gen_ai.agent.name"] == "thinker", found
    assert attributes(create)["gen_ai.operation.name"] == "create_agent"
    assert create.status.code != 2  # not an error: the agent started


class McpStdio:
    """`agentos mcp` over stdio, spoken to as JSON-RPC lines, so a request's
    `params._meta` is exactly what the test puts there."""

    def __init__(self, socket_path: str) -> None:
        self.process = subprocess.Popen(
            [str(binary("agentos")), "--socket", socket_path, "mcp"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "test", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(json.loads(line))

    def _send(self, message: dict) -> None:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        deadline = time.monotonic() + 60
        while True:
            message = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def call_tool(self, name: str, arguments: dict, traceparent: str | None) -> dict:
        params: dict = {"name": name, "arguments": arguments}
        if traceparent is not None:
            params["_meta"] = {"traceparent": traceparent}
        return self.request("tools/call", params)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)


def test_an_mcp_tool_calls_traceparent_is_the_trace_its_run_joins(receiver):
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    # Uppercase hex: a traceparent a receiver must ignore.
    malformed = PARENT.upper()
    with kernel_with(config(receiver)) as kernel:
        mcp = McpStdio(kernel.socket_path)
        try:
            joined = mcp.call_tool("exec", {"code": "print(1)"}, PARENT)
            alone = mcp.call_tool("exec", {"code": "print(2)"}, malformed)
        finally:
            mcp.close()
        spans = receiver.wait_for(2)
    assert not joined.get("isError") and not alone.get("isError"), (joined, alone)
    assert joined["structuredContent"]["stdout"] == "1\n"
    assert alone["structuredContent"]["stdout"] == "2\n"
    assert [span.name for span in spans] == ["exec python", "exec python"]
    [run] = [span for span in spans if span.trace_id.hex() == TRACE_ID]
    [other] = [span for span in spans if span is not run]
    assert run.parent_span_id.hex() == "00f067aa0ba902b7"
    # The malformed one was dropped, not passed on: the run began a trace.
    assert other.parent_span_id == b"" and len(other.trace_id) == 16


def test_an_mcp_think_and_run_prompt_join_the_callers_trace(receiver):
    think_parent = f"00-{TRACE_ID}-1111111111111111-01"
    prompt_parent = f"00-{TRACE_ID}-2222222222222222-01"
    with kernel_with(config(receiver)) as kernel:
        mcp = McpStdio(kernel.socket_path)
        try:
            thought = mcp.call_tool("think", {"prompt": PROMPT}, think_parent)
            # The model answers without code, so the loop ends at once.
            prompted = mcp.call_tool("run_prompt", {"prompt": PROMPT}, prompt_parent)
        finally:
            mcp.close()
        spans = receiver.wait_for(3)
    assert not thought.get("isError") and not prompted.get("isError"), (thought, prompted)
    assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
    by_parent = {span.parent_span_id.hex(): span for span in spans}
    assert by_parent["1111111111111111"].name == "chat stub-model"
    task = by_parent["2222222222222222"]
    assert task.name == "task prompt"
    assert by_parent[task.span_id.hex()].name == "chat stub-model"


def test_each_run_of_a_session_sees_its_own_traceparent_in_python_and_bash(receiver):
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    show = "import os; print(os.environ.get('TRACEPARENT', 'none'))"
    runs = [("python", show, PARENT), ("bash", 'echo "${TRACEPARENT:-none}"', PARENT),
            ("python", show, PARENT), ("python", show, None)]
    with kernel_with(config(receiver)) as kernel, AgentOSClient(kernel.socket_path) as client:
        seen = []
        for language, code, trace in runs:
            request = {"code": code, "language": language, "session": "traced"}
            if trace:
                request["trace"] = trace
            reply = client.call_json(Opcode.EXEC, request)
            assert reply["success"], reply
            seen.append(reply["stdout"].strip())
        spans = receiver.wait_for(4)
    # Each run sees its own span, set for it alone: the last, without a
    # trace of the caller's, is in a trace of its own.
    expected = [f"00-{span.trace_id.hex()}-{span.span_id.hex()}-01" for span in spans]
    assert seen == expected, (seen, expected)
    assert [span.trace_id.hex() == TRACE_ID for span in spans] == [True, True, True, False]


def test_a_hostile_trace_field_is_ignored_not_trusted(receiver):
    """What LLM-written code in a run might send as `trace`: garbage, a huge
    string, all-zero ids, the wrong type. Each is ignored (the span starts a
    trace of its own) or refused as a bad field; none fails the kernel."""
    if os.geteuid() != 0:
        print("!!! NOT TESTED: EXEC needs namespaces, so root (CI runs as root)")
        return
    bad = ["not a traceparent", "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
           "00-" + "a" * 32 + "-" + "b" * 16 + "-01" + "x" * 200_000]
    with kernel_with(config(receiver)) as kernel, AgentOSClient(kernel.socket_path) as client:
        for trace in bad:
            reply = client.call_json(Opcode.EXEC, {"code": "print(1)", "trace": trace})
            assert reply["success"], reply
        with pytest.raises(Exception) as wrong_type:
            client.call_json(Opcode.EXEC, {"code": "print(1)", "trace": 7})
        assert "trace" in str(wrong_type.value)
        spans = receiver.wait_for(len(bad))
    assert all(span.parent_span_id == b"" for span in spans[:len(bad)])
    assert TRACE_ID not in {span.trace_id.hex() for span in spans}
