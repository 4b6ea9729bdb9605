# The exec host's interpreter: it never runs request code itself. For
# each run child the kernel asks for, it forks one from its own warm image,
# rehearsed (its pages touched by a sample run) and blocked waiting for
# code, and hands it to the kernel over its channel (fd 8, see
# sandbox::spec::fds) as three descriptors: the run's socket, the read ends
# of its stdout and stderr pipes. A run child serves one run (or, for a
# session, many), then exits; the zygote reaps it.
#
# Isolation per run. The zygote first makes a user namespace of its own
# (the host's seccomp filter lets it), keeping the host's unprivileged uid
# there too. Each run child then gets fresh mount, PID,
# IPC and UTS namespaces owned by it: a private /tmp and /workspace, a
# /proc that shows only its own processes (guarded as an agent's is), and
# no way to see or signal another run. Before any code arrives it drops
# every capability, sets no_new_privs and installs the kernel's whole
# seccomp filter (sent by the kernel) on top of the host's. Its
# first message on its socket carries a pidfd of itself, PID 1 of its
# namespace: killing it ends everything the run started.
#
# Run socket frames, both ways: a 4-byte little-endian length, then JSON.
#   kernel -> run:  first, once it is ready: {"op": "prepare", "shell":
#                   true|false} with its first run's own kernel connection
#                   attached (a shell, if asked, is started with it at
#                   once); then orders:
#                   {"op": "run", "code": "...",
#                    "language": "python"|"bash", "env": {...},
#                    "cwd": "..." | null, "files": {...}, "collect": [...],
#                    "max_file_bytes": n, "keep": false, "join": n}
#                   with the run's own kernel connection attached (none
#                   for the first run: it came with "prepare"), after the
#                   "join" files, if any: an agent's work moves into a
#                   cgroup inside the agent's before anything else; or
#                   {"op": "snapshot"|"restore", "keep": true} with a
#                   memfd attached: the session's /workspace is written
#                   into it (a gzip'd tar of its directories and regular
#                   files), or replaced by what it holds
#   run -> kernel:  {"exit_code": 0, "error": null | "Type: message",
#                    "files": {...}, "uncollected": [...],
#                    "workspace_bytes": n, "left_out": [...]}
# A run kept for a session ("keep": true) stays with its interpreter state
# and /workspace: after its end frame it sends one byte "P" with the read
# ends of fresh stdout and stderr pipes, and waits for its next order.
# Channel messages (one datagram each, descriptors as SCM_RIGHTS):
#   zygote -> kernel:  {"ready": <run number>, "cgroup": <cgroup number>}
#                      [run socket, stdout, stderr]
#   kernel -> zygote:  the settings first; then, for each run child it
#                      wants prepared, {"cgroup": <number>} [one file per
#                      hierarchy]: the child writes "0" into each to move
#                      itself into its own cgroup, then closes them (number
#                      0 and no files: it stays in the host's cgroup); and
#                      {"reload_tools": true} when the kernel's tools have
#                      changed: the `tools` package is imported again.
#
# Started as `python -I -S -c <this>`: no site, no user paths, nothing from
# the environment but what the kernel set.

import base64
import ctypes
import fcntl
import gc
import importlib
import json
import stat
import os
import signal
import socket
import struct
import sys
import traceback

CHANNEL_FD = 8
# Set by main() from the kernel's first datagram on the channel (never the
# environment: every run can read PID 1's initial environment).
SETTINGS = {}
REHEARSAL = "total = sum(range(100))\nprint(total)\n"

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def write(path, text):
    with open(path, "w") as file:
        file.write(text)


def mount(source, target, fstype, flags, data=None):
    check(
        libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def own_namespaces():
    """Gives the zygote a user namespace of its own, so it may make the
    namespaces of its runs. Its uid there is its uid outside, the host's
    unprivileged one: it holds the namespace's capabilities as its creator,
    not as root, and every run is that uid too (never uid 0, even inside)."""
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(CLONE_NEWUSER), "unshare(user)")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", f"{uid} {uid} 1")
    write("/proc/self/gid_map", f"{gid} {gid} 1")


def isolate_run():
    """In a new run child: its own mount, PID, IPC, UTS and network
    namespaces, with a private /tmp and /workspace and a loopback of its
    own (runs of different owners share an exec host: on one loopback, or
    through abstract Unix sockets, they could reach each other). The PID
    namespace holds the next child forked, which is PID 1 there."""
    check(
        libc.unshare(
            CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET
        ),
        "unshare(run namespaces)",
    )
    loopback_up()
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    scratch = MS_NOSUID | MS_NODEV
    tmp = SETTINGS["tmp_bytes"]
    mount("tmpfs", "/tmp", "tmpfs", scratch, f"size={tmp},mode=1777")
    workspace = SETTINGS["workspace_bytes"]
    mount("tmpfs", "/workspace", "tmpfs", scratch, f"size={workspace},mode=700")
    check(libc.sethostname(b"run", 3), "sethostname")


def loopback_up():
    """Brings up the loopback of the run's own network namespace (struct
    ifreq: a 16-byte name, then its flags, 40 bytes in all)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def guard_proc():
    """PID 1 of a run: a /proc of its own namespace, guarded as an agent's."""
    locked = MS_NOSUID | MS_NODEV | MS_NOEXEC
    mount("proc", "/proc", "proc", locked)
    for name in SETTINGS["proc_read_only"]:
        path = f"/proc/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked)
    for name in SETTINGS["proc_masked"]:
        path = f"/proc/{name}"
        if os.path.exists(path):
            mount("/dev/null", path, None, MS_BIND)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def drop_privileges(program):
    """No capabilities, no_new_privs, and the kernel's seccomp filter: from
    here on the run can do no more than an agent can."""
    for capability in range(64):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient")
    header = CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (CapData * 2)()
    check(libc.capset(ctypes.byref(header), data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    check(
        libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
        "seccomp",
    )


def send_frame(sock, value):
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def receive_order(sock):
    """An order, and the descriptors that come with its first bytes (None,
    [] when the kernel has gone)."""
    header, fds, _, _ = socket.recv_fds(sock, 4, 8)
    if not header:
        return None, []
    if len(header) < 4:
        rest = receive_exactly(sock, 4 - len(header))
        if rest is None:
            return None, []
        header += rest
    (length,) = struct.unpack("<I", header)
    body = receive_exactly(sock, length)
    if body is None:
        return None, []
    return json.loads(body), fds


def receive_exactly(sock, length):
    chunks = []
    while length:
        chunk = sock.recv(min(length, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def run_python(code, scope):
    """Runs code as __main__ in ``scope``; returns (exit code, error
    sentence)."""
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
        # From the run's own code on: this file's frame is not the run's.
        traceback.print_exception(type(err), err, err.__traceback__.tb_next)
        return 1, f"{type(err).__name__}: {err}"


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


WORKSPACE = "/workspace"


def open_beneath(path, flags, create_dirs=False):
    """Opens /workspace/<path> without following a symlink anywhere on the
    way (the kernel checked the path is plain and relative). Directories
    missing on the way are made when ``create_dirs``."""
    *dirs, name = path.split("/")
    directory = walk_beneath(dirs, create_dirs)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory)
    finally:
        os.close(directory)


def walk_beneath(dirs, create):
    """A descriptor of /workspace/<dirs...>, each opened without following
    a symlink, each made first if ``create`` and missing."""
    directory = os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in dirs:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=directory)
                except FileExistsError:
                    pass
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = inner
    except BaseException:
        os.close(directory)
        raise
    return directory


def write_files(files):
    for path, content in files.items():
        fd = open_beneath(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create_dirs=True)
        with os.fdopen(fd, "wb") as file:
            file.write(base64.b64decode(content))


def collect_files(paths, max_bytes, budget):
    """The named files' contents (base64), and why any could not be read:
    each within ``max_bytes``, all within ``budget``."""
    files, problems = {}, []
    for path in paths:
        try:
            fd = open_beneath(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            problems.append(f"cannot collect {path}: no such file in /workspace")
            continue
        except OSError as err:
            problems.append(f"cannot collect {path}: {err.strerror}")
            continue
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"cannot collect {path}: not a regular file")
            elif info.st_size > max_bytes:
                problems.append(
                    f"cannot collect {path}: {info.st_size} bytes, over {max_bytes}"
                )
            elif info.st_size > budget:
                problems.append(
                    f"cannot collect {path}: the files collected would not fit in the reply"
                )
            else:
                data = file.read(info.st_size)
                budget -= len(data)
                files[path] = base64.b64encode(data).decode()
    return files, problems


def workspace_bytes():
    total = 0
    for root, dirs, files in os.walk(WORKSPACE):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


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


def serve_run(sock, stdout_w, stderr_w):
    """The run child: wait for code, run it with its output on the pipes,
    report how it ended; for a session, again and again."""
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    place_output(stdout_w, stderr_w)
    settle_in()
    first_connection, shell = None, None
    while True:
        request, fds = receive_order(sock)
        if request is None:
            os._exit(0)
        keep = bool(request.get("keep"))
        op = request.get("op", "run")
        join = request.get("join", 0)
        joins, rest = fds[:join], fds[join:]
        attached = rest[0] if rest else None
        for extra in rest[1:]:
            os.close(extra)
        if op == "prepare":
            first_connection = attached
            if request.get("shell") and attached is not None:
                shell = Shell(attached)
            continue
        if shell is not None and (
            joins or op != "run" or request.get("language") != "bash"
        ):
            # It holds the output pipes: they would never close. (And a
            # shell started before a move into the agent's cgroup would
            # stay outside it.)
            shell.stop()
            shell = None
        refused = join_agent_cgroup(joins) if joins else None
        if refused is not None:
            # Half moved, it serves no more orders.
            end, keep = refused, False
        elif op == "snapshot":
            end = save_workspace(attached)
        elif op == "restore":
            end = restore_workspace(attached)
        else:
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
        for fd in (1, 2):
            try:
                os.close(fd)
            except OSError:
                pass  # the code closed it itself
        send_frame(sock, end)
        if op == "run" and attached is not None:
            try:
                os.close(attached)
            except OSError:
                pass
        if not keep:
            sock.close()
            os._exit(0)
        # Hold 1 and 2 with /dev/null, so the new pipes land elsewhere.
        null = os.open(os.devnull, os.O_RDWR)
        for target in (1, 2):
            if target != null:
                os.dup2(null, target)
        if null not in (1, 2):
            os.close(null)
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        place_output(stdout_w, stderr_w)
        if os.getcwd() != WORKSPACE or dict(os.environ) != SETTINGS["run_env"]:
            settle_in()
        socket.send_fds(sock, [b"P"], [stdout_r, stderr_r])
        os.close(stdout_r)
        os.close(stderr_r)


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
    cwd = request.get("cwd") or WORKSPACE
    exit_code, error = 0, None
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
        if request.get("language") == "bash":
            ran = shell.run(request["code"], env, cwd) if shell else None
            exit_code, error = ran or run_bash(request["code"], dict(os.environ))
        else:
            exit_code, error = run_python(request["code"], scope)
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
    return {"exit_code": exit_code, "error": error, "files": files, "uncollected": problems}


def save_workspace(fd):
    """Writes the directories and regular files of /workspace into ``fd``
    as a gzip'd tar. Symlinks and special files are left out (and named):
    none is ever followed."""
    import tarfile

    left_out, saved = [], 0
    try:
        with os.fdopen(fd, "wb") as sink, tarfile.open(fileobj=sink, mode="w:gz") as tar:
            pending = [""]
            while pending:
                relative = pending.pop()
                for name, kind in list_beneath(relative, left_out):
                    path = f"{relative}/{name}" if relative else name
                    if kind == "dir":
                        info = tarfile.TarInfo(path)
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)
                        pending.append(path)
                    elif kind == "file":
                        saved += add_file(tar, path, left_out)
                    else:
                        left_out.append(path)
    except (OSError, tarfile.TarError) as err:
        return {"exit_code": 1, "error": f"cannot take the snapshot: {err}", "left_out": left_out}
    return {"exit_code": 0, "error": None, "left_out": left_out, "snapshot_bytes": saved}


def list_beneath(relative, left_out):
    """The entries of a directory under /workspace as (name, kind), opened
    without following a symlink on the way (one swapped in meanwhile is
    left out, not followed)."""
    try:
        if relative:
            fd = open_beneath(relative, os.O_RDONLY | os.O_DIRECTORY)
        else:
            fd = os.open(WORKSPACE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        left_out.append(relative)
        return []
    try:
        listed = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    kind = "dir"
                elif entry.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    kind = "other"
                listed.append((entry.name, kind))
        return sorted(listed)
    finally:
        os.close(fd)


def add_file(tar, path, left_out):
    """Adds one regular file, opened without following a symlink (it may
    have been swapped for one); returns its size."""
    import tarfile

    try:
        fd = open_beneath(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        left_out.append(path)
        return 0
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            left_out.append(path)
            return 0
        info = tarfile.TarInfo(path)
        info.size = status.st_size
        info.mode = 0o755 if status.st_mode & 0o111 else 0o644
        info.mtime = int(status.st_mtime)
        tar.addfile(info, file)
        return info.size


def restore_workspace(fd):
    """Empties /workspace and fills it from the snapshot in ``fd``: only
    directories and regular files at plain relative paths are made (anything
    else is left out and named), never through a symlink."""
    import shutil
    import tarfile

    for entry in os.scandir(WORKSPACE):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    left_out = []
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        with os.fdopen(fd, "rb") as source, tarfile.open(fileobj=source, mode="r:gz") as tar:
            for member in tar:
                parts = member.name.split("/")
                plain = all(part not in ("", ".", "..") for part in parts)
                if not plain or not (member.isdir() or member.isfile()):
                    left_out.append(member.name)
                elif member.isdir():
                    os.close(walk_beneath(parts, create=True))
                else:
                    write_member(tar, member, left_out)
    except (OSError, tarfile.TarError, EOFError) as err:
        return {"exit_code": 1, "error": f"cannot restore the snapshot: {err}", "left_out": left_out}
    return {"exit_code": 0, "error": None, "left_out": left_out}


def write_member(tar, member, left_out):
    try:
        fd = open_beneath(member.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, create_dirs=True)
    except OSError:
        left_out.append(member.name)
        return
    with os.fdopen(fd, "wb") as file, tar.extractfile(member) as content:
        while chunk := content.read(1 << 20):
            file.write(chunk)
        os.fchmod(file.fileno(), 0o755 if member.mode & 0o111 else 0o644)


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


def next_cgroup(channel):
    """Waits for the kernel to ask for the next run child: the number of
    its cgroup and the files that move a process into it (0 and none: it
    has no cgroup of its own)."""
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 256, 8)
        if not message:
            raise SystemExit(0)  # the kernel has gone
        order = json.loads(message)
        if order.get("reload_tools"):
            import_tools()
            continue
        return order["cgroup"], fds


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


def join_agent_cgroup(files):
    """Moves this run child into the cgroup inside its agent's that the
    kernel sent, before any of the agent's code runs: what it uses from now
    on counts against the agent's limits. None once moved; if it cannot
    move, the end frame that refuses the order (the code never runs
    outside the agent's limits)."""
    try:
        join_cgroup(files)
        return None
    except OSError as err:
        for fd in files:
            try:
                os.close(fd)
            except OSError:
                pass
        return {
            "exit_code": 1,
            "error": f"cannot enter the agent's cgroup: {err.strerror}; nothing ran",
            "files": {},
            "uncollected": [],
        }


def join_cgroup(files):
    """Moves this (single-threaded) process into the run's cgroup: each
    write moves the writing thread only, which takes no global lock."""
    for fd in files:
        os.write(fd, b"0")
        os.close(fd)


def prepare(channel, number, program, cgroup):
    """Forks one run child and hands its descriptors to the kernel."""
    cgroup_number, cgroup_files = cgroup
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            join_cgroup(cgroup_files)
            channel.close()
            ours.close()
            os.close(stdout_r)
            os.close(stderr_r)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            isolate_run()
            run = os.fork()
            if run == 0:
                become_run(theirs, stdout_w, stderr_w, program)
            # Stays as the run's parent, only to say when it has ended.
            theirs.close()
            os.close(stdout_w)
            os.close(stderr_w)
            _, status = os.waitpid(run, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(70)
    for fd in cgroup_files:
        os.close(fd)
    theirs.close()
    os.close(stdout_w)
    os.close(stderr_w)
    message = json.dumps({"ready": number, "cgroup": cgroup_number}).encode()
    socket.send_fds(channel, [message], [ours.fileno(), stdout_r, stderr_r])
    ours.close()
    os.close(stdout_r)
    os.close(stderr_r)
    return pid


def become_run(sock, stdout_w, stderr_w, program):
    """PID 1 of the run's namespace: guard its /proc, tell the kernel how to
    kill it, give up every privilege, rehearse, then wait for code."""
    try:
        guard_proc()
        pidfd = os.pidfd_open(os.getpid())
        socket.send_fds(sock, [b"R"], [pidfd])
        os.close(pidfd)
        drop_privileges(program)
        rehearse()
        serve_run(sock, stdout_w, stderr_w)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(70)


def main():
    # Preparing runs is background work: it yields the CPU to every run and
    # request. The kernel gives each run normal priority back once it is
    # prepared (an unprivileged process cannot leave the idle class).
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    channel = socket.socket(fileno=CHANNEL_FD)
    channel.setblocking(True)
    SETTINGS.update(json.loads(channel.recv(1 << 20)))
    program = bytes.fromhex(SETTINGS["run_filter"])
    if not program:
        raise SystemExit("the kernel sent no seccomp filter: runs would have none")
    own_namespaces()
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
        prepare(channel, number, program, cgroup)


def reap(_signum, _frame):
    """Reaps every child that has ended (a run's waiting parent, once its
    run is over), so none lingers as a zombie holding its cgroup's pids."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    main()
