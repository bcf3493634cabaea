"""The from-scratch MHA reproduces real layers, and the check fails when it should."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attnviz import check
from attnviz.analysis.check import compare
from attnviz.cli import app
from attnviz.core import capture, families
from attnviz.core.attention import Encoded
from attnviz.core.mha import LayerWeights, multi_head_attention
from attnviz.core.tokens import pad
from attnviz.pipelines.check import check_layers
from tests.conftest import ARCHITECTURES, eager

runner = CliRunner()
# Each architecture's random token ids come from its own fixed seed, so a failure replays
# (hash() of a string changes with every process).
SEEDS = {arch: 100 + i for i, arch in enumerate(ARCHITECTURES)}


def random_batch(loaded, lengths, seed):
    """Encoded texts of random token ids (fresh random inputs), of different lengths."""
    rng = np.random.default_rng(seed)
    vocab = loaded.model.config.vocab_size
    batch = []
    for n in lengths:
        ids = tuple(int(i) for i in rng.integers(5, vocab, size=n))
        batch.append(Encoded("", ids, ("t",) * n, (False,) * n, tuple(range(n)), ("t",) * n, ()))
    return batch


def test_every_layer_of_the_bundled_model_matches(bundled):
    result = check("The quick brown fox jumps over the lazy dog because it was bored.")
    assert result.passed and len(result.layers) == 6
    assert result.max_error <= 1e-5
    assert all(len(lc.head_errors) == 12 for lc in result.layers)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_models_match_on_a_padded_batch(loaded_tiny, arch):
    loaded = loaded_tiny[arch]
    batch = random_batch(loaded, [11, 5, 8], seed=SEEDS[arch])
    checks, shapes = check_layers(loaded, batch, list(range(loaded.info.n_layers)))
    for lc in checks:
        assert max(lc.head_errors) <= 1e-5 and lc.output_error <= 1e-5, (arch, lc)
    assert dict((name, shape) for name, _, shape in shapes)["scores"] == (3, 11, 11)


def test_causal_mask_and_padding_give_zero_weight(loaded_tiny):
    loaded = loaded_tiny["gpt2"]
    batch = random_batch(loaded, [6, 4], seed=3)
    inputs = pad(loaded, batch)
    seen = {}
    capture.run(loaded, inputs, [capture.Each([0], ("input",), seen.__setitem__)])
    ours = multi_head_attention(
        seen[0]["input"],
        families.layer_weights(loaded.model, 0),
        inputs["attention_mask"],
        causal=True,
    )
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert (ours.probs[..., upper] == 0).all()
    assert (ours.probs[1, :, :, 4:] == 0).all()  # padded keys of the shorter text
    torch.testing.assert_close(ours.probs.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))


def test_matches_torch_multihead_attention_independently():
    """An independent reference: torch's own MultiheadAttention with the same weights."""
    reference, weights = _torch_reference(24, 3)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    expected, expected_probs = reference(x, x, x, need_weights=True, average_attn_weights=False)
    ours = multi_head_attention(x, weights)
    torch.testing.assert_close(ours.output, expected.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.probs, expected_probs.detach(), atol=1e-12, rtol=0)


def _torch_reference(d, h, scale=1.0):
    """torch's MultiheadAttention (d_model d, h heads; its Q and K weights times `scale`) and
    the same weights as our LayerWeights."""
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(d, h, batch_first=True).double().eval()
    with torch.no_grad():
        reference.in_proj_weight[: 2 * d].mul_(scale)
    w_in, b_in = reference.in_proj_weight.detach(), reference.in_proj_bias.detach()
    weights = LayerWeights(
        w_in[:d].T, b_in[:d], w_in[d : 2 * d].T, b_in[d : 2 * d], w_in[2 * d :].T, b_in[2 * d :],
        reference.out_proj.weight.detach().T, reference.out_proj.bias.detach(), h,
    )  # fmt: skip
    return reference, weights


def _layer_run(loaded, layer, weights):
    batch = random_batch(loaded, [9, 6], seed=7)
    inputs = pad(loaded, batch)
    seen = {}
    kinds = ("input", "probs", "output")
    recorder = capture.Each([layer], kinds, seen.__setitem__)
    with eager(loaded.model):  # check holds the model's own probabilities
        out = capture.run(loaded, {**inputs, "output_attentions": True}, [recorder])
    mask = inputs["attention_mask"]
    ours = multi_head_attention(seen[layer]["input"], weights, mask, loaded.info.causal)
    torch.testing.assert_close(seen[layer]["probs"], out.attentions[layer])  # the hook's = HF's
    return compare(layer, out.attentions[layer], seen[layer]["output"], ours, mask)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "qwen3"])
def test_perturbing_one_head_is_caught_on_that_head(loaded_tiny, arch):
    loaded = loaded_tiny[arch]
    weights = families.layer_weights(loaded.model, 1)
    d_k = loaded.info.d_head
    w_q = weights.w_q.clone()
    torch.manual_seed(0)
    # Random, not constant: a constant shift cancels on BERT's zero-mean LayerNorm output.
    w_q[:, 2 * d_k : 3 * d_k] += 0.5 * torch.randn(w_q.shape[0], d_k)  # head 2's queries only
    lc = _layer_run(loaded, 1, replace(weights, w_q=w_q))
    assert lc.failing_heads(1e-5) == [2]
    assert lc.output_error > 1e-5 and not lc.passed(1e-5)


def test_swapping_two_heads_is_caught_although_the_output_matches(loaded_tiny):
    loaded = loaded_tiny["bert"]
    w = families.layer_weights(loaded.model, 0)
    d_k = loaded.info.d_head
    order = torch.arange(loaded.info.d_model)
    order[: 2 * d_k] = torch.cat([order[d_k : 2 * d_k], order[:d_k]])  # head 0 <-> head 1
    swapped = LayerWeights(
        w.w_q[:, order], w.b_q[order], w.w_k[:, order], w.b_k[order],
        w.w_v[:, order], w.b_v[order], w.w_o[order, :], w.b_o, w.n_heads,
    )  # fmt: skip
    lc = _layer_run(loaded, 0, swapped)
    assert lc.failing_heads(1e-5) == [0, 1]
    assert lc.output_error <= 1e-5  # heads are a sum: the block cannot see the swap


def test_cli_passes_with_exit_0_and_json():
    result = runner.invoke(app, ["check", "Time flies like an arrow.", "--layer", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and [lc["layer"] for lc in data["layers"]] == [3]
    assert data["shapes"]["W_Q^h"] == [384, 32]


def test_cli_reports_a_mismatch_with_exit_1(monkeypatch):
    real = families.layer_weights

    def broken(model, layer, stack=None):
        w = real(model, layer, stack)
        w_v = w.w_v.clone()
        w_v[:, 5 * 32 : 6 * 32] *= 1.5  # head 5's values: probabilities stay, the output moves
        return replace(w, w_v=w_v)

    monkeypatch.setattr(families, "layer_weights", broken)
    result = runner.invoke(app, ["check", "Time flies like an arrow.", "-l", "2"])
    assert result.exit_code == 1
    assert "MISMATCH in layer 2: heads none, output error" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (["check", "hi", "-l", "9"], "layer 9 out of range: this model has layers 0–5"),
        (["check", ""], "text is empty"),
        (["check", " ".join(["word"] * 600)], "602 tokens long; this model takes at most 512"),
        (["check", "hi", "-l", "1", "--all-layers"], "either --layer or --all-layers"),
    ],
)
def test_cli_bad_input(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_unsupported_attention_is_a_clear_error(tmp_path, tiny_model_dirs):
    from transformers import BertConfig, BertModel

    from tests.conftest import _wordpiece_tokenizer

    config = BertConfig(
        vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=20, position_embedding_type="relative_key",
    )  # fmt: skip
    BertModel(config).save_pretrained(tmp_path)
    _wordpiece_tokenizer().save_pretrained(tmp_path)
    result = runner.invoke(app, ["check", "hi there", "-m", str(tmp_path)])
    if "relative_key" not in json.dumps(BertConfig.from_pretrained(tmp_path).to_dict()):
        pytest.skip("this transformers version has no relative position embeddings for BERT")
    assert result.exit_code == 2
    assert "absolute positions only" in result.output


@pytest.mark.parametrize(
    "arch, change",
    [
        ("llama", dict(rope=None)),  # RoPE left out
        ("qwen3", dict(q_norm=None)),  # Qwen3's q/k norm left out
        ("mistral", dict(window=None)),  # sliding window left out
        ("gemma2", dict(softcap=None)),  # soft-capping left out
        ("gemma2", dict(scale=None)),  # 1/√d_k instead of query_pre_attn_scalar
    ],
)
def test_each_modern_step_matters(loaded_tiny, arch, change):
    """Leaving out any one step the tiny models use breaks the match: the steps are real."""
    loaded = loaded_tiny[arch]
    layer = 0  # gemma2's layer 0 is a sliding layer
    weights = families.layer_weights(loaded.model, layer)
    assert _layer_run(loaded, layer, weights).passed(1e-5)
    assert not _layer_run(loaded, layer, replace(weights, **change)).passed(1e-5)


def test_visible_keys_by_hand():
    from attnviz.core.mha import visible_keys

    def grid(*rows):
        return torch.tensor([[c == "1" for c in row] for row in rows])

    assert visible_keys(1, 3).tolist() == [grid("111", "111", "111").tolist()]  # encoder
    assert visible_keys(1, 3, causal=True)[0].equal(grid("100", "110", "111"))
    # a window of 2: the query and the key before it
    assert visible_keys(1, 4, causal=True, window=2)[0].equal(grid("1000", "1100", "0110", "0011"))
    padded = visible_keys(2, 3, key_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert padded[0].equal(grid("110", "110", "110")) and padded[1].all()
    # a band of 1 (an encoder's local layer): the key before the query, itself and the one after
    banded = grid("11000", "11100", "01110", "00111", "00011")
    assert visible_keys(1, 5, band=1)[0].equal(banded)
    assert visible_keys(1, 2, band=1, n_keys=5, start=3)[0].equal(banded[3:])  # a block of rows


def test_rms_norm_by_hand():
    from attnviz.core.mha import rms_norm

    x = torch.tensor([3.0, 4.0], dtype=torch.float64)  # mean of squares 12.5
    weight = torch.tensor([2.0, 0.5], dtype=torch.float64)
    assert rms_norm(x, weight, 0.0).tolist() == pytest.approx(
        [3 / 12.5**0.5 * 2, 4 / 12.5**0.5 / 2]
    )
    assert rms_norm(x, weight, 37.5).tolist() == pytest.approx([3 / 50**0.5 * 2, 4 / 50**0.5 / 2])


def test_to_cpu_upcasts_half_precision_and_leaves_float32_as_it_is():
    """What the recompute and the measures compute with: every weight (the RoPE frequencies
    and Qwen3's norms too) in float32 at least, exactly the model's numbers."""
    import torch

    from attnviz.core.mha import Rope

    names = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")
    half = {name: torch.randn(4, 4).to(torch.bfloat16) for name in names}
    rope = Rope(torch.rand(2).to(torch.float16), 1.5)
    weights = LayerWeights(*half.values(), n_heads=2, rope=rope, q_norm=torch.ones(2).half())
    moved = weights.to_cpu()
    for name in names:
        assert getattr(moved, name).dtype == torch.float32, name
        assert torch.equal(getattr(moved, name), half[name].float()), name
    assert torch.equal(moved.rope.inv_freq, rope.inv_freq.float()) and moved.rope.scaling == 1.5
    assert moved.q_norm.dtype == torch.float32 and moved.k_norm is None and moved.n_heads == 2
    assert moved.to_cpu().w_q is moved.w_q  # float32 on the CPU: not copied again
    assert replace(moved, w_q=moved.w_q.double()).to_cpu().w_q.dtype == torch.float64


def test_each_heads_q_k_v_are_the_models_own_projections():
    """Q_h, K_h (after RoPE) and V_h, which the page's inside view shows, against the Llama
    layer's own q_proj, k_proj, v_proj (with biases) and transformers' own RoPE: 4 query heads
    sharing 2 key/value heads."""
    import transformers as tf
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from attnviz.core.mha import attention_head, rope_angles, visible_keys

    config = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=8,
                            attention_bias=True, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config).eval()
    attn = model.model.layers[0].self_attn
    seen = {}
    with torch.no_grad():
        for name in ("q", "k", "v"):
            projection = getattr(attn, f"{name}_proj")
            projection.bias.normal_()  # transformers starts biases at 0: a sign would not show
            projection.register_forward_hook(
                lambda _m, args, out, name=name: seen.update({name: out, "x": args[0]})
            )
        model(torch.randint(0, 50, (2, 6)))
    x = seen["x"].double()  # (B, T, d_model)
    w = families.layer_weights(model, 0).double()
    cos, sin = LlamaRotaryEmbedding(config)(seen["x"], torch.arange(6)[None])  # (1, T, d_k)
    allowed = visible_keys(2, 6, causal=True)
    for h in range(4):
        q_cols, kv_cols = slice(8 * h, 8 * h + 8), slice(8 * (h // 2), 8 * (h // 2) + 8)
        q, k = apply_rotary_pos_emb(
            seen["q"][:, None, :, q_cols], seen["k"][:, None, :, kv_cols], cos, sin
        )  # (B, 1, T, d_k) each
        steps = attention_head(x, w, h, allowed, rope_angles(w.rope, 6))
        torch.testing.assert_close(steps.q, q[:, 0].double(), atol=1e-5, rtol=0)
        torch.testing.assert_close(steps.k, k[:, 0].double(), atol=1e-5, rtol=0)
        torch.testing.assert_close(steps.v, seen["v"][..., kv_cols].double(), atol=1e-5, rtol=0)
        torch.testing.assert_close(steps.output, steps.probs @ steps.v)


def test_scores_in_the_thousands_still_give_exact_probabilities():
    """Softmax shifted by each row's largest score: scores of ~10⁴ would overflow exp()."""
    reference, weights = _torch_reference(24, 3, scale=300.0)
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    ours = multi_head_attention(x, weights)
    expected, expected_probs = reference(x, x, x, need_weights=True, average_attn_weights=False)
    assert ours.probs.isfinite().all() and (ours.probs.max(-1).values > 0.99).any()
    torch.testing.assert_close(ours.probs, expected_probs.detach(), atol=1e-9, rtol=0)
    torch.testing.assert_close(ours.output, expected.detach(), atol=1e-9, rtol=0)


def test_the_steps_and_shapes_check_prints():
    """The table of steps `attnviz check` prints, written out: a one-head layer, then a Llama
    layer with grouped-query heads and RoPE."""
    reference, weights = _torch_reference(8, 1)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    assert multi_head_attention(x, weights).shapes == (
        ("X", "layer input", (2, 5, 8)),
        ("W_Q^h", "query weights of one head", (8, 8)),
        ("Q_h", "X W_Q^h + b_Q^h (K_h, V_h alike)", (2, 5, 8)),
        ("scores", "Q_h K_hᵀ / √d_k + mask", (2, 5, 5)),
        ("head_h", "softmax(scores) V_h", (2, 5, 8)),
        ("concat", "Concat(head_1 … head_H)", (2, 5, 8)),
        ("output", "concat W_O + b_O", (2, 5, 8)),
    )
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=50, hidden_size=48, num_hidden_layers=1,
                            num_attention_heads=6, num_key_value_heads=2,
                            intermediate_size=8)  # fmt: skip
    llama = families.layer_weights(tf.LlamaForCausalLM(config), 0)
    x = torch.randn(1, 3, 48, dtype=torch.float64)
    assert multi_head_attention(x, llama, causal=True).shapes == (
        ("X", "layer input", (1, 3, 48)),
        ("W_Q^h", "query weights of one head", (48, 8)),
        ("Q_h", "X W_Q^h + b_Q^h (K_h, V_h alike)", (1, 3, 8)),
        ("K_h, V_h", "one per 3 query heads (GQA)", (1, 3, 8)),
        ("RoPE", "Q_h, K_h turned by position", (1, 3, 8)),
        ("scores", "Q_h K_hᵀ / √d_k + mask", (1, 3, 3)),
        ("head_h", "softmax(scores) V_h", (1, 3, 8)),
        ("concat", "Concat(head_1 … head_H)", (1, 3, 48)),
        ("output", "concat W_O + b_O", (1, 3, 48)),
    )
