# A session's run on its disk. The kernel mounts the session's disk over
# the run child's /workspace, /tmp and home before its first order; the
# child then moves into them and makes the session's own Python
# environment there, once: a virtual environment that sees the system's
# packages, which `pip install` and `python -m pip install` fill (its bin
# is first on PATH), and whose packages this interpreter imports too, as
# the environment's own python would.

import os
import sys


VENV_PYTHON = SESSION_VENV + "/bin/python"

PIP_SCRIPT = """#!{python}
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""


def settle_on_disk():
    """Moves into the session's disk (the directory the child stood in is
    the tmpfs the disk now covers) and puts the session's environment on
    this interpreter's path. Once per child."""
    if SETTLED_ON_DISK:
        return
    SETTLED_ON_DISK.append(True)
    os.chdir(WORKSPACE)
    try:
        make_session_venv()
        add_session_paths()
    except Exception as err:  # noqa: BLE001 - whatever it is, the run goes on
        # The run still runs, on its disk; only installed packages are
        # out of reach, and it is told why.
        print(f"the session's Python environment is unusable: {err}", file=sys.stderr)


SETTLED_ON_DISK = []


def make_session_venv():
    """The session's virtual environment, unless it is there already:
    pyvenv.cfg is written last, so a half-made one is made again."""
    config = os.path.join(SESSION_VENV, "pyvenv.cfg")
    if os.path.exists(config):
        return
    version = "%d.%d" % sys.version_info[:2]
    bin_dir = os.path.join(SESSION_VENV, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    os.makedirs(os.path.join(SESSION_VENV, "lib", f"python{version}", "site-packages"), exist_ok=True)
    for name in ["python", "python3", f"python{version}"]:
        link = os.path.join(bin_dir, name)
        if not os.path.lexists(link):
            os.symlink(sys.executable, link)
    for name in ("pip", "pip3", f"pip{version}"):
        script = os.path.join(bin_dir, name)
        with open(script, "w") as file:
            file.write(PIP_SCRIPT.format(python=VENV_PYTHON))
        os.chmod(script, 0o755)
    with open(config, "w") as file:
        file.write(
            f"home = {os.path.dirname(sys.executable)}\n"
            "include-system-site-packages = true\n"
            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n"
        )


def add_session_paths():
    """Adds to sys.path what the environment's own python has on its path
    (its packages, .pth files read, then the system's), after what this
    interpreter has: a package pip found installed on the system is
    importable here as it is there."""
    # Imported here, not in the zygote: every run child would carry them.
    import json
    import subprocess

    listed = subprocess.run(
        [VENV_PYTHON, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True, check=True, timeout=30, env=dict(PATH="/usr/bin:/bin"),
    )
    for entry in json.loads(listed.stdout):
        if entry and entry not in sys.path:
            sys.path.append(entry)
