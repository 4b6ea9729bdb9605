"""A blocking client for the AgentOS kernel: one method per syscall."""

from __future__ import annotations

import base64
import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import results
from .connection import Connection, Payload, Reply, decode_json, raise_if_failed
from .errors import AgentOSError, ProtocolError, Timeout
from .limits import Size, parse_size, wire_limits
from .paths import PathLike
from .protocol import Opcode
from .types import (
    FINISHED_TASK_STATES,
    Agent,
    Execution,
    Hello,
    Killed,
    Language,
    PausedSession,
    RestartPolicy,
    SearchDetail,
    Session,
    Snapshot,
    Spawned,
    Task,
    TaskKind,
    TaskState,
    Template,
    Thought,
    Tool,
    ToolServer,
    Volume,
    VolumeMount,
)

__all__ = ["AgentOSClient", "Payload", "Reply"]

#: The longest single wait the protocol allows (TASK ``wait``, in ms).
MAX_TASK_WAIT_MS = 600_000
#: How long each long-poll of a log follow waits for new output, in ms.
LOG_FOLLOW_WAIT_MS = 10_000
#: How long each round of :meth:`AgentOSClient.as_completed` waits, in ms:
#: how late, at most, it notices a task that has ended.
COMPLETION_POLL_MS = 250
#: Tasks waited on at once in one round (one pipelined request each).
COMPLETION_BATCH = 32
#: The largest page TASK ``list`` gives.
MAX_TASK_PAGE = 1000
#: The kernel's deadlines in its default configuration, for requests that
#: name none (``exec.default_timeout_ms``, ``llm.timeout_ms``, and a tool
#: server's ``timeout_ms``): HELLO does not report the configured ones.
DEFAULT_EXEC_DEADLINE_MS = 30_000
DEFAULT_THINK_DEADLINE_MS = 120_000
DEFAULT_TOOL_DEADLINE_MS = 30_000
#: ``exec.template_build_timeout_ms``'s default.
DEFAULT_BUILD_DEADLINE_MS = 1_800_000

AgentRef = Union[int, str]
#: A volume to mount: a dict (``name``, ``path``, ``read_only``), or a
#: ``(name, path)`` or ``(name, path, read_only)`` tuple.
VolumeSpec = Union[VolumeMount, Mapping[str, Any], Tuple[str, str], Tuple[str, str, bool]]


class AgentOSClient(Connection):
    """A connection to ``agentosd`` with a method for each syscall.

    Use it as a context manager to close it reliably::

        with AgentOSClient() as client:
            client.echo("Hello!")

    Results are plain dicts typed in :mod:`agentos.types`; failures raise
    the :class:`~agentos.AgentOSError` subclass for their code.
    """

    # -- basics -----------------------------------------------------------

    def noop(self, data: bytes = b"") -> bytes:
        """NOOP: the kernel echoes ``data``."""
        return self.call(Opcode.NOOP, bytes(data)).payload

    def echo(self, text: str) -> str:
        """NOOP with text: returns the same text, as echoed by the kernel."""
        return self.noop(text.encode("utf-8")).decode("utf-8")

    def hello(self) -> Hello:
        """HELLO: protocol version, kernel version, your id and principal,
        and the features this kernel provides right now."""
        return results.without_success(self.call_json(Opcode.HELLO))  # type: ignore[return-value]

    def exit(self) -> None:
        """EXIT: the kernel says goodbye and closes; so does the client."""
        with self._lock:
            try:
                data = self.call(Opcode.EXIT).payload
                if data != b"goodbye":
                    raise ProtocolError(f"EXIT answered {data[:100]!r}, not b'goodbye'")
            finally:
                self.disconnect()

    # -- agents -----------------------------------------------------------

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
        network: Union[bool, Mapping[str, Any], None] = None,
        limits: Optional[Mapping[str, Any]] = None,
        restart_policy: Optional[RestartPolicy] = None,
        max_restarts: Optional[int] = None,
        restart_window: Optional[int] = None,
        permissions: Optional[Mapping[str, Any]] = None,
        volumes: Optional[Sequence[VolumeSpec]] = None,
        template: Optional[str] = None,
    ) -> Spawned:
        """SPAWN: starts an agent and returns once it runs.

        Give a Python ``script`` (made absolute here; run with ``python``, or
        the kernel's configured interpreter) or a ``command`` argv.
        ``limits`` takes ``memory`` (bytes, or a size such as ``"256M"``),
        ``cpus`` (a share such as ``0.5``; or ``cpu_quota`` and
        ``cpu_period`` in microseconds) and ``max_pids``. ``volumes`` are
        mounted into its sandbox (see :meth:`exec`); with ``template`` it
        starts from a template (see :meth:`templates`): its environment is
        first on ``PATH`` and its python runs ``script``. Returns ``id``,
        ``name``, ``pid``, ``status`` and ``isolation``.
        """
        if (script is None) == (command is None):
            raise ValueError("spawn() takes a script or a command, not both or neither")
        request: Dict[str, Any] = {"name": name}
        if script is not None:
            request["script"] = os.path.abspath(os.fspath(script))
        if command is not None:
            request["command"] = list(command)
        request.update(_present(
            args=list(args) if args is not None else None,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            python=python,
            sandboxed=sandboxed,
            network=_network(network),
            limits=wire_limits(limits) if limits is not None else None,
            restart_policy=restart_policy,
            max_restarts=max_restarts,
            restart_window=restart_window,
            permissions=dict(permissions) if permissions is not None else None,
            volumes=_volume_mounts(volumes) or None,
            template=template,
        ))
        return results.without_success(self.call_json(Opcode.SPAWN, request))  # type: ignore[return-value]

    def kill(self, agent: AgentRef, grace_ms: Optional[int] = None) -> Killed:
        """KILL: stops a live agent by id (int) or name (str): SIGTERM to its
        whole process tree, SIGKILL after ``grace_ms`` (default 5000)."""
        request = _agent_ref(agent)
        request.update(_present(grace_ms=grace_ms))
        return results.without_success(self.call_json(Opcode.KILL, request))  # type: ignore[return-value]

    def pause(self, agent: AgentRef) -> Dict[str, Any]:
        """PAUSE: freezes a live agent where it stands (no CPU, no signal
        handled) and returns once it does: ``{"id", "name", "state":
        "paused"}``. LIST shows it ``paused`` until :meth:`resume`. A
        session is paused with :meth:`pause_session`."""
        return self.call_json(Opcode.PAUSE, _agent_ref(agent))

    def resume(self, agent: AgentRef) -> Dict[str, Any]:
        """RESUME: lets a paused agent go on (``"state": "running"``)."""
        return self.call_json(Opcode.RESUME, _agent_ref(agent))

    def list_agents(self) -> List[Agent]:
        """LIST: every agent you may see (live, and recently ended), with
        its state, exit code or signal, restarts, limits, and memory and CPU
        figures read from its cgroup."""
        return self.call_json(Opcode.LIST)

    def logs(self, agent: AgentRef, lines: Optional[int] = None) -> str:
        """LOGS: the last ``lines`` lines (default 100) of an agent's log
        (what it wrote to stdout and stderr), by id or name."""
        request = _agent_ref(agent)
        request.update(_present(lines=lines))
        return self.call_json(Opcode.LOGS, request)["text"]

    def follow_logs(self, agent: AgentRef, lines: Optional[int] = None) -> Iterator[str]:
        """LOGS, followed: the last ``lines`` lines, then each piece of text
        the agent writes as it comes. The iterator ends when the agent has
        ended and its log is read to the end."""
        request = _agent_ref(agent)
        request.update(_present(lines=lines))
        reply = self.call_json(Opcode.LOGS, request)
        while True:
            if reply["text"]:
                yield reply["text"]
            if reply["ended"]:
                return
            follow = {"id": reply["id"], "after": reply["offset"], "follow": True,
                      "wait_ms": LOG_FOLLOW_WAIT_MS}
            reply = self.call_json(Opcode.LOGS, follow, deadline_ms=LOG_FOLLOW_WAIT_MS)

    def net(self, agent: AgentRef) -> Dict[str, Any]:
        """NET: an agent's network policy (``network``) and its connection
        record through the kernel's egress proxy: ``totals`` (``allowed``,
        ``refused``, ``bytes_out``, ``bytes_in``) and the newest
        ``attempts``, each with its host, port, address, whether it was
        allowed and why not, bytes each way and duration."""
        request = _agent_ref(agent)
        request["op"] = "show"
        return self.call_json(Opcode.NET, request)

    def set_network(self, agent: AgentRef, policy: Mapping[str, Any]) -> Dict[str, Any]:
        """NET ``set``: replaces a running agent's policy (``{"allow":
        [...], "deny": [...]}``), within your own; its descendants are
        narrowed with it, and open connections the new policy refuses are
        closed. Returns what :meth:`net` does, with the new policy."""
        request = _agent_ref(agent)
        request.update(op="set", network=dict(policy))
        return self.call_json(Opcode.NET, request)

    # -- files ------------------------------------------------------------

    def read_file(self, path: str) -> Dict[str, Any]:
        """READ: the text of a regular file in your own view (an agent's:
        its sandbox's), read with your own rights: ``content``, ``size``."""
        return self.call_json(Opcode.READ, {"path": path})

    def write_file(self, path: str, content: str, mode: str = "write") -> Dict[str, Any]:
        """WRITE: ``content`` into a regular file in your own view, replacing
        it (``mode="write"``) or after its end (``"append"``), making
        missing directories: ``bytes_written``."""
        return self.call_json(Opcode.WRITE, {"path": path, "content": content, "mode": mode})

    # -- asynchronous EXEC -------------------------------------------------

    def exec_async(
        self,
        code: str,
        language: Language = "python",
        *,
        request_id: Optional[int] = None,
        timeout_ms: Optional[int] = None,
    ) -> Dict[str, Any]:
        """EXEC with ``"async": true``: the run becomes a TASK of yours and
        this returns at once with its ``request_id`` (yours, or one the
        kernel made) and ``task_id``; :meth:`poll_async` hands over its
        reply once it is done."""
        request: Dict[str, Any] = {"code": code, "language": language, "async": True}
        request.update(_present(request_id=request_id, timeout_ms=timeout_ms))
        return self.call_json(Opcode.EXEC, request)

    def poll_async(self, max_results: int = 10) -> Dict[str, Any]:
        """ASYNC_POLL: your asynchronous requests that are done, oldest
        first, each handed over once: ``results`` of ``request_id`` and
        ``payload`` (the EXEC reply as a JSON string)."""
        return self.call_json(Opcode.ASYNC_POLL, {"max": max_results})

    # -- record and replay -------------------------------------------------

    def start_recording(
        self,
        include_think: bool = False,
        include_http: bool = False,
        include_exec: bool = False,
        max_entries: Optional[int] = None,
        filter_agents: Optional[Sequence[int]] = None,
    ) -> Dict[str, Any]:
        """RECORD_START: record your calls and those of the agents you see
        (or only ``filter_agents`` among them), secrets redacted."""
        request: Dict[str, Any] = {"include_think": include_think,
                                   "include_http": include_http, "include_exec": include_exec}
        request.update(_present(max_entries=max_entries,
                                filter_agents=list(filter_agents) if filter_agents else None))
        return self.call_json(Opcode.RECORD_START, request)

    def stop_recording(self) -> Dict[str, Any]:
        """RECORD_STOP: ``entry_count``; the recording stays for export."""
        return self.call_json(Opcode.RECORD_STOP, {})

    def get_recording_status(self, export: bool = False) -> Dict[str, Any]:
        """RECORD_STATUS: ``state`` (``RECORDING`` or ``IDLE``),
        ``entry_count``, and with ``export`` the ``recording`` as a JSON
        string."""
        return self.call_json(Opcode.RECORD_STATUS, {"export": export})

    def start_replay(self, recording: str) -> Dict[str, Any]:
        """REPLAY_START: re-issues a recording's NOOP and state store calls,
        as you; the reply comes once they are done."""
        return self.call_json(Opcode.REPLAY_START, {"recording": recording})

    def get_replay_status(self) -> Dict[str, Any]:
        """REPLAY_STATUS: your last replay's figures."""
        return self.call_json(Opcode.REPLAY_STATUS, {})

    # -- HTTP -------------------------------------------------------------

    def http(
        self,
        url: str,
        method: str = "GET",
        headers: Optional[Mapping[str, str]] = None,
        body: Optional[str] = None,
        timeout: Optional[int] = None,
    ) -> Dict[str, Any]:
        """HTTP: the kernel makes this request for you, to what your network
        policy allows (every redirect decided again): ``status_code``,
        ``headers``, ``body`` (base64 when ``body_encoding`` says so) and
        the ``url`` that answered. ``timeout`` is in seconds (default 30)."""
        request: Dict[str, Any] = {"url": url, "method": method}
        if headers:
            request["headers"] = dict(headers)
        if body is not None:
            request["body"] = body
        if timeout is not None:
            request["timeout"] = timeout
        return self.call_json(Opcode.HTTP, request)

    # -- state store ------------------------------------------------------

    def store(self, key: str, value: Any, scope: str = "global", ttl: Optional[float] = None) -> Dict[str, Any]:
        """STORE: ``value`` (any JSON) under ``key``, in your tree's
        ``global`` scope (shared with the operator and every agent of
        your tree) or your own ``agent`` scope; ``ttl`` seconds until it
        expires. Returns ``key``, ``scope`` (and ``expires_at``)."""
        request: Dict[str, Any] = {"key": key, "value": value, "scope": scope}
        if ttl is not None:
            request["ttl"] = ttl
        return self.call_json(Opcode.STORE, request)

    def fetch(self, key: str, scope: Optional[str] = None) -> Dict[str, Any]:
        """FETCH: ``exists``, ``value`` and the ``scope`` it was found in;
        without ``scope`` your own key first, then your tree's."""
        return self.call_json(Opcode.FETCH, _key_request(key, scope))

    def delete_key(self, key: str, scope: Optional[str] = None) -> Dict[str, Any]:
        """DELETE: ``deleted`` — the key :meth:`fetch` would have read."""
        return self.call_json(Opcode.DELETE, _key_request(key, scope))

    def list_keys(self, prefix: str = "", scope: Optional[str] = None) -> Dict[str, Any]:
        """KEYS: the keys you see that start with ``prefix``, sorted:
        ``keys``, ``count``, and ``truncated`` past 1000."""
        request: Dict[str, Any] = {"prefix": prefix}
        if scope is not None:
            request["scope"] = scope
        return self.call_json(Opcode.KEYS, request)

    # -- names and messages -----------------------------------------------

    def register_name(self, name: str) -> Dict[str, Any]:
        """REGISTER: ``name`` is yours to be messaged by, in your operator's
        tree (one name each: registering again replaces it; an agent's
        SPAWN name is always its own). Returns ``agent_id`` — your id, which
        your messages carry — and ``name``."""
        return self.call_json(Opcode.REGISTER, {"name": name})

    def send_message(
        self, message: Any, to: Optional[int] = None, to_name: Optional[str] = None
    ) -> Dict[str, Any]:
        """SEND: ``message`` (any JSON) to the mailbox of agent or
        connection ``to``, or of the one named ``to_name``. Returns
        ``delivered_to``; a full mailbox answers ``busy``."""
        request: Dict[str, Any] = {"message": message}
        if to is not None:
            request["to"] = to
        if to_name is not None:
            request["to_name"] = to_name
        return self.call_json(Opcode.SEND, request)

    def recv_messages(self, max_messages: int = 10) -> Dict[str, Any]:
        """RECV: up to ``max_messages`` (at most 100) of your messages,
        oldest first, without waiting: ``messages`` (each ``from_id``,
        ``from_name``, ``from_kind``, ``message``, ``age_ms``), ``count``
        and ``remaining``."""
        return self.call_json(Opcode.RECV, {"max": max_messages})

    def broadcast(self, message: Any, include_self: bool = False) -> Dict[str, Any]:
        """BROADCAST: ``message`` to everyone you may message (and you,
        with ``include_self``). Returns ``delivered_count`` and
        ``full_count`` (mailboxes that were full)."""
        return self.call_json(Opcode.BROADCAST, {"message": message, "include_self": include_self})

    # -- events -----------------------------------------------------------

    def subscribe(self, event_types: List[str]) -> Dict[str, Any]:
        """SUBSCRIBE this connection to ``event_types``: the kernel's
        (``AGENT_SPAWNED``, ``AGENT_EXITED``, ...), ``CUSTOM`` for every
        CUSTOM event, or a CUSTOM event's own type name. Returns
        ``subscribed``. Subscriptions end with the connection."""
        return self.call_json(Opcode.SUBSCRIBE, {"event_types": list(event_types)})

    def unsubscribe(self, event_types: Optional[List[str]] = None) -> Dict[str, Any]:
        """UNSUBSCRIBE from ``event_types`` (``None``: from all). Returns
        ``unsubscribed`` and the ``subscribed`` left."""
        if event_types is None:
            return self.call_json(Opcode.UNSUBSCRIBE, {"all": True})
        return self.call_json(Opcode.UNSUBSCRIBE, {"event_types": list(event_types)})

    def poll_events(self, max_events: int = 10) -> Dict[str, Any]:
        """POLL: up to ``max_events`` queued events (at most 500), oldest
        first: ``events`` (each ``type``, ``data``, ``source_agent_id``,
        ``timestamp``; ``custom_type`` for CUSTOM ones), ``count``,
        ``dropped`` (lost to a full queue since the last POLL) and
        ``pending``."""
        return self.call_json(Opcode.POLL, {"max": max_events})

    def emit_event(self, event_type: str, data: Any = None) -> Dict[str, Any]:
        """EMIT a CUSTOM event of your own ``event_type`` carrying
        ``data`` to the subscribers that may see you. Returns
        ``delivered_to``. The kernel's own types are refused."""
        return self.call_json(
            Opcode.EMIT, {"event_type": event_type, "data": {} if data is None else data}
        )

    # -- permissions ------------------------------------------------------

    def get_permissions(self) -> Dict[str, Any]:
        """GET_PERMS: what this caller may do now — ``permissions`` with
        ``level`` (``unrestricted``, ``standard``, ``readonly``,
        ``minimal`` or ``custom``) and each switch (``think``, ``exec``,
        ``spawn``, ``task``, ``read``, ``write``, ``http``)."""
        return self.call_json(Opcode.GET_PERMS, {})

    def set_permissions(
        self,
        level: Optional[str] = None,
        permissions: Optional[Mapping[str, bool]] = None,
        agent_id: Optional[int] = None,
    ) -> Dict[str, Any]:
        """SET_PERMS: lowers this caller (an operator: this connection
        only), or an agent it manages with its descendants, to a ``level``
        or by ``can_*`` switches (``{"can_exec": False}``). Nothing is ever
        raised: ``unrestricted`` changes nothing. Returns what
        :meth:`get_permissions` does, after the change."""
        request: Dict[str, Any] = {}
        if level is not None:
            request["level"] = level
        if permissions is not None:
            request["permissions"] = dict(permissions)
        if agent_id is not None:
            request["agent_id"] = agent_id
        return self.call_json(Opcode.SET_PERMS, request)

    def delegate(self, name: str) -> Dict[str, Any]:
        """DELEGATE: this operator connection speaks, from now until it
        closes, for the delegate principal ``name`` (1 to 48 of ``A-Z a-z
        0-9 _ . -``). What it creates then — sessions, volumes, snapshots,
        tasks — is that delegate's alone; it reaches only EXEC, THINK,
        TASK, PAUSE and RESUME, within what this operator has. Returns
        ``{"agent_id", "principal": {"kind": "delegate", "name", "of"}}``."""
        return self.call_json(Opcode.DELEGATE, {"delegate": name})

    def nodes(self) -> Dict[str, Any]:
        """FLEET ``nodes`` (operators; a node in a fleet): ``{"node": this
        node's name, "nodes": [...]}``, each node with ``name``,
        ``advertise``, ``alive``, ``lease_age_ms``, ``draining``,
        ``agents``, ``runs``, ``load``, ``version``, ``reads_schema`` and
        ``started_at``. ``unavailable`` when this node has no fleet or
        cannot reach its database."""
        return results.without_success(self.call_json(Opcode.FLEET, {"op": "nodes"}))

    def drain_node(self, name: str, draining: bool = True) -> Dict[str, Any]:
        """FLEET ``drain`` (or, with ``draining=False``, ``undrain``;
        operators): node ``name`` takes no new fleet work (or takes it
        again). Returns ``{"node", "draining"}``; ``not_found`` for a node
        the fleet does not know."""
        op = "drain" if draining else "undrain"
        return results.without_success(self.call_json(Opcode.FLEET, {"op": op, "node": name}))

    # -- audit log --------------------------------------------------------

    def get_audit_log(
        self,
        category: Optional[str] = None,
        agent_id: Optional[int] = None,
        since_id: int = 0,
        limit: int = 100,
    ) -> Dict[str, Any]:
        """GET_AUDIT_LOG: the entries you may read after ``since_id``,
        oldest first, at most ``limit`` (capped at 1000), optionally of one
        ``category`` (``SECURITY``, ``AGENT_LIFECYCLE``, ``SYSCALL``, ...)
        or about one agent. Returns ``entries`` (each with ``id``,
        ``timestamp``, ``category``, ``event_type``, ``agent_id``,
        ``agent_name``, ``principal``, ``success``, ``details``),
        ``count`` and ``more`` (ask again from the last ``id``)."""
        request: Dict[str, Any] = {"limit": limit}
        if category is not None:
            request["category"] = category
        if agent_id is not None:
            request["agent_id"] = agent_id
        if since_id:
            request["since_id"] = since_id
        return self.call_json(Opcode.GET_AUDIT_LOG, request)

    def set_audit_config(self, **switches: Any) -> Dict[str, Any]:
        """SET_AUDIT_CONFIG (operators): ``max_entries`` (at most the
        kernel's ``audit.max_entries``) and the ``log_*`` switches
        (``log_syscalls`` records TOOL calls; ``log_security`` and
        ``log_lifecycle`` cannot be turned off). Returns ``config``, what
        is in force."""
        return self.call_json(Opcode.SET_AUDIT_CONFIG, dict(switches))

    # -- figures ----------------------------------------------------------

    def system_metrics(self) -> Dict[str, Any]:
        """SYSTEM_METRICS (operators): the host's ``cpu`` (``percent``,
        ``count``, ``load_avg``), ``memory``, ``disk`` and ``network``."""
        return self.call_json(Opcode.SYSTEM_METRICS, {})

    def agent_metrics(self, agent_id: Optional[int] = None) -> Dict[str, Any]:
        """AGENT_METRICS: an agent's ``process``, ``cgroup`` and
        ``kernel_stats`` (an agent's own by default)."""
        return self.call_json(Opcode.AGENT_METRICS,
                              {} if agent_id is None else {"agent_id": agent_id})

    def all_agent_metrics(self) -> Dict[str, Any]:
        """ALL_AGENT_METRICS: :meth:`agent_metrics` of every agent you may
        see, as ``agents`` with their ``count``."""
        return self.call_json(Opcode.ALL_AGENT_METRICS, {})

    def cgroup_metrics(self, agent: Optional[AgentRef] = None) -> Dict[str, Any]:
        """CGROUP_METRICS: an agent's cgroup (by name or id; an agent's own
        by default): ``cpu``, ``memory``, ``pids``, every figure a number."""
        return self.call_json(Opcode.CGROUP_METRICS,
                              {} if agent is None else {"cgroup_path": str(agent)})

    # -- think ------------------------------------------------------------

    def think(
        self,
        prompt: Optional[str] = None,
        system: Optional[str] = None,
        model: Optional[str] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        *,
        messages: Optional[Sequence[Mapping[str, str]]] = None,
    ) -> Thought:
        """THINK: asks the kernel's shared LLM and returns its answer.

        Give a ``prompt``, a chat history in ``messages`` (dicts with
        ``role`` and ``content``), or both (the prompt then follows the
        history as the last user turn). Returns ``content``, ``tokens``,
        ``usage``, ``model``, ``queue_ms`` and ``latency_ms``. The client
        waits for the kernel's own THINK deadline (two minutes by default)
        even when its ``timeout`` is shorter.
        """
        if not prompt and not messages:
            raise ValueError("think() needs a prompt or messages")
        request = _present(
            prompt=prompt,
            messages=[dict(m) for m in messages] if messages is not None else None,
            system=system,
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        reply = self.call_json(Opcode.THINK, request, deadline_ms=DEFAULT_THINK_DEADLINE_MS)
        return results.thought(reply)

    # -- exec -------------------------------------------------------------

    def exec(
        self,
        code: str,
        language: Language = "python",
        *,
        session: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, Union[bytes, str]]] = None,
        collect: Optional[Sequence[str]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        network: Union[bool, Mapping[str, Any], None] = None,
        permissions: Optional[Mapping[str, Any]] = None,
        template: Optional[str] = None,
        volumes: Optional[Sequence[VolumeSpec]] = None,
    ) -> Execution:
        """EXEC: runs ``code`` (``language`` ``python`` or ``bash``) in a
        fresh, isolated sandbox, or in ``session``'s, and returns how it
        ended. Code that fails is a result with ``ok`` false, not an
        exception; the request raises only when the kernel refused it.
        ``files`` (path under ``/workspace`` to bytes) are written before
        the run; the ``collect`` paths come back in ``files`` as bytes.
        ``volumes`` are mounted into the run (a session's: when its
        interpreter starts), each a dict ``{"name", "path", "read_only"}``
        or a ``(name, path)`` or ``(name, path, read_only)`` tuple: yours,
        or given to you, at ``/data`` or beneath ``/data``, ``/mnt`` or
        ``/workspace``.
        """
        request: Dict[str, Any] = {"code": code, "language": language}
        request.update(_present(
            session=session,
            template=template,
            volumes=_volume_mounts(volumes) or None,
            timeout_ms=timeout_ms,
            env=dict(env) if env is not None else None,
            files=results.base64_files(files) if files is not None else None,
            collect=list(collect) if collect is not None else None,
            limits=wire_limits(limits, period=False) if limits is not None else None,
            network=_network(network),
            permissions=dict(permissions) if permissions is not None else None,
        ))
        deadline = timeout_ms if timeout_ms is not None else DEFAULT_EXEC_DEADLINE_MS
        reply = decode_json(self.call(Opcode.EXEC, request, deadline_ms=deadline), Opcode.EXEC)
        if reply.get("code"):
            # Refused before any code ran: a run whose code failed has no code.
            raise_if_failed(reply)
        return results.execution(reply)

    def sessions(self, *, usage: bool = False) -> List[Session]:
        """EXEC ``sessions``: your sessions; with ``usage``, what each
        one's sandbox uses now (``usage``, read from its cgroup)."""
        request: Dict[str, Any] = {"op": "sessions"}
        if usage:
            request["usage"] = True
        return self.call_json(Opcode.EXEC, request)["sessions"]

    def open_session(
        self,
        session: str,
        *,
        template: Optional[str] = None,
        network: Any = None,
        limits: Optional[Mapping[str, Any]] = None,
        volumes: Optional[Sequence[Mapping[str, Any]]] = None,
        permissions: Optional[Mapping[str, Any]] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        lifetime_ms: Optional[int] = None,
        then: Optional[str] = None,
    ) -> Dict[str, Any]:
        """EXEC ``open``: opens ``session`` without running code — its
        template, network, limits, volumes and permissions as a run's (its
        later runs must ask the same). ``env`` is the environment of the
        processes started in it (never listed), ``labels`` what it is
        listed with; after ``lifetime_ms`` the kernel closes it, or with
        ``then="hibernate"`` hibernates it. A live session of that name is
        ``AlreadyExists``; a stored one opens on a fresh interpreter.
        Returns ``{"session", "state", "fresh_interpreter", "ends_at"}``."""
        request: Dict[str, Any] = {"op": "open", "session": session}
        request.update(_present(
            template=template, network=network,
            limits=dict(limits) if limits is not None else None,
            volumes=list(volumes) if volumes is not None else None,
            permissions=dict(permissions) if permissions is not None else None,
            env=dict(env) if env is not None else None,
            labels=dict(labels) if labels is not None else None,
            lifetime_ms=lifetime_ms, then=then,
        ))
        return self.call_json(Opcode.EXEC, request)

    def set_lifetime(
        self, session: str, lifetime_ms: Optional[int], then: Optional[str] = None
    ) -> Optional[str]:
        """EXEC ``lifetime``: the session ends ``lifetime_ms`` from now
        (closed, or with ``then="hibernate"`` hibernated); ``None`` clears
        its lifetime. Returns when it ends now (RFC 3339), or ``None``."""
        request: Dict[str, Any] = {"op": "lifetime", "session": session, "lifetime_ms": lifetime_ms}
        request.update(_present(then=then))
        return self.call_json(Opcode.EXEC, request)["ends_at"]

    def start_process(
        self,
        session: str,
        argv: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: bool = False,
        pty: Optional[Mapping[str, int]] = None,
        tag: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> Dict[str, Any]:
        """EXEC ``start``: runs ``argv`` inside ``session``, beside its
        interpreter and its other processes (same files, network and
        limits), with the session's environment and ``env`` over it.
        ``stdin=True`` keeps its input open for :meth:`send_input`;
        ``pty={"cols": 80, "rows": 24}`` runs it on a terminal of that size
        (one ``pty`` stream, its input open, :meth:`resize` to change it);
        the kernel kills its process group after ``timeout_ms``. Returns
        once it runs: ``{"session", "pid", "tag"}``."""
        request: Dict[str, Any] = {"op": "start", "session": session, "argv": list(argv)}
        request.update(_present(
            env=dict(env) if env is not None else None, cwd=cwd, stdin=stdin or None,
            pty=dict(pty) if pty is not None else None, tag=tag, timeout_ms=timeout_ms,
        ))
        return self.call_json(Opcode.EXEC, request)

    def processes(self, session: str) -> List[Dict[str, Any]]:
        """EXEC ``processes``: the session's processes, running ones
        first, then those ended lately, each with its state and how it
        ended."""
        return self.call_json(Opcode.EXEC, {"op": "processes", "session": session})["processes"]

    def process_output(
        self,
        session: str,
        pid: Optional[int] = None,
        *,
        tag: Optional[str] = None,
        after: Optional[int] = None,
        follow: bool = False,
        wait_ms: Optional[int] = None,
    ) -> Dict[str, Any]:
        """EXEC ``output``: what a process (by ``pid`` or ``tag``) printed
        after offset ``after``; with ``follow``, waits up to ``wait_ms``
        for more. Each chunk's ``data`` comes back decoded (bytes); the
        reply's ``offset`` is the next ``after``, and ``ended`` says the
        process has ended and nothing more will come."""
        request: Dict[str, Any] = {"op": "output", "session": session}
        request.update(_present(pid=pid, tag=tag, after=after, follow=follow or None,
                                wait_ms=wait_ms))
        reply = self.call_json(Opcode.EXEC, request)
        for chunk in reply["chunks"]:
            chunk["data"] = base64.b64decode(chunk["data"])
        return reply

    def send_input(self, session: str, pid: int, data: bytes, eof: bool = False) -> int:
        """EXEC ``input``: ``data`` for a process's stdin (it was started
        with ``stdin=True``); ``eof`` closes it after them. Returns the
        bytes taken."""
        request: Dict[str, Any] = {"op": "input", "session": session, "pid": pid,
                                   "data": base64.b64encode(data).decode("ascii")}
        request.update(_present(eof=eof or None))
        return self.call_json(Opcode.EXEC, request)["written"]

    def resize(self, session: str, pid: int, *, cols: int, rows: int) -> bool:
        """EXEC ``resize``: a new size for the PTY a process runs on (its
        foreground job gets ``SIGWINCH``)."""
        request = {"op": "resize", "session": session, "pid": pid, "cols": cols, "rows": rows}
        return self.call_json(Opcode.EXEC, request)["success"]

    def signal_process(self, session: str, pid: int, signal: str = "SIGTERM") -> bool:
        """EXEC ``signal``: sends ``signal`` (``SIGTERM``, ``SIGKILL``,
        ``SIGINT``, ...) to the process's group. Returns whether it was
        there to be signalled."""
        request = {"op": "signal", "session": session, "pid": pid, "signal": signal}
        return self.call_json(Opcode.EXEC, request)["signalled"]

    def run_process(
        self, session: str, argv: Sequence[str], *, wait_ms: int = 10_000, **start: Any
    ) -> Dict[str, Any]:
        """Starts ``argv`` in ``session`` (as :meth:`start_process`) and
        follows its output to its end. Returns ``{"pid", "stdout",
        "stderr", "exit_code", "signal", "timed_out", "reason"}``, the
        streams as bytes."""
        pid = self.start_process(session, argv, **start)["pid"]
        streams: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        after = 0
        while True:
            reply = self.process_output(session, pid, after=after, follow=True, wait_ms=wait_ms)
            for chunk in reply["chunks"]:
                streams.setdefault(chunk["stream"], bytearray()).extend(chunk["data"])
            after = reply["offset"]
            if reply["ended"]:
                ended = {key: reply.get(key) for key in ("exit_code", "signal", "timed_out", "reason")}
                return {"pid": pid, **{k: bytes(v) for k, v in streams.items()}, **ended}

    def file_stat(self, session: str, path: str) -> Dict[str, Any]:
        """EXEC ``stat``: what ``path`` is inside ``session`` (as ``lstat``
        sees it there): ``{"name", "path", "type", "size", "mode",
        "permissions", "owner", "group", "modified_at", "symlink_target",
        "metadata"?}``."""
        request = {"op": "stat", "session": session, "path": path}
        return self.call_json(Opcode.EXEC, request)["entry"]

    def file_list(self, session: str, path: str, *, depth: int = 1) -> Dict[str, Any]:
        """EXEC ``list``: a directory's entries in ``session``, ``depth``
        levels down (1 to 16). Returns ``{"entries", "truncated"}``
        (truncated past 10 000 entries)."""
        request = {"op": "list", "session": session, "path": path, "depth": depth}
        reply = self.call_json(Opcode.EXEC, request)
        return {"entries": reply["entries"], "truncated": reply["truncated"]}

    def file_mkdir(self, session: str, path: str, *, parents: bool = False) -> bool:
        """EXEC ``mkdir``: makes a directory in ``session`` (and those above
        it, with ``parents``). Returns whether it was made (``False``: one
        was there)."""
        request: Dict[str, Any] = {"op": "mkdir", "session": session, "path": path}
        request.update(_present(parents=parents or None))
        return self.call_json(Opcode.EXEC, request)["created"]

    def file_move(self, session: str, source: str, target: str) -> Dict[str, Any]:
        """EXEC ``move``: renames ``source`` to ``target`` in ``session``.
        Returns the entry at ``target``."""
        request = {"op": "move", "session": session, "from": source, "to": target}
        return self.call_json(Opcode.EXEC, request)["entry"]

    def file_remove(self, session: str, path: str) -> bool:
        """EXEC ``remove``: removes ``path`` in ``session``, a directory
        with all it holds."""
        request = {"op": "remove", "session": session, "path": path}
        return self.call_json(Opcode.EXEC, request)["removed"]

    def file_read(
        self, session: str, path: str, *, offset: int = 0, length: Optional[int] = None
    ) -> Dict[str, Any]:
        """EXEC ``read``: at most ``length`` bytes (default and cap 4 MiB)
        of a file in ``session`` from ``offset``. Returns ``{"data"
        (bytes), "offset", "size", "eof"}``."""
        request: Dict[str, Any] = {"op": "read", "session": session, "path": path,
                                   "offset": offset}
        request.update(_present(length=length))
        reply = self.call_json(Opcode.EXEC, request)
        return {"data": base64.b64decode(reply["data"]), "offset": reply["offset"],
                "size": reply["size"], "eof": reply["eof"]}

    def file_write(
        self,
        session: str,
        path: str,
        data: bytes,
        *,
        offset: int = 0,
        truncate: bool = True,
        parents: bool = False,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> Dict[str, Any]:
        """EXEC ``write``: ``data`` (at most 512 KiB) into a file in
        ``session`` at ``offset``, made if missing; the file ends where
        they end unless ``truncate=False``. ``metadata`` replaces the
        file's. Returns its entry."""
        request: Dict[str, Any] = {"op": "write", "session": session, "path": path,
                                   "data": base64.b64encode(data).decode("ascii"),
                                   "offset": offset, "truncate": truncate}
        request.update(_present(parents=parents or None,
                                metadata=dict(metadata) if metadata is not None else None))
        return self.call_json(Opcode.EXEC, request)["entry"]

    def file_watch(self, session: str, path: str, *, recursive: bool = False) -> str:
        """EXEC ``watch``: watches a directory of ``session`` (and those
        below, with ``recursive``) for changes. Returns the watch's name,
        for :meth:`file_events` and :meth:`file_unwatch`."""
        request: Dict[str, Any] = {"op": "watch", "session": session, "path": path}
        request.update(_present(recursive=recursive or None))
        return self.call_json(Opcode.EXEC, request)["watch"]

    def file_events(
        self,
        session: str,
        watch: str,
        *,
        after: Optional[int] = None,
        follow: bool = False,
        wait_ms: Optional[int] = None,
    ) -> Dict[str, Any]:
        """EXEC ``events``: what a watch saw after offset ``after``
        (``{"type", "path", "name"}`` each, ``type`` one of ``create``,
        ``write``, ``remove``, ``rename``, ``chmod``); with ``follow``,
        waits up to ``wait_ms`` for one. Returns ``{"events", "offset"
        (the next ``after``), "dropped", "ended"}``."""
        request: Dict[str, Any] = {"op": "events", "session": session, "watch": watch}
        request.update(_present(after=after, follow=follow or None, wait_ms=wait_ms))
        reply = self.call_json(Opcode.EXEC, request)
        return {key: reply[key] for key in ("events", "offset", "dropped", "ended")}

    def file_unwatch(self, session: str, watch: str) -> bool:
        """EXEC ``unwatch``: ends a watch; its waiting follows are
        answered."""
        request = {"op": "unwatch", "session": session, "watch": watch}
        return self.call_json(Opcode.EXEC, request)["removed"]

    def download(self, session: str, path: str) -> bytes:
        """A whole file of ``session``, read 4 MiB at a time, up to the
        size it had when first read (one that grows as it is read is not
        read for ever)."""
        out = bytearray()
        size: Optional[int] = None
        while True:
            part = self.file_read(session, path, offset=len(out))
            out.extend(part["data"])
            size = part["size"] if size is None else size
            if part["eof"] or not part["data"] or len(out) >= size:
                return bytes(out)

    def upload(
        self, session: str, path: str, data: bytes, *, parents: bool = True,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> Dict[str, Any]:
        """Writes ``data`` to ``path`` in ``session`` in 512 KiB parts,
        beside it first and then moved into place, so a failed upload
        leaves the old file. Returns its entry."""
        chunk = 512 << 10
        # Beside it, under a name short enough whatever its own is.
        partial = f"{path.rsplit('/', 1)[0]}/.agentos-upload-{os.urandom(6).hex()}"
        try:
            for offset in range(0, max(len(data), 1), chunk):
                last = offset + chunk >= len(data)
                self.file_write(session, partial, data[offset:offset + chunk], offset=offset,
                                parents=parents and offset == 0,
                                metadata=metadata if last else None)
            return self.file_move(session, partial, path)
        except BaseException:
            try:
                self.file_remove(session, partial)
            except AgentOSError:
                pass
            raise

    def close_session(self, session: str) -> bool:
        """EXEC ``close``: ends a session and deletes its workspace; returns
        whether it was open."""
        return self.call_json(Opcode.EXEC, {"op": "close", "session": session})["closed"]

    def snapshot(self, session: str, name: str, *, state: bool = False) -> Snapshot:
        """EXEC ``snapshot``: saves a session's files — its ``/workspace``
        and its home (installed packages; not ``.cache``) — as ``name``, on
        the kernel's disk, replacing a snapshot of that name. With
        ``state``, the interpreter's picklable globals too (modules by
        name). Returns the snapshot (``name``, ``bytes``, ``created_at``,
        ``state``: whether it kept globals) with ``left_out``, the paths not
        saved (symlinks, special files), and ``not_saved``, each global
        that could not be (``"name: Type: why"``)."""
        request: Dict[str, Any] = {"op": "snapshot", "session": session, "name": name}
        if state:
            request["state"] = True
        reply = self.call_json(Opcode.EXEC, request)
        return {
            **_snapshot(reply["snapshot"]),
            "left_out": reply.get("left_out", []),
            "not_saved": reply.get("not_saved", []),
        }

    def restore(self, session: str, name: str, *, into: Optional[str] = None) -> List[str]:
        """EXEC ``restore``: replaces a session's files with snapshot
        ``name``'s and restarts its interpreter, with the snapshot's
        globals if it kept them. With ``into``, makes a new session of that
        name from the snapshot instead (a branch: ``session`` is left as it
        is; a name in use raises ``AlreadyExists``), whose first run starts
        with the snapshot's globals. Returns the globals that could not be
        loaded (``"name: why"``)."""
        request: Dict[str, Any] = {"op": "restore", "session": session, "name": name}
        request.update(_present(into=into))
        return self.call_json(Opcode.EXEC, request).get("left_out", [])

    def snapshots(self, session: str) -> List[Snapshot]:
        """EXEC ``snapshots``: a session's snapshots, oldest first, each
        with ``state`` saying whether it keeps the interpreter's globals."""
        request = {"op": "snapshots", "session": session}
        return [_snapshot(taken) for taken in self.call_json(Opcode.EXEC, request)["snapshots"]]

    def remove_snapshot(self, session: str, name: str) -> bool:
        """EXEC ``remove_snapshot``: deletes one of a session's snapshots
        (closing the session deletes them all); one it does not have raises
        ``NotFound``."""
        request = {"op": "remove_snapshot", "session": session, "name": name}
        return self.call_json(Opcode.EXEC, request)["removed"]

    def pause_session(self, session: str, *, hibernate: bool = False) -> PausedSession:
        """PAUSE a session: its interpreter frozen by the cgroup freezer
        (no CPU, a run's time limit stopped) until :meth:`resume_session`
        — ``{"session", "state": "paused", "not_saved": []}``. Its owner's
        end, its idle timeout and running out of memory still end it. With
        ``hibernate``, its globals are saved and its interpreter ended,
        freeing its memory (``"state": "hibernated"``); its next run or
        :meth:`resume_session` brings it back with them, but for those
        named in ``not_saved`` (``"name: Type: why"``)."""
        request: Dict[str, Any] = {"session": session}
        if hibernate:
            request["hibernate"] = True
        return _paused(self.call_json(Opcode.PAUSE, request))

    def resume_session(self, session: str) -> PausedSession:
        """RESUME a paused or hibernated session: ``{"session", "state":
        "ready", "not_saved": []}``."""
        return _paused(self.call_json(Opcode.RESUME, {"session": session}))

    def templates(self) -> List[Template]:
        """EXEC ``templates``: the templates there are (built by operators,
        usable by all)."""
        return self.call_json(Opcode.EXEC, {"op": "templates"})["templates"]

    def build_template(
        self,
        template: str,
        packages: Sequence[str] = (),
        *,
        requirements: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> Execution:
        """EXEC ``build_template`` (operators): pip installs ``packages``
        and a ``requirements`` file's text into a new read-only environment,
        reaching only the kernel's package index. Returns the build's run:
        ``template`` describes the template once built; a build that failed
        is a result with ``ok`` false and pip's output, not an exception."""
        request: Dict[str, Any] = {"op": "build_template", "template": template}
        request.update(_present(
            packages=list(packages) or None,
            requirements=requirements,
            timeout_ms=timeout_ms,
        ))
        deadline = timeout_ms if timeout_ms is not None else DEFAULT_BUILD_DEADLINE_MS
        reply = decode_json(self.call(Opcode.EXEC, request, deadline_ms=deadline), Opcode.EXEC)
        if reply.get("code"):
            # Refused, or built but not kept: a build whose pip failed has
            # no code.
            raise_if_failed(reply)
        return results.execution(reply)

    def remove_template(self, template: str) -> bool:
        """EXEC ``remove_template`` (the operator who built it, or root):
        returns whether there was one; refused (``Busy``) while a session
        uses it."""
        request = {"op": "remove_template", "template": template}
        return self.call_json(Opcode.EXEC, request)["removed"]

    def volumes(self) -> List[Volume]:
        """EXEC ``volumes``: your volumes, then those you were given by
        whoever started you."""
        return self.call_json(Opcode.EXEC, {"op": "volumes"})["volumes"]

    def create_volume(self, volume: str, bytes: Optional[Size] = None) -> Volume:
        """EXEC ``create_volume``: makes an empty volume of ``bytes`` (an
        int, or a size such as ``"512M"``; left out, the kernel's
        ``exec.volume_bytes``, 1 GiB; at least 16 MiB), yours until you
        remove it (an agent's or a run's own end with it). A write past its
        size fails with ``ENOSPC``."""
        request: Dict[str, Any] = {"op": "create_volume", "volume": volume}
        if bytes is not None:
            request["bytes"] = parse_size(bytes)
        return self.call_json(Opcode.EXEC, request)["volume"]

    def remove_volume(self, volume: str) -> bool:
        """EXEC ``remove_volume``: removes a volume of yours and its files
        (a sandbox that has it mounted keeps it until it ends). One you
        were given raises ``PermissionDenied``, another's ``NotFound``."""
        request = {"op": "remove_volume", "volume": volume}
        return self.call_json(Opcode.EXEC, request)["removed"]

    # -- tools ------------------------------------------------------------

    def tools(self) -> List[Tool]:
        """TOOL ``list``: every tool you may use, the built-in servers
        ``llm`` and ``kernel`` among them."""
        return self.call_json(Opcode.TOOL, {"op": "list"})["tools"]

    def tool_servers(self) -> List[ToolServer]:
        """TOOL ``list``: every tool server and its state."""
        return self.call_json(Opcode.TOOL, {"op": "list"})["servers"]

    def search_tools(
        self, query: str, detail: SearchDetail = "summary", limit: int = 10
    ) -> List[Tool]:
        """TOOL ``search``: the tools you may use that match ``query``, best
        first. ``detail`` is ``name``, ``summary`` or ``full`` (with schemas)."""
        request = {"op": "search", "query": query, "detail": detail, "limit": limit}
        return self.call_json(Opcode.TOOL, request)["tools"]

    def call_tool(
        self, server: str, tool: str, /, *, timeout_ms: Optional[int] = None, **arguments: Any
    ) -> Any:
        """TOOL ``call``: calls ``tool`` of ``server`` with keyword arguments
        and returns its result (its structured result, else its text parsed
        as JSON, else its text). A tool's own error raises
        :class:`~agentos.ToolError`."""
        request: Dict[str, Any] = {"op": "call", "server": server, "tool": tool,
                                   "arguments": arguments}
        request.update(_present(timeout_ms=timeout_ms))
        deadline = timeout_ms if timeout_ms is not None else DEFAULT_TOOL_DEADLINE_MS
        return self.call_json(Opcode.TOOL, request, deadline_ms=deadline).get("result")

    # -- tasks ------------------------------------------------------------

    def dispatch(
        self, kind: TaskKind, request: Union[Mapping[str, Any], str],
        label: Optional[str] = None,
    ) -> str:
        """TASK ``dispatch``: starts ``request`` in the background and returns
        its task id at once. ``kind`` is ``exec`` (an EXEC run such as
        ``{"code": "print(1)"}``), ``think`` (a THINK payload, or a prompt
        string) or ``prompt`` (the kernel's code-writing loop)."""
        body: Dict[str, Any] = {"op": "dispatch", "kind": kind, "request": _task_request(request)}
        body.update(_present(label=label))
        return self.call_json(Opcode.TASK, body)["task_id"]

    def task_status(self, task_id: str) -> Task:
        """TASK ``status``: the task as it is now."""
        reply = self.call_json(Opcode.TASK, {"op": "status", "task_id": task_id})
        return results.task(reply["task"])

    def wait_task(self, task_id: str, timeout: Optional[float] = None) -> Task:
        """Waits until the task has ended and returns it, with its
        ``result``. Raises :class:`~agentos.Timeout` (a ``TimeoutError``)
        when ``timeout`` seconds pass first; the task goes on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait_ms = MAX_TASK_WAIT_MS if deadline is None else _ms_until(deadline)
            wait_ms = min(wait_ms, MAX_TASK_WAIT_MS)
            task = self._wait_request(task_id, wait_ms)
            if task["state"] in FINISHED_TASK_STATES:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"task {task_id} is still {task['state']} after {timeout}s")

    def as_completed(
        self, task_ids: Iterable[str], timeout: Optional[float] = None
    ) -> Iterator[Task]:
        """Yields each task, with its ``result``, as it ends. Raises
        :class:`~agentos.Timeout` when ``timeout`` seconds pass before all
        have ended."""
        pending = list(dict.fromkeys(task_ids))
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            wait_ms = COMPLETION_POLL_MS
            if deadline is not None:
                wait_ms = min(wait_ms, _ms_until(deadline))
            ended = [task for task in self._wait_many(pending, wait_ms)
                     if task["state"] in FINISHED_TASK_STATES]
            ended.sort(key=lambda task: task.get("finished_at") or "")
            for task in ended:
                pending.remove(task["task_id"])
                yield task
            if pending and deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"{len(pending)} tasks still going after {timeout}s: "
                              f"{', '.join(pending[:5])}")

    def list_tasks(
        self,
        state: Optional[TaskState] = None,
        kind: Optional[TaskKind] = None,
        limit: Optional[int] = None,
        before: Optional[str] = None,
        owner: Optional[AgentRef] = None,
    ) -> List[Task]:
        """TASK ``list``: your tasks, newest first (all of them, or the
        newest ``limit``); only those older than task ``before`` if given.
        An operator may pass ``owner``, an agent's id or name or ``"*"``
        for everyone's."""
        tasks: List[Task] = []
        while limit is None or len(tasks) < limit:
            page = MAX_TASK_PAGE if limit is None else min(MAX_TASK_PAGE, limit - len(tasks))
            body: Dict[str, Any] = {"op": "list", "limit": page}
            body.update(_present(state=state, kind=kind, before=before, owner=owner))
            reply = self.call_json(Opcode.TASK, body)
            tasks.extend(results.task(task) for task in reply["tasks"])
            before = reply.get("next")
            if before is None:
                break
        return tasks

    def cancel_task(self, task_id: str) -> bool:
        """TASK ``cancel``: stops a queued or running task (a running EXEC is
        killed with everything it started); returns whether it was still
        going."""
        return self.call_json(Opcode.TASK, {"op": "cancel", "task_id": task_id})["cancelled"]

    def run(
        self,
        prompt: str,
        *,
        max_iterations: Optional[int] = None,
        system: Optional[str] = None,
        session: Optional[str] = None,
        label: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Task:
        """The kernel's prompt-to-program loop, waited for: THINK writes
        code, EXEC runs it, the output goes back, until THINK answers
        (``completed``) or ``max_iterations`` (default 5) are spent
        (``failed``). Returns the task; ``result`` has ``answer``,
        ``iterations`` and ``checked`` (false, with ``unchecked_reason``,
        when the answer did not come from a run's output). Raises :class:`~agentos.Timeout` after ``timeout``
        seconds; the task goes on (see :meth:`wait_task`)."""
        request: Dict[str, Any] = {"prompt": prompt}
        request.update(_present(max_iterations=max_iterations, system=system, session=session))
        task_id = self.dispatch("prompt", request, label=label)
        return self.wait_task(task_id, timeout=timeout)

    def _wait_request(self, task_id: str, wait_ms: int) -> Task:
        body = {"op": "wait", "task_id": task_id, "timeout_ms": wait_ms}
        reply = self.call_json(Opcode.TASK, body, deadline_ms=wait_ms)
        return results.task(reply["task"])

    def _wait_many(self, task_ids: Sequence[str], wait_ms: int) -> List[Task]:
        """One TASK ``wait`` per task, pipelined: the kernel works on them at
        once, so a batch takes ``wait_ms`` at most, however many it holds.
        Batches keep the requests in flight under the kernel's limit; only
        the first waits, the rest look at how their tasks are now."""
        tasks: List[Task] = []
        for start in range(0, len(task_ids), COMPLETION_BATCH):
            batch = task_ids[start:start + COMPLETION_BATCH]
            batch_wait_ms = wait_ms if start == 0 else 0
            with self._lock:
                for task_id in batch:
                    self.send(Opcode.TASK, {"op": "wait", "task_id": task_id,
                                            "timeout_ms": batch_wait_ms})
                replies = [self.recv(deadline_ms=batch_wait_ms) for _ in batch]
            for reply in replies:
                value = decode_json(reply, Opcode.TASK)
                raise_if_failed(value)
                tasks.append(results.task(value["task"]))
        return tasks


def _present(**fields: Any) -> Dict[str, Any]:
    """The fields that were given (not ``None``)."""
    return {key: value for key, value in fields.items() if value is not None}


def _snapshot(taken: Mapping[str, Any]) -> Snapshot:
    """A snapshot as the kernel lists it, ``state`` said when false too
    (the wire leaves it out)."""
    return {**taken, "state": taken.get("state", False)}  # type: ignore[typeddict-item]


def _paused(reply: Mapping[str, Any]) -> PausedSession:
    """PAUSE's or RESUME's reply for a session, ``not_saved`` always a list."""
    paused = results.without_success(reply)
    return {**paused, "not_saved": paused.get("not_saved", [])}  # type: ignore[typeddict-item]


def _agent_ref(agent: AgentRef) -> Dict[str, Any]:
    """An agent named by id (int) or name (str), as a request's fields."""
    if isinstance(agent, bool) or not isinstance(agent, (int, str)):
        raise TypeError(f"an agent is named by its id (int) or name (str), not {agent!r}")
    return {"id": agent} if isinstance(agent, int) else {"name": agent}


def _network(network: Union[bool, Mapping[str, Any], None]) -> Any:
    return dict(network) if isinstance(network, Mapping) else network


def _volume_mounts(volumes: Optional[Sequence[VolumeSpec]]) -> Optional[List[Dict[str, Any]]]:
    """Volumes to mount as the wire takes them: each a dict (passed on as
    given, so the kernel names a field it does not know), or a ``(name,
    path)`` or ``(name, path, read_only)`` tuple made one."""
    if volumes is None:
        return None
    if isinstance(volumes, (str, Mapping)):
        raise TypeError(f"volumes is a list of volumes to mount, not {volumes!r}")
    mounts = []
    for volume in volumes:
        if isinstance(volume, Mapping):
            mounts.append(dict(volume))
        elif isinstance(volume, (tuple, list)) and len(volume) in (2, 3):
            read_only = volume[2] if len(volume) == 3 else False
            if not isinstance(read_only, bool):
                raise TypeError(f"a volume's read_only is True or False, not {read_only!r}")
            mounts.append({"name": volume[0], "path": volume[1], "read_only": read_only})
        else:
            raise TypeError(
                "a volume to mount is a dict with name, path and read_only, or a "
                f"(name, path) or (name, path, read_only) tuple, not {volume!r}"
            )
    return mounts


def _task_request(request: Union[Mapping[str, Any], str]) -> Any:
    """A task's request as the wire wants it. An EXEC run's ``files`` may
    hold bytes (base64-encoded here; a str is taken as already encoded, as
    on the wire), its ``limits`` sizes and ``cpus``, and its ``volumes``
    tuples, as :meth:`exec`'s."""
    if isinstance(request, str):
        return request
    body = dict(request)
    if isinstance(body.get("files"), Mapping):
        body["files"] = {
            path: results.base64_files({path: content})[path]
            if isinstance(content, (bytes, bytearray, memoryview)) else content
            for path, content in body["files"].items()
        }
    if isinstance(body.get("limits"), Mapping):
        body["limits"] = wire_limits(body["limits"], period=False)
    if isinstance(body.get("volumes"), (list, tuple)):
        body["volumes"] = _volume_mounts(body["volumes"])
    return body


def _ms_until(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))


def _key_request(key: str, scope: Optional[str]) -> Dict[str, Any]:
    """FETCH's and DELETE's request."""
    request: Dict[str, Any] = {"key": key}
    if scope is not None:
        request["scope"] = scope
    return request
