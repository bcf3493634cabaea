"""Where a run's weights are held whole: an array in memory, or a `.npy` file on disk written
a block of query rows at a time as the pass makes them (the API's `attention(..., to=PATH)`),
for maps larger than the memory the process can have.

The file is written beside its final name (`.NAME.part`) and renamed only once the pass has
written every block, so a reader never sees half a file; an error or Ctrl-C removes it. It is
written with `os.pwrite`, not through a writable memory map: the pages go to the page cache,
which the kernel writes back and reclaims, not to this process's resident memory. Keys a
decoder's block stops before (a causal row's later keys) are never written: the file is made
at its full size first, and its unwritten bytes read as 0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from attnviz.errors import InputError

FLOAT = 4  # bytes: weights are float32


# Arrays from this size on are made of fresh pages the kernel is asked to back with huge
# pages (2 MiB, where transparent huge pages are on "madvise" or "always"): the blocks of rows
# that fill them first fault 2 MiB at a time, not 4 KiB (1.1 GB filled 7-10× as fast here).
HUGE_FROM = 64 * 2**20


def zeroed(shape: tuple[int, ...]) -> Any:
    """A float32 array of `shape` holding 0, for the blocks of rows of a pass to fill: fresh
    anonymous pages (which read as 0 until written), backed by huge pages where the kernel
    allows it; a plain `np.zeros` below HUGE_FROM or where mmap cannot."""
    import mmap

    import numpy as np

    nbytes = FLOAT * int(np.prod(shape))
    if nbytes < HUGE_FROM or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(shape, np.float32)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            pages.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: 4 KiB pages
            pass
    return np.frombuffer(pages, np.float32).reshape(shape)  # the array keeps the pages


def npy_target(path: str | os.PathLike[str], nbytes: int) -> Path:
    """Refuse, one line each, a `to=` path that cannot take `nbytes` of weights: not a
    `.npy` name, a folder that does not exist or cannot be written, a disk with less room
    free. The path, resolved."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise InputError(f"to={str(path)!r} is a folder: give a file name in it, e.g. weights.npy")
    if target.suffix != ".npy":
        raise InputError(f"to={str(path)!r} is not a .npy file name: give one, e.g. weights.npy")
    folder = target.parent.resolve()
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise InputError(f"to={str(path)!r}: the folder {folder} {what}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"to={str(path)!r}: the folder {folder} cannot be written")
    free = shutil.disk_usage(folder).free
    if free < nbytes:
        raise InputError(
            f"to={str(path)!r}: the weights take {_gb(nbytes)} and the disk holding {folder} "
            f"has {_gb(free)} free; keep fewer layers (layers=[…]) or free some space"
        )
    return folder / target.name


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:,.1f} MB"


class NpyFile:
    """A float32 `.npy` array of `shape` (B, L, H, T, S), B = 1, written in blocks of rows;
    `close()` renames it into place and returns its read-only memory map (L, H, T, S)."""

    def __init__(self, path: Path, shape: tuple[int, ...]) -> None:
        import numpy as np

        if shape[0] != 1:
            raise ValueError("a weights file holds one text's attention")
        self.shape = shape[1:]  # (L, H, T, S)
        self.path = npy_target(path, FLOAT * int(np.prod(self.shape)))  # room on its disk
        self.part = path.with_name(f".{path.name}.part")
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                  "fortran_order": False, "shape": self.shape}  # fmt: skip
        with open(self.part, "wb") as handle:
            np.lib.format.write_array_header_1_0(handle, header)
            self.offset = handle.tell()
            handle.truncate(self.offset + FLOAT * int(np.prod(self.shape)))  # unwritten: 0
        self.fd = os.open(self.part, os.O_WRONLY)

    def write(self, slot: int, start: int, rows: Any) -> None:
        """Rows start … start+b−1 of every head of layer slot `slot`, `rows` (H, b, W) float32
        (W ≤ S: a causal block's later keys stay 0)."""
        import numpy as np

        _, heads, _, keys = self.shape
        n_heads, b, width = rows.shape
        if width < keys:  # each row padded to the file's width: one write a head
            whole = np.zeros((n_heads, b, keys), np.float32)
            whole[:, :, :width] = rows
            rows = whole
        rows = np.ascontiguousarray(rows, np.float32)
        row_bytes = keys * FLOAT
        for head in range(n_heads):
            at = self.offset + ((slot * heads + head) * self.shape[2] + start) * row_bytes
            data = memoryview(rows[head]).cast("B")
            while data:  # pwrite may write less than asked
                written = os.pwrite(self.fd, data, at)
                data, at = data[written:], at + written

    def close(self) -> Any:
        """The whole file renamed into place; its read-only memory map."""
        import numpy as np

        os.close(self.fd)
        self.fd = -1
        os.replace(self.part, self.path)
        return np.load(self.path, mmap_mode="r")

    def discard(self) -> None:
        """The half-written file removed (an error or Ctrl-C during the pass)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.part.unlink(missing_ok=True)
