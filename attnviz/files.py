"""Safe output: folders checked before any work, files written atomically (temp, then rename)."""

from __future__ import annotations

import os
import re
import tempfile
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import IO

from attnviz.errors import OutputError


def prepare_dir(path: Path) -> Path:
    """Create `path` if needed and prove it is writable, before any slow work starts."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(
            f"cannot write under {existing}: it is a file, not a folder; choose another --out"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".attnviz-probe-"):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write to output folder {path}: {exc.strerror}") from exc
    return path


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write a file through `write(fileobj)` so that readers only ever see the whole file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
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
