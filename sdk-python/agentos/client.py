"""A blocking client for the AgentOS kernel socket."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
from types import TracebackType
from typing import Any, Iterator, Mapping, NamedTuple, Optional, Sequence, Type, Union

from .errors import AgentOSConnectionError, AgentOSError, ProtocolError
from .paths import PathLike, resolve_socket_path
from .protocol import HEADER_LEN, MAX_REPLY_BYTES, Opcode, decode_header, encode_frame

Payload = Union[bytes, bytearray, memoryview, str, dict, list, None]


class Reply(NamedTuple):
    """One reply frame: the caller's identity, the opcode answered, the payload."""

    agent_id: int
    opcode: int
    payload: bytes


class AgentOSClient:
    """A connection to ``agentosd``.

    The socket path is resolved like every AgentOS client does (explicit
    argument, ``$AGENTOS_SOCKET``, the system socket as root, then the
    per-user runtime directory). The client connects on first use or on
    :meth:`connect`; use it as a context manager to close it reliably::

        with AgentOSClient() as client:
            client.echo("Hello!")

    Replies on one connection come back in request order. The client is safe
    to share between threads: each call holds the connection for its whole
    request/reply exchange.
    """

    def __init__(
        self, socket_path: Optional[PathLike] = None, timeout: Optional[float] = 30.0
    ) -> None:
        """``timeout`` bounds each blocking socket operation, in seconds
        (``None`` waits forever)."""
        self.socket_path: str = resolve_socket_path(socket_path)
        # Code run by EXEC inherits its own connection to the kernel: a run
        # of whoever started it, with what that EXEC request gave the run.
        inherited = os.environ.get("AGENTOS_SOCKET_FD") if socket_path is None else None
        self._inherited_fd: Optional[int] = int(inherited) if inherited else None
        self.timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._lock = threading.RLock()
        self._agent_id: Optional[int] = None

    # -- connection -------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a connection is open."""
        return self._sock is not None

    @property
    def agent_id(self) -> Optional[int]:
        """The identity the kernel gave this connection (after a reply)."""
        return self._agent_id

    def connect(self) -> "AgentOSClient":
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

    def __enter__(self) -> "AgentOSClient":
        return self.connect()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.disconnect()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "not connected"
        return f"AgentOSClient({self.socket_path!r}, {state})"

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
                raise self._broken(err, "sending") from err
            except OSError as err:
                raise self._broken(err, "sending") from err

    def recv(self) -> Reply:
        """Receives the next reply. Never connects: a reply can only come on
        the connection its request went out on."""
        with self._lock:
            sock = self._sock
            if sock is None:
                raise AgentOSConnectionError(
                    "not connected: nothing to receive (an earlier failure closed the "
                    "connection, or no request was sent)"
                )
            try:
                header = decode_header(self._read_exact(sock, HEADER_LEN))
            except ValueError as err:
                self.disconnect()
                raise ProtocolError(f"malformed reply from the kernel: {err}") from err
            if header.payload_len > MAX_REPLY_BYTES:
                self.disconnect()
                raise ProtocolError(
                    f"reply of {header.payload_len} bytes exceeds the protocol's "
                    f"limit of {MAX_REPLY_BYTES}"
                )
            payload = self._read_exact(sock, header.payload_len)
            self._agent_id = header.agent_id
            return Reply(header.agent_id, header.opcode, payload)

    def call(self, opcode: int, payload: Payload = b"") -> tuple[int, int, bytes]:
        """Sends a request and returns its reply as ``(agent_id, opcode, payload)``.

        ``payload`` may be bytes, a str (sent as UTF-8) or a dict/list (sent
        as JSON). The raw reply payload is returned; see :meth:`call_json`
        for JSON replies with errors raised.
        """
        with self._lock:
            self.send(opcode, payload)
            return tuple(self.recv())  # type: ignore[return-value]

    def call_json(self, opcode: int, payload: Payload = b"") -> Any:
        """Sends a request and returns its JSON reply, decoded.

        Raises :class:`AgentOSError` (with ``.code``) when the kernel answers
        ``"success": false``.
        """
        _, reply_opcode, data = self.call(opcode, payload)
        try:
            value = json.loads(data)
        except ValueError as err:
            raise ProtocolError(
                f"{_opcode_name(opcode)} reply is not JSON: {data[:200]!r}"
            ) from err
        _raise_if_failed(value)
        if reply_opcode != opcode:
            raise ProtocolError(f"reply opcode 0x{reply_opcode:02X} answers 0x{opcode:02X}")
        return value

    # -- syscalls ---------------------------------------------------------

    def noop(self, data: bytes = b"") -> bytes:
        """NOOP: the kernel echoes ``data``."""
        return self.call(Opcode.NOOP, bytes(data))[2]

    def echo(self, text: str) -> str:
        """NOOP with text: returns the same text, as echoed by the kernel."""
        return self.noop(text.encode("utf-8")).decode("utf-8")

    def hello(self) -> dict:
        """HELLO: protocol version, kernel version, your id and the features
        this kernel provides right now."""
        return self.call_json(Opcode.HELLO)

    def list_agents(self) -> list:
        """LIST: one dict per known agent (live, and recently ended), with
        its state, exit code or signal, restarts, limits, and memory and CPU
        figures read from its cgroup."""
        return self.call_json(Opcode.LIST)

    def think(
        self,
        prompt: Optional[str] = None,
        system: Optional[str] = None,
        model: Optional[str] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        *,
        messages: Optional[Sequence[Mapping[str, str]]] = None,
    ) -> dict:
        """THINK: asks the kernel's shared LLM and returns its reply.

        Give a ``prompt``, a chat history in ``messages`` (dicts with
        ``role`` — ``system``, ``user`` or ``assistant`` — and ``content``),
        or both (the prompt then follows the history as the last user
        turn). ``system``, ``model``, ``max_tokens`` and ``temperature``
        (0 to 2) are sent only when given; the kernel's defaults apply
        otherwise::

            with AgentOSClient() as client:
                reply = client.think("What is 2+2?", max_tokens=32)
                print(reply["content"], reply["tokens"])

        Returns the reply: ``content``, ``tokens``, ``usage``
        (``prompt_tokens``, ``completion_tokens``, ``total_tokens``),
        ``model``, ``queue_ms`` and ``latency_ms``. Raises
        :class:`AgentOSError` (``bad_request``, ``limit_exceeded``,
        ``permission_denied``, ``unavailable``, ``busy``, ``timeout``, ...)
        when the kernel could not answer. The call blocks until the model
        has answered, so the client's ``timeout`` must allow for that.
        """
        if not prompt and not messages:
            raise ValueError("think() needs a prompt or messages")
        fields = {
            "prompt": prompt,
            "messages": [dict(m) for m in messages] if messages is not None else None,
            "system": system,
            "model": model,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        request = {k: v for k, v in fields.items() if v is not None}
        return self.call_json(Opcode.THINK, request)

    def spawn(
        self,
        name: str,
        script: Optional[PathLike] = None,
        *,
        command: Optional[Sequence[str]] = None,
        args: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        python: Optional[str] = None,
        sandboxed: Optional[bool] = None,
        network: Optional[bool] = None,
        limits: Optional[Mapping[str, int]] = None,
        restart_policy: Optional[str] = None,
        max_restarts: Optional[int] = None,
        restart_window: Optional[int] = None,
        permissions: Optional[Mapping[str, Any]] = None,
    ) -> dict:
        """SPAWN: starts an agent and returns once it runs.

        Give a Python ``script`` (made absolute here; run with ``python``, or
        the kernel's configured interpreter) or a ``command`` argv. ``limits``
        takes ``memory`` (bytes), ``cpu_quota`` and ``cpu_period``
        (microseconds) and ``max_pids``; ``restart_policy`` is ``never``,
        ``on-failure`` or ``always``. Returns the reply: ``id``, ``name``,
        ``pid``, ``status`` and ``isolation`` (with ``degraded_reason`` when
        the host could not give all that was asked). Raises
        :class:`AgentOSError` (``already_exists``, ``not_found``,
        ``bad_request``, ``permission_denied``, ...) otherwise.
        """
        if (script is None) == (command is None):
            raise ValueError("spawn() takes a script or a command, not both or neither")
        request: dict = {"name": name}
        if script is not None:
            request["script"] = os.path.abspath(os.fspath(script))
        if command is not None:
            request["command"] = list(command)
        optional = {
            "args": list(args) if args is not None else None,
            "env": dict(env) if env is not None else None,
            "cwd": cwd,
            "python": python,
            "sandboxed": sandboxed,
            "network": network,
            "limits": dict(limits) if limits is not None else None,
            "restart_policy": restart_policy,
            "max_restarts": max_restarts,
            "restart_window": restart_window,
            "permissions": dict(permissions) if permissions is not None else None,
        }
        request.update({k: v for k, v in optional.items() if v is not None})
        return self.call_json(Opcode.SPAWN, request)

    def kill(self, agent: Union[int, str], grace_ms: Optional[int] = None) -> dict:
        """KILL: stops a live agent by id (int) or name (str): SIGTERM to its
        whole process tree, SIGKILL after ``grace_ms`` (default 5000).
        Raises :class:`AgentOSError` with code ``not_found`` for no such
        live agent."""
        request: dict = {"id": agent} if isinstance(agent, int) else {"name": agent}
        if grace_ms is not None:
            request["grace_ms"] = grace_ms
        return self.call_json(Opcode.KILL, request)

    def logs(
        self, agent: Union[int, str], follow: bool = False, lines: Optional[int] = None
    ) -> Union[str, Iterator[str]]:
        """LOGS: an agent's log, by id (int) or name (str).

        Without ``follow``, the text of its last ``lines`` lines (default
        100). With ``follow``, an iterator: the last lines, then each piece
        the agent writes as it comes, ending when the agent has ended and
        its log is read to the end::

            for text in client.logs("worker1", follow=True):
                print(text, end="")

        Raises :class:`AgentOSError` with code ``not_found`` for an agent
        that does not exist or is not yours to see."""
        request: dict = {"id": agent} if isinstance(agent, int) else {"name": agent}
        if lines is not None:
            request["lines"] = lines
        if not follow:
            return self.call_json(Opcode.LOGS, request)["text"]
        return self._follow_logs(request)

    def _follow_logs(self, request: dict) -> Iterator[str]:
        reply = self.call_json(Opcode.LOGS, request)
        # Each wait stays well inside the socket timeout.
        wait_ms = 10_000 if self.timeout is None else max(100, min(10_000, int(self.timeout * 500)))
        while True:
            if reply["text"]:
                yield reply["text"]
            if reply["ended"]:
                return
            follow = {"id": reply["id"], "after": reply["offset"], "follow": True,
                      "wait_ms": wait_ms}
            reply = self.call_json(Opcode.LOGS, follow)

    def exec(
        self,
        code: str,
        language: str = "python",
        *,
        session: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, Union[bytes, str]]] = None,
        collect: Optional[Sequence[str]] = None,
        limits: Optional[Mapping[str, int]] = None,
    ) -> dict:
        """EXEC: runs ``code`` (``language`` ``python`` or ``bash``) in a fresh,
        isolated sandbox and returns the reply once it has ended::

            with AgentOSClient() as client:
                run = client.exec("print(6 * 7)")
                print(run["stdout"], run["exit_code"])

        The reply has ``success`` (exit code 0 and not timed out),
        ``stdout``, ``stderr`` (each capped to its head and tail, with
        ``truncated`` counting the bytes dropped), ``exit_code``, ``signal``,
        ``error`` (an uncaught exception's ``Type: message``), ``duration_ms``,
        ``timed_out``, ``oom_killed``, ``files`` and ``session``. Code that
        fails is a reply with ``success`` false, not an exception:
        :class:`AgentOSError` is raised only when the kernel refused the run
        (``bad_request``, ``permission_denied``, ``busy``, ``unavailable``).
        ``files`` (path under ``/workspace`` to content; bytes are sent
        base64-encoded, str as UTF-8) are written before the run, and the
        ``collect`` paths come back in ``files``, base64-encoded. The client's
        ``timeout`` must allow for ``timeout_ms``.
        """
        request: dict = {"code": code, "language": language}
        optional = {
            "session": session,
            "timeout_ms": timeout_ms,
            "env": dict(env) if env is not None else None,
            "files": _base64_files(files) if files is not None else None,
            "collect": list(collect) if collect is not None else None,
            "limits": dict(limits) if limits is not None else None,
        }
        request.update({k: v for k, v in optional.items() if v is not None})
        _, _, data = self.call(Opcode.EXEC, request)
        try:
            reply = json.loads(data)
        except ValueError as err:
            raise ProtocolError(f"EXEC reply is not JSON: {data[:200]!r}") from err
        if isinstance(reply, dict) and reply.get("code"):
            # Refused before any code ran (a run that failed has no code).
            _raise_if_failed(reply)
        return reply

    def sessions(self) -> list:
        """EXEC ``sessions``: your sessions, each with ``session``,
        ``created_at``, ``last_used_at``, ``runs`` and ``workspace_bytes``."""
        return self.call_json(Opcode.EXEC, {"op": "sessions"})["sessions"]

    def close_session(self, session: str) -> bool:
        """EXEC ``close``: ends a session and deletes its workspace."""
        return self.call_json(Opcode.EXEC, {"op": "close", "session": session})["closed"]

    def snapshot(self, session: str, name: str) -> dict:
        """EXEC ``snapshot``: saves the directories and regular files of a
        session's ``/workspace`` as ``name``; returns ``name``, ``bytes``,
        ``created_at`` and ``left_out`` (symlinks and special files, which
        are never followed or saved)."""
        request = {"op": "snapshot", "session": session, "name": name}
        reply = self.call_json(Opcode.EXEC, request)
        return {**reply["snapshot"], "left_out": reply.get("left_out", [])}

    def restore(self, session: str, name: str) -> list:
        """EXEC ``restore``: replaces a session's ``/workspace`` with a
        snapshot and restarts its interpreter; returns what of the snapshot
        was left out (anything but plain directories and files)."""
        request = {"op": "restore", "session": session, "name": name}
        return self.call_json(Opcode.EXEC, request).get("left_out", [])

    def snapshots(self, session: str) -> list:
        """EXEC ``snapshots``: a session's snapshots, oldest first."""
        return self.call_json(Opcode.EXEC, {"op": "snapshots", "session": session})[
            "snapshots"
        ]

    def tools(self) -> dict:
        """TOOL ``list``: every tool you may use and every tool server's
        state. Returns ``{"tools": [...], "servers": [...]}``: each tool has
        ``server``, ``name``, ``description``, ``input_schema`` and
        ``output_schema``; each server ``name``, ``state`` (``starting``,
        ``ready``, ``failed`` or ``stopped``), ``error`` and ``tools`` (how
        many). Built-in servers ``llm`` and ``kernel`` are among the tools."""
        reply = self.call_json(Opcode.TOOL, {"op": "list"})
        return {"tools": reply["tools"], "servers": reply["servers"]}

    def search_tools(self, query: str, detail: str = "summary", limit: int = 10) -> list:
        """TOOL ``search``: the tools you may use whose names and
        descriptions match ``query``, best first. ``detail`` is ``name``
        (server and name only), ``summary`` (and the description) or
        ``full`` (and the schemas)."""
        request = {"op": "search", "query": query, "detail": detail, "limit": limit}
        return self.call_json(Opcode.TOOL, request)["tools"]

    def call_tool(
        self, server: str, tool: str, /, *, timeout_ms: Optional[int] = None, **arguments: Any
    ) -> Any:
        """TOOL ``call``: calls ``tool`` of ``server`` with keyword
        arguments and returns its ``result`` (its structured result, else
        its text parsed as JSON, else its text)::

            client.call_tool("everything", "get-sum", a=1, b=2)

        A tool that reports an error raises :class:`AgentOSError` with code
        ``tool_error`` and the tool's message; a call past ``timeout_ms``
        (else the server's own deadline) raises with code ``timeout``."""
        request: dict = {"op": "call", "server": server, "tool": tool, "arguments": arguments}
        if timeout_ms is not None:
            request["timeout_ms"] = timeout_ms
        return self.call_json(Opcode.TOOL, request).get("result")

    def dispatch(self, kind: str, request: Any, label: Optional[str] = None) -> str:
        """TASK ``dispatch``: starts ``request`` in the background and
        returns its task id at once. ``kind`` is ``exec`` (``request`` is an
        EXEC run, e.g. ``{"code": "print(1)"}``), ``think`` (a THINK
        payload, or the prompt as a string) or ``prompt`` (the kernel's
        loop: ``{"prompt": ..., "max_iterations": 5}``; see :meth:`run`).
        The task is yours (your agent's,
        or your uid's) and outlives this connection::

            ids = [client.dispatch("exec", {"code": f"print({i})"}) for i in range(3)]
            results = [client.wait_task(i)["result"]["stdout"] for i in ids]
        """
        body: dict = {"op": "dispatch", "kind": kind, "request": request}
        if label is not None:
            body["label"] = label
        return self.call_json(Opcode.TASK, body)["task_id"]

    def task_status(self, task_id: str) -> dict:
        """TASK ``status``: the task as it is: ``task_id``, ``kind``,
        ``label``, ``state`` (``queued``, ``running``, ``completed``,
        ``failed``, ``cancelled``, ``timed_out``, ``interrupted``), its
        times, and while it runs ``progress`` (the tail of its output)."""
        return self.call_json(Opcode.TASK, {"op": "status", "task_id": task_id})["task"]

    def wait_task(self, task_id: str, timeout_ms: Optional[int] = None) -> dict:
        """TASK ``wait``: the task once it has finished, with ``result`` (the
        EXEC or THINK reply), or as it is when ``timeout_ms`` (default 30 s,
        at most 600 s) passes first — a wait that times out changes nothing.
        The client's own ``timeout`` must allow for ``timeout_ms``."""
        body: dict = {"op": "wait", "task_id": task_id}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        return self.call_json(Opcode.TASK, body)["task"]

    def list_tasks(
        self,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        limit: Optional[int] = None,
        before: Optional[str] = None,
        owner: Optional[Union[int, str]] = None,
    ) -> dict:
        """TASK ``list``: your tasks, newest first: ``{"tasks": [...],
        "next": id or None}``; pass ``next`` as ``before`` for the next
        page. An operator may pass ``owner`` — an agent's id or name, or
        ``"*"`` for everyone's — to list another owner's tasks."""
        body: dict = {"op": "list"}
        body.update({k: v for k, v in
                     {"state": state, "kind": kind, "limit": limit, "before": before,
                      "owner": owner}.items()
                     if v is not None})
        reply = self.call_json(Opcode.TASK, body)
        return {"tasks": reply["tasks"], "next": reply.get("next")}

    def run(
        self,
        prompt: str,
        *,
        max_iterations: Optional[int] = None,
        system: Optional[str] = None,
        session: Optional[str] = None,
        label: Optional[str] = None,
        timeout_ms: int = 600_000,
    ) -> dict:
        """The kernel's prompt-to-program loop, waited for: THINK writes
        code, EXEC runs it, the output goes back, until THINK answers
        (``state`` ``completed``) or ``max_iterations`` (default 5) are spent
        (``failed``). Returns the task; its ``result`` has ``answer``,
        ``iterations`` (each ``code``, ``stdout``, ``stderr``,
        ``exit_code``), ``tokens``, ``tool_calls`` and ``tool_bytes``::

            task = client.run("How many lines are in /etc/services?")
            print(task["result"]["answer"])

        The task goes on if the wait gives up first (``state`` still
        ``running``); :meth:`wait_task` picks it up again. The client's own
        ``timeout`` must allow for ``timeout_ms``."""
        request: dict = {"prompt": prompt}
        optional = {"max_iterations": max_iterations, "system": system, "session": session}
        request.update({k: v for k, v in optional.items() if v is not None})
        task_id = self.dispatch("prompt", request, label=label)
        return self.wait_task(task_id, timeout_ms=timeout_ms)

    def cancel_task(self, task_id: str) -> bool:
        """TASK ``cancel``: stops a queued or running task (a running EXEC is
        killed with everything it started); returns whether it was still
        going."""
        return self.call_json(Opcode.TASK, {"op": "cancel", "task_id": task_id})["cancelled"]

    def exit(self) -> None:
        """EXIT: the kernel says goodbye and closes; so does the client."""
        with self._lock:
            try:
                _, _, data = self.call(Opcode.EXIT)
                if data != b"goodbye":
                    raise ProtocolError(f"EXIT answered {data[:100]!r}, not b'goodbye'")
            finally:
                self.disconnect()

    # -- internals ----------------------------------------------------------

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        return self._sock

    def _read_exact(self, sock: socket.socket, size: int) -> bytes:
        chunks = []
        remaining = size
        while remaining:
            try:
                chunk = sock.recv(min(remaining, 1 << 20))
            except OSError as err:
                raise self._broken(err, "waiting for a reply") from err
            if not chunk:
                self.disconnect()
                raise AgentOSConnectionError(
                    f"the kernel at {self.socket_path} closed the connection"
                )
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _broken(self, err: OSError, action: str) -> AgentOSError:
        """Closes the connection after a socket failure; returns what to raise."""
        self.disconnect()
        if isinstance(err, socket.timeout):
            return AgentOSError(f"timed out {action} after {self.timeout}s", "timeout")
        return AgentOSConnectionError(
            f"connection to the kernel at {self.socket_path} failed while {action}: {err}"
        )

    def _read_refusal(self) -> Optional[AgentOSError]:
        """The kernel's parting words on a connection it refused: an error
        reply under opcode EXIT. A reply to an earlier pipelined request is
        not one."""
        try:
            reply = self.recv()
            if reply.opcode != Opcode.EXIT:
                return None
            return _failure(json.loads(reply.payload))
        except (AgentOSError, ValueError):
            return None


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


def _failure(value: Any) -> Optional[AgentOSError]:
    """The error a JSON reply reports, if it is a failure."""
    if isinstance(value, dict) and value.get("success") is False:
        return AgentOSError(
            str(value.get("error") or "the kernel reported a failure"),
            str(value.get("code") or "internal"),
        )
    return None


def _base64_files(files: Mapping[str, Union[bytes, str]]) -> dict:
    """EXEC's ``files``: each content base64-encoded (str as UTF-8)."""
    return {
        path: base64.b64encode(
            content.encode("utf-8") if isinstance(content, str) else bytes(content)
        ).decode("ascii")
        for path, content in files.items()
    }


def _raise_if_failed(value: Any) -> None:
    failure = _failure(value)
    if failure is not None:
        raise failure


def _opcode_name(opcode: int) -> str:
    try:
        return Opcode(opcode).name
    except ValueError:
        return f"0x{opcode:02X}"
