#!/usr/bin/env python3
"""Plans a goal with the kernel's LLM: asks THINK for a numbered plan,
reads its steps (whatever shape the model gave them), THINKs a short note
on each, and prints the plan as a checklist.

Usage: python agents/task_planner_agent.py [goal ...]
"""

import sys

from agentos import AgentOSClient, AgentOSError
from llm_text import list_items

DEFAULT_GOAL = "make a cup of tea"
MAX_STEPS = 5


def plan(kernel: AgentOSClient, goal: str) -> list[str]:
    reply = kernel.think(
        f"Write a numbered plan of 3 to {MAX_STEPS} short steps to {goal}. "
        "Only the numbered list, one step per line.",
        max_tokens=128,
        temperature=0.2,
    )
    return list_items(reply["content"], MAX_STEPS)


def note(kernel: AgentOSClient, goal: str, step: str) -> str:
    reply = kernel.think(
        f"The goal is to {goal}. In one short sentence, how do I do this step: {step}",
        max_tokens=48,
        temperature=0.2,
    )
    return " ".join(reply["content"].split())


def main(argv: list[str]) -> int:
    goal = " ".join(argv).strip() or DEFAULT_GOAL
    with AgentOSClient(timeout=120) as kernel:
        print(f"goal: {goal}", flush=True)
        steps = plan(kernel, goal)
        if not steps:
            print("task_planner_agent: the model gave no plan to read steps from",
                  file=sys.stderr)
            return 1
        print(f"plan: {len(steps)} steps; thinking about each", flush=True)
        checklist = [(step, note(kernel, goal, step)) for step in steps]
    print("\nchecklist:")
    for i, (step, how) in enumerate(checklist, 1):
        print(f"  [ ] {i}. {step}")
        if how:
            print(f"         {how}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AgentOSError as err:
        print(f"task_planner_agent: THINK failed: {err.code} — {err.message}", file=sys.stderr)
        sys.exit(1)
