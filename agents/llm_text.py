"""Reading lists out of a small model's free text, shared by the example
agents that ask THINK for steps or questions.

A model this small follows "a numbered list, nothing else" only some of the
time: it adds a preamble, mixes bullets and numbers, or writes one
paragraph. So numbered or bulleted lines are taken first, then any
non-empty lines, then sentences.

>>> list_items("Sure! Here it is:\\n1. Boil water\\n2) Add tea\\n- Wait")
['Boil water', 'Add tea', 'Wait']
>>> list_items("Boil water. Add tea. Wait three minutes.")
['Boil water.', 'Add tea.', 'Wait three minutes.']
"""

from __future__ import annotations

import re

MARKER = re.compile(r"^\s*(?:\d+\s*[.):]|[-*•]|step\s+\d+\s*[.):]?)\s*", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Shorter than this is a stray word or a lone number, not an item.
MIN_ITEM_CHARS = 4


def list_items(text: str, limit: int = 5) -> list[str]:
    """Up to ``limit`` items read from ``text``, best-structured reading first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [MARKER.sub("", line, count=1) for line in lines if MARKER.match(line)]
    candidates = [
        marked,
        [MARKER.sub("", line, count=1) for line in lines] if len(lines) > 1 else [],
        SENTENCE_END.split(" ".join(lines)),
    ]
    for items in candidates:
        items = [item.strip() for item in items if len(item.strip()) >= MIN_ITEM_CHARS]
        if items:
            return _unique(items)[:limit]
    return []


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    kept = []
    for item in items:
        key = item.casefold()
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return kept
