"""Head metrics and roles on synthetic attention whose answers are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnviz.analysis.metrics import (
    METRICS,
    MetricSums,
    is_punctuation,
    sentence_sums,
)
from attnviz.analysis.roles import (
    Thresholds,
    assign_roles,
)
from attnviz.errors import InputError
from tests.conftest import synthetic_attention

TOKENS = ["[CLS]", "the", "cat", "sat", "down", ".", "[SEP]"]
SPECIAL = [True, False, False, False, False, False, True]


def _row_set(kind: str, n: int = 7) -> np.ndarray:
    """A (T, T) head where every row follows one pattern."""
    grid = np.zeros((n, n))
    for i in range(n):
        if kind == "previous":
            grid[i, max(i - 1, 0)] = 1
        elif kind == "next":
            grid[i, min(i + 1, n - 1)] = 1
        elif kind == "self":
            grid[i, i] = 1
        elif kind == "first":
            grid[i, 0] = 1
        elif kind == "separator":
            grid[i, n - 1] = 1
        elif kind == "punctuation":
            grid[i, 5] = 1
        elif kind == "broad":
            grid[i, :] = 1 / n
        elif kind == "local":  # spread over the neighbours within ±1 that are not special
            near = [j for j in range(i - 1, i + 2) if 0 <= j < n and not SPECIAL[j]]
            grid[i, near] = 1 / len(near) if near else 0
            if not near:
                grid[i, i] = 1
    return grid


KINDS = ["previous", "next", "self", "first", "separator", "punctuation", "broad", "local"]
EXPECTED_ROLES = [
    "previous-token", "next-token", "self", "first-token sink", "separator sink",
    "punctuation", "broad", "local",
]  # fmt: skip


def _attention():
    weights = np.stack([_row_set(k) for k in KINDS])[None]  # (1, 8, T, T)
    return synthetic_attention(weights, TOKENS, special=SPECIAL)


def test_each_head_gets_the_role_it_was_built_for():
    sums = MetricSums()
    sums.add(_attention())
    roles = assign_roles(sums.means(), Thresholds())
    assert [r.role for r in roles] == EXPECTED_ROLES
    assert roles[0].score == pytest.approx(1.0) and roles[6].score == pytest.approx(1.0)


def test_metric_values_by_construction():
    sums = MetricSums()
    sums.add(_attention())
    means = sums.means()  # (M, L, H)
    m = {name: means[i, 0] for i, name in enumerate(METRICS)}
    assert m["previous"][0] == 1 and m["next"][1] == 1 and m["self"][2] == 1
    assert m["first"][3] == 1 and m["separator"][4] == 1 and m["punctuation"][5] == 1
    assert m["distance"][0] == pytest.approx(1.0)  # previous-token: always one step back
    assert m["distance"][2] == 0.0 and m["confidence"][2] == 1.0
    assert m["entropy"][6] == pytest.approx(math.log(7))  # uniform over 7 keys
    assert m["entropy_norm"][6] == pytest.approx(1.0) and m["entropy_norm"][0] == 0.0
    assert m["local"][7] == pytest.approx(1.0) and m["local"][3] == 0.0
    assert sums.queries == 5  # the five non-special tokens


def _one(name: str, a: np.ndarray, i: int, att, visible: int) -> float:
    """One metric of query i's row `a`, straight from its definition."""
    n = len(a)
    entropy = -sum(x * math.log(x) for x in a if x > 0)
    if name == "previous":
        return a[i - 1]
    if name == "next":
        return a[i + 1]
    if name == "self":
        return a[i]
    if name == "first":
        return a[0]
    if name == "separator":
        return sum(a[j] for j in range(1, n) if att.special[j])
    if name == "punctuation":
        return sum(a[j] for j in range(n) if is_punctuation(att.tokens[j]) and not att.special[j])
    if name == "local":
        return sum(a[j] for j in range(n) if abs(i - j) <= 2 and not att.special[j])
    if name == "entropy":
        return entropy
    if name == "entropy_norm":
        return entropy / math.log(visible)
    if name == "distance":
        return sum(a[j] * abs(i - j) for j in range(n))
    return a.max()  # confidence


def brute_force(att) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The metric definitions as plain loops: each metric's total over the text's queries,
    and how many queries it covers (counted here, not taken from the code under test)."""
    n_layers, n_heads, n, _ = att.weights.shape
    totals = {name: np.zeros((n_layers, n_heads)) for name in METRICS}
    counts = dict.fromkeys(METRICS, 0)
    for i in range(n):
        if att.special[i]:
            continue
        visible = i + 1 if att.info.causal else n
        for name in METRICS:
            if (name == "previous" and i == 0) or (name == "next" and i == n - 1):
                continue
            if name == "entropy_norm" and visible < 2:
                continue
            counts[name] += 1
            for layer in range(n_layers):
                for head in range(n_heads):
                    row = att.weights[layer, head, i].astype(float)
                    totals[name][layer, head] += _one(name, row, i, att, visible)
    return totals, counts


@pytest.mark.parametrize("causal", [False, True])
def test_vectorised_corpus_means_equal_brute_force(causal):
    rng = np.random.default_rng(5)
    atts = []
    # Texts framed by special tokens, and ones without (as after --hide-special): their first
    # query has no previous token, their last no next one.
    for n, framed in ((6, True), (9, True), (4, True), (5, False), (1, False)):
        logits = rng.normal(size=(2, 3, n, n))
        if causal:
            logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
        weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        words = [",", "word", "!", "x", "y", "z", "w"]
        if framed:
            tokens = ["<s>"] + words[: n - 2] + ["</s>"]
            special = [True] + [False] * (n - 2) + [True]
        else:
            tokens, special = words[:n], [False] * n
        att = synthetic_attention(weights, tokens, special=special)
        if causal:
            from dataclasses import replace

            att = replace(att, info=replace(att.info, causal=True))
        atts.append(att)
    sums = MetricSums()
    for att in atts:
        sums.add(att)
    means = sums.means()
    # The corpus mean is over all queries of all sentences: totals and counts add up.
    expected_totals = dict.fromkeys(METRICS, 0.0)
    expected_counts = dict.fromkeys(METRICS, 0)
    for att in atts:
        totals, counts = brute_force(att)
        _, theirs = sentence_sums(att)
        assert dict(zip(METRICS, theirs)) == counts
        for name in METRICS:
            expected_totals[name] = expected_totals[name] + totals[name]
            expected_counts[name] += counts[name]
    for k, name in enumerate(METRICS):
        np.testing.assert_allclose(
            means[k], expected_totals[name] / expected_counts[name], atol=1e-9, err_msg=name
        )


def test_thresholds_are_parsed_and_checked():
    assert Thresholds.parse(["previous=0.7"]).values["previous-token"] == 0.7
    with pytest.raises(InputError, match=r"outside the valid range \[0, 1\]"):
        Thresholds.parse(["broad=1.5"])
    with pytest.raises(InputError, match="NAME one of previous, next"):
        Thresholds.parse(["sideways=0.5"])
    with pytest.raises(InputError, match="not a number"):
        Thresholds.parse(["self=high"])


def test_a_higher_threshold_changes_the_role():
    sums = MetricSums()
    sums.add(_attention())
    strict = assign_roles(sums.means(), Thresholds.parse(["local=1.0", "broad=1.0"]))
    assert strict[7].role == "local"  # local is exactly 1.0, so it still clears
    stricter = assign_roles(sums.means(), Thresholds.parse(["previous=1.0", "broad=1.0"]))
    assert stricter[0].role == "previous-token"
    none = assign_roles(sums.means(), Thresholds.parse(["broad=1.0"]))
    assert none[6].role == "broad"


def test_punctuation_tokens():
    assert is_punctuation(".") and is_punctuation("...") and is_punctuation("##,")
    assert not is_punctuation("a.") and not is_punctuation("") and not is_punctuation("[SEP]x")


def test_corpus_counts_sentences_and_leaves_unmeasured_metrics_nan_quietly():
    """A corpus of one-word texts: no query has a previous or a next token, so those means
    are NaN, without a numpy warning (report turns NaN into "–"); the others are measured."""
    import warnings

    sums = MetricSums()
    for word in ("yes", "no", "maybe"):
        sums.add(synthetic_attention(np.ones((1, 2, 1, 1)), [word]))
    assert (sums.sentences, sums.queries) == (3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        means = sums.means()
    m = {name: means[k] for k, name in enumerate(METRICS)}
    assert np.isnan(m["previous"]).all() and np.isnan(m["next"]).all()
    assert (m["self"] == 1.0).all() and (m["first"] == 1.0).all() and (m["entropy"] == 0).all()


def test_repeat_scores_by_hand():
    """<s> a a b a b a, one head attending uniformly to every key up to the query.

    Earlier occurrences (duplicate keys) and the tokens after them (induction keys), by query:
      2 a: duplicate 1; no induction key (the token after 1 is the query itself)
      4 a: duplicate 1, 2; induction 2, 3
      5 b: duplicate 3; induction 4
      6 a: duplicate 1, 2, 4; induction 2, 3, 5
    Query i's uniform row gives each key 1 / (i + 1).
    """
    from attnviz.analysis.metrics import repeat_scores

    tokens = ["<s>", "a", "a", "b", "a", "b", "a"]
    n = len(tokens)
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    att = synthetic_attention(uniform[None, None], tokens, special=[True] + [False] * 6)
    scores, counted = repeat_scores(att)
    assert counted == 3  # queries 4, 5 and 6 have an induction key
    induction = (2 / 5 + 1 / 6 + 3 / 7) / 3
    duplicate = (1 / 3 + 2 / 5 + 1 / 6 + 3 / 7) / 4
    np.testing.assert_allclose(scores[:, 0, 0], [induction, duplicate], atol=1e-12)
    # two queries with an induction key are too few to score: zeros, counted 0
    short = synthetic_attention(
        uniform[None, None, :6, :6], tokens[:6], special=[True] + [False] * 5
    )
    scores, counted = repeat_scores(short)
    assert counted == 0 and (scores == 0).all()


def test_role_kinds_are_where_a_role_can_be_given():
    """The registry's kinds, which the legends list, agree with what the metrics can measure:
    no positional role in cross-attention, the probed role on decoders only; and every head
    built above, made causal (later keys masked, rows renormalised), gets a role that the
    decoder's list has (the next-token head cannot: a causal query never sees the next key)."""
    from dataclasses import replace

    from attnviz.analysis.roles import MIXED, ROLES, roles_for
    from attnviz.analysis.summary import TOKEN, summarise

    for role in ROLES.values():
        metric = METRICS.get(role.metric)
        assert not (metric is not None and metric.positional and "cross" in role.kinds), role
        assert not role.probed or role.kinds == ("decoder",), role
    weights = np.tril(_attention().weights) + np.eye(len(TOKENS)) * 1e-6  # (1, 8, T, T)
    weights /= weights.sum(-1, keepdims=True)
    att = synthetic_attention(weights, TOKENS, special=SPECIAL)
    att = replace(att, info=replace(att.info, causal=True))
    decoder = {role.name for role in roles_for("decoder")}
    sums = MetricSums()
    sums.add(att)
    given = {r.role for r in assign_roles(sums.means(), Thresholds())}
    given |= {s.pattern.role for s in summarise(att, [0], list(range(len(KINDS))))}
    assert given - {MIXED.name, TOKEN} <= decoder, given
    assert "previous-token" in given and "next-token" not in decoder


def test_kept_makes_a_block_once_under_its_budget_and_once_a_layer_past_it():
    """Under the budget a block's is made once for every layer; past it, once a layer (the
    pass and the recorder both ask a block's in turn), and what is kept stays in budget."""
    from attnviz.analysis.metrics import Kept

    made = []

    def make(start, stop):
        made.append((start, stop))
        return np.zeros(stop - start, np.float64)  # 8 bytes a row

    kept = Kept(make, budget=8 * 10)  # the first block of 8 rows fits, the later ones do not
    blocks = ((0, 8), (8, 16), (16, 24))
    for _layer in range(3):
        for block in blocks:
            first, again = kept(*block), kept(*block)
            assert first is again and len(first) == 8
    assert made == [(0, 8), *blocks[1:] * 3]
    assert kept.size == 64 and list(kept.kept) == [(0, 8)]
