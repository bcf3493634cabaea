"""What the recorders of a pass read of each block of attention rows, computed in one place
while the block is in cache (STYLE 22).

A block of query rows (…, b, W) (`core.recording`'s, one layer's every head) is read by
several recorders: the summary's head statistics, the figures' and the page's pooled maps,
the special shares by weight and by norm. Each registers its reductions of a block (`reads`),
and `read` computes all of them from the block at once, right after the attention function
made it: every product with a table of key weights in one matrix product, every weighted
sum over queries in another, each pooling of rows once whatever the number of recorders that
asked for it. The recorders then finish from these small results (a row's sums, a column's)
and read a few cells of the block themselves (a band around the diagonal, a repeat's cells).

    KeySums    Σ_j a[i, j] w[c, j]: each row's sums over keys weighted by the k columns of
               a table, (…, b, k); the table shared by every head (k, W) or each head's own
               (…, k, W) (the norm measure's ‖f^h(x_j)‖)
    QuerySums  Σ_i w[r, i] a[i, j]: each key's weight summed over the block's queries,
               weighted, (…, R, W)
    Bins       the max (or sum) of each square of `size` × `size` cells, squares starting at
               multiples of `size` (the pooled maps), (…, row bins, ⌈W/size⌉): the row bins
               the block touches
    KeyMax     each row's largest weight on the keys `keys` marks, (…, b); −1 where none
    KeyLists   each row's sum of its weights at keys of its own (G lists a row), (…, b, G)
               float64: the cells of a text's repeats (induction, duplicate tokens)

The products run in the orientation that reads the block as the wide operand (a table's
k columns as k rows, times the block's rows transposed): 2–3 times faster on the CPU than
the block times a skinny table (bench/bench_recorders.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True, eq=False)
class KeySums:
    """Each row's sums over its keys weighted by the columns of `table(start, stop, width)`:
    (k, W) for every head, or (…, k, W) with the block's leading dims (each head's own)."""

    table: Callable[[int, int, int], Any]


@dataclass(frozen=True, eq=False)
class QuerySums:
    """Each key's weight summed over the block's queries weighted by `weights` (R, T) float32
    (T: the text's queries; R sums at once)."""

    weights: Any


@dataclass(frozen=True)
class Bins:
    """The max (`how` "max") or sum ("sum") of each square of `size` query rows by `size`
    keys, squares starting at the multiples of `size` (the last along the keys narrower where
    W is no multiple): (…, row bins, ⌈W/size⌉), the first row bin being start // size."""

    size: int
    how: str = "max"


@dataclass(frozen=True, eq=False)
class KeyMax:
    """Each row's largest weight on the keys `keys` (S,) bool marks; −1 where it has none."""

    keys: np.ndarray


@dataclass(frozen=True, eq=False)
class KeyLists:
    """Each row's sum of its weights at keys of its own: `lists(start, stop)` gives, for
    rows start … stop−1, G lists as (offsets (b+1,), keys (P,)) int64, row i's keys being
    keys[offsets[i] : offsets[i+1]] (keys past a block's width count 0); (…, b, G) float64,
    each row's cells summed in float64 in the order listed."""

    lists: Callable[[int, int], Sequence[tuple[np.ndarray, np.ndarray]]]


Reduction = KeySums | QuerySums | Bins | KeyMax | KeyLists


def read(rows: torch.Tensor, start: int, asked: Sequence[Reduction]) -> list[Any]:
    """Every reduction `asked` of query rows start … start+b−1, `rows` (…, b, W) float32 (W ≤
    S keys: a decoder's block stops at its last query's key), in the order asked; one product
    for every KeySums and one for every QuerySums, each Bins and KeyMax once however often
    it is asked (equal ones)."""
    import torch

    stop, width = start + rows.shape[-2], rows.shape[-1]
    found: dict[int, Any] = {}
    sums = [r for r in asked if isinstance(r, KeySums)]
    if sums:
        tables = [torch.as_tensor(r.table(start, stop, width)) for r in sums]
        for reduction, part in zip(sums, _key_sums(rows, tables)):
            found[id(reduction)] = part
    by_query = [r for r in asked if isinstance(r, QuerySums)]
    if by_query:
        weights = torch.cat([torch.as_tensor(r.weights[:, start:stop]) for r in by_query])
        weights = weights.to(rows.dtype)
        summed = weights @ rows  # (…, ΣR, W)
        first = 0
        for reduction in by_query:
            count = reduction.weights.shape[0]
            found[id(reduction)] = summed[..., first : first + count, :]
            first += count
    once: dict[Any, Any] = {}
    for reduction in asked:
        if isinstance(reduction, Bins):
            key = reduction
            if key not in once:
                once[key] = _bins(rows, start, reduction.size, reduction.how == "max")
        elif isinstance(reduction, KeyMax):
            key = id(reduction.keys)
            if key not in once:
                once[key] = _key_max(rows, reduction.keys[:width])
        elif isinstance(reduction, KeyLists):
            key = id(reduction)
            if key not in once:
                once[key] = key_list_sums(rows, reduction.lists(start, stop))
        else:
            continue
        found[id(reduction)] = once[key]
    return [found[id(reduction)] for reduction in asked]


def _key_sums(rows: torch.Tensor, tables: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each table's sums (…, b, k): the shared tables (k, W) as one product with every row,
    the block's rows the wide operand; with any head's own table (…, k, W), all as one
    batched product, the shared ones broadcast."""
    import torch

    lead, (b, width) = rows.shape[:-2], rows.shape[-2:]
    counts = [t.shape[-2] for t in tables]
    tables = [t.to(rows.dtype) for t in tables]
    if all(t.dim() == 2 for t in tables):
        joined = torch.cat(tables) if len(tables) > 1 else tables[0]  # (k, W)
        found = (joined @ rows.reshape(-1, width).t()).t()  # (N, k), N = … · b
        found = found.reshape(*lead, b, -1)
    else:
        joined = torch.cat([t.expand(*lead, *t.shape[-2:]) for t in tables], dim=-2)
        flat = joined.reshape(-1, joined.shape[-2], width)  # (…, k, W) as (n, k, W)
        found = torch.bmm(flat, rows.reshape(-1, b, width).transpose(1, 2))  # (n, k, b)
        found = found.transpose(1, 2).reshape(*lead, b, -1)
    return list(torch.split(found, counts, dim=-1))


def _bins(rows: torch.Tensor, start: int, size: int, largest: bool) -> torch.Tensor:
    """The max (or sum) of each square of `size` × `size` cells the block touches, (…, row
    bins, ⌈W/size⌉): along the rows first (the rows that end a bin begun in an earlier block,
    whole bins, and the rows that begin the next, each reduced while the keys stay
    contiguous), then along the keys, `size` at a time (the last bin narrower)."""
    import torch

    b, width = rows.shape[-2:]
    head = min(b, -start % size)  # rows that end a bin begun in an earlier block
    whole = (b - head) // size * size  # then whole bins
    parts = []
    for lo, hi in ((0, head), (head, head + whole), (head + whole, b)):
        if hi <= lo:
            continue
        part = rows[..., lo:hi, :]
        part = part.reshape(*rows.shape[:-2], -(-(hi - lo) // size), -1, width)
        parts.append(part.amax(dim=-2) if largest else part.sum(dim=-2))
    by_row = torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]  # (…, bins, W)
    if size == 1:
        return by_row
    full = width - width % size
    columns = [by_row[..., :full].reshape(*by_row.shape[:-1], full // size, size)]
    if full < width:
        columns.append(by_row[..., None, full:])  # the last, narrower bin of keys
    found = [part.amax(dim=-1) if largest else part.sum(dim=-1) for part in columns]
    return torch.cat(found, dim=-1) if len(found) > 1 else found[0]


def _key_max(rows: torch.Tensor, keys: np.ndarray) -> torch.Tensor:
    """Each row's largest weight on the keys `keys` (W,) marks, (…, b); −1 where none: the runs
    of marked keys, each a view, never a masked copy of the rows."""
    import numpy as np
    import torch

    best = torch.full(rows.shape[:-1], -1.0, dtype=rows.dtype)
    marks = np.concatenate([[0], keys.astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(marks))  # where runs of marked keys begin and end
    for first, stop in zip(edges[::2], edges[1::2]):
        torch.maximum(best, rows[..., first:stop].amax(dim=-1), out=best)
    return best


def key_list_sums(rows: torch.Tensor, lists: Sequence[tuple[np.ndarray, np.ndarray]]) -> Any:
    """`KeyLists`' sums of rows (…, b, W) for `lists` (its (offsets, keys) each): (…, b, G)
    float64, each row's cells gathered and added in the order listed (what `core.fused`
    does row by row)."""
    import numpy as np
    import torch

    lead, (b, width) = rows.shape[:-2], rows.shape[-2:]
    found = torch.zeros(len(lists), rows[..., 0, 0].numel(), b, dtype=torch.float64)
    for g, (offsets, keys) in enumerate(lists):
        which = np.repeat(np.arange(b), np.diff(offsets))  # each cell's row
        held = keys < width
        if not held.any():
            continue
        which, keys = which[held], keys[held]
        picked = _cells(rows, which, keys).reshape(-1, len(keys)).double()  # (N, P)
        found[g].index_add_(1, torch.from_numpy(which), picked)
    return found.permute(1, 2, 0).reshape(*lead, b, len(lists))


def _cells(rows: torch.Tensor, queries: np.ndarray, keys: np.ndarray) -> torch.Tensor:
    """rows[…, queries, keys] of rows (…, b, W), (…, P): one gather along each head's cells
    where they lie in row order (a block of the pass), else by index."""
    import torch

    lead, (b, width) = rows.shape[:-2], rows.shape[-2:]
    if not rows.is_contiguous():
        return rows[..., torch.from_numpy(queries), torch.from_numpy(keys)]
    flat = rows.view(-1, b * width)  # (N, b·W)
    picked = flat.index_select(1, torch.from_numpy(queries * width + keys))
    return picked.view(*lead, -1)
