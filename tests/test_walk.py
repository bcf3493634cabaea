"""docs/walk.py's count of returns is the definition its docstring gives: a module entered
again after the route had left it for another, each call counted the first time it is made."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "docs_walk", Path(__file__).resolve().parent.parent / "docs" / "walk.py"
)
walk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(walk)


def f(module: str, name: str) -> tuple[str, str, int]:
    return (f"{module}.py", name, 1)


CHECKS, ASK, PICTURES = f("checks", "run"), f("checks", "ask"), f("checks", "pictures")
TABLE = f("features", "refuse")


def test_a_module_entered_again_after_another_is_a_return():
    calls = [(None, CHECKS), (CHECKS, TABLE), (CHECKS, PICTURES), (PICTURES, TABLE)]
    assert walk.returns(calls) == [(TABLE, PICTURES), (PICTURES, TABLE)]


def test_calls_within_a_module_are_no_return():
    calls = [(None, CHECKS), (CHECKS, ASK), (ASK, PICTURES), (CHECKS, TABLE)]
    assert walk.returns(calls) == []


def test_a_loop_walks_its_step_once_unless_every_call_is_counted():
    layer = [(CHECKS, TABLE), (TABLE, ASK)]  # the same two calls for each of three layers
    calls = [(None, CHECKS), *layer * 3]
    assert walk.returns(calls) == [(TABLE, ASK)]
    assert len(walk.returns(calls, every=True)) == 5  # checks, table, checks, table, checks


def test_returns_are_counted_in_the_phase_whose_first_call_came_before():
    calls = [(None, CHECKS), (CHECKS, TABLE), (TABLE, PICTURES), (PICTURES, TABLE)]
    phases = (("checks", None), ("pictures", ("checks.py", "pictures")))
    # the table entered again from the pictures' phase: the pictures' phase's return
    assert walk.by_phase(calls, phases) == {"checks": 0, "pictures": 2}
    later = (("checks", None), ("never", ("features.py", "asks")))
    assert walk.by_phase(calls, later) == {"checks": 2, "never": 0}
