"""Python client for the AgentOS kernel.

    >>> from agentos import AgentOSClient
    >>> with AgentOSClient() as client:          # doctest: +SKIP
    ...     client.echo("Hello!")
    'Hello!'
"""

from . import types
from .client import AgentOSClient
from .connection import Connection, Reply
from .errors import (
    AgentOSConnectionError,
    AgentOSError,
    AlreadyExists,
    BadMagic,
    BadRequest,
    Busy,
    Cancelled,
    InternalError,
    Interrupted,
    LimitExceeded,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    ProtocolError,
    Timeout,
    ToolError,
    Unavailable,
    UnknownOpcode,
    error_for,
)
from .limits import parse_size
from .paths import resolve_socket_path
from .protocol import HEADER_LEN, MAGIC, MAX_REPLY_BYTES, Opcode

__version__ = "0.1.0"

__all__ = [
    "AgentOSClient",
    "AgentOSConnectionError",
    "AgentOSError",
    "AlreadyExists",
    "BadMagic",
    "BadRequest",
    "Busy",
    "Cancelled",
    "Connection",
    "HEADER_LEN",
    "InternalError",
    "Interrupted",
    "LimitExceeded",
    "MAGIC",
    "MAX_REPLY_BYTES",
    "NotFound",
    "Opcode",
    "PayloadTooLarge",
    "PermissionDenied",
    "ProtocolError",
    "Reply",
    "Timeout",
    "ToolError",
    "Unavailable",
    "UnknownOpcode",
    "error_for",
    "parse_size",
    "resolve_socket_path",
    "types",
]
