"""Head metrics and roles: what each head does, averaged over the queries of a corpus.

All metrics are means over every non-special query token i of every sentence, for each head,
of a quantity of that query's attention row a = A[layer, head, i, :] (n keys):

    previous     a[i-1]                      (queries with i ≥ 1)
    next         a[i+1]                      (queries with i ≤ n-2)
    self         a[i]
    first        a[0]   the first token: [CLS], BOS, or a decoder's first token (its sink)
    separator    Σ a[j] over special tokens j > 0: [SEP], EOS (0 where there are none)
    punctuation  Σ a[j] over punctuation tokens j
    local        Σ a[j] over non-special tokens with |i − j| ≤ 2
    entropy      −Σ a[j] ln a[j]                 (nats)
    entropy_norm entropy / ln(visible keys)      (queries that see ≥ 2 keys; 1 = uniform)
    distance     Σ a[j] |i − j|                  (tokens)
    confidence   max_j a[j]

In cross-attention (an encoder-decoder's target queries over source keys) the positional
metrics (previous, next, self, local, distance) compare positions of two different texts,
so they are not measured there; the others are, over the source keys.

Everything is vectorised over layers, heads and queries; a text is summed a block of query
rows at a time (`row_blocks`: at most BLOCK_FLOATS weights at once, or the attention function's
blocks), and a corpus sentence by sentence (`MetricSums`), so memory grows neither with T²
nor with the corpus. Each row's figure is taken from the block in its own precision
(float32) by torch, in as few reads of the block as the figures allow (`Rows.by_key`: one
product for every sum over a set of keys); the rows' figures are summed in float64.

Each metric is one `Metric` in METRICS (its name, its definition and how it is summed);
adding one is one entry there. Causal models also get two probes on repeated random tokens
(`PROBES`, see `probe_scores`): induction and duplicate-token. Roles built on these are in
`attnviz.analysis.roles`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

from attnviz.analysis.ordered import OrderedSum

if TYPE_CHECKING:
    import numpy as np
    import torch

    from attnviz.core.attention import Attention

LOCAL_WINDOW = 2
# `Rows.by_key`'s sums, in the order of its table's columns
BY_KEY = ("first", "separators", "punctuation", "special", "before", "far_before", "after",
          "far_after")  # fmt: skip
# A block of query rows holds at most this many weights (4 MiB in float32): what a text's
# metrics and summary read at once, whatever its length.
BLOCK_FLOATS = 2**20


def row_blocks(att: Attention, block_rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """`att.weights` a block of query rows at a time: (start, rows (L, H, b, S), a view) for
    start = 0, b, 2b, …; b is `block_rows`, or as many rows as BLOCK_FLOATS allows. A text
    that fits is one block, the whole array."""
    n_layers, n_heads, n, n_keys = att.weights.shape
    if block_rows is None:
        block_rows = BLOCK_FLOATS // max(1, n_layers * n_heads * n_keys)
    step = max(1, block_rows)
    for start in range(0, n, step):
        yield start, att.weights[:, :, start : start + step]


def as_tensor(rows: Any) -> torch.Tensor:
    """`rows` as a torch tensor without a copy: numpy's (read-only views too) or torch's."""
    import warnings

    import torch

    if isinstance(rows, torch.Tensor):
        return rows
    with warnings.catch_warnings():  # a read-only view (a broadcast stand-in) is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.as_tensor(rows)


# The tables of key weights a text's blocks keep for its later layers (`BlockReads.table`):
# 8,085 tokens read in blocks of 172 rows keep 48 tables of (8, ≤ 8,085), 6 MB.
TABLES_BYTES = 32 * 2**20


class Kept:
    """`make(*block)` of a text's blocks of rows, made once a block and kept for the text's
    later layers while what is kept takes at most `budget` bytes. Past it, a block's is made
    once a layer: the last one made is kept until another block's is asked (the pass and
    the recorder that asked it both ask a block's)."""

    def __init__(self, make: Callable[..., Any], budget: int) -> None:
        self.make, self.budget = make, budget
        self.kept: dict[tuple, Any] = {}
        self.size = 0
        self.last: tuple[tuple, Any] | None = None  # past the budget: (block, what was made)

    def __call__(self, *block: int) -> Any:
        found = self.kept.get(block)
        if found is not None:
            return found
        if self.last is not None and self.last[0] == block:
            return self.last[1]
        found = self.make(*block)
        size = _nbytes(found)
        if self.size + size <= self.budget:
            self.kept[block] = found
            self.size += size
        else:
            self.last = (block, found)
        return found


def _nbytes(found: Any) -> int:
    """The bytes of an array, or of the arrays in nested lists and tuples."""
    if isinstance(found, (list, tuple)):
        return sum(_nbytes(part) for part in found)
    return found.nbytes


class BlockReads:
    """What `Rows` reads of every row of a text's blocks, registered with the one pass over
    each block (`core.reductions`): each row's sums over sets of keys (`by_key`'s table) and
    its largest weight on a non-special key (`content_max`). Made once a text, from which
    queries are special tokens, which keys are and the keys' tokens."""

    def __init__(self, special: Any, key_special: Any, key_tokens: Sequence[str]) -> None:
        import numpy as np

        from attnviz.core.reductions import KeyMax, KeySums

        self.special = np.asarray(special)
        key_special = np.asarray(key_special)
        separators = key_special.copy()  # special tokens after the first
        separators[0] = False
        keys = np.arange(len(key_special))
        punctuation = _punctuation(tuple(key_tokens)) & ~key_special
        # the table's columns that do not depend on the block (see `Rows.by_key`)
        self.fixed = np.stack([keys == 0, separators, punctuation, key_special]).astype(np.float32)
        self.table = Kept(self._table, TABLES_BYTES)  # (start, stop, width): for later layers
        self.key_sums = KeySums(self.table)
        self.content = KeyMax(~key_special)
        self.asked = (self.key_sums, self.content)

    def _table(self, start: int, stop: int, width: int) -> np.ndarray:
        """`Rows.by_key`'s key weights for query rows start … stop−1, (8, W): lo … hi are the
        block's first and last non-special queries (`table`: made once a block)."""
        import numpy as np

        block = np.arange(start, stop)
        queries = block[~self.special[start:stop]]
        lo, hi = (int(queries[0]), int(queries[-1])) if len(queries) else (0, -1)
        keys = np.arange(width)
        around = np.stack([keys < lo, np.maximum(lo - keys, 0), keys > hi,
                           np.maximum(keys - hi, 0)]).astype(np.float32)  # fmt: skip
        return np.concatenate([self.fixed[:, :width], around])


class Rows:
    """One text's non-special query rows (all of them, or one block), and what several
    metrics share.

    `rows` (L, H, b, S) are query rows start … start+b−1 of `att`'s text, where they come a
    block at a time (`core.recording`); by default, all of `att.weights`. Every metric is a
    sum over queries, so a text's sums are the sums of its blocks'. What every metric reads
    of the whole block (`BlockReads`) is read once, with the other recorders' reads of it
    (`core.reductions`): `found`, its results where the pass has them, else read here. Each
    row's figure is taken in the rows' own precision by torch (every core; no float64 copy of
    the block), and the rows' figures are summed in float64.
    """

    def __init__(
        self,
        att: Attention,
        rows: Any = None,
        start: int = 0,
        entropy: Any = None,
        reads: BlockReads | None = None,
        found: Sequence[Any] | None = None,
    ) -> None:
        import numpy as np
        import torch

        from attnviz.core.reductions import read

        if rows is None:
            rows, start = att.weights, 0  # (L, H, T, S): S = T but in cross-attention
        rows = as_tensor(rows)
        self.n = len(att.key_tokens)
        self.square = att.keys is None  # keys are the queries' own tokens
        block = np.arange(start, start + rows.shape[2])
        self.queries = block[~np.asarray(att.special)[block]]  # (Q,) positions in the text
        # (L, H, Q, W): W ≤ S keys (a decoder's block of rows stops at its last query's key:
        # the later keys hold 0); a view where every row of the block is a query
        rows = rows[..., : self.n]
        if found is None:
            reads = reads or BlockReads(att.special, att.key_special, att.key_tokens)
            found = read(rows, start, reads.asked)
        key_sums, content = found  # (L, H, b, 8), (L, H, b): every row of the block
        if len(self.queries) < rows.shape[2]:
            picked = torch.from_numpy(self.queries - start)
            rows = rows.index_select(2, picked)
            entropy = None if entropy is None else entropy.index_select(-1, picked)
            key_sums, content = key_sums.index_select(2, picked), content.index_select(2, picked)
        self.rows = rows
        self._entropy = entropy  # (L, H, Q) float32, where the rows came with it
        self._key_sums, self.content_max = key_sums, content
        self.width = rows.shape[-1]
        self.count = len(self.queries)
        self.key_special = np.asarray(att.key_special)
        self.special = self.key_special[: self.width]
        # keys a query can see: all of them, or (causal) those up to itself
        self.visible = self.queries + 1 if att.info.causal else np.full(self.count, self.n)

    def summed(self, found: torch.Tensor) -> np.ndarray:
        """A figure of each row, (L, H, Q), summed over the queries in float64: (L, H)."""
        import torch

        return found.sum(dim=-1, dtype=torch.float64).numpy()

    @cached_property
    def by_key(self) -> dict[str, torch.Tensor]:
        """Each row's sums over sets of keys, (L, H, Q) each, from one product of the block
        with a (8, W) table of key weights (`BlockReads.table`):

            first        a[0]
            separators   Σ a[j] over special tokens after the first
            punctuation  Σ a[j] over punctuation tokens
            special      Σ a[j] over special tokens (the summary's special share)
            before, far_before   Σ a[j] and Σ a[j] (lo − j) over keys j < lo
            after, far_after     Σ a[j] and Σ a[j] (j − hi) over keys j > hi

        where lo … hi are the block's first and last queries (what `_distance` adds the
        block's own span to)."""
        return dict(zip(BY_KEY, self._key_sums.unbind(-1)))

    @cached_property
    def band(self) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Each row's weights at offsets −LOCAL_WINDOW … LOCAL_WINDOW from its query, (L, H,
        Q, 2·LOCAL_WINDOW + 1), in one gather (0 where the key is outside the text or the
        block); which queries have a key at each offset in the text, and those keys'
        positions, (Q, offsets) each."""
        import numpy as np
        import torch

        offsets = np.arange(-LOCAL_WINDOW, LOCAL_WINDOW + 1)
        keys = self.queries[:, None] + offsets[None, :]  # (Q, offsets)
        keep = (keys >= 0) & (keys < self.n)  # queries that have that key
        held = keep & (keys < self.width)  # and whose key is in the block (else 0)
        rows = torch.arange(self.count)[:, None].expand(keys.shape)  # (Q, offsets)
        picked = self.rows[:, :, rows, torch.from_numpy(np.where(held, keys, 0))]
        return picked * torch.from_numpy(held).to(picked.dtype), keep, keys

    def at_offset(self, k: int) -> tuple[np.ndarray, int]:
        """Σ over queries i of a[i + k], |k| ≤ LOCAL_WINDOW, and how many queries have a key
        there."""
        picked, keep, _ = self.band
        return self.summed(picked[..., k + LOCAL_WINDOW]), int(keep[:, k + LOCAL_WINDOW].sum())

    def largest(self) -> torch.Tensor:
        """Each row's largest weight, (L, H, Q): `content_max`'s, and the special keys'."""
        import numpy as np
        import torch

        special = np.flatnonzero(self.special)
        if not len(special):
            return self.content_max
        on_special = self.rows.index_select(-1, torch.from_numpy(special)).amax(dim=-1)
        return torch.maximum(self.content_max, on_special)

    @cached_property
    def entropy(self) -> torch.Tensor:
        """−Σ_j a[j] ln a[j] of each row, (L, H, Q) float64: as the rows came (recomputed
        rows bring it from their softmax, `core.recording.Scores.rows`), else from each
        weight, in the rows' own precision."""

        found = self._entropy if self._entropy is not None else self._terms()
        return found.double()

    def _terms(self) -> torch.Tensor:
        import torch

        return torch.special.entr(self.rows).sum(dim=-1)

    def all_queries(self, summed: np.ndarray) -> tuple[np.ndarray, int]:
        return summed, self.count


def _entropy_norm(r: Rows) -> tuple[np.ndarray, int]:
    import numpy as np
    import torch

    spread = np.flatnonzero(r.visible > 1)  # a query that sees one key has no spread
    logs = torch.from_numpy(np.log(r.visible[spread].astype(np.float64)))
    return (r.entropy[:, :, torch.from_numpy(spread)] / logs).sum(dim=-1).numpy(), len(spread)


def _local(r: Rows) -> tuple[np.ndarray, int]:
    """Σ a[j] over the non-special keys within LOCAL_WINDOW of the query: the band's cells,
    not the whole row."""
    import numpy as np
    import torch

    picked, _, keys = r.band  # (L, H, Q, offsets), (Q, offsets)
    content = ~r.key_special[np.clip(keys, 0, r.n - 1)]  # (Q, offsets)
    found = (picked * torch.from_numpy(content).to(picked.dtype)).sum(dim=-1)
    return r.all_queries(r.summed(found))


def _distance(r: Rows) -> tuple[np.ndarray, int]:
    """Σ_j a[j] |i − j| of each row as sums of non-negative terms (no cancellation): for the
    keys before the block's first query lo, |i − j| = (i − lo) + (lo − j), and alike after its
    last query hi, both from `by_key`'s one product; the keys lo … hi cell by cell."""
    import numpy as np
    import torch

    if not r.count:
        return r.all_queries(np.zeros(r.rows.shape[:2]))
    lo, hi = int(r.queries[0]), int(r.queries[-1])
    queries = torch.from_numpy(r.queries).to(r.rows.dtype)  # (Q,)
    keys = torch.arange(lo, min(hi + 1, r.width), dtype=r.rows.dtype)
    span = r.rows[..., lo : hi + 1]  # (L, H, Q, hi − lo + 1): the block's own span
    found = (span * (keys[None, :] - queries[:, None]).abs_()).sum(dim=-1)
    by_key = r.by_key
    found += (queries - lo) * by_key["before"] + by_key["far_before"]
    found += (hi - queries) * by_key["after"] + by_key["far_after"]
    return r.all_queries(r.summed(found))


@dataclass(frozen=True)
class Metric:
    """One head metric: its name, its definition, and its sum over a text's queries (L, H)
    with the number of queries it covers."""

    name: str
    help: str
    sums: Callable[[Rows], tuple[np.ndarray, int]]
    positional: bool = False  # compares query and key positions: not in cross-attention


METRICS = {
    metric.name: metric
    for metric in (
        Metric(
            "previous", "a[i−1]: attention to the previous token", lambda r: r.at_offset(-1), True
        ),
        Metric("next", "a[i+1]: attention to the next token", lambda r: r.at_offset(1), True),
        Metric("self", "a[i]: attention to itself", lambda r: r.at_offset(0), True),
        Metric(
            "first",
            "a[0]: attention to the first token ([CLS], BOS, or a decoder's first token)",
            lambda r: r.all_queries(r.summed(r.by_key["first"])),
        ),
        Metric(
            "separator",
            "Σ a[j] over special tokens after the first ([SEP], EOS)",
            lambda r: r.all_queries(r.summed(r.by_key["separators"])),
        ),
        Metric(
            "punctuation",
            "Σ a[j] over punctuation tokens",
            lambda r: r.all_queries(r.summed(r.by_key["punctuation"])),
        ),
        Metric(
            "local", f"Σ a[j] over non-special tokens with |i − j| ≤ {LOCAL_WINDOW}", _local, True
        ),
        Metric(
            "entropy",
            "−Σ a[j] ln a[j], in nats",
            lambda r: r.all_queries(r.entropy.sum(dim=-1).numpy()),
        ),
        Metric(
            "entropy_norm", "entropy / ln(keys the query can see); 1 means uniform", _entropy_norm
        ),
        Metric("distance", "Σ a[j] |i − j|: mean attention distance, in tokens", _distance, True),
        Metric(
            "confidence",
            "max_j a[j]: the largest weight",
            lambda r: r.all_queries(r.summed(r.largest())),
        ),
    )
}
# Decoder probes on repeated random tokens (`probe_scores`), in the order it returns them.
PROBES = {
    "induction": "repeated random tokens: a[token after the earlier occurrence]",
    "duplicate": "repeated random tokens: a[the earlier occurrence]",
}
METRIC_HELP = {**{m.name: m.help for m in METRICS.values()}, **PROBES}


@lru_cache(maxsize=4)
def _punctuation(tokens: tuple[str, ...]) -> np.ndarray:
    """Which of `tokens` are punctuation, (T,) bool: once a text, not once a block of rows."""
    import numpy as np

    return np.array([is_punctuation(token) for token in tokens], dtype=bool)


def is_punctuation(token: str) -> bool:
    """A token made only of punctuation characters (after word-piece markers are removed)."""
    text = token.removeprefix("##").strip()
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def sentence_sums(
    att: Attention, rows: Any = None, start: int = 0, block_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-head sums of every metric over this text's non-special queries (or those of one
    block of its rows, as `Rows` takes them), and their counts. Without `rows`, the sums of
    the text's blocks (`row_blocks`, `block_rows` rows each).

    Returns sums (M, L, H) and counts (M,) in the order of METRICS.
    """

    if rows is None:
        blocks = [sentence_sums(att, part, first) for first, part in row_blocks(att, block_rows)]
        sums, counts = blocks[0]
        for more, counted in blocks[1:]:
            sums, counts = sums + more, counts + counted
        return sums, counts
    return metric_sums(Rows(att, rows, start))


def metric_sums(found: Rows) -> tuple[np.ndarray, np.ndarray]:
    """`sentence_sums` of one block's `Rows`: sums (M, L, H) and counts (M,)."""
    import numpy as np

    unmeasured = (np.zeros(found.rows.shape[:2]), 0)  # counted over no query: None
    summed = [
        metric.sums(found) if found.square or not metric.positional else unmeasured
        for metric in METRICS.values()
    ]
    sums = np.stack([total for total, _ in summed])  # (M, L, H)
    counts = np.array([count for _, count in summed], dtype=float)  # (M,)
    return sums, counts


@dataclass
class MetricSums:
    """Running sums of the metrics over a corpus; add sentences one at a time, each at its
    index in the corpus, so that parts of a corpus summed apart `merge` into the same bits
    (`analysis.ordered`)."""

    sums: OrderedSum = field(default_factory=OrderedSum)  # of (M, L, H) per sentence
    counts: Any = None  # (M,), whole numbers: exact in any order
    sentences: int = 0
    queries: int = 0
    # a decoder's own repeats (`repeat_sums`): induction and duplicate-token sums (2, L, H)
    # per sentence, and the queries counted (2,), pooled over the corpus
    repeats: OrderedSum = field(default_factory=OrderedSum)
    repeat_counts: Any = None

    def add(self, att: Attention, index: int | None = None, found: Any = None,
            repeats: Any = None) -> None:  # fmt: skip
        """Add one sentence, at `index` (default: after the sentences added so far); `found`,
        its sums and counts where `att` holds no maps (a long text's, from blocks of rows), and
        `repeats` its repeat sums and counts likewise (a decoder's)."""
        sums, counts = found if found is not None else sentence_sums(att)
        at = self.sentences if index is None else index
        self.sums.add(at, sums)
        self.counts = counts if self.counts is None else self.counts + counts
        if att.info.causal and att.keys is None:  # a decoder reading itself
            if repeats is None:
                repeats = repeat_totals(att)
            self.repeats.add(at, repeats[0])
            self.repeat_counts = repeats[1] + (
                0 if self.repeat_counts is None else self.repeat_counts
            )
        self.sentences += 1
        self.queries += int(counts[list(METRICS).index("self")])

    def repeat_means(self) -> tuple[np.ndarray | None, tuple[int, int]]:
        """Each head's induction and duplicate-token scores on the corpus's own repeats,
        (2, L, H) means over every query with an earlier occurrence of its token (pooled over
        the texts), and how many queries each counted; None below MIN_REPEATS queries or for
        an encoder."""
        if self.repeat_counts is None:
            return None, (0, 0)
        counts = (int(self.repeat_counts[0]), int(self.repeat_counts[1]))
        if counts[0] < MIN_REPEATS:
            return None, counts
        return self.repeats.total() / self.repeat_counts[:, None, None], counts

    def merge(self, other: MetricSums) -> MetricSums:
        """This part of the corpus and `other` (other sentences) as one."""
        if other.counts is None or self.counts is None:
            return other if self.counts is None else self
        counts = [c for c in (self.repeat_counts, other.repeat_counts) if c is not None]
        return MetricSums(
            self.sums.merge(other.sums),
            self.counts + other.counts,
            self.sentences + other.sentences,
            self.queries + other.queries,
            self.repeats.merge(other.repeats),
            sum(counts[1:], counts[0]) if counts else None,
        )

    def means(self) -> np.ndarray:
        """Mean of each metric, (M, L, H); NaN where no query qualified."""
        import numpy as np

        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sums.total() / self.counts[:, None, None]


# A text's own repeats score induction only when this many queries repeat an earlier token.
MIN_REPEATS = 3


def repeat_scores(att: Attention, block_rows: int | None = None) -> tuple[np.ndarray, int]:
    """Induction and duplicate-token scores of every head on this text's own repeats,
    (2, L, H), and how many queries they average over (0: no scores, all zero).

    The probes' recipe (`probe_scores`) applied to ordinary text: a non-special query i whose
    token occurred before, at positions j < i, gives

        induction   Σ a[j + 1] over those j with j + 1 < i   (the token after each earlier
                                                             occurrence: "A B … A → B")
        duplicate   Σ a[j]                                   (the earlier occurrences)

    each averaged over the queries that have an earlier occurrence (for induction, one with
    j + 1 < i). Tokens are compared by their labels, exactly. Summed over blocks of query
    rows (`row_blocks`, `repeat_sums`), each block's (query, key) masks made for it alone.
    """
    return repeat_means(*repeat_totals(att, block_rows))


def repeat_totals(att: Attention, block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`repeat_scores`' sums (2, L, H) and the queries each counted (2,), over the whole
    text: what a corpus pools."""
    import numpy as np

    n_layers, n_heads = att.weights.shape[:2]
    sums, counts = np.zeros((2, n_layers, n_heads)), np.zeros(2, dtype=int)
    for start, rows in row_blocks(att, block_rows):
        found, counted = repeat_sums(att, start, rows)
        sums += found
        counts += counted
    return sums, counts


def repeat_sums(att: Attention, start: int, rows: np.ndarray, found: Any = None,
                lists: Any = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`repeat_scores`' sums over one block of query rows start … start+b−1, rows (L, H, b, S):
    (2, L, H) and the queries each counted, (2,); from `found`, each row's sums over its
    repeat cells `lists` (`repeat_lists`, made here if not given), (L, H, b, 2), where the
    pass made them (`reductions.KeyLists`), else read here."""
    import numpy as np

    from attnviz.core.reductions import key_list_sums

    rows = as_tensor(rows)
    lists = lists or repeat_lists(att, start, start + rows.shape[2])
    if found is None:
        found = key_list_sums(rows[..., : len(att.tokens)], lists)
    sums = found.sum(dim=-2).permute(2, 0, 1).numpy()  # (2, L, H)
    counts = np.array([np.count_nonzero(np.diff(offsets)) for offsets, _ in lists])
    return sums, counts  # counts: the queries with a pair


def repeat_lists(att: Attention, start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The repeat cells of query rows start … stop−1 (`reductions.KeyLists`' lists): each
    row's induction keys (the token after each earlier occurrence of its own, before the
    query), then its duplicate-token keys (each earlier occurrence), as (offsets (b+1,),
    keys) with rows 0 … b−1 and each row's keys in the text's order."""
    import numpy as np

    query, key = _earlier(tuple(att.tokens), tuple(att.special), start, stop)
    later = key + 1 < query  # induction: the key after an earlier occurrence, before the query
    lists = []
    for q, k in ((query[later], key[later] + 1), (query, key)):
        order = np.lexsort((k, q))  # by row, then key
        counts = np.bincount(q - start, minlength=stop - start)
        lists.append((np.r_[0, np.cumsum(counts)], k[order]))
    return lists


@lru_cache(maxsize=4)
def _occurrences(tokens: tuple[str, ...], special: tuple[bool, ...]) -> tuple[np.ndarray, ...]:
    """The text's content positions grouped by label, in order within each group: (positions,
    the first index of each one's group, its place in the group), once a text."""
    import numpy as np

    content = np.flatnonzero(~np.asarray(special, dtype=bool))
    ids = np.unique(np.array(tokens)[content], return_inverse=True)[1].reshape(-1)
    order = np.argsort(ids, kind="stable")  # by label, then position
    grouped, labels = content[order], ids[order]
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    first = np.repeat(starts, np.diff(np.r_[starts, len(labels)]))
    return grouped, first, np.arange(len(labels)) - first


def _earlier(
    tokens: tuple[str, ...], special: tuple[bool, ...], start: int, stop: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every (query, key) of non-special queries start … stop−1 and the earlier non-special
    occurrences of their token (equal labels, exactly): two (P,) arrays, the pairs a
    repeating text has, not a (queries × keys) mask."""
    import numpy as np

    grouped, first, rank = _occurrences(tokens, special)
    mine = np.flatnonzero((grouped >= start) & (grouped < stop) & (rank > 0))
    counts = rank[mine]
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    query = np.repeat(grouped[mine], counts)
    key = grouped[np.repeat(first[mine], counts) + offsets]
    return query, key


def repeat_means(sums: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, int]:
    """The repeat scores from their sums (2, L, H) and counts (2,): means, and the queries
    counted; zeros and 0 below MIN_REPEATS repeating queries."""
    import numpy as np

    if counts[0] < MIN_REPEATS:
        return np.zeros(sums.shape), 0
    return sums / counts[:, None, None], int(counts[0])


def repeated_random_tokens(
    vocabulary: np.ndarray, n_sequences: int, length: int, seed: int, bos: int | None
) -> np.ndarray:
    """The probe's inputs, (S, prefix + 2·length) token ids: BOS (when the model has one),
    then `length` tokens drawn uniformly from `vocabulary`, then the same tokens again."""
    import numpy as np

    rng = np.random.default_rng(seed)
    random = rng.choice(vocabulary, size=(n_sequences, length))  # (S, n)
    prefix = np.full((n_sequences, 0 if bos is None else 1), bos if bos is not None else 0)
    return np.concatenate([prefix, random, random], axis=1)


def probe_scores(weights: np.ndarray, length: int, prefix: int) -> np.ndarray:
    """Induction and duplicate-token scores of every head on one repeated sequence, (2, L, H).

    Recipe (as TransformerLens' head_detector): the sequence is [BOS] t_1 … t_n t_1 … t_n,
    `weights` its `[layer, head, query, key]` attention. A query i in the second repeat saw
    its token before, at i − n:

        induction   a[i − n + 1]   the token right after the earlier occurrence (what an
                                   induction head copies: "A B … A → B")
        duplicate   a[i − n]       the earlier occurrence itself

    Each is the mean over the n queries of the second repeat; random attention would give
    about 1 / i.
    """
    import numpy as np

    queries = np.arange(prefix + length, prefix + 2 * length)  # (n,) the second repeat
    induction = weights[:, :, queries, queries - length + 1].mean(axis=-1)  # (L, H)
    duplicate = weights[:, :, queries, queries - length].mean(axis=-1)  # (L, H)
    return np.stack([induction, duplicate])
