"""The Python SDK against a real agentosd."""

from __future__ import annotations

import threading
import time

import pytest

from agentos import AgentOSClient, AgentOSConnectionError, AgentOSError, Opcode


def test_echo_hello(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        assert client.echo("Hello!") == "Hello!"


def test_echo_round_trips_unicode_and_binary(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        assert client.echo("héllo — 世界 🚀") == "héllo — 世界 🚀"
        blob = bytes(range(256)) * 64
        assert client.noop(blob) == blob
        assert client.noop(b"") == b""


def test_socket_path_comes_from_the_environment(kernel, monkeypatch):
    monkeypatch.setenv("AGENTOS_SOCKET", kernel.socket_path)
    with AgentOSClient() as client:
        assert client.socket_path == kernel.socket_path
        assert client.echo("env") == "env"


def test_hello_reports_version_identity_and_features(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        hello = client.hello()
    assert "success" not in hello
    assert hello["protocol_version"] == 1
    assert hello["agent_id"] >= 1_000_000
    assert client.agent_id == hello["agent_id"]
    assert hello["features"]["spawn"] is True
    assert hello["features"]["think"] is False


def test_list_agents_is_a_list(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        assert client.list_agents() == []


def test_call_returns_agent_id_opcode_and_raw_payload(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        agent_id, opcode, payload = client.call(Opcode.NOOP, b"raw")
        assert (opcode, payload) == (Opcode.NOOP, b"raw")
        assert agent_id >= 1_000_000
        # dict payloads are sent as JSON
        _, opcode, payload = client.call(Opcode.HELLO, {})
        assert opcode == Opcode.HELLO and b'"success":true' in payload


def test_errors_raise_with_their_code_and_keep_the_connection(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(AgentOSError) as unknown:
            client.call_json(0x42, b"")
        assert unknown.value.code == "unknown_opcode"
        with pytest.raises(AgentOSError) as bad:
            client.call_json(Opcode.SPAWN, {"name": 5})
        assert bad.value.code == "bad_request"
        assert "name" in bad.value.message
        with pytest.raises(AgentOSError) as unavailable:
            client.call_json(Opcode.THINK, "What is 2+2?")
        assert unavailable.value.code == "unavailable"
        assert client.echo("still usable") == "still usable"


def test_exit_says_goodbye_and_disconnects(kernel):
    client = AgentOSClient(kernel.socket_path).connect()
    client.exit()
    assert not client.connected
    # A later call reconnects.
    assert client.echo("again") == "again"
    client.disconnect()


def test_pipelined_requests_come_back_in_order(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        for i in range(200):
            client.send(Opcode.NOOP, f"n{i}")
        for i in range(200):
            assert client.recv().payload == f"n{i}".encode()


def test_a_client_is_safe_to_share_between_threads(kernel):
    errors = []
    with AgentOSClient(kernel.socket_path) as client:
        def worker(n: int) -> None:
            try:
                for i in range(100):
                    text = f"t{n}-{i}"
                    if client.echo(text) != text:
                        errors.append(text)
            except Exception as err:  # noqa: BLE001 - collected and asserted below
                errors.append(repr(err))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_connection_error_says_how_to_start_the_kernel(tmp_path):
    client = AgentOSClient(tmp_path / "nothing.sock")
    with pytest.raises(AgentOSConnectionError) as err:
        client.connect()
    message = str(err.value)
    assert "agentosd" in message
    assert str(tmp_path / "nothing.sock") in message


def test_kernel_going_away_is_a_connection_error(kernel):
    client = AgentOSClient(kernel.socket_path).connect()
    assert kernel.stop() == 0
    with pytest.raises(AgentOSConnectionError):
        client.echo("anyone?")


# -- shapes and waits ----------------------------------------------------------


def test_a_run_longer_than_the_client_timeout_is_not_cut_short(kernel):
    with AgentOSClient(kernel.socket_path, timeout=0.5) as client:
        started = time.monotonic()
        run = client.exec("import time; time.sleep(2); print('slept')", timeout_ms=20_000)
        assert run["ok"] and run["stdout"] == "slept\n"
        assert time.monotonic() - started >= 2
        task_id = client.dispatch("exec", {"code": "import time; time.sleep(2)"})
        assert client.wait_task(task_id)["state"] == "completed"
        assert client.connected


def test_wait_task_gives_up_at_its_own_timeout(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        task_id = client.dispatch("exec", {"code": "import time; time.sleep(60)"})
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            client.wait_task(task_id, timeout=1)
        assert 1 <= time.monotonic() - started < 5
        assert client.task_status(task_id)["state"] in ("queued", "running")
        client.cancel_task(task_id)


def test_as_completed_yields_tasks_as_they_end(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        naps = {client.dispatch("exec", {"code": f"import time; time.sleep({s})"}): s
                for s in (2.4, 0.2, 1.2)}
        order = [naps[t["task_id"]] for t in client.as_completed(naps, timeout=60)]
        assert order == [0.2, 1.2, 2.4]
        late = client.dispatch("exec", {"code": "import time; time.sleep(60)"})
        with pytest.raises(TimeoutError):
            list(client.as_completed([late], timeout=0.5))
        client.cancel_task(late)


def test_collected_files_come_back_as_bytes(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        run = client.exec("open('out.bin', 'wb').write(open('in.bin', 'rb').read()[::-1])",
                          files={"in.bin": b"\x00\x01\xfe\xff"}, collect=["out.bin"])
        assert run["files"] == {"out.bin": b"\xff\xfe\x01\x00"}
        task = client.wait_task(client.dispatch(
            "exec", {"code": "print(open('in.bin','rb').read())",
                     "files": {"in.bin": b"\x00raw"}}), timeout=60)
        assert task["result"]["stdout"] == "b'\\x00raw'\n"


def test_limits_as_sizes_and_cpus_reach_the_agent(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        agent = client.spawn("limited", command=["/bin/sleep", "30"],
                             limits={"memory": "96M", "cpus": 0.25, "max_pids": 8})
        entry = next(a for a in client.list_agents() if a["id"] == agent["id"])
    assert entry["limits"]["memory"] == 96 << 20
    assert (entry["limits"]["cpu_quota"], entry["limits"]["cpu_period"]) == (25_000, 100_000)
    assert entry["limits"]["max_pids"] == 8


def test_no_result_has_a_success_key(kernel):
    with AgentOSClient(kernel.socket_path) as client:
        agent = client.spawn("plain", command=["/bin/sleep", "30"])
        results = [client.hello(), agent, client.kill("plain"), client.exec("print(1)"),
                   *client.list_agents(), *client.list_tasks()]
    assert all("success" not in r for r in results), results
