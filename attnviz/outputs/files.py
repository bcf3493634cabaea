"""Safe output: folders checked before any work, files written atomically (temp, then rename).

A folder written for one text holds only the files of its last run: `done.json`, written last,
lists them, and the next run into the same folder removes them first.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from attnviz.core import interrupts
from attnviz.errors import OutputError

DONE = "done.json"
PROBE = ".attnviz-probe-"


def check_writable(path: Path) -> Path:
    """Prove that `path` can be written, or made, before any slow work starts, without making
    it: a temporary file in it, or in its nearest folder that exists. Nothing is created
    until there is something whole to write (`prepare_dir`, `write_atomic`)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(
            f"cannot write under {existing}: it is a file, not a folder; choose another --out"
        )
    try:
        with interrupts.holding(), tempfile.NamedTemporaryFile(dir=existing, prefix=PROBE):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {path}: {exc.strerror}") from exc
    return path


def prepare_dir(path: Path) -> Path:
    """Create `path` if needed and prove it is writable: where files are about to be written."""
    check_writable(path)
    interrupts.hold()  # a run's folder: Ctrl-C from now must let it say what it holds
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=PROBE):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {path}: {exc.strerror}") from exc
    return path


@functools.cache
def _umask() -> int:
    """The process's umask, read once a process: reading it means setting it and straight
    back, which a thread making a file at that moment would feel."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write a file through `write(fileobj)` so that readers only ever see the whole file.

    The file gets the mode any program would give it (0666 less the umask): mkstemp's
    private 0600 would otherwise survive the rename.
    """
    mode = 0o666 & ~_umask()
    interrupts.hold()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write text (UTF-8) atomically."""
    return write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))


def slug(text: str, max_len: int = 40) -> str:
    """A short, filesystem-safe name made from the start of a sentence."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    words = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return words[:max_len].rstrip("-") or "text"


def text_folder_name(text: str, max_len: int = 40, *context: str | None) -> str:
    """A folder name unique to `text` and its `context` (the model, a sentence pair): a
    readable slug of the text and 8 hex digits of a hash of all of them.

    Texts that share their first words (or have no ASCII letters at all), or one text read by
    two models, still get distinct folders.
    """
    keyed = "\n".join([text, *(c for c in context if c is not None)]) if context else text
    digest = hashlib.sha256(keyed.encode("utf-8")).hexdigest()[:8]
    return f"{slug(text, max_len)}-{digest}"


def read_done(folder: Path) -> dict[str, Any] | None:
    """The `done.json` of a finished run in `folder`, or None."""
    try:
        return json.loads((folder / DONE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# The names of the files one text's folder gets (render.py names the figures; export adds
# the raw array; show and export the page). A test checks every name written matches.
TEXT_FILES = re.compile(
    r"(overview|layer-\d+|layer-\d+-head-\d+|query-.*-\d+|divergence|layer-\d+-head-\d+-(compare|pictures)"
    r"|importance-[ab]|moved-or-matters|picture-(\d+-\d+-|dist-|reg\d+-)?(layer-\d+|rollout))"
    r"\.(png|svg|pdf)|attention\.(html|npz)|compare(-\d+)?\.html|layout\.json"
)


def clear_previous(folder: Path, text_folder: bool = False) -> None:
    """Before writing into `folder`: remove the files its last run listed in `done.json`
    (paths relative to the folder's parent), that `done.json`, and temp files of a killed run.

    A `text_folder` (one text's folder, which attnviz made and names) also loses any file named
    as attnviz names a text's files: an interrupted run wrote some and no `done.json`.
    """
    done = read_done(folder) or {}
    previous = done.get("record", {}).get("files", []) if isinstance(done, dict) else []
    (folder / DONE).unlink(missing_ok=True)
    for name in previous:
        (folder.parent / name).unlink(missing_ok=True)
    for stale in folder.glob(".*.part"):
        stale.unlink()
    if text_folder:
        for path in folder.iterdir():
            if TEXT_FILES.fullmatch(path.name) and path.is_file():
                path.unlink()


def write_done(folder: Path, settings: dict[str, Any], record: dict[str, Any]) -> Path:
    """Write `done.json` last: the settings of the run and its record (with the files it wrote)."""
    done = {"settings": settings, "record": record}
    return write_text_atomic(folder / DONE, json.dumps(done, ensure_ascii=False, indent=1))
