# Framing: what the zygote and its run children say to the kernel, and
# read from it, on the host's channel and on each run's socket, as
# exec/wire.rs defines it. The names and sizes used here (CHANNEL_FD,
# FRAME_HEADER, OP_*, ...) come from the prelude the kernel writes from
# that file, before the zygote's parts.

import json
import socket
import struct


# Set by main() from the kernel's first datagram on the channel (never the
# environment: every run can read PID 1's initial environment).
SETTINGS = {}


def receive_settings(channel):
    """The kernel's settings, its first datagram on the channel."""
    return json.loads(channel.recv(SETTINGS_MAX))


def receive_host_order(channel):
    """The kernel's next order on the channel and the descriptors that came
    with it (None, [] when the kernel has gone)."""
    message, fds, _, _ = socket.recv_fds(channel, CHANNEL_MESSAGE_MAX, FDS_MAX)
    if not message:
        return None, []
    return json.loads(message), fds


def send_ready(channel, number, cgroup, fds):
    """Hands a prepared run child to the kernel: its socket and the read
    ends of its stdout and stderr pipes."""
    message = json.dumps({"ready": number, "cgroup": cgroup}).encode()
    socket.send_fds(channel, [message], fds)


def send_pidfd(sock, pidfd):
    """A run child's first message: how to kill it."""
    socket.send_fds(sock, [PIDFD_MARK], [pidfd])


def send_pipes(sock, fds):
    """A session's child, ready again: the read ends of its fresh pipes."""
    socket.send_fds(sock, [PIPES_MARK], fds)


def send_frame(sock, value):
    """Sends one frame: its length, then its JSON (a lone surrogate, from
    a name that is not UTF-8, goes as "?": the kernel would not read
    it)."""
    data = json.dumps(value, ensure_ascii=False).encode("utf-8", "replace")
    sock.sendall(struct.pack(FRAME_LENGTH, len(data)) + data)


def receive_order(sock):
    """An order, and the descriptors that come with its first bytes (None,
    [] when the kernel has gone)."""
    header, fds, _, _ = socket.recv_fds(sock, FRAME_HEADER, FDS_MAX)
    if not header:
        return None, []
    if len(header) < FRAME_HEADER:
        rest = receive_exactly(sock, FRAME_HEADER - len(header))
        if rest is None:
            return None, []
        header += rest
    (length,) = struct.unpack(FRAME_LENGTH, header)
    body = receive_exactly(sock, length)
    if body is None:
        return None, []
    return json.loads(body), fds


def receive_exactly(sock, length):
    """Exactly ``length`` bytes (None if the kernel went first)."""
    chunks = []
    while length:
        chunk = sock.recv(min(length, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        length -= len(chunk)
    return b"".join(chunks)
