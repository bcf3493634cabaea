"""A part of a report's sums in a file (a *partial*): `report --shard I/N --partial DIR` and
each rank of a distributed run write one, `attnviz merge` and `--resume` read them.

One `.npz` file (numpy's own zip of arrays, read back without pickle): the part's named
float arrays and one JSON document (what the part is of, and how its arrays fit together),
written atomically, so a partial is whole or absent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError
from attnviz.outputs.files import write_atomic

if TYPE_CHECKING:
    import numpy as np

_DOCUMENT = "document"  # the JSON document's name among the arrays
NAME = re.compile(r"report-shard-(\d+)-of-(\d+)\.npz")


def partial_path(folder: Path, index: int, count: int) -> Path:
    """Where shard `index` of `count` is written in `folder`."""
    return folder / f"report-shard-{index}-of-{count}.npz"


def encode(arrays: dict[str, np.ndarray], document: dict[str, Any]) -> bytes:
    """The arrays and the document as the bytes of one .npz (the arrays renamed a0, a1, …
    inside it; the document keeps their names)."""
    import io

    import numpy as np

    names = list(arrays)
    stored = {f"a{k}": np.asarray(arrays[name]) for k, name in enumerate(names)}
    text = json.dumps({"arrays": names, **document}, ensure_ascii=False)
    stored[_DOCUMENT] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **stored)
    return buffer.getvalue()


def decode(raw: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays by name and the document of `encode`'s bytes; one line naming `where` they
    came from if they are not."""
    import io
    import zipfile

    import numpy as np

    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as found:
            document = json.loads(found[_DOCUMENT].tobytes().decode("utf-8"))
            arrays = {name: found[f"a{k}"] for k, name in enumerate(document.pop("arrays"))}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise InputError(f"{where}: not a partial attnviz wrote ({error})") from None
    return arrays, document


def write_partial(path: Path, arrays: dict[str, np.ndarray], document: dict[str, Any]) -> Path:
    """Write a partial atomically."""
    raw = encode(arrays, document)
    return write_atomic(path, lambda handle: handle.write(raw))


def read_partial(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A partial's arrays by name and its document."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read it ({error.strerror})") from None
    return decode(raw, str(path))


def find_partials(folders: Sequence[Path]) -> list[Path]:
    """The partials in `folders`, refusing a folder that is missing or holds none."""
    found = []
    for folder in folders:
        if not folder.is_dir():
            raise InputError(f"{folder}: no such folder; give the folders of the partials")
        here = sorted(path for path in folder.iterdir() if NAME.fullmatch(path.name))
        if not here:
            raise InputError(
                f"{folder}: no partial (report-shard-I-of-N.npz) in it; write them with "
                "attnviz report --shard I/N --partial FOLDER"
            )
        found += here
    return found
