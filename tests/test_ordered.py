"""Sums in one fixed order (attnviz.analysis.ordered): any split of the items, summed apart and
merged in any order, gives the bits of one process's sum; a plain running sum does not."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.analysis.ordered import OrderedSum


def _items(n: int, seed: int = 0) -> list[np.ndarray]:
    """Per-item float64 arrays of very different magnitudes, where the order of additions
    shows in the last bits."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(5) * 10.0 ** float(rng.integers(-8, 8)) for _ in range(n)]


def _summed(items: list[np.ndarray], indices) -> OrderedSum:
    part = OrderedSum()
    for i in indices:
        part.add(i, items[i])
    return part


@pytest.mark.parametrize("n", [1, 2, 7, 64, 101])
def test_any_split_merged_in_any_order_gives_the_same_bits(n):
    items = _items(n)
    whole = _summed(items, range(n)).total()
    rng = np.random.default_rng(n)
    for parts in (2, 3, 5):
        cuts = sorted(rng.choice(np.arange(n + 1), parts - 1))
        bounds = [0, *cuts, n]
        pieces = [_summed(items, range(a, b)) for a, b in zip(bounds, bounds[1:])]
        order = rng.permutation(len(pieces))
        merged = pieces[order[0]]
        for k in order[1:]:
            merged = merged.merge(pieces[k])
        assert merged.total().tobytes() == whole.tobytes()
    # scattered parts too: every third item in each
    scattered = [_summed(items, range(k, n, 3)) for k in range(3)]
    assert scattered[2].merge(scattered[0]).merge(scattered[1]).total().tobytes() == whole.tobytes()


def test_a_running_sum_split_in_two_gives_other_bits():
    """What the fixed order is for: the plain float64 running sum of the same items, taken in
    one process and as two halves added, differs in its last bits."""
    items = _items(101)
    running = np.zeros(5)
    for item in items:
        running += item
    first, second = np.zeros(5), np.zeros(5)
    for item in items[:50]:
        first += item
    for item in items[50:]:
        second += item
    assert (first + second).tobytes() != running.tobytes()
    assert np.allclose(first + second, running, rtol=1e-12, atol=0)


def test_items_without_a_value_add_nothing_and_a_gap_or_a_repeat_is_refused():
    items = _items(6)
    part = OrderedSum()
    for i in range(6):
        part.add(i, None if i in (1, 4) else items[i])
    expected = _summed(
        [x if i not in (1, 4) else np.zeros(5) for i, x in enumerate(items)], range(6)
    )
    assert np.allclose(part.total(), expected.total(), rtol=1e-15, atol=0)
    assert OrderedSum().merge(OrderedSum()).total() is None
    with pytest.raises(ValueError, match="gap"):
        _summed(items, [0, 1]).merge(_summed(items, [3, 4])).total()
    with pytest.raises(ValueError, match="twice"):
        _summed(items, [0, 1, 2]).merge(_summed(items, [2, 3]))
    with pytest.raises(ValueError, match="twice"):
        part.add(5, items[5])


def test_a_part_keeps_few_blocks_and_travels_as_arrays():
    items = _items(1000)
    part = _summed(items, range(123, 877))
    assert len(part.blocks) <= 2 * 10  # about 2·log2(n), not one per item
    arrays, index = part.arrays("x")
    again = OrderedSum.from_arrays("x", arrays, index)
    whole = _summed(items, range(123)).merge(again).merge(_summed(items, range(877, 1000)))
    assert whole.total().tobytes() == _summed(items, range(1000)).total().tobytes()
