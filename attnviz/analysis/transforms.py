"""Attention transforms: the same attention at another grain (word pieces merged into words,
special tokens hidden), each a pure function Attention -> Attention whose rows still sum to 1.

Each transform is one `Transform` in TRANSFORMS: its name is its command-line flag (`--words`,
`--hide-special`), its help the flag's help. Adding one is one function and one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from attnviz.core.attention import Attention, Keys
from attnviz.errors import InputError


@dataclass(frozen=True)
class Transform:
    """One transform of attention: its flag's name and help, and the function that makes it."""

    name: str
    help: str
    apply: Callable[[Attention], Attention]


def transform(att: Attention, words: bool = False, hide_special_tokens: bool = False) -> Attention:
    """The transforms a command asks for: word pieces merged first, then special tokens hidden."""
    for name, wanted in (("words", words), ("hide-special", hide_special_tokens)):
        if wanted:
            att = TRANSFORMS[name].apply(att)
    return att


def word_view(att: Attention) -> Attention:
    """Merge word pieces into words.

    Attention *to* a word sums over its pieces; attention *from* a word averages its pieces'
    rows. Rows still sum to 1. In cross-attention the target's words are the queries and the
    source's the keys.
    """
    import numpy as np

    if att.unit == "word":
        return att

    def members(words: tuple[int, ...], n_words: int) -> np.ndarray:
        member = np.zeros((len(words), n_words))  # (T, W) one-hot token -> word
        member[np.arange(len(words)), list(words)] = 1.0
        return member

    def special_words(words: tuple[int, ...], special: np.ndarray, n_words: int) -> np.ndarray:
        groups = np.array(words)
        return np.array([special[groups == w].all() for w in range(n_words)])

    n_words = len(att.word_labels)
    member = members(att.words, n_words)  # (T, W)
    key_member, keys = member, None
    if att.keys is not None:
        n_source = len(att.keys.word_labels)
        key_member = members(att.keys.words, n_source)  # (S, W_s)
        keys = Keys(
            att.keys.text,
            att.keys.word_labels,
            special_words(att.keys.words, att.keys.special, n_source),
            tuple(range(n_source)),
            att.keys.word_labels,
        )
    counts = member.sum(axis=0)  # (W,)
    n_layers, n_heads = att.weights.shape[:2]
    merged = np.empty((n_layers, n_heads, n_words, key_member.shape[1]), np.float32)
    for slot, layer in enumerate(att.weights):  # a layer at a time, in float64
        to_words = layer.astype(np.float64) @ key_member  # (H, T, W_s)
        merged[slot] = (member.T @ to_words) / counts[:, None]  # (W, T) @ (H, T, W_s): (H, W, W_s)
    groups = np.array(att.words)
    segments = None
    if att.segments is not None:
        segments = tuple(att.segments[int(np.argmax(groups == w))] for w in range(n_words))
    return replace(
        att,
        tokens=att.word_labels,
        special=special_words(att.words, att.special, n_words),
        weights=merged,
        unit="word",
        words=tuple(range(n_words)),
        segments=segments,
        keys=keys,
        notes=att.notes + ("word view: pieces merged into words",),
        continuation=_word_continuation(att),
    )


def _word_continuation(att: Attention) -> Any:
    """A continuation in words: it starts at its first token's word (a word of its own, see
    `generation`), and a word's probability is the product of its tokens' (chain rule)."""
    c = att.continuation
    if c is None:
        return None
    probs: dict[int, float] = {}
    for i, prob in enumerate(c.probs):
        word = att.words[c.start + i]
        probs[word] = probs.get(word, 1.0) * prob
    return replace(c, start=att.words[c.start], probs=tuple(probs[w] for w in sorted(probs)))


def _kept_continuation(att: Attention, keep: Any) -> Any:
    """A continuation without its hidden (special) tokens: an end-of-text token is one."""
    c = att.continuation
    if c is None:
        return None
    kept = [p for i, p in enumerate(c.probs) if keep[c.start + i]]
    return replace(c, start=int(keep[: c.start].sum()), probs=tuple(kept))


def hide_special(att: Attention) -> Attention:
    """Drop special tokens ([CLS], [SEP], BOS…) as queries and keys, renormalising each row."""
    import numpy as np

    keep, keep_keys = ~att.special, ~att.key_special
    if keep.all() and keep_keys.all():
        return replace(att, notes=att.notes + ("no special tokens to hide",))
    if not keep.any() or not keep_keys.any():
        raise InputError("the text has only special tokens; nothing is left once they are hidden")
    n_layers, n_heads = att.weights.shape[:2]
    weights = np.empty((n_layers, n_heads, int(keep.sum()), int(keep_keys.sum())), np.float32)
    kept_share = np.empty((*weights.shape[:3], 1))  # (L, H, t, 1)
    kept_rows = np.ix_(range(n_heads), np.flatnonzero(keep), np.flatnonzero(keep_keys))
    for slot, layer in enumerate(att.weights):  # a layer at a time, in float64
        rows = layer[kept_rows].astype(np.float64)  # (H, t, s)
        kept_share[slot] = rows.sum(axis=-1, keepdims=True)
        rows /= np.where(kept_share[slot] > 0, kept_share[slot], 1.0)
        weights[slot] = rows
    held = ""  # what they held: nothing to say of labels without weights (`check_query`)
    if kept_share.size:
        held = (
            f"; they held {1.0 - float(kept_share.mean()):.0%} of attention on average, and "
            "each row was renormalised"
        )

    def kept(tokens, special, words, word_labels, keep):
        kept_words = [w for w, k in zip(words, keep) if k]
        distinct = sorted(set(kept_words))
        return (
            tuple(t for t, k in zip(tokens, keep) if k),
            special[keep],
            tuple(distinct.index(w) for w in kept_words),
            tuple(word_labels[w] for w in distinct),
        )

    tokens, special, words, word_labels = kept(
        att.tokens, att.special, att.words, att.word_labels, keep
    )
    keys = None
    if att.keys is not None:
        source = att.keys
        keys = Keys(source.text, *kept(source.tokens, source.special, source.words,
                                       source.word_labels, keep_keys))  # fmt: skip
    hidden = int((~keep).sum()) + (int((~keep_keys).sum()) if keys is not None else 0)
    total = len(keep) + (len(keep_keys) if keys is not None else 0)
    return replace(
        att,
        tokens=tokens,
        special=special,
        weights=weights,
        words=words,
        word_labels=word_labels,
        keys=keys,
        hidden_special=True,
        segments=None
        if att.segments is None
        else tuple(s for s, k in zip(att.segments, keep) if k),
        notes=att.notes + (f"special tokens hidden ({hidden} of {total}){held}",),
        continuation=_kept_continuation(att, keep),
    )


TRANSFORMS = {
    t.name: t
    for t in (
        Transform(
            "words", "Merge word pieces into words (to-word sums, from-word averages).", word_view
        ),
        Transform(
            "hide-special", "Hide [CLS]/[SEP]/BOS tokens and renormalise each row.", hide_special
        ),
    )
}
