# Files under a run's /workspace: writing a request's files and
# collecting those it names, each opened beneath /workspace without
# following a symlink on the way (the kernel checked the paths are plain
# and relative), and what /workspace holds.

import base64
import os
import stat


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
