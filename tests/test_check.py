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
from attnviz.core import adapters, capture
from attnviz.core.attention import Encoded
from attnviz.core.mha import LayerWeights, multi_head_attention
from attnviz.core.tokens import pad
from attnviz.pipelines.check import check_layers
from tests.conftest import ARCHITECTURES

runner = CliRunner()


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
    batch = random_batch(loaded, [11, 5, 8], seed=hash(arch) % 1000)
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
        adapters.layer_weights(loaded.model, 0),
        inputs["attention_mask"],
        causal=True,
    )
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert (ours.probs[..., upper] == 0).all()
    assert (ours.probs[1, :, :, 4:] == 0).all()  # padded keys of the shorter text
    torch.testing.assert_close(ours.probs.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64))


def test_matches_torch_multihead_attention_independently():
    """An independent reference: torch's own MultiheadAttention with the same weights."""
    torch.manual_seed(0)
    d, h = 24, 3
    reference = torch.nn.MultiheadAttention(d, h, batch_first=True).double().eval()
    w_in, b_in = reference.in_proj_weight.detach(), reference.in_proj_bias.detach()
    weights = LayerWeights(
        w_in[:d].T, b_in[:d], w_in[d : 2 * d].T, b_in[d : 2 * d], w_in[2 * d :].T, b_in[2 * d :],
        reference.out_proj.weight.detach().T, reference.out_proj.bias.detach(), h,
    )  # fmt: skip
    x = torch.randn(2, 7, d, dtype=torch.float64)
    expected, expected_probs = reference(x, x, x, need_weights=True, average_attn_weights=False)
    ours = multi_head_attention(x, weights)
    torch.testing.assert_close(ours.output, expected.detach(), atol=1e-12, rtol=0)
    torch.testing.assert_close(ours.probs, expected_probs.detach(), atol=1e-12, rtol=0)


def _layer_run(loaded, layer, weights):
    batch = random_batch(loaded, [9, 6], seed=7)
    inputs = pad(loaded, batch)
    seen = {}
    kinds = ("input", "probs", "output")
    recorder = capture.Each([layer], kinds, seen.__setitem__)
    out = capture.run(loaded, {**inputs, "output_attentions": True}, [recorder])
    mask = inputs["attention_mask"]
    ours = multi_head_attention(seen[layer]["input"], weights, mask, loaded.info.causal)
    torch.testing.assert_close(seen[layer]["probs"], out.attentions[layer])  # the hook's = HF's
    return compare(layer, out.attentions[layer], seen[layer]["output"], ours, mask)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "qwen3"])
def test_perturbing_one_head_is_caught_on_that_head(loaded_tiny, arch):
    loaded = loaded_tiny[arch]
    weights = adapters.layer_weights(loaded.model, 1)
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
    w = adapters.layer_weights(loaded.model, 0)
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
    real = adapters.layer_weights

    def broken(model, layer):
        w = real(model, layer)
        w_v = w.w_v.clone()
        w_v[:, 5 * 32 : 6 * 32] *= 1.5  # head 5's values: probabilities stay, the output moves
        return replace(w, w_v=w_v)

    monkeypatch.setattr(adapters, "layer_weights", broken)
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
    weights = adapters.layer_weights(loaded.model, layer)
    assert _layer_run(loaded, layer, weights).passed(1e-5)
    assert not _layer_run(loaded, layer, replace(weights, **change)).passed(1e-5)
