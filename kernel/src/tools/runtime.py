"""The kernel's tools, as Python functions.

    import tools
    tools.everything.echo(message="hi")       # -> "Echo: hi"
    tools.search("read file")                 # -> [{"server", "name", "description"}]
    tools.call("time", "get_current_time", timezone="UTC")

Each MCP server the kernel runs is a namespace here, each of its tools a
function taking its arguments by name or by position: required ones
first, in the order the schema's "required" lists them, then the others
in the order of its "properties" (the kernel's catalog gives the order;
see the function's signature and docstring, or /tools/<server>/SKILL.md).
An optional argument given as None is not sent. A call is a TOOL request on this run's own
kernel connection, made as the run's caller; its result comes back as a
Python value: the tool's structured result (a dict; one whose output
schema is a single text field, like {"content": "..."}, is that text, a
str), else its text parsed as JSON, else the text. A tool that fails
raises ToolError with the server's message; so does naming a server that is configured but not serving (it
failed, or is starting again), with its last error. Names that are not
Python identifiers have every other character turned into "_" (get-sum ->
get_sum); tools.call takes the real name.
"""

# Modules under private names: every public name here is a server's.
import inspect as _inspect
import json as _json
import keyword as _keyword
import os as _os
import struct as _struct
import threading as _threading

__all__ = ["ToolError", "ToolResult", "ToolText", "call", "search"]

_CATALOG = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "catalog.json")
_MAGIC = 0x41474E54
_TOOL = 0x05
_HEADER = _struct.Struct("<IIBQ")
# One request at a time on the run's connection: replies come in order.
_lock = _threading.Lock()
# (server, tool) to the one text field of its result, for the tools whose
# output schema is that (from the catalog).
_TEXT_FIELDS = {}


class ToolError(Exception):
    """A tool call that failed: `code` is the kernel's word for why
    (tool_error: the tool itself reported it; unavailable: its server is
    not serving), `content` the tool's content blocks, if it gave any."""

    def __init__(self, message, code="tool_error", content=None):
        super().__init__(message)
        self.code = code
        self.content = content


def _connection():
    fd = _os.environ.get("AGENTOS_SOCKET_FD")
    if fd is None:
        raise ToolError("this process has no kernel connection (AGENTOS_SOCKET_FD)", "unavailable")
    return int(fd)


def _exchange(request):
    # The run's span, when the kernel traces: its tool calls join it.
    trace = _os.environ.get("TRACEPARENT")
    if trace:
        request = dict(request, trace=trace)
    payload = _json.dumps(request).encode()
    frame = _HEADER.pack(_MAGIC, 0, _TOOL, len(payload)) + payload
    with _lock:
        fd = _connection()
        view = memoryview(frame)
        while view:
            view = view[_os.write(fd, view):]
        magic, _, opcode, length = _HEADER.unpack(_read(fd, _HEADER.size))
        body = _read(fd, length)
    if magic != _MAGIC or opcode != _TOOL:
        raise ToolError("the kernel's reply was not a TOOL frame", "internal")
    return _json.loads(body)


def _read(fd, size):
    chunks = []
    while size:
        chunk = _os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise ToolError("the kernel closed this run's connection", "unavailable")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class ToolResult(dict):
    """A tool's result that is a JSON object: a dict, whose missing keys
    and attributes say which keys it has. Code often guesses a result's
    keys (`now["hour"]`) or takes it for text (`.splitlines()`); the error
    it gets back names the keys there are."""

    __slots__ = ()

    def __missing__(self, key):
        raise KeyError(f"{key!r}: not a key of this tool's result; its keys are {list(self)}")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"a tool's result is a dict, which has no attribute {name!r}: its keys are {list(self)}"
        )


class ToolText(str):
    """A tool's structured result that is one text field (the filesystem
    server's {"content": "..."}): that text, as code expects of a tool that
    reads a file. `result["content"]` gives the same text, as the tool's
    output schema promises."""

    def __new__(cls, text, field):
        self = super().__new__(cls, text)
        self.field = field
        return self

    def __getnewargs__(self):  # copy and pickle
        return (str(self), self.field)

    def __getitem__(self, index):
        if index == self.field:
            return str(self)
        if isinstance(index, str):
            raise KeyError(f"{index!r}: this tool's result is text, the {self.field!r} field")
        return str.__getitem__(self, index)

    def get(self, key, default=None):
        return str(self) if key == self.field else default

    def keys(self):
        return [self.field]


def _result(server, tool, value):
    """A tool's result as code gets it: the text of one whose output schema
    is one text field (the catalog's `text_field`) as its ToolText, any
    JSON object as a ToolResult (and so the objects inside it)."""
    field = _TEXT_FIELDS.get((server, tool))
    if field is not None and isinstance(value, dict) and list(value) == [field]:
        if isinstance(value[field], str):
            return ToolText(value[field], field)
    return _objects(value)


def _objects(value):
    if isinstance(value, dict):
        return ToolResult((key, _objects(item)) for key, item in value.items())
    if isinstance(value, list):
        return [_objects(item) for item in value]
    return value


def call(server, tool, /, **arguments):
    """Calls `tool` of `server` (names as the kernel lists them) with
    keyword arguments; returns its result, or raises ToolError."""
    reply = _exchange({"op": "call", "server": server, "tool": tool, "arguments": arguments})
    if not reply.get("success"):
        raise ToolError(
            reply.get("error") or "the call failed",
            reply.get("code") or "internal",
            reply.get("content"),
        )
    return _result(server, tool, reply.get("result"))


def search(query, detail="summary", limit=10):
    """The tools this run's caller may use whose names and descriptions
    match `query`, best first: dicts with `server` and `name`, and for
    detail "summary" the description, for "full" the schemas too."""
    reply = _exchange({"op": "search", "query": query, "detail": detail, "limit": limit})
    if not reply.get("success"):
        raise ToolError(reply.get("error") or "the search failed", reply.get("code") or "internal")
    return reply["tools"]


class _Server:
    """One tool server: its tools as attributes."""

    def __init__(self, name, description):
        self.__name__ = name
        self.__doc__ = description

    def __repr__(self):
        names = sorted(k for k in vars(self) if not k.startswith("__"))
        return f"<tools.{self.__name__}: {', '.join(names)}>"


_KINDS = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _parameters(tool):
    """The tool's parameters as the kernel orders them (required first,
    then the rest in schema order): [(name, required, default)]."""
    parameters = tool.get("parameters")
    if not isinstance(parameters, list):
        return []
    found = []
    for parameter in parameters:
        if not isinstance(parameter, dict):
            continue
        name = parameter.get("name")
        # The kernel lists only names Python takes; an odd one stops the
        # order here rather than shift every position after it.
        if not isinstance(name, str) or not name.isidentifier() or _keyword.iskeyword(name):
            break
        found.append((name, parameter.get("required") is True, parameter.get("default")))
    return found


def _arguments(signature, positional, args, keywords):
    """The call's arguments by name: `args` fill `positional` in order.
    An optional argument given as None is left out, as if not given: the
    signature shows None as "not given"."""
    if len(args) > len(positional):
        takes = len(positional)
        raise TypeError(
            f"{signature} takes {takes} positional argument{'' if takes == 1 else 's'} "
            f"but {len(args)} {'was' if len(args) == 1 else 'were'} given"
        )
    arguments = dict(keywords)
    for (name, required, _), value in zip(positional, args):
        if name in arguments:
            raise TypeError(f"{signature} got multiple values for argument {name!r}")
        arguments[name] = value
    for name, required, _ in positional:
        if not required and name in arguments and arguments[name] is None:
            del arguments[name]
    return arguments


def _function(server, tool):
    """A function for one tool, taking its arguments by position (in the
    order the catalog gives) or by name. Schemas come from servers and may
    be odd: what cannot be read is left out of the signature, never fatal."""
    name, python = tool["name"], tool["python"]
    schema = tool.get("input_schema")
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    positional = _parameters(tool)
    signature = tool.get("signature")
    if not isinstance(signature, str):
        signature = f"tools.{server}.{python}(...)"
    lines = []
    for arg, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type") if isinstance(spec.get("type"), str) else None
        need = "required" if arg in required else "optional"
        about = spec.get("description") if isinstance(spec.get("description"), str) else ""
        lines.append(f"    {arg} ({kind or 'any'}, {need}){': ' + about if about else ''}")

    def tool_function(*args, **keywords):
        return call(server, name, **_arguments(signature, positional, args, keywords))

    tool_function.__name__ = tool_function.__qualname__ = python
    tool_function.__module__ = f"tools.{server}"
    doc = tool.get("description") if isinstance(tool.get("description"), str) else ""
    doc = f"{signature}\n\n{doc}" if doc else signature
    if lines:
        doc += "\n\nArguments (by position in the order above, or by name):\n" + "\n".join(lines)
    returns = tool.get("returns")
    if isinstance(returns, str) and returns:
        doc += "\n\nReturns:\n" + "\n".join("    " + line for line in returns.splitlines())
    doc += "\n\nRaises tools.ToolError when the tool fails."
    tool_function.__doc__ = doc
    if isinstance(tool.get("text_field"), str):
        returns_kind = str
    elif isinstance(tool.get("output_schema"), dict):
        returns_kind = dict
    else:
        returns_kind = _inspect.Signature.empty
    parameters = []
    for arg, is_required, default in positional:
        spec = properties.get(arg) if isinstance(properties.get(arg), dict) else {}
        kind = spec.get("type") if isinstance(spec.get("type"), str) else None
        parameters.append(
            _inspect.Parameter(
                arg,
                _inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=_inspect.Parameter.empty if is_required else default,
                annotation=_KINDS.get(kind, _inspect.Parameter.empty),
            )
        )
    if any(arg not in {p.name for p in parameters} for arg in properties):
        # `from=` cannot be a parameter's name: it is passed as **{"from": ...}.
        parameters.append(_inspect.Parameter("arguments", _inspect.Parameter.VAR_KEYWORD))
    try:
        tool_function.__signature__ = _inspect.Signature(
            parameters, return_annotation=returns_kind
        )
    except (TypeError, ValueError):
        pass
    return tool_function


def _load():
    try:
        with open(_CATALOG) as file:
            catalog = _json.load(file)
    except (OSError, ValueError):
        return
    for server in catalog.get("servers", []):
        namespace = _Server(server["name"], server.get("description", ""))
        for tool in server.get("tools", []):
            try:
                setattr(namespace, tool["python"], _function(server["name"], tool))
                if isinstance(tool.get("text_field"), str):
                    _TEXT_FIELDS[(server["name"], tool["name"])] = tool["text_field"]
            except Exception:  # one odd tool never costs the others
                pass
        globals()[server["name"]] = namespace
        if server["name"] not in __all__:
            __all__.append(server["name"])


def _unserved(name):
    """Why server `name`, configured but not in the catalog, offers no
    tools: a ToolError naming its last failure, or None when this run's
    caller may use no server of that name. The kernel's TOOL list names
    only the servers the caller may use (their errors redacted), so a run
    never learns more here than TOOL would tell it."""
    try:
        reply = _exchange({"op": "list"})
    except (ToolError, OSError, ValueError, _struct.error):
        return None
    servers = reply.get("servers") if isinstance(reply, dict) else None
    for server in servers if isinstance(servers, list) else []:
        if not isinstance(server, dict) or server.get("name") != name:
            continue
        state, error = server.get("state"), server.get("error")
        if state == "failed":
            why = f"tool server `{name}` failed: {error}" if error else f"tool server `{name}` failed"
        elif state == "starting" and error:
            why = f"tool server `{name}` failed, and is starting again: {error}"
        elif state == "starting":
            why = f"tool server `{name}` is starting; its tools are not listed yet"
        elif state == "stopped":
            why = f"tool server `{name}` is stopped (disabled, or the kernel is stopping)"
        else:
            why = f"tool server `{name}` is {state}; its tools are not in the package yet"
        return ToolError(why, "unavailable")
    return None


def __getattr__(name):
    # A server that came up after this interpreter imported the package:
    # the catalog on disk is always current.
    if not name.startswith("_"):
        _load()
        if name in globals():
            return globals()[name]
        # Not an AttributeError: `from tools import x` would turn that into
        # an ImportError that drops the server's error.
        unserved = _unserved(name)
        if unserved is not None:
            raise unserved
    raise AttributeError(f"module 'tools' has no attribute {name!r}; no tool server is called that")


_load()
