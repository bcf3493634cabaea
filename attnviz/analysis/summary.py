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

A head removed from the pass (`show --ablate`, `Attention.removed`) has no pattern: its
weights are what it computed, but its output was set to 0, so nothing it attended to reached
the model. Its summary says `removed`, and every number about its pattern is None.

Each key's mean weight is taken over the non-special queries that can see it (on a decoder,
the queries at or after it), so early keys do not win merely by being visible to more queries.

Every number is summed over blocks of query rows (`metrics.row_blocks`, as the head metrics
are), each block read in place (float32, by torch) and its figures summed in float64, never
a copy of the whole attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import (
    METRICS,
    PROBES,
    BlockReads,
    Kept,
    Rows,
    as_tensor,
    metric_sums,
    repeat_lists,
    repeat_means,
    repeat_sums,
    row_blocks,
)
from attnviz.analysis.roles import MIXED, ROLES, Thresholds
from attnviz.core.reductions import KeyLists, QuerySums

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention

# A content token the queries give this much of their attention, on average, names the head.
AGREE = 0.3
TOKEN = "token"  # the pattern of a head whose queries agree on one content token
REMOVED = "removed"  # the pattern of a head removed from the pass (`Attention.removed`)
REMOVED_MARK = "✗"  # what the terminal's maps show for it
SINKS = ("first-token sink", "separator sink")
# The repeat cells a text's blocks keep for its later layers (`HeadStats.repeat_lists`): 8,085
# tokens of English prose (bench/bench_long.py's text) have 1.1 million, 9 MB.
LISTS_BYTES = 32 * 2**20
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
    """What a head does on this text: a role in ROLES, `token`, `mixed` or `removed`, the
    score that earned it, and the key it names (the agreed token, or the sink)."""

    role: str
    score: float | None
    key: int | None = None

    @property
    def short(self) -> str:
        """The role's short name (`prev`, `[CLS]`'s role `first`, `token`, `·` for mixed, `✗`
        for removed)."""
        if self.role == TOKEN:
            return TOKEN
        if self.role == REMOVED:
            return REMOVED_MARK
        return MIXED.shown if self.role == MIXED.name else ROLES[self.role].short


@dataclass(frozen=True)
class HeadSummary:
    """One head on one text: its pattern, the keys it attends to most, its strongest link.

    `top_other` is the most-attended key that is not special ([CLS], [SEP], BOS);
    `special_share` the mean weight non-special queries give special tokens; `scores` every
    role's score on this text (None where it cannot be measured). A `removed` head has none
    of these (see the module's docstring).
    """

    layer: int
    head: int
    pattern: Pattern
    top: tuple[Target, ...]
    top_other: Target | None
    special_share: float | None
    link: Link | None
    scores: dict[str, float | None]
    removed: bool = False

    @classmethod
    def of_removed(cls, layer: int, head: int) -> HeadSummary:
        """A head removed from the pass: no pattern, no numbers."""
        scores: dict[str, float | None] = dict.fromkeys(ROLES)
        return cls(layer, head, Pattern(REMOVED, None), (), None, None, None, scores, True)

    def as_dict(self, tokens: tuple[str, ...]) -> dict[str, Any]:
        """The summary as JSON; `tokens` are the keys' (the source's in cross-attention). A
        removed head keeps every key, each null (`top` too)."""
        if self.removed:
            empty = ("pattern", "scores", "top", "top_non_special", "special_share",
                     "strongest_link")  # fmt: skip
            return {"layer": self.layer, "head": self.head, "removed": True,
                    **dict.fromkeys(empty)}  # fmt: skip
        key = self.pattern.key
        return {
            "layer": self.layer,
            "head": self.head,
            "removed": False,
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
    keys: Sequence[str], special: np.ndarray, weights: np.ndarray, k: int
) -> tuple[tuple[Target, ...], Target | None]:
    """The `k` keys (of the tokens `keys`, `special` (T,) bool) with the most weight in
    `weights` (T,), and the best non-special key (None when every key is special)."""
    import numpy as np

    order = np.argsort(-weights, kind="stable")[: min(k, len(weights))]
    top = tuple(Target(int(i), keys[i], float(weights[i])) for i in order)
    best = int(np.argmax(np.where(special, -1.0, weights)))
    other = None if special[best] else Target(best, keys[best], float(weights[best]))
    return top, other


def role_scores(att: Attention, block_rows: int | None = None) -> dict[str, np.ndarray | None]:
    """Every role's score on this text, (L, H) per role name; None where the text cannot
    measure it (no non-special query; induction on an encoder or without repeats)."""
    return HeadStats.of(att, block_rows).role_scores()


class HeadStats:
    """Everything a text's head summaries take from its attention, summed a block of query
    rows at a time: the head metrics and the text's own repeats (the role scores), each key's
    weight over the non-special queries that see it, the strongest link from a non-special
    query to a non-special key, and the share of special keys.

    `att` gives the text's tokens and facts; its weights are not read here, so a run that
    never holds them (a long text, `core.recording`'s blocks) feeds the same sums: `add(start,
    rows)` with rows (L, H, b, S) of every held layer, or `add(start, rows, slot)` with rows
    (H, b, S) of one (`slot`: its place among `att`'s layers). `of` sums a whole attention.
    """

    def __init__(self, att: Attention, n_layers: int, n_heads: int) -> None:
        import numpy as np

        self.att = att
        keys, self.key_special = att.key_tokens, att.key_special
        self.n_keys = n_keys = len(keys)
        self.queries = ~np.asarray(att.special)
        self.link_rows = self.queries.copy()  # a decoder's first query sees only itself
        if att.info.causal:
            self.link_rows[0] = False
        self.metric_sums = np.zeros((len(METRICS), n_layers, n_heads))
        self.metric_counts = np.zeros((len(METRICS), n_layers))
        self.repeats = np.zeros((2, n_layers, n_heads))
        self.repeat_counts = np.zeros((2, n_layers), dtype=int)
        self.summed = np.zeros((n_layers, n_heads, n_keys))
        self.link_weight = np.full((n_layers, n_heads), -np.inf)
        self.link_at = np.zeros((n_layers, n_heads, 2), dtype=int)  # (query, key)
        self.special = np.zeros((n_layers, n_heads))
        self.special_count = np.zeros(n_layers, dtype=int)
        # what every row of a block gives (`core.reductions`): the metrics' reads, and each
        # key's weight summed over the non-special queries
        self.reads = BlockReads(att.special, self.key_special, keys)
        self.key_weights = QuerySums(self.queries[None].astype(np.float32))
        # a decoder's text read by itself: each row's sums over its repeat cells, the lists
        # made once a block of rows and kept for every layer's
        self.reads_itself = att.info.causal and att.keys is None
        self.repeat_lists = Kept(lambda start, stop: repeat_lists(att, start, stop), LISTS_BYTES)
        repeats = (KeyLists(self.repeat_lists),) if self.reads_itself else ()
        self.asked = (*self.reads.asked, self.key_weights, *repeats)

    @classmethod
    def of(cls, att: Attention, block_rows: int | None = None) -> HeadStats:
        """The sums of a whole attention, `block_rows` rows at a time (default: as many as
        `metrics.BLOCK_FLOATS` allows)."""
        stats = cls(att, *att.weights.shape[:2])
        for start, rows in row_blocks(att, block_rows):
            stats.add(start, rows)
        return stats

    def add(self, start: int, rows: Any, slot: int | None = None, entropy: Any = None,
            found: Sequence[Any] | None = None) -> None:  # fmt: skip
        """Add query rows start … start+b−1: (L, H, b, S) of every layer, or (H, b, S) of the
        layer at `slot`; numpy's or torch's, with each row's `entropy` ((L, H, b) or (H, b),
        torch) where they came with it (`core.capture.ENTROPY`), and `found`, the results of
        `asked` where the pass read them (`core.reductions`; else they are read here)."""
        from attnviz.core.reductions import read

        if slot is not None:
            rows = rows[None]
            entropy = None if entropy is None else entropy[None]
            found = None if found is None else [part[None] for part in found]
        at = slice(None) if slot is None else slice(slot, slot + 1)
        # the block's figures (`metrics`), then the text's sums of them
        rows = as_tensor(rows)
        if found is None:
            found = read(rows[..., : self.n_keys], start, self.asked)
        if self.reads_itself:  # a decoder's text, read by itself: its repeats, asked last
            *found, repeated = found
            stop = start + rows.shape[2]
            repeats, counted = repeat_sums(self.att, start, rows, repeated,
                                           self.repeat_lists(start, stop))  # fmt: skip
            self.repeats[:, at] += repeats
            self.repeat_counts[:, at] += counted[:, None]
        *by_rows, by_keys = found
        found = Rows(self.att, rows, start, entropy, found=by_rows)  # its non-special rows
        sums, counts = metric_sums(found)  # (M, l, H), (M,)
        special = found.summed(found.by_key["special"]) if found.count else None
        self._add_keys(by_keys, at)
        self.metric_sums[:, at] += sums
        self.metric_counts[:, at] += counts[:, None]
        if not found.count:
            return
        self._keys(found, at)
        self.special[at] += special
        self.special_count[at] += found.count

    def _add_keys(self, by_keys: Any, at: slice) -> None:
        """Each key's weight from the block's non-special queries that see it (a decoder's
        rows hold 0 past their query): `key_weights`' sums, (l, H, 1, W), summed within the
        block in float32, over blocks in float64."""
        self.summed[at, :, : by_keys.shape[-1]] += by_keys[..., 0, :].double().numpy()

    def _keys(self, found: Rows, at: slice) -> None:
        """The strongest link from the block's non-special queries."""
        import numpy as np
        import torch

        queries, rows = found.queries, found.rows  # (Q,), (l, H, Q, W)
        linked = np.flatnonzero(self.link_rows[queries])  # a decoder's first query links none
        if not len(linked):
            return
        best = found.content_max  # (l, H, Q)
        if len(linked) < len(queries):
            linked_at = torch.from_numpy(linked)
            rows, best = rows.index_select(2, linked_at), best.index_select(2, linked_at)
        query = best.argmax(dim=-1)  # (l, H): the first largest over queries
        weight = best.gather(-1, query[..., None])[..., 0].double().numpy()
        picked = rows[torch.arange(rows.shape[0])[:, None], torch.arange(rows.shape[1]), query]
        picked[..., torch.from_numpy(found.special)] = -1.0  # (l, H, W), a copy: content keys
        key = picked.argmax(dim=-1).numpy()  # the first largest in that row: (query, key) order
        better = weight > self.link_weight[at]  # a tie keeps the earlier block's
        self.link_weight[at] = np.where(better, weight, self.link_weight[at])
        where = np.stack([queries[linked][query.numpy()], key], axis=-1)  # (l, H, 2)
        self.link_at[at] = np.where(better[..., None], where, self.link_at[at])

    def role_scores(self) -> dict[str, np.ndarray | None]:
        """Every role's score, (L, H) per role name, as `role_scores`."""
        counts = self.metric_counts[:, 0]  # every layer counts the same queries
        named: dict[str, np.ndarray | None] = {
            name: self.metric_sums[i] / counts[i] if counts[i] else None
            for i, name in enumerate(METRICS)
        }
        repeats, counted = repeat_means(self.repeats, self.repeat_counts[:, 0])
        for i, name in enumerate(PROBES):
            named[name] = repeats[i] if counted else None
        return {name: named[role.metric] for name, role in ROLES.items()}

    def key_means(self) -> np.ndarray:
        """Each key's weight averaged over the non-special queries that can see it, (L, H, S);
        0 for a key no such query sees."""
        import numpy as np

        return np.where(self.seen_by > 0, self.summed / np.maximum(self.seen_by, 1), 0.0)

    @property
    def seen_by(self) -> np.ndarray:
        """How many non-special queries see each key, (S,)."""
        import numpy as np

        n, causal = len(self.key_special), self.att.info.causal
        if not causal:
            return np.full(n, int(self.queries.sum()))
        return np.cumsum(self.queries[::-1])[::-1][:n]  # queries at or after each key

    def special_shares(self) -> np.ndarray:
        """Each head's mean over non-special queries of its weight on special keys, (L, H)."""
        import numpy as np

        counts = np.maximum(self.special_count, 1)[:, None]
        return np.where(self.special_count[:, None] > 0, self.special / counts, 0.0)


def special_shares(weights: np.ndarray, queries: np.ndarray, key_special: np.ndarray) -> np.ndarray:
    """`special_share`: the mean over the `queries` (T,) bool of the weight each gives the
    special keys `key_special` (S,) bool, (...) from `weights` (..., T, S) whose rows are shares
    (sum to 1); 0 where there is no such query. `report` averages it over a corpus's texts.
    Summed in float64 from the special keys' columns alone: no copy of `weights`."""
    import numpy as np

    if not queries.any():
        return np.zeros(weights.shape[:-2])
    on_special = weights[..., key_special][..., queries, :]  # (..., Q, specials)
    return on_special.astype(np.float64).sum(axis=-1).mean(axis=-1)


def pick_pattern(
    key_special: np.ndarray,
    scores: dict[str, float | None],
    received: np.ndarray,
    thresholds: Thresholds,
    agreed: int | None,
) -> Pattern:
    """One head's pattern from its role `scores`, its per-key means `received` (T,) and the
    best content key `agreed` (visible to at least half the queries), in the module's order;
    `key_special` (T,) says which keys are special tokens (a separator sink's)."""
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
            later = np.flatnonzero(key_special)
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
    block_rows: int | None = None,
    stats: HeadStats | None = None,
) -> list[HeadSummary]:
    """Summarise the chosen heads on this text (see the module's docstring), from `stats`, or
    from its attention `block_rows` query rows at a time (default: as many as
    `metrics.BLOCK_FLOATS` allows)."""
    import numpy as np

    thresholds = thresholds or Thresholds()
    stats = stats or HeadStats.of(att, block_rows)
    per_role = stats.role_scores()
    received = stats.key_means()  # (L, H, S)
    # keys a content pattern may name: non-special, seen by at least half the queries
    seen_by = stats.seen_by
    candidates = ~stats.key_special & (seen_by * 2 >= max(int(stats.queries.sum()), 1))
    special_share = stats.special_shares()  # (L, H)
    any_link = bool(stats.link_rows.any() and (~stats.key_special).any())

    # the text's facts, read once: its tokens, where each layer is held, the removed heads
    tokens, key_tokens, key_special = att.tokens, att.key_tokens, att.key_special
    removed = {(layer, head) for layer in layers for head in heads if att.is_removed(layer, head)}
    slots = {layer: att.slot(layer) for layer in layers}
    att.info.pick_heads(list(heads))
    summaries = []
    for layer in layers:
        slot = slots[layer]
        for head in heads:
            if (layer, head) in removed:
                summaries.append(HeadSummary.of_removed(layer, head))
                continue
            keys = received[slot, head]  # (T,)
            top, other = rank_keys(key_tokens, key_special, keys, top_k)
            scores = {
                name: None if values is None else float(values[slot, head])
                for name, values in per_role.items()
            }
            agreed = int(np.argmax(np.where(candidates, keys, -1.0))) if candidates.any() else None
            link = None
            if any_link:
                q, key = (int(i) for i in stats.link_at[slot, head])
                weight = float(stats.link_weight[slot, head])
                link = Link(q, tokens[q], key, key_tokens[key], weight)
            summaries.append(
                HeadSummary(
                    layer=layer,
                    head=head,
                    pattern=pick_pattern(key_special, scores, keys, thresholds, agreed),
                    top=top,
                    top_other=other,
                    special_share=float(special_share[slot, head]),
                    link=link,
                    scores=scores,
                )
            )
    return summaries
