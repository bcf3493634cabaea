"""The share special tokens take of each head, by weight and by norm ‖α·f(x)‖, and with
`--measure alti` each layer's mixing ratios: from the same pass as the attention."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    from attnviz.core.attention import Attention


class Contributions(Consumer):
    special: Any = None

    def recorders(self, run: Run) -> list[Any]:
        import numpy as np

        from attnviz.analysis.contributions import SpecialShares

        if run.loaded.info.seq2seq or run.request.continues:  # a continuation keeps no X
            return []
        special = [np.array(run.encoded.special, dtype=bool)]
        self.special = SpecialShares.of(run.loaded, run.layers, special)
        return [self.special] if self.special else []

    def finish(self, run: Run) -> None:
        from attnviz.analysis.contributions import mixing_means

        found = self.special
        by_weight, by_norm = found.means()[:, 0] if found else (None, None)  # (L, H) each
        run.made.special_by_weight = _without_removed(by_weight, run.shown, run.layers)
        run.made.special_by_norm = _without_removed(by_norm, run.shown, run.layers)
        alti = self.request.measure == "alti" and not run.loaded.info.seq2seq
        n = len(run.encoded) if alti else 0
        run.made.mixing = mixing_means(run.measure_recorder, 0, n) if alti else None


def _without_removed(values: Any, att: Attention, layers: list[int]) -> Any:
    """Per-head values (L, H) over `layers`, NaN for the heads removed from the pass: a head
    whose output was set to 0 gave nothing, special tokens included."""
    if values is None or not att.removed:
        return values
    values = values.astype("f8")  # a copy
    for layer, head in att.removed:
        if layer in layers:
            values[layers.index(layer), head] = float("nan")
    return values
