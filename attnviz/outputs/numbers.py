"""Numbers in tables: one format per column, so decimal points line up and neighbours read
alike (`.4g` gave 0.0519 beside 0.09542)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def decimals(values: Sequence[float], significant: int = 3, least: int = 2, most: int = 6) -> int:
    """Decimal places for a column of `values`: enough to show its smallest non-zero
    magnitude with `significant` digits, at least `least`, at most `most`."""
    magnitudes = [abs(v) for v in values if v and math.isfinite(v)]
    if not magnitudes:
        return least
    places = significant - 1 - math.floor(math.log10(min(magnitudes)))
    return min(max(places, least), most)


def column(values: Sequence[float]) -> list[str]:
    """`values` formatted alike, with `decimals(values)` places each."""
    places = decimals(values)
    return [f"{value:.{places}f}" for value in values]
