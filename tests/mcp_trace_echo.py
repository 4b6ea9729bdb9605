"""An MCP server (stdio, protocol 2025-11-25) for the tracing tests: its
one tool, `traceparent`, answers with the `_meta.traceparent` its
`tools/call` request carried ("none" without one)."""

import json
import sys

TOOL = {
    "name": "traceparent",
    "description": "Answers with the traceparent of the request.",
    "inputSchema": {"type": "object", "properties": {}},
}


def answer(request_id, result=None, error=None):
    message = {"jsonrpc": "2.0", "id": request_id}
    if error is None:
        message["result"] = result
    else:
        message["error"] = error
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    method, request_id = request.get("method"), request.get("id")
    if request_id is None:
        continue  # a notification
    if method == "initialize":
        answer(request_id, {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "trace-echo", "version": "1"},
        })
    elif method == "tools/list":
        answer(request_id, {"tools": [TOOL]})
    elif method == "tools/call":
        meta = request.get("params", {}).get("_meta") or {}
        text = meta.get("traceparent", "none")
        answer(request_id, {"content": [{"type": "text", "text": text}]})
    elif method == "ping":
        answer(request_id, {})
    else:
        answer(request_id, error={"code": -32601, "message": f"no method {method}"})
