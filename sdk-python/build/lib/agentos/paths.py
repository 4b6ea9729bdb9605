"""Where the kernel's socket lives.

Every AgentOS client resolves it the same way, in this order: an explicit
path; ``$AGENTOS_SOCKET``; ``/run/agentos/agentos.sock`` when running as
root; ``$XDG_RUNTIME_DIR/agentos/agentos.sock``; ``/tmp/agentos-$UID/agentos.sock``.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Union

SYSTEM_SOCKET = "/run/agentos/agentos.sock"
SOCKET_FILE = "agentos.sock"

PathLike = Union[str, "os.PathLike[str]"]


def resolve_socket_path(
    explicit: Optional[PathLike] = None,
    *,
    environ: Optional[Mapping[str, str]] = None,
    euid: Optional[int] = None,
) -> str:
    """Returns the socket path by the protocol's rule.

    ``environ`` and ``euid`` default to the process's own; tests pass them in.

    >>> resolve_socket_path("/tmp/k.sock")
    '/tmp/k.sock'
    >>> resolve_socket_path(environ={}, euid=0)
    '/run/agentos/agentos.sock'
    >>> resolve_socket_path(environ={"XDG_RUNTIME_DIR": "/run/user/1000"}, euid=1000)
    '/run/user/1000/agentos/agentos.sock'
    >>> resolve_socket_path(environ={}, euid=1000)
    '/tmp/agentos-1000/agentos.sock'
    """
    env = os.environ if environ is None else environ
    uid = os.geteuid() if euid is None else euid
    if explicit is not None and os.fspath(explicit):
        return os.fspath(explicit)
    from_env = env.get("AGENTOS_SOCKET")
    if from_env:
        return from_env
    if uid == 0:
        return SYSTEM_SOCKET
    runtime_dir = env.get("XDG_RUNTIME_DIR")
    # The XDG spec says a relative XDG_RUNTIME_DIR is invalid and to be ignored.
    if runtime_dir and os.path.isabs(runtime_dir):
        return os.path.join(runtime_dir, "agentos", SOCKET_FILE)
    return os.path.join(f"/tmp/agentos-{uid}", SOCKET_FILE)
