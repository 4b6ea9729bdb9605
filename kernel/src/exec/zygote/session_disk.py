# A run on disks the kernel mounted before its first order. A session's
# disk covers the run child's /workspace, /tmp and home: the child moves
# into them and makes the session's own Python environment there, once — a
# virtual environment that sees the system's packages, which `pip install`
# and `python -m pip install` fill (its bin is first on PATH), and whose
# packages this interpreter imports too, as the environment's own python
# would. A template (read-only, at TEMPLATE_ROOT) is an environment built
# the same way: its packages join the path, behind a session's own.

import os
import site
import sys


PIP_SCRIPT = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


def settle_on_disks(on_disk, template):
    """Moves into the session's disk (the directory the child stood in is
    the tmpfs the disk now covers) and puts the session's environment, and
    the template's, on this interpreter's path. Once per child."""
    if SETTLED_ON_DISK:
        return
    SETTLED_ON_DISK.append(True)
    if not on_disk:
        add_template_paths()
        return
    os.chdir(WORKSPACE)
    try:
        make_venv(SESSION_VENV, True)
        if template:
            link_template(SESSION_VENV)
        add_session_paths()
    except BaseException as err:  # noqa: BLE001 - anything (a .pth exiting too): the run goes on
        # The run still runs, on its disk; only installed packages are
        # out of reach, and it is told why.
        print(f"the session's Python environment is unusable: {err}", file=sys.stderr)


SETTLED_ON_DISK = []


def make_venv(root, system_site):
    """A virtual environment at `root` (seeing the system's packages with
    `system_site`), unless it is there already: pyvenv.cfg is written last,
    so a half-made one is made again."""
    config = os.path.join(root, "pyvenv.cfg")
    # A restored snapshot keeps no symlinks: its interpreter's links are
    # made again.
    if os.path.exists(config) and os.path.lexists(os.path.join(root, "bin", "python3")):
        return
    version = "%d.%d" % sys.version_info[:2]
    bin_dir = os.path.join(root, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    os.makedirs(site_packages(root), exist_ok=True)
    names = ["python", "python3", f"python{version}"]
    for name in names:
        link = os.path.join(bin_dir, name)
        if not os.path.lexists(link):
            os.symlink(sys.executable, link)
    for name in ("pip", "pip3", f"pip{version}"):
        script = os.path.join(bin_dir, name)
        with open(script, "w") as file:
            file.write(PIP_SCRIPT.format(python=os.path.join(bin_dir, names[0])))
        os.chmod(script, 0o755)
    with open(config, "w") as file:
        file.write(
            f"home = {os.path.dirname(sys.executable)}\n"
            f"include-system-site-packages = {'true' if system_site else 'false'}\n"
            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
        )


def site_packages(root):
    """Where packages go in the environment at `root`."""
    return os.path.join(root, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")


def link_template(root):
    """Makes the template's packages part of the environment at `root`
    (behind its own): pip there sees them installed, and its python
    imports them."""
    link = os.path.join(site_packages(root), "_agentos_template.pth")
    if not os.path.exists(link):
        with open(link, "w") as file:
            file.write(site_packages(TEMPLATE_ROOT) + "\n")


def add_template_paths():
    """Puts the template's packages (and what its .pth files add) on this
    interpreter's path. (site, imported with the zygote, runs nothing of
    its own under -S.)"""
    site.addsitedir(site_packages(TEMPLATE_ROOT))


def add_session_paths():
    """Adds to sys.path what the environment's own python has on its path,
    after what this interpreter has, worked out as that python's site
    module does at its start: its packages, with the .pth files there
    read, then the system's if its pyvenv.cfg says it sees them. A package
    pip found installed on the system is importable here as it is there.
    (Asking that python itself costs a process start, tens of
    milliseconds, on every session's first run.)"""
    site.addsitedir(site_packages(SESSION_VENV))
    if sees_system_site(SESSION_VENV):
        for path in site.getsitepackages():
            if os.path.isdir(path):
                site.addsitedir(path)


def sees_system_site(root):
    """Whether the environment at `root` sees the system's packages, as its
    pyvenv.cfg says (the key and its value as the venv module writes and
    site reads them)."""
    try:
        with open(os.path.join(root, "pyvenv.cfg")) as config:
            lines = config.read().splitlines()
    except OSError:
        return False
    sees = False
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip().lower() == "include-system-site-packages":
            sees = value.strip().lower() == "true"  # the last one holds, as for site
    return sees
