#!/usr/bin/env python3
"""Network egress by policy, in one run: an agent may reach pypi.org and
nothing else. Its code uses plain urllib, which finds the kernel's proxy
in the environment; the proxy resolves names itself, checks the policy
and records every attempt. The demo prints what the agent saw, then the
agent's connection record as its owner reads it (NET, `agentos net`).

Usage: python agents/network_demo.py
"""

from __future__ import annotations

import sys
import textwrap
import time

from agentos import AgentOSClient

AGENT = "fetcher"
POLICY = {"allow": ["pypi.org:443"]}

# What the agent runs: two fetches, one allowed by its policy, one not.
CODE = textwrap.dedent("""
    import urllib.request
    for url in ("https://pypi.org/simple/pip/", "https://example.com/"):
        try:
            with urllib.request.urlopen(url, timeout=20) as reply:
                print(f"{url}: HTTP {reply.status}, {len(reply.read())} bytes")
        except Exception as err:
            print(f"{url}: {err}")
    """)


def main() -> int:
    with AgentOSClient() as kernel:
        if not kernel.hello()["features"].get("network_policy"):
            print("network policies are unavailable on this kernel (it needs root)")
            return 0
        spawned = kernel.spawn(AGENT, command=[sys.executable, "-c", CODE], network=POLICY)
        deadline = time.monotonic() + 60
        while True:
            entry = next(a for a in kernel.list_agents() if a["id"] == spawned["id"])
            if not entry["running"] and entry["state"] != "starting":
                break
            if time.monotonic() > deadline:
                kernel.kill(spawned["id"], grace_ms=0)
                break
            time.sleep(0.2)
        print(f"agent {AGENT}, network {POLICY}, printed:")
        for line in kernel.logs(spawned["id"]).splitlines():
            print("  " + line)
        record = kernel.net(spawned["id"])
        totals = record["totals"]
        print(f"its connection record: {totals['allowed']} allowed, {totals['refused']} "
              f"refused, {totals['bytes_out']} bytes out, {totals['bytes_in']} bytes in")
        for attempt in record["attempts"]:
            verdict = "allowed" if attempt["allowed"] else "REFUSED"
            why = f": {attempt['reason']}" if attempt.get("reason") else ""
            print(f"  {verdict:7} {attempt['host']}:{attempt['port']} "
                  f"({attempt.get('address') or '-'}) {attempt['bytes_out']} out, "
                  f"{attempt['bytes_in']} in, {attempt['duration_ms']} ms{why}")
        allowed = any(a["host"] == "pypi.org" and a["allowed"] for a in record["attempts"])
        refused = any(a["host"] == "example.com" and not a["allowed"] for a in record["attempts"])
        if not (allowed and refused):
            print("the record does not show pypi.org allowed and example.com refused")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
