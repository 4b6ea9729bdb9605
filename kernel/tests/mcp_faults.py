"""An MCP server (stdio) that misbehaves on purpose, for the kernel's tool
tests. The first argument picks how:

  exit     says why on stderr and exits at once
  hang     never answers `initialize`
  strict   exits at a request before `initialize` (`server/discover`), as
           servers of the earlier era built on old SDKs do
  garbage  prints lines that are not messages around every answer
  serve    behaves (the tools below do the damage when called)
  malformed  serves, and lists two more tools whose answers cannot be
           parsed: `nul` (a raw NUL byte inside a string) and `deep` (a
           result nested 200 levels deep, its id written last)

Its tools: `huge` (a 10 MB text), `never` (no answer, ever), `die` (exits
mid-call), `orphan` (exits mid-call, leaving a child that holds its
output), `fail` (isError), `env` (whether SECRET is in its environment),
`leak` and `leak_error` (SECRET in a result, and in an error), three whose
names are not Python identifiers (`get-sum`, `2fa`, `class`), `send` (an
argument named `from`), `odd` (a schema that is not one) and `deafen`
(it stops reading its input, for good).
Its listing comes in two pages. With `--leak` it prints its SECRET on
stderr at start (the kernel must not log it); with `--ignore-term` it
ignores SIGTERM and outlives its stdin.
"""

import json
import os
import signal
import subprocess
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "serve"
TOOLS = [
    {"name": "huge", "description": "Returns 10 MB of text."},
    {"name": "never", "description": "Never answers."},
    {"name": "die", "description": "Exits in the middle of the call."},
    {"name": "fail", "description": "Reports an error of its own."},
    {"name": "env", "description": "Says whether SECRET is in its environment."},
    {
        "name": "get-sum",
        "description": "Adds a and b.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
    {"name": "2fa", "description": "A name that starts with a digit."},
    {"name": "class", "description": "A name that is a Python keyword."},
    {"name": "orphan", "description": "Exits, leaving a child holding its output."},
    {"name": "deafen", "description": "Stops reading its input."},
    {"name": "leak", "description": "Returns its key."},
    {"name": "leak_error", "description": "Fails, naming its key."},
    {
        "name": "send",
        "description": "An argument named after a Python keyword.",
        "inputSchema": {
            "type": "object",
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
            "required": ["from"],
        },
    },
    {
        "name": "odd",
        "description": "A schema that is not one.",
        "inputSchema": {"type": "object", "properties": ["x"], "required": "x"},
    },
]
if MODE == "malformed":
    TOOLS += [
        {"name": "nul", "description": "Answers with a raw NUL byte inside a string."},
        {"name": "deep", "description": "Answers with a result nested 200 levels deep."},
    ]
for tool in TOOLS:
    tool.setdefault("inputSchema", {"type": "object", "properties": {}})


def send(message):
    if MODE == "garbage":
        sys.stdout.write("this is not json\n{\"broken\": \n")
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def send_line(line):
    """Writes `line` as it is: json.dumps would make it well formed."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def answer(request_id, result):
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def text(value, is_error=False):
    return {"content": [{"type": "text", "text": value}], "isError": is_error}


def call(request_id, name, arguments):
    if name == "huge":
        answer(request_id, text("x" * (10 << 20)))
    elif name == "never":
        pass
    elif name == "die":
        os._exit(9)
    elif name == "fail":
        answer(request_id, text("the disk is on fire", is_error=True))
    elif name == "env":
        answer(request_id, text(json.dumps({"has_secret": "SECRET" in os.environ})))
    elif name == "get-sum":
        answer(request_id, text(json.dumps(arguments.get("a", 0) + arguments.get("b", 0))))
    elif name in ("2fa", "class", "odd"):
        answer(request_id, text(f"{name} ran"))
    elif name == "deafen":
        while True:
            time.sleep(60)
    elif name == "orphan":
        subprocess.Popen(["sleep", "61.5"], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os._exit(9)
    elif name == "leak":
        answer(request_id, text(json.dumps({"key": os.environ.get("SECRET")})))
    elif name == "leak_error":
        answer(request_id, text(f"key {os.environ.get('SECRET')} refused", is_error=True))
    elif name == "send":
        answer(request_id, text(f"{arguments.get('from')}->{arguments.get('to')}"))
    elif name == "nul":
        send_line('{"jsonrpc": "2.0", "id": %s, "result": {"content": '
                  '[{"type": "text", "text": "a\x00b"}]}}' % json.dumps(request_id))
    elif name == "deep":
        # Like a JavaScript server, the id last: after what the parser gives up on.
        nested = "[" * 200 + "]" * 200
        send_line('{"jsonrpc": "2.0", "result": {"content": [], "structuredContent": '
                  '{"deep": %s}}, "id": %s}' % (nested, json.dumps(request_id)))
    else:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32602, "message": f"Unknown tool: {name}"}})


def main():
    if "--leak" in sys.argv:
        print(f"starting with key {os.environ.get('SECRET')}", file=sys.stderr, flush=True)
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if MODE == "exit":
        print("cannot start: no licence file", file=sys.stderr, flush=True)
        sys.exit(3)
    initialized = False
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if MODE == "strict" and method != "initialize" and not initialized:
            print(f"request {method} before initialization", file=sys.stderr, flush=True)
            sys.exit(1)
        initialized = initialized or method == "initialize"
        if method == "initialize":
            if MODE == "hang":
                continue
            answer(request_id, {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "faults", "version": "1"},
            })
        elif method == "tools/list":
            cursor = (message.get("params") or {}).get("cursor")
            if cursor is None:
                answer(request_id, {"tools": TOOLS[:4], "nextCursor": "page-2"})
            else:
                answer(request_id, {"tools": TOOLS[4:]})
        elif method == "tools/call":
            params = message.get("params") or {}
            call(request_id, params.get("name"), params.get("arguments") or {})
        else:
            send({"jsonrpc": "2.0", "id": request_id,
                  "error": {"code": -32601, "message": "Method not found"}})
    while "--ignore-term" in sys.argv:
        time.sleep(60)


main()
