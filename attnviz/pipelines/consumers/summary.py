"""The per-head summary `show` prints and `--json` holds: each chosen head's pattern, top
keys and strongest links."""

from __future__ import annotations

from typing import Any

from attnviz.pipelines.consumers import Consumer, Run


class Summary(Consumer):
    stats: Any = None  # analysis.summary.HeadStats, summed from a streamed run's blocks

    def recorders(self, run: Run) -> list[Any]:
        from attnviz.analysis.summary import HeadStats

        if not run.streamed:
            return []
        self.stats = HeadStats(run.raw, len(run.layers), run.loaded.info.n_heads)
        return [_Blocks(self.stats, run.layers)]

    def finish(self, run: Run) -> None:
        from attnviz.analysis.summary import summarise

        ranked = run.shown if run.streamed else run.ranked  # streamed: the weights
        summaries = summarise(ranked, run.layers, run.heads, self.request.top_k, stats=self.stats)
        run.made.summaries = summaries


class _Blocks:
    """A capture recorder adding each block of rows (batch row 0) to the summary's sums."""

    def __init__(self, stats: Any, layers: list[int]) -> None:
        self.stats, self.slot = stats, {layer: i for i, layer in enumerate(layers)}
        self.wants = {layer: ("rows", "entropy") for layer in layers}

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def reductions(self, layer: int) -> tuple:
        return self.stats.asked  # read with the other recorders' (`core.reductions`)

    def receive_rows(self, layer: int, start: int, rows: Any, entropy: Any,
                     found: Any = None) -> None:  # fmt: skip
        mine = None if found is None else [part[0] for part in found]
        self.stats.add(start, rows[0], self.slot[layer], entropy[0], mine)  # (H, b, S), (H, b)
