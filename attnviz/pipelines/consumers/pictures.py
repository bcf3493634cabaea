"""A picture's views (a vision model's run): what each head does on it (`analysis.vision`),
and per layer each head's attention of the CLS token over the patches drawn over the picture,
with `--query ROW,COL` that patch's too; with `--measure rollout`, one figure of the rollout
composed up to each layer over the picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnviz.pipelines.consumers import Consumer, Run


class Pictures(Consumer):
    def finish(self, run: Run) -> None:
        from dataclasses import replace

        from attnviz.analysis.vision import vision_heads

        att = run.ranked  # norm: each row's lengths as shares
        if att.picture is None or att.per_layer:
            return
        run.made.vision = vision_heads(att, run.layers, run.heads, self.request.top_k)
        if att.picture.first == 0 and self.request.images:
            note = ("no CLS token (SigLIP pools with a head of its own): no CLS view over the "
                    "picture; --query ROW,COL draws a patch's")  # fmt: skip
            run.shown = replace(run.shown, notes=(*run.shown.notes, note))

    def write(self, run: Run, folder: Path) -> None:
        """The views over the picture, drawn in the drawing processes where there are some
        (each layer's a task, beside the heatmaps'), else here."""
        from dataclasses import replace

        from attnviz.analysis.query import find_query

        att, jobs = run.ranked, self.request.jobs
        if not self.request.images or att.picture is None:
            return
        queries = [0] if att.picture.first > 0 else []  # CLS, where the model has one
        if self.request.query is not None:
            queries.append(find_query(att, self.request.query))
        pool = None
        if jobs > 1:
            from attnviz.outputs.render import start_workers

            pool = start_workers(jobs)
        labels = replace(att, weights=att.weights[:0])  # what a drawing process needs
        drawn = []
        for query in dict.fromkeys(queries):
            for task in self._tasks(run, labels, query, folder):
                drawn.append(pool.submit(*task) if pool else task[0](*task[1:]))
        written = [found.result() if pool else found for found in drawn]
        run.made.images = [*run.made.images, *written]  # new: a result given out keeps its own

    def _tasks(self, run: Run, labels: Any, query: int, folder: Path) -> list[tuple]:
        """What draws `query`'s views: (function, its arguments), each layer's figure of the
        heads, or rollout's one figure of the layers."""
        from attnviz.outputs.figures.pictures import (
            overlay_name,
            query_rows,
            rollout_rows,
            save_overlay,
            save_rollout,
        )

        att, style, r = run.ranked, run.style, self.request
        if att.per_layer:
            how = f"heads' {r.fusion}, {r.discard:.0%} of each map discarded"
            path = folder / overlay_name(att, None, query, style.fmt)
            rows = rollout_rows(att, run.layers, query)
            return [(save_rollout, labels, run.layers, query, style, how, path, rows)]
        return [(save_overlay, labels, layer, run.heads, query, style,
                 folder / overlay_name(att, layer, query, style.fmt),
                 query_rows(att, layer, query)) for layer in run.layers]  # fmt: skip
