# Cgroups: a run child moves itself into its cgroups by writing "0" into
# the files the kernel opened for it (its own cgroup's, as it is forked;
# the one inside its agent's, with its first order of the agent's work).
# Each write moves the writing thread only, which takes no global lock.

import os


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
