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

Everything is vectorised over layers, heads and queries; a corpus is summed sentence by
sentence (`MetricSums`), so memory does not grow with its size.

Causal models also get two probes on repeated random tokens (`PROBES`, see
`probe_scores`): induction and duplicate-token.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.extract import Attention

METRICS = (
    "previous",
    "next",
    "self",
    "first",
    "separator",
    "punctuation",
    "local",
    "entropy",
    "entropy_norm",
    "distance",
    "confidence",
)
LOCAL_WINDOW = 2
PROBES = ("induction", "duplicate")

# Roles in the order they are tried; each is the metric that scores it and its threshold.
ROLE_METRICS = {
    "previous-token": "previous",
    "next-token": "next",
    "self": "self",
    "first-token sink": "first",
    "separator sink": "separator",
    "punctuation": "punctuation",
    "induction": "induction",
    "local": "local",
    "broad": "entropy_norm",
}
DEFAULT_THRESHOLDS = {
    "previous-token": 0.5,
    "next-token": 0.5,
    "self": 0.5,
    "first-token sink": 0.5,
    "separator sink": 0.5,
    "punctuation": 0.4,
    "induction": 0.4,
    "local": 0.7,
    "broad": 0.8,
}
THRESHOLD_NAMES = {
    "previous": "previous-token",
    "next": "next-token",
    "self": "self",
    "first": "first-token sink",
    "separator": "separator sink",
    "punctuation": "punctuation",
    "induction": "induction",
    "local": "local",
    "broad": "broad",
}
# One token does the job in these; `local` and `broad` are spread.
SPECIFIC_ROLES = tuple(r for r in ROLE_METRICS if r not in ("local", "broad"))


def is_punctuation(token: str) -> bool:
    """A token made only of punctuation characters (after word-piece markers are removed)."""
    text = token.removeprefix("##").strip()
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def sentence_sums(att: Attention) -> tuple[np.ndarray, np.ndarray]:
    """Per-head sums of every metric over this text's non-special queries, and their counts.

    Returns sums (M, L, H) and counts (M,) in the order of METRICS.
    """
    import numpy as np

    weights = att.weights.astype(np.float64)  # (L, H, T, T)
    n = weights.shape[-1]
    queries = np.flatnonzero(~att.special)  # (Q,)
    rows = weights[:, :, queries, :]  # (L, H, Q, T)
    positions = np.arange(n)
    offset = positions[None, :] - queries[:, None]  # (Q, T): j − i
    punct = np.array([is_punctuation(t) for t in att.tokens]) & ~att.special  # (T,)
    separators = att.special.copy()
    separators[0] = False
    if att.info.causal:
        visible = queries + 1  # (Q,) keys a causal query can see
    else:
        visible = np.full(len(queries), n)

    def mass(mask: np.ndarray) -> np.ndarray:  # Σ_j a[j] over a (Q, T) or (T,) mask -> (L, H)
        if mask.ndim == 1:
            return (rows @ mask.astype(np.float64)).sum(axis=-1)  # (L, H, Q) -> (L, H)
        return np.einsum("lhqt,qt->lh", rows, mask.astype(np.float64))

    def at_offset(k: int) -> tuple[np.ndarray, int]:
        keep = (queries + k >= 0) & (queries + k < n)
        picked = rows[:, :, keep, :][:, :, np.arange(keep.sum()), queries[keep] + k]  # (L, H, q)
        return picked.sum(axis=-1), int(keep.sum())

    previous, n_previous = at_offset(-1)
    following, n_next = at_offset(1)
    own, n_queries = at_offset(0)
    logs = np.log(np.where(rows > 0, rows, 1.0))
    entropy = -(rows * logs).sum(axis=-1)  # (L, H, Q)
    spread = visible > 1
    entropy_norm = (entropy[:, :, spread] / np.log(visible[spread])).sum(axis=-1)
    local_mask = (np.abs(offset) <= LOCAL_WINDOW) & ~att.special[None, :]

    sums = np.stack(
        [
            previous,
            following,
            own,
            rows[..., 0].sum(axis=-1),
            mass(separators),
            mass(punct),
            mass(local_mask),
            entropy.sum(axis=-1),
            entropy_norm,
            mass(np.abs(offset)),
            rows.max(axis=-1).sum(axis=-1),
        ]
    )  # (M, L, H)
    q = n_queries
    counts = np.array([n_previous, n_next, q, q, q, q, q, q, int(spread.sum()), q, q], dtype=float)
    return sums, counts


@dataclass
class MetricSums:
    """Running sums of the metrics over a corpus; add sentences one at a time."""

    sums: Any = None  # (M, L, H)
    counts: Any = None  # (M,)
    sentences: int = 0
    queries: int = 0

    def add(self, att: Attention) -> None:
        sums, counts = sentence_sums(att)
        if self.sums is None:
            self.sums, self.counts = sums, counts
        else:
            self.sums += sums
            self.counts += counts
        self.sentences += 1
        self.queries += int(counts[METRICS.index("self")])

    def means(self) -> np.ndarray:
        """Mean of each metric, (M, L, H); NaN where no query qualified."""
        import numpy as np

        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sums / self.counts[:, None, None]


@dataclass(frozen=True)
class HeadRole:
    """One head's role and the score (its metric's mean) that earned it; None for `mixed`."""

    layer: int
    head: int
    role: str
    score: float | None


@dataclass(frozen=True)
class Thresholds:
    """Minimum score for each role, in [0, 1]; a head gets the strongest role it clears."""

    values: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))

    @classmethod
    def parse(cls, items: list[str] | None) -> Thresholds:
        """From `name=value` strings such as `previous=0.6` (names: see THRESHOLD_NAMES)."""
        values = dict(DEFAULT_THRESHOLDS)
        for item in items or []:
            name, sep, raw = item.partition("=")
            role = THRESHOLD_NAMES.get(name.strip())
            if not sep or role is None:
                raise InputError(
                    f"--threshold {item}: expected NAME=VALUE with NAME one of "
                    f"{', '.join(THRESHOLD_NAMES)}"
                )
            try:
                value = float(raw)
            except ValueError:
                raise InputError(f"--threshold {item}: {raw!r} is not a number") from None
            if not 0.0 <= value <= 1.0:
                raise InputError(f"--threshold {item}: {value} is outside the valid range [0, 1]")
            values[role] = value
        return cls(values)


def assign_roles(
    means: np.ndarray, thresholds: Thresholds, probes: np.ndarray | None = None
) -> list[HeadRole]:
    """Give each head the specific role it clears by the widest margin (induction first),
    else local, else broad.

    `probes` (P, L, H) are the decoder probes' scores in the order of PROBES; without them
    (encoders) no head is an induction head. A head that clears none is `mixed`.
    """
    import numpy as np

    n_layers, n_heads = means.shape[1:]
    named = {m: means[i] for i, m in enumerate(METRICS)}
    if probes is not None:
        named.update({m: probes[i] for i, m in enumerate(PROBES)})
    scores = {
        role: np.nan_to_num(named[m]) if m in named else np.zeros((n_layers, n_heads))
        for role, m in ROLE_METRICS.items()
    }
    limit = thresholds.values
    roles = []
    for layer in range(n_layers):
        for head in range(n_heads):
            score = {role: float(values[layer, head]) for role, values in scores.items()}
            cleared = [r for r in SPECIFIC_ROLES if score[r] >= limit[r] and score[r] > 0]
            if "induction" in cleared:
                # A decoder head rests on its first token when its pattern finds nothing to
                # match, so on ordinary text an induction head looks like a sink; the probe
                # gives it the text it needs, and that is the role worth naming.
                best = "induction"
            elif cleared:
                best = max(cleared, key=lambda r: score[r] - limit[r])
            elif score["local"] >= limit["local"]:
                best = "local"
            elif score["broad"] >= limit["broad"]:
                best = "broad"
            else:
                roles.append(HeadRole(layer, head, "mixed", None))
                continue
            roles.append(HeadRole(layer, head, best, score[best]))
    return roles


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
