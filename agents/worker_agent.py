#!/usr/bin/env python3
"""A long-running worker: does a unit of work every second, checks in with
the kernel, and stops cleanly on SIGTERM (KILL's first signal).

Arguments: [units] — stop after that many units (default: run until stopped).
"""

import signal
import sys
import time

from agentos import AgentOSClient

stopping = False


def stop(signum, _frame):
    global stopping
    stopping = True


def main() -> int:
    signal.signal(signal.SIGTERM, stop)
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else None
    with AgentOSClient() as kernel:
        me = kernel.hello()["agent_id"]
        done = 0
        while not stopping and (limit is None or done < limit):
            total = sum(i * i for i in range(200_000))  # the "work"
            done += 1
            kernel.echo(f"unit {done}")
            print(f"worker {me}: unit {done} done ({total % 1000})", flush=True)
            time.sleep(1)
    print(f"worker {me}: stopping after {done} units", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
