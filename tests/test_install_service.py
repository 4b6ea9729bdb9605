"""scripts/install-service, staged under a temporary root (``--destdir``)
from the debug build: every file in place, the pkg-config file good enough
to build the C example, the unit accepted by ``systemd-analyze verify``, the
default config accepted by ``agentosd --check-config`` with every setting
commented and with every setting uncommented, and ``--uninstall`` leaving
the root empty. Nothing outside the temporary root is touched."""

from __future__ import annotations

import filecmp
import grp
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import BIN_DIR, LLM_VARIABLES, REPO, binary

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

INSTALLER = REPO / "scripts" / "install-service"
PREFIX = "/usr/local"

# Every file an install makes, with its mode, relative to the root.
INSTALLED = {
    "usr/local/bin/agentosd": 0o755,
    "usr/local/bin/agentos": 0o755,
    "usr/local/lib/libagentos.so": 0o755,
    "usr/local/lib/libagentos.a": 0o644,
    "usr/local/include/agentos.h": 0o644,
    "usr/local/lib/pkgconfig/agentos.pc": 0o644,
    "usr/local/share/agentos/install-manifest": 0o644,
    "etc/agentos/agentosd.toml": 0o640,
    "etc/systemd/system/agentosd.service": 0o644,
}

# The capabilities the unit keeps: what isolation needs, nothing else.
CAPABILITIES = {
    "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP",
    "CAP_KILL", "CAP_SYS_PTRACE", "CAP_SYS_NICE", "CAP_CHOWN", "CAP_DAC_READ_SEARCH",
    "CAP_SYS_RESOURCE",
}

# A commented setting: `# key = value` or `# [table]` / `# [[array]]`.
COMMENTED_SETTING = re.compile(r"^# (\[|[A-Za-z0-9_]+ = )")


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def install(root: Path, *args: str) -> subprocess.CompletedProcess:
    return run(INSTALLER, "--destdir", root, "--bin-dir", BIN_DIR, *args, timeout=120)


def uninstall(root: Path) -> subprocess.CompletedProcess:
    return run(INSTALLER, "--destdir", root, "--uninstall", timeout=60)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def uncommented(config: str) -> str:
    """The config with every commented setting made live."""
    return "\n".join(
        line[2:] if COMMENTED_SETTING.match(line) else line for line in config.splitlines()
    ) + "\n"


def clean_env() -> dict[str, str]:
    """This environment without AGENTOS_* and LLM settings."""
    return {
        k: v for k, v in os.environ.items()
        if not k.startswith("AGENTOS_") and k not in LLM_VARIABLES
    }


def check_config(agentosd: Path, path: Path) -> subprocess.CompletedProcess:
    return run(agentosd, "--config", path, "--check-config", timeout=30, env=clean_env())


def agentos_group() -> str | None:
    try:
        return str(grp.getgrnam("agentos"))
    except KeyError:
        return None


@pytest.fixture(scope="module")
def staged() -> Iterator[Path]:
    """One staged install the read-only tests share."""
    root = Path(tempfile.mkdtemp(prefix="agentos-install-"))
    try:
        done = install(root)
        assert done.returncode == 0, done.stdout + done.stderr
        yield root
    finally:
        uninstall(root)
        shutil.rmtree(root, ignore_errors=True)


def test_help_names_every_option():
    done = run(INSTALLER, "--help")
    assert done.returncode == 0
    for option in ("--prefix", "--bin-dir", "--destdir", "--uninstall"):
        assert option in done.stdout
    wrong = run(INSTALLER, "--frobnicate")
    assert wrong.returncode != 0 and "unknown argument: --frobnicate" in wrong.stderr


def test_the_script_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        print("!!! NOT TESTED: shellcheck is not installed")
        return
    done = run("shellcheck", INSTALLER)
    assert done.returncode == 0, done.stdout


def test_a_staged_install_puts_every_file_in_place_and_nothing_outside():
    group_before = agentos_group()
    real_config_before = Path("/etc/agentos/agentosd.toml").exists()
    root = Path(tempfile.mkdtemp(prefix="agentos-install-"))
    try:
        done = install(root)
        assert done.returncode == 0, done.stdout + done.stderr
        for path, mode in INSTALLED.items():
            info = (root / path).stat()
            assert stat.S_ISREG(info.st_mode), path
            assert stat.S_IMODE(info.st_mode) == mode, f"{path}: {oct(info.st_mode)}"
        files = {p for p in files_under(root) if not (root / p).is_dir()}
        assert files == set(INSTALLED)
        for name in ("agentosd", "agentos"):
            assert filecmp.cmp(root / "usr/local/bin" / name, BIN_DIR / name, shallow=False)
        for name in ("libagentos.so", "libagentos.a"):
            assert filecmp.cmp(root / "usr/local/lib" / name, BIN_DIR / name, shallow=False)
        header = REPO / "sdk-c/include/agentos.h"
        assert filecmp.cmp(root / "usr/local/include/agentos.h", header, shallow=False)
        # The staged files name the real paths.
        unit = (root / "etc/systemd/system/agentosd.service").read_text()
        assert f"ExecStart={PREFIX}/bin/agentosd\n" in unit
        assert f"prefix={PREFIX}\n" in (root / "usr/local/lib/pkgconfig/agentos.pc").read_text()
        assert "did not create the group agentos" in done.stdout
        # Nothing outside the root changed.
        assert agentos_group() == group_before
        assert Path("/etc/agentos/agentosd.toml").exists() == real_config_before

        again = install(root)
        assert again.returncode == 0, again.stdout + again.stderr
        manifest = (root / "usr/local/share/agentos/install-manifest").read_text()
        gone = uninstall(root)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert files_under(root) == [], "a second install made uninstall leave files behind"
        # The second install's manifest still knew the directories the first made.
        assert "dir\t/etc/agentos\n" in manifest and "dir\t/usr/local/bin\n" in manifest
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_uninstall_keeps_a_config_the_user_changed_and_removes_the_rest():
    root = Path(tempfile.mkdtemp(prefix="agentos-install-"))
    try:
        assert install(root).returncode == 0
        config = root / "etc/agentos/agentosd.toml"
        config.write_text(config.read_text() + "log_level = \"debug\"\n")
        again = install(root)
        assert again.returncode == 0
        assert "kept /etc/agentos/agentosd.toml" in again.stdout
        assert config.read_text().endswith("log_level = \"debug\"\n"), "install overwrote it"
        gone = uninstall(root)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert "kept /etc/agentos/agentosd.toml: it was changed" in gone.stdout
        assert files_under(root) == ["etc", "etc/agentos", "etc/agentos/agentosd.toml"]
        # Nothing left to uninstall is said, not ignored.
        assert uninstall(root).returncode != 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_unit_passes_systemd_analyze_verify(staged: Path):
    unit = (staged / "etc/systemd/system/agentosd.service").read_text()
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["KillMode"] == "mixed" and settings["Delegate"] == "yes"
    assert settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert settings["Restart"] == "on-failure"
    assert set(settings["CapabilityBoundingSet"].split()) == CAPABILITIES
    for absent in ("RestrictNamespaces", "PrivateDevices", "ProtectSystem", "RuntimeDirectory"):
        assert absent not in settings, absent

    if shutil.which("systemd-analyze") is None:
        print("!!! NOT TESTED: systemd-analyze is not installed; the unit was not verified")
        return
    # verify checks that ExecStart exists: point it at the staged binary.
    work = Path(tempfile.mkdtemp(prefix="agentos-unit-"))
    try:
        staged_unit = work / "agentosd.service"
        staged_unit.write_text(unit.replace(f"ExecStart={PREFIX}/", f"ExecStart={staged}{PREFIX}/"))
        done = run("systemd-analyze", "verify", staged_unit)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        # And it does check: a unit whose program is missing is refused.
        staged_unit.write_text(unit.replace(f"ExecStart={PREFIX}/", f"ExecStart={work}/missing/"))
        done = run("systemd-analyze", "verify", staged_unit)
        assert done.returncode != 0 and "not executable" in done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_default_config_is_valid_commented_and_uncommented(staged: Path):
    installed = staged / "etc/agentos/agentosd.toml"
    agentosd = staged / "usr/local/bin/agentosd"
    text = installed.read_text()
    if tomllib is not None:
        assert tomllib.loads(text) == {}, "a setting of the default config is not commented out"
    done = check_config(agentosd, installed)
    assert done.returncode == 0, done.stdout + done.stderr

    live = uncommented(text)
    settings = [line for line in live.splitlines() if line and not line.startswith("#")]
    assert len(settings) > 90, f"only {len(settings)} settings could be uncommented"
    # The examples' programs, which a check may look for, made real.
    healthy = REPO / "agents/healthy_agent.py"
    live = live.replace('script = "/opt/agents/watcher.py"', f'script = "{healthy}"')
    assert str(healthy) in live
    work = Path(tempfile.mkdtemp(prefix="agentos-config-"))
    try:
        everything = work / "everything.toml"
        everything.write_text(live)
        done = check_config(agentosd, everything)
        assert done.returncode == 0, done.stdout + done.stderr + live
        # check-config is strict, so the line above means something.
        misspelt = work / "misspelt.toml"
        misspelt.write_text(live.replace("max_in_flight = ", "max_in_flite = "))
        done = check_config(agentosd, misspelt)
        assert done.returncode == 2 and "max_in_flite" in done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)


# The config structs of kernel/src/config and where their keys live.
TABLES = {
    "Config": (), "AgentsConfig": ("agents",), "LlmConfig": ("llm",),
    "LocalConfig": ("llm", "local"), "QuotaConfig": ("llm", "quota"), "ExecConfig": ("exec",), "TasksConfig": ("tasks",),
    "McpServerConfig": ("mcp", "servers"), "NetworkConfig": ("network",),
    "CredentialConfig": ("network", "credentials"), "MetricsConfig": ("metrics",),
    "TracingConfig": ("tracing",), "StateConfig": ("state",), "AuditSettings": ("audit",),
    "FleetConfig": ("fleet",),
}
# Structs whose TABLES entry holds examples of them, one a key: a setting
# is named if any example has it (a program server and a remote one
# cannot both have every setting).
EXAMPLES = {"McpServerConfig"}
# Fields that are tables of their own (checked through TABLES), or not
# settings: the file's own path, the boot agents (checked below), the test
# diagnostics.
NOT_KEYS = {"file", "agents", "llm", "exec", "mcp", "tasks", "debug", "local", "servers", "boot",
            "network", "credentials", "metrics", "tracing", "state", "audit", "fleet"}
SKIPPED_STRUCTS = {"DebugConfig", "McpConfig"}


def test_the_default_config_names_every_setting_the_kernel_reads(staged: Path):
    if tomllib is None:
        print("!!! NOT TESTED: reading TOML needs Python 3.11 (tomllib)")
        return
    live = tomllib.loads(uncommented((staged / "etc/agentos/agentosd.toml").read_text()))
    missing = []
    for source in sorted((REPO / "kernel/src/config").glob("*.rs")):
        text = source.read_text()
        structs = r"deny_unknown_fields\)\]\s*pub struct (\w+) \{(.*?)\n\}"
        for match in re.finditer(structs, text, re.S):
            name, body = match.groups()
            if name in SKIPPED_STRUCTS:
                continue
            assert name in TABLES, f"{source.name}: new config struct {name}: add it to TABLES"
            table = live
            for key in TABLES[name]:
                table = table[key]
            if name in EXAMPLES:
                table = {key: None for example in table.values() for key in example}
            elif isinstance(table, list):
                # An array of tables: a setting is named if an entry has it.
                table = {key: None for entry in table for key in entry}
            for field in re.findall(r"^    pub (\w+):", body, re.M):
                if field not in NOT_KEYS and field not in table:
                    missing.append(".".join((*TABLES[name], field)))
    assert not missing, f"scripts/service/agentosd.toml lacks {missing}"
    boot = live["agents"]["boot"][0]
    assert {"name", "script", "args", "env", "limits", "restart_policy", "max_restarts",
            "restart_window", "permissions"} <= set(boot)


def start_staged_kernel(root: Path, workdir: Path) -> tuple[subprocess.Popen, Path]:
    """The staged agentosd on the staged default config, with no LLM."""
    sock = workdir / "agentos.sock"
    env = clean_env()
    env.update(
        AGENTOS_LLM_PROVIDER="none",
        AGENTOS_STATE_DIR=str(workdir / "state"),
        AGENTOS_AGENT_LOG_DIR=str(workdir / "logs"),
    )
    with open(workdir / "agentosd.log", "wb") as log:
        process = subprocess.Popen(
            [root / "usr/local/bin/agentosd", "--socket", sock,
             "--config", root / "etc/agentos/agentosd.toml"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert process.poll() is None, (workdir / "agentosd.log").read_text()
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(sock))
            return process, sock
        except OSError:
            time.sleep(0.02)
        finally:
            probe.close()
    process.kill()
    pytest.fail("the staged agentosd did not come up:\n" + (workdir / "agentosd.log").read_text())


def test_pkg_config_builds_the_c_example_against_the_staged_library(staged: Path):
    if shutil.which("pkg-config") is None or shutil.which("gcc") is None:
        print("!!! NOT TESTED: pkg-config and gcc are needed to build the C example")
        return
    env = dict(os.environ, PKG_CONFIG_PATH=str(staged / "usr/local/lib/pkgconfig"))

    def pkg_config(*args: str, sysroot: bool = True) -> list[str]:
        run_env = dict(env, PKG_CONFIG_SYSROOT_DIR=str(staged)) if sysroot else env
        done = run("pkg-config", *args, "agentos", env=run_env)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    # As installed for real: the prefix's paths.
    assert pkg_config("--cflags", "--libs", sysroot=False) == [
        f"-I{PREFIX}/include", f"-L{PREFIX}/lib", "-lagentos"]
    version = run(binary("agentosd"), "--version").stdout.split()[1]
    assert pkg_config("--modversion") == [version]
    # The static library's needs come with --static.
    private = [
        flag for flag in pkg_config("--static", "--libs")
        if flag.startswith("-l") and flag != "-lagentos"
    ]
    assert "-lpthread" in private and "-ldl" in private

    work = Path(tempfile.mkdtemp(prefix="agentos-pc-"))
    kernel = None
    try:
        shared, static = work / "hello", work / "hello-static"
        libdir = staged / "usr/local/lib"
        hello = REPO / "examples/c/hello.c"
        gcc = ("gcc", "-Wall", "-Werror", hello)
        built = run(*gcc, *pkg_config("--cflags", "--libs"), f"-Wl,-rpath,{libdir}", "-o", shared)
        assert built.returncode == 0, built.stderr
        built = run(*gcc, *pkg_config("--cflags"), libdir / "libagentos.a", *private, "-o", static)
        assert built.returncode == 0, built.stderr
        linked = run("ldd", shared).stdout
        assert f"{libdir}/libagentos.so" in linked, linked
        assert "libagentos" not in run("ldd", static).stdout

        # Both talk to the staged daemon running on the staged default config.
        kernel, sock = start_staged_kernel(staged, work)
        for program in (shared, static):
            said = run(program, sock, timeout=60)
            assert said.returncode == 0, said.stdout + said.stderr
            assert "noop: ping" in said.stdout and "raw noop: 3 bytes back" in said.stdout
    finally:
        if kernel is not None and kernel.poll() is None:
            kernel.send_signal(signal.SIGTERM)
            try:
                kernel.wait(timeout=15)
            except subprocess.TimeoutExpired:
                kernel.kill()
                kernel.wait()
        shutil.rmtree(work, ignore_errors=True)
