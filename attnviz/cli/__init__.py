"""The `attnviz` command line: one module per command, each parsing its options, calling one
pipeline and rendering the result; `app` holds what they share.

COMMANDS is the one list of command modules, in the order `attnviz --help` shows them;
adding a command is one module that registers on `app` and one name here.
"""

from __future__ import annotations

from typing import Any

COMMANDS = ("show", "compare", "check", "export", "report", "needle", "merge", "serve")
STOPPED_EARLY = "interrupted: nothing was written"


def main() -> None:
    """The console entry point. A Ctrl-C ends the process at once, with one line, while the
    command holds nothing to finish or remove (`core.interrupts` says why); from then on it
    raises KeyboardInterrupt, which the commands handle."""
    import signal

    import attnviz.core.interrupts  # noqa: F401  (loaded before the handler can ask it)

    signal.signal(signal.SIGINT, _on_ctrl_c)
    from attnviz.cli.app import main as run

    _register(_named_command())
    run()


def _named_command() -> str | None:
    """The command the command line starts with, where it starts with one: only its module
    is imported (40 ms less for `show`); None (every command) for --help, --version or a
    mistake, which list them all."""
    import sys

    first = sys.argv[1] if len(sys.argv) > 1 else None
    return first if first in COMMANDS else None


def _on_ctrl_c(signum: int, frame: Any) -> None:
    import os
    import sys

    from attnviz.core import interrupts

    if not interrupts.at_once():
        interrupts.ask()
        if _swallowed(frame):  # Python would print it with a traceback and drop it: the
            return  # loops over texts stop at their next one (`interrupts.asked`)
        raise KeyboardInterrupt
    os.write(2, f"{STOPPED_EARLY}\n".encode())
    try:
        if "multiprocessing" in sys.modules:
            # The drawing workers hold no task yet (they start, or warm up): they are
            # stopped before they print a traceback on finding this process gone (and the
            # pool's thread that watches them says nothing), and their queues' named
            # semaphores unlinked as a normal exit would, so that the resource tracker finds
            # none left over and prints no warning.
            import threading

            threading.excepthook = lambda args: None
            for worker in sys.modules["multiprocessing"].active_children():
                worker.kill()
            sys.modules["multiprocessing.util"]._run_finalizers(0)
    finally:
        os._exit(130)


def _swallowed(frame: Any, depth: int = 5) -> bool:
    """Whether an exception raised at `frame` would be dropped by Python with a traceback on
    stderr: inside a weakref callback (the garbage collector's) or a finaliser (`__del__`)."""
    while frame is not None and depth > 0:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _register(only: str | None = None) -> Any:
    """Import every command (each registers on `app`), or the command `only`, and return
    `app`."""
    from importlib import import_module

    from attnviz.cli.app import app

    for name in COMMANDS if only is None else (only,):
        import_module(f"attnviz.cli.{name}")
    # Importing the submodule `attnviz.cli.app` set this package's `app` to that module.
    globals()["app"] = app
    return app


def __getattr__(name: str) -> Any:
    """`app`, with every command registered on it (for tests and other programs)."""
    if name == "app":
        return _register()
    raise AttributeError(f"module 'attnviz.cli' has no attribute {name!r}")


__all__ = ["COMMANDS", "app", "main"]
