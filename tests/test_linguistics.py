"""Syntax and coreference heads on hand-made sentences whose answers are worked out by hand,
and the word-level encoding they rest on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import synthetic_attention

from attnviz.analysis.linguistics import LinguisticSums, linguistic_roles
from attnviz.analysis.transforms import word_view
from attnviz.core.extract import attend
from attnviz.core.tokens import encode, encode_words
from attnviz.core.treebank import Mention, TreebankSentence
from attnviz.errors import TextTooLongError


def sentence(words, heads=None, relations=None, mentions=()):
    n = len(words)
    return TreebankSentence(1, " ".join(words), tuple(words), (True,) * n,
                            heads, relations, tuple(mentions))  # fmt: skip


def word_attention(words, targets, cls_share=0.0):
    """A word view [CLS] w0 … wn-1 [SEP] with one head per entry of `targets`: query word i's
    row puts most of its weight on word targets[h][i] (1 − cls_share of it, the rest spread
    thinly), and cls_share on [CLS]."""
    n = len(words)
    w = n + 2
    weights = np.full((1, len(targets), w, w), 1.0 / w)
    for h, (target, share) in enumerate(zip(targets, cls_share)):
        for i, t in enumerate(target):
            row = np.full(w, 0.02 / w)
            row[0] += share
            for key, weight in t.items() if isinstance(t, dict) else {t: 1.0}.items():
                row[key + 1] += weight * (1 - share - 0.02)
            weights[0, h, i + 1] = row / row.sum()
    tokens = ("[CLS]", *words, "[SEP]")
    special = [True] + [False] * n + [True]
    return replace(synthetic_attention(weights, tokens, special), unit="word")


# "the cat sat on the mat": the→cat det, cat→sat nsubj, sat root, on→mat case, the→mat det,
# mat→sat obl.  "the big dog ran": the→dog det, big→dog amod, dog→ran nsubj, ran root.
CAT = sentence(["the", "cat", "sat", "on", "the", "mat"], (1, 2, -1, 5, 5, 2),
               ("det", "nsubj", "root", "case", "det", "obl"))  # fmt: skip
DOG = sentence(["the", "big", "dog", "ran"], (2, 2, 3, -1), ("det", "amod", "nsubj", "root"))


def heads_of(s):  # head 0: every word attends to its syntactic head (the root to itself)
    return [h if h >= 0 else i for i, h in enumerate(s.heads)]


def previous_of(s):  # head 1: every word attends to the word before it (the first to itself)
    return [max(i - 1, 0) for i in range(len(s.words))]


def test_syntax_both_directions_and_baselines():
    sums = LinguisticSums()
    for s in (CAT, DOG):
        # head 2 attends like head 0 but parks 90% on [CLS]: special tokens are no prediction
        att = word_attention(s.words, [heads_of(s), previous_of(s), heads_of(s)], [0, 0, 0.9])
        sums.add(att, s)
    result = sums.syntax(min_count=1)
    assert result.relations[:2] == ("det", "nsubj")  # most arcs first (3, 2)
    acc = {rel: result.accuracy[:, r, 0] for r, rel in enumerate(result.relations)}  # (2, H)
    assert list(result.arcs) == [3, 2, 1, 1, 1]
    # dependent → head: heads 0 and 2 always right; the previous-word head never
    for rel in result.relations:
        assert list(acc[rel][0]) == [1.0, 0.0, 1.0]
    # head → dependent for the previous-word head: det: cat←the ✓, mat←the ✓, dog←big ✗
    assert acc["det"][1, 1] == pytest.approx(2 / 3)
    assert acc["nsubj"][1, 1] == 1.0  # sat←cat ✓, ran←dog ✓
    assert acc["case"][1, 1] == 0.0 and acc["obl"][1, 1] == 0.0  # mat←the, sat←cat
    assert acc["det"][1, 0] == 0.0  # the head-finding head attends from a head to *its* head
    baseline = dict(zip(result.relations, zip(result.baseline_offset, result.baseline_accuracy)))
    assert baseline["det"] == (1, pytest.approx(2 / 3))  # offsets +1, +1, +2
    assert baseline["nsubj"] == (1, 1.0) and baseline["obl"] == (-3, 1.0)
    rows = {(r.relation, r.direction): r for r in result.table([0], [0, 1, 2])}
    det_down = rows[("det", "head-to-dependent")]
    assert (det_down.head, det_down.accuracy, det_down.baseline) == (1, pytest.approx(2 / 3), -1)
    assert rows[("det", "dependent-to-head")].head == 0  # the first of the tied best heads
    assert result.table([0], [1])[0].accuracy == 0.0  # best among the chosen heads only
    assert len(result.table([0], [0])) == 2 * 5
    assert [r.relation for r in result.table([0], [0]) if r.n >= 2] == ["det"] * 2 + ["nsubj"] * 2
    assert replace(result, min_count=2).counted() == [0, 1]

    roles = linguistic_roles(result, None, margin=0.1, min_count=1)
    assert "syntax:det" in roles[(0, 0)] and "syntax:det" not in roles.get((0, 1), [])
    assert "syntax:det:h2d" not in roles.get((0, 1), [])  # 2/3 does not beat 2/3 + 0.1
    assert "syntax:nsubj:h2d" not in roles.get((0, 1), [])  # 1.0 vs baseline 1.0


def test_coreference_earlier_words_and_nearest_mention_baseline():
    # "John met Mary and she greeted him": she → Mary, him → John.
    s = sentence(["John", "met", "Mary", "and", "she", "greeted", "him"], mentions=[
        Mention("e1", 0, 0, 0), Mention("e2", 2, 2, 2), Mention("e2", 4, 4, 4),
        Mention("e1", 6, 6, 6)])  # fmt: skip
    antecedent = [0, 0, 2, 3, 2, 5, 0]  # head 0: she → Mary, him → John
    previous = [0, 0, 1, 2, 3, 4, 5]  # head 1: she → and, him → greeted
    # head 2: she looks mostly *ahead* at him, him mostly at itself; among earlier words both
    # find their antecedent
    later = [0, 0, 2, 3, {6: 0.7, 2: 0.2}, 5, {6: 0.7, 0: 0.2}]
    sums = LinguisticSums()
    sums.add(word_attention(s.words, [antecedent, previous, later], [0, 0, 0]), s)
    result = sums.coreference()
    assert result.mentions == 2
    assert list(result.accuracy[0]) == [1.0, 0.0, 1.0]
    assert result.baseline_accuracy == 0.5  # she: nearest is Mary ✓; him: nearest is she ✗
    assert result.best([0], [1, 2]) == (0, 2, 1.0)
    assert sums.syntax(1) is None  # no syntax in this sentence
    roles = linguistic_roles(None, result, margin=0.2, min_count=2)
    assert roles == {(0, 0): ["coreference"], (0, 2): ["coreference"]}
    assert linguistic_roles(None, result, margin=0.2, min_count=3) == {}


def test_truncated_sentence_counts_only_kept_arcs():
    att = word_attention(CAT.words[:3], [heads_of(CAT)[:3]], [0])  # only the first 3 words
    sums = LinguisticSums()
    sums.add(att, CAT)
    result = sums.syntax(1)
    assert dict(zip(result.relations, result.arcs)) == {"det": 1, "nsubj": 1}


def test_encode_words_matches_running_text(loaded_tiny):
    words = ["The", "cat", "sat", "on", "the", "mat", "."]
    space_after = [True] * 5 + [False, True]
    text = "The cat sat on the mat."
    for arch in ("bert", "gpt2"):  # WordPiece; byte-level BPE, which needs the spaces
        loaded = loaded_tiny[arch]
        given = encode_words(loaded, words, space_after, text)
        assert given.ids == encode(loaded, text).ids
        view = word_view(attend(loaded, [given])[0])
        kept = [label for label, s in zip(view.tokens, view.special) if not s]
        assert kept == words and np.allclose(view.weights.sum(axis=-1), 1.0, atol=1e-5)


def test_encode_words_keeps_every_word_and_truncates(loaded_tiny):
    loaded = loaded_tiny["bert"]
    given = encode_words(loaded, ["a", "\u200b", "unbelievably"])
    assert given.word_labels == ("[CLS]", "a", "\u200b", "unbelievably", "[SEP]")
    assert "given as [UNK]" in given.notes[0]
    pieces = [t for t, w in zip(given.tokens, given.words) if w == 3]
    assert "".join(p.removeprefix("##") for p in pieces) == "unbelievably" and len(pieces) > 1
    long = ["word"] * 100
    with pytest.raises(TextTooLongError):
        encode_words(loaded, long)
    cut = encode_words(loaded, long, truncate=True)
    assert len(cut.ids) == loaded.info.max_tokens
    assert "(62 of 100 words)" in cut.notes[-1]
