"""Sandboxes through any node: a sandbox's id names the node that holds
it, and the E2B face of any node forwards a request for another node's
sandbox to that node's face, proven by the fleet's secret. A forward that
cannot prove itself is refused, and a proven one is never forwarded
again. Each node and its face run in a network namespace of their own;
the test reaches the faces over the harness's bridge."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from e2b_face import sdk_at, stop
from fleet_harness import fleet, impostor, signed, status_of

FACE_PORT = 3000


def tag_of(node: str) -> str:
    """The node's tag, as the face makes it: six base-36 digits of the
    first eight bytes of its name's SHA-256."""
    number = int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")
    digits = "abcdefghijklmnopqrstuvwxyz0123456789"
    tag = ""
    for _ in range(6):
        tag += digits[number % 36]
        number //= 36
    return tag


@contextlib.contextmanager
def faces(nodes, fleet_secret: str):
    """An E2B face on each node, in its host, on FACE_PORT of its address,
    sharing one keys file and the fleet's secret; the key "alice"."""
    from e2b_face import add_key, start_face, stop

    workdir = Path(tempfile.mkdtemp(prefix="agentos-e2b-"))
    processes = []
    try:
        keys_file = workdir / "keys"
        key = add_key(keys_file, "alice")
        secret_file = workdir / "fleet-secret"
        secret_file.write_text(fleet_secret)
        secret_file.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if k != "AGENTOS_E2B_API_KEY"}
        env["HOME"] = str(workdir)
        env.pop("XDG_CONFIG_HOME", None)
        urls = []
        for node in nodes:
            envd_secret = workdir / f"envd-{node.name}"
            envd_secret.write_text(secrets.token_hex(32))
            envd_secret.chmod(0o600)
            args = ["--socket", node.socket_path, "e2b",
                    "--listen", f"{node.host.address}:{FACE_PORT}",
                    "--keys-file", str(keys_file), "--secret-file", str(envd_secret),
                    "--fleet-secret-file", str(secret_file)]
            process, lines, url = start_face(args, env, wrap=node.host.wrap())
            processes.append(process)
            assert url, f"the face of {node.name} did not start: {lines}"
            urls.append(url)
        yield urls, key, processes
    finally:
        for process in processes:
            stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_sandbox_is_used_through_another_nodes_face_and_forged_forwards_are_refused():
    import e2b

    fleet_secret = secrets.token_hex(32)
    with fleet() as f:
        n1, n2 = f.node("n1", face_port=FACE_PORT), f.node("n2", face_port=FACE_PORT)
        with faces([n1, n2], fleet_secret) as ((url1, url2), key, processes):
            with sdk_at(url1):
                sandbox = e2b.Sandbox.create(api_key=key, timeout=300)
            sandbox_id = sandbox.sandbox_id
            try:
                print("sandbox", sandbox_id, "made through", url1)
                assert sandbox_id.endswith(tag_of("n1")), sandbox_id
                # Through n2's face: its record, its commands and its files,
                # all n1's sandbox.
                with sdk_at(url2):
                    assert e2b.Sandbox.get_info(sandbox_id, api_key=key).state == "running"
                    there = e2b.Sandbox.connect(sandbox_id, api_key=key)
                    ran = there.commands.run("echo $((6 * 7)) > /tmp/answer; hostname")
                    assert ran.exit_code == 0, ran
                    there.files.write("/home/user/note.txt", "written through n2")
                with sdk_at(url1):
                    here = e2b.Sandbox.connect(sandbox_id, api_key=key)
                    assert here.files.read("/home/user/note.txt") == "written through n2"
                    assert here.commands.run("cat /tmp/answer").stdout == "42\n"

                target = f"/sandboxes/{sandbox_id}"
                api = {"X-API-KEY": key}
                # A forward with no proof, one signed with another secret,
                # and one signed for another sandbox: refused.
                unproven = {"X-AgentOS-Forwarded-By": "n2"}
                stranger = signed(secrets.token_hex(32), "n2", "n1", "GET", target, sandbox_id)
                elsewhere = signed(fleet_secret, "n2", "n1", "GET", target, "a" * 26)
                for_n3 = signed(fleet_secret, "n2", "n3", "GET", target, sandbox_id)
                for forged in (unproven, stranger, elsewhere, for_n3):
                    status, body = status_of(url1 + target, {**api, **forged})
                    assert status == 403, (status, body)
                    assert "not proven" in json.loads(body)["message"], body
                # A proven forward is answered where it lands: n2 does not
                # hold the sandbox and never forwards it again.
                to_n2 = signed(fleet_secret, "n1", "n2", "GET", target, sandbox_id)
                status, body = status_of(url2 + target, {**api, **to_n2})
                assert status == 404, (status, body)
                to_n1 = signed(fleet_secret, "n2", "n1", "GET", target, sandbox_id)
                assert status_of(url1 + target, {**api, **to_n1})[0] == 200
                # Another key's request is refused by the holding node, as
                # on one node, even when it comes through another.
                status, _ = status_of(url2 + target, {"X-API-KEY": "e2b_" + "0" * 40})
                assert status == 401
            finally:
                with sdk_at(url2):
                    assert e2b.Sandbox.kill(sandbox_id, api_key=key)
            with sdk_at(url1):
                assert sandbox_id not in [s.sandbox_id for s in e2b.Sandbox.list(api_key=key).next_items()]

            # Something else listening at n1's address (its face stopped)
            # is greeted first, cannot prove it is n1's face, and is sent
            # nothing of the client's.
            stop(processes[0])
            with impostor(n1, FACE_PORT) as seen:
                status, body = status_of(url2 + f"/sandboxes/{sandbox_id}", {"X-API-KEY": key})
                assert status == 502, (status, body)
                assert "cannot be reached" in body and n1.host.address not in body, body
            assert seen, "the impostor was not asked at all"
            assert all(path.startswith("/.agentos/fleet-greeting?nonce=") for path, _ in seen), seen
            assert not any(key in headers for _, headers in seen), "the key reached it"
