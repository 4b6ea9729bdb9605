"""The Python SDK against a real agentosd."""

from __future__ import annotations

import threading

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
