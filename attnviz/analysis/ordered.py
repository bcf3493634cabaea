"""Sums over a corpus that come out the same to the last bit however the corpus is split.

Floating-point addition is not associative: the sum of texts 0…9 taken in one process, and
the sum of a shard's texts 0…4 plus another's 5…9, differ in their last bits, and so can a
printed digit. `OrderedSum` fixes the order instead: each text's float64 array is a block at
its index i (level 0); two sibling blocks, [k·2^(j+1), k·2^(j+1) + 2^j) and the 2^j items
after it, are added (left + right) into one block of level j + 1 as soon as both are there
(pairwise summation on a fixed tree over the indices). A block's value is then a function of
its items alone, so any split of the texts into contiguous or scattered parts, summed apart
and merged in any order, ends in the same blocks: the binary decomposition of [0, n), folded
left to right. A part holds at most about 2·log2(n) blocks, so memory stays flat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# a block: (first index, level, value); it covers indices first … first + 2^level − 1, and
# a value of None adds nothing (a text with nothing to count here)
Block = tuple[int, int, Any]


def _add(left: Any, right: Any) -> Any:
    if left is None:
        return right
    if right is None:
        return left
    return left + right


def _siblings(left: Block, right: Block) -> bool:
    (start, level, _), (other, other_level, _) = left, right
    return level == other_level and start % (2 ** (level + 1)) == 0 and other == start + 2**level


class OrderedSum:
    """The float64 sum of per-item arrays (or None) indexed 0, 1, …, in one fixed order.

    `add(i, value)` for increasing i; `merge` another part (its items disjoint from these);
    `total()` once the items 0 … n−1 are all there.
    """

    def __init__(self, blocks: list[Block] | None = None) -> None:
        self.blocks: list[Block] = []
        for block in sorted(blocks or [], key=lambda b: b[0]):
            self._push(block)

    def _push(self, block: Block) -> None:
        if self.blocks:
            start, level, _ = self.blocks[-1]
            if block[0] < start + 2**level:
                raise ValueError(f"item {block[0]} is summed twice (or out of order)")
        self.blocks.append(block)
        while len(self.blocks) >= 2 and _siblings(self.blocks[-2], self.blocks[-1]):
            right = self.blocks.pop()
            start, level, left = self.blocks.pop()
            self.blocks.append((start, level + 1, _add(left, right[2])))

    def add(self, index: int, value: np.ndarray | None) -> None:
        """Add item `index`'s array (float64; None: nothing to add), after the items before."""
        import numpy as np

        self._push((index, 0, None if value is None else np.asarray(value, dtype=np.float64)))

    def merge(self, other: OrderedSum) -> OrderedSum:
        """This part and `other` (disjoint items) as one, exactly as if summed together."""
        return OrderedSum(self.blocks + other.blocks)

    def span(self) -> int:
        """How many items from 0 on are summed without a gap (the total needs all of them)."""
        end = 0
        for start, level, _ in self.blocks:
            if start != end:
                break
            end = start + 2**level
        return end

    def total(self) -> np.ndarray | None:
        """The sum of every item, 0 … n−1 with no gap (None if none had a value)."""
        if self.span() != sum(2**level for _, level, _ in self.blocks):
            raise ValueError("the items summed leave a gap: a part is missing")
        found = None
        for _, _, value in self.blocks:
            found = _add(found, value)
        return found

    def items(self) -> int:
        """How many items were added."""
        return sum(2**level for _, level, _ in self.blocks)

    def arrays(self, name: str) -> tuple[dict[str, np.ndarray], list[list[int]]]:
        """The blocks as named arrays and their (first index, level, has a value) list, for
        a file (`from_arrays` reads them back)."""
        arrays, index = {}, []
        for k, (start, level, value) in enumerate(self.blocks):
            index.append([start, level, value is not None])
            if value is not None:
                arrays[f"{name}.{k}"] = value
        return arrays, index

    @classmethod
    def from_arrays(
        cls, name: str, arrays: dict[str, np.ndarray], index: list[list[int]]
    ) -> OrderedSum:
        blocks = [
            (int(start), int(level), arrays[f"{name}.{k}"] if has else None)
            for k, (start, level, has) in enumerate(index)
        ]
        return cls(blocks)
