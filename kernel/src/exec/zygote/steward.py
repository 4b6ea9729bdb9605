# A session's steward: forked by its run child (PID 1 of the session's
# namespaces) on the kernel's order, it starts programs in the session
# as `docker exec` does, reaps them and says how they ended. Being a
# fork, it has exactly what the sandbox has: its uid, namespaces,
# cgroup, seccomp filter and rlimits. The kernel made each program's
# pipes on the host and keeps their other ends, so output never passes
# through here.
#
# Orders and reports are frames (FRAME_LENGTH, then JSON) on the
# steward's socket, descriptors attached to an order's first bytes:
#   start {ref, argv, env, cwd, stdin, pty}, fds [stdout, stderr(, stdin)]
#       or, with pty, [the PTY's slave]
#       -> started {ref, pid, cwd} | failed {ref, errno, error}
#   signal {ref, pid, signal} -> signalled {ref, sent}
#   file {ref, call} -> done {ref, reply} | failed {ref, errno, error}
#       (steward_files.py)
# and, unasked, hello {pid} first and ended {pid, exit_code, signal}.

import errno
import selectors
import signal
import subprocess

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
TIOCSCTTY = 0x540E


def start_steward(sock, base_env):
    """Forks the steward on `sock` (then closed here); the run child goes
    on at once."""
    try:
        pid = os.fork()
    except OSError as err:
        os.close(sock)
        return {"exit_code": 1, "error": f"cannot fork the steward: {err.strerror}"}
    if pid:
        os.close(sock)
        STEWARDS.append(pid)
        return {"exit_code": 0}
    try:
        steward(sock, dict(base_env or {}))
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(0)


# The stewards this interpreter forked: reaped once they end, so that
# none holds one of the session's pids.
STEWARDS = []


def reap_stewards():
    """Reaps the stewards that have ended (never another child: those are
    the runs' own)."""
    for pid in list(STEWARDS):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            STEWARDS.remove(pid)


def steward(sock_fd, base_env):
    """The steward's life: leave the run's descriptors behind, then serve
    orders until the kernel goes."""
    os.setsid()
    # What the session's code did to its signals is not its processes'.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    # Orphans of `cmd &` are reaped here, not left to PID 1; and no other
    # process of the sandbox's uid may open this one's descriptors.
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # fds 1 and 2 are the run's output pipes, which must close for the
    # run to end.
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.dup2(sock_fd, 3)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    os.set_inheritable(3, False)
    sock = socket.socket(fileno=3)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    send_frame(sock, {"hello": os.getpid()})
    serve_steward(sock, wake_r, base_env)


def serve_steward(sock, wake_r, base_env):
    """Orders in, reports out, children reaped, until the kernel closes
    (or can no longer be told): then its processes are killed."""
    children = {}
    try:
        serve_orders(sock, wake_r, base_env, children)
    except OSError:
        pass
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def serve_orders(sock, wake_r, base_env, children):
    events = selectors.DefaultSelector()
    events.register(sock, selectors.EVENT_READ)
    events.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in events.select():
            if key.fileobj is sock:
                order, fds = receive_order(sock)
                if order is None:
                    # The kernel has let it go.
                    return
                report = carry_out(order, fds, children, base_env)
                if report is not None:
                    send_frame(sock, report)
                if WATCHING.fd is not None and not WATCHING.registered:
                    events.register(WATCHING.fd, selectors.EVENT_READ)
                    WATCHING.registered = True
            elif key.fileobj == WATCHING.fd:
                for report in WATCHING.reports():
                    send_frame(sock, report)
            else:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
        reap_processes(sock, children)


def carry_out(order, fds, children, base_env):
    """One order's report (none for `unwatch`); the descriptors that
    came with it are closed."""
    ref = order.get("ref")
    try:
        if order.get("op") == "start":
            process, cwd = start_process(order, fds, base_env)
            children[process.pid] = process
            return {"started": ref, "pid": process.pid, "cwd": cwd}
        if order.get("op") == "signal":
            # Its group, even once its leader has gone: what it started
            # may still hold its output.
            try:
                os.killpg(int(order["pid"]), int(order["signal"]))
            except ProcessLookupError:
                return {"signalled": ref, "sent": False}
            return {"signalled": ref, "sent": True}
        if order.get("op") == "file":
            return {"done": ref, "reply": file_op(order["call"], ref)}
        if order.get("op") == "unwatch":
            # Never answered: the kernel has ended the watch already.
            WATCHING.unwatch(ref)
            return None
        return {"failed": ref, "errno": errno.EINVAL, "error": "no such order"}
    except OSError as err:
        return {"failed": ref, "errno": err.errno or 0, "error": err.strerror or str(err)}
    except Exception as err:  # noqa: BLE001 - one order fails, not the steward
        return {"failed": ref, "errno": errno.EINVAL, "error": str(err)}
    finally:
        for fd in fds:
            os.close(fd)


def start_process(order, fds, base_env):
    """The program of a start order, in a process group of its own, on
    the pipes that came with it; and where it started."""
    env = dict(base_env)
    env.update(order.get("env") or {})
    cwd = order.get("cwd") or env.get("HOME") or WORKSPACE
    terminal = None
    if order.get("pty"):
        # A session of its own, whose controlling terminal the PTY is.
        env.setdefault("TERM", "xterm-256color")
        terminal = stdin = stdout = stderr = fds[0]
    else:
        stdout, stderr = fds[0], fds[1]
        stdin = fds[2] if order.get("stdin") and len(fds) > 2 else subprocess.DEVNULL
    process = subprocess.Popen(
        order["argv"],
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        preexec_fn=take_terminal if terminal is not None else None,
    )
    return process, cwd


def take_terminal():
    """In a PTY's process, after setsid: its stdin becomes its controlling
    terminal."""
    fcntl.ioctl(0, TIOCSCTTY, 0)


def reap_processes(sock, children):
    """Every child that has ended: ours are reported, orphans of theirs
    that came to us are reaped unsaid."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        process = children.pop(pid, None)
        if process is None:
            continue
        # Popen would reap it again otherwise.
        process.returncode = os.waitstatus_to_exitcode(status)
        ended = {"ended": pid, "exit_code": None, "signal": None}
        if os.WIFSIGNALED(status):
            ended["signal"] = os.WTERMSIG(status)
        else:
            ended["exit_code"] = os.WEXITSTATUS(status)
        send_frame(sock, ended)
