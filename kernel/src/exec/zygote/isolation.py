# Isolation, through the C library (ctypes): the zygote's own user
# namespace, and each run child's namespaces, mounts, loopback, /proc and
# dropped privileges.
#
# The zygote first makes a user namespace of its own (the host's seccomp
# filter lets it), keeping the host's unprivileged uid there too, and
# becomes PID 1 of a PID namespace of its own. Each run child then gets
# fresh mount, PID, IPC, UTS and network namespaces owned by it: a
# private /tmp and /workspace, a /proc that shows only its own
# processes (guarded as an agent's is), a loopback of its own, and no way
# to see or signal another run. Before any code arrives it drops every
# capability, sets no_new_privs and installs the kernel's whole seccomp
# filter (sent in the settings) on top of the host's.

import ctypes
import fcntl
import os
import signal
import socket
import struct


libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
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


def own_pid_namespace():
    """Makes the zygote PID 1 of a PID namespace owned by its own user
    namespace, and returns a descriptor of it. Holding the capabilities of
    that namespace is what lets the zygote go back to it (setns) after
    each run's PID namespace: a process can make a PID namespace only for
    the children it forks next, and only while those would land in its
    own; going back is what makes the next one possible. Without it, each
    run would need a process of its own between the zygote and the run,
    forked from the whole interpreter, only to make the run's namespace
    (a second copy of the page tables and a second teardown per run).

    The process that started stays outside, only to wait: the kernel
    watches it as the host's workload, and it ends when the zygote does
    (and the zygote, and with it every run, when it does)."""
    check(libc.unshare(CLONE_NEWPID), "unshare(pid)")
    pid = os.fork()
    if pid != 0:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def fork_run_child(zygote_pid_namespace):
    """Forks a child that is PID 1 of a fresh PID namespace: 0 in the
    child, its pid in the zygote, whose next children land in its own
    namespace again (see `own_pid_namespace`)."""
    check(libc.unshare(CLONE_NEWPID), "unshare(pid)")
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0 and libc.setns(zygote_pid_namespace, CLONE_NEWPID) != 0:
            # Never prepare another run from here: its child would land in
            # this run's namespace. As PID 1, the zygote takes every run
            # with it; the kernel starts a new exec host.
            os.write(2, b"zygote: setns back to its own PID namespace failed\n")
            os._exit(71)
    return pid


def isolate_run():
    """In a new run child, PID 1 of its own PID namespace: its own mount,
    IPC, UTS and network namespaces, with a private /tmp and /workspace
    and a loopback of its own (runs of different owners share an exec
    host: on one loopback, or through abstract Unix sockets, they could
    reach each other)."""
    check(
        libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET),
        "unshare(run namespaces)",
    )
    loopback_up()
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    scratch = MS_NOSUID | MS_NODEV
    tmp = SETTINGS["tmp_bytes"]
    mount("tmpfs", "/tmp", "tmpfs", scratch, f"size={tmp},mode=1777")
    workspace = SETTINGS["workspace_bytes"]
    mount("tmpfs", WORKSPACE, "tmpfs", scratch, f"size={workspace},mode=700")
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
