"""Each error code the kernel sends is raised as a class of its own.

A fake kernel answers with each code, so codes no live kernel gives on
demand (``internal``, ``busy``, ``bad_magic``) are covered too; the end-to-end
suite provokes the rest from a real agentosd.
"""

from __future__ import annotations

import socket

import pytest
from fake_kernel import fake_kernel, socket_dir  # noqa: F401  (fixtures)

import agentos
from agentos import (
    AgentOSClient,
    AgentOSConnectionError,
    AgentOSError,
    Opcode,
    ProtocolError,
    Timeout,
)

# Every code of the protocol's error table, with the class raised for it.
CODES = {
    "bad_request": agentos.BadRequest,
    "unknown_opcode": agentos.UnknownOpcode,
    "not_found": agentos.NotFound,
    "already_exists": agentos.AlreadyExists,
    "permission_denied": agentos.PermissionDenied,
    "limit_exceeded": agentos.LimitExceeded,
    "busy": agentos.Busy,
    "timeout": agentos.Timeout,
    "unavailable": agentos.Unavailable,
    "internal": agentos.InternalError,
    "tool_error": agentos.ToolError,
    "cancelled": agentos.Cancelled,
    "interrupted": agentos.Interrupted,
    "bad_magic": agentos.BadMagic,
    "payload_too_large": agentos.PayloadTooLarge,
}


@pytest.mark.parametrize("code", sorted(CODES))
def test_each_code_raises_its_own_class_with_code_and_message(fake_kernel, code):
    message = f"the kernel says {code}"
    fake = fake_kernel([{"success": False, "code": code, "error": message}])
    with AgentOSClient(fake.path, timeout=5) as client:
        with pytest.raises(AgentOSError) as raised:
            client.call_json(Opcode.TOOL, {"op": "list"})
    assert type(raised.value) is CODES[code]
    assert raised.value.code == code
    assert raised.value.message == message
    assert str(raised.value) == f"{message} ({code})"


def test_every_class_is_exported_and_none_is_left_out():
    assert set(agentos.errors.ERRORS_BY_CODE) == set(CODES)
    for cls in CODES.values():
        assert getattr(agentos, cls.__name__) is cls
        assert issubclass(cls, AgentOSError)


def test_a_code_from_a_newer_kernel_raises_the_base_class_with_that_code(fake_kernel):
    fake = fake_kernel([{"success": False, "code": "quota_moved", "error": "elsewhere"}])
    with AgentOSClient(fake.path, timeout=5) as client:
        with pytest.raises(AgentOSError) as raised:
            client.hello()
    assert type(raised.value) is AgentOSError
    assert (raised.value.code, raised.value.message) == ("quota_moved", "elsewhere")


def test_timeouts_are_also_timeout_errors():
    err = agentos.error_for("timeout", "too slow")
    assert isinstance(err, TimeoutError) and isinstance(err, AgentOSError)
    with pytest.raises(TimeoutError):
        raise err


def test_the_clients_own_timeout_is_a_timeout_error(fake_kernel):
    fake = fake_kernel([("delay", 1.0, {"success": True, "tools": [], "servers": []})])
    with AgentOSClient(fake.path, timeout=0.2) as client:
        with pytest.raises(TimeoutError) as raised:
            client.tools()
        assert isinstance(raised.value, Timeout) and raised.value.code == "timeout"
        assert "0.2s" in raised.value.message
        assert not client.connected  # a late reply must not answer the next request


def test_connection_failures_are_also_connection_errors(socket_dir):
    client = AgentOSClient(socket_dir / "nothing-here.sock", timeout=1)
    with pytest.raises(ConnectionError) as raised:
        client.hello()
    assert isinstance(raised.value, AgentOSConnectionError)
    assert raised.value.code == "connection"
    assert "Is agentosd running?" in raised.value.message


def test_a_connection_closed_mid_reply_is_a_connection_error(socket_dir):
    path = str(socket_dir / "closing.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    with AgentOSClient(path, timeout=5) as client:
        conn, _ = server.accept()
        conn.close()
        with pytest.raises(ConnectionError):
            client.hello()
    server.close()


def test_a_reply_that_breaks_the_protocol_is_a_protocol_error():
    decode = agentos.connection.decode_json
    with pytest.raises(ProtocolError, match="not JSON"):
        decode(agentos.Reply(0, Opcode.HELLO, b"{nope"), Opcode.HELLO)
    with pytest.raises(ProtocolError, match="answers 0xFE"):
        decode(agentos.Reply(0, Opcode.LIST, b"[]"), Opcode.HELLO)
    # The kernel's parting error comes under EXIT; it is raised for its code.
    parting = b'{"success":false,"code":"bad_magic","error":"bad magic"}'
    assert decode(agentos.Reply(0, Opcode.EXIT, parting), Opcode.HELLO)["code"] == "bad_magic"
