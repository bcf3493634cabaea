"""The walk of one `attnviz show` from the command line to its PNGs and the terminal, measured
two ways; docs/architecture.md gives the figures it prints.

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

    .venv/bin/python docs/walk.py ["The cat sat on the mat."]

One drawing process (`-j 1`), so that the figures are drawn in this process and counted.
"""

from __future__ import annotations

import sys
import tempfile
import threading
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


def _reaches(code) -> bool:
    """Whether a call of `code` hands the data to the next step."""
    name, file = code.co_name, code.co_filename
    if not file.startswith(PACKAGE):
        return name == "print" and file.endswith("rich/console.py")
    module = file[len(PACKAGE) :]
    if module.startswith("pipelines/consumers/") and name in CONSUMER_STEPS:
        return True
    return name in RECEIVERS or name in STEPS.get(module, ())


def walk(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(module path, first function entered) for each attnviz module the run enters, and the
    walk: the modules on the stack where the data reaches something, in the same order."""
    seen: dict[str, str] = {}
    on_walk: set[str] = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call":
            return
        if code.co_flags & OPTIMIZED and code.co_filename.startswith(PACKAGE):
            name = code.co_filename[len(PACKAGE) :]
            if name not in seen and not code.co_name.startswith("<"):
                seen[name] = code.co_name
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
    return entered, [module for module, _ in entered if module in on_walk]


def main() -> None:
    text = sys.argv[1] if len(sys.argv) > 1 else "The cat sat on the mat."
    entered, walked = walk(text)
    print("The walk (modules on the stack where the data is handed on):", file=sys.stderr)
    for i, module in enumerate(walked, 1):
        print(f"{i:3d}  attnviz/{module}", file=sys.stderr)
    print(f"{len(walked)} modules on the walk", file=sys.stderr)
    print("Every module entered:", file=sys.stderr)
    for i, (module, function) in enumerate(entered, 1):
        mark = "" if module in walked else "   (called from the walk)"
        print(f"{i:3d}  attnviz/{module}  ({function}){mark}", file=sys.stderr)
    print(f"{len(entered)} modules entered", file=sys.stderr)


if __name__ == "__main__":
    main()
