#!/usr/bin/env python3
"""An agent with a memory leak: grabs 10 MiB more every tenth of a second
and keeps all of it. Its cgroup's memory limit ends it with an OOM kill,
which the kernel reports; nothing else on the host is touched."""

import time

hoard = []
while True:
    hoard.append(bytearray(10 << 20))  # zero-filled, so really resident
    print(f"memory hog: holding {len(hoard) * 10} MiB", flush=True)
    time.sleep(0.1)
