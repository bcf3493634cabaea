"""Sinks and reach: how much of each head's attention parks on the first token, and how far
from its query it looks; summed over blocks of query rows, so no head's whole matrix is
ever needed (a long text's rows arrive a block at a time, `core.recording`).

Per head, over **every** query row i of a text (special tokens included), T rows each
weighing 1/T:

    first_token_alpha   mean_i a[i, 0]: the share the first token the model reads (BOS,
                        [CLS]) receives; Gu et al. (2025)'s α₁ of an attention sink
    distance_mean       mean_i Σ_k a[i, k] |i − k|, in tokens
    distance_p90        the smallest distance d such that the pairs with |i − k| ≤ d hold at
                        least 90 % of the attention: Σ_i Σ_{|i−k|≤d} a[i, k] / T ≥ 0.9

Per layer, `sink_head_share` is the share of its heads whose first_token_alpha exceeds 0.3.
A corpus's figures are each text's, averaged over texts. Cross-attention (queries and keys
from two texts) has no distance: it is not measured there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.ordered import OrderedSum

if TYPE_CHECKING:
    import numpy as np
    import torch

SINK_ALPHA = 0.3  # a head giving its first token more than this, on average, is a sink
REACH_SHARE = 0.9  # distance_p90: the distance within which this share of attention lies


class TextReach:
    """One text's running sums, layer by layer, from blocks of its query rows."""

    def __init__(self, n_layers: int, n_heads: int, n_tokens: int) -> None:
        import torch

        self.n = n_tokens
        self.first = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        # attention by distance: histogram[l, h, d] = Σ_i Σ_{|i−k| = d} a[i, k]
        self.histogram = torch.zeros(n_layers, n_heads, n_tokens, dtype=torch.float64)
        self.rows = torch.zeros(n_layers, dtype=torch.int64)

    def add(self, slot: int, start: int, rows: torch.Tensor) -> None:
        """Add query rows start … start+b−1 of layer `slot`: rows (H, b, S), S ≥ the text's
        length (padding keys beyond it hold 0); rows past the text's end are ignored."""
        stop = min(start + rows.shape[1], self.n)
        if stop <= start:
            return
        block = rows[:, : stop - start, : self.n]  # (H, b, T)
        self.first[slot] += block[:, :, 0].sum(dim=1, dtype=self.first.dtype)
        sums, signed = _by_distance(block.float(), start)  # (H, W), (W,): i − k
        self.histogram[slot].index_add_(1, signed.abs(), sums.double())
        self.rows[slot] += stop - start

    def finish(self) -> Reach:
        """The text's figures, (L, H) each; every layer must have had all its rows."""

        if not bool((self.rows == self.n).all()):
            raise ValueError(f"rows seen per layer {self.rows.tolist()}, not {self.n} each")
        import torch

        distances = torch.arange(self.n, dtype=torch.float64)
        share = self.histogram.cumsum(dim=-1) / self.n  # (L, H, T): attention within d
        # the first d where the share reaches 90 % (a little below, for float rounding)
        p90 = (share < REACH_SHARE - 1e-9).sum(dim=-1)
        return Reach(
            first_token_alpha=(self.first / self.n).numpy(),
            distance_mean=((self.histogram * distances).sum(dim=-1) / self.n).numpy(),
            distance_p90=p90.double().numpy(),
            texts=1,
        )


def _by_distance(block: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over a block's rows of the attention at each signed distance i − k: sums (H, W) and
    their distances (W,), W = b + T − 1, for rows (H, b, T) of queries start … start+b−1.

    Row r (query i = start + r) is written shifted right by b − 1 − r, so key k lands in
    column c = k + b − 1 − r and every cell of a column has the same i − k = start + b − 1 − c:
    summing the shifted rows sums each diagonal. One copy and one sum, not a scatter per cell.
    """
    import torch

    heads, b, t = block.shape
    width = t + b - 1
    flat = block.new_zeros(heads, b * width)
    shifted = flat.as_strided((heads, b, t), (b * width, width - 1, 1), b - 1)  # (H, b, T)
    shifted.copy_(block)
    sums = flat.view(heads, b, width).sum(dim=1)  # (H, W)
    return sums, start + b - 1 - torch.arange(width)


@dataclass(frozen=True)
class Reach:
    """Sinks and reach per head, (L, H) each: one text's, or the mean over `texts` texts."""

    first_token_alpha: np.ndarray
    distance_mean: np.ndarray
    distance_p90: np.ndarray
    texts: int

    @property
    def sink_head_share(self) -> np.ndarray:
        """Per layer, the share of heads whose first_token_alpha exceeds SINK_ALPHA, (L,)."""
        return (self.first_token_alpha > SINK_ALPHA).mean(axis=1)

    @property
    def sink_share(self) -> float:
        """The share of all heads that are sinks."""
        return float((self.first_token_alpha > SINK_ALPHA).mean())

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_token_alpha": self.first_token_alpha.tolist(),
            "distance_mean": self.distance_mean.tolist(),
            "distance_p90": self.distance_p90.tolist(),
            "sink_head_share": self.sink_head_share.tolist(),
            "sink_share": self.sink_share,
        }


# heads.csv's figures of a `Reach`, in the order a `ReachSums` stacks them
FIGURES = ("first_token_alpha", "distance_mean", "distance_p90")


class ReachSums:
    """Sinks and reach over a corpus: each text's figures summed at its index in the corpus
    (`analysis.ordered`), so that parts summed apart `merge` into the same bits."""

    def __init__(self, sums: OrderedSum | None = None, texts: int = 0) -> None:
        self.sums = sums or OrderedSum()  # of (3, L, H) per text, in the order of FIGURES
        self.texts = texts

    def add(self, index: int, found: Reach) -> None:
        """Add a text's figures (a mean of several texts counts as that many)."""
        import numpy as np

        stacked = np.stack([getattr(found, name) for name in FIGURES]).astype(np.float64)
        self.sums.add(index, stacked * found.texts)
        self.texts += found.texts

    def merge(self, other: ReachSums) -> ReachSums:
        return ReachSums(self.sums.merge(other.sums), self.texts + other.texts)

    def result(self) -> Reach:
        """Each figure averaged over the texts (every text weighs the same)."""
        if not self.texts:
            raise ValueError("no text to average")
        means = self.sums.total() / self.texts
        return Reach(*means, texts=self.texts)


def mean(texts: list[Reach]) -> Reach:
    """Each figure averaged over the texts (every text weighs the same; a mean of several
    counts as that many), summed in float64 in the order of `analysis.ordered`."""
    sums = ReachSums()
    for index, found in enumerate(texts):
        sums.add(index, found)
    return sums.result()


class ReachRecorder:
    """A capture recorder of a padded batch's rows: one `TextReach` per text (`lengths`
    are the texts' token counts), fed block by block (`capture.ROWS`)."""

    def __init__(self, layers: list[int], n_heads: int, lengths: list[int]) -> None:
        self.wants = {layer: ("rows",) for layer in layers}
        self.slot = {layer: i for i, layer in enumerate(layers)}
        self.texts = [TextReach(len(layers), n_heads, n) for n in lengths]

    def receive_rows(self, layer: int, start: int, rows: torch.Tensor) -> None:
        for row, text in enumerate(self.texts):  # rows (B, H, b, S)
            text.add(self.slot[layer], start, rows[row])

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        """Nothing but rows is asked for."""

    def finish(self) -> list[Reach]:
        return [text.finish() for text in self.texts]
