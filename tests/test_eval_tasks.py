"""The local-model evaluation's checks (scripts/eval/tasks.py): they must
pass right answers and fail wrong ones, or its scores mean nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts" / "eval"))
import tasks as eval_tasks  # noqa: E402


def by_name(name: str) -> eval_tasks.Task:
    [task] = [t for t in eval_tasks.tasks(Path("/fixtures")) if t.name == name]
    return task


def test_there_are_at_least_twenty_tasks_of_every_kind_the_evaluation_needs():
    chosen = eval_tasks.tasks(Path("/fixtures"))
    assert len(chosen) >= 20
    assert len({t.name for t in chosen}) == len(chosen)
    assert {t.kind for t in chosen} == {"code", "tool", "file", "two-step", "fix"}


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
