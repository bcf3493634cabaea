"""Sinks and reach from blocks of rows equal plain loops over the whole matrix."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from attnviz.analysis import reach
from attnviz.core import capture
from attnviz.core.extract import attend
from attnviz.core.tokens import encode, pad

TEXTS = ("The cat sat on the mat because it was tired.", "A dog.", "Heads look back, far back.")


def _loops(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """first_token_alpha, distance_mean and distance_p90 of (L, H, T, T), by plain loops."""
    n_layers, n_heads, n, _ = weights.shape
    first = np.zeros((n_layers, n_heads))
    mean = np.zeros((n_layers, n_heads))
    p90 = np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        for head in range(n_heads):
            a = weights[layer, head].astype(np.float64)
            first[layer, head] = np.mean([a[i, 0] for i in range(n)])
            mean[layer, head] = np.mean(
                [sum(a[i, k] * abs(i - k) for k in range(n)) for i in range(n)]
            )
            for d in range(n):
                held = sum(a[i, k] for i in range(n) for k in range(n) if abs(i - k) <= d) / n
                if held >= 0.9 - 1e-9:
                    p90[layer, head] = d
                    break
    return first, mean, p90


@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize("block", [1, 7, None])
def test_reach_from_blocks_equals_loops(arch, block, loaded_tiny):
    loaded = loaded_tiny[arch]
    batch = [encode(loaded, text) for text in TEXTS]
    inputs = pad(loaded, batch)
    layers = list(range(loaded.info.n_layers))
    recorder = reach.ReachRecorder(layers, loaded.info.n_heads, [len(e) for e in batch])
    capture.run(loaded, inputs, [recorder], block_rows=block or inputs["input_ids"].shape[1])
    found = recorder.finish()
    for ours, att in zip(found, attend(loaded, batch)):
        first, mean, p90 = _loops(att.weights)
        assert np.allclose(ours.first_token_alpha, first, atol=1e-6)
        assert np.allclose(ours.distance_mean, mean, atol=1e-5)
        assert np.array_equal(ours.distance_p90, p90)
    # the corpus's figures: each text's, averaged over texts
    corpus = reach.mean(found)
    assert corpus.texts == 3
    assert np.allclose(corpus.first_token_alpha, np.mean([r.first_token_alpha for r in found], 0))
    expected = (corpus.first_token_alpha > reach.SINK_ALPHA).mean(axis=1)
    assert np.array_equal(corpus.sink_head_share, expected)


def test_reach_on_known_patterns():
    """A head that attends to its first token only, one that attends to itself, and one
    spread evenly over the previous two tokens."""
    import torch

    n = 10
    sink = torch.zeros(n, n)
    sink[:, 0] = 1.0
    own = torch.eye(n)
    spread = torch.zeros(n, n)
    spread[0, 0] = 1.0
    for i in range(1, n):
        spread[i, max(0, i - 2) : i] = 1.0 / min(i, 2)
    text = reach.TextReach(1, 3, n)
    text.add(0, 0, torch.stack([sink, own, spread]))
    found = text.finish()
    assert found.first_token_alpha[0].tolist() == pytest.approx([1.0, 0.1, (1 + 1 + 0.5) / n])
    assert found.distance_mean[0, 0] == pytest.approx(np.mean(range(n)))
    assert found.distance_mean[0, 1] == 0.0
    assert found.distance_p90[0].tolist() == [8.0, 0.0, 2.0]  # 9 of 10 sink rows within 8
    assert found.sink_head_share.tolist() == [pytest.approx(1 / 3)]


def test_reach_refuses_missing_rows():
    import torch

    text = reach.TextReach(1, 1, 4)
    text.add(0, 0, torch.full((1, 2, 4), 0.25))
    with pytest.raises(ValueError, match="rows seen"):
        text.finish()


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_metric_sums_from_blocks_equal_the_whole(arch, loaded_tiny):
    """Every head metric is a sum over queries: blocks of 1, 7 and T rows add up to the
    whole text's sums and counts."""
    from attnviz.analysis.metrics import sentence_sums

    loaded = loaded_tiny[arch]
    att = attend(loaded, [encode(loaded, TEXTS[0])])[0]
    whole, counts = sentence_sums(att)
    n = att.weights.shape[2]
    for size in (1, 7, n):
        parts = [sentence_sums(att, att.weights[:, :, s : s + size], s) for s in range(0, n, size)]
        assert np.allclose(sum(p[0] for p in parts), whole, atol=1e-12)
        assert np.array_equal(sum(p[1] for p in parts), counts)


@contextmanager
def _sinking(loaded, layer: int, head: int, strength: float = 8.0):
    """`loaded` with one head that parks its attention on the first token (while the context
    lasts): every query of head `head` of layer `layer`, and the first token's key, get
    `strength` added along one dimension, the slowest-turning pair of RoPE's (half-split)
    layout, which barely turns over a short text. Its first key then scores strength² / √d_k
    above the others."""
    info = loaded.info
    if info.causal:
        attention = loaded.model.base_model.layers[layer].self_attn
        q, k = attention.q_proj, attention.k_proj
    else:
        attention = loaded.model.base_model.encoder.layer[layer].attention.self
        q, k = attention.query, attention.key
    d_k, dim = info.d_head, info.d_head // 2 - 1
    kv_head = head // (info.n_heads // info.n_kv_heads)

    def queries(module, args, out):  # (B, T, H · d_k)
        out = out.clone()
        out[..., head * d_k + dim] += strength
        return out

    def first_key(module, args, out):  # (B, T, H_kv · d_k)
        out = out.clone()
        out[:, 0, kv_head * d_k + dim] += strength
        return out

    handles = [q.register_forward_hook(queries), k.register_forward_hook(first_key)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_report_carries_sinks_and_reach_averaged_over_texts(arch, loaded_tiny):
    """report's first_token_alpha, distance_mean and distance_p90 are each text's (by plain
    loops over its whole attention) averaged over the texts; sink_head_share follows, with
    one head made to sink (layer 1, head 2) among heads that do not."""
    from attnviz.core.inputs import read_sentences
    from attnviz.pipelines.report import build_report

    loaded = loaded_tiny[arch]
    with _sinking(loaded, 1, 2):
        found = build_report(loaded, read_sentences(None, list(TEXTS)), batch_size=2)
        batch = [encode(loaded, t) for t in TEXTS]
        per_text = [_loops(att.weights) for att in attend(loaded, batch)]
    expected = [np.mean([figures[k] for figures in per_text], axis=0) for k in range(3)]
    for name, values in zip(("first_token_alpha", "distance_mean", "distance_p90"), expected):
        assert np.allclose(getattr(found.reach, name), values, atol=1e-5), name
        row = found.rows()[5]
        assert row[name] == pytest.approx(values[row["layer"], row["head"]], abs=1e-5)
    sinks = expected[0] > reach.SINK_ALPHA
    assert np.argwhere(sinks).tolist() == [[1, 2]]  # the one head made to sink, alone
    assert found.as_dict()["sink_head_share"] == pytest.approx([0.0, 0.25])
