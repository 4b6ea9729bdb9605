"""Wire replies turned into the shapes of :mod:`agentos.types`.

The kernel marks every reply with ``success``; the client raises instead,
so no result keeps that key. EXEC's ``success`` says how the code ended,
not whether the request was served, and becomes ``ok``; files travel as
base64 and come back as bytes.
"""

from __future__ import annotations

import base64
from typing import Any, Dict, Mapping, Union, cast

from .errors import ProtocolError
from .types import Execution, Task, TaskResult, Thought

FileContent = Union[bytes, bytearray, memoryview, str]


def without_success(reply: Mapping[str, Any]) -> Dict[str, Any]:
    """The reply minus its ``success`` mark.

    >>> without_success({"success": True, "killed": True, "id": 7})
    {'killed': True, 'id': 7}
    """
    return {key: value for key, value in reply.items() if key != "success"}


def execution(reply: Mapping[str, Any]) -> Execution:
    """An EXEC reply as an :class:`~agentos.types.Execution`.

    >>> run = execution({"success": True, "stdout": "", "files": {"a": "aGk="}})
    >>> run["ok"], run["files"]
    (True, {'a': b'hi'})
    """
    result = without_success(reply)
    result["ok"] = bool(reply.get("success"))
    result["files"] = {
        path: _decoded_file(path, content) for path, content in (reply.get("files") or {}).items()
    }
    return cast(Execution, result)


def _decoded_file(path: str, content: Any) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"EXEC reply's files[{path!r}] is not base64: {err}") from err


def thought(reply: Mapping[str, Any]) -> Thought:
    """A THINK reply that answered, minus its empty failure fields."""
    return cast(
        Thought,
        {key: value for key, value in reply.items() if key not in ("success", "error", "code")},
    )


def task(info: Mapping[str, Any]) -> Task:
    """A TASK reply's task, its ``result`` shaped like the same request's
    own reply would be."""
    shaped = dict(info)
    result = info.get("result")
    if isinstance(result, Mapping):
        shaped["result"] = task_result(info.get("kind"), result)
    return cast(Task, shaped)


def task_result(kind: Any, result: Mapping[str, Any]) -> TaskResult:
    """A finished task's result: an EXEC run, a THINK answer, the prompt
    loop's answer, or (``code`` set) why the work failed."""
    if result.get("success") is False and "stdout" not in result:
        return cast(TaskResult, without_success(result))
    if kind == "exec":
        return execution(result)
    if kind == "think":
        return thought(result)
    return cast(TaskResult, without_success(result))


def base64_files(files: Mapping[str, FileContent]) -> Dict[str, str]:
    """EXEC's ``files``: each content base64-encoded (a str as UTF-8).

    >>> base64_files({"a.csv": b"x,y\\n"})
    {'a.csv': 'eCx5Cg=='}
    """
    encoded = {}
    for path, content in files.items():
        if isinstance(content, str):
            raw = content.encode("utf-8")
        elif isinstance(content, (bytes, bytearray, memoryview)):
            raw = bytes(content)
        else:
            raise TypeError(f"files[{path!r}] must be bytes or str, not {type(content).__name__}")
        encoded[path] = base64.b64encode(raw).decode("ascii")
    return encoded
