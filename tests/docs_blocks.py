"""The fenced code blocks of the project's Markdown, and what each asks of
the docs runner (``test_docs.py``).

A block's info string says what it is:

- ``bash``, ``sh``: commands, run by bash with ``-e -o pipefail``;
- ``console``: a session; its ``$ `` lines (with their ``\\``
  continuations) are the commands, run as a ``bash`` block, the rest is
  their output;
- ``python``: a program, run by the project's ``.venv`` Python;
- ``python exec``, ``bash exec``: code for an EXEC run (``import tools``
  works there), run with ``agentos exec``;
- ``toml``: a config file, or part of one, checked by
  ``agentosd --check-config``;
- ``text``, ``json``, ``c``, ...: shown, never run (output, payloads,
  other languages);
- a runnable language followed by ``no-run`` and the reason
  (```` ```bash no-run needs systemd ````): shown, not run, and listed
  with its reason by the runner.

A fence with no info string is an error: every block says what it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

# Languages the runner executes, and how it names each kind.
RUNNERS = {"bash": "bash", "sh": "bash", "console": "console", "python": "python", "toml": "toml"}
NO_RUN = "no-run"
IN_EXEC = "exec"

# An opening fence: up to three spaces (more inside list items), three or
# more backticks or tildes, the info string.
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block."""

    path: Path  # the Markdown file
    name: str  # the file as the repository names it (docs/tools.md)
    line: int  # the line of its opening fence, from 1
    info: str  # the whole info string
    code: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runner(self) -> Optional[str]:
        """How the runner executes it: bash, console, python, toml, or None."""
        return RUNNERS.get(self.language)

    @property
    def no_run_reason(self) -> Optional[str]:
        """Why it is not run, when its info string says ``no-run``."""
        words = self.info.split()
        if len(words) < 2 or words[1] != NO_RUN:
            return None
        return " ".join(words[2:])

    @property
    def in_exec(self) -> bool:
        """Whether it is code for an EXEC run, not for the host."""
        words = self.info.split()
        return len(words) >= 2 and words[1] == IN_EXEC and self.language in ("python", "bash")

    @property
    def id(self) -> str:
        return f"{self.name}:{self.line}"


def blocks(path: Path, name: str) -> Iterator[Block]:
    """The fenced blocks of one Markdown file, in order."""
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        # A backtick fence's info string has no backtick: ```` ```bash ````
        # inside a paragraph is inline code, not a fence.
        if opening is None or ("`" in opening["fence"] and "`" in opening["info"]):
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        body = []
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence) and set(closing) == {fence[0]}:
                break
            # Inside a list item the block is indented with its fence.
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        yield Block(path, name, index + 1, opening["info"].strip(), "\n".join(body) + "\n")
        index = end + 1


def markdown_files(repo: Path) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def all_blocks(repo: Path) -> list[Block]:
    """Every fenced block of the project's documentation, file by file."""
    found = []
    for path in markdown_files(repo):
        found.extend(blocks(path, str(path.relative_to(repo))))
    return found


def console_commands(code: str) -> str:
    """The commands of a console session: its ``$ `` lines, with the lines
    a trailing backslash continues."""
    commands, continuing = [], False
    for line in code.splitlines():
        if continuing:
            commands.append(line)
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            continue
        continuing = line.endswith("\\")
    return "\n".join(commands) + "\n"
