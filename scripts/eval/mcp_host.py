"""The MCP part of the local-model evaluation: a plain MCP host — the PyPI
`mcp` client driving `agentos mcp` over stdio, with the kernel's local
model as its LLM — given fixed tasks. The host tells the model the
server's instructions and its tools (name, arguments, description, as any
host shows them), runs each tool call the model asks for, and hands back
the result, until the model answers. So it measures what the MCP face
teaches a model, not what the kernel's own prompt loop does."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentos import AgentOSClient

# Model turns a task may take: tool calls, then the answer.
MAX_TURNS = 6
# Characters of a tool's result the model is shown.
RESULT_CHARS = 3000

HOST_SYSTEM = (
    "You answer the user's task using the tools of an MCP server.\n"
    "To call a tool, reply with only a JSON object: "
    '{"name": "TOOL", "arguments": {...}}. You then get its result.\n'
    "When you know the answer, reply with the answer alone, without JSON."
)


def tool_line(tool: types.Tool) -> str:
    schema = tool.input_schema or {}
    required = set(schema.get("required") or [])
    arguments = ", ".join(name if name in required else f"{name}?"
                          for name in (schema.get("properties") or {}))
    summary = (tool.description or "").strip()
    return f"- {tool.name}({arguments}): {summary}"


def system_text(instructions: str | None, tools: list[types.Tool]) -> str:
    parts = [HOST_SYSTEM]
    if instructions:
        parts.append(f"The server says:\n{instructions}")
    parts.append("Tools:\n" + "\n".join(tool_line(tool) for tool in tools))
    return "\n\n".join(parts)


def tool_call_in(reply: str) -> dict | None:
    """The tool call a reply asks for: its first JSON object with a `name`
    (in a fence, in <tool_call> tags, or bare), else None."""
    for match in re.finditer(r"\{", reply):
        try:
            value, _ = json.JSONDecoder().raw_decode(reply[match.start():])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            arguments = value.get("arguments") or value.get("parameters") or {}
            return {"name": value["name"], "arguments": arguments if isinstance(arguments, dict) else {}}
    return None


def result_text(result: types.CallToolResult) -> str:
    text = "".join(block.text for block in result.content if isinstance(block, types.TextContent))
    if result.structured_content is not None and not text:
        text = json.dumps(result.structured_content)
    prefix = "The tool failed: " if result.is_error else ""
    return prefix + text[:RESULT_CHARS]


async def solve(session: ClientSession, think: AgentOSClient, system: str, prompt: str) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    calls = []
    for _ in range(MAX_TURNS):
        thought = await asyncio.to_thread(think.think, messages=messages)
        reply = thought["content"]
        messages.append({"role": "assistant", "content": reply})
        call = tool_call_in(reply)
        if call is None:
            return {"answer": reply.strip(), "calls": calls}
        try:
            result = await session.call_tool(call["name"], call["arguments"])
            text = result_text(result)
        except Exception as err:  # a refused call is the model's to read
            text = f"The call failed: {err}"
        calls.append({**call, "result": text[:500]})
        messages.append({"role": "user", "content": f"Result of {call['name']}:\n{text}"})
    return {"answer": "", "calls": calls, "error": f"no answer in {MAX_TURNS} turns"}


async def run_all(agentos: Path, socket: Path, tasks: list) -> list[dict]:
    server = StdioServerParameters(command=str(agentos), args=["--socket", str(socket), "mcp"])
    outcomes = []
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=300) as session:
            initialized = await session.initialize()
            tools = (await session.list_tools()).tools
            system = system_text(initialized.instructions, tools)
            with AgentOSClient(str(socket)) as think:
                for task in tasks:
                    started = time.monotonic()
                    try:
                        done = await solve(session, think, system, task.prompt)
                    except Exception as err:  # one task's failure is its own
                        done = {"answer": "", "calls": [], "error": repr(err)}
                    took = time.monotonic() - started
                    result = {"iterations": [{"stdout": c["result"]} for c in done["calls"]],
                              "tool_calls": len(done["calls"])}
                    passed = task.check(done["answer"], result)
                    outcomes.append({"task": task.name, "kind": "mcp", "passed": passed,
                                     "seconds": round(took, 1),
                                     "answer": done["answer"], "calls": done["calls"],
                                     "error": done.get("error"), "system_bytes": len(system)})
    return outcomes


def run_tasks(agentos: Path, socket: Path, tasks: list) -> list[dict]:
    return asyncio.run(run_all(agentos, socket, tasks))
