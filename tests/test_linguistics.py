"""Syntax and coreference heads on hand-made sentences whose answers are worked out by hand,
and the word-level encoding they rest on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import synthetic_attention

from attnviz.analysis.linguistics import DIRECTIONS, LinguisticSums, linguistic_roles
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
    assert list(result.arcs) == [3, 2, 1, 1, 1] and result.arcs.dtype.kind == "i"  # "case (1)"
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

    # margin 0: equal to the baseline is enough (nsubj head → dependent: 1.0 and 1.0)
    assert "syntax:nsubj:h2d" in linguistic_roles(result, None, margin=0.0, min_count=1)[(0, 1)]
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
    # 1.0 ≥ 0.5 + 0.5 exactly: heads 0 and 2 still count; head 1 (0.0) never does
    assert linguistic_roles(None, result, margin=0.5, min_count=2) == roles
    assert linguistic_roles(None, result, margin=0.6, min_count=2) == {}


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


def test_result_and_its_json_worked_out_by_hand():
    """`result` gathers syntax, coreference, roles and notes; `as_dict` is what
    linguistics.json holds. Every figure below is worked out by hand from the two syntax
    sentences of the first test and the coreference sentence of the second."""
    from attnviz.core.treebank import Treebank

    sums = LinguisticSums()
    for s in (CAT, DOG):
        sums.add(
            word_attention(s.words, [heads_of(s), previous_of(s), heads_of(s)], [0, 0, 0.9]), s
        )
    coref = sentence(["John", "met", "Mary", "and", "she", "greeted", "him"], mentions=[
        Mention("e1", 0, 0, 0), Mention("e2", 2, 2, 2), Mention("e2", 4, 4, 4),
        Mention("e1", 6, 6, 6)])  # fmt: skip
    heads = [[0, 0, 2, 3, 2, 5, 0], [0, 0, 1, 2, 3, 4, 5], [0, 0, 2, 3, 2, 5, 0]]
    sums.add(word_attention(coref.words, heads, [0, 0, 0]), coref)
    assert sums.sentences == 3
    treebank = Treebank((), "hand-made", True, True, ("from the treebank",))
    result = sums.result(treebank, min_count=2, margin=0.1, notes=("from the run",))
    assert (result.has_syntax, result.has_coreference) == (True, True)
    assert result.notes == ("from the treebank", "from the run")
    assert (result.min_count, result.margin) == (2, 0.1)
    assert set(result.examples) == {"det", "nsubj", "case", "obl", "amod"}
    # det (3 arcs, baseline 2/3): heads 0 and 2 score 1.0 ≥ 2/3 + 0.1; nsubj's baseline is 1.0;
    # coreference (2 mentions, baseline 0.5): heads 0 and 2 score 1.0
    assert result.roles == {(0, 0): ["syntax:det", "coreference"],
                            (0, 2): ["syntax:det", "coreference"]}  # fmt: skip

    data = result.as_dict([0], [0, 1])
    assert (data["min_count"], data["margin"]) == (2, 0.1)
    assert data["notes"] == ["from the treebank", "from the run"]
    syntax = data["syntax"]
    assert (syntax["min_count"], syntax["directions"]) == (2, list(DIRECTIONS))
    rows = [(r["relation"], r["direction"][:4], r["head"], round(r["accuracy"], 6), r["n"],
             r["baseline"], round(r["baseline_accuracy"], 6)) for r in syntax["table"]]  # fmt: skip
    assert rows == [
        ("det", "depe", 0, 1.0, 3, 1, 0.666667),
        ("det", "head", 1, 0.666667, 3, -1, 0.666667),
        ("nsubj", "depe", 0, 1.0, 2, 1, 1.0),
        ("nsubj", "head", 1, 1.0, 2, -1, 1.0),
    ]
    assert {r["layer"] for r in syntax["table"]} == {0}
    assert all(type(r["baseline"]) is int for r in syntax["table"])  # JSON: 1, not 1.0
    det, nsubj, obl = (syntax["relations"][name] for name in ("det", "nsubj", "obl"))
    assert det == {
        "n": 3, "in_table": True, "baseline_offset": 1, "baseline_accuracy": pytest.approx(2 / 3),
        "dependent-to-head": [[1.0, 0.0, 1.0]], "head-to-dependent": [[0.0, 0.666667, 0.0]],
    }  # fmt: skip
    assert nsubj["head-to-dependent"] == [[0.0, 1.0, 0.0]] and nsubj["in_table"]
    assert (obl["n"], obl["in_table"], obl["baseline_offset"]) == (1, False, -3)
    assert data["coreference"] == {
        "mentions": 2, "baseline": "nearest earlier mention", "baseline_accuracy": 0.5,
        "best": {"layer": 0, "head": 0, "accuracy": 1.0}, "accuracy": [[1.0, 0.0, 1.0]],
    }  # fmt: skip
    empty = LinguisticSums().result(replace(treebank, has_syntax=False), 1, 0.1)
    assert (
        empty.as_dict([0], [0])["syntax"] is None and empty.as_dict([0], [0])["coreference"] is None
    )
    assert empty.roles == {} and not empty.has_syntax and empty.notes == ("from the treebank",)


def test_arcs_at_the_edges_of_a_sentence_and_of_its_kept_words():
    """An arc to the first word counts; an arc from or to a word cut off does not."""
    sums = LinguisticSums()
    run = sentence(["run", "fast", "now"], (-1, 0, 0), ("root", "advmod", "advmod"))
    sums.add(word_attention(run.words, [[0, 0, 0]], [0]), run)  # every word attends to "run"
    five = word_attention(CAT.words[:5], [heads_of(CAT)[:2] + [2, 3, 4]], [0])
    sums.add(five, CAT)  # on(3) → mat(5) and the(4) → mat(5): mat was cut off
    cut = sentence(["a", "b", "c"], (1, -1, 1), ("x", "root", "y"))
    sums.add(word_attention(["a", "b"], [[1, 1]], [0]), cut)  # c(2) → b(1): c was cut off
    result = sums.syntax(1)
    assert dict(zip(result.relations, result.arcs)) == {"advmod": 2, "det": 1, "nsubj": 1, "x": 1}
    assert result.accuracy[0, result.relations.index("advmod"), 0, 0] == 1.0


def test_examples_are_sentences_of_at_most_25_words():
    def chain(n):  # word i's head is word i + 1; the last word is the root
        return sentence([f"w{i}" for i in range(n)], tuple(range(1, n)) + (-1,),
                        ("dep",) * (n - 1) + ("root",))  # fmt: skip

    sums = LinguisticSums()
    long = chain(26)
    sums.add(word_attention(long.words, [heads_of(long)], [0]), long)
    assert sums.examples == {}
    short = chain(25)
    att = word_attention(short.words, [heads_of(short)], [0])
    sums.add(att, short)
    assert set(sums.examples) == {"dep"} and sums.examples["dep"][1] is short
    assert sums.examples["dep"][0] is att


def test_baseline_offset_is_the_most_common_then_the_nearest():
    sums = LinguisticSums()
    # offsets +2 (w0 → w2), +2 (w1 → w3), −1 (w3 → w2): +2 is the most common
    common = sentence(["p", "q", "r", "s"], (2, 3, -1, 2), ("x", "x", "root", "x"))
    sums.add(word_attention(common.words, [heads_of(common)], [0]), common)
    # offsets +2 (w0 → w2) and −1 (w1 → w0), once each: the nearer one, −1
    tie = sentence(["t", "u", "v"], (2, 0, -1), ("y", "y", "root"))
    sums.add(word_attention(tie.words, [heads_of(tie)], [0]), tie)
    result = sums.syntax(1)
    baseline = dict(zip(result.relations, zip(result.baseline_offset, result.baseline_accuracy)))
    assert baseline["x"] == (2, pytest.approx(2 / 3)) and baseline["y"] == (-1, 0.5)


def test_coreference_mentions_cut_off_with_their_words_are_left_out():
    s = sentence(["John", "met", "Mary", "and", "she", "greeted", "him"], mentions=[
        Mention("e1", 0, 0, 0), Mention("e2", 2, 2, 2), Mention("e2", 4, 4, 4),
        Mention("e1", 6, 6, 6)])  # fmt: skip
    sums = LinguisticSums()
    sums.add(word_attention(s.words[:6], [[0, 0, 2, 3, 2, 5]], [0]), s)  # "him" was cut off
    assert sums.coreference().mentions == 1 and sums.coreference().accuracy[0, 0] == 1.0


def test_word_positions_need_the_word_view_of_the_sentence():
    from attnviz.analysis.linguistics import word_positions

    att = word_attention(["a", "b", "c"], [[0, 1, 2]], [0])
    assert word_positions(att, 3).tolist() == [1, 2, 3] and len(word_positions(att, 5)) == 3
    message = "^expected the word view of a sentence encoded with encode_words$"
    with pytest.raises(ValueError, match=message):
        word_positions(att, 2)  # more words than the sentence has
    with pytest.raises(ValueError, match=message):
        word_positions(replace(att, unit="token"), 3)
