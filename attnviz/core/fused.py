"""One pass over a block of attention scores in compiled C (`fused.c`): the softmax, each
row's entropy and every reduction the recorders asked of the block (`core.reductions`), each
row read while it is in the core's cache (issue 55).

torch makes the same numbers in separate operations, each a pass over the whole block (the
softmax, the entropy's Σ p s, a product for the key sums, another for the query sums, a max
for each pooling): at 8,192 keys a block of SmolLM2's rows is 50 MB, and each pass reads it
from memory. Here a row of 8,192 keys is 32 KB: read once from memory, the rest from the
core's cache. bench/bench_recorders.py measures both (ATTNVIZ_KERNEL=0 for torch's).

The C file is compiled on first use with the machine's C compiler ($CC, else cc) for this
CPU (-march=native) and kept in attnviz's cache folder (`gguf_cache.cache_root()`, kernels/),
named by the source's hash, the compiler's flags and the CPU's features, so a folder shared
by different machines keeps one build per CPU. It links the OpenMP runtime torch has loaded
(libgomp), so torch's threads and these are one pool. Where there is no compiler, the build
fails, the platform is not Linux, or ATTNVIZ_KERNEL=0, `kernel()` is None and
`core.recording` makes the rows with torch: the same numbers within float32's rounding (the
order of a row's sums differs), which tests/test_fused.py holds to 1e-6.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from attnviz.core.reductions import Reduction

SOURCE = Path(__file__).with_name("fused.c")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp",
         "-fPIC", "-shared")  # fmt: skip
VERSION = 5  # what `attnviz_fused_version` returns: a stale build is not used
OFF = "ATTNVIZ_KERNEL"  # "0": torch's operations, never the compiled pass


@functools.lru_cache(maxsize=1)
def kernel() -> Any:
    """The compiled pass (ctypes), built once a machine; None where it cannot be (then torch's
    operations make the same rows)."""
    if os.environ.get(OFF) == "0" or platform.system() != "Linux":
        return None
    try:
        path = _built()
        library = ctypes.CDLL(str(path))
        if library.attnviz_fused_version() != VERSION:
            return None
    except (OSError, subprocess.SubprocessError, AttributeError):
        return None
    library.attnviz_fused_block.restype = None
    return library


def _built() -> Path:
    """The shared library for this source, flags and CPU: compiled into the cache folder
    under a temporary name and renamed when complete (two processes may both build it)."""
    from attnviz.core.gguf_cache import cache_root

    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler")
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), compiler.encode(),
                 platform.machine().encode(), _cpu_features().encode()):  # fmt: skip
        key.update(part + b"\0")
    folder = cache_root() / "kernels"
    path = folder / f"fused-{key.hexdigest()[:16]}.so"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=".fused-", suffix=".so")
    os.close(handle)
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", partial, "-lm"], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)
    return path


def _cpu_features() -> str:
    """The CPU's feature flags (Linux's /proc/cpuinfo): what -march=native compiled for."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def applies(scores: Any) -> bool:
    """Whether a block of these scores (`recording.Scores`) can be made here: on the CPU,
    with no mask (every row sees every key, or a causal layer's each the keys up to its
    own), soft cap, position bias or sink logits, and no gradient to carry (the pass writes
    the rows outside autograd: head importance's gradients go through torch's); and the
    pass is built."""
    q, k = scores.query, scores.key
    return (q.device.type == "cpu" and scores.mask is None and scores.softcap is None
            and scores.position_bias is None and scores.sinks is None
            and not (q.requires_grad or k.requires_grad) and kernel() is not None)  # fmt: skip


def block(raw: torch.Tensor, start: int, causal: bool, entropy: bool,
          asked: tuple[Reduction, ...]) -> tuple[torch.Tensor, Any, list[Any]]:  # fmt: skip
    """Query rows start … start+b−1 from their scores `raw` (B, H, b, W) float32, contiguous,
    made probabilities in place: (probs, each row's entropy (B, H, b) or None, what `asked`
    reads of them, in its order, as `reductions.read` gives it)."""
    import numpy as np
    import torch

    from attnviz.core.reductions import Bins, KeyLists, KeyMax, KeySums, QuerySums

    batch, n_heads, b, width = raw.shape
    units, stop = batch * n_heads, start + b
    lead = (batch, n_heads)
    entropies = torch.empty(batch, n_heads, b) if entropy else None
    keep: list[Any] = []  # what the pass reads, alive until it has run

    def at(t: torch.Tensor) -> int:
        keep.append(t)
        return t.data_ptr()

    tables: list[tuple[int, ...]] = []
    queries: list[tuple[int, ...]] = []
    maxima: list[tuple[int, ...]] = []
    bins: list[tuple[int, ...]] = []
    lists: list[tuple[int, ...]] = []
    found: list[Any] = []
    for reduction in asked:
        if isinstance(reduction, KeySums):
            table = torch.as_tensor(reduction.table(start, stop, width)).float()
            if table.stride(-1) != 1:
                table = table.contiguous()
            k = table.shape[-2]
            if table.dim() == 2:  # shared by every unit
                unit = 0
            else:  # each head's own, (…, k, W): unit u's at u times one stride
                table = table.expand(*lead, k, table.shape[-1])
                strided = table.stride(1) > 0 and (
                    batch == 1 or table.stride(0) == n_heads * table.stride(1)
                )
                if not strided:
                    table = table.contiguous()
                unit = table.stride(1)
            out = torch.empty(*lead, b, k)
            tables.append((at(table), k, unit, table.stride(-2), at(out)))
        elif isinstance(reduction, QuerySums):
            weights = torch.as_tensor(np.ascontiguousarray(reduction.weights[:, start:stop],
                                                           dtype=np.float32))  # fmt: skip
            n_r = weights.shape[0]
            out = torch.zeros(*lead, n_r, width)
            queries.append((at(weights), n_r, weights.stride(0), at(out)))
        elif isinstance(reduction, KeyMax):
            marks = torch.as_tensor(np.ascontiguousarray(reduction.keys[:width], np.float32))
            out = torch.empty(*lead, b)
            maxima.append((at(marks), int(bool(marks.any())), at(out)))
        elif isinstance(reduction, Bins):
            count = (stop - 1) // reduction.size - start // reduction.size + 1
            out = torch.empty(*lead, count, -(-width // reduction.size))
            scratch = torch.empty(*lead, count, width)  # each key's over a bin's rows
            bins.append((reduction.size, int(reduction.how == "max"), at(out), at(scratch)))
        elif isinstance(reduction, KeyLists):
            given = reduction.lists(start, stop)
            out = torch.empty(*lead, b, len(given), dtype=torch.float64)
            for g, (offsets, keys) in enumerate(given):
                offsets = torch.as_tensor(np.ascontiguousarray(offsets, np.int64))
                keys = torch.as_tensor(np.ascontiguousarray(keys, np.int64))
                lists.append((at(offsets), at(keys), at(out) + 8 * g, len(given)))
        found.append(out)

    def columns(groups: list[tuple[int, ...]], n: int) -> list[Any]:
        array = ctypes.c_int64 * max(1, len(groups))
        return [array(*(group[i] for group in groups)) for i in range(n)]

    int64 = ctypes.c_int64
    kernel().attnviz_fused_block(
        ctypes.c_void_p(raw.data_ptr()),
        int64(units),
        int64(b),
        int64(width),
        int64(start),
        int64(int(causal)),
        ctypes.c_void_p(entropies.data_ptr() if entropies is not None else None),
        int64(len(tables)),
        *columns(tables, 5),
        int64(len(queries)),
        *columns(queries, 4),
        int64(len(maxima)),
        *columns(maxima, 3),
        int64(len(bins)),
        *columns(bins, 4),
        int64(len(lists)),
        *columns(lists, 4),
        int64(torch.get_num_threads()),
    )
    return raw, entropies, found
