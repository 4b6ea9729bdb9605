#!/usr/bin/env python3
"""The smallest agent: greets the kernel and reports who it is.

Spawn it with `agentos spawn hello agents/hello_agent.py`; its output goes to
the agent's log. Inside its sandbox AGENTOS_SOCKET points at the agent's own
kernel socket, so the SDK needs no arguments.
"""

import os
import socket

from agentos import AgentOSClient


def main() -> None:
    with AgentOSClient() as kernel:
        hello = kernel.hello()
        print(
            f"hello from agent {hello['agent_id']} ({os.environ.get('AGENTOS_AGENT_NAME')}) "
            f"on {socket.gethostname()}, uid {os.getuid()}, "
            f"kernel {hello['kernel_version']}",
            flush=True,
        )
        print(f"echo: {kernel.echo('Hello!')}", flush=True)


if __name__ == "__main__":
    main()
