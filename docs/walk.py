"""The walk of one `attnviz show` from the command line to its PNGs and the terminal, measured
three ways; docs/architecture.md gives the figures it prints.

- **The walk**: the attnviz modules on the call stack whenever the sentence, or what is made
  of it, is handed to the next step: the checks (`checks.before_loading`), the tokenizer
  (`tokens.encode`), a recorder fed a block of attention (`receive`, `receive_rows`), a
  consumer's step (`recorders`, `read`, `finish`, `write`), a file written
  (`outputs.files.write_atomic`: the PNGs, done.json), the terminal printed (rich's
  `Console.print`). These are the files a reader follows from the command line to a PNG and
  to the terminal, in the order each is first entered.
- **Every module entered**: each attnviz module a function of which runs at all, including
  the helpers called from the walk for one thing each (an option's callback, a check, a
  model's facts), which return at once (module bodies and class bodies left out: imports are
  not the walk).
- **Returns**: how often the route goes back to a module it had left. The route is the
  sequence of attnviz modules that the run's calls enter, in the order they are made: a call
  is a function of attnviz starting (named functions only: a lambda, comprehension or
  generator expression belongs to the function it is written in, which is also where the
  calls it makes come from), made by the innermost named attnviz function on the stack (or by
  none, the first). Each call counts the first time it is made: the same function calling
  the same function again (for the next layer, head, block of rows or figure) walks a step
  of the route already walked. Consecutive entries of one module are one. A **return** is an
  entry of a module that is on the route earlier: the data had left it for another module
  and comes back (the checks asking the feature table, then the checks again, then the table
  again). The count is printed with each returning transition (the function the route was
  in, and the one entered), and beside it the count with every round of every loop walked
  again (`every call`); then by phase of the run (`PHASES`: a phase starts at the first call
  of its function).

    .venv/bin/python docs/walk.py ["The cat sat on the mat."]

One drawing process (`-j 1`), so that the figures are drawn in this process and counted.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

PACKAGE = str(Path(__file__).resolve().parent.parent / "attnviz") + "/"
OPTIMIZED = 0x1  # CO_OPTIMIZED: a function's code (not a module's or a class body's)
# Where the data is handed on: (module, functions); a recorder's anywhere (core.capture
# feeds it), a consumer's steps in any consumer module.
STEPS = {
    "pipelines/checks.py": ("before_loading",),
    "core/tokens.py": ("encode",),
    "outputs/files.py": ("write_atomic",),
}
RECEIVERS = ("receive", "receive_rows")
CONSUMER_STEPS = ("recorders", "read", "finish", "write")
# The phases of a show's run, each from the first call of its function (module, name) on.
PHASES = (
    ("before loading", None),
    ("loading", ("core/models.py", "load")),
    ("the reader", ("core/tokens.py", "encode")),
    ("the pass", ("core/capture.py", "run")),
    ("the consumers", ("pipelines/consumers/__init__.py", "read")),
    ("the terminal", ("cli/show.py", "print_summary")),
    ("the figures", ("outputs/render.py", "render_text")),
)

Function = tuple[str, str, int]  # (module path under attnviz/, name, first line)
Call = tuple["Function | None", Function]  # (the calling function, the function called)


def _reaches(code) -> bool:
    """Whether a call of `code` hands the data to the next step."""
    name, file = code.co_name, code.co_filename
    if not file.startswith(PACKAGE):
        return name == "print" and file.endswith("rich/console.py")
    module = file[len(PACKAGE) :]
    if module.startswith("pipelines/consumers/") and name in CONSUMER_STEPS:
        return True
    return name in RECEIVERS or name in STEPS.get(module, ())


def _named(code) -> Function | None:
    """`code` as a Function where it is a named function of attnviz; None otherwise."""
    if not (code.co_flags & OPTIMIZED and code.co_filename.startswith(PACKAGE)):
        return None
    if code.co_name.startswith("<"):  # <lambda>, <listcomp>, <genexpr>: the enclosing one's
        return None
    return code.co_filename[len(PACKAGE) :], code.co_name, code.co_firstlineno


def _caller(frame) -> Function | None:
    """The innermost named attnviz function below `frame` on the stack."""
    at = frame.f_back
    while at is not None:
        found = _named(at.f_code)
        if found is not None:
            return found
        at = at.f_back
    return None


def returns(calls: Sequence[Call], every: bool = False) -> list[tuple[Function, Function]]:
    """The route's returns, from the calls in the order they were made: (the function the
    route was in, the function entered) for each entry of a module already on the route
    (see the module's docstring). With `every`, a call made again counts again too."""
    return [(last, entered) for _, last, entered in _returning(calls, every)]


def by_phase(calls: Sequence[Call], phases: Sequence[tuple] = PHASES) -> dict[str, int]:
    """The route's returns counted by the phase of the run each is made in: a phase starts at
    the first call of its function (`PHASES`), in the order listed."""
    returning = {at for at, _, _ in _returning(calls)}
    counted = dict.fromkeys((name for name, _ in phases), 0)
    phase = 0
    for at, (_, function) in enumerate(calls):
        if phase + 1 < len(phases) and function[:2] == phases[phase + 1][1]:
            phase += 1
        counted[phases[phase][0]] += at in returning
    return counted


def _returning(calls: Sequence[Call], every: bool = False):
    """`returns`, each with the index of its call in `calls`."""
    made: set[Call] = set()
    seen: set[str] = set()
    last: Function | None = None  # the last function entered on the route
    for at, call in enumerate(calls):
        if not every:
            if call in made:
                continue
            made.add(call)
        entered = call[1]
        module = entered[0]
        if last is not None and last[0] != module and module in seen:
            yield at, last, entered
        seen.add(module)
        last = entered


def walk(text: str) -> tuple[list[tuple[str, str]], list[str], dict[str, list[Call]]]:
    """(module path, first function entered) for each attnviz module the run enters; the
    walk: the modules on the stack where the data reaches something, in the same order; and
    the calls of attnviz functions in the order they were made, by thread."""
    seen: dict[str, str] = {}
    on_walk: set[str] = set()
    calls: dict[str, list[Call]] = {}

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call":
            return
        function = _named(code)
        if function is not None:
            if function[0] not in seen:
                seen[function[0]] = function[1]
            thread = threading.current_thread().name
            calls.setdefault(thread, []).append((_caller(frame), function))
        if _reaches(code):
            at = frame
            while at is not None:
                if at.f_code.co_filename.startswith(PACKAGE):
                    on_walk.add(at.f_code.co_filename[len(PACKAGE) :])
                at = at.f_back

    from attnviz.cli import _register

    app = _register("show")
    with tempfile.TemporaryDirectory() as out:
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            app(["show", text, "-o", out, "-j", "1"], standalone_mode=False)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    entered = list(seen.items())
    return entered, [module for module, _ in entered if module in on_walk], calls


def main() -> None:
    text = sys.argv[1] if len(sys.argv) > 1 else "The cat sat on the mat."
    entered, walked, calls = walk(text)
    say = sys.stderr
    print("The walk (modules on the stack where the data is handed on):", file=say)
    for i, module in enumerate(walked, 1):
        print(f"{i:3d}  attnviz/{module}", file=say)
    print(f"{len(walked)} modules on the walk", file=say)
    print("Every module entered:", file=say)
    for i, (module, function) in enumerate(entered, 1):
        mark = "" if module in walked else "   (called from the walk)"
        print(f"{i:3d}  attnviz/{module}  ({function}){mark}", file=say)
    print(f"{len(entered)} modules entered", file=say)
    print("Returns (a module entered again after the route had left it):", file=say)
    back, every = [], 0
    for thread, made in calls.items():
        back += [(thread, *step) for step in returns(made)]
        every += len(returns(made, every=True))
    for i, (thread, (module, name, _), (to, entered, _)) in enumerate(back, 1):
        where = "" if thread == "MainThread" else f"  [{thread}]"
        print(f"{i:3d}  {module} ({name}) -> {to} ({entered}){where}", file=say)
    print(f"{len(back)} returns ({every} with every call made again counted again)", file=say)
    print("Returns by phase (the main thread's):", file=say)
    for phase, count in by_phase(calls.get("MainThread", [])).items():
        print(f"{count:5d}  {phase}", file=say)


if __name__ == "__main__":
    main()
