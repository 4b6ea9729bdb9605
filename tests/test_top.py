"""`agentos top` against a real agentosd: the live view in a terminal (tmux),
and the plain-text snapshot for scripts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import uuid
from typing import Callable, Optional

from agentos import AgentOSClient
from conftest import binary, wait_state

BURN = ["/bin/sh", "-c", "while :; do :; done"]
# Half a core: the figure top must show for the burner.
HALF_A_CORE = {"cpu_quota": 50_000, "cpu_period": 100_000, "memory": 64 << 20}


def cpu_is_measured() -> bool:
    """CPU figures come from the agent's cgroup, which needs root."""
    if os.geteuid() != 0:
        print("!!! NOT TESTED: agentos top: CPU % comes from cgroups, so root (CI runs as root)")
        return False
    return True


def row(screen: str, name: str) -> Optional[list[str]]:
    """The words of the agent's row: ID NAME STATE CPU% MEMORY... RESTARTS TOKENS EXEC."""
    for line in screen.splitlines():
        words = line.split()
        if len(words) >= 8 and words[0].isdigit() and words[1] == name:
            return words
    return None


def cpu_of(screen: str, name: str) -> Optional[float]:
    words = row(screen, name)
    if words is None or words[3] == "-":
        return None
    return float(words[3])


class Tmux:
    """A private tmux server (its own socket), so the test touches no one's sessions."""

    def __init__(self) -> None:
        self.tmux = shutil.which("tmux")
        self.server = f"agentos-top-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        assert self.tmux is not None
        done = subprocess.run([self.tmux, "-L", self.server, *args],
                              capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait(self, what: str, holds: Callable[[str], bool], timeout: float = 20) -> str:
        """Polls the pane until ``holds``; returns the screen it held on."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if holds(screen):
                return screen
            assert time.monotonic() < deadline, f"{what}; the pane shows:\n{screen}"
            time.sleep(0.1)

    def kill(self) -> None:
        subprocess.run([self.tmux, "-L", self.server, "kill-server"],
                       capture_output=True, timeout=10)


def terminal_is_restored(screen: str) -> bool:
    """`stty -a` printed after top shows the line discipline as a shell wants it."""
    words = screen.split()
    return all(flag in words for flag in ("icanon", "echo", "isig")) and "-icanon" not in words


def test_top_follows_agents_live_and_q_or_ctrl_c_give_the_terminal_back(kernel):
    if shutil.which("tmux") is None:
        print("!!! NOT TESTED: agentos top: tmux is not installed")
        return
    measured = cpu_is_measured()
    top = f"{shlex.quote(str(binary('agentos')))} --socket {shlex.quote(kernel.socket_path)} top"
    # The shell prints a marker, runs top, says how it ended and how the
    # terminal was left; on Enter it does it again (to be ended by Ctrl-C).
    script = (
        "echo shell-before-top; "
        f"{top}; echo top-exited-$?; stty -a; echo press-enter; read line; "
        f"{top}; echo top-exited-again-$?; stty -a; echo done; "
        "sleep 600"
    )
    tmux = Tmux()
    with AgentOSClient(kernel.socket_path) as client:
        burner = client.spawn("burner", command=BURN, limits=HALF_A_CORE)
        try:
            tmux("new-session", "-d", "-s", "top", "-x", "140", "-y", "40", "sh", "-c", script)

            # The burner's row, with its half core measured.
            if measured:
                screen = tmux.wait("the burner at about half a core",
                                   lambda s: 25 <= (cpu_of(s, "burner") or 0) <= 60)
            else:
                screen = tmux.wait("the burner's row", lambda s: row(s, "burner") is not None)
            words = row(screen, "burner")
            assert words[:3] == [str(burner["id"]), "burner", "running"], screen
            assert words[5:7] == ["/", "64M"], screen
            assert words[7:] == ["0", "0", "0"], screen  # restarts, tokens, EXEC runs
            assert "q quits" in screen.splitlines()[0], screen
            assert "1 agent, 1 live" in screen, screen
            # The view is on the alternate screen: the shell's output is hidden.
            assert "shell-before-top" not in screen, screen

            # A new agent appears on a later refresh; killed, its state changes.
            sleeper = client.spawn("sleeper", command=["/bin/sleep", "600"])
            tmux.wait("the new agent's row", lambda s: (row(s, "sleeper") or [""] * 3)[2] == "running")
            client.kill(sleeper["id"], grace_ms=100)
            wait_state(client, sleeper["id"], {"killed"})
            screen = tmux.wait("the killed agent's state",
                               lambda s: (row(s, "sleeper") or [""] * 3)[2] == "killed")
            assert row(screen, "sleeper")[3] == "-", screen  # no CPU % for an ended agent
            assert "2 agents, 1 live" in screen, screen

            # q: top ends with 0, the shell's screen is back, and so is the
            # terminal's mode.
            tmux("send-keys", "-t", "top", "q")
            screen = tmux.wait("top ending on q", lambda s: "press-enter" in s)
            assert "top-exited-0" in screen, screen
            assert "shell-before-top" in screen, screen
            assert row(screen, "burner") is None, screen
            assert terminal_is_restored(screen), screen

            # Ctrl-C does the same.
            tmux("send-keys", "-t", "top", "Enter")
            tmux.wait("top again", lambda s: row(s, "burner") is not None)
            tmux("send-keys", "-t", "top", "C-c")
            screen = tmux.wait("top ending on Ctrl-C", lambda s: "done" in s.split())
            assert "top-exited-again-0" in screen, screen
            assert terminal_is_restored(screen.split("top-exited-again-0")[1]), screen
        finally:
            tmux.kill()
            for agent in client.list_agents():
                if agent["running"]:
                    client.kill(agent["id"], grace_ms=100)


def agentos_top(kernel, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("agentos"), "--socket", kernel.socket_path, "top", *args],
                          capture_output=True, text=True, timeout=60)


def test_top_once_prints_one_measured_snapshot_as_plain_text(kernel):
    measured = cpu_is_measured()
    with AgentOSClient(kernel.socket_path) as client:
        client.spawn("burner", command=BURN, limits=HALF_A_CORE)
        try:
            started = time.monotonic()
            out = agentos_top(kernel, "--once")
            took = time.monotonic() - started
            assert out.returncode == 0, out.stderr
            # Two samples one interval apart: the CPU figure is measured.
            assert took >= 1.0, took
            assert "\x1b" not in out.stdout, repr(out.stdout)
            lines = out.stdout.splitlines()
            assert lines[0].startswith("agentos top · kernel "), out.stdout
            assert f"at {kernel.socket_path}" in lines[0] and "q quits" not in lines[0]
            assert lines[1].startswith("1 agent, 1 live · CPU "), out.stdout
            assert lines[2].startswith("THINK queued 0, EXEC ready "), out.stdout
            assert lines[4].split() == [
                "ID", "NAME", "STATE", "CPU%", "MEMORY", "RESTARTS", "TOKENS", "EXEC"]
            words = row(out.stdout, "burner")
            assert words is not None and words[2] == "running", out.stdout
            assert words[4:7] == [words[4], "/", "64M"], out.stdout
            if measured:
                # Any load on the host may slow it, but never past its quota.
                assert 0 < float(words[3]) <= 65, out.stdout

            # Output that is not a terminal gets the same snapshot, without --once.
            piped = agentos_top(kernel)
            assert piped.returncode == 0, piped.stderr
            assert row(piped.stdout, "burner") is not None, piped.stdout
        finally:
            for agent in client.list_agents():
                if agent["running"]:
                    client.kill(agent["id"], grace_ms=100)


def test_top_once_with_no_agents_and_a_bad_interval(kernel):
    out = agentos_top(kernel, "--once", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith("0 agents, 0 live · CPU 0.0%"), out.stdout
    assert out.stdout.rstrip().endswith("(no agents)"), out.stdout
    bad = agentos_top(kernel, "--once", "--interval", "0")
    assert bad.returncode == 2  # a usage error
    assert "--interval must be between 0.1 and 3600 seconds" in bad.stderr
