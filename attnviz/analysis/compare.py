"""Two attentions side by side: which tokens correspond, and how far each head's pattern moved.

Two texts (a minimal pair) or two models reading one text give two `Attention`s whose tokens
need not match one for one. `align` pairs them: token for token where both tokenisations
give the same word as the same tokens, whole words elsewhere (a word cut into other pieces,
or one word put for another: "is" for "are"). Words inserted or deleted on one side have no
partner; they are listed in `Alignment.unaligned_a` / `unaligned_b`, never dropped silently.

Each side's attention is then read over the aligned units (`project`: a unit's query row is
the mean of its tokens' rows, a unit's key column the sum of its tokens' columns, as
`transforms.word_view` merges pieces), and every row is renormalised over the aligned keys,
so that both rows are distributions over the same keys. A head's divergence is the
Jensen–Shannon divergence (natural log, nats: 0 for the same row, at most ln 2 ≈ 0.693)
between A's and B's row, averaged over every aligned query, special tokens included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.summary import Pattern, Target
from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention
    from attnviz.core.model_info import LoadedModel

UNIT = "nats"
AVERAGED = (
    "divergence: the Jensen–Shannon divergence (natural log, nats; 0 = the same pattern, at "
    "most ln 2 ≈ 0.693) between A's and B's row of each aligned query, each row renormalised "
    "over the aligned keys, averaged over every aligned query (special tokens included); "
    "role_change and special_share_change: B's score minus A's, each on its own text"
)


@dataclass(frozen=True)
class Unit:
    """One aligned position: the tokens it covers in A and in B, and how they were paired:
    `token` (the same token), `word` (the same word, cut into other pieces), `substituted`
    (one word put for another at the same place) or `shared` (a token two runs of words of
    unequal length both hold)."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    kind: str
    label: str  # A's token or word, `are→is` where B's differs


@dataclass(frozen=True)
class Alignment:
    """Which of A's tokens correspond to which of B's; what has no partner is listed."""

    units: tuple[Unit, ...]
    unaligned_a: tuple[int, ...]  # token positions in A with no partner in B
    unaligned_b: tuple[int, ...]

    def labels(self) -> list[str]:
        """Each unit's label: A's token or word, `are→is` where B's differs."""
        return [unit.label for unit in self.units]

    def note(self, a_tokens: Sequence[str], b_tokens: Sequence[str]) -> str | None:
        """One line naming what could not be aligned (None when everything was)."""
        sides = [
            f"{side} {' '.join(tokens[i] for i in missing)}"
            for side, tokens, missing in (
                ("only in A:", a_tokens, self.unaligned_a),
                ("only in B:", b_tokens, self.unaligned_b),
            )
            if missing
        ]
        if not sides:
            return None
        return "not aligned (left out of the divergence): " + "; ".join(sides)

    def as_dict(self, a_tokens: Sequence[str], b_tokens: Sequence[str]) -> dict[str, Any]:
        return {
            "units": [
                {"a": list(u.a), "b": list(u.b), "kind": u.kind, "label": u.label}
                for u in self.units
            ],
            "unaligned_a": [a_tokens[i] for i in self.unaligned_a],
            "unaligned_b": [b_tokens[i] for i in self.unaligned_b],
        }


def _word_tokens(att: Attention) -> list[list[int]]:
    """Each word's token positions, in order."""
    grouped: list[list[int]] = [[] for _ in att.word_labels]
    for position, word in enumerate(att.words):
        grouped[word].append(position)
    return grouped


def align(a: Attention, b: Attention) -> Alignment:
    """Pair A's tokens with B's: the words are matched in order (difflib's longest matching
    blocks); a matched word whose tokens are the same is paired token for token, otherwise as
    one unit; a run of words replaced by as many words is paired word for word (substituted);
    inside a run replaced by a run of another length, the tokens both runs share are paired
    (`_inside_run`); what is left (inserted or deleted words, the rest of such runs) is
    unaligned."""
    from difflib import SequenceMatcher

    words_a, words_b = _word_tokens(a), _word_tokens(b)
    matcher = SequenceMatcher(None, a.word_labels, b.word_labels, autojunk=False)
    found = _Found([], [], [])
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        run_a, run_b = list(range(i1, i2)), list(range(j1, j2))
        if tag == "equal" or (tag == "replace" and len(run_a) == len(run_b)):
            _word_for_word(a, b, words_a, words_b, run_a, run_b, tag == "equal", found)
        elif tag == "replace":
            _inside_run(a, b, words_a, words_b, run_a, run_b, found)
        else:
            found.only_a.extend(i for word in run_a for i in words_a[word])
            found.only_b.extend(j for word in run_b for j in words_b[word])
    if not found.units:
        raise InputError("the two texts have no word in common: nothing to compare")
    return Alignment(tuple(found.units), tuple(sorted(found.only_a)), tuple(sorted(found.only_b)))


@dataclass(frozen=True)
class _Found:
    """What `align` has paired so far, and what it left without a partner."""

    units: list[Unit]
    only_a: list[int]
    only_b: list[int]


def _word_for_word(a, b, words_a, words_b, run_a, run_b, equal: bool, found: _Found) -> None:
    """Two runs of as many words, paired in order: a matched word cut into the same tokens
    token for token, any other pair of words as one unit (the same word: `word`; two words:
    `substituted`)."""
    for word_a, word_b in zip(run_a, run_b):
        wa, wb = words_a[word_a], words_b[word_b]
        if equal and [a.tokens[i] for i in wa] == [b.tokens[j] for j in wb]:
            found.units.extend(Unit((i,), (j,), "token", a.tokens[i]) for i, j in zip(wa, wb))
            continue
        left, right = a.word_labels[word_a], b.word_labels[word_b]
        label = left if left == right else f"{left}→{right}"
        found.units.append(Unit(tuple(wa), tuple(wb), "word" if equal else "substituted", label))


def _inside_run(a, b, words_a, words_b, run_a, run_b, found: _Found) -> None:
    """A run of k words replaced by m ≠ k words: the tokens the two runs share (compared as
    --query compares them: case-insensitive, a word piece without its "##") are paired token
    for token, in order (`shared`: "cabinet" in "key cabinet" → "cabinets"); between two
    shared tokens, whole words on each side are paired word for word when there are as many on
    both (substituted). The rest has no partner."""
    from difflib import SequenceMatcher

    from attnviz.analysis.query import normal_form

    tokens_a = [i for word in run_a for i in words_a[word]]
    tokens_b = [j for word in run_b for j in words_b[word]]
    matcher = SequenceMatcher(
        None,
        [normal_form(a.tokens[i]) for i in tokens_a],
        [normal_form(b.tokens[j]) for j in tokens_b],
        autojunk=False,
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        gap_a, gap_b = tokens_a[i1:i2], tokens_b[j1:j2]
        if tag == "equal":
            for i, j in zip(gap_a, gap_b):
                left, right = a.tokens[i], b.tokens[j]
                label = left if left == right else f"{left}→{right}"
                found.units.append(Unit((i,), (j,), "shared", label))
            continue
        whole_a = [w for w in run_a if words_a[w] and set(words_a[w]) <= set(gap_a)]
        whole_b = [w for w in run_b if words_b[w] and set(words_b[w]) <= set(gap_b)]
        covered_a = sorted(i for w in whole_a for i in words_a[w]) == sorted(gap_a)
        covered_b = sorted(j for w in whole_b for j in words_b[w]) == sorted(gap_b)
        if whole_a and covered_a and covered_b and len(whole_a) == len(whole_b):
            _word_for_word(a, b, words_a, words_b, whole_a, whole_b, False, found)
        else:
            found.only_a.extend(gap_a)
            found.only_b.extend(gap_b)


def project(weights: np.ndarray, groups: Sequence[tuple[int, ...]]) -> np.ndarray:
    """`weights` (L, H, T, T) read over aligned units (L, H, U, U): a unit's row is the mean
    of its tokens' rows, its column the sum of its tokens' columns; each row is then
    renormalised over the aligned keys (a row with no weight on them is left at 0)."""
    import numpy as np

    member = np.zeros((weights.shape[-1], len(groups)))  # (T, U) one-hot token -> unit
    for unit, tokens in enumerate(groups):
        member[list(tokens), unit] = 1.0
    counts = member.sum(axis=0)  # (U,)
    to_units = weights.astype(np.float64) @ member  # (L, H, T, U)
    rows = (member.T @ to_units) / counts[:, None]  # (U, T) @ (L, H, T, U) -> (L, H, U, U)
    mass = rows.sum(axis=-1, keepdims=True)  # (L, H, U, 1)
    return rows / np.where(mass > 0, mass, 1.0)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen–Shannon divergence (natural log) between rows of `p` and `q` (..., K), summed
    over the last axis: ½ KL(p‖m) + ½ KL(q‖m) with m = ½ (p + q); 0 log 0 = 0. Exactly 0
    where the rows are equal, and exactly symmetric."""
    import numpy as np

    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_p = np.where(p > 0, p * np.log(p / m), 0.0).sum(axis=-1)
        kl_q = np.where(q > 0, q * np.log(q / m), 0.0).sum(axis=-1)
    return np.maximum(0.5 * (kl_p + kl_q), 0.0)  # rounding must not make it negative


@dataclass(frozen=True, eq=False)
class Compared:
    """One pair: both attentions, their alignment and how each head moved between them.

    `rows` (L, H, U) is the divergence of each aligned query (NaN where a side's row has no
    weight on the aligned keys); `divergence` (L, H) its mean over the queries that have one.
    `role_change` and `special_change` are B's score minus A's, each on its own text (None
    where a text cannot measure the role).

    A pair of long texts is compared a block of rows at a time (`compare_blocks`): `a` and
    `b` are then their maps pooled (`Attention.pooled` says how), `grids_a` and `grids_b` the
    unit grids pooled by `unit_size`, `texts` each side's tokens and facts (no map: 0 rows),
    `stats` each side's head sums and `kept` the exact rows of the units asked for (--query).
    """

    a: Attention
    b: Attention
    alignment: Alignment
    grids_a: np.ndarray  # (L, H, U, U) A over the aligned units, rows renormalised
    grids_b: np.ndarray
    rows: np.ndarray  # (L, H, U)
    divergence: np.ndarray  # (L, H)
    role_change: dict[str, np.ndarray | None]
    special_change: np.ndarray  # (L, H)
    unit_size: int = 1  # aligned units a cell of grids_a and grids_b spans along each axis
    texts: tuple[Attention, Attention] | None = None  # compared in blocks: tokens and facts
    stats: tuple[Any, Any] | None = None  # compared in blocks: each side's summary.HeadStats
    kept: dict[int, tuple[np.ndarray, np.ndarray]] | None = None  # unit -> rows (L, H, U)

    @property
    def labels(self) -> list[str]:
        return self.alignment.labels()

    @property
    def tokens(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A's and B's tokens (a pooled view's are its blocks' first tokens)."""
        a, b = self.texts or (self.a, self.b)
        return a.tokens, b.tokens

    def grid_labels(self) -> list[str]:
        """The labels of grids_a's rows and columns: each cell's first unit."""
        return self.labels[:: self.unit_size]

    def unit_rows(self, unit: int) -> tuple[np.ndarray, np.ndarray]:
        """A's and B's row of `unit` over the aligned keys, (L, H, U) each."""
        if self.unit_size == 1:
            return self.grids_a[:, :, unit], self.grids_b[:, :, unit]
        if self.kept is None or unit not in self.kept:
            raise InputError(f"unit {unit}'s rows were not kept: give it with --query")
        return self.kept[unit]

    def unit_of(self, index: int) -> int:
        """The aligned unit holding A's token `index` (refusing one with no partner)."""
        for position, unit in enumerate(self.alignment.units):
            if index in unit.a:
                return position
        raise InputError(
            f"“{self.tokens[0][index]}” (position {index}) has no partner in B; pick a token "
            "both texts share"
        )


def compare_pair(a: Attention, b: Attention) -> Compared:
    """How every head moved from `a` to `b` (same model shape, same layers held)."""
    import numpy as np

    from attnviz.analysis.contributions import shares
    from attnviz.analysis.summary import role_scores

    if a.weights.shape[:2] != b.weights.shape[:2] or a.held_layers() != b.held_layers():
        raise InputError(
            f"the two attentions hold different heads ({a.weights.shape[0]}×"
            f"{a.weights.shape[1]} and {b.weights.shape[0]}×{b.weights.shape[1]} layers × "
            "heads): compare needs models of the same shape"
        )
    alignment = align(a, b)
    grids_a = project(a.weights, [u.a for u in alignment.units])  # (L, H, U, U)
    grids_b = project(b.weights, [u.b for u in alignment.units])
    rows = js_divergence(grids_a, grids_b)  # (L, H, U)
    defined = (grids_a.sum(-1) > 0) & (grids_b.sum(-1) > 0)  # rows with weight on aligned keys
    rows = np.where(defined, rows, np.nan)
    counted = defined.sum(axis=-1)  # (L, H)
    divergence = np.where(defined, rows, 0.0).sum(axis=-1) / np.maximum(counted, 1)
    ranked_a, ranked_b = shares(a), shares(b)  # a norm's rows as shares, as `show` ranks them
    role_change = changes(role_scores(ranked_a), role_scores(ranked_b))
    special = _special_share(ranked_b) - _special_share(ranked_a)
    return Compared(a, b, alignment, grids_a, grids_b, rows, divergence, role_change, special)


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Each role's score on B minus its score on A, (L, H); None where either text cannot
    measure it."""
    return {
        name: None if before[name] is None or after[name] is None else after[name] - before[name]
        for name in before
    }


def _special_share(att: Attention) -> np.ndarray:
    """`show`'s special_share of every head, (L, H)."""
    from attnviz.analysis.summary import special_shares

    return special_shares(att.weights, ~att.special, att.key_special)


@dataclass(frozen=True, eq=False)
class Comparison:
    """Every pair compared, and the per-head means over the pairs: `divergence` (L, H) in
    nats, `role_change` and `special_change` (B − A). With one pair, `a`, `b` and
    `alignment` are its own."""

    pairs: tuple[Compared, ...]
    divergence: np.ndarray  # (L, H)
    role_change: dict[str, np.ndarray | None]
    special_change: np.ndarray  # (L, H)

    @property
    def a(self) -> Attention:
        return self.pairs[0].a

    @property
    def b(self) -> Attention:
        return self.pairs[0].b

    @property
    def alignment(self) -> Alignment:
        return self.pairs[0].alignment

    @property
    def layers(self) -> list[int]:
        return self.a.held_layers()

    def moved(self, n: int) -> list[tuple[int, int, float]]:
        """The `n` heads whose pattern moved most: (layer, head, divergence), largest first;
        a head that did not move at all (0) is not listed."""
        import numpy as np

        order = np.argsort(-self.divergence, axis=None, kind="stable")[:n]
        slots = [np.unravel_index(int(i), self.divergence.shape) for i in order]
        return [
            (self.layers[int(s)], int(h), float(self.divergence[s, h]))
            for s, h in slots
            if self.divergence[s, h] > 0
        ]

    def as_dict(self) -> dict[str, Any]:
        def grid(values: np.ndarray | None) -> list | None:
            return None if values is None else values.round(8).tolist()

        return {
            "unit": UNIT,
            "averaged": AVERAGED,
            "layers": self.layers,
            "n_pairs": len(self.pairs),
            "divergence": self.divergence.tolist(),
            "role_change": {name: grid(v) for name, v in self.role_change.items()},
            "special_share_change": grid(self.special_change),
            "pairs": [
                {
                    "a": p.a.text,
                    "b": p.b.text,
                    "tokens_a": list(p.tokens[0]),
                    "tokens_b": list(p.tokens[1]),
                    "alignment": p.alignment.as_dict(*p.tokens),
                    "divergence": p.divergence.tolist(),
                }
                for p in self.pairs
            ],
        }


def compare_pairs(pairs: Sequence[tuple[Attention, Attention]]) -> Comparison:
    """Each (A, B) pair compared, and the per-head means over the pairs (a role's change is
    averaged over the pairs where both texts measure it; None where none does)."""
    if not pairs:
        raise InputError("no pairs to compare")
    return combine([compare_pair(a, b) for a, b in pairs])


def combine(compared: Sequence[Compared]) -> Comparison:
    """Pairs already compared (held whole, or in blocks: `compare_blocks`), and the per-head
    means over them."""
    import numpy as np

    found = tuple(compared)
    roles: dict[str, np.ndarray | None] = {}
    for name in found[0].role_change:
        measured = [p.role_change[name] for p in found if p.role_change[name] is not None]
        roles[name] = np.mean(measured, axis=0) if measured else None
    return Comparison(
        found,
        np.mean([p.divergence for p in found], axis=0),
        roles,
        np.mean([p.special_change for p in found], axis=0),
    )


@dataclass(frozen=True)
class Moved:
    """A head that moved, with the keys it attends to most in A and in B (on the pair where
    it moved most: `pair`, counted from 0)."""

    layer: int
    head: int
    divergence: float  # the mean over the pairs
    pair: int
    top_a: tuple[Target, ...]
    top_b: tuple[Target, ...]
    pattern_a: Pattern  # what `show` calls the head's pattern on A's text
    pattern_b: Pattern

    def as_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "divergence": self.divergence,
            "pair": self.pair,
            "pattern_a": self.pattern_a.role,
            "pattern_b": self.pattern_b.role,
            "top_a": [t.__dict__ for t in self.top_a],
            "top_b": [t.__dict__ for t in self.top_b],
        }


def moved_heads(comparison: Comparison, n: int, top_k: int = 3) -> list[Moved]:
    """The `n` heads that moved most, each with its top keys in A and in B (`summary`'s key
    means: over the non-special queries that see each key)."""
    from attnviz.analysis.contributions import shares
    from attnviz.analysis.summary import summarise

    found = []
    for layer, head, value in comparison.moved(n):
        slot = comparison.layers.index(layer)
        pair = max(range(len(comparison.pairs)),
                   key=lambda i: comparison.pairs[i].divergence[slot, head])  # fmt: skip
        chosen = comparison.pairs[pair]
        if chosen.stats is not None:  # compared in blocks: the sums of each side's rows
            (in_a, in_b) = (summarise(stats.att, [layer], [head], top_k, stats=stats)[0]
                            for stats in chosen.stats)  # fmt: skip
        else:
            (in_a,) = summarise(shares(chosen.a), [layer], [head], top_k)
            (in_b,) = summarise(shares(chosen.b), [layer], [head], top_k)
        found.append(
            Moved(layer, head, value, pair, in_a.top, in_b.top, in_a.pattern, in_b.pattern)
        )
    return found


@dataclass(frozen=True, eq=False)
class QueryMoves:
    """One aligned query: its divergence in every head (L, H), and its top aligned keys in A
    and in B per head (rows renormalised over the aligned keys).

    Over several pairs (`follow_query` on a file of pairs), `divergence` is the mean over the
    pairs in `counted` (those whose text A has the token, with a partner in B), `pair` (L, H)
    the pair each head's top keys come from (where that head's row moved most), and
    `skipped` the pairs left out; all counted from 0."""

    unit: int
    label: str
    divergence: np.ndarray  # (L, H)
    top_a: dict[tuple[int, int], tuple[Target, ...]]
    top_b: dict[tuple[int, int], tuple[Target, ...]]
    pair: np.ndarray | None = None  # (L, H) int, over several pairs
    counted: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()

    def as_dict(self, layers: Sequence[int]) -> dict[str, Any]:
        several = self.pair is not None
        return {
            "unit": self.unit,
            "label": self.label,
            "divergence": self.divergence.tolist(),
            **(
                {
                    "pairs_counted": [n + 1 for n in self.counted],
                    "pairs_left_out": [n + 1 for n in self.skipped],
                }
                if several
                else {}
            ),  # fmt: skip
            "heads": [
                {
                    "layer": layer,
                    "head": head,
                    **({"pair": int(self.pair[slot, head]) + 1} if several else {}),
                    "top_a": [t.__dict__ for t in self.top_a[(layer, head)]],
                    "top_b": [t.__dict__ for t in self.top_b[(layer, head)]],
                }
                for slot, layer in enumerate(layers)
                for head in range(self.divergence.shape[1])
            ],
        }


def query_moves(compared: Compared, index: int, top_k: int = 3) -> QueryMoves:
    """How A's token `index` (aligned in B) moved in every head: its row's divergence and
    top aligned keys on each side."""
    import numpy as np

    unit = compared.unit_of(index)
    labels = compared.labels
    layers = compared.a.held_layers()
    top: list[dict[tuple[int, int], tuple[Target, ...]]] = [{}, {}]
    for grids, into in zip(compared.unit_rows(unit), top):
        for slot, layer in enumerate(layers):
            for head in range(grids.shape[1]):
                row = grids[slot, head]  # (U,) over aligned keys
                order = np.argsort(-row, kind="stable")[:top_k]
                into[(layer, head)] = tuple(Target(int(k), labels[k], float(row[k])) for k in order)
    divergence = np.nan_to_num(compared.rows[:, :, unit])  # a row without aligned weight: 0
    return QueryMoves(unit, labels[unit], divergence, top[0], top[1])


def follow_query(comparison: Comparison, query: str, top_k: int = 3) -> QueryMoves:
    """`--query`: the token `query` names in text A ("are", "are#2" or a position, as
    `show --query` reads it) followed into B. With one pair, its row in every head (refusing a
    token A lacks, or one with no partner in B). With several, the same token in every pair
    whose A has it with a partner: each head's divergence is the mean over those pairs, its
    top keys are those of the pair where its row moved most, and the other pairs are listed
    (refused only when no pair has it)."""
    import numpy as np

    from attnviz.analysis.query import find_query

    if len(comparison.pairs) == 1:
        pair = comparison.pairs[0]
        return query_moves(pair, find_query(_text_a(pair), query), top_k)
    found: list[tuple[int, QueryMoves]] = []
    skipped = []
    for number, pair in enumerate(comparison.pairs):
        try:
            found.append((number, query_moves(pair, find_query(_text_a(pair), query), top_k)))
        except InputError:  # not in this A, or no partner in this B
            skipped.append(number)
    if not found:
        raise InputError(
            f"no pair's text A has '{query}' with a partner in its text B; --query takes a "
            'token of A ("are", "are#2" or a position)'
        )
    moved = np.stack([asked.divergence for _, asked in found])  # (P, L, H)
    best = moved.argmax(axis=0)  # (L, H): where each head's row moved most
    layers = comparison.layers
    top_a, top_b = {}, {}
    for slot, layer in enumerate(layers):
        for head in range(moved.shape[2]):
            asked = found[int(best[slot, head])][1]
            top_a[(layer, head)] = asked.top_a[(layer, head)]
            top_b[(layer, head)] = asked.top_b[(layer, head)]
    labels = {asked.label for _, asked in found}
    label = labels.pop() if len(labels) == 1 else query
    pairs = np.array([number for number, _ in found])[best]  # (L, H)
    counted = tuple(number for number, _ in found)
    return QueryMoves(found[0][1].unit, label, moved.mean(axis=0), top_a, top_b, pairs,
                      counted, tuple(skipped))  # fmt: skip


def _text_a(pair: Compared) -> Attention:
    """Text A as read, with its tokens (not a pooled view's blocks)."""
    return pair.texts[0] if pair.texts is not None else pair.a


def refuse_models(a: LoadedModel, b: LoadedModel, words: bool) -> None:
    """Refuse two models that cannot be compared head by head, or token by token (that each
    has one attention stack is `pipelines.features`' to say)."""
    shape_a, shape_b = (a.info.n_layers, a.info.n_heads), (b.info.n_layers, b.info.n_heads)
    if shape_a != shape_b:
        raise InputError(
            f"{a.info.name} has {shape_a[0]} layers × {shape_a[1]} heads and {b.info.name} "
            f"{shape_b[0]} × {shape_b[1]}: compare needs models of the same shape"
        )
    if b is a or words or a.info.pictures:  # a picture's tokens are grid positions
        return
    same = type(a.tokenizer) is type(b.tokenizer) and (
        a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    )
    if not same:
        raise InputError(
            f"{a.info.name} and {b.info.name} have different tokenizers, so their tokens do "
            "not correspond: compare them by words with --words"
        )


class TwoRows:
    """A recorder for `capture.run`: each chosen layer's probabilities of batch rows 0 and 1
    (one text read twice, as `ablation.ablated_pass` reads it: as it is, then with heads
    removed), cropped to its `n` tokens."""

    def __init__(self, layers: Sequence[int], n: int) -> None:
        self.wants = {layer: ("probs",) for layer in layers}
        self.layers, self.n = list(layers), n
        self.held: dict[int, Any] = {}

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        n = self.n
        self.held[layer] = tensors["probs"][:2, :, :n, :n].float().numpy()  # (2, H, n, n)

    def weights(self, row: int) -> np.ndarray:
        """Batch row `row`'s attention over the chosen layers, (L, H, n, n)."""
        import numpy as np

        return np.stack([self.held[layer][row] for layer in self.layers])


def ablation_divergence(
    att: Attention, rows: TwoRows, removed: Sequence[tuple[int, int]]
) -> np.ndarray:
    """How far each head's pattern moved when `removed` heads were taken out: the
    divergence of `compare_pair` between the text as it is (row 0 of `rows`) and without
    them (row 1), (L, H) over `rows`' layers; the removed heads themselves are NaN."""
    from dataclasses import replace

    import numpy as np

    as_it_is = replace(att, weights=rows.weights(0), layers=tuple(rows.layers), unit="token",
                       measure="weights", per_layer=False)  # fmt: skip
    without = replace(as_it_is, weights=rows.weights(1))
    divergence = compare_pair(as_it_is, without).divergence.copy()
    for layer, head in removed:
        if layer in rows.layers:
            divergence[rows.layers.index(layer), head] = np.nan
    return divergence
