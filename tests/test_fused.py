"""The compiled pass over a block (`core.fused`): its probabilities and entropies within 1e-6
of the softmax's in float64 (and of torch's operations, `Scores.rows`, within their rounding),
each reduction its formula (`core.reductions`), at widths on both sides of the panels'
(`recording.PANEL_WIDTH`), causal or not, shared and per-head tables, one or two texts; a run
makes every block in it, with what every recorder asked, and torch reads none; without a
compiler, or with ATTNVIZ_KERNEL=0, torch's operations make the rows and nothing half-built is
left. (The statistics a streamed run sums with it on every one-stack model type of the
any-model matrix: tests/test_reductions.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.core import fused, recording, reductions

needs_kernel = pytest.mark.skipif(fused.kernel() is None, reason="no C compiler here")


def _scores(batch, n_heads, kv_heads, length, causal, seed=0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_heads, length, 16, generator=generator) * 3  # peaked rows too
    k = torch.randn(batch, kv_heads, length, 16, generator=generator)
    return recording.Scores(q, k, None, None, causal)


def _asked(batch, n_heads, length, seed=1):
    import torch

    rng = np.random.default_rng(seed)
    shared = rng.random((5, length)).astype("f4")
    own = torch.rand(batch, n_heads, 3, length + 4)[..., :length]  # a strided view
    marks = np.zeros(length, bool)
    marks[length // 2 :: 3] = True  # late keys alone: early rows of a causal block see none

    def lists(start, stop):  # each row's own keys, 0 … 5 of them, some past any row's width
        made = np.random.default_rng(start)
        found = []
        for _ in range(2):
            counts = made.integers(0, 6, stop - start)
            found.append((np.r_[0, np.cumsum(counts)], made.integers(0, length + 3, counts.sum())))
        return found

    return (reductions.KeySums(lambda a, b, w: shared[:, :w]),
            reductions.KeySums(lambda a, b, w: own[..., :w]),
            reductions.QuerySums(rng.random((2, length)).astype("f4")),
            reductions.Bins(5, "max"), reductions.Bins(7, "sum"), reductions.Bins(1, "max"),
            reductions.KeyLists(lists),
            reductions.KeyMax(marks), reductions.KeyMax(np.zeros(length, bool)))  # fmt: skip


def _definitions(probs, start, asked):
    """What each of `asked` reads of `probs` (B, H, b, W), by its formula in float64."""
    import torch

    p, found = probs.double(), []
    b, width = p.shape[-2:]
    for reduction in asked:
        if isinstance(reduction, reductions.KeySums):
            table = torch.as_tensor(reduction.table(start, start + b, width)).double()
            if table.dim() == 2:  # shared by every head
                found.append(torch.einsum("uhbw,kw->uhbk", p, table))
            else:  # each head's own
                found.append(
                    torch.einsum(
                        "uhbw,uhkw->uhbk", p, table.expand(*p.shape[:2], *table.shape[-2:])
                    )
                )
        elif isinstance(reduction, reductions.QuerySums):
            weights = torch.from_numpy(reduction.weights[:, start : start + b]).double()
            found.append(weights @ p)
        elif isinstance(reduction, reductions.Bins):
            size, rows, keys = reduction.size, torch.arange(start, start + b), torch.arange(width)
            columns = range(-(-width // size))
            squares = [[p[..., rows // size == k, :][..., keys // size == c] for c in columns]
                       for k in range(start // size, (start + b - 1) // size + 1)]  # fmt: skip
            pooled = [[cell.amax((-2, -1)) if reduction.how == "max" else cell.sum((-2, -1))
                       for cell in row] for row in squares]  # fmt: skip
            found.append(torch.stack([torch.stack(row, -1) for row in pooled], -2))
        elif isinstance(reduction, reductions.KeyLists):
            sums = torch.zeros(*p.shape[:-1], 2, dtype=torch.float64)
            for g, (offsets, keys) in enumerate(reduction.lists(start, start + b)):
                for i in range(b):
                    mine = [int(k) for k in keys[offsets[i] : offsets[i + 1]] if k < width]
                    sums[..., i, g] = p[..., i, mine].sum(-1)
            found.append(sums)
        else:
            keys = torch.from_numpy(reduction.keys[:width])
            found.append(p[..., keys].amax(-1) if bool(keys.any())
                         else torch.full(p.shape[:-1], -1.0, dtype=p.dtype))  # fmt: skip
    return found


def _truth(scores, start, stop):
    """Rows start … stop−1 by the softmax's definition in float64, and their entropies."""
    import torch

    raw = scores._raw(start, stop).double()
    if scores.trimmed:  # query i sees keys 0 … i
        later = torch.ones(stop - start, raw.shape[-1] - start, dtype=torch.bool).triu_(1)
        raw[..., start:].masked_fill_(later, float("-inf"))
    p = torch.softmax(raw, dim=-1)
    return p, -(p * p.clamp(min=1e-300).log()).sum(-1)


@needs_kernel
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("batch", "length", "start", "stop"),
                         [(1, 40, 13, 29), (2, 40, 0, 40), (1, 2100, 2050, 2100)])  # fmt: skip
def test_a_block_is_its_definitions(causal, batch, length, start, stop):
    """Rows start … stop−1 from the compiled pass (bins begun in an earlier block; 2,100
    keys: multiplied in panels): the probabilities and entropies within 1e-6 of the softmax's
    in float64, and torch's operations' within their rounding; each reduction its formula."""
    import torch

    scores = _scores(batch, 6, 2, length, causal)
    asked = _asked(batch, 6, length)
    want, want_entropy = _truth(scores, start, stop)
    torch_rows, torch_entropy = scores.rows(start, stop, entropy=True)
    got, entropy, found = fused.block(scores._raw(start, stop), start, scores.trimmed, True,
                                      asked)  # fmt: skip
    assert got.shape == want.shape and got.dtype == torch.float32 and len(found) == len(asked)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(got, torch_rows, rtol=0, atol=2e-6)
    torch.testing.assert_close(entropy, torch_entropy, rtol=0, atol=1e-4)  # torch's: 1e-5 off
    for mine, theirs, reduction in zip(found, _definitions(got, start, asked), asked):
        wide = isinstance(reduction, reductions.KeyLists)  # summed in float64
        assert mine.shape == theirs.shape, reduction
        assert mine.dtype == (torch.float64 if wide else torch.float32), reduction
        torch.testing.assert_close(mine.double(), theirs, rtol=1e-6, atol=1e-6)
    # the lists' sums as torch's read makes them from the same rows: the same bits
    lists = [r for r in asked if isinstance(r, reductions.KeyLists)][0]
    assert torch.equal(found[6], reductions.read(got, start, [lists])[0])
    assert float(found[6].abs().sum()) > 0
    if causal and start == 13:  # rows 13 … 19 see no marked key (20, 23, …): 0, as torch's
        assert bool((found[-2][..., :7] == 0).all()) and bool((found[-2][..., 7:] > 0).all())
    assert bool((found[-1] == -1).all())  # no marked key among the block's: −1


@needs_kernel
def test_a_run_reads_each_block_in_one_compiled_pass(monkeypatch):
    """A causal pass over blocks of 4 rows: one compiled pass a block, each with every
    reduction its recorders asked (the summary's four, a pooled map's one), none by torch."""
    from tests.test_reductions import _a_streamed_show_pass

    calls, reads = [], []
    real = fused.block
    monkeypatch.setattr(fused, "block", lambda raw, start, causal, entropy, asked: calls.append(
        len(asked)) or real(raw, start, causal, entropy, asked))  # fmt: skip
    monkeypatch.setattr(reductions, "read", lambda *args: reads.append(args) or [])
    blocks = _a_streamed_show_pass()
    assert len(calls) == blocks and all(count == 4 + 2 for count in calls) and not reads


def test_without_a_compiler_torch_makes_the_rows(monkeypatch, tmp_path):
    """ATTNVIZ_KERNEL=0, or a compiler that fails: no compiled pass, nothing half-built left
    in the cache folder, and the rows come from torch's operations."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        fused.kernel.cache_clear()
        monkeypatch.setenv(fused.OFF, "0")
        assert fused.kernel() is None
        monkeypatch.delenv(fused.OFF)
        fused.kernel.cache_clear()
        monkeypatch.setenv("CC", "false")  # exits 1, writes nothing
        assert fused.kernel() is None
        assert not fused.applies(_scores(1, 2, 2, 8, True))
        assert list((tmp_path / "attnviz" / "kernels").iterdir()) == []
        probs, _, found = _scores(1, 2, 2, 8, True).read_rows(0, 8, False, ())
        assert found is None and float(probs.sum(-1).min()) > 0.999
    finally:
        fused.kernel.cache_clear()


@needs_kernel
def test_the_pass_misread_fails_the_comparison(monkeypatch):
    """tests/test_reductions.py's comparison can fail on the compiled pass: its bins of
    rows summed where their max was asked move the pooled maps."""
    from attnviz.analysis.pooling import pool
    from tests.test_reductions import POOL, _streamed, _text

    model, given, layers, att = _text("llama")
    real = fused.block

    def misread(raw, start, causal, entropy, asked):
        wrong = [reductions.Bins(r.size, "sum") if isinstance(r, reductions.Bins) else r
                 for r in asked]  # fmt: skip
        return real(raw, start, causal, entropy, tuple(wrong))

    monkeypatch.setattr(fused, "block", misread)
    whole, _, by_blocks = _streamed(model, given, layers, 4, att)
    probs = np.stack([whole.probs[layer] for layer in range(layers)])
    got = np.stack([by_blocks["max"].result(layer).values for layer in range(layers)])
    assert np.abs(got - pool(probs, POOL, "max", True).values).max() > 1e-3


@needs_kernel
def test_rows_that_carry_a_gradient_are_made_by_torch():
    """q and k that need a gradient (a pass with autograd on): torch's operations make the
    rows, whose gradient reaches q as the float64 formula's does."""
    import torch

    scores = _scores(1, 2, 2, 12, True)
    assert fused.applies(scores)
    q = scores.query.clone().requires_grad_(True)
    graded = recording.Scores(q, scores.key, None, None, True)
    assert not fused.applies(graded)
    probs, _, found = graded.read_rows(0, 12)
    (probs * torch.arange(12.0)).sum().backward()
    exact = recording.Scores(q.detach().double().requires_grad_(True), scores.key.double(),
                             None, None, True)  # fmt: skip
    raw = exact._raw(0, 12).double()
    later = torch.ones(12, 12, dtype=torch.bool).triu_(1)
    (torch.softmax(raw.masked_fill(later, float("-inf")), -1) * torch.arange(12.0)).sum().backward()
    assert found is None and float((q.grad - exact.query.grad).abs().max()) < 1e-5
