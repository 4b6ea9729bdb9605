"""Sessions through any node's MCP face: a tool call whose session names
its node (NAME@NODE) is forwarded by `agentos mcp --http` to that node's
face, proven by the fleet's secret, and served there as session NAME. A
forward that cannot prove itself is refused, and a proven one is never
forwarded again. Each node and its face run in a network namespace of
their own; the test reaches the faces over the harness's bridge."""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import shutil
import tempfile
from pathlib import Path

from fleet_harness import fleet, impostor, signed, status_of
from mcp_http import mcp_http_server, rpc_reply

MCP_PORT = 8765
ACCEPT = "application/json, text/event-stream"


@contextlib.contextmanager
def mcp_faces(nodes, fleet_secret: str, token: str):
    """An MCP face on each node, in its host, on MCP_PORT of its address,
    sharing the token and the fleet's secret; yields their URLs."""
    workdir = Path(tempfile.mkdtemp(prefix="agentos-mcp-fleet-"))
    try:
        token_file = workdir / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        secret_file = workdir / "fleet-secret"
        secret_file.write_text(fleet_secret)
        secret_file.chmod(0o600)
        with contextlib.ExitStack() as stack:
            servers = [
                stack.enter_context(mcp_http_server(
                    node.socket_path, f"{node.host.address}:{MCP_PORT}",
                    "--token-file", str(token_file), "--fleet-secret-file", str(secret_file),
                    wrap=node.host.wrap()))
                for node in nodes
            ]
            yield servers
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def message(tool: str, arguments: dict, request_id: int = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}}).encode()


def post(url: str, token: str, body: bytes, extra: dict | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": ACCEPT, "MCP-Protocol-Version": "2025-11-25", **(extra or {})}
    return status_of(url, headers, "POST", body)


def call(url: str, token: str, tool: str, arguments: dict) -> dict:
    """A tool call's structured result; fails on an error."""
    status, body = post(url, token, message(tool, arguments))
    assert status == 200, (status, body)
    reply = rpc_reply(body.encode())
    assert "result" in reply, reply
    assert not reply["result"].get("isError"), reply
    return reply["result"]["structuredContent"]


def subject(session: str, body: bytes) -> str:
    """What an MCP face's forward is signed for: the session, and the
    body's SHA-256."""
    return f"{session} sha256:{hashlib.sha256(body).hexdigest()}"


def sessions_at(url: str, token: str) -> list[str]:
    listed = call(url, token, "exec_session", {"op": "list"})
    return [session["session"] for session in listed["sessions"]]


def test_a_session_is_used_through_another_nodes_mcp_face_and_forged_forwards_are_refused():
    fleet_secret, token = secrets.token_hex(32), secrets.token_hex(32)
    with fleet() as f:
        n1, n2 = f.node("n1", mcp_port=MCP_PORT), f.node("n2", mcp_port=MCP_PORT)
        with mcp_faces([n1, n2], fleet_secret, token) as (face1, face2):
            url1, url2 = face1.url, face2.url
            # Made through n1's face, on n2: n2's session, not n1's.
            ran = call(url1, token, "exec", {"code": "x = 41\nprint('made')",
                                             "session": "s1@n2"})
            assert ran["stdout"] == "made\n", ran
            assert "s1" in sessions_at(url2, token)
            assert "s1" not in sessions_at(url1, token)
            # The same session, by its plain name on its node, by its full
            # name on either.
            for url, session in ((url2, "s1"), (url2, "s1@n2"), (url1, "s1@n2")):
                ran = call(url, token, "exec", {"code": "x += 1\nprint(x)", "session": session})
                assert ran["exit_code"] == 0, ran
            assert call(url1, token, "exec", {"code": "print(x)", "session": "s1@n2"})[
                "stdout"] == "44\n"
            # A task naming it, dispatched through n1, runs on n2 by it.
            dispatched = call(url1, token, "task_dispatch",
                              {"code": "print(x * 2)", "session": "s1@n2"})
            waited = call(url1, token, "task_wait",
                          {"task_id": dispatched["task_id"], "timeout_ms": 60000})
            assert waited["task"]["state"] == "completed", waited
            assert waited["task"]["result"]["stdout"] == "88\n", waited
            # A node the fleet does not have is the client's mistake.
            status, body = post(url1, token, message("exec", {"code": "1", "session": "s1@n9"}))
            error = rpc_reply(body.encode())["error"]
            assert status == 200 and error["code"] == -32602, (status, body)
            assert "n9" in error["message"], error

            target = "/mcp"
            body = message("exec", {"code": "print(x)", "session": "s1@n2"})
            # Forged forwards: no proof, another secret, signed for another
            # session, signed for another node.
            about = subject("s1@n2", body)
            unproven = {"X-AgentOS-Forwarded-By": "n1"}
            stranger = signed(secrets.token_hex(32), "n1", "n2", "POST", target, about, "mcp")
            elsewhere = signed(fleet_secret, "n1", "n2", "POST", target,
                               subject("s2@n2", body), "mcp")
            other_body = signed(fleet_secret, "n1", "n2", "POST", target,
                                subject("s1@n2", body + b" "), "mcp")
            for_n3 = signed(fleet_secret, "n1", "n3", "POST", target, about, "mcp")
            # Signed as the E2B face would sign it: no MCP face's forward.
            by_e2b = signed(fleet_secret, "n1", "n2", "POST", target, about, "e2b")
            for forged in (unproven, stranger, elsewhere, other_body, for_n3, by_e2b):
                status, said = post(url2, token, body, forged)
                assert status == 403 and "not proven" in said, (forged, status, said)
            # A greeting that proves nothing is refused, token or not; so
            # is one signed as an E2B face's, which an MCP face does not
            # answer for. One of an MCP face is answered with the proof.
            nonce = "/.agentos/fleet-greeting?nonce=00"
            greeting = url2.replace("/mcp", nonce)
            assert status_of(greeting, {})[0] == 403
            as_e2b = signed(fleet_secret, "n1", "n2", "GET", nonce, "", "e2b")
            assert status_of(greeting, as_e2b)[0] == 403
            as_mcp = signed(fleet_secret, "n1", "n2", "GET", nonce, "", "mcp")
            assert status_of(greeting, as_mcp)[0] == 204
            # A proven forward is served where it lands, with the proof
            # of who answered; one for another node's session is refused
            # there, never sent on.
            proven = signed(fleet_secret, "n1", "n2", "POST", target, about, "mcp")
            status, said = post(url2, token, body, proven)
            assert status == 200 and rpc_reply(said.encode())["result"]["structuredContent"][
                "stdout"] == "44\n", (status, said)
            to_n1 = signed(fleet_secret, "n2", "n1", "POST", target, about, "mcp")
            status, said = post(url1, token, body, to_n1)
            assert status == 404 and "never sent on" in said, (status, said)
            # The token is still checked where the forward lands.
            status, _ = post(url2, "0" * 64, body, proven)
            assert status == 401

            # Something else listening at n2's face's address (the face
            # stopped) is greeted, cannot prove it is n2's face, and is sent
            # nothing of the client's.
            face2.process.terminate()
            face2.process.wait(timeout=20)
            with impostor(n2, MCP_PORT) as seen:
                status, said = post(url1, token, body)
                assert status == 502 and "cannot be reached" in said, (status, said)
                assert n2.host.address not in said, said
            assert seen, "the impostor was not asked at all"
            assert all(path.startswith("/.agentos/fleet-greeting?nonce=") for path, _ in seen), seen
            assert not any(token in headers for _, headers in seen), "the token reached it"


def test_a_face_without_the_fleets_secret_refuses_forward_claims():
    token = secrets.token_hex(32)
    with fleet() as f:
        n1 = f.node("n1", mcp_port=MCP_PORT)
        workdir = Path(tempfile.mkdtemp(prefix="agentos-mcp-fleet-"))
        try:
            token_file = workdir / "token"
            token_file.write_text(token)
            token_file.chmod(0o600)
            with mcp_http_server(n1.socket_path, f"{n1.host.address}:{MCP_PORT}",
                                 "--token-file", str(token_file),
                                 wrap=n1.host.wrap()) as face:
                assert any("forwards nothing" in line for line in face.stderr), face.stderr
                body = message("exec", {"code": "print(1)", "session": "s1@n1"})
                claim = signed(secrets.token_hex(32), "n2", "n1", "POST", "/mcp",
                               subject("s1@n1", body), "mcp")
                status, said = post(face.url, token, body, claim)
                assert status == 403 and "no fleet secret" in said, (status, said)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
