"""The walk of one `attnviz show` from the command line to its PNGs: every attnviz module a
function of which runs, in the order each is first entered (module bodies and class bodies
left out: imports are not the walk). docs/architecture.md gives the figures it prints.

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


def walk(text: str) -> list[tuple[str, str]]:
    """(module path, first function entered) for each attnviz module the run enters."""
    seen: dict[str, str] = {}

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_flags & OPTIMIZED and code.co_filename.startswith(PACKAGE):
            name = code.co_filename[len(PACKAGE) :]
            if name not in seen and not code.co_name.startswith("<"):
                seen[name] = code.co_name

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
    return list(seen.items())


def main() -> None:
    text = sys.argv[1] if len(sys.argv) > 1 else "The cat sat on the mat."
    found = walk(text)
    for i, (module, function) in enumerate(found, 1):
        print(f"{i:3d}  attnviz/{module}  ({function})", file=sys.stderr)
    print(f"{len(found)} modules entered", file=sys.stderr)


if __name__ == "__main__":
    main()
