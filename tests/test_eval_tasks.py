"""The local-model evaluation's checks (scripts/eval/tasks.py): they must
pass right answers and fail wrong ones, or its scores mean nothing."""

from __future__ import annotations

import collections
import datetime
import sys
import zoneinfo
from pathlib import Path

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts" / "eval"))
import tasks as eval_tasks  # noqa: E402


def by_name(name: str) -> eval_tasks.Task:
    [task] = [t for t in eval_tasks.tasks(Path("/fixtures")) if t.name == name]
    return task


def test_there_are_thirty_tasks_four_of_every_kind_and_the_five_named_ones():
    chosen = eval_tasks.tasks(Path("/fixtures"))
    assert len(chosen) >= 30
    assert len({t.name for t in chosen}) == len(chosen)
    kinds = collections.Counter(t.kind for t in chosen)
    assert set(kinds) == {"code", "tool", "file", "two-step", "fix"}
    assert min(kinds.values()) >= 4, kinds
    prompts = {t.prompt for t in chosen}
    for verbatim in ['the sha256 of "hello"', "list your tools, then the time in Tokyo",
                     "the days from 2024-03-01 to 2024-12-25", "the primes below 10000"]:
        assert verbatim in prompts
    [csv] = [t for t in chosen if "mean of column b" in t.prompt]
    assert "data.csv" in csv.workspace, "the SDK puts the CSV in /workspace"
    assert len(eval_tasks.mcp_tasks(Path("/fixtures"))) == 5


def test_a_tool_task_needs_a_tool_call_and_the_time_now():
    utc = by_name("utc now").check
    now = datetime.datetime.now(datetime.timezone.utc)
    said = f"It is {now:%H:%M} UTC."
    assert utc(said, {"tool_calls": 1})
    assert not utc(said, {"tool_calls": 0}), "answered from memory"
    later = now + datetime.timedelta(minutes=30)
    assert not utc(f"It is {later:%H:%M}.", {"tool_calls": 1})
    assert utc(f"It is {now:%I:%M %p}.", {"tool_calls": 1})
    tokyo = by_name("tools then tokyo").check
    in_tokyo = now.astimezone(zoneinfo.ZoneInfo("Asia/Tokyo"))
    listed = {"tool_calls": 2, "iterations": [{"stdout": "tools.time.get_current_time(timezone)"}]}
    assert tokyo(f"{in_tokyo:%H:%M}", listed)
    assert not tokyo(f"{in_tokyo:%H:%M}", {"tool_calls": 2, "iterations": []}), "not listed"


def test_the_primes_below_10000_are_counted_or_listed():
    primes = by_name("primes below 10000").check
    assert primes("There are 1,229 primes below 10000.", {})
    assert not primes("There are 1228 primes below 10000.", {})
    listed = [n for n in range(2, 10000) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
    assert primes(", ".join(map(str, listed)), {})
    assert not primes(", ".join(map(str, listed[:-1])), {})


def test_the_mcp_host_reads_a_tool_call_however_a_model_wraps_it():
    import mcp_host

    for reply in ['{"name": "exec", "arguments": {"code": "print(1)"}}',
                  'Sure.\n```json\n{"name": "exec", "arguments": {"code": "print(1)"}}\n```',
                  '<tool_call>\n{"name": "exec", "arguments": {"code": "print(1)"}}\n</tool_call>']:
        assert mcp_host.tool_call_in(reply) == {"name": "exec", "arguments": {"code": "print(1)"}}
    assert mcp_host.tool_call_in("The answer is 42.") is None
    assert mcp_host.tool_call_in('{"a": 1} is a dict') is None


def test_numbers_are_read_with_their_digit_groups_joined():
    assert eval_tasks.numbers_in("It is 2,432,902,008,176,640,000.") == ["2432902008176640000"]
    assert eval_tasks.numbers_in("about 37.8 degrees, or -4") == ["37.8", "-4"]


def test_a_check_passes_the_right_answer_and_fails_others():
    squares = by_name("sum of squares").check
    assert squares("The sum is 42,925.", {})
    assert not squares("The sum is 42924.", {})
    assert not squares("", {})
    assert by_name("read a file").check("The code word is pelican-42", {})
    assert not by_name("read a file").check("PELICAN", {})


def test_a_fix_task_needs_a_failed_run_then_a_good_one():
    fix = by_name("fix a name error").check
    fixed = {"iterations": [{"exit_code": 1}, {"exit_code": 0}]}
    assert fix("It printed 42.", fixed)
    assert not fix("It printed 42.", {"iterations": [{"exit_code": 0}]})
    assert not fix("It printed 42.", {"iterations": [{"exit_code": 0}, {"exit_code": 1}]})
    assert not fix("It printed 41.", fixed)


def test_a_right_answer_reached_another_way_fails_the_task_but_is_not_wrong():
    fix = by_name("fix a name error")
    straight_to_the_fix = {"iterations": [{"exit_code": 0}]}
    assert not fix.check("42", straight_to_the_fix)
    assert eval_tasks.answer_is_right(fix, "42", straight_to_the_fix)
    assert not eval_tasks.answer_is_right(fix, "41", straight_to_the_fix)
    utc = by_name("utc now")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M")
    assert not utc.check(now, {"tool_calls": 0})
    assert eval_tasks.answer_is_right(utc, now, {"tool_calls": 0})
    plain = by_name("sum of squares")
    assert eval_tasks.answer_is_right(plain, "42925", {})
    assert not eval_tasks.answer_is_right(plain, "42924", {})
