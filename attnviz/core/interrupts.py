"""Whether a Ctrl-C may end the process at once, or must reach the code as KeyboardInterrupt.

While a command holds nothing to finish or remove (it imports torch, loads the model, runs the
pass), the command line ends the process at once on Ctrl-C: a KeyboardInterrupt raised there
can land in Python code that torch or matplotlib called from C++ (pybind11), where it aborts
the process instead of unwinding. From the moment it holds something (a file being written,
a folder a run writes into, a server to stop), Ctrl-C raises KeyboardInterrupt, so that the
code writing it can finish or remove it and say what was written.

Code that writes calls `hold()` (for the rest of the process) or `holding()` (for a block);
the command line's handler asks `at_once()`, and says `asked()` from then on: a
KeyboardInterrupt raised where Python swallows it (a finaliser, a callback) is not lost, since
a loop over many texts also stops at the next text where `asked()`. A run that reads it
starts with `new_run()`: a Ctrl-C stops the run it came in, not every run of the process
after it (a notebook runs again). The API installs no handler: for it this module only keeps
a count.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_held_for_good = False
_held_now = 0
_asked = False


def hold() -> None:
    """From now on this process holds something a Ctrl-C must let it finish or remove."""
    global _held_for_good
    _held_for_good = True


@contextmanager
def holding() -> Iterator[None]:
    """Hold something for the length of the block (a probe file, a staging folder)."""
    global _held_now
    _held_now += 1
    try:
        yield
    finally:
        _held_now -= 1


def ask() -> None:
    """A Ctrl-C came (the command line's handler says so before it raises)."""
    global _asked
    _asked = True


def asked() -> bool:
    """Whether a Ctrl-C came in this run (since `new_run`)."""
    return _asked


def new_run() -> None:
    """A run starts: no Ctrl-C has come in it yet."""
    global _asked
    _asked = False


def at_once() -> bool:
    """Whether a Ctrl-C now may end the process at once: nothing held."""
    return not _held_for_good and _held_now == 0
