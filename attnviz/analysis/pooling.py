"""Long maps pooled to what a picture can show: each cell of a pooled map is the mean, or the
max, of a square block of `size` × `size` cells of a head's [query, key] map.

A head's map at 8,192 tokens has 67 million cells; a figure or a page shows about a thousand
pixels a side. `Pooled` sums a layer's maps a block of query rows at a time (as
`core.recording` hands them out), so the whole map never exists: its memory is the pooled
maps, (H, ⌈T/size⌉, ⌈S/size⌉) a layer. Pooling the whole matrix at once (`pool`) gives the same
numbers, whatever the blocks (a test holds blocks of 1, 7 and T rows to it).

The mean is taken over the cells a query can see: a decoder's masked cells (a key after its
query) are left out of the count, so a block on the diagonal is not diluted by cells that
cannot hold weight; a block with no visible cell is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.core.reductions import Bins

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention

POOLS = {
    "mean": "each cell the mean of the visible cells it covers",
    "max": "each cell the largest of the cells it covers",
}
# The longest side a map is drawn at cell by cell; longer maps are pooled to at most this.
MAX_SIDE = 512


def pool_size(n_queries: int, n_keys: int, side: int = MAX_SIDE) -> int:
    """How many cells a pooled cell covers along each axis: 1 (no pooling) when both sides fit
    in `side`, else the smallest whole number that brings the longer side within it."""
    if side < 1:
        raise ValueError(f"side must be at least 1, not {side}")
    return max(1, math.ceil(max(n_queries, n_keys) / side))


@dataclass(frozen=True)
class PooledMap:
    """A head's (or every head's) pooled map: `values` (..., ⌈T/size⌉, ⌈S/size⌉), each cell the
    `how` ("mean" or "max") of `size` × `size` cells of the full map."""

    values: np.ndarray
    size: int
    how: str

    def describe(self, unit: str = "token") -> str:
        """What a cell is, for a title or a colour bar: "mean of 16 × 16 tokens"."""
        if self.size == 1:
            return "one cell a token pair" if unit == "token" else f"one cell a {unit} pair"
        return f"{self.how} of {self.size} × {self.size} {unit}s"


class Pooled:
    """The pooled maps of the chosen layers of one text, summed from blocks of query rows:
    `add(layer, start, rows)` with rows (H, b, S), then `result(layer)`. It is a capture
    recorder too (`core.capture`'s `rows`: blocks of batch row 0)."""

    def __init__(
        self,
        layers: Sequence[int],
        n_heads: int,
        n_queries: int,
        n_keys: int,
        size: int,
        how: str = "mean",
        causal: bool = False,
    ) -> None:
        import numpy as np

        if how not in POOLS:
            raise ValueError(f"unknown pooling {how!r}; known: {', '.join(POOLS)}")
        self.size, self.how, self.causal = size, how, causal
        self.n_queries, self.n_keys = n_queries, n_keys
        self.layers = list(layers)
        shape = (n_heads, math.ceil(n_queries / size), math.ceil(n_keys / size))
        # sums or maxima (of weights, never below 0) from 0, in float32, every layer's in one
        # array: a long text's 30 × 9 maps of 512² cells are 283 MB
        self.grid = np.zeros((len(self.layers), *shape), np.float32)
        self.held = {layer: self.grid[i] for i, layer in enumerate(self.layers)}
        self.counts = _visible_counts(n_queries, n_keys, size, causal) if how == "mean" else None
        self.wants = {layer: ("rows",) for layer in layers}
        self.bins = Bins(size, "sum" if how == "mean" else "max")

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def reductions(self, layer: int) -> tuple:
        """What it reads of every block (`core.reductions`): its squares of cells, pooled."""
        return (self.bins,)

    def receive_rows(self, layer: int, start: int, rows: Any, found: Any = None) -> None:
        bins = None if found is None else found[0][0]
        self.add(layer, start, rows[0], bins)  # (H, b, W) of batch row 0

    def add(self, layer: int, start: int, rows: np.ndarray, bins: Any = None) -> None:
        """Take query rows start … start+b−1 of `layer`, (H, b, W): W ≤ S keys (a decoder's
        block stops at its last query's key); `bins`, their squares pooled where the pass
        read them (`core.reductions.Bins`). A max needs no mask: a masked cell's weight is
        0, and weights are ≥ 0."""
        import torch

        from attnviz.core.reductions import read

        if bins is None:
            block = torch.as_tensor(rows)  # no copy: numpy's, or the pass's own tensor
            (bins,) = read(block, start, (self.bins,))
        first = start // self.size
        held = torch.from_numpy(self.held[layer])  # (H, R, C), a view
        target = held[:, first : first + bins.shape[1], : bins.shape[2]]  # a decoder's: W keys
        if self.how == "mean":
            target += bins
        else:
            torch.maximum(target, bins, out=target)

    def result(self, layer: int) -> PooledMap:
        """The layer's pooled maps, (H, ⌈T/size⌉, ⌈S/size⌉) float32 (the maxima: a view of
        what it holds)."""
        return PooledMap(self._values(self.held[layer]), self.size, self.how)

    def stacked(self, layers: Sequence[int]) -> PooledMap:
        """The pooled maps of `layers`, (L, H, ⌈T/size⌉, ⌈S/size⌉) float32: the maxima of every
        layer it holds, in its order, are what it holds (no copy)."""
        import numpy as np

        if list(layers) == self.layers:
            held = self.grid
        else:
            held = np.stack([self.held[layer] for layer in layers])
        return PooledMap(self._values(held), self.size, self.how)

    def _values(self, held: np.ndarray) -> np.ndarray:
        import numpy as np

        if self.how == "max":
            return held
        return np.where(self.counts > 0, held / np.maximum(self.counts, 1), 0.0).astype(np.float32)


def pool(grid: np.ndarray, size: int, how: str = "mean", causal: bool = False) -> PooledMap:
    """The pooled map of whole maps `grid` (..., T, S), at once: what `Pooled` gives from blocks."""
    import numpy as np

    *lead, n_queries, n_keys = grid.shape
    heads = int(np.prod(lead)) if lead else 1
    found = Pooled([0], heads, n_queries, n_keys, size, how, causal)
    found.add(0, 0, grid.reshape(heads, n_queries, n_keys))
    pooled = found.result(0)
    values = pooled.values.reshape(*lead, *pooled.values.shape[1:])
    return PooledMap(values, size, how)


def _visible_counts(n_queries: int, n_keys: int, size: int, causal: bool) -> np.ndarray:
    """How many cells of each pooled cell a query can see, (⌈T/size⌉, ⌈S/size⌉): every cell, or
    a decoder's cells on or below the diagonal."""
    import numpy as np

    rows = np.minimum(size, n_queries - np.arange(0, n_queries, size))  # (R,) rows per bin
    cols = np.minimum(size, n_keys - np.arange(0, n_keys, size))  # (C,)
    if not causal:
        return rows[:, None] * cols[None, :]
    # per query i, the visible keys in each column bin: clip(i + 1 − bin start, 0, bin width)
    queries = np.arange(n_queries)[:, None]  # (T, 1)
    starts = np.arange(0, n_keys, size)[None, :]  # (1, C)
    per_query = np.clip(queries + 1 - starts, 0, cols[None, :])  # (T, C)
    counts = np.add.reduceat(per_query, np.arange(0, n_queries, size), axis=0)
    return counts


def pooled_attention(att: Attention, maps: PooledMap) -> Attention:
    """`att`'s view drawn from its pooled maps, those of its layers in order, (L, H,
    ⌈T/size⌉, ⌈S/size⌉): `weights` the maps, `tokens` each block's first token (and `special`
    whether the block holds a special token), `pooled` (size, how). Figures, the page and
    the terminal draw it as they draw any attention, their labels giving token positions."""
    from dataclasses import replace

    import numpy as np

    from attnviz.core.attention import Keys

    first, size, weights = maps, maps.size, maps.values
    if size == 1:  # the exact cells (kept from blocks of rows)
        return replace(att, weights=weights)

    def blocks(tokens: tuple[str, ...], special: np.ndarray) -> tuple[tuple[str, ...], Any]:
        starts = range(0, len(tokens), size)
        marked = np.array([bool(special[s : s + size].any()) for s in starts], dtype=bool)
        return tuple(tokens[s] for s in starts), marked

    tokens, special = blocks(att.tokens, att.special)
    keys = None
    if att.keys is not None:
        key_tokens, key_special = blocks(att.keys.tokens, att.keys.special)
        keys = Keys(att.keys.text, key_tokens, key_special, tuple(range(len(key_tokens))),
                    key_tokens)  # fmt: skip
    pooled = replace(
        att,
        tokens=tokens,
        special=special,
        weights=weights,
        words=tuple(range(len(tokens))),
        word_labels=tokens,
        keys=keys,
        segments=None,
        pooled=(size, first.how),
        pooled_from=att.token_counts(),
    )
    return replace(pooled, notes=(*att.notes, f"maps pooled: {pooled.pooling()}"))
