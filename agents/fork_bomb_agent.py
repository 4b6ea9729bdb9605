#!/usr/bin/env python3
"""An agent that forks without end. Its cgroup's process limit makes fork
fail once the limit is reached; the bomb keeps trying, and stays contained."""

import os
import time

children = 0
refused = 0
last_report = time.monotonic()
while True:
    try:
        pid = os.fork()
    except OSError:
        refused += 1  # EAGAIN: the pids limit said no
        time.sleep(0.01)
    else:
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        children += 1
    if time.monotonic() - last_report > 1:
        print(f"fork bomb: {children} children, {refused} forks refused", flush=True)
        last_report = time.monotonic()
