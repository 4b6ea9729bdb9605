"""A code context of `agentos e2b`'s code interpreter: one Python process in
the sandbox that keeps its globals between executions, as a Jupyter kernel
does; or, started with the argument ``bash``, one that keeps a bash process
whose variables, functions and directory last between executions.

The face writes one request per line on this process's stdin,
``{"id": N, "code": "...", "env": {...}}``, and reads the answers as lines
of JSON on its stdout: ``count``, ``stdout``, ``stderr``, ``result``,
``error`` and, last, ``end``, each with the request's ``id``. The code's own
output — ``print``, ``sys.stderr``, and whatever its subprocesses write to
file descriptors 1 and 2 — is read from pipes that stand in for them and
sent on as ``stdout`` and ``stderr``; the answers go out on a copy of the
original stdout (the code could find it, as it could anything of its own
process: what it says is read as the sandbox's words). Its stdin is
/dev/null. An
answer longer than a pipe's worth is written to a file under the
context's directory and sent as ``{"type": "file", "path": ...}``, for the
face to read and remove.
"""

import ast
import base64
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import threading
import traceback

# The largest answer sent inline; a longer one goes by file.
MAX_INLINE = 48 * 1024
# Always under /tmp, whatever TMPDIR the sandbox's environment says: the
# face reads results from there alone.
RESULTS = "/tmp/.e2b-results-%d" % os.getpid()

send_lock = threading.Lock()
answers = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
requests = os.fdopen(os.dup(0), "r", encoding="utf-8", errors="replace")
current = {"id": None}
results_made = [0]


def send(message):
    message["id"] = current["id"]
    line = json.dumps(message, ensure_ascii=False)
    if len(line) > MAX_INLINE:
        os.makedirs(RESULTS, mode=0o700, exist_ok=True)
        results_made[0] += 1
        path = os.path.join(RESULTS, "%d.json" % results_made[0])
        with open(path, "w", encoding="utf-8") as held:
            held.write(line)
        line = json.dumps({"type": "file", "path": path, "id": current["id"]})
    with send_lock:
        answers.write(line + "\n")
        answers.flush()


class Drain(threading.Thread):
    """Reads what is written to one of the code's output descriptors and
    sends it on; ``synced`` is set when a marker written after an
    execution has come through, so everything before it has been sent."""

    def __init__(self, fd, stream):
        super().__init__(daemon=True)
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.read_fd, self.stream = read, stream
        self.marker = None
        self.synced = threading.Event()

    def run(self):
        pending = b""
        while True:
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                return
            pending += chunk
            marker = self.marker
            if marker is not None and marker in pending:
                before, _, after = pending.partition(marker)
                self.forward(before)
                pending = after
                self.marker = None
                self.synced.set()
                continue
            # Keep a tail that may be the start of a marker.
            keep = len(marker) - 1 if marker else 0
            cut = len(pending) - keep
            if cut > 0:
                self.forward(pending[:cut])
                pending = pending[cut:]

    def forward(self, data):
        if data:
            send({"type": self.stream, "text": data.decode("utf-8", "replace")})

    def sync(self, fd):
        self.synced.clear()
        marker = b"\x00agentos-sync-%s\x00" % os.urandom(8).hex().encode()
        self.marker = marker
        os.write(fd, marker)
        self.synced.wait(5)


def bundle(value):
    """The value's representations, as Jupyter's display machinery gives
    them: ``text`` always, and each ``_repr_*_`` it has."""
    shown = {"text": repr(value)}
    for method, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"),
                        ("_repr_svg_", "svg"), ("_repr_png_", "png"),
                        ("_repr_jpeg_", "jpeg"), ("_repr_pdf_", "pdf"),
                        ("_repr_latex_", "latex"), ("_repr_json_", "json"),
                        ("_repr_javascript_", "javascript")):
        represent = getattr(value, method, None)
        if represent is None:
            continue
        try:
            made = represent()
        except Exception:
            continue
        if made is None:
            continue
        if isinstance(made, tuple):
            made = made[0]
        if isinstance(made, bytes):
            made = base64.b64encode(made).decode()
        shown[key] = made
    if type(value).__module__.startswith("matplotlib.figure"):
        shown.update(figure_png(value))
    return shown


def figure_png(figure):
    import io
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return {"png": base64.b64encode(buffer.getvalue()).decode()}


def open_figures():
    """Each figure matplotlib holds open, as a PNG; then they are closed,
    as Jupyter's inline backend shows and closes them."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        shown = {"text": repr(figure)}
        shown.update(figure_png(figure))
        send(dict(type="result", is_main_result=False, **shown))
    pyplot.close("all")


def cell_traceback(error):
    """The traceback from the code's own frames on, as Jupyter shows it."""
    frames = traceback.extract_tb(error.__traceback__)
    while frames and frames[0].filename != "<cell>":
        frames.pop(0)
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines)


def execute(code, namespace):
    """Runs ``code``; the value of a last bare expression is the result."""
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(last, "<cell>", "eval"), namespace)
        if value is not None:
            namespace["_"] = value
            send(dict(type="result", is_main_result=True, **bundle(value)))


class Bash:
    """A bash process the executions are sourced in, one at a time. Each
    cell is written to a file whose path goes to bash on a pipe of its own
    (the cell's stdin is /dev/null), and bash answers with that path and
    the cell's exit status on another: an answer for another cell (one an
    interrupt cut short) is dropped. bash shares this process's group, so
    an interrupt or a kill of the context reaches it and its jobs; an
    interrupt ends the cell (its trap returns from it), and one that has
    not ended it within ``GRACE`` seconds ends bash. A cell that ends bash
    (``exit``) is an error, and the next starts a fresh one."""

    LOOP = ('builtin trap : INT\n'
            'while IFS= builtin read -r -u {cells} __e2b_cell; do\n'
            '  for __e2b_once in 1; do builtin source "$__e2b_cell" {cells}<&- {status}>&-; done\n'
            '  builtin printf "%s %d\\n" "$__e2b_cell" "$?" >&{status}\n'
            '  builtin trap : INT\n'
            'done\n')
    GRACE = 2.0

    def __init__(self):
        self.process = None
        self.cells = 0

    def start(self):
        if self.process is not None:
            for fd in (self.cells_write, self.statuses, self.pidfd):
                os.close(fd)
        cells_read, self.cells_write = os.pipe()
        self.statuses, status_write = os.pipe()
        loop = self.LOOP.format(cells=cells_read, status=status_write)
        # Nothing runs before the loop: no startup file, no imported function.
        env = {name: value for name, value in os.environ.items()
               if name not in ("BASH_ENV", "ENV") and not name.startswith("BASH_FUNC_")}
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-c", loop], stdin=subprocess.DEVNULL,
            pass_fds=(cells_read, status_write), env=env)
        os.close(cells_read)
        os.close(status_write)
        self.pidfd = os.pidfd_open(self.process.pid)
        self.pending = b""

    def run(self, code, env):
        """Runs ``code`` with ``env`` set for it alone; its exit status,
        or None if it ended bash."""
        if self.process is None or self.process.poll() is not None:
            self.start()
        os.makedirs(RESULTS, mode=0o700, exist_ok=True)
        self.cells += 1
        code_path = os.path.join(RESULTS, "cell-%d.sh" % self.cells)
        wrapper_path = code_path + ".run"
        try:
            write_new(code_path, code + "\n")
            write_new(wrapper_path, with_env(code_path, env))
            interrupted_at[0] = None
            os.write(self.cells_write, (wrapper_path + "\n").encode())
            return self.status_of(wrapper_path)
        finally:
            for path in (code_path, wrapper_path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def status_of(self, wrapper_path):
        """The status bash answers for the cell at ``wrapper_path``, or
        None once bash has ended."""
        poller = select.poll()
        poller.register(self.statuses, select.POLLIN)
        poller.register(self.pidfd, select.POLLIN)
        killed = False
        while True:
            since = interrupted_at[0]
            if since is not None and not killed and time.monotonic() - since > self.GRACE:
                self.process.kill()
                killed = True
            ready = {fd for fd, _ in poller.poll(100)}
            if self.statuses in ready:
                chunk = os.read(self.statuses, 4096)
                self.pending += chunk
                *lines, self.pending = self.pending.split(b"\n")
                for line in lines:
                    path, _, status = line.decode("utf-8", "replace").rpartition(" ")
                    if path == wrapper_path and status.lstrip("-").isdigit():
                        return int(status)
                if chunk:
                    continue
                # Every copy of its write end is closed: bash's end is next.
                poller.unregister(self.statuses)
            if self.pidfd in ready:
                # Ended: what it holds open (a background job may hold a
                # copy of the status pipe) never closes the pipe.
                self.process.wait()
                return None


interrupted_at = [None]


def note_interrupt(signum, frame):
    """bash mode's SIGINT: bash and the cell's processes have it too (they
    share this group); it is noted, for a cell it does not end."""
    interrupted_at[0] = time.monotonic()


def write_new(path, text):
    """Writes ``text`` to a file made now at ``path`` (never one that was
    there, a link included)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o600), "w", encoding="utf-8") as file:
        file.write(text)


def shell_word(text):
    return "'" + text.replace("'", "'\\''") + "'"


def with_env(code_path, env):
    """A script that sources ``code_path`` with ``env`` exported for it,
    each variable put back as it was afterwards (set or not, exported or
    not), and ends with its status. Its interrupt trap is set anew for
    each cell."""
    before = ["builtin trap 'builtin return 130' INT"]
    after = []
    for n, (name, value) in enumerate(sorted(env.items())):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            continue
        before.append("__e2b_was_%d=$(builtin declare -p %s 2>/dev/null)" % (n, name))
        before.append("builtin export %s=%s" % (name, shell_word(str(value))))
        after.append("builtin unset -v %s; builtin eval \"$__e2b_was_%d\"; builtin unset -v __e2b_was_%d"
                     % (name, n, n))
    lines = before + ["builtin source %s" % shell_word(code_path), "__e2b_status=$?"] + after
    return "\n".join(lines + ['builtin return "$__e2b_status"', ""])


def serve(execute_one):
    """Answers the face's requests one at a time: each is counted, run by
    ``execute_one``, and ended once all it wrote has been sent."""
    count = 0
    while True:
        request = next_request()
        if request is None:
            return
        count += 1
        send({"type": "count", "execution_count": count})
        handler = signal.getsignal(signal.SIGINT)
        try:
            execute_one(request)
        except KeyboardInterrupt:
            pass  # one that came after the code's own end
        except Exception as error:  # noqa: BLE001 - the context's own failure, told
            send({"type": "error", "name": type(error).__name__,
                  "value": "the context could not run it: %s" % error, "traceback": ""})
        # An interrupt that comes now would end the context with its
        # globals: it is ignored until the execution's end is sent.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        end_execution()
        signal.signal(signal.SIGINT, handler)


def python_executor():
    """Runs each request's code as Python, with its globals kept."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}

    def execute_one(request):
        saved = {}
        try:
            for name, value in (request.get("env") or {}).items():
                before = os.environ.get(name)
                os.environ[name] = str(value)
                saved[name] = before
            execute(request.get("code", ""), namespace)
            open_figures()
        except BaseException as error:  # noqa: BLE001 - the code's own, sent on
            if not (isinstance(error, SystemExit) and not error.code):
                send({"type": "error", "name": type(error).__name__,
                      "value": str(error), "traceback": cell_traceback(error)})
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    return execute_one


def bash_executor():
    """Runs each request's code in bash: a non-zero exit status is the
    error, as Jupyter's bash kernel reports it (no name, the status as its
    value)."""
    bash = Bash()
    signal.signal(signal.SIGINT, note_interrupt)

    def execute_one(request):
        status = bash.run(request.get("code", ""), request.get("env") or {})
        if status is None:
            send({"type": "error", "name": "", "value": "bash ended; its state is gone",
                  "traceback": ""})
        elif status != 0:
            send({"type": "error", "name": "", "value": str(status), "traceback": ""})

    return execute_one


def next_request():
    """The next request, its id made current; None when the face is gone."""
    while True:
        try:
            line = requests.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return None
        try:
            request = json.loads(line)
        except ValueError:
            continue
        current["id"] = request.get("id")
        return request


def end_execution():
    """Everything the execution wrote has been sent: its end follows."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    for drain, fd in zip(drains, (1, 2)):
        drain.sync(fd)
    send({"type": "end"})


drains = []


def main():
    os.environ.setdefault("MPLBACKEND", "Agg")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    drains.extend([Drain(1, "stdout"), Drain(2, "stderr")])
    for drain in drains:
        drain.start()
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", errors="replace", buffering=1)
    sys.stderr = os.fdopen(2, "w", encoding="utf-8", errors="replace", buffering=1)
    serve(bash_executor() if sys.argv[1:] == ["bash"] else python_executor())


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
