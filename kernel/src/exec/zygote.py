# The exec host's interpreter: it never runs request code itself. It keeps
# a few run children forked from its own warm image, each rehearsed (its
# pages touched by a sample run) and blocked waiting for code, and hands
# each to the kernel over its channel (fd 8, see sandbox::spec::fds) as
# three descriptors: the run's socket, the read ends of its stdout and
# stderr pipes. A run child serves one run (or, for a session, many), then
# exits; the zygote reaps it and prepares another.
#
# Run socket frames, both ways: a 4-byte little-endian length, then JSON.
#   kernel -> run:  {"code": "...", "language": "python"|"bash",
#                    "env": {...}, "cwd": "..." | null}
#   run -> kernel:  {"exit_code": 0, "error": null | "Type: message"}
# Channel messages, zygote -> kernel (one datagram each, descriptors as
# SCM_RIGHTS):  {"ready": <run number>}  [run socket, stdout, stderr]
#
# Started as `python -I -S -c <this>`: no site, no user paths, nothing from
# the environment but what the kernel set.

import gc
import json
import os
import signal
import socket
import struct
import sys
import traceback

CHANNEL_FD = 8
READY_RUNS = int(os.environ.get("AGENTOS_EXEC_READY_RUNS", "4"))
REHEARSAL = "total = sum(range(100))\nprint(total)\n"


def send_frame(sock, value):
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def receive_frame(sock):
    header = receive_exactly(sock, 4)
    if header is None:
        return None
    (length,) = struct.unpack("<I", header)
    body = receive_exactly(sock, length)
    return None if body is None else json.loads(body)


def receive_exactly(sock, length):
    chunks = []
    while length:
        chunk = sock.recv(min(length, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def run_python(code):
    """Runs code as __main__; returns (exit code, error sentence)."""
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<exec>", "exec"), scope)
        return 0, None
    except SystemExit as stop:
        if stop.code is None:
            return 0, None
        if isinstance(stop.code, int):
            return stop.code, None
        print(stop.code, file=sys.stderr)
        return 1, None
    except BaseException as err:  # the run's own failure, reported as such
        traceback.print_exc()
        return 1, f"{type(err).__name__}: {err}"


def run_bash(code, env):
    pid = os.fork()
    if pid == 0:
        try:
            os.execve("/bin/bash", ["bash", "-c", code], env)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status), None
    return os.WEXITSTATUS(status), None


def serve_run(sock, stdout_w, stderr_w):
    """The run child: wait for code, run it with its output on the pipes,
    report how it ended."""
    request = receive_frame(sock)
    if request is None:
        os._exit(0)
    env = dict(request.get("env") or {})
    os.environ.clear()
    os.environ.update(env)
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.close(stdout_w)
    os.close(stderr_w)
    cwd = request.get("cwd")
    exit_code, error = 0, None
    try:
        if cwd:
            os.chdir(cwd)
    except OSError as err:
        exit_code, error = 1, f"cannot enter {cwd}: {err.strerror}"
    if error is None:
        if request.get("language") == "bash":
            exit_code, error = run_bash(request["code"], env)
        else:
            exit_code, error = run_python(request["code"])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    send_frame(sock, {"exit_code": exit_code, "error": error})
    os._exit(0)


def rehearse():
    """Touches the pages a run uses, so the first real one does not fault
    them in on the request path."""
    scope = {"__name__": "__rehearsal__"}
    with open(os.devnull, "w") as sink:
        saved = sys.stdout
        sys.stdout = sink
        try:
            exec(compile(REHEARSAL, "<rehearsal>", "exec"), scope)
        finally:
            sys.stdout = saved


def prepare(channel, number):
    """Forks one run child and hands its descriptors to the kernel."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            channel.close()
            ours.close()
            os.close(stdout_r)
            os.close(stderr_r)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            rehearse()
            gc.collect()
            gc.freeze()
            serve_run(theirs, stdout_w, stderr_w)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(70)
    theirs.close()
    os.close(stdout_w)
    os.close(stderr_w)
    message = json.dumps({"ready": number}).encode()
    socket.send_fds(channel, [message], [ours.fileno(), stdout_r, stderr_r])
    ours.close()
    os.close(stdout_r)
    os.close(stderr_r)
    return pid


def main():
    channel = socket.socket(fileno=CHANNEL_FD)
    children = set()
    number = 0
    while True:
        while len(children) < READY_RUNS:
            number += 1
            children.add(prepare(channel, number))
        # Wait for a child to end (it served its run) or the kernel to go.
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            continue
        children.discard(pid)


if __name__ == "__main__":
    main()
