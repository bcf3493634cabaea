"""Where a decoder looked as it wrote: for each token of its continuation (`--generate`, or
a `--target` read by teacher forcing), its probability and the keys the row that wrote it
attended to most, over every chosen layer and head.

Token t (at position p) was written from row p − 1: that position's output gave the
distribution t was taken from. The row's weights are averaged over layers and heads; the
first token is left out of the ranking, since most heads of a decoder park spare attention
on it (a sink, Xiao et al. 2024) and it would top every list. Its own mean share is said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.analysis.summary import Target
    from attnviz.core.attention import Attention, Continuation

SHOWN = 20  # written tokens the terminal lists (the rest with --query, or --json)


@dataclass(frozen=True)
class Step:
    """One continuation token: where it is, its probability, and where the model looked
    when it wrote it (the row before it)."""

    position: int
    token: str
    prob: float
    looked: tuple[Target, ...]
    sink: float  # the first token's mean weight in the writing row, where it is left out

    def as_dict(self) -> dict[str, Any]:
        looked = [{"index": t.index, "token": t.token, "weight": round(t.weight, 6)}
                  for t in self.looked]  # fmt: skip
        return {"position": self.position, "token": self.token, "prob": round(self.prob, 6),
                "looked_at": looked, "first_token_weight": round(self.sink, 6)}  # fmt: skip


@dataclass(frozen=True)
class Written:
    """A continuation and where the model looked for each of its tokens."""

    start: int
    how: str
    stopped: bool
    written: bool  # generated (True) or given (False)
    steps: tuple[Step, ...]
    line: str  # `Continuation.describe()`
    sink_left_out: bool = True  # the first token (special) is left out of each ranking
    unit: str = "token"  # or "word" (--words)

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "how": self.how,
            "stopped": self.stopped,
            "generated": self.written,
            "tokens": [s.as_dict() for s in self.steps],
        }


class WritingRows:
    """A capture recorder summing, over `layers` and heads, the rows that wrote the
    continuation (rows start − 1 … n − 2, batch row 0), (N, n): what `written` ranks, held
    for N rows whether or not the whole maps are."""

    def __init__(self, layers: Sequence[int], continuation: Continuation, n: int) -> None:
        import numpy as np

        self.first = continuation.start - 1  # the row that wrote the first token
        self.sums = np.zeros((len(continuation.probs), n))  # (N, n)
        self.count = 0  # (layer, head) rows summed into each
        self.wants = {layer: ("rows",) for layer in layers}

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        """Rows start … start+b−1 of every head, (B, H, b, W)."""
        n_rows = self.sums.shape[0]
        lo, hi = max(start, self.first), min(start + rows.shape[2], self.first + n_rows)
        if lo >= hi:
            return
        part = rows[0, :, lo - start : hi - start].double().sum(dim=0).numpy()  # (b', W)
        self.sums[lo - self.first : hi - self.first, : part.shape[1]] += part
        if lo == self.first:  # each (layer, head) is counted once, with the first row
            self.count += rows.shape[1]

    def written(self, att: Attention, top_k: int) -> Written:
        """The continuation's steps (`steps`) from the rows summed, over `att`'s tokens (a
        streamed run's: the tokens as the model read them)."""
        return steps(att, self.sums / max(self.count, 1), top_k)


def written(att: Attention, top_k: int) -> Written:
    """The continuation's steps over an attention held whole, as it is shown (its words,
    without its special tokens: `att.continuation` is in the same units): each writing row
    averaged over `att`'s layers and every head."""
    c = att.continuation
    rows = att.weights[:, :, c.start - 1 : c.start - 1 + len(c.probs)]  # (L, H, N, T)
    return steps(att, rows.astype("f8").mean(axis=(0, 1)), top_k)


def steps(att: Attention, means: Any, top_k: int) -> Written:
    """Each continuation token's probability and the `top_k` keys its writing row (mean over
    layers and heads, `means` (N, T)) attended to most; the first token left out where it
    is special (a decoder's BOS, where spare attention parks), its share said."""
    import numpy as np

    from attnviz.analysis.summary import Target

    c = att.continuation
    sink_left_out = bool(att.special[0])
    found = []
    for i, prob in enumerate(c.probs):
        position = c.start + i
        row = np.array(means[i, :position], dtype=float)  # keys 0 … p − 1: what it saw
        sink = float(row[0]) if sink_left_out else 0.0
        if sink_left_out:
            row[0] = -1.0
        order = np.argsort(-row, kind="stable")[: min(top_k, position - sink_left_out)]
        looked = tuple(Target(int(k), att.tokens[k], float(row[k])) for k in order)
        found.append(Step(position, att.tokens[position], prob, looked, sink))
    return Written(c.start, c.how, c.stopped, c.written, tuple(found), c.describe(att.unit),
                   sink_left_out, att.unit)  # fmt: skip
