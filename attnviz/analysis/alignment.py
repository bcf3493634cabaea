"""Cross-attention as word alignment: how monotone each head's alignment is, and how much it
rests on the source's end-of-sentence token.

For one head's cross-attention a = A[layer, head] (target queries t × source keys s), with
the non-special target tokens t_1 < t_2 < … < t_n (the decoder's start token and other
special tokens left out) and the non-special source tokens:

    aligned(t)  argmax_s a[t, s] over non-special source tokens s   (the head's alignment)
    monotone    share of t_k, k ≥ 2, with aligned(t_k) ≥ aligned(t_{k−1})
                (1: the head reads the source left to right; 0: right to left)
    source_eos  a[t, e], e the source's last special token (EOS: </s>, [SEP]),
                averaged over the non-special target tokens t

A corpus is summed text by text (`AlignmentSums`), as `attnviz.analysis.metrics` sums the
positional metrics: sums over every counted target token of every text, divided by how many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention

# The cross-attention metrics, in the order `alignment_sums` returns them, with their help.
ALIGNMENT = {
    "monotone": "alignment at or after the previous target token's",
    "source_eos": "a[t, EOS]: attention to the source's last special token",
}


def monotone_sums(
    weights: np.ndarray, query_special: np.ndarray, key_special: np.ndarray
) -> tuple[np.ndarray, int]:
    """Per head, how many non-special target tokens (after the first) align at or after the
    previous one's alignment, (L, H), and how many target tokens were compared."""
    import numpy as np

    queries = np.flatnonzero(~query_special)  # (Q,)
    keys = np.flatnonzero(~key_special)  # (K,)
    n_layers, n_heads = weights.shape[:2]
    if len(queries) < 2 or len(keys) == 0:
        return np.zeros((n_layers, n_heads)), 0
    rows = weights[:, :, queries][:, :, :, keys]  # (L, H, Q, K)
    aligned = rows.argmax(axis=-1)  # (L, H, Q): position among the non-special keys
    forward = aligned[:, :, 1:] >= aligned[:, :, :-1]  # (L, H, Q − 1)
    return forward.sum(axis=-1).astype(np.float64), len(queries) - 1


def eos_sums(
    weights: np.ndarray, query_special: np.ndarray, key_special: np.ndarray
) -> tuple[np.ndarray, int]:
    """Per head, the summed weight non-special target tokens give the source's last special
    token, (L, H), and how many target tokens were summed (0 when the source has none)."""
    import numpy as np

    queries = np.flatnonzero(~query_special)  # (Q,)
    specials = np.flatnonzero(key_special)
    n_layers, n_heads = weights.shape[:2]
    if len(queries) == 0 or len(specials) == 0:
        return np.zeros((n_layers, n_heads)), 0
    eos = specials[-1]
    return weights[:, :, queries, eos].astype(np.float64).sum(axis=-1), len(queries)  # (L, H)


def alignment_sums(att: Attention) -> tuple[np.ndarray, np.ndarray]:
    """Every alignment metric's sums over one text's cross-attention, (A, L, H), and their
    counts (A,), in the order of ALIGNMENT."""
    import numpy as np

    found = [
        measure(att.weights, att.special, att.key_special) for measure in (monotone_sums, eos_sums)
    ]
    sums = np.stack([total for total, _ in found])  # (A, L, H)
    return sums, np.array([count for _, count in found], dtype=float)


@dataclass
class AlignmentSums:
    """Running sums of the alignment metrics over a corpus; add texts one at a time."""

    sums: Any = None  # (A, L, H)
    counts: Any = None  # (A,)

    def add(self, att: Attention) -> None:
        sums, counts = alignment_sums(att)
        if self.sums is None:
            self.sums, self.counts = sums, counts
        else:
            self.sums += sums
            self.counts += counts

    def means(self) -> np.ndarray:
        """Mean of each metric, (A, L, H); NaN where no target token qualified."""
        import numpy as np

        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sums / self.counts[:, None, None]
