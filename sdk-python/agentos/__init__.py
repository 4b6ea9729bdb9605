"""Python client for the AgentOS kernel.

    >>> from agentos import AgentOSClient
    >>> with AgentOSClient() as client:          # doctest: +SKIP
    ...     client.echo("Hello!")
    'Hello!'
"""

from .client import AgentOSClient, Reply
from .errors import AgentOSConnectionError, AgentOSError, ProtocolError
from .paths import resolve_socket_path
from .protocol import HEADER_LEN, MAGIC, MAX_REPLY_BYTES, Opcode

__version__ = "0.1.0"

__all__ = [
    "AgentOSClient",
    "AgentOSConnectionError",
    "AgentOSError",
    "HEADER_LEN",
    "MAGIC",
    "MAX_REPLY_BYTES",
    "Opcode",
    "ProtocolError",
    "Reply",
    "resolve_socket_path",
]
