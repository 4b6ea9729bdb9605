"""Exceptions raised by the AgentOS client.

Every failure is an :class:`AgentOSError` with the protocol's ``code`` (a
stable machine word) and the kernel's ``message`` (a human sentence). Each
code has a class of its own, so a caller catches exactly what it can handle:

    >>> try:
    ...     raise error_for("not_found", 'no live agent named "w1"')
    ... except NotFound as err:
    ...     print(err.code, "-", err.message)
    not_found - no live agent named "w1"

A kernel deadline (``timeout``) is also a :class:`TimeoutError`, and a
failed connection also a :class:`ConnectionError`, so code that knows
nothing of AgentOS still handles them:

    >>> isinstance(error_for("timeout", "the run took too long"), TimeoutError)
    True
"""

from __future__ import annotations

from typing import Dict, Type


class AgentOSError(Exception):
    """The kernel answered with ``"success": false``, or the exchange failed.

    ``code`` is the protocol's stable machine word; ``message`` is the
    kernel's sentence saying what was wrong and, where it can, how to fix it.
    A code this client does not know (from a newer kernel) is raised as
    :class:`AgentOSError` itself, with that code.
    """

    #: The protocol's code for this class of failure.
    CODE = "internal"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.CODE

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class BadRequest(AgentOSError):
    """The payload does not fit the opcode; the message names the field."""

    CODE = "bad_request"


class UnknownOpcode(AgentOSError):
    """The opcode is not one this kernel serves."""

    CODE = "unknown_opcode"


class NotFound(AgentOSError):
    """No such agent, task, session or tool (or not one yours to see)."""

    CODE = "not_found"


class AlreadyExists(AgentOSError):
    """A live agent already has that name."""

    CODE = "already_exists"


class PermissionDenied(AgentOSError):
    """The caller may not do this; the message names what it asked for."""

    CODE = "permission_denied"


class LimitExceeded(AgentOSError):
    """A quota was hit, or a requested limit is out of its allowed range."""

    CODE = "limit_exceeded"


class Busy(AgentOSError):
    """A queue is full, or the kernel is at its connection limit: retry later."""

    CODE = "busy"


class Timeout(AgentOSError, TimeoutError):
    """The work did not finish in time: the kernel's deadline, the client's
    socket timeout, or a wait's own ``timeout``."""

    CODE = "timeout"


class Unavailable(AgentOSError):
    """The subsystem is missing, not configured, or down (e.g. no LLM)."""

    CODE = "unavailable"


class InternalError(AgentOSError):
    """A fault inside the kernel; the message says what failed."""

    CODE = "internal"


class ToolError(AgentOSError):
    """A tool reported an error of its own; the message is its text."""

    CODE = "tool_error"


class Cancelled(AgentOSError):
    """A task was cancelled, or its owner ended, before its work answered."""

    CODE = "cancelled"


class Interrupted(AgentOSError):
    """A task was running when the kernel stopped."""

    CODE = "interrupted"


class BadMagic(AgentOSError):
    """A frame did not start with the protocol's magic; the kernel closed
    the connection."""

    CODE = "bad_magic"


class PayloadTooLarge(AgentOSError):
    """A request was larger than the kernel accepts; it closed the connection."""

    CODE = "payload_too_large"


class AgentOSConnectionError(AgentOSError, ConnectionError):
    """The kernel's socket could not be reached, or the connection dropped."""

    CODE = "connection"

    def __init__(self, message: str) -> None:
        super().__init__(message, self.CODE)


class ProtocolError(AgentOSError):
    """The bytes from the kernel do not follow the protocol."""

    CODE = "protocol"

    def __init__(self, message: str) -> None:
        super().__init__(message, self.CODE)


#: The class raised for each code the kernel sends.
ERRORS_BY_CODE: Dict[str, Type[AgentOSError]] = {
    cls.CODE: cls
    for cls in (
        BadRequest, UnknownOpcode, NotFound, AlreadyExists, PermissionDenied,
        LimitExceeded, Busy, Timeout, Unavailable, InternalError, ToolError,
        Cancelled, Interrupted, BadMagic, PayloadTooLarge,
    )
}


def error_for(code: str, message: str) -> AgentOSError:
    """The exception for a failure the kernel reported with ``code``.

    >>> error_for("busy", "the THINK queue is full")
    Busy('the THINK queue is full')
    >>> err = error_for("some_new_code", "from a newer kernel")
    >>> type(err).__name__, err.code
    ('AgentOSError', 'some_new_code')
    """
    return ERRORS_BY_CODE.get(code, AgentOSError)(message, code)
