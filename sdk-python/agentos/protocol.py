"""The AgentOS frame: a 17-byte little-endian header, then the payload.

====== ==== =========== ==================================================
offset size field       meaning
====== ==== =========== ==================================================
0      4    magic       0x41474E54 (bytes 54 4E 47 41)
4      4    agent_id    replies: the caller's identity; requests: ignored
8      1    opcode      see :class:`Opcode`
9      8    payload_len bytes of payload that follow
====== ==== =========== ==================================================
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

MAGIC = 0x41474E54
HEADER = struct.Struct("<IIBQ")
HEADER_LEN = HEADER.size  # 17
MAX_REPLY_BYTES = 16 * 1024 * 1024


class Opcode(enum.IntEnum):
    """Operations of the protocol."""

    NOOP = 0x00
    THINK = 0x01
    EXEC = 0x02
    READ = 0x03
    WRITE = 0x04
    TOOL = 0x05
    SPAWN = 0x10
    KILL = 0x11
    LIST = 0x12
    TASK = 0x13
    PAUSE = 0x14
    RESUME = 0x15
    LOGS = 0x16
    NET = 0x17
    METRICS = 0x18
    DELEGATE = 0x19
    FLEET = 0x1A
    SEND = 0x20
    RECV = 0x21
    BROADCAST = 0x22
    REGISTER = 0x23
    STORE = 0x30
    FETCH = 0x31
    DELETE = 0x32
    KEYS = 0x33
    GET_PERMS = 0x40
    SET_PERMS = 0x41
    HTTP = 0x50
    SUBSCRIBE = 0x60
    UNSUBSCRIBE = 0x61
    POLL = 0x62
    EMIT = 0x63
    RECORD_START = 0x70
    RECORD_STOP = 0x71
    RECORD_STATUS = 0x72
    REPLAY_START = 0x73
    REPLAY_STATUS = 0x74
    ASYNC_POLL = 0x80
    GET_AUDIT_LOG = 0x76
    SET_AUDIT_CONFIG = 0x77
    SYSTEM_METRICS = 0xC0
    AGENT_METRICS = 0xC1
    ALL_AGENT_METRICS = 0xC2
    CGROUP_METRICS = 0xC3
    HELLO = 0xFE
    EXIT = 0xFF


class Header(NamedTuple):
    """A decoded frame header (the magic already checked)."""

    agent_id: int
    opcode: int
    payload_len: int


def encode_frame(opcode: int, payload: bytes, agent_id: int = 0) -> bytes:
    """Returns header + payload.

    >>> encode_frame(Opcode.NOOP, b"hi").hex(" ")
    '54 4e 47 41 00 00 00 00 00 02 00 00 00 00 00 00 00 68 69'
    """
    if not 0 <= opcode <= 0xFF:
        raise ValueError(f"opcode {opcode} does not fit in one byte")
    return HEADER.pack(MAGIC, agent_id, opcode, len(payload)) + payload


def decode_header(data: bytes) -> Header:
    """Parses 17 header bytes; raises ``ValueError`` on wrong magic.

    >>> decode_header(encode_frame(Opcode.HELLO, b"", agent_id=7))
    Header(agent_id=7, opcode=254, payload_len=0)
    """
    magic, agent_id, opcode, payload_len = HEADER.unpack(data[:HEADER_LEN])
    if magic != MAGIC:
        raise ValueError(f"bad magic 0x{magic:08X} (expected 0x{MAGIC:08X})")
    return Header(agent_id, opcode, payload_len)
