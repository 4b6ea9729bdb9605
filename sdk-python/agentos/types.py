"""The shapes of what :class:`~agentos.AgentOSClient` returns.

Each result is a plain ``dict`` at run time, typed here as a ``TypedDict``
so editors and type checkers know its keys, and with ``Literal`` types for
the words the protocol fixes (states, kinds). No result has a ``success``
key: a failure raises an :class:`~agentos.AgentOSError` instead.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict, Union

AgentState = Literal[
    "starting", "running", "paused", "exited", "killed", "oom_killed", "failed", "restarting"
]
RestartPolicy = Literal["never", "on-failure", "always"]
TaskState = Literal[
    "queued", "running", "completed", "failed", "cancelled", "timed_out", "interrupted"
]
TaskKind = Literal["exec", "think", "prompt"]
Language = Literal["python", "bash"]
ToolServerState = Literal["starting", "ready", "failed", "stopped"]
SearchDetail = Literal["name", "summary", "full"]
CgroupVersion = Literal["v1", "v2"]

#: The states a task does not leave.
FINISHED_TASK_STATES = frozenset(
    {"completed", "failed", "cancelled", "timed_out", "interrupted"}
)


class Features(TypedDict):
    """What works on this host right now."""

    think: bool
    exec: bool
    spawn: bool
    tools: bool
    task: bool
    cgroup: Optional[CgroupVersion]


class _HelloRequired(TypedDict):
    protocol_version: int
    kernel_version: str
    agent_id: int
    features: Features


class Hello(_HelloRequired, total=False):
    """HELLO: who you are to the kernel and what it offers. ``principal`` is
    ``{"kind": "operator", "uid": 0}``, ``{"kind": "agent", "id", "name"}``
    or ``{"kind": "run", "of": ...}``; ``limits`` the sizes a request and a
    reply may have; ``llm`` THINK's provider and model."""

    principal: Dict[str, Any]
    limits: Dict[str, int]
    llm: Dict[str, Any]
    tool_servers: List["ToolServer"]


class Isolation(TypedDict, total=False):
    """What isolation an agent got (``degraded_reason`` when the host could
    not give all that was asked)."""

    sandboxed: bool
    namespaces: List[str]
    cgroup: Optional[CgroupVersion]
    degraded_reason: Optional[str]


class Spawned(TypedDict):
    """SPAWN: the new agent."""

    id: int
    name: str
    pid: Optional[int]
    status: AgentState
    isolation: Isolation


class Killed(TypedDict):
    """KILL: the agent being stopped."""

    killed: bool
    id: int


class _AgentRequired(TypedDict):
    id: int
    name: str
    pid: Optional[int]
    state: AgentState
    status: AgentState
    running: bool


class Agent(_AgentRequired, total=False):
    """LIST: one agent, live or recently ended, with what its cgroup reads."""

    exit_code: Optional[int]
    signal: Optional[int]
    oom_killed: bool
    restarts: int
    started_at: str
    uptime_ms: int
    limits: Dict[str, int]
    memory: Dict[str, int]
    cpu: Dict[str, int]
    llm: Dict[str, int]
    isolation: Isolation


class Usage(TypedDict):
    """Tokens a THINK used."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _ThoughtRequired(TypedDict):
    content: str
    tokens: int


class Thought(_ThoughtRequired, total=False):
    """THINK: the model's answer, what it cost, and how long it took."""

    usage: Usage
    model: str
    queue_ms: int
    latency_ms: int


class Truncated(TypedDict):
    """Bytes dropped from the middle of each output stream."""

    stdout: int
    stderr: int


class _ExecutionRequired(TypedDict):
    stdout: str
    stderr: str
    exit_code: Optional[int]
    signal: Optional[int]
    error: Optional[str]
    duration_ms: int
    timed_out: bool
    oom_killed: bool
    truncated: Truncated
    tool_calls: int
    tool_bytes: int
    files: Dict[str, bytes]
    session: Optional[str]


class Execution(_ExecutionRequired, total=False):
    """EXEC: how a run ended. It succeeded when ``ok`` is true: exit code 0,
    not timed out. ``files`` holds the collected files' contents as bytes;
    ``network`` counts connections when a network policy applied;
    ``fresh_interpreter`` is true when a session's files were kept but its
    interpreter had ended (idle, a timeout, a kernel restart)."""

    ok: bool
    network: Dict[str, int]
    fresh_interpreter: bool
    template: Template


class _SessionRequired(TypedDict):
    session: str
    created_at: str
    last_used_at: str
    runs: int
    workspace_bytes: int
    state: Literal["running", "ready", "paused", "hibernated", "stored"]


class SessionUsage(TypedDict):
    """What a session's sandbox uses now: memory (page cache included, and
    of it the cache alone) in bytes, CPU time since its interpreter started
    (``uptime_ms`` ago) in microseconds, and processes and threads."""

    memory_bytes: int
    memory_cache_bytes: int
    cpu_usec: int
    uptime_ms: int
    pids: int


class Session(_SessionRequired, total=False):
    """An EXEC session of yours: ``paused`` when its interpreter is frozen,
    ``hibernated`` when its globals are saved and its interpreter ended
    (its next run or a resume brings them back), ``stored`` when only its
    disk is left (its next run starts a fresh interpreter); ``disk_bytes``
    and ``disk_used_bytes`` when it has a disk of its own; ``labels``,
    ``ends_at`` and ``then`` when it was opened with them; ``limits`` and
    ``usage`` while it has an interpreter."""

    disk_bytes: int
    disk_used_bytes: int
    labels: Dict[str, str]
    ends_at: str
    then: str
    limits: Dict[str, int]
    usage: SessionUsage


class Template(TypedDict):
    """A template: a read-only Python environment runs and sessions start
    from (``template=``), built once by an operator."""

    template: str
    created_at: str
    bytes: int
    shared: bool
    packages: List[str]


class Volume(TypedDict):
    """A volume: a disk of a fixed size (``bytes``) that runs and agents
    mount by name (``volumes=``). ``owned`` when it is yours (you may
    remove it), else it was given to you by whoever started you;
    ``read_only`` when it was given so. ``used_bytes`` is what its files
    take, or None when not known."""

    volume: str
    bytes: int
    used_bytes: Optional[int]
    created_at: str
    owned: bool
    read_only: bool


class _VolumeMountRequired(TypedDict):
    name: str
    path: str


class VolumeMount(_VolumeMountRequired, total=False):
    """A volume to mount into a run or an agent, as ``exec`` and ``spawn``
    take it: at ``path`` (``/data``, or beneath ``/data``, ``/mnt`` or
    ``/workspace``), read-write unless ``read_only``."""

    read_only: bool


class Snapshot(TypedDict, total=False):
    """A saved copy of a session's files (its ``/workspace`` and its home),
    kept on the kernel's disk until it is removed or its session closed;
    ``bytes`` counts its files, ``state`` says whether it keeps the
    interpreter's globals. From ``snapshot()``, ``left_out`` names the
    paths not saved (symlinks and special files are never followed) and
    ``not_saved`` the globals that could not be (``"name: Type: why"``)."""

    name: str
    bytes: int
    created_at: str
    state: bool
    left_out: List[str]
    not_saved: List[str]


class PausedSession(TypedDict):
    """A session after ``pause_session`` or ``resume_session``: its
    ``state`` now, and when hibernated the globals that could not be saved
    (gone when it wakes)."""

    session: str
    state: Literal["paused", "hibernated", "ready"]
    not_saved: List[str]


class _ToolRequired(TypedDict):
    server: str
    name: str


class Tool(_ToolRequired, total=False):
    """A tool you may call (search results carry less with ``detail``)."""

    description: str
    input_schema: Dict[str, Any]
    output_schema: Optional[Dict[str, Any]]


class ToolServer(TypedDict):
    """A tool server and its state (``tools``: how many it offers)."""

    name: str
    state: ToolServerState
    error: Optional[str]
    tools: int


class TaskProgress(TypedDict, total=False):
    """A running task's output so far (its tail), and its loop iteration."""

    output: str
    iteration: Optional[int]


class Iteration(TypedDict, total=False):
    """One round of the prompt loop: the code THINK wrote and how it ran."""

    code: str
    language: Language
    stdout: str
    stderr: str
    exit_code: Optional[int]


class PromptResult(TypedDict, total=False):
    """A ``prompt`` task's result: THINK's answer and the code it ran.
    ``checked`` is false when the answer did not come from a run: the last
    run failed or printed nothing, none ran, or the answer states a number
    no run printed; ``unchecked_reason`` says which."""

    answer: str
    iterations: List[Iteration]
    tokens: int
    tool_calls: int
    tool_bytes: int
    checked: bool
    unchecked_reason: str


class TaskFailure(TypedDict, total=False):
    """The result of a task whose work failed before answering (a THINK
    refused, a task cancelled or interrupted): what went wrong, its
    ``code``, and for an interrupted run the ``output`` it had printed.
    The fields of the failed reply, if any, come with them."""

    error: str
    code: str
    output: str


TaskResult = Union[Execution, Thought, PromptResult, TaskFailure]


class _TaskRequired(TypedDict):
    task_id: str
    kind: TaskKind
    label: Optional[str]
    state: TaskState
    created_at: str
    started_at: Optional[str]
    finished_at: Optional[str]


class Task(_TaskRequired, total=False):
    """A background task. ``result`` is there once it has finished;
    ``progress`` while it runs; ``owner`` (a principal) when an operator
    lists other owners' tasks."""

    progress: Optional[TaskProgress]
    result: TaskResult
    owner: Dict[str, Any]
