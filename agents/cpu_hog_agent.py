#!/usr/bin/env python3
"""An agent stuck in an infinite loop. Its cgroup's CPU quota throttles it;
the other agents and the kernel keep their share."""

import time

print("cpu hog: spinning", flush=True)
n = 0
last = time.monotonic()
while True:
    n += 1
    if n % 5_000_000 == 0:
        now = time.monotonic()
        print(f"cpu hog: {n} iterations ({5_000_000 / (now - last):.0f}/s)", flush=True)
        last = now
