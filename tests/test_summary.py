"""The per-head summary of one text: patterns in the report's vocabulary, key means over the
queries that see a key, and the strongest link; checked on hand-built patterns with the
expected figures worked out by hand, on the bundled model and on SmolLM2."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnviz.analysis.metrics import repeat_scores
from attnviz.analysis.summary import role_scores, summarise
from tests.conftest import synthetic_attention
from tests.test_decoders import needs_smollm2


def _causal(att):
    return replace(att, info=replace(att.info, causal=True))


def _one_head(rows, tokens, special=None, causal=False):
    att = synthetic_attention(np.array(rows, float)[None, None], tokens, special)
    return _causal(att) if causal else att


def test_positional_heads_read_as_their_role():
    tokens = ["[CLS]", "a", "b", "c", "d", "[SEP]"]
    n = len(tokens)
    prev, nxt, own = np.zeros((n, n)), np.zeros((n, n)), np.eye(n)
    for i in range(n):
        prev[i, max(i - 1, 0)] = 1
        nxt[i, min(i + 1, n - 1)] = 1
    att = synthetic_attention(np.stack([prev, nxt, own])[None], tokens, special=[1, 0, 0, 0, 0, 1])
    found = {s.head: (s.pattern.role, s.pattern.score) for s in summarise(att, [0], [0, 1, 2])}
    assert found == {0: ("previous-token", 1.0), 1: ("next-token", 1.0), 2: ("self", 1.0)}


def test_content_token_sink_and_mixed():
    tokens = ["[CLS]", "cats", "chase", "mice", "[SEP]"]
    special = [1, 0, 0, 0, 1]
    # Head 0: each non-special query gives "mice" 0.5, the rest spread on the others.
    agree = np.array([[0.25] * 4 + [0]] * 5)
    agree[:, 3], agree[:, 4] = 0.5, 0.0
    agree[:, :3] = 0.5 / 3
    # Head 1: 0.8 on [CLS]. Head 2: 0.2 everywhere (nothing reaches a threshold).
    sink = np.array([[0.8, 0.05, 0.05, 0.05, 0.05]] * 5)
    flat = np.full((5, 5), 0.2)
    att = synthetic_attention(np.stack([agree, sink, flat])[None], tokens, special)
    summaries = {s.head: s for s in summarise(att, [0], [0, 1, 2])}
    assert summaries[0].pattern.role == "token" and summaries[0].pattern.key == 3
    assert summaries[0].pattern.score == pytest.approx(0.5)
    assert summaries[1].pattern.role == "first-token sink" and summaries[1].pattern.key == 0
    assert summaries[1].pattern.score == pytest.approx(0.8)
    # flat: 0.4 to specials, 0.6 over 3 local non-special keys, entropy ln 5 / ln 5 = 1: broad
    assert summaries[2].pattern.role == "broad"
    assert summaries[1].special_share == pytest.approx(0.85)
    assert summaries[2].special_share == pytest.approx(0.4)


def test_decoder_key_means_count_only_the_queries_that_see_the_key():
    # BOS x y z, causal. Query rows (non-special queries 1, 2, 3):
    rows = [
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.5, 0.1, 0.4, 0.0],
        [0.4, 0.1, 0.1, 0.4],
    ]
    att = _one_head(rows, ["<s>", "x", "y", "z"], special=[1, 0, 0, 0], causal=True)
    (summary,) = summarise(att, [0], [0], top_k=4)
    means = {t.token: t.weight for t in summary.top}
    # BOS: (.5 + .5 + .4) / 3; x: (.5 + .1 + .1) / 3; y: (.4 + .1) / 2; z: .4 / 1
    assert means == pytest.approx({"<s>": 1.4 / 3, "x": 0.7 / 3, "y": 0.25, "z": 0.4})
    # The strongest link leaves out BOS as a key: x → x .5 (row 1), not <s> → <s> 1.0
    assert (summary.link.query, summary.link.key, summary.link.weight) == (1, 1, 0.5)
    # Encoder averaging over all queries would give BOS 2.4/4 and z .1: the old, biased view.


def test_decoder_first_query_is_not_the_strongest_link():
    # No special token: the first query can only see itself (weight 1), which says nothing.
    rows = [[1.0, 0, 0], [0.3, 0.7, 0], [0.2, 0.6, 0.2]]
    (summary,) = summarise(_one_head(rows, ["The", "cat", "sat"], causal=True), [0], [0])
    assert (summary.link.query, summary.link.key) == (1, 1)


def _repeated_text(head):
    """[BOS] A B C A B C: query 4 (A) repeats 1, query 5 (B) repeats 2, query 6 (C) repeats 3."""
    tokens = ["<s>", "A", "B", "C", "A", "B", "C"]
    n = len(tokens)
    rows = np.zeros((n, n))
    rows[:, 0] = 1.0  # sink by default
    for query, key in head:
        rows[query] = 0.0
        rows[query, key] = 1.0
    return _one_head(rows, tokens, special=[1, 0, 0, 0, 0, 0, 0], causal=True)


def test_repeat_scores_by_hand():
    # An induction head looks at the token after the earlier occurrence: 4→2, 5→3, 6→4.
    induction = _repeated_text([(4, 2), (5, 3), (6, 4)])
    scores, counted = repeat_scores(induction)
    assert counted == 3
    assert scores[:, 0, 0] == pytest.approx([1.0, 0.0])
    # A duplicate-token head looks at the earlier occurrence: 4→1, 5→2, 6→3.
    scores, _ = repeat_scores(_repeated_text([(4, 1), (5, 2), (6, 3)]))
    assert scores[:, 0, 0] == pytest.approx([0.0, 1.0])
    # Half of one query's attention on its induction target: (0.5 + 0 + 0) / 3.
    half = _repeated_text([])
    half.weights[0, 0, 4, :] = 0
    half.weights[0, 0, 4, [0, 2]] = 0.5
    assert repeat_scores(half)[0][0, 0, 0] == pytest.approx(0.5 / 3)


def test_induction_needs_enough_repeats_and_wins_over_sinks():
    (summary,) = summarise(_repeated_text([(4, 2), (5, 3), (6, 4)]), [0], [0])
    # induction 1.0 (3 of 6 queries), first-token sink 0.5: induction is the pattern
    assert summary.pattern.role == "induction" and summary.pattern.score == pytest.approx(1.0)
    assert summary.scores["first-token sink"] == pytest.approx(0.5)
    # Two repeats are too few to call a head an induction head.
    short = _one_head(np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None], list("<ABAB"))
    assert repeat_scores(_causal(short))[1] == 0
    # An encoder's head is never given induction
    decoder = _repeated_text([(4, 2), (5, 3), (6, 4)])
    encoder = replace(decoder, info=replace(decoder.info, causal=False))
    (summary,) = summarise(encoder, [0], [0])
    assert summary.scores["induction"] is None and summary.pattern.role != "induction"


def _long_text(n=120, causal=True, seed=0):
    """A random text of `n` tokens (first and last special, many repeats) and random rows."""
    rng = np.random.default_rng(seed)
    weights = rng.random((2, 3, n, n)) ** 4
    if causal:
        weights *= np.tril(np.ones((n, n)))
    weights /= weights.sum(axis=-1, keepdims=True)
    words = ["the", "cat", ",", "sat", ".", "a", "dog"]
    tokens = ["<s>"] + [words[i] for i in rng.integers(0, len(words), n - 2)] + ["</s>"]
    att = synthetic_attention(weights, tokens, [1] + [0] * (n - 2) + [1])
    return _causal(att) if causal else att


@pytest.mark.parametrize("causal", [True, False])
def test_summary_from_blocks_of_1_7_and_t_rows_agree(causal):
    """Every number of the summary is summed over blocks of query rows: blocks of 1, 7 and T
    rows give the same summaries (the same keys, links and patterns; scores within float32
    rounding: a row's sums over keys come from one matrix product with the whole block
    (`core.reductions`), whose rounding may differ with the block's shape; the keys' weights
    too: a column is summed over a block's rows in float32)."""
    att = _long_text(causal=causal)
    n = att.weights.shape[2]
    layers, heads = [0, 1], [0, 1, 2]
    whole = summarise(att, layers, heads, top_k=4, block_rows=n)
    assert not causal or whole[0].scores["induction"] is not None  # the repeats are measured
    for size in (1, 7):
        for a, b in zip(whole, summarise(att, layers, heads, top_k=4, block_rows=size)):
            assert (a.pattern.role, a.pattern.key) == (b.pattern.role, b.pattern.key)
            assert [t.index for t in a.top] == [t.index for t in b.top]
            assert a.link == b.link  # the same query, key and weight: ties keep the first
            assert b.special_share == pytest.approx(a.special_share, rel=1e-6, abs=1e-12)
            for name, score in a.scores.items():
                assert b.scores[name] == (score and pytest.approx(score, rel=1e-6, abs=1e-12))
            assert [t.weight for t in b.top] == pytest.approx([t.weight for t in a.top], 1e-6)
        by_blocks, counted = repeat_scores(att, size)
        assert (by_blocks, counted)[1] == repeat_scores(att, n)[1]
        np.testing.assert_allclose(by_blocks, repeat_scores(att, n)[0], rtol=1e-12)
        for name, values in role_scores(att, size).items():
            expected = role_scores(att, n)[name]
            assert (values is None) == (expected is None)
            if values is not None:
                np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-12)


def test_summary_holds_less_than_the_attention_itself(monkeypatch):
    """The summary is an accumulator over blocks of rows, not a float64 copy of the whole
    attention: with blocks of 2^16 floats, the numpy memory it allocates at its peak is under
    the size of the (L, H, T, T) float32 array it summarises (a float64 copy alone is twice
    that)."""
    import tracemalloc

    from attnviz.analysis import metrics

    monkeypatch.setattr(metrics, "BLOCK_FLOATS", 2**16, raising=False)
    att = _long_text(400)
    tracemalloc.start()
    try:
        summarise(att, [0, 1], [0, 1, 2])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < att.weights.nbytes


def test_cross_attention_with_repeated_target_tokens_is_summarised():
    """Cross-attention's queries (the target) may repeat tokens while its keys are the
    source's: there is nothing to score induction on, and nothing fails."""
    from attnviz.core.attention import Keys

    rng = np.random.default_rng(0)
    weights = rng.random((1, 2, 6, 4))
    target = ["<s>", "a", "b", "a", "b", "a"]
    att = synthetic_attention(weights / weights.sum(-1, keepdims=True), target, [1, 0, 0, 0, 0, 0])
    source = Keys("x y", ("x", "y", "z", "</s>"), np.array([0, 0, 0, 1], bool), (0, 1, 2, 3),
                  ("x", "y", "z", "</s>"))  # fmt: skip
    summaries = summarise(replace(att, keys=source), [0], [0, 1])
    assert [s.scores["induction"] for s in summaries] == [None, None]
    assert all(s.top[0].token in source.tokens for s in summaries)


def test_bundled_layer0_head2_is_a_previous_token_head(bundled):
    from attnviz.core.extract import extract

    att = extract(bundled, "The quick brown fox jumps over the lazy dog because it was bored.")
    summaries = {(s.layer, s.head): s for s in summarise(att, [0], list(range(12)))}
    prev = summaries[(0, 2)].pattern
    assert prev.role == "previous-token" and prev.score > 0.95
    # Its previous-token score, recomputed by a plain loop over the non-special queries:
    rows = att.weights[0, 2]
    queries = [i for i in range(len(att.tokens)) if not att.special[i]]
    assert prev.score == pytest.approx(np.mean([rows[i, i - 1] for i in queries]), abs=1e-6)


@needs_smollm2
def test_smollm2_reads_induction_heads_on_a_repeated_text(smollm2):
    from attnviz.core.extract import extract

    once = "The quick brown fox jumps over the lazy dog because it was bored."
    twice = extract(smollm2, f"{once} {once}")
    heads = list(range(9))
    layers = list(range(30))
    repeated = {(s.layer, s.head): s.pattern for s in summarise(twice, layers, heads)}
    induction = {key for key, p in repeated.items() if p.role == "induction"}
    # The probe's induction head (random tokens, tests/test_decoders.py) reads as one here.
    assert (18, 6) in induction
    assert all(repeated[key].score >= 0.4 for key in induction)
    # Without a repeat there is nothing to copy: no head is called an induction head.
    single = summarise(extract(smollm2, once), layers, heads)
    assert not [s for s in single if s.pattern.role == "induction"]
    # A decoder's first query no longer decides every strongest link.
    assert all(s.link is not None and s.link.query > 0 for s in single)


@pytest.fixture(scope="module")
def smollm2():
    from attnviz.core import models

    return models.model("smollm2", "cpu").load()
