"""Pooled maps (`attnviz.analysis.pooling`): the same from blocks of any size as from the whole
map, equal to a plain loop over the cells, and a decoder's masked cells left out of the mean."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.analysis.pooling import Pooled, pool, pool_size


def _loop(grid: np.ndarray, size: int, how: str, causal: bool) -> np.ndarray:
    """Each pooled cell from its cells one by one."""
    n_queries, n_keys = grid.shape
    out = np.zeros((-(-n_queries // size), -(-n_keys // size)))
    for r in range(out.shape[0]):
        for c in range(out.shape[1]):
            cells = [
                grid[i, j]
                for i in range(r * size, min((r + 1) * size, n_queries))
                for j in range(c * size, min((c + 1) * size, n_keys))
                if not (causal and j > i)
            ]
            if cells:
                out[r, c] = np.mean(cells) if how == "mean" else np.max(cells)
    return out


def _maps(n_heads: int, n_queries: int, n_keys: int, causal: bool, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grid = rng.random((n_heads, n_queries, n_keys)).astype(np.float32)
    if causal:
        grid *= np.tril(np.ones((n_queries, n_keys), dtype=np.float32))
    return grid / grid.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("how", ["mean", "max"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("size", [1, 3, 4, 37])
def test_pooled_equals_a_loop_over_the_cells(how, causal, size):
    grid = _maps(2, 37, 37, causal)
    found = pool(grid, size, how, causal)
    assert found.values.shape == (2, -(-37 // size), -(-37 // size)) and found.size == size
    for head in range(2):
        np.testing.assert_allclose(found.values[head], _loop(grid[head], size, how, causal),
                                   rtol=1e-6, atol=1e-9)  # fmt: skip


@pytest.mark.parametrize("how", ["mean", "max"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 7, 50])
def test_blocks_of_rows_give_the_whole_maps_pooling(how, causal, block):
    grid = _maps(3, 50, 50 if causal else 23, causal, seed=1)  # cross-attention: S != T
    whole = pool(grid, 4, how, causal).values
    streamed = Pooled([5], 3, grid.shape[1], grid.shape[2], 4, how, causal)
    for start in range(0, grid.shape[1], block):
        streamed.add(5, start, grid[:, start : start + block])
    np.testing.assert_allclose(streamed.result(5).values, whole, rtol=1e-6, atol=1e-9)


def test_the_mean_of_a_decoder_leaves_masked_cells_out():
    grid = _maps(1, 4, 4, causal=True)
    found = pool(grid, 2, "mean", causal=True).values[0]
    assert found[0, 0] == pytest.approx((grid[0, 0, 0] + grid[0, 1, 0] + grid[0, 1, 1]) / 3)
    assert found[0, 1] == 0.0  # every cell above the diagonal: nothing to show
    # pooled means of row-stochastic maps stay within [0, 1]
    assert 0.0 <= found.min() and found.max() <= 1.0


def test_pool_size_keeps_the_longer_side_within_the_limit():
    assert pool_size(100, 100, 512) == 1
    assert pool_size(8085, 8085, 512) == 16 and -(-8085 // 16) <= 512
    assert pool_size(513, 20, 512) == 2
    with pytest.raises(ValueError):
        pool_size(10, 10, 0)
