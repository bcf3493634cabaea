"""Attention transforms: the same attention at another grain (word pieces merged into words,
special tokens hidden), each a pure function Attention -> Attention whose rows still sum to 1.

Each transform is one `Transform` in TRANSFORMS: its name is its command-line flag (`--words`,
`--hide-special`), its help the flag's help. Adding one is one function and one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from attnviz.core.attention import Attention
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
    rows. Rows still sum to 1.
    """
    import numpy as np

    if att.unit == "word":
        return att
    groups = np.array(att.words)
    n_words = len(att.word_labels)
    member = np.zeros((len(groups), n_words))  # (T, W) one-hot token -> word
    member[np.arange(len(groups)), groups] = 1.0
    counts = member.sum(axis=0)  # (W,)
    to_words = att.weights.astype(np.float64) @ member  # (L, H, T, W)
    merged = (member.T @ to_words) / counts[:, None]  # (W, T) @ (L, H, T, W) -> (L, H, W, W)
    special = np.array([att.special[groups == w].all() for w in range(n_words)])
    segments = None
    if att.segments is not None:
        segments = tuple(att.segments[int(np.argmax(groups == w))] for w in range(n_words))
    return replace(
        att,
        tokens=att.word_labels,
        special=special,
        weights=merged.astype(np.float32),
        unit="word",
        words=tuple(range(n_words)),
        segments=segments,
        notes=att.notes + ("word view: pieces merged into words",),
    )


def hide_special(att: Attention) -> Attention:
    """Drop special tokens ([CLS], [SEP], BOS…) as queries and keys, renormalising each row."""
    import numpy as np

    keep = ~att.special
    if keep.all():
        return replace(att, notes=att.notes + ("no special tokens to hide",))
    if not keep.any():
        raise InputError("the text has only special tokens; nothing is left once they are hidden")
    weights = att.weights[:, :, keep][:, :, :, keep].astype(np.float64)  # (L, H, t, t)
    kept_share = weights.sum(axis=-1, keepdims=True)  # (L, H, t, 1)
    weights = weights / np.where(kept_share > 0, kept_share, 1.0)
    removed = 1.0 - float(kept_share.mean())
    kept_words = [w for w, k in zip(att.words, keep) if k]
    return replace(
        att,
        tokens=tuple(t for t, k in zip(att.tokens, keep) if k),
        special=att.special[keep],
        weights=weights.astype(np.float32),
        words=tuple(sorted(set(kept_words)).index(w) for w in kept_words),
        word_labels=tuple(att.word_labels[w] for w in sorted(set(kept_words))),
        hidden_special=True,
        segments=None
        if att.segments is None
        else tuple(s for s, k in zip(att.segments, keep) if k),
        notes=att.notes
        + (
            f"special tokens hidden ({int((~keep).sum())} of {len(keep)}); they held "
            f"{removed:.0%} of attention on average, and each row was renormalised",
        ),
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
