# A run child's life: PID 1 of its run's namespaces, it guards its /proc,
# sends the kernel its pidfd, gives up every privilege and rehearses; then
# it serves orders (one, or for a session many, handing over fresh output
# pipes after each) and exits.

import os
import sys
import traceback


def become_run(sock, stdout_w, stderr_w, program):
    """PID 1 of the run's namespace: guard its /proc, tell the kernel how to
    kill it, give up every privilege, rehearse, then wait for code."""
    try:
        guard_proc()
        pidfd = os.pidfd_open(os.getpid())
        send_pidfd(sock, pidfd)
        os.close(pidfd)
        drop_privileges(program)
        rehearse()
        serve_run(sock, stdout_w, stderr_w)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(70)


def serve_run(sock, stdout_w, stderr_w):
    """The run child: wait for code, run it with its output on the pipes,
    report how it ended; for a session, again and again."""
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    # The tools package is there without an import, as a notebook's names
    # are: code a small model writes often calls tools.x.y() and forgets
    # the import line. (`import tools` gives the same module.)
    if "tools" in sys.modules:
        scope["tools"] = sys.modules["tools"]
    place_output(stdout_w, stderr_w)
    settle_in()
    first_connection, shell = None, None
    while True:
        request, fds = receive_order(sock)
        if request is None:
            os._exit(0)
        reap_stewards()
        keep = bool(request.get("keep"))
        if request.get("on_disk") or request.get("template"):
            settle_on_disks(request.get("on_disk"), request.get("template"))
        op = request.get("op", OP_RUN)
        join = request.get("join", 0)
        joins, rest = fds[:join], fds[join:]
        # A fresh interpreter's saved globals come last.
        state = rest.pop() if request.get("load_state") and rest else None
        attached = rest[0] if rest else None
        for extra in rest[1:]:
            os.close(extra)
        if op == OP_PREPARE:
            if attached is None:
                continue  # a template settled into, no connection
            first_connection = attached
            if request.get("shell") and attached is not None:
                shell = Shell(attached)
            continue
        if shell is not None and (
            joins or op != OP_RUN or request.get("language") != LANGUAGE_BASH
        ):
            # It holds the output pipes: they would never close. (And a
            # shell started before a move into the agent's cgroup would
            # stay outside it.)
            shell.stop()
            shell = None
        refused = join_agent_cgroup(joins) if joins else None
        not_loaded = load_state(scope, state) if state is not None else []
        if refused is not None:
            # Half moved, it serves no more orders.
            end, keep = refused, False
        elif op == OP_SNAPSHOT:
            end = save_state(scope, attached) if attached is not None else {"exit_code": 0}
        elif op == OP_RESTORE:
            end = {"exit_code": 0, "left_out": not_loaded}
        elif op == OP_STEWARD:
            end = (
                start_steward(attached, request.get("env"))
                if attached is not None
                else {"exit_code": 1, "error": "no steward socket came"}
            )
        else:
            if not_loaded:
                print("globals not restored: " + "; ".join(not_loaded), file=sys.stderr)
            if attached is None:
                attached, first_connection = first_connection, None
            end = run_order(request, scope, attached, shell)
            shell = None
        if keep:
            end["workspace_bytes"] = workspace_bytes()
        # What the kernel waits on, all at once: the output pipes close and
        # the end frame follows. Then the rest, after the reply: the run's
        # kernel connection closes, and this process is torn down (its
        # address space first) or renews its pipes.
        hold_output()
        send_frame(sock, end)
        if op == OP_RUN and attached is not None:
            try:
                os.close(attached)
            except OSError:
                pass
        if not keep:
            sock.close()
            os._exit(0)
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        place_output(stdout_w, stderr_w)
        if os.getcwd() != WORKSPACE or dict(os.environ) != SETTINGS["run_env"]:
            settle_in()
        send_pipes(sock, [stdout_r, stderr_r])
        os.close(stdout_r)
        os.close(stderr_r)


def hold_output():
    """The run's output pipes close: /dev/null takes their place on 1 and
    2 at once (dup2), never leaving either free. A thread the run left
    going could otherwise be given 1 or 2 by its next open(), which the
    next run's pipes would then take from it (and it close under them)."""
    null = os.open(os.devnull, os.O_RDWR)
    for target in (1, 2):
        if target != null:
            os.dup2(null, target)
    if null not in (1, 2):
        os.close(null)


def place_output(stdout_w, stderr_w):
    """The pipes become the run's stdout and stderr, before code arrives."""
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.close(stdout_w)
    os.close(stderr_w)


def settle_in():
    """What every run starts with, set while waiting rather than on the
    request path: the base environment and /workspace as the directory."""
    os.environ.clear()
    os.environ.update(SETTINGS["run_env"])
    os.chdir(WORKSPACE)
