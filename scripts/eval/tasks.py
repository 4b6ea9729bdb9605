"""The tasks of the local-model evaluation: each a prompt for `agentos run`
and a check of the answer (and, where the task says how to get there, of
the transcript). Every check is computed here, never typed in by hand
from a model's output."""

from __future__ import annotations

import datetime
import hashlib
import re
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Files the filesystem server serves to the tasks that read through it.
FIXTURES = {
    "codeword.txt": "Notes from the field.\nThe code word is PELICAN-42.\nEnd of notes.\n",
    "numbers.txt": "".join(f"{n}\n" for n in range(3, 300, 8)),
    "inventory.csv": "item,count\napples,12\npears,7\nplums,30\nfigs,5\n",
}


def numbers_in(text: str) -> list[str]:
    """The numbers an answer states, commas and spaces between digit
    groups taken out ("1,234" and "1 234" are 1234)."""
    joined = re.sub(r"(?<=\d)[, ](?=\d{3}\b)", "", text)
    return re.findall(r"-?\d+(?:\.\d+)?", joined)


def says_number(expected: float | int) -> Callable[[str, dict], bool]:
    def check(answer: str, _result: dict) -> bool:
        for found in numbers_in(answer):
            if float(found) == float(expected):
                return True
        return False
    check.__doc__ = f"the answer states {expected}"
    return check


def says_text(expected: str) -> Callable[[str, dict], bool]:
    def check(answer: str, _result: dict) -> bool:
        return expected.lower() in answer.lower()
    check.__doc__ = f"the answer contains {expected!r}"
    return check


def answer_is_right(task: "Task", answer: str, result: dict) -> bool:
    """Whether the answer itself is right, however it was reached: a
    check of how the task was done (a failed run first, a tool called)
    keeps the check of its answer as `answer`."""
    return getattr(task.check, "answer", task.check)(answer, result)


def failed_then_fixed(inner: Callable[[str, dict], bool]) -> Callable[[str, dict], bool]:
    """The answer passes `inner`, and a run failed before a later one
    succeeded: the model saw its error and fixed its code."""
    def check(answer: str, result: dict) -> bool:
        codes = [i.get("exit_code") for i in result.get("iterations") or []]
        failed = [n for n, code in enumerate(codes) if code not in (0, None)]
        fixed = bool(failed) and any(code == 0 for code in codes[failed[0] + 1:])
        return fixed and inner(answer, result)
    check.__doc__ = f"a run failed, a later one succeeded, and {inner.__doc__}"
    check.answer = inner
    return check


def used_a_tool(inner: Callable[[str, dict], bool]) -> Callable[[str, dict], bool]:
    """The answer passes `inner`, and the runs called a tool: a tool
    task answered from memory is not solved."""
    def check(answer: str, result: dict) -> bool:
        return (result.get("tool_calls") or 0) > 0 and inner(answer, result)
    check.__doc__ = f"a tool was called, and {inner.__doc__}"
    check.answer = inner
    return check


def says_time_now(zone: str) -> Callable[[str, dict], bool]:
    """The answer states the time in `zone` within two minutes of when it
    is checked, as HH:MM (24-hour) or H:MM with AM or PM."""
    def check(answer: str, _result: dict) -> bool:
        now = datetime.datetime.now(zoneinfo.ZoneInfo(zone))
        stated = set()
        for hour, minute, half in re.findall(r"\b(\d{1,2}):(\d{2})(?::\d{2})?\s*([AaPp][Mm])?", answer):
            hour = int(hour) % 12 + (12 if half.lower() == "pm" else 0) if half else int(hour)
            stated.add(hour * 60 + int(minute))
        minutes = now.hour * 60 + now.minute
        return any(min(abs(s - minutes), 1440 - abs(s - minutes)) <= 2 for s in stated)
    check.__doc__ = f"the answer states the time now in {zone}"
    return check


def names_a_tool(names: list[str]) -> Callable[[str, dict], bool]:
    """The answer, or what a run printed, names one of `names`: the tools
    were listed."""
    def check(answer: str, result: dict) -> bool:
        seen = answer + "".join(i.get("stdout") or "" for i in result.get("iterations") or [])
        return any(name in seen for name in names)
    check.__doc__ = f"the tools were listed (one of {names} named)"
    return check


def all_of(*checks: Callable[[str, dict], bool]) -> Callable[[str, dict], bool]:
    def check(answer: str, result: dict) -> bool:
        return all(c(answer, result) for c in checks)
    check.__doc__ = " and ".join(c.__doc__ or "" for c in checks)
    return check


def one_of(*checks: Callable[[str, dict], bool]) -> Callable[[str, dict], bool]:
    def check(answer: str, result: dict) -> bool:
        return any(c(answer, result) for c in checks)
    check.__doc__ = " or ".join(c.__doc__ or "" for c in checks)
    return check


def says_count(expected: int) -> Callable[[str, dict], bool]:
    """The answer states `expected` as a count: among a few numbers, not
    inside a long list where it may be an item."""
    inner = says_number(expected)

    def check(answer: str, result: dict) -> bool:
        return len(numbers_in(answer)) <= 20 and inner(answer, result)
    check.__doc__ = f"the answer states the count {expected}"
    return check


def says_every_number(expected: list[int]) -> Callable[[str, dict], bool]:
    def check(answer: str, _result: dict) -> bool:
        return set(expected) <= {float(n) for n in numbers_in(answer)}
    check.__doc__ = f"the answer lists all {len(expected)} numbers"
    return check


@dataclass
class Task:
    name: str
    kind: str
    prompt: str
    check: Callable[[str, dict], bool]
    needs: list[str] = field(default_factory=list)
    # Files the SDK puts in the task's session's /workspace before the
    # task runs (name to content); the task then runs in that session.
    workspace: dict[str, str] = field(default_factory=dict)


def tasks(fixtures: Path) -> list[Task]:
    """The tasks, with `fixtures` the directory the filesystem server
    serves (holding FIXTURES)."""
    primes = [n for n in range(2, 1000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    digest = hashlib.sha256(b"agentos").hexdigest()[:12]
    numbers = [int(line) for line in FIXTURES["numbers.txt"].split()]
    london_noon = datetime.datetime.combine(
        datetime.date.today(), datetime.time(12, 0), zoneinfo.ZoneInfo("Europe/London"))
    tokyo = london_noon.astimezone(zoneinfo.ZoneInfo("Asia/Tokyo"))
    sentence = "The quick brown fox jumps over the lazy dog while the cat sleeps"
    primes_below_10000 = [n for n in range(2, 10000)
                          if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    column_b = [2.5, 4, 7.25, 10, 3.5]
    data_csv = "a,b,c\n" + "".join(f"{i},{b},{i * 3}\n" for i, b in enumerate(column_b, 1))
    return [
        Task("sum of squares", "code", "Use Python to compute the sum of the squares of the "
             "integers from 1 to 50, then tell me the number.", says_number(sum(n * n for n in range(1, 51)))),
        Task("fibonacci", "code", "Use Python to compute the 30th Fibonacci number "
             "(F(1) = 1, F(2) = 1), then tell me the number.", says_number(832040)),
        Task("primes", "code", "Use Python to count the prime numbers below 1000, then tell "
             "me how many there are.", says_number(len(primes))),
        Task("factorial", "code", "Use Python to compute 20 factorial, then tell me the "
             "number.", says_number(2432902008176640000)),
        Task("digit sum", "code", "Use Python to compute the sum of the decimal digits of 2 "
             "to the power 100, then tell me the number.", says_number(sum(map(int, str(2 ** 100))))),
        Task("sha256", "code", "Use Python's hashlib to compute the SHA-256 hex digest of the "
             "text agentos, then tell me its first 12 characters.", says_text(digest)),
        Task("days between", "code", "Use Python to compute how many days there are from "
             "2024-01-01 to 2024-12-25, then tell me the number.", says_number(359)),
        Task("vowels", "code", f"Use Python to count the vowels (a, e, i, o, u) in this "
             f"sentence: {sentence!r}. Tell me the number.",
             says_number(sum(c in "aeiou" for c in sentence.lower()))),
        Task("median", "code", "Use Python to find the median of these numbers: 14, 3, 27, 8, "
             "19, 42, 5. Tell me the median.", says_number(14)),
        Task("fahrenheit", "code", "Use Python to convert 100 degrees Fahrenheit to Celsius, "
             "rounded to one decimal place, then tell me the result.", says_number(37.8)),
        Task("json", "code", 'Use Python to parse this JSON and tell me the total of the '
             '"price" fields: {"items": [{"price": 12.5}, {"price": 7.25}, {"price": 30}]}',
             says_number(49.75)),
        Task("sha256 of hello", "code", 'the sha256 of "hello"',
             says_text(hashlib.sha256(b"hello").hexdigest())),
        Task("days in 2024", "code", "the days from 2024-03-01 to 2024-12-25",
             says_number((datetime.date(2024, 12, 25) - datetime.date(2024, 3, 1)).days)),
        Task("primes below 10000", "code", "the primes below 10000",
             one_of(says_count(len(primes_below_10000)), says_every_number(primes_below_10000))),
        Task("get-sum tool", "tool", "Call the everything server's get-sum tool with a = 1234 "
             "and b = 4321 (keyword arguments a and b), then tell me the sum it returns.",
             says_number(5555), ["everything"]),
        Task("convert time tool", "tool", "Use the time server's convert_time tool to convert "
             f"12:00 in Europe/London today to Asia/Tokyo time, then tell me the time in "
             f"Tokyo as HH:MM.", says_text(tokyo.strftime("%H:%M")), ["time"]),
        Task("tools then tokyo", "tool", "list your tools, then the time in Tokyo",
             all_of(used_a_tool(says_time_now("Asia/Tokyo")),
                    names_a_tool(["get_current_time", "convert_time", "get-sum", "echo"])),
             ["time"]),
        Task("utc now", "tool", "Use the time server's get_current_time tool to get the "
             "current time in UTC, then tell me that time as HH:MM.",
             used_a_tool(says_time_now("UTC")), ["time"]),
        Task("csv in workspace", "file", "the mean of column b of data.csv in /workspace",
             says_number(sum(column_b) / len(column_b)), workspace={"data.csv": data_csv}),
        Task("read a file", "file", f"Read the file {fixtures}/codeword.txt with the filesystem "
             "server's read_text_file tool, then tell me the code word it gives.",
             says_text("PELICAN-42"), ["filesystem"]),
        Task("count lines", "file", f"Read {fixtures}/numbers.txt with the filesystem server's "
             "read_text_file tool and tell me how many lines it has.",
             says_number(len(numbers)), ["filesystem"]),
        Task("sum a file", "file", f"Read {fixtures}/numbers.txt with the filesystem server's "
             "read_text_file tool; it has one integer per line. Tell me their sum.",
             says_number(sum(numbers)), ["filesystem"]),
        Task("csv", "file", f"Read {fixtures}/inventory.csv with the filesystem server's "
             "read_text_file tool and tell me the total count of all items.",
             says_number(54), ["filesystem"]),
        Task("workspace file", "two-step", "First, write the integers 1 to 10, one per line, to "
             "/workspace/n.txt. Then, in a second step, read /workspace/n.txt back and tell me "
             "the sum of its lines.", says_number(55)),
        Task("workspace json", "two-step", 'First, save {"a": 3, "b": 4} as JSON to '
             "/workspace/data.json. Then, in a second step, load that file and tell me a times "
             "b.", says_number(12)),
        Task("workspace state", "two-step", "First, in one step, define a Python variable "
             "total = 7 * 6 and print it. Then, in a second step, print total + 8 and tell me "
             "that number.", says_number(50)),
        Task("workspace directory", "two-step", "First, create the directory "
             "/workspace/parts and write three files in it: a.txt holding 10, b.txt holding 20 "
             "and c.txt holding 30. Then, in a second step, read every file in /workspace/parts "
             "and tell me the total of the numbers they hold.", says_number(60)),
        Task("fix a name error", "fix", "Run exactly this code first: print(undefined_value * 2). "
             "It fails. Then fix it by setting undefined_value = 21 before the print, run it "
             "again, and tell me what it printed.", failed_then_fixed(says_number(42))),
        Task("fix a missing file", "fix", "Run Python that opens /workspace/missing.txt for "
             "reading; it does not exist, so it fails. Then write the text hello into that file, "
             "read it back, and tell me how many characters it has.",
             failed_then_fixed(says_number(5))),
        Task("fix a bad number", "fix", "Run exactly this code first: print(int('12a') + 1). "
             "It fails. Then fix the text so that it is '12', run it again, and tell me what it "
             "printed.", failed_then_fixed(says_number(13))),
        Task("fix a missing module", "fix", "Run exactly this code first: import numpy; "
             "print(numpy.mean([3, 5, 10])). If it fails, compute the same mean with plain "
             "Python, run that, and tell me the number.", failed_then_fixed(says_number(6))),
    ]


def mcp_tasks(fixtures: Path) -> list[Task]:
    """The tasks an MCP host gives the local model through `agentos mcp`
    (scripts/eval/mcp_host.py): each needs the server's tools, and the
    first four what its descriptions teach (`exec` with the `tools`
    module, `tools_search`)."""
    return [
        Task("mcp sha256", "mcp", 'the sha256 of "hello"',
             used_a_tool(says_text(hashlib.sha256(b"hello").hexdigest()))),
        Task("mcp tokyo", "mcp", "the time in Tokyo now, as HH:MM",
             used_a_tool(says_time_now("Asia/Tokyo"))),
        Task("mcp code word", "mcp", f"Read the file {fixtures}/codeword.txt with the "
             "filesystem server and tell me the code word it gives.",
             used_a_tool(says_text("PELICAN-42"))),
        Task("mcp get-sum", "mcp", "Use the everything server's get-sum tool to add 1234 and "
             "4321, and tell me the sum.", used_a_tool(says_number(5555))),
        Task("mcp days", "mcp", "Run Python to count the days from 2024-03-01 to 2024-12-25.",
             used_a_tool(says_number(299))),
    ]
