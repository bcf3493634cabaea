"""What each head does on one text: its pattern in the report's vocabulary, the keys it
attends to most, and its strongest link.

A head's pattern is the report's roles (`attnviz.analysis.roles`) measured on this one text,
with the same metrics and thresholds: `prev 1.00` is a head whose queries give, on average,
all their attention to the previous token. A decoder's induction and duplicate-token scores
come from the text's own repeats (`metrics.repeat_scores`). Where roles compete, the most
specific wins, in this order:

    induction · previous/next/self/punctuation (the widest margin over its threshold) ·
    a content token the queries agree on · first-token and separator sinks · local · broad ·
    mixed

A sink is named only when the head does nothing more specific: most decoder heads park
attention on their first token, and the share that goes to special tokens is reported once,
per head, as `special_share`.

Each key's mean weight is taken over the non-special queries that can see it (on a decoder,
the queries at or after it), so early keys do not win merely by being visible to more queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import METRICS, PROBES, repeat_scores, sentence_sums
from attnviz.analysis.roles import MIXED, ROLES, Thresholds

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention

# A content token the queries give this much of their attention, on average, names the head.
AGREE = 0.3
TOKEN = "token"  # the pattern of a head whose queries agree on one content token
SINKS = ("first-token sink", "separator sink")
AVERAGED = (
    "top: each key's weight averaged over the non-special queries that can see it (on a "
    "decoder, those at or after it); special_share: the mean over non-special queries of the "
    "weight on special tokens; strongest_link: the largest weight from a non-special query "
    "(not a decoder's first) to a non-special key; pattern and scores: the report's roles and "
    "metrics on this text (scores are means over non-special queries; induction and duplicate "
    "from the text's own repeats, decoders only, null without enough repeats)"
)


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
class Pattern:
    """What a head does on this text: a role in ROLES, `token` or `mixed`, the score that
    earned it, and the key it names (the agreed token, or the sink)."""

    role: str
    score: float | None
    key: int | None = None

    @property
    def short(self) -> str:
        """The role's short name (`prev`, `[CLS]`'s role `first`, `token`, `·` for mixed)."""
        if self.role == TOKEN:
            return TOKEN
        return MIXED.shown if self.role == MIXED.name else ROLES[self.role].short


@dataclass(frozen=True)
class HeadSummary:
    """One head on one text: its pattern, the keys it attends to most, its strongest link.

    `top_other` is the most-attended key that is not special ([CLS], [SEP], BOS);
    `special_share` the mean weight non-special queries give special tokens; `scores` every
    role's score on this text (None where it cannot be measured).
    """

    layer: int
    head: int
    pattern: Pattern
    top: tuple[Target, ...]
    top_other: Target | None
    special_share: float
    link: Link | None
    scores: dict[str, float | None]

    def as_dict(self, tokens: tuple[str, ...]) -> dict[str, Any]:
        """The summary as JSON; `tokens` are the keys' (the source's in cross-attention)."""
        key = self.pattern.key
        return {
            "layer": self.layer,
            "head": self.head,
            "pattern": {
                "role": self.pattern.role,
                "short": self.pattern.short,
                "score": self.pattern.score,
                "key": key,
                "key_token": tokens[key] if key is not None else None,
            },
            "scores": self.scores,
            "top": [t.__dict__ for t in self.top],
            "top_non_special": self.top_other.__dict__ if self.top_other else None,
            "special_share": self.special_share,
            "strongest_link": self.link.__dict__ if self.link else None,
        }


def rank_keys(
    att: Attention, weights: np.ndarray, k: int
) -> tuple[tuple[Target, ...], Target | None]:
    """The `k` keys with the most weight in `weights` (T,), and the best non-special key
    (None when every key is special)."""
    import numpy as np

    keys, special = att.key_tokens, att.key_special
    order = np.argsort(-weights, kind="stable")[: min(k, len(weights))]
    top = tuple(Target(int(i), keys[i], float(weights[i])) for i in order)
    best = int(np.argmax(np.where(special, -1.0, weights)))
    other = None if special[best] else Target(best, keys[best], float(weights[best]))
    return top, other


def role_scores(att: Attention) -> dict[str, np.ndarray | None]:
    """Every role's score on this text, (L, H) per role name; None where the text cannot
    measure it (no non-special query; induction on an encoder or without repeats)."""

    sums, counts = sentence_sums(att)  # (M, L, H), (M,)
    named: dict[str, np.ndarray | None] = {
        name: sums[i] / counts[i] if counts[i] else None for i, name in enumerate(METRICS)
    }
    repeats, counted = repeat_scores(att)
    for i, name in enumerate(PROBES):
        named[name] = repeats[i] if att.info.causal and counted else None
    return {name: named[role.metric] for name, role in ROLES.items()}


def key_means(att: Attention, weights: np.ndarray) -> np.ndarray:
    """Each key's weight averaged over the non-special queries that can see it, (L, H, S)
    from `weights` (L, H, T, S); 0 for a key no such query sees."""
    import numpy as np

    queries = ~att.special  # (T,)
    n, n_keys = len(queries), weights.shape[-1]
    sees = np.broadcast_to(queries[:, None], (n, n_keys)).copy()  # (query, key)
    if att.info.causal:
        sees &= np.tril(np.ones((n, n), dtype=bool))
    seen_by = sees.sum(axis=0)  # (T,) queries that see each key
    summed = np.einsum("lhqk,qk->lhk", weights, sees.astype(weights.dtype))
    return np.where(seen_by > 0, summed / np.maximum(seen_by, 1), 0.0)


def special_shares(att: Attention) -> np.ndarray:
    """The mean over non-special queries of the weight on special keys, (L, H); 0 where
    every query is special."""
    import numpy as np

    weights, queries = att.weights.astype(np.float64), ~att.special  # (L, H, T, S), (T,)
    if not queries.any():
        return np.zeros(weights.shape[:2])
    return weights[:, :, queries][..., att.key_special].sum(axis=-1).mean(axis=-1)


def pick_pattern(
    att: Attention,
    scores: dict[str, float | None],
    received: np.ndarray,
    thresholds: Thresholds,
    agreed: int | None,
) -> Pattern:
    """One head's pattern from its role `scores`, its per-key means `received` (T,) and the
    best content key `agreed` (visible to at least half the queries), in the module's order."""
    import numpy as np

    limit = thresholds.values
    cleared = {
        name: score
        for name, score in scores.items()
        if ROLES[name].specific and score is not None and score > 0 and score >= limit[name]
    }
    if "induction" in cleared:
        return Pattern("induction", cleared["induction"])
    positional = [name for name in cleared if name not in SINKS]
    if positional:
        best = max(positional, key=lambda name: cleared[name] - limit[name])
        return Pattern(best, cleared[best])
    if agreed is not None and received[agreed] >= AGREE:
        return Pattern(TOKEN, float(received[agreed]), agreed)
    sinks = [name for name in SINKS if name in cleared]
    if sinks:
        best = max(sinks, key=lambda name: cleared[name] - limit[name])
        key = 0
        if best == "separator sink":
            later = np.flatnonzero(att.key_special)
            later = later[later > 0]
            key = int(later[np.argmax(received[later])])
        return Pattern(best, cleared[best], key)
    for name in ("local", "broad"):
        score = scores[name]
        if score is not None and score >= limit[name]:
            return Pattern(name, score)
    return Pattern(MIXED.name, None)


def summarise(
    att: Attention,
    layers: list[int],
    heads: list[int],
    top_k: int = 3,
    thresholds: Thresholds | None = None,
) -> list[HeadSummary]:
    """Summarise the chosen heads on this text (see the module's docstring)."""
    import numpy as np

    thresholds = thresholds or Thresholds()
    weights = att.weights.astype(np.float64)  # (L, H, T, S): S = T but in cross-attention
    n = weights.shape[-1]
    queries, key_special = ~att.special, att.key_special  # (T,), (S,)
    received = key_means(att, weights)  # (L, H, S)
    per_role = role_scores(att)
    special_share = special_shares(att)  # (L, H)
    # keys a content pattern may name: non-special, seen by at least half the queries
    seen_by = np.array([(queries[k:] if att.info.causal else queries).sum() for k in range(n)])
    candidates = ~key_special & (seen_by * 2 >= max(int(queries.sum()), 1))
    # the strongest link leaves out special tokens and a decoder's first query (it sees
    # only itself)
    link_rows = queries.copy()
    if att.info.causal:
        link_rows[0] = False
    link_mask = link_rows[:, None] & ~key_special[None, :]  # (query, key)

    summaries = []
    for layer in layers:
        slot = att.slot(layer)
        for head in heads:
            att.info.pick_heads([head])
            keys = received[slot, head]  # (T,)
            top, other = rank_keys(att, keys, top_k)
            scores = {
                name: None if values is None else float(values[slot, head])
                for name, values in per_role.items()
            }
            agreed = int(np.argmax(np.where(candidates, keys, -1.0))) if candidates.any() else None
            grid = weights[slot, head]  # (T, S) query x key
            link = None
            if link_mask.any():
                q, key = np.unravel_index(
                    int(np.argmax(np.where(link_mask, grid, -1.0))), grid.shape
                )
                link = Link(
                    int(q), att.tokens[q], int(key), att.key_tokens[key], float(grid[q, key])
                )
            summaries.append(
                HeadSummary(
                    layer=layer,
                    head=head,
                    pattern=pick_pattern(att, scores, keys, thresholds, agreed),
                    top=top,
                    top_other=other,
                    special_share=float(special_share[slot, head]),
                    link=link,
                    scores=scores,
                )
            )
    return summaries
