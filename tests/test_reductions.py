"""A block of attention rows read once for all its recorders (`core.reductions`): each
reduction equals its definition; the pass reads each block in one place, once, whatever
the number of recorders; the statistics a streamed run sums from blocks of 1, 7 and T rows
(the summary's, the pooled maps') equal those of the whole matrix on every one-stack model
type of the any-model matrix; and the block rows of a run on the CPU come from its cache."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnviz.core import capture, recording, reductions
from tests import any_models
from tests.conftest import synthetic_attention

ONE_STACK = sorted(set(any_models.TYPES) - set(any_models.STACKS))
POOL = 3  # pooled cells of 3 × 3: LENGTH (10) is no multiple of it


def _block(lead=(2, 3), b=5, width=11, seed=0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows = torch.rand(*lead, b, width, generator=generator)
    return rows / rows.sum(dim=-1, keepdim=True)


def test_each_reduction_is_its_definition():
    """KeySums (shared and per-head tables, several at once), QuerySums, Bins (max and sum,
    row bins begun in an earlier block, a narrower last bin of keys), KeyMax and KeyLists
    against their formulas, in float64."""
    import torch

    rows, start = _block(), 4  # rows 4 … 8 of a text: bins of 3 are {3,4,5}, {6,7,8}
    r64 = rows.double()
    shared = np.random.default_rng(1).random((2, 11)).astype("f4")
    own = torch.rand(2, 3, 3, 11)
    weights = np.random.default_rng(2).random((2, 12)).astype("f4")
    keys = np.array([0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1], dtype=bool)
    asked = [reductions.KeySums(lambda a, b, w: shared[:, :w]),
             reductions.KeySums(lambda a, b, w: own[..., :w]), reductions.QuerySums(weights),
             reductions.Bins(3, "max"), reductions.Bins(3, "sum"),
             reductions.KeyMax(keys)]  # fmt: skip
    by_shared, by_own, by_query, top, summed, key_max = reductions.read(rows, start, asked)
    expect = r64 @ torch.from_numpy(shared).double().T
    assert torch.allclose(by_shared.double(), expect, rtol=1e-6, atol=1e-7)
    expect = torch.einsum("lhbw,lhkw->lhbk", r64, own.double())
    assert torch.allclose(by_own.double(), expect, rtol=1e-6, atol=1e-7)
    expect = torch.from_numpy(weights[:, start : start + 5]).double() @ r64
    assert torch.allclose(by_query.double(), expect, rtol=1e-6, atol=1e-7)
    # the block's rows of bin 1 (rows 4, 5) and bin 2 (6, 7, 8); keys 0-2, 3-5, 6-8, 9-10
    bins, columns = [(0, 2), (2, 5)], [(0, 3), (3, 6), (6, 9), (9, 11)]

    def squares(cells, reduce):
        return torch.stack([torch.stack([reduce(cells[..., a:b, c:d]) for c, d in columns], -1)
                            for a, b in bins], -2)  # fmt: skip

    assert top.shape == summed.shape == (2, 3, 2, 4)
    assert torch.equal(top, squares(rows, lambda x: x.amax(dim=(-2, -1))))
    expect = squares(r64, lambda x: x.sum(dim=(-2, -1)))
    assert torch.allclose(summed.double(), expect, rtol=1e-6)
    assert torch.equal(key_max, rows[..., torch.from_numpy(keys)].amax(-1))
    nothing = reductions.read(rows, start, [reductions.KeyMax(np.zeros(11, bool))])[0]
    assert bool((nothing == -1).all())
    # KeyLists: row 0 two keys (one twice), row 1 none, row 2 one past the width, rows 3, 4 one
    lists = [(np.array([0, 3, 3, 4, 5, 6]), np.array([2, 7, 2, 11, 0, 10])),
             (np.array([0, 0, 0, 0, 0, 0]), np.array([], dtype=np.int64))]  # fmt: skip
    asked = reductions.KeyLists(lambda a, b: lists if (a, b) == (start, start + 5) else None)
    (found,) = reductions.read(rows[:, 1:], start, [asked])  # a strided view
    r64 = r64[:, 1:]
    expect = torch.zeros(*found.shape, dtype=torch.float64)
    expect[..., 0, 0] = 2 * r64[..., 0, 2] + r64[..., 0, 7]
    expect[..., 3, 0], expect[..., 4, 0] = r64[..., 3, 0], r64[..., 4, 10]
    assert found.dtype == torch.float64 and found.shape == (2, 2, 5, 2)
    assert torch.allclose(found, expect, rtol=1e-12, atol=0)


def test_equal_reductions_are_read_once(monkeypatch):
    """Two recorders' equal Bins and one KeyMax's keys asked twice: each read once."""
    rows = _block()
    calls = []
    real = reductions._bins

    def counted(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(reductions, "_bins", counted)
    first, second = reductions.read(rows, 0, [reductions.Bins(3), reductions.Bins(3)])
    assert calls == [3] and first is second


def _loaded(model):
    from types import SimpleNamespace

    info = SimpleNamespace(implementation="sdpa", name=model.config.model_type)
    return SimpleNamespace(model=model, info=info)


def _first_row(given):
    """The first text of the matrix's batch of two: a streamed run reads one text."""
    return {name: value[:1] for name, value in given.items()}


class _Whole:
    """Each layer's whole probabilities (B, H, T, S), from the same pass."""

    def __init__(self, layers):
        self.wants = {layer: ("probs",) for layer in layers}
        self.probs = {}

    def receive(self, layer, tensors):
        self.probs[layer] = tensors["probs"][0].numpy()


def _streamed(model, given, n_layers, block_rows, att):
    """One pass: the whole maps, and the summary's and the pooled maps' recorders fed its
    blocks, as a streamed `show` feeds them."""
    from attnviz.analysis.pooling import Pooled
    from attnviz.analysis.summary import HeadStats
    from attnviz.pipelines.consumers.summary import _Blocks

    layers = list(range(n_layers))
    n_heads, n = att.weights.shape[1], att.weights.shape[2]
    stats = HeadStats(att, n_layers, n_heads)
    pooled = {how: Pooled(layers, n_heads, n, n, POOL, how, att.info.causal)
              for how in ("max", "mean")}  # fmt: skip
    whole = _Whole(layers)
    recorders = [whole, _Blocks(stats, layers), *pooled.values()]
    capture.run(_loaded(model), given, recorders, block_rows=block_rows)
    return whole, stats, pooled


def _facts(probs, ids):
    """The text's Attention over `probs` (L, H, T, T): its tokens (the ids, some repeated),
    its first token special, causal where the rows are."""
    tokens = [f"t{int(i) % 4}" if k % 3 else "," for k, i in enumerate(ids)]
    special = [True] + [False] * (len(tokens) - 1)
    att = synthetic_attention(probs, tokens, special)
    causal = bool(np.all(np.triu(probs, 1) == 0))
    return replace(att, info=replace(att.info, causal=causal))


def _text(model_type):
    """A matrix model and its first text: (model, inputs, layers, the text's Attention, its
    maps (L, H, T, T) held whole: no weights)."""
    from attnviz.core import layer_map

    model = any_models.build(model_type)
    given = _first_row(any_models.inputs(model_type, model))
    recording.register()
    model.set_attn_implementation(recording.implementation(model))
    layers, n = layer_map.n_layers(model, None), given["input_ids"].shape[1]
    whole = _Whole(range(layers))
    capture.run(_loaded(model), given, [whole], block_rows=n)
    probs = np.stack([whole.probs[layer] for layer in range(layers)])
    return model, given, layers, _facts(probs, given["input_ids"][0])


@pytest.mark.parametrize("model_type", ONE_STACK)
def test_statistics_from_blocks_equal_the_whole_matrix(model_type):
    """On every one-stack type of the any-model matrix, a pass in blocks of 1, 7 and T rows
    (each block's reads in one place, `core.reductions`) sums the same summary (role scores,
    each key's mean, special shares, strongest links) and the same pooled maps (max, mean)
    as the pass's whole matrix does, within 1e-6 (the entropies come from the function's
    softmax, the whole matrix's from each weight: 1e-7 apart)."""
    from attnviz.analysis.pooling import pool
    from attnviz.analysis.summary import HeadStats

    model, given, layers, att = _text(model_type)
    for size in (1, 7, len(att.tokens)):
        whole, stats, by_blocks = _streamed(model, given, layers, size, att)
        # the pass's own maps (the same within float32 rounding in any blocks): the reference
        probs = np.stack([whole.probs[layer] for layer in range(layers)])
        expected = HeadStats.of(replace(att, weights=probs))
        for name, values in stats.role_scores().items():
            want = expected.role_scores()[name]
            assert (values is None) == (want is None), name
            if values is not None:
                np.testing.assert_allclose(values, want, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(stats.key_means(), expected.key_means(), atol=1e-6)
        np.testing.assert_allclose(stats.special_shares(), expected.special_shares(), atol=1e-6)
        np.testing.assert_allclose(stats.link_weight, expected.link_weight, atol=1e-6)
        assert np.array_equal(stats.link_at, expected.link_at)
        for how, recorder in by_blocks.items():
            got = np.stack([recorder.result(layer).values for layer in range(layers)])
            want = pool(probs, POOL, how, att.info.causal).values
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=how)


def test_blocks_misread_fail_the_comparison(monkeypatch):
    """The comparison above can fail: bins of rows pooled one row off move the pooled maps."""
    from attnviz.analysis.pooling import pool

    model, given, layers, att = _text("llama")
    real = reductions._bins
    monkeypatch.setattr(reductions, "_bins", lambda rows, start, *rest: real(rows, start + 1,
                        *rest))  # fmt: skip
    whole, _, by_blocks = _streamed(model, given, layers, 4, att)
    probs = np.stack([whole.probs[layer] for layer in range(layers)])
    got = np.stack([by_blocks["max"].result(layer).values for layer in range(layers)])
    assert np.abs(got - pool(probs, POOL, "max", True).values).max() > 1e-3


def _a_streamed_show_pass() -> int:
    """A streamed `show`'s recorders of a llama's two layers in blocks of 4 rows (the
    summary's, two pooled maps'): one pass; how many blocks it made."""
    from attnviz.analysis.pooling import Pooled
    from attnviz.analysis.summary import HeadStats
    from attnviz.pipelines.consumers.summary import _Blocks

    model = any_models.build("llama")
    given = _first_row(any_models.inputs("llama", model))
    recording.register()
    model.set_attn_implementation(recording.implementation(model))
    n = given["input_ids"].shape[1]
    att = _facts(np.tril(np.ones((2, 4, n, n), "f4")), given["input_ids"][0])
    recorders = [_Blocks(HeadStats(att, 2, 4), [0, 1]),
                 *(Pooled([0, 1], 4, n, n, size, "max", True) for size in (2, 3))]  # fmt: skip
    capture.run(_loaded(model), given, recorders, block_rows=4)
    return 2 * -(-n // 4)  # two layers


def test_a_block_is_read_once_for_all_its_recorders(monkeypatch):
    """Where torch's operations make the rows (no compiled pass, `core.fused`), a streamed
    `show`'s recorders of a block have it read in one place: one `reductions.read` a block,
    with every reduction they asked (tests/test_fused.py: the compiled pass's the same)."""
    from attnviz.core import fused

    monkeypatch.setattr(fused, "kernel", lambda: None)
    reads = []
    real = reductions.read
    monkeypatch.setattr(reductions, "read", lambda rows, start, asked: reads.append(
        (start, len(asked))) or real(rows, start, asked))  # fmt: skip
    blocks = _a_streamed_show_pass()
    assert len(reads) == blocks
    assert all(count == 4 + 2 for _, count in reads)  # the summary's four, a pool's one each
