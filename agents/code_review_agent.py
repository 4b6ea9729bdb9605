#!/usr/bin/env python3
"""Reviews a Python file with the kernel's LLM: checks that it compiles,
asks THINK for the issues it sees, then for a verdict, and prints both.

Usage: python agents/code_review_agent.py [file.py]   (default: this file)

The verdict is the model's opinion — at this model size, a demonstration
of the workflow rather than a review to trust; the compile check is exact.
"""

import os
import sys
from typing import Optional

from agentos import AgentOSClient, AgentOSError
from llm_text import list_items

# About a thousand tokens of code: the rest of the model's 2048-token context
# is left for the instructions and the answer.
MAX_SOURCE_CHARS = 3000
# Checked in this order, so "not approved" reads as a request for changes.
VERDICT_PHRASES = (
    ("request changes", "REQUEST CHANGES"), ("not approv", "REQUEST CHANGES"),
    ("reject", "REQUEST CHANGES"), ("approve", "APPROVE"), ("lgtm", "APPROVE"),
)


def syntax_error(source: str, path: str) -> Optional[str]:
    try:
        compile(source, path, "exec")
    except SyntaxError as err:
        return f"syntax error at line {err.lineno}: {err.msg}"
    return None


def issues(kernel: AgentOSClient, name: str, source: str) -> list[str]:
    reply = kernel.think(
        f"Review this Python file, {name}. List up to three problems or risks, "
        f"one per line.\n\n```python\n{source}\n```",
        system="You are a careful Python code reviewer. Be brief.",
        max_tokens=128,
        temperature=0.2,
    )
    return list_items(reply["content"], 3)


def verdict(kernel: AgentOSClient, name: str, found: list[str]) -> tuple[str, str]:
    """The verdict word and the model's own sentence for it."""
    listed = "\n".join(f"- {issue}" for issue in found) or "- none found"
    reply = kernel.think(
        f"A review of {name} found these issues:\n{listed}\n\n"
        "Should the file be approved as it is? Start your answer with APPROVE or "
        "REQUEST CHANGES, then give one sentence of reason.",
        max_tokens=48,
        temperature=0.2,
    )
    said = reply["content"].strip()
    lowered = said.lower()
    # Asked to lead with its verdict, the model sometimes does; otherwise
    # the verdict is read from anywhere in the answer.
    for phrase, word in VERDICT_PHRASES:
        if lowered.startswith(phrase):
            return word, said
    for phrase, word in VERDICT_PHRASES:
        if phrase in lowered:
            return word, said
    return "UNCLEAR", said


def main(argv: list[str]) -> int:
    path = argv[0] if argv else os.path.abspath(__file__)
    try:
        with open(path, encoding="utf-8") as file:
            source = file.read()
    except (OSError, UnicodeDecodeError) as err:
        print(f"code_review_agent: cannot read {path}: {err}", file=sys.stderr)
        return 2
    name = os.path.basename(path)
    shown = source[:MAX_SOURCE_CHARS]
    print(f"reviewing {path} ({len(source.splitlines())} lines)", flush=True)
    if len(shown) < len(source):
        print(f"  only its first {MAX_SOURCE_CHARS} characters go to the model", flush=True)
    broken = syntax_error(source, path)
    print(f"compile check: {broken or 'compiles'}", flush=True)
    with AgentOSClient(timeout=120) as kernel:
        found = issues(kernel, name, shown)
        if broken:
            found.insert(0, broken)
        print("issues:")
        for issue in found or ["(the model listed none)"]:
            print(f"  - {issue}")
        word, said = verdict(kernel, name, found)
    if broken:
        # Whatever the model thinks, a file that does not compile is not ready.
        word = "REQUEST CHANGES"
    print(f"verdict: {word}")
    print(f"  model said: {said or '(nothing)'}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AgentOSError as err:
        print(f"code_review_agent: THINK failed: {err.code} — {err.message}", file=sys.stderr)
        sys.exit(1)
