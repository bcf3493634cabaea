"""`compare` of long texts: a pair's comparison summed a block of query rows at a time as the
pass makes them, A and B read in one padded batch, no map of either held whole (what `show`
does for one long text; `analysis.compare.compare_pair` is the same comparison held whole).

Each block's rows of each side are read over the aligned units as `compare.project` reads a
whole map: a unit's key column is the sum of its tokens' columns, its query row the mean of
its tokens' rows. A unit's row is complete once every one of its tokens' rows has come; once
it is complete on both sides, both rows are renormalised over the aligned keys and their
Jensen–Shannon divergence is kept, (L, H, U). Rows wait only for their partner on the other
side: a few units for a minimal pair, at most the longest insertion's.

The head summaries of each side (the role scores, special shares, each head's top keys) are
`summary.HeadStats` of its blocks; the figures' maps are pooled (`pooling.Pooled`, means):
each side's token maps and both sides' unit grids, exact (one cell a unit) where they fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.analysis.compare import Compared
    from attnviz.core.attention import Attention


class _Side:
    """One text's part of a pair: its (token, unit) memberships, the rows of units not yet
    complete or not yet matched, and its statistics."""

    def __init__(self, att: Attention, units: Sequence[tuple[int, ...]], layers: Sequence[int],
                 n_heads: int, size: int, how: str) -> None:  # fmt: skip
        import numpy as np
        import torch

        from attnviz.analysis.pooling import Pooled
        from attnviz.analysis.summary import HeadStats

        self.att, self.n = att, len(att.tokens)
        pairs = [(token, unit) for unit, tokens in enumerate(units) for token in tokens]
        self.tokens = torch.tensor([t for t, _ in pairs], dtype=torch.long)  # (P,)
        self.units = torch.tensor([u for _, u in pairs], dtype=torch.long)  # (P,)
        self.count = np.array([len(tokens) for tokens in units], dtype=np.float64)  # (U,)
        self.last = np.array([max(tokens) for tokens in units])  # (U,) the unit's last token
        self.stats = HeadStats(att, len(layers), n_heads)
        self.pooled = Pooled(layers, n_heads, self.n, self.n, size, how, att.info.causal)
        # slot -> unit -> its row (H, U) float64, summed so far; and each slot's tokens read.
        # By layer: where two models read A and B, one may be a layer ahead of the other.
        self.waiting: dict[int, dict[int, Any]] = {}
        self.read: dict[int, int] = {}

    def add(self, layer: int, slot: int, start: int, rows: Any, entropy: Any) -> int:
        """Rows start … start+b−1 of this side, (H, b, W) of the padded batch: into the
        statistics and the pooled maps, and into the rows of the units their tokens are in.
        The tokens of this layer read so far (start + the block's rows of this text)."""
        import torch

        b = max(0, min(rows.shape[1], self.n - start))
        self.read[slot] = start + b if b else self.n
        if b == 0:
            return self.n
        block = rows[:, :b, : self.n]  # this text's queries and keys
        self.stats.add(start, block, slot, None if entropy is None else entropy[:, :b])
        self.pooled.add(layer, start, block)
        seen = self.tokens < block.shape[2]  # a causal block stops at its last query's key
        columns = torch.zeros(block.shape[0], b, len(self.count), dtype=torch.float64)
        columns.index_add_(2, self.units[seen], block[:, :, self.tokens[seen]].double())
        here = (self.tokens >= start) & (self.tokens < start + b)  # (token, unit) in the block
        waiting = self.waiting.setdefault(slot, {})
        for token, unit in zip(self.tokens[here].tolist(), self.units[here].tolist()):
            share = columns[:, token - start] / self.count[unit]  # (H, U) its mean's part
            if unit in waiting:
                waiting[unit] += share
            else:
                waiting[unit] = share.clone()
        return start + b

    def complete(self, slot: int) -> set[int]:
        """The units waiting in layer `slot` whose every token's row has been read."""
        read = self.read.get(slot, 0)
        return {unit for unit in self.waiting.get(slot, {}) if self.last[unit] < read}


class PairBlocks:
    """A capture recorder for one pair read in one padded batch (A in batch row `row_a`, B in
    `row_b`): each layer's blocks of rows of both sides summed as they come (`rows`,
    `entropy`), then `result()`: the pair's `Compared`, its maps pooled by `size` (tokens)
    and `unit_size` (aligned units)."""

    def __init__(self, a: Attention, b: Attention, layers: Sequence[int], rows: tuple[int, int],
                 sizes: tuple[int, int, int], query: str | None = None) -> None:  # fmt: skip
        import numpy as np

        from attnviz.analysis.compare import align
        from attnviz.analysis.pooling import Pooled

        self.alignment = align(a, b)
        units = self.alignment.units
        n_heads, n_units = a.info.n_heads, len(units)
        self.layers, self.rows_of = list(layers), rows
        self.wants = {layer: ("rows", "entropy") for layer in layers}
        self.sides = tuple(
            _Side(att, [getattr(u, side) for u in units], layers, n_heads, size, "mean")
            for att, side, size in zip((a, b), "ab", sizes)
        )
        self.grids = tuple(Pooled(layers, n_heads, n_units, n_units, sizes[2], "mean")
                           for _ in range(2))  # fmt: skip
        self.js = np.full((len(layers), n_heads, n_units), np.nan)  # (L, H, U)
        self.keep = {unit: (np.zeros((len(layers), n_heads, n_units)),
                            np.zeros((len(layers), n_heads, n_units)))
                     for unit in _query_unit(a, self.alignment, query)}  # fmt: skip

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def receive_rows(self, layer: int, start: int, rows: Any, entropy: Any) -> None:
        """A block of both texts' rows, (B, H, b, W), of the one padded pass reading both."""
        for side, row in enumerate(self.rows_of):
            self.add(side, layer, start, rows[row], entropy[row])

    def add(self, side: int, layer: int, start: int, rows: Any, entropy: Any) -> int:
        """A block of one side's rows, (H, b, W), from `start`: summed, and the units it
        completes on both sides compared. The side's tokens of this layer read so far."""
        slot = self.layers.index(layer)
        read = self.sides[side].add(layer, slot, start, rows, entropy)
        ready = self.sides[0].complete(slot) & self.sides[1].complete(slot)
        if ready:
            self._match(layer, slot, sorted(ready))
        return read

    def _match(self, layer: int, slot: int, units: list[int]) -> None:
        """Units complete on both sides: their rows renormalised over the aligned keys, their
        divergence kept, their rows into the pooled grids; then let go."""
        import numpy as np
        import torch

        from attnviz.analysis.compare import js_divergence

        grids = []
        for side in self.sides:
            waiting = side.waiting[slot]
            rows = torch.stack([waiting.pop(unit) for unit in units], dim=1)  # (H, n, U)
            mass = rows.sum(dim=-1, keepdim=True)
            grids.append((rows / torch.where(mass > 0, mass, 1.0)).numpy())
        p, q = grids
        defined = (p.sum(-1) > 0) & (q.sum(-1) > 0)  # (H, n)
        self.js[slot][:, units] = np.where(defined, js_divergence(p, q), np.nan)
        for i, unit in enumerate(units):
            if unit in self.keep:
                self.keep[unit][0][slot], self.keep[unit][1][slot] = p[:, i], q[:, i]
        for grid, rows in zip(self.grids, grids):
            for first, last in _runs(units):  # consecutive units: one add each
                lo, hi = units.index(first), units.index(last) + 1
                grid.add(layer, first, rows[:, lo:hi].astype(np.float32))

    def result(self) -> Compared:
        """The pair's comparison: the divergence of each aligned query and its mean per head,
        each side's role scores and special shares (B − A), its maps pooled."""
        import numpy as np

        from attnviz.analysis.compare import Compared, changes
        from attnviz.analysis.pooling import pooled_attention

        left = [unit for side in self.sides for units in side.waiting.values() for unit in units]
        if left:  # every row of both texts was read: a unit left waiting is a bug
            raise RuntimeError(f"units {sorted(set(left))[:5]} were never matched")
        defined = ~np.isnan(self.js)
        counted = defined.sum(axis=-1)
        divergence = np.where(defined, self.js, 0.0).sum(axis=-1) / np.maximum(counted, 1)
        (a, b), (grid_a, grid_b) = self.sides, self.grids
        role_change = changes(a.stats.role_scores(), b.stats.role_scores())
        special = b.stats.special_shares() - a.stats.special_shares()
        views = [pooled_attention(side.att, side.pooled.stacked(self.layers))
                 for side in self.sides]  # fmt: skip
        return Compared(
            views[0], views[1], self.alignment,
            grid_a.stacked(self.layers).values,  # float32
            grid_b.stacked(self.layers).values,
            self.js, divergence, role_change, special,
            unit_size=grid_a.size, texts=(a.att, b.att), stats=(a.stats, b.stats),
            kept={unit: rows for unit, rows in self.keep.items()},
        )  # fmt: skip


class Lockstep:
    """Two passes, one a side of `pair` (two models, one reading A and one B, each in a thread
    of its own), kept within a block of each other: a side that has handed in its rows up to
    a point (layer, rows read) waits until the other has reached it. So the rows waiting for
    their partner stay about a block of each side, never a layer's (L, H, T, U) whole.

    The side behind never waits, so neither waits for good; a side whose pass ends (or
    fails: `end(side, failed=True)`) no longer holds the other, and a failure stops the other
    at its next block (`Stopped`)."""

    def __init__(self, pair: PairBlocks) -> None:
        import threading

        self.pair, self.turn = pair, threading.Condition()
        self.at = [(-1, 0), (-1, 0)]  # each side's (layer slot, tokens read)
        self.ended = [False, False]
        self.failed = False
        self.sides = (_OneSide(self, 0, pair.wants), _OneSide(self, 1, pair.wants))

    def hand_in(self, side: int, layer: int, start: int, rows: Any, entropy: Any) -> None:
        """One side's block of rows (H, b, W) from `start`: summed, then wait for the other."""
        other = 1 - side
        with self.turn:
            if self.failed:
                raise Stopped("the other side's pass failed")
            read = self.pair.add(side, layer, start, rows, entropy)
            self.at[side] = (self.pair.layers.index(layer), read)
            self.turn.notify_all()
            while not (self.ended[other] or self.at[other] >= self.at[side]):
                if self.failed:
                    raise Stopped("the other side's pass failed")
                self.turn.wait(0.1)

    def end(self, side: int, failed: bool = False) -> None:
        """Side `side`'s pass is over (or failed): the other no longer waits for it."""
        with self.turn:
            self.ended[side] = True
            self.failed = self.failed or failed
            self.turn.notify_all()


class Stopped(Exception):
    """A side's pass stopped because the other side's failed (its error is the one raised)."""


class _OneSide:
    """The recorder of one side's pass in a `Lockstep`: a batch of one text, (1, H, b, W)."""

    def __init__(self, step: Lockstep, side: int, wants: dict[int, tuple[str, ...]]) -> None:
        self.step, self.side, self.wants = step, side, wants

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def receive_rows(self, layer: int, start: int, rows: Any, entropy: Any) -> None:
        self.step.hand_in(self.side, layer, start, rows[0], entropy[0])


def _query_unit(a: Attention, alignment: Any, query: str | None) -> list[int]:
    """The aligned unit holding A's token `query` names (--query), if A has it with a partner
    in B: its rows are kept whole."""
    from attnviz.analysis.query import find_query
    from attnviz.errors import InputError

    if query is None:
        return []
    try:
        index = find_query(a, query)
    except InputError:  # not in this A: `follow_query` says so, or leaves the pair out
        return []
    return [number for number, unit in enumerate(alignment.units) if index in unit.a][:1]


def _runs(units: list[int]) -> list[tuple[int, int]]:
    """Sorted `units` as runs of consecutive numbers: [(first, last), …]."""
    runs: list[tuple[int, int]] = []
    for unit in units:
        if runs and unit == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], unit)
        else:
            runs.append((unit, unit))
    return runs
