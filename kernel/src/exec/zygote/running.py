# Running code: one order's code as Python in the run's own scope, or as
# bash (a shell started ahead, or one spawned for it), with the request's
# environment, directory and files; and the rehearsal that touches a
# run's pages before any request comes.

import ast
import fcntl
import os
import signal
import sys
import traceback


REHEARSAL = "total = sum(range(100))\nprint(total)\n"


def run_order(request, scope, connection, shell):
    """Runs one order with its output on stdout and stderr (the pipes);
    returns its end frame. The run's own kernel connection, if it came, is
    in AGENTOS_SOCKET_FD while it runs."""
    env = request.get("env") or {}
    if env != SETTINGS["run_env"]:
        os.environ.clear()
        os.environ.update(env)
    if connection is not None:
        os.set_inheritable(connection, True)
        os.environ["AGENTOS_SOCKET_FD"] = str(connection)
    trace = request.get("trace")
    if trace:
        set_trace(trace)
    cwd = request.get("cwd") or WORKSPACE
    exit_code, error, not_code = 0, None, None
    try:
        write_files(request.get("files") or {})
    except (OSError, ValueError) as err:
        exit_code, error = 1, f"cannot write the request's files: {err}"
    try:
        if error is None and cwd != WORKSPACE:
            os.chdir(cwd)
    except OSError as err:
        exit_code, error = 1, f"cannot enter {cwd}: {err.strerror}"
    if error is None:
        if request.get("language") == LANGUAGE_BASH:
            shell_env = dict(env, TRACEPARENT=trace) if trace else env
            ran = shell.run(request["code"], shell_env, cwd) if shell else None
            exit_code, error = ran or run_bash(request["code"], dict(os.environ))
        else:
            exit_code, error, not_code = run_python(
                request["code"], scope,
                print_last_expression=request.get("print_last_expression", False),
                skip_if_not_code=request.get("skip_if_not_code", False),
            )
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    files, problems = collect_files(
        request.get("collect") or [],
        request.get("max_file_bytes") or 0,
        request.get("max_collect_bytes") or 0,
    )
    if connection is not None:
        os.environ.pop("AGENTOS_SOCKET_FD", None)
    if trace:
        clear_trace()
    end = {"exit_code": exit_code, "error": error, "files": files, "uncollected": problems}
    if not_code is not None:
        end["not_code"] = not_code
    return end


def run_python(code, scope, print_last_expression=False, skip_if_not_code=False):
    """Runs code as __main__ in ``scope``; returns (exit code, error
    sentence, why it is not code). With ``print_last_expression``, a last
    statement that is a bare expression has its value printed (as the
    interactive interpreter does; None prints nothing). With
    ``skip_if_not_code``, code that does not parse, or only states values
    (text a model set out as its answer), is not run: the third item says
    why."""
    try:
        if not (print_last_expression or skip_if_not_code):
            exec(compile(code, "<exec>", "exec"), scope)
            return 0, None, None
        try:
            tree = compile(code, "<exec>", "exec", ast.PyCF_ONLY_AST)
        except (SyntaxError, ValueError) as err:
            if skip_if_not_code:
                return 0, None, f"not Python: {type(err).__name__}: {err}"
            raise
        if skip_if_not_code and all(states_only_values(statement) for statement in tree.body):
            return 0, None, "it only states values: nothing in it runs"
        last = tree.body[-1] if print_last_expression and tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            exec(compile(tree, "<exec>", "exec"), scope)
            value = eval(compile(ast.Expression(last.value), "<exec>", "eval"), scope)
            if value is not None:
                print(repr(value))
        else:
            exec(compile(tree, "<exec>", "exec"), scope)
        return 0, None, None
    except SystemExit as stop:
        if stop.code is None:
            return 0, None, None
        if isinstance(stop.code, int):
            return stop.code, None, None
        print(stop.code, file=sys.stderr)
        return 1, None, None
    except BaseException as err:  # the run's own failure, reported as such
        # From the run's own code on: this file's frame is not the run's.
        traceback.print_exception(type(err), err, err.__traceback__.tb_next)
        return 1, f"{type(err).__name__}: {err}", None


# Expressions that only state a value: a literal, a name, containers of
# them, a sign on a number.
VALUE_NODES = (ast.Constant, ast.Name, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp,
               ast.expr_context, ast.unaryop)


def states_only_values(statement):
    """Whether ``statement`` does nothing but state a value: ``42``,
    ``{"total": 3}``, ``PELICAN``, ``answer: 42`` (an annotation with no
    value), ``pass``."""
    if isinstance(statement, ast.Pass):
        return True
    if isinstance(statement, ast.AnnAssign) and statement.value is None:
        return True
    if isinstance(statement, ast.Expr):
        return all(isinstance(node, VALUE_NODES) for node in ast.walk(statement.value))
    return False


def run_bash(code, env):
    # posix_spawn shares the address space until exec (no copy of this
    # interpreter's page tables, which a fork makes).
    pid = os.posix_spawn("/bin/bash", ["bash", "-c", code], env)
    return bash_status(pid)


def bash_status(pid):
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status), None
    return os.WEXITSTATUS(status), None


# The pre-started shell reads its script to the end from descriptor 3 and
# runs it as if given with -c; its kernel connection is descriptor 4.
SHELL_BOOTSTRAP = ". /proc/self/fd/3"


class Shell:
    """A bash started while the run waited, blocked reading its script: a
    bash run then costs no process start. It holds the run's output pipes
    and its first kernel connection, as a shell started for the run would."""

    def __init__(self, connection):
        read, self.script = os.pipe()
        # The shell finds its script at 3 and its connection at 4: both are
        # moved clear of those numbers first, so neither lands on the other.
        script_in = fcntl.fcntl(read, fcntl.F_DUPFD_CLOEXEC, 10)
        kernel = fcntl.fcntl(connection, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(read)
        env = dict(SETTINGS["run_env"], AGENTOS_SOCKET_FD="4")
        actions = [(os.POSIX_SPAWN_DUP2, script_in, 3), (os.POSIX_SPAWN_DUP2, kernel, 4)]
        try:
            self.pid = os.posix_spawn(
                "/bin/bash", ["bash", "--norc", "--noprofile", "-c", SHELL_BOOTSTRAP], env,
                file_actions=actions,
            )
        finally:
            os.close(script_in)
            os.close(kernel)

    def run(self, code, env, cwd):
        """Gives it the script: the request's environment and directory,
        then the code; returns how it ended. None (and it is stopped) if
        the environment cannot be said in bash."""
        lines = []
        for name, value in env.items():
            if not name.isidentifier() or not name.isascii():
                self.stop()
                return None
            lines.append(f"export {name}={quote(value)}")
        lines.append(f"cd -- {quote(cwd)} || exit 1")
        script = memoryview(("\n".join(lines) + "\n" + code + "\n").encode())
        try:
            while script:
                script = script[os.write(self.script, script):]
        except OSError:
            pass  # it died: its status says how
        finally:
            os.close(self.script)
        return bash_status(self.pid)

    def stop(self):
        os.close(self.script)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


def quote(value):
    return "'" + value.replace("'", "'\\''") + "'"


def set_trace(traceparent):
    """The run's span, for its code and the tool calls it makes."""
    os.environ["TRACEPARENT"] = traceparent


def clear_trace():
    os.environ.pop("TRACEPARENT", None)


def rehearse():
    """Touches the pages a run uses, so the first real one does not fault
    them in on the request path."""
    scope = {"__name__": "__rehearsal__"}
    # A traced run's TRACEPARENT: the first change to the environment in
    # a forked child copies pages of os.environ, of the C environment and
    # of the code that changes them (about 0.1 ms), paid here.
    set_trace("00-" + "0" * 32 + "-" + "0" * 16 + "-00")
    clear_trace()
    with open(os.devnull, "w") as sink:
        saved = sys.stdout
        sys.stdout = sink
        try:
            exec(compile(REHEARSAL, "<rehearsal>", "exec"), scope)
        finally:
            sys.stdout = saved
