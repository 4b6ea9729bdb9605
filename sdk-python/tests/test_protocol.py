"""Frame codec and socket-path rule, without a kernel."""

import struct

import pytest

from agentos import HEADER_LEN, MAGIC, Opcode, resolve_socket_path
from agentos.protocol import decode_header, encode_frame


def test_header_is_17_little_endian_bytes():
    frame = encode_frame(Opcode.HELLO, b"{}", agent_id=0x01020304)
    assert HEADER_LEN == 17
    assert frame[:4] == bytes([0x54, 0x4E, 0x47, 0x41])
    assert frame[4:8] == bytes([4, 3, 2, 1])
    assert frame[8] == 0xFE
    assert struct.unpack("<Q", frame[9:17]) == (2,)
    assert frame[17:] == b"{}"


def test_header_round_trips():
    for opcode in (0, 0x13, 0xFF):
        header = decode_header(encode_frame(opcode, b"x" * 300, agent_id=5))
        assert (header.agent_id, header.opcode, header.payload_len) == (5, opcode, 300)


def test_wrong_magic_is_refused():
    bad = struct.pack("<IIBQ", MAGIC ^ 1, 0, 0, 0)
    with pytest.raises(ValueError, match="bad magic"):
        decode_header(bad)


def test_opcodes_match_the_protocol_table():
    assert {op.name: op.value for op in Opcode} == {
        "NOOP": 0x00, "THINK": 0x01, "EXEC": 0x02, "READ": 0x03, "WRITE": 0x04, "TOOL": 0x05,
        "SPAWN": 0x10, "KILL": 0x11,
        "LIST": 0x12, "TASK": 0x13, "PAUSE": 0x14, "RESUME": 0x15, "LOGS": 0x16, "NET": 0x17,
        "METRICS": 0x18, "DELEGATE": 0x19, "FLEET": 0x1A, "SUBSCRIBE": 0x60, "UNSUBSCRIBE": 0x61, "POLL": 0x62, "EMIT": 0x63,
        "SEND": 0x20, "RECV": 0x21, "BROADCAST": 0x22, "REGISTER": 0x23,
        "STORE": 0x30, "FETCH": 0x31, "DELETE": 0x32, "KEYS": 0x33,
        "GET_PERMS": 0x40, "SET_PERMS": 0x41, "HTTP": 0x50, "RECORD_START": 0x70, "RECORD_STOP": 0x71,
        "RECORD_STATUS": 0x72, "REPLAY_START": 0x73, "REPLAY_STATUS": 0x74, "GET_AUDIT_LOG": 0x76,
        "SET_AUDIT_CONFIG": 0x77, "ASYNC_POLL": 0x80,
        "SYSTEM_METRICS": 0xC0,
        "AGENT_METRICS": 0xC1, "ALL_AGENT_METRICS": 0xC2, "CGROUP_METRICS": 0xC3,
        "HELLO": 0xFE, "EXIT": 0xFF,
    }


def test_socket_path_resolution_order():
    env = {"AGENTOS_SOCKET": "/env.sock", "XDG_RUNTIME_DIR": "/run/user/7"}
    assert resolve_socket_path("/x.sock", environ=env, euid=0) == "/x.sock"
    assert resolve_socket_path(None, environ=env, euid=0) == "/env.sock"
    assert resolve_socket_path(None, environ={}, euid=0) == "/run/agentos/agentos.sock"
    assert (
        resolve_socket_path(None, environ={"XDG_RUNTIME_DIR": "/run/user/7"}, euid=7)
        == "/run/user/7/agentos/agentos.sock"
    )
    assert resolve_socket_path(None, environ={"XDG_RUNTIME_DIR": "rel"}, euid=7) == (
        "/tmp/agentos-7/agentos.sock"
    )
    assert resolve_socket_path("", environ={}, euid=3) == "/tmp/agentos-3/agentos.sock"


def test_recv_never_opens_a_connection(tmp_path):
    from agentos import AgentOSClient, AgentOSConnectionError

    client = AgentOSClient(tmp_path / "none.sock")
    with pytest.raises(AgentOSConnectionError, match="not connected"):
        client.recv()


def test_an_inherited_kernel_connection_is_used_when_no_path_is_given(monkeypatch):
    """Code run by EXEC finds its own connection in AGENTOS_SOCKET_FD."""
    import os
    import socket
    import threading

    from agentos import AgentOSClient
    from agentos.protocol import HEADER_LEN, decode_header, encode_frame

    ours, theirs = socket.socketpair()

    def echo_one() -> None:
        header = decode_header(ours.recv(HEADER_LEN))
        payload = ours.recv(header.payload_len) if header.payload_len else b""
        ours.sendall(encode_frame(header.opcode, payload, agent_id=7))

    server = threading.Thread(target=echo_one)
    server.start()
    monkeypatch.setenv("AGENTOS_SOCKET_FD", str(theirs.fileno()))
    with AgentOSClient() as client:
        assert client.noop(b"hi") == b"hi"
        assert client.agent_id == 7
    server.join()
    ours.close()
    theirs.close()
