"""What each head attends to: top-k tokens by attention received, and its strongest link."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention


@dataclass(frozen=True)
class Target:
    """A token and the weight it gets."""

    index: int
    token: str
    weight: float


@dataclass(frozen=True)
class Link:
    """The single largest query→key weight of a head."""

    query: int
    query_token: str
    key: int
    key_token: str
    weight: float


@dataclass(frozen=True)
class HeadSummary:
    """One head: the tokens it attends to most (mean over queries) and its strongest link.

    `top_other` is the most-attended token that is not special ([CLS], [SEP], BOS), and
    `special_share` the mean attention that goes to special tokens: many heads park most of
    their attention on [CLS] or [SEP], and the token after that is what they read.
    """

    layer: int
    head: int
    top: tuple[Target, ...]
    top_other: Target | None
    special_share: float
    link: Link

    def as_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "top": [t.__dict__ for t in self.top],
            "top_non_special": self.top_other.__dict__ if self.top_other else None,
            "special_share": self.special_share,
            "strongest_link": self.link.__dict__,
        }


def rank_keys(
    att: Attention, weights: np.ndarray, k: int
) -> tuple[tuple[Target, ...], Target | None]:
    """The `k` keys with the most weight in `weights` (T,), and the best non-special key
    (None when every key is special)."""
    import numpy as np

    order = np.argsort(-weights, kind="stable")[: min(k, len(weights))]
    top = tuple(Target(int(i), att.tokens[i], float(weights[i])) for i in order)
    best = int(np.argmax(np.where(att.special, -1.0, weights)))
    other = None if att.special[best] else Target(best, att.tokens[best], float(weights[best]))
    return top, other


def summarise(
    att: Attention, layers: list[int], heads: list[int], top_k: int = 3
) -> list[HeadSummary]:
    """Summarise the chosen heads; attention received is the mean over query rows (sums to 1)."""
    import numpy as np

    summaries = []
    for layer in layers:
        for head in heads:
            grid = att.pattern(layer, head)  # (T, T) query x key
            received = grid.mean(axis=0)  # (T,) mean over queries
            top, other = rank_keys(att, received, top_k)
            q, key = np.unravel_index(int(np.argmax(grid)), grid.shape)
            summaries.append(
                HeadSummary(
                    layer=layer,
                    head=head,
                    top=top,
                    top_other=other,
                    special_share=float(received[att.special].sum()),
                    link=Link(
                        int(q), att.tokens[q], int(key), att.tokens[key], float(grid[q, key])
                    ),
                )
            )
    return summaries
