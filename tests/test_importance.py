"""Head importance (attnviz.analysis.importance) on tiny models: what ablation and gradients
compute, checked against the same quantities computed another way (weights edited by hand,
plain forward passes, finite differences), never by the code under test."""

from __future__ import annotations

import copy

import numpy as np
import pytest

TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!"]


def _encoded(loaded, texts=TEXTS):
    from attnviz.core.tokens import encode

    return [encode(loaded, t) for t in texts]


def _copy(loaded, model):
    from attnviz.core.model_info import LoadedModel

    return LoadedModel(model, loaded.tokenizer, loaded.info, loaded.device)


def _w_o(loaded, layer):
    from attnviz.core import layer_map

    return layer_map.layer_modules(loaded.model, layer).o


def _head_columns(loaded, head):
    """The columns of W_O (nn.Linear: weight (out, in)) that read head `head`'s output."""
    d_head = loaded.info.d_head
    return slice(head * d_head, (head + 1) * d_head)


def _next_token_loss(model, ids):
    """Mean −log P(token p | tokens before it) over p = 1 … T−1, by a plain loop."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()  # (T, V)
    total = 0.0
    for p in range(1, len(ids)):
        total -= float(torch.log_softmax(logits[p - 1], dim=-1)[ids[p]])
    return total, len(ids) - 1


def _objective(model, encoded):
    totals = [_next_token_loss(model, list(e.ids)) for e in encoded]
    return sum(t for t, _ in totals) / sum(n for _, n in totals)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3", "bert"])
def test_ablating_every_head_of_a_layer_leaves_only_the_output_bias(loaded_tiny, arch):
    """Zero-ablating all heads of layer 1 = a model whose layer-1 W_O weight is 0: the block's
    output is then b_O alone at every position. Compared: the whole model's output (logits for
    decoders, the last hidden state for encoders), to 1e-5."""
    import torch

    from attnviz.analysis.importance import ablating
    from attnviz.core import capture
    from attnviz.core.tokens import pad

    loaded = loaded_tiny[arch]
    inputs = pad(loaded, _encoded(loaded))
    n_rows, n_heads = inputs["input_ids"].shape[0], loaded.info.n_heads
    edit = ablating({1: torch.ones((n_rows, n_heads), dtype=torch.bool)}, n_heads)
    causal = loaded.info.causal
    edited = capture.run(loaded, inputs, [], lm_head=causal, edit=edit)
    by_hand = copy.deepcopy(loaded.model)
    with torch.no_grad():
        _w_o(_copy(loaded, by_hand), 1).weight.zero_()
        expected = (by_hand if causal else by_hand.base_model)(**inputs)
        clean = (loaded.model if causal else loaded.model.base_model)(**inputs)
    field = "logits" if causal else "last_hidden_state"
    mask = inputs["attention_mask"].bool()
    got, want, before = (getattr(o, field)[mask] for o in (edited, expected, clean))
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, before, atol=1e-3)  # the ablation did change something


def test_albert_removes_a_head_in_one_layer_of_its_shared_block(loaded_tiny):
    """ALBERT's layers share one W_O: ablating layer 1's heads leaves layer 0's block output
    as it was and makes layer 1's exactly b_O."""
    import torch

    from attnviz.analysis.importance import ablating
    from attnviz.core import capture
    from attnviz.core.tokens import pad

    loaded = loaded_tiny["albert"]
    inputs = pad(loaded, _encoded(loaded))
    n_rows, n_heads = inputs["input_ids"].shape[0], loaded.info.n_heads
    edit = ablating({1: torch.ones((n_rows, n_heads), dtype=torch.bool)}, n_heads)

    def outputs(edit):
        held = {}
        capture.run(loaded, inputs, [capture.Each([0, 1], ("output",), held.__setitem__)],
                    edit=edit)  # fmt: skip
        return held[0]["output"], held[1]["output"]

    clean0, clean1 = outputs(None)
    edited0, edited1 = outputs(edit)
    bias = _w_o(loaded, 1).bias.detach()
    assert torch.equal(edited0, clean0)
    assert torch.allclose(edited1, bias.expand_as(edited1), atol=1e-6)
    assert not torch.allclose(clean1, bias.expand_as(clean1), atol=1e-3)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "bert", "albert"])
def test_a_head_whose_w_o_slice_is_zero_does_not_matter(loaded_tiny, arch):
    """Zero ablation of a head that W_O ignores changes nothing; the other heads do matter.
    (ALBERT's layers share their W_O: head 2 is then ignored in both.)"""
    import torch

    from attnviz.analysis.importance import importance

    loaded = loaded_tiny[arch]
    silent = _copy(loaded, copy.deepcopy(loaded.model))
    o = _w_o(silent, 0)
    with torch.no_grad():
        if arch == "gpt2":  # Conv1D stores (in, out)
            o.weight[_head_columns(silent, 2)].zero_()
        else:
            o.weight[:, _head_columns(silent, 2)].zero_()
    scores = importance(silent, _encoded(silent)).scores
    ignored = np.zeros(scores.shape, dtype=bool)
    ignored[0 if arch != "albert" else slice(None), 2] = True
    assert np.all(np.abs(scores[ignored]) < 1e-9)
    assert np.all(np.abs(scores[~ignored]) > 1e-7)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3"])
def test_gradient_scores_are_finite_differences_of_the_gate(loaded_tiny, arch):
    """|∂L/∂ξ_h| = |L(ξ_h = 1 + ε) − L(ξ_h = 1 − ε)| / 2ε, where ξ_h scales W_O's columns
    for head h (a copy of the model with those weights scaled, run plainly), in float64.
    eps = 1e-2: Llama-family eager attention takes its softmax in float32 even in a float64
    model, so the loss carries ~1e-7 of rounding that a smaller eps would blow up; the central
    difference's own error, eps² times the third derivative over 6, is far below 1e-4."""
    import torch

    from attnviz.analysis.importance import importance

    loaded = loaded_tiny[arch]
    double = _copy(loaded, copy.deepcopy(loaded.model).double())
    encoded = _encoded(double)
    scores = importance(double, encoded, method="gradient").scores
    eps = 1e-2
    for layer, head in [(0, 1), (1, 3)]:
        sides = []
        for gate in (1 + eps, 1 - eps):
            scaled = copy.deepcopy(double.model)
            o = _w_o(_copy(double, scaled), layer)
            with torch.no_grad():
                if arch == "gpt2":
                    o.weight[_head_columns(double, head)] *= gate
                else:
                    o.weight[:, _head_columns(double, head)] *= gate
            sides.append(_objective(scaled, encoded))
        expected = abs(sides[0] - sides[1]) / (2 * eps)
        assert scores[layer, head] == pytest.approx(expected, abs=1e-4)
    assert scores.max() > 1e-3  # the gradients are not all ~0, which would pass trivially


def test_ablation_score_is_the_loss_change_by_hand(loaded_tiny):
    """Zero ablation's score of one head = the loss of a copy whose W_O ignores that head,
    minus the clean loss; `clean` is the loss by hand; mean ablation differs from zero."""
    import torch

    from attnviz.analysis.importance import importance

    loaded = loaded_tiny["llama"]
    encoded = _encoded(loaded)
    result = importance(loaded, encoded)
    clean = _objective(loaded.model, encoded)
    assert result.clean == pytest.approx(clean, abs=1e-5)
    without = copy.deepcopy(loaded.model)
    with torch.no_grad():
        _w_o(_copy(loaded, without), 1).weight[:, _head_columns(loaded, 2)].zero_()
    assert result.scores[1, 2] == pytest.approx(_objective(without, encoded) - clean, abs=1e-5)
    mean = importance(loaded, encoded, ablation="mean").scores
    assert not np.allclose(mean, result.scores, atol=1e-5)


def test_batch_size_does_not_change_the_scores(loaded_tiny):
    """Heads ablated in rows of one batch score as they do one row per pass."""
    from attnviz.analysis.importance import importance

    loaded = loaded_tiny["mistral"]
    encoded = _encoded(loaded)
    together = importance(loaded, encoded, ablation="mean").scores
    alone = importance(loaded, encoded, ablation="mean", batch_size=1).scores
    assert np.allclose(together, alone, atol=1e-5)


def test_a_head_trained_to_carry_the_prediction_ranks_first(loaded_tiny):
    """Train only head (1, 3)'s value and output weights of a tiny Llama to predict the texts'
    next tokens: removing it then costs the most. Trained to its optimum, its gate's gradient
    is ~0 (the gate scales weights that were just optimised): halved, the head is the one
    the loss is steepest in, and gradient importance ranks it first."""
    import torch

    from attnviz.analysis.importance import importance

    loaded = loaded_tiny["llama"]
    trained = copy.deepcopy(loaded.model)
    torch.manual_seed(0)
    encoded = _encoded(loaded)
    attn = trained.model.layers[1].self_attn
    columns = _head_columns(loaded, 3)
    kv_head = 3 // (loaded.info.n_heads // loaded.info.n_kv_heads)  # its key/value group
    d_head = loaded.info.d_head
    rows_v = slice(kv_head * d_head, (kv_head + 1) * d_head)
    params = [attn.o_proj.weight, attn.v_proj.weight]
    optimiser = torch.optim.Adam(params, lr=0.05)
    ids = [torch.tensor([e.ids]) for e in encoded]
    for _ in range(60):
        optimiser.zero_grad()
        loss = sum(trained(input_ids=i, labels=i).loss for i in ids)
        loss.backward()
        mask_o = torch.zeros_like(attn.o_proj.weight)
        mask_o[:, columns] = 1
        mask_v = torch.zeros_like(attn.v_proj.weight)
        mask_v[rows_v] = 1
        attn.o_proj.weight.grad *= mask_o  # only head 3's slice of W_O learns
        attn.v_proj.weight.grad *= mask_v  # and its key/value head's W_V
        optimiser.step()
    model = _copy(loaded, trained.eval())
    result = importance(model, encoded)
    assert result.top(1)[0][:2] == (1, 3), result.scores
    assert result.ranks()[1, 3] == 1
    others = np.delete(result.scores.ravel(), 1 * 4 + 3)
    assert result.scores[1, 3] > 3 * others.max(), result.scores  # by far, not by a hair
    with torch.no_grad():
        attn.o_proj.weight[:, columns] *= 0.5
    assert importance(model, encoded, method="gradient").ranks()[1, 3] == 1


def test_gradient_is_refused_where_the_objective_sits_at_its_optimum(loaded_tiny):
    from attnviz.analysis.importance import importance
    from attnviz.errors import InputError

    loaded = loaded_tiny["bert"]
    with pytest.raises(InputError, match="use --importance ablation"):
        importance(loaded, _encoded(loaded), method="gradient")


def test_an_mlm_checkpoint_is_measured_by_its_masked_lm_loss(tmp_path):
    """A tiny BertForMaskedLM: loaded with its head, the objective is the masked-LM loss,
    which equals the loss by hand at the positions the seed picks."""
    import torch
    import transformers as tf

    from attnviz.analysis.importance import MASK_SHARE, SEED, importance
    from attnviz.core.models import bundled_model_path, load_model

    torch.manual_seed(0)
    tokenizer = tf.AutoTokenizer.from_pretrained(bundled_model_path())
    config = tf.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=37,
                           max_position_embeddings=64)  # fmt: skip
    tf.BertForMaskedLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "cpu")
    encoded = _encoded(loaded)
    result = importance(loaded, encoded, method="gradient")
    assert result.objective_name == "masked-lm"
    total, count = 0.0, 0
    for index, e in enumerate(encoded):
        words = [p for p, special in enumerate(e.special) if not special]
        k = max(1, round(MASK_SHARE * len(words)))
        chosen = np.random.default_rng([SEED, index]).choice(words, k, replace=False)
        ids = list(e.ids)
        for p in chosen:
            ids[p] = tokenizer.mask_token_id
        with torch.no_grad():
            logits = loaded.model(input_ids=torch.tensor([ids])).logits[0].double()
        for p in chosen:
            total -= float(torch.log_softmax(logits[p], dim=-1)[e.ids[p]])
            count += 1
    assert result.clean == pytest.approx(total / count, abs=1e-4)
    assert np.all(result.scores > 0)


def test_spearman_against_ranks_by_hand():
    from attnviz.analysis.importance import spearman

    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert spearman(a, a * 10) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # ranks 1 2 3 4 against 2 1 4 3: 1 − 6·Σd²/(n(n²−1)) = 1 − 6·4/60 = 0.6
    assert spearman(a, np.array([[2.0, 1.0], [4.0, 3.0]])) == pytest.approx(0.6)
    # ties share their mean rank: x = 1, 2.5, 2.5, 4 against y = 1 2 3 4
    tied = spearman(np.array([1.0, 2.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert tied == pytest.approx(4.5 / np.sqrt(4.5 * 5.0))
    assert np.isnan(spearman(np.array([1.0, np.nan]), np.array([1.0, 2.0])))


def test_ranks_and_top_skip_heads_not_measured(loaded_tiny):
    from attnviz.analysis.importance import importance

    loaded = loaded_tiny["gpt2"]
    result = importance(loaded, _encoded(loaded), layers=[1], heads=[0, 2])
    assert np.isnan(result.scores[0]).all() and np.isnan(result.scores[1, [1, 3]]).all()
    ranks = result.ranks()
    assert sorted(ranks[1, [0, 2]]) == [1, 2] and ranks[0].sum() == 0
    assert [(layer, head) for layer, head, _ in result.top(5)] == sorted(
        [(1, 0), (1, 2)], key=lambda c: -result.scores[c]
    )


def test_the_api_measures_texts_by_name(tiny_model_dirs, loaded_tiny):
    """attnviz.importance(texts, model=...) gives the same scores as the loss by hand."""
    import torch

    import attnviz

    result = attnviz.importance(TEXTS, model=str(tiny_model_dirs["qwen2"]), device="cpu",
                                layers=[0], heads=[1])  # fmt: skip
    loaded = loaded_tiny["qwen2"]
    encoded = _encoded(loaded)
    without = copy.deepcopy(loaded.model)
    with torch.no_grad():
        _w_o(_copy(loaded, without), 0).weight[:, _head_columns(loaded, 1)].zero_()
    clean = _objective(loaded.model, encoded)
    assert result.clean == pytest.approx(clean, abs=1e-5)
    assert result.scores[0, 1] == pytest.approx(_objective(without, encoded) - clean, abs=1e-5)
    assert np.isnan(result.scores[1]).all() and "next-token" in result.objective
