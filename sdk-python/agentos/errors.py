"""Exceptions raised by the AgentOS client."""

from __future__ import annotations


class AgentOSError(Exception):
    """The kernel answered with ``"success": false``, or the exchange failed.

    ``code`` is the protocol's stable machine word (``bad_request``,
    ``unknown_opcode``, ``not_found``, ``permission_denied``, ``unavailable``,
    ...); ``message`` is the kernel's human sentence.
    """

    def __init__(self, message: str, code: str = "internal") -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class AgentOSConnectionError(AgentOSError):
    """The kernel's socket could not be reached, or the connection dropped."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="connection")


class ProtocolError(AgentOSError):
    """The bytes from the kernel do not follow the protocol."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="protocol")
