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
import signal
import subprocess
import sys
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
    """A bash process the executions are sourced in, one at a time: each
    cell is written to a file whose path goes to bash on a pipe of its own
    (the cell's stdin is /dev/null), and bash writes the cell's exit status
    on another. An interrupt ends the cell, not bash; a cell that ends
    bash (``exit``) is an error, and the next starts a fresh one."""

    LOOP = ('trap "return 130" INT\n'
            'while IFS= read -r -u {cells} __e2b_cell; do\n'
            '  source "$__e2b_cell" {cells}<&- {status}>&-\n'
            '  printf "%d\\n" "$?" >&{status}\n'
            'done\n')

    def __init__(self):
        self.process = None
        self.cells = 0

    def start(self):
        if self.process is not None:
            os.close(self.cells_write)
            self.statuses.close()
        cells_read, self.cells_write = os.pipe()
        status_read, status_write = os.pipe()
        loop = self.LOOP.format(cells=cells_read, status=status_write)
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-c", loop], stdin=subprocess.DEVNULL,
            pass_fds=(cells_read, status_write), start_new_session=True)
        os.close(cells_read)
        os.close(status_write)
        self.statuses = os.fdopen(status_read, "r")

    def interrupt(self):
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

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
            with open(code_path, "w", encoding="utf-8") as cell:
                cell.write(code + "\n")
            with open(wrapper_path, "w", encoding="utf-8") as wrapper:
                wrapper.write(with_env(code_path, env))
            os.write(self.cells_write, (wrapper_path + "\n").encode())
            line = self.status()
        finally:
            for path in (code_path, wrapper_path):
                if os.path.exists(path):
                    os.unlink(path)
        if not line:
            self.process.wait()
            return None
        return int(line)

    def status(self):
        """The running cell's status line ("" if bash ended); an interrupt
        meanwhile is passed on to the cell."""
        while True:
            try:
                return self.statuses.readline()
            except KeyboardInterrupt:
                self.interrupt()


def shell_word(text):
    return "'" + text.replace("'", "'\\''") + "'"


def with_env(code_path, env):
    """A script that sources ``code_path`` with ``env`` exported for it,
    each variable put back as it was afterwards, and ends with its status."""
    before, after = [], []
    for n, (name, value) in enumerate(sorted(env.items())):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            continue
        before.append('if [ -n "${%s+set}" ]; then __e2b_had_%d=1; __e2b_old_%d=$%s; '
                      'else __e2b_had_%d=; fi' % (name, n, n, name, n))
        before.append("export %s=%s" % (name, shell_word(str(value))))
        after.append('if [ -n "$__e2b_had_%d" ]; then %s=$__e2b_old_%d; else unset %s; fi'
                     % (n, name, n, name))
    lines = before + ["source %s" % shell_word(code_path), "__e2b_status=$?"] + after
    return "\n".join(lines + ["return $__e2b_status", ""])


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
        try:
            execute_one(request)
        except KeyboardInterrupt:
            pass  # one that came after the code's own end
        # An interrupt that comes now would end the context with its
        # globals: it is ignored until the execution's end is sent.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        end_execution()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def python_executor():
    """Runs each request's code as Python, with its globals kept."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}

    def execute_one(request):
        saved = {}
        for name, value in (request.get("env") or {}).items():
            saved[name] = os.environ.get(name)
            os.environ[name] = str(value)
        try:
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

    def execute_one(request):
        try:
            status = bash.run(request.get("code", ""), request.get("env") or {})
        except KeyboardInterrupt:
            # Interrupted before the cell went to bash: it never ran.
            status = 130
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
