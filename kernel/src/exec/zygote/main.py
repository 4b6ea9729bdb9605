# The zygote's main loop. The exec host's interpreter never runs request
# code itself: for each run child the kernel asks for, it forks one from
# its own warm image, rehearsed and blocked waiting for code, and hands it
# to the kernel over its channel. A run child serves one run (or, for a
# session, many), then exits; the zygote reaps it.
#
# Started as `python -I -S -c <the joined parts>`: no site, no user paths,
# nothing from the environment but what the kernel set.

import gc
import importlib
import os
import signal
import socket
import sys
import traceback


def main():
    # Preparing runs is background work: it leaves most of the CPU to runs
    # and requests, but is never starved. The kernel gives each run normal
    # priority back once it is prepared (an unprivileged process cannot
    # lower its nice value again).
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(nice, BACKGROUND_NICE))
    channel = socket.socket(fileno=CHANNEL_FD)
    channel.setblocking(True)
    SETTINGS.update(receive_settings(channel))
    program = bytes.fromhex(SETTINGS["run_filter"])
    if not program:
        raise SystemExit("the kernel sent no seccomp filter: runs would have none")
    own_namespaces()
    pid_namespace = own_pid_namespace()
    if os.getpid() != 1:
        raise SystemExit("the zygote is not PID 1 of its own PID namespace")
    install_site_builtins()
    import_tools()
    # Everything the zygote holds now is permanent: no collection in a run
    # child ever walks (and so copies) the pages it shares with the zygote.
    gc.collect()
    gc.freeze()
    # The kernel decides how many children are prepared: one per request.
    # (Children kept by sessions live on without holding up new ones.)
    signal.signal(signal.SIGCHLD, reap)
    number = 0
    while True:
        cgroup = next_cgroup(channel)
        number += 1
        prepare(channel, number, program, cgroup, pid_namespace)


def next_cgroup(channel):
    """Waits for the kernel to ask for the next run child: the number of
    its cgroup and the files that move a process into it (0 and none: it
    has no cgroup of its own)."""
    while True:
        order, fds = receive_host_order(channel)
        if order is None:
            raise SystemExit(0)  # the kernel has gone
        if order.get(HOST_RELOAD_TOOLS):
            import_tools()
            continue
        return order[HOST_PREPARE], fds


def prepare(channel, number, program, cgroup, pid_namespace):
    """Forks one run child, PID 1 of its own namespaces, and hands its
    descriptors to the kernel."""
    cgroup_number, cgroup_files = cgroup
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    try:
        pid = fork_run_child(pid_namespace)
    except OSError:
        # No PID namespace or no process to be had (the user namespace's
        # limits, memory): this child is lost, not the host and its
        # sessions. The kernel sees its channel end at once.
        traceback.print_exc()
        pid = None
    if pid == 0:
        try:
            # Into its own cgroup first, so all it touches from here on
            # is charged there.
            join_cgroup(cgroup_files)
            channel.close()
            ours.close()
            os.close(stdout_r)
            os.close(stderr_r)
            os.close(pid_namespace)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            isolate_run()
            become_run(theirs, stdout_w, stderr_w, program)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(70)
    for fd in cgroup_files:
        os.close(fd)
    theirs.close()
    os.close(stdout_w)
    os.close(stderr_w)
    send_ready(channel, number, cgroup_number, [ours.fileno(), stdout_r, stderr_r])
    ours.close()
    os.close(stdout_r)
    os.close(stderr_r)
    return pid


def import_tools():
    """Imports the kernel's `tools` package (again), so every run child
    forked from here has it loaded. A broken catalog leaves runs without
    tools, never without a zygote."""
    path = SETTINGS.get("tools_path")
    if not path:
        return
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        if "tools" in sys.modules:
            importlib.reload(sys.modules["tools"])
        else:
            importlib.import_module("tools")
    except Exception:
        traceback.print_exc()


def reap(_signum, _frame):
    """Reaps every run child that has ended, so none lingers as a zombie
    holding its cgroup's pids."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    main()
