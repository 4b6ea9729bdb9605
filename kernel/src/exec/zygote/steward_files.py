# A session's files, as its steward carries out EXEC's file ops: `stat`,
# `list`, `mkdir`, `move`, `remove`, `read` and `write`, as the session's
# user in the session's own view (its disk, its mounts, the read-only
# system beneath), so `..` and symlinks resolve inside it. Each reply is
# the op's reply as the caller gets it; the kernel checks its shape and
# size first.
#
#   file {ref, call} -> done {ref, reply} | failed {ref, errno, error}
#   unwatch {ref} -> (nothing)

import errno
import grp
import pwd
import shutil
import stat
import time

# A file's metadata is kept in extended attributes of this prefix.
METADATA_XATTR = "user.e2b."
# What a list's entries may come to, short of the kernel's cap on a
# report (JSON's escapes and the frame around them aside).
LIST_BYTES_MAX = FILE_REPORT_MAX - (256 << 10)


def file_op(call, ref):
    """The reply to file op `ref` (an OSError says why it failed)."""
    op = call["op"]
    if op == "stat":
        return {"success": True, "entry": entry_of(call["path"])}
    if op == "list":
        return list_dir(call["path"], call.get("depth") or 1)
    if op == "mkdir":
        return make_dir(call["path"], call.get("parents", False))
    if op == "move":
        return move_path(call["from"], call["to"])
    if op == "remove":
        return remove_path(call["path"])
    if op == "read":
        return read_file(call["path"], call.get("offset", 0), call.get("length"))
    if op == "write":
        return write_file(call)
    if op == "watch":
        return WATCHING.watch(ref, call["path"], call.get("recursive", False))
    raise OSError(errno.EINVAL, f"no file op {op!r}")


def entry_of(path, status=None, listed=False):
    """What `path` is, as `lstat` sees it (`status`, if known); its path
    made absolute through its directory's symlinks (its own, if it is
    one, kept) unless it was `listed` from a directory already real."""
    if status is None:
        status = os.lstat(path)
    mode = status.st_mode
    if stat.S_ISREG(mode):
        kind = "file"
    elif stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISLNK(mode):
        kind = "symlink"
    else:
        kind = "other"
    parent, name = os.path.split(path.rstrip("/"))
    if listed or not name:
        where = path if name else "/"
    else:
        where = os.path.join(os.path.realpath(parent or "/"), name)
    entry = {
        "name": shown(name or "/"),
        "path": shown(where),
        "type": kind,
        "size": status.st_size,
        "mode": stat.S_IMODE(mode),
        "permissions": stat.filemode(mode),
        "owner": name_of(pwd.getpwuid, status.st_uid),
        "group": name_of(grp.getgrgid, status.st_gid),
        "modified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(status.st_mtime)),
        "symlink_target": shown(os.readlink(path)) if kind == "symlink" else None,
    }
    metadata = metadata_of(path) if kind in ("file", "dir") else {}
    if metadata:
        entry["metadata"] = metadata
    return entry


NAMES = {}


def name_of(lookup, number):
    """A user's or group's name in the session (its number if it has
    none)."""
    key = (lookup, number)
    if key not in NAMES:
        try:
            NAMES[key] = lookup(number)[0]
        except KeyError:
            NAMES[key] = str(number)
    return NAMES[key]


def metadata_of(path):
    """A file's metadata, as `write` set it: at most FILE_METADATA_MAX
    bytes (other code in the session may have set more)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    metadata, size = {}, 0
    for name in sorted(names):
        if not name.startswith(METADATA_XATTR):
            continue
        try:
            value = os.getxattr(path, name, follow_symlinks=False).decode("ascii", "replace")
        except OSError:
            continue
        key = shown(name[len(METADATA_XATTR):])
        size += len(key) + len(value)
        if size > FILE_METADATA_MAX:
            break
        metadata[key] = value
    return metadata


def list_dir(path, depth):
    """A directory's entries, level by level to `depth`, each
    directory's by name; symlinks to directories are not descended."""
    top = os.path.realpath(path)
    if not os.path.isdir(top):
        raise OSError(errno.ENOENT if not os.path.lexists(path) else errno.EINVAL,
                      f"{path} is not a directory")
    entries, size, truncated = [], 0, False
    level = [top]
    for _ in range(depth):
        below = []
        for directory in level:
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                if directory == top:
                    raise
                continue
            for name in names:
                full = os.path.join(directory, name)
                try:
                    # One that goes while it is looked at is left out.
                    status = os.lstat(full)
                    entry = entry_of(full, status, listed=True)
                except (OSError, ValueError, OverflowError):
                    continue
                size += len(json.dumps(entry))
                if len(entries) >= FILE_LIST_MAX or size > LIST_BYTES_MAX:
                    truncated = True
                    break
                entries.append(entry)
                if stat.S_ISDIR(status.st_mode):
                    below.append(full)
            if truncated:
                break
        if truncated or not below:
            break
        level = below
    return {"success": True, "entries": entries, "truncated": truncated}


def make_dir(path, parents):
    """A directory made, or found there already."""
    try:
        if parents:
            os.makedirs(path)
        else:
            os.mkdir(path)
        created = True
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        created = False
    return {"success": True, "created": created, "entry": entry_of(path)}


def move_path(source, target):
    """`source` renamed to `target`; across disks, copied beside `target`
    and renamed into place (as rename would, a directory there is not
    moved into), then removed."""
    try:
        os.rename(source, target)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        if os.path.isdir(target) and not os.path.islink(target):
            raise OSError(errno.EEXIST, f"{target} is a directory on another disk") from None
        partial = f"{target}.agentos-move-{os.getpid()}"
        try:
            if stat.S_ISDIR(os.lstat(source).st_mode):
                shutil.copytree(source, partial, symlinks=True)
            else:
                shutil.copy2(source, partial, follow_symlinks=False)
            os.rename(partial, target)
        except shutil.Error as failed:
            raise OSError(errno.EIO, f"cannot copy {source}: {failed}") from None
        finally:
            if os.path.lexists(partial):
                remove_path(partial)
        remove_path(source)
    return {"success": True, "entry": entry_of(target)}


def remove_path(path):
    """A path removed: a directory with all it holds, a symlink itself."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return {"success": True, "removed": True}


def open_regular(path, flags):
    """A regular file's descriptor (a FIFO or a device would block the
    steward, or never end)."""
    # O_NOCTTY: a PTY opened here would become the steward's terminal.
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return fd


def read_file(path, offset, length):
    """At most `length` bytes of a regular file from `offset`."""
    length = FILE_READ_MAX if length is None else length
    fd = open_regular(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        parts, got = [], 0
        while got < length:
            part = os.pread(fd, length - got, offset + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
    finally:
        os.close(fd)
    data = b"".join(parts)
    return {
        "success": True,
        "data": base64.b64encode(data).decode("ascii"),
        "offset": offset,
        "size": size,
        "eof": got < length or offset + got >= size,
    }


def write_file(call):
    """Bytes written into a regular file (made if missing) at `offset`;
    with `truncate`, the file ends where they end."""
    data = base64.b64decode(call.get("data") or "", validate=True)
    path, offset = call["path"], call.get("offset", 0)
    if call.get("parents"):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT)
    try:
        if call.get("truncate", True):
            os.ftruncate(fd, offset)
        view, written = memoryview(data), 0
        while written < len(data):
            written += os.pwrite(fd, view[written:], offset + written)
        if call.get("metadata") is not None:
            set_metadata(fd, call["metadata"])
    finally:
        os.close(fd)
    return {"success": True, "entry": entry_of(path)}


def set_metadata(fd, metadata):
    """A file's metadata replaced by `metadata`."""
    for name in os.listxattr(fd):
        if name.startswith(METADATA_XATTR):
            os.removexattr(fd, name)
    for key, value in metadata.items():
        os.setxattr(fd, METADATA_XATTR + key, value.encode("ascii"))


# Watches (`watch`, then `unwatch`): one inotify instance per steward,
# made at its first watch; one inotify watch per directory, shared by the
# watches of that directory. What they see goes to the kernel unasked:
#   events {events: the watch's ref, list: [{type, path, name}]}
IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_IGNORED = 0x100, 0x200, 0x8000
IN_ONLYDIR, IN_ISDIR = 0x1000000, 0x40000000
WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
EVENT_TYPES = ((IN_CREATE | IN_MOVED_TO, "create"), (IN_DELETE, "remove"),
               (IN_MOVED_FROM, "rename"), (IN_MODIFY, "write"), (IN_ATTRIB, "chmod"))
INOTIFY_EVENT = struct.Struct("iIII")
# Directories one steward watches at most: a recursive watch of a larger
# tree watches part of it.
WATCHED_DIRS_MAX = 8192
# An events report's list, well short of the kernel's cap on a report.
EVENTS_BYTES_MAX = 48 << 10


class Watched:
    """One watch: whether it takes in directories made below, and the
    inotify watches it uses."""

    def __init__(self, recursive):
        self.recursive = recursive
        self.descriptors = set()


class Watching:
    """The steward's watches, and the inotify instance they share."""

    def __init__(self):
        self.fd = None
        self.registered = False
        self.directories = {}
        self.users = {}
        self.watches = {}

    def watch(self, ref, path, recursive):
        """Watch `ref` of directory `path` (and those below, with
        `recursive`)."""
        if self.fd is None:
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            self.fd = fd
        top = os.path.realpath(path)
        self.watches[ref] = Watched(recursive)
        try:
            self.add_directory(ref, top, IN_ONLYDIR)
        except OSError:
            self.unwatch(ref)
            raise
        if recursive:
            self.add_below(ref, top)
        return {"success": True, "watch": ""}

    def add_directory(self, ref, directory, extra=0):
        descriptor = libc.inotify_add_watch(self.fd, os.fsencode(directory), WATCH_MASK | extra)
        if descriptor < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{directory}: {os.strerror(err)}")
        self.directories[descriptor] = directory
        self.users.setdefault(descriptor, set()).add(ref)
        self.watches[ref].descriptors.add(descriptor)

    def add_below(self, ref, top):
        """The directories below `top` (symlinks not followed), as many as
        the cap leaves room for."""
        for root, directories, _ in os.walk(top):
            for name in directories:
                if len(self.directories) >= WATCHED_DIRS_MAX:
                    return
                try:
                    self.add_directory(ref, os.path.join(root, name))
                except OSError:
                    pass

    def unwatch(self, ref):
        """Watch `ref` ends; the directories no other watch uses are let
        go."""
        watched = self.watches.pop(ref, None)
        for descriptor in watched.descriptors if watched else ():
            users = self.users.get(descriptor, set())
            users.discard(ref)
            if not users:
                self.forget(descriptor)
                libc.inotify_rm_watch(self.fd, descriptor)

    def forget(self, descriptor):
        self.users.pop(descriptor, None)
        self.directories.pop(descriptor, None)
        for watched in self.watches.values():
            watched.descriptors.discard(descriptor)

    def reports(self):
        """What the watches saw since last read, as reports for the
        kernel (a recursive watch takes in the directories made below)."""
        try:
            data = os.read(self.fd, 64 << 10)
        except BlockingIOError:
            return []
        lists, at = {}, 0
        while at + INOTIFY_EVENT.size <= len(data):
            descriptor, mask, _, length = INOTIFY_EVENT.unpack_from(data, at)
            name = data[at + INOTIFY_EVENT.size:at + INOTIFY_EVENT.size + length].rstrip(b"\0")
            at += INOTIFY_EVENT.size + length
            if mask & IN_IGNORED:
                self.forget(descriptor)
                continue
            directory = self.directories.get(descriptor)
            kind = next((kind for bits, kind in EVENT_TYPES if mask & bits), None)
            if directory is None or kind is None:
                continue
            path = os.path.join(directory, os.fsdecode(name)) if name else directory
            event = {"type": kind, "path": shown(path), "name": shown(os.path.basename(path))}
            for ref in list(self.users.get(descriptor, ())):
                made = mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO)
                room = len(self.directories) < WATCHED_DIRS_MAX
                if made and room and self.watches[ref].recursive:
                    try:
                        self.add_directory(ref, path)
                        self.add_below(ref, path)
                    except OSError:
                        pass
                events = lists.setdefault(ref, [])
                # A file written in many calls is one write here.
                if not events or events[-1] != event:
                    events.append(event)
        reports = []
        for ref, events in lists.items():
            part, size = [], 0
            for event in events:
                size += len(json.dumps(event))
                if part and size > EVENTS_BYTES_MAX:
                    reports.append({"events": ref, "list": part})
                    part, size = [], len(json.dumps(event))
                part.append(event)
            reports.append({"events": ref, "list": part})
        return reports


# The steward's watches (each steward, a fork, has its own).
WATCHING = Watching()


def shown(text):
    """A name as JSON can carry it: bytes that are not UTF-8 become
    U+FFFD (a lone surrogate would not be read)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
