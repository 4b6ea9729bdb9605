#!/usr/bin/env python3
"""A well-behaved agent: a heartbeat to the kernel every half second,
printing how long each round trip took. It keeps running whatever its
neighbours do."""

import time

from agentos import AgentOSClient

with AgentOSClient() as kernel:
    beat = 0
    while True:
        start = time.perf_counter()
        kernel.echo(f"heartbeat {beat}")
        took = (time.perf_counter() - start) * 1000
        print(f"healthy: heartbeat {beat} ({took:.2f} ms)", flush=True)
        beat += 1
        time.sleep(0.5)
