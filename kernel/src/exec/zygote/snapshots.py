# Snapshots: a session's /workspace saved as a gzip'd tar into a memfd
# the kernel sent, and restored from one: directories and regular files
# only, never through a symlink. (tarfile and shutil are imported when a
# snapshot or restore comes, not by the zygote.)

import os
import stat


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
