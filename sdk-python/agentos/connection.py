"""One connection to the kernel's socket: frames out, frames in, errors raised.

:class:`Connection` knows the transport and nothing of what the opcodes
mean; :class:`~agentos.AgentOSClient` builds the syscalls on it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from types import TracebackType
from typing import Any, NamedTuple, Optional, Type, TypeVar, Union

from .errors import (
    AgentOSConnectionError,
    AgentOSError,
    PayloadTooLarge,
    ProtocolError,
    Timeout,
    error_for,
)
from .paths import PathLike, resolve_socket_path
from .protocol import HEADER_LEN, MAX_REPLY_BYTES, Opcode, decode_header, encode_frame

Payload = Union[bytes, bytearray, memoryview, str, dict, list, None]
_Self = TypeVar("_Self", bound="Connection")

#: How long, beyond a request's own deadline, the client waits for its
#: reply: the kernel may queue it (for a sandbox, for the model) before its
#: deadline starts, and still has to write the reply after it.
REPLY_MARGIN_S = 30.0


class Reply(NamedTuple):
    """One reply frame: the caller's identity, the opcode answered, the payload."""

    agent_id: int
    opcode: int
    payload: bytes


class Connection:
    """A connection to ``agentosd``, opened on first use or by :meth:`connect`.

    The socket path is resolved like every AgentOS client does (explicit
    argument, ``$AGENTOS_SOCKET``, the system socket as root, then the
    per-user runtime directory). Replies on one connection come back in
    request order. A connection is safe to share between threads: each call
    holds it for its whole request/reply exchange.
    """

    def __init__(
        self, socket_path: Optional[PathLike] = None, timeout: Optional[float] = 30.0
    ) -> None:
        """``timeout`` bounds each blocking socket operation, in seconds
        (``None`` waits forever). A request with a deadline of its own
        (EXEC's ``timeout_ms``, a task wait, a log follow) is given that
        deadline plus a margin instead, when that is longer."""
        self.socket_path: str = resolve_socket_path(socket_path)
        # Code run by EXEC inherits its own connection to the kernel: a run
        # of whoever started it, with what that EXEC request gave the run.
        inherited = os.environ.get("AGENTOS_SOCKET_FD") if socket_path is None else None
        self._inherited_fd: Optional[int] = int(inherited) if inherited else None
        self.timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._lock = threading.RLock()
        self._agent_id: Optional[int] = None

    @property
    def connected(self) -> bool:
        """Whether a connection is open."""
        return self._sock is not None

    @property
    def agent_id(self) -> Optional[int]:
        """The identity the kernel gave this connection (after a reply)."""
        return self._agent_id

    def connect(self: _Self) -> _Self:
        """Opens the connection (a no-op if already open). Returns ``self``."""
        with self._lock:
            if self._sock is not None:
                return self
            if self._inherited_fd is not None:
                sock = socket.socket(fileno=os.dup(self._inherited_fd))
                sock.settimeout(self.timeout)
                self._sock = sock
                return self
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.socket_path)
            except OSError as err:
                sock.close()
                raise AgentOSConnectionError(
                    f"cannot connect to the AgentOS kernel at {self.socket_path}: "
                    f"{err.strerror or err}. Is agentosd running? Start it with "
                    f"`sudo agentosd` (system socket) or "
                    f"`agentosd --socket {self.socket_path}`, or set AGENTOS_SOCKET "
                    f"to a running kernel's socket"
                ) from err
            self._sock = sock
            return self

    def disconnect(self) -> None:
        """Closes the connection (a no-op if not open)."""
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.close()
                finally:
                    self._sock = None

    close = disconnect

    def __enter__(self: _Self) -> _Self:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.disconnect()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"{type(self).__name__}({self.socket_path!r}, {state})"

    # -- frames -----------------------------------------------------------

    def send(self, opcode: int, payload: Payload = b"") -> None:
        """Sends one request without waiting for its reply (pipelining);
        collect replies, in order, with :meth:`recv`."""
        with self._lock:
            sock = self._socket()
            frame = encode_frame(int(opcode), _to_bytes(payload), self._agent_id or 0)
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError) as err:
                # The kernel may have refused this connection and closed it
                # before we wrote; its reason is then waiting to be read.
                refusal = self._read_refusal()
                if refusal is not None:
                    self.disconnect()
                    raise refusal from err
                raise self._broken(err, "sending", self.timeout) from err
            except OSError as err:
                raise self._broken(err, "sending", self.timeout) from err

    def recv(self, deadline_ms: Optional[int] = None) -> Reply:
        """Receives the next reply. Never connects: a reply can only come on
        the connection its request went out on. ``deadline_ms`` is the
        request's own deadline, which the wait is stretched to cover."""
        with self._lock:
            sock = self._sock
            if sock is None:
                raise AgentOSConnectionError(
                    "not connected: nothing to receive (an earlier failure closed the "
                    "connection, or no request was sent)"
                )
            wait = self.reply_wait(deadline_ms)
            sock.settimeout(wait)
            try:
                header_bytes = self._read_exact(sock, HEADER_LEN, wait)
                try:
                    header = decode_header(header_bytes)
                except ValueError as err:
                    self.disconnect()
                    raise ProtocolError(f"malformed reply from the kernel: {err}") from err
                if header.payload_len > MAX_REPLY_BYTES:
                    self.disconnect()
                    raise ProtocolError(
                        f"reply of {header.payload_len} bytes exceeds the protocol's "
                        f"limit of {MAX_REPLY_BYTES}"
                    )
                payload = self._read_exact(sock, header.payload_len, wait)
            finally:
                if self._sock is sock:
                    sock.settimeout(self.timeout)
            self._agent_id = header.agent_id
            return Reply(header.agent_id, header.opcode, payload)

    def reply_wait(self, deadline_ms: Optional[int]) -> Optional[float]:
        """How long to wait for the reply to a request whose own deadline is
        ``deadline_ms``: the client's ``timeout``, stretched to the deadline
        plus :data:`REPLY_MARGIN_S` when that is longer.

        >>> Connection("/nowhere", timeout=5).reply_wait(60_000)
        90.0
        >>> Connection("/nowhere", timeout=5).reply_wait(None)
        5
        """
        if self.timeout is None or deadline_ms is None:
            return self.timeout
        return max(self.timeout, deadline_ms / 1000 + REPLY_MARGIN_S)

    def call(
        self, opcode: int, payload: Payload = b"", *, deadline_ms: Optional[int] = None
    ) -> Reply:
        """Sends a request and returns its reply frame.

        ``payload`` may be bytes, a str (sent as UTF-8) or a dict/list (sent
        as JSON). The raw reply is returned; see :meth:`call_json` for JSON
        replies with errors raised. ``deadline_ms`` is the request's own
        deadline, if it has one (see :meth:`reply_wait`).
        """
        with self._lock:
            self.send(opcode, payload)
            return self.recv(deadline_ms)

    def call_json(
        self, opcode: int, payload: Payload = b"", *, deadline_ms: Optional[int] = None
    ) -> Any:
        """Sends a request and returns its JSON reply, decoded.

        Raises the :class:`~agentos.AgentOSError` for its ``code`` when the
        kernel answers ``"success": false``.
        """
        reply = self.call(opcode, payload, deadline_ms=deadline_ms)
        value = decode_json(reply, opcode)
        raise_if_failed(value)
        return value

    # -- internals ----------------------------------------------------------

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        return self._sock

    def _read_exact(self, sock: socket.socket, size: int, wait: Optional[float]) -> bytes:
        chunks = []
        remaining = size
        while remaining:
            try:
                chunk = sock.recv(min(remaining, 1 << 20))
            except OSError as err:
                raise self._broken(err, "waiting for a reply", wait) from err
            if not chunk:
                self.disconnect()
                raise AgentOSConnectionError(
                    f"the kernel at {self.socket_path} closed the connection"
                )
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _broken(self, err: OSError, action: str, wait: Optional[float]) -> AgentOSError:
        """Closes the connection after a socket failure (a reply that comes
        later would answer the wrong request); returns what to raise."""
        self.disconnect()
        if isinstance(err, socket.timeout):
            return Timeout(
                f"timed out {action} after {wait}s (the client's timeout; "
                f"pass a larger timeout to AgentOSClient)"
            )
        return AgentOSConnectionError(
            f"connection to the kernel at {self.socket_path} failed while {action}: {err}"
        )

    def _read_refusal(self) -> Optional[AgentOSError]:
        """The kernel's parting words on a connection it closed while we
        wrote: a refused connection's error under opcode EXIT, or a request
        too large to read. A reply to an earlier pipelined request is not
        one."""
        try:
            reply = self.recv()
            failure = failure_of(json.loads(reply.payload))
        except (AgentOSError, ValueError):
            return None
        if reply.opcode == Opcode.EXIT or isinstance(failure, PayloadTooLarge):
            return failure
        return None


def decode_json(reply: Reply, opcode: int) -> Any:
    """A reply's JSON payload; a reply to another opcode, or one that is not
    JSON, breaks the protocol. The kernel's parting error (under EXIT) is
    let through, to be raised for its code."""
    try:
        value = json.loads(reply.payload)
    except ValueError as err:
        raise ProtocolError(
            f"{_opcode_name(opcode)} reply is not JSON: {reply.payload[:200]!r}"
        ) from err
    if reply.opcode != opcode and failure_of(value) is None:
        raise ProtocolError(f"reply opcode 0x{reply.opcode:02X} answers 0x{opcode:02X}")
    return value


def failure_of(value: Any) -> Optional[AgentOSError]:
    """The error a JSON reply reports, if it is a failure."""
    if isinstance(value, dict) and value.get("success") is False:
        return error_for(
            str(value.get("code") or "internal"),
            str(value.get("error") or "the kernel reported a failure"),
        )
    return None


def raise_if_failed(value: Any) -> None:
    """Raises the error a JSON reply reports, if it is a failure."""
    failure = failure_of(value)
    if failure is not None:
        raise failure


def _to_bytes(payload: Payload) -> bytes:
    if payload is None:
        return b""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, (dict, list)):
        return json.dumps(payload, separators=(",", ":")).encode("utf-8")
    raise TypeError(f"payload must be bytes, str, dict or list, not {type(payload).__name__}")


def _opcode_name(opcode: int) -> str:
    try:
        return Opcode(opcode).name
    except ValueError:
        return f"0x{opcode:02X}"
