"""`compare` of long texts (issue 61): past `memory.STREAM_ABOVE` each pair is compared a
block of rows at a time (`analysis.compare_blocks`), A and B in one pass (one model) or two in
step (two models), with the numbers of
the comparison held whole; the bound is set to 0 so that tiny models cross it."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz
from attnviz.core import memory
from attnviz.core.settings import Load
from attnviz.pipelines.compare import compare
from attnviz.pipelines.request import CompareRequest

PAIRS = [
    ("the keys to the cabinet are on the table and the cat sat on the mat",
     "the key to the cabinets is on the table and the cat sat on the mat"),
    ("the cat sat on the mat", "a big black cat sat quietly on the mat near the door"),
]  # fmt: skip


def _both(tiny_model_dirs, arch, monkeypatch, tmp_path, **fields):
    request = CompareRequest(Load(str(tiny_model_dirs[arch]), "cpu"), pairs=tuple(PAIRS),
                             out=tmp_path / "held", top=3, **fields)  # fmt: skip
    held = compare(request)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    from dataclasses import replace

    blocks = compare(replace(request, out=tmp_path / "blocks"))
    monkeypatch.undo()
    return held, blocks


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_a_comparison_in_blocks_equals_the_one_held_whole(tiny_model_dirs, arch, monkeypatch,
                                                          tmp_path):  # fmt: skip
    held, blocks = _both(tiny_model_dirs, arch, monkeypatch, tmp_path, query="sat")
    one, other = held.comparison, blocks.comparison
    assert all(p.texts is not None for p in other.pairs)  # it did go in blocks
    assert all(p.texts is None for p in one.pairs)
    np.testing.assert_allclose(other.divergence, one.divergence, atol=1e-6)
    np.testing.assert_allclose(other.special_change, one.special_change, atol=1e-6)
    for name, change in one.role_change.items():
        assert (change is None) == (other.role_change[name] is None)
        if change is not None:
            np.testing.assert_allclose(other.role_change[name], change, atol=1e-6)
    for p, q in zip(one.pairs, other.pairs, strict=True):
        np.testing.assert_allclose(q.rows, p.rows, atol=1e-6)  # NaN where the same
        np.testing.assert_allclose(q.grids_a, p.grids_a, atol=1e-6)  # short: not pooled
        np.testing.assert_allclose(q.grids_b, p.grids_b, atol=1e-6)
        np.testing.assert_allclose(q.a.weights, p.a.weights, atol=1e-6)
        assert q.tokens == p.tokens
    assert [(m.layer, m.head, m.pair) for m in blocks.moved] == [
        (m.layer, m.head, m.pair) for m in held.moved]  # fmt: skip
    for m, n in zip(held.moved, blocks.moved, strict=True):
        assert [t.index for t in n.top_a] == [t.index for t in m.top_a]
        assert m.pattern_a.role == n.pattern_a.role and m.pattern_b.role == n.pattern_b.role
    np.testing.assert_allclose(blocks.query.divergence, held.query.divergence, atol=1e-6)
    assert blocks.query.top_a.keys() == held.query.top_a.keys()
    assert [p.name for p in blocks.images] == [p.name for p in held.images]
    assert blocks.as_dict()["pairs"][0]["tokens_a"] == held.as_dict()["pairs"][0]["tokens_a"]


def test_the_api_compares_long_texts_in_blocks(tiny_model_dirs, monkeypatch):
    model = str(tiny_model_dirs["llama"])
    held = attnviz.compare(*PAIRS[1], model=model, device="cpu")
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    blocks = attnviz.compare(*PAIRS[1], model=model, device="cpu")
    np.testing.assert_allclose(blocks.divergence, held.divergence, atol=1e-6)
    assert blocks.a.pooled is None  # short: the exact maps, real values
    np.testing.assert_allclose(blocks.a.weights.sum(-1), 1.0, atol=1e-5)


def test_pooled_unit_grids_are_the_means_of_the_exact_ones(tiny_model_dirs, monkeypatch):
    """A pool of 2 units a cell: each cell the mean of the held grid's 2 × 2 cells."""
    from attnviz.pipelines import views

    model = str(tiny_model_dirs["bert"])
    held = attnviz.compare(*PAIRS[0], model=model, device="cpu").pairs[0]
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    monkeypatch.setattr(views, "image_pool_size", lambda *args: 2)
    pair = attnviz.compare(*PAIRS[0], model=model, device="cpu").pairs[0]
    assert pair.unit_size == 2 and pair.a.pooled == (2, "mean")
    u = held.grids_a.shape[-1]
    padded = np.zeros((*held.grids_a.shape[:2], u + u % 2, u + u % 2))
    padded[..., :u, :u] = held.grids_a
    cells = padded.reshape(*padded.shape[:2], (u + 1) // 2, 2, (u + 1) // 2, 2)
    counts = np.zeros((u + u % 2,) * 2)
    counts[:u, :u] = 1
    counts = counts.reshape((u + 1) // 2, 2, (u + 1) // 2, 2).sum(axis=(1, 3))
    np.testing.assert_allclose(pair.grids_a, cells.sum(axis=(3, 5)) / counts, atol=1e-6)
    assert pair.grid_labels() == held.labels[::2]


def test_a_comparison_over_the_memory_is_one_line_before_the_models_load(monkeypatch):
    from typer.testing import CliRunner

    from attnviz.cli import app
    from attnviz.core.models import Model

    monkeypatch.setattr(Model, "load", lambda self: pytest.fail("the model loaded"))
    monkeypatch.setenv(memory.ENV, "200MiB")
    done = CliRunner().invoke(app, ["compare", *PAIRS[0], "--no-images"])
    assert done.exit_code == 2
    (line,) = done.output.strip().splitlines()
    assert "compare of 1 pair(s)" in line and "200 MiB" in line


def test_in_blocks_a_long_comparison_needs_no_more_than_its_pooled_maps_and_blocks():
    """SmolLM2 (30 × 9 heads, 540 MB of weights): 8,085 tokens a side within 4 GiB in blocks;
    held whole, 1,720 tokens a side would take tens of GiB (float64 grids)."""
    weights = 540 * 10**6
    blocks = memory.compare_estimate(30, 9, weights, [(8085, 8085)], in_blocks=True).total
    held = memory.compare_estimate(30, 9, weights, [(1720, 1720)], in_blocks=False).total
    assert memory.compare_in_blocks(30, 9, [(1720, 1720)])
    assert blocks < 4 * memory.GiB < 10 * memory.GiB < held
    # two models' passes at once, as measured at 8,085 tokens (2026-12-02): 3.88 GiB
    two = memory.compare_estimate(30, 9, 2 * weights, [(8085, 8085)], True, two_passes=True)
    assert 3.88 * memory.GiB < two.total < 4.5 * memory.GiB


@pytest.fixture(scope="module")
def changed_llama(tiny_model_dirs, tmp_path_factory):
    """The tiny llama with one head's W_Q changed: a second model of the same shape."""
    from conftest import perturbed_copy

    folder = tmp_path_factory.mktemp("changed") / "llama"
    return perturbed_copy(tiny_model_dirs["llama"], folder, 1, 2)


@pytest.mark.parametrize("rows", [1, 3, 256])
def test_two_models_compared_in_step_equal_the_comparison_held_whole(
    tiny_model_dirs, changed_llama, monkeypatch, tmp_path, rows
):
    """Two models, each reading its text in its own pass, the passes kept in step a block of
    `rows` query rows at a time: the same numbers as both held whole (texts of unequal
    lengths: one side's blocks end before the other's)."""
    from attnviz.analysis import compare_blocks

    request = CompareRequest(Load(str(tiny_model_dirs["llama"]), "cpu"), pairs=tuple(PAIRS),
                             against=Load(str(changed_llama), "cpu"), out=None,
                             query="sat")  # fmt: skip
    held = compare(request)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    monkeypatch.setattr(memory, "stream_rows", lambda *args: rows)
    most = []  # the units waiting for their partner, at most, over the run
    real = compare_blocks.Lockstep.hand_in

    def hand_in(self, side, layer, start, block, entropy):
        real(self, side, layer, start, block, entropy)
        most.append(sum(len(u) for s in self.pair.sides for u in s.waiting.values()))

    monkeypatch.setattr(compare_blocks.Lockstep, "hand_in", hand_in)
    blocks = compare(request)
    one, other = held.comparison, blocks.comparison
    assert all(p.texts is not None for p in other.pairs)  # it did go in blocks
    np.testing.assert_allclose(other.divergence, one.divergence, atol=1e-6)
    np.testing.assert_allclose(other.special_change, one.special_change, atol=1e-6)
    for p, q in zip(one.pairs, other.pairs, strict=True):
        np.testing.assert_allclose(q.rows, p.rows, atol=1e-6)
        np.testing.assert_allclose(q.grids_a, p.grids_a, atol=1e-6)
        np.testing.assert_allclose(q.grids_b, p.grids_b, atol=1e-6)
    np.testing.assert_allclose(blocks.query.divergence, held.query.divergence, atol=1e-6)
    assert one.divergence[0].max() > 0 and one.divergence[1, 2] == one.divergence.max()
    # in step: a few blocks of rows wait for their partner, never a layer's
    longest = max(len(p.a.tokens) + len(p.b.tokens) for p in one.pairs)
    assert most and max(most) <= min(longest, 4 * rows + 8)


def test_a_failure_in_one_side_s_pass_is_raised_and_stops_the_other(
    tiny_model_dirs, changed_llama, monkeypatch
):
    from attnviz.analysis import compare_blocks

    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    monkeypatch.setattr(memory, "stream_rows", lambda *args: 1)
    real = compare_blocks.PairBlocks.add
    seen = []

    def add(self, side, layer, start, rows, entropy):
        seen.append(side)
        if side == 1 and start == 3:
            raise MemoryError("B's pass ran out")
        return real(self, side, layer, start, rows, entropy)

    monkeypatch.setattr(compare_blocks.PairBlocks, "add", add)
    with pytest.raises(MemoryError, match="B's pass ran out"):
        attnviz.compare(*PAIRS[0], model=str(tiny_model_dirs["llama"]),
                        against_model=str(changed_llama), device="cpu")  # fmt: skip
    assert seen.count(0) <= 6  # A stopped within a few blocks of B's failure
