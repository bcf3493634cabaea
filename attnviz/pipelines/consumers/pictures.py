"""A picture's views (a vision model's run): what each head does on it (`analysis.vision`),
and per layer each head's attention of the CLS token over the patches drawn over the picture,
with `--query ROW,COL` that patch's too; with `--measure rollout`, one figure of the rollout
composed up to each layer over the picture."""

from __future__ import annotations

from pathlib import Path

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
        from attnviz.analysis.query import find_query
        from attnviz.outputs.figures.pictures import picture_tasks, rollout_how, views_of

        att, jobs = run.ranked, self.request.jobs
        if not self.request.images or att.picture is None:
            return
        asked = self.request.query
        queries = views_of(att, find_query(att, asked) if asked is not None else None)
        pool = None
        if jobs > 1:
            from attnviz.outputs.render import start_workers

            pool = start_workers(jobs)
        how = rollout_how(self.request.fusion, self.request.discard)
        tasks = picture_tasks(att, folder, run.layers, run.heads, run.style, queries, how)
        drawn = [pool.submit(*task) if pool else task[0](*task[1:]) for task in tasks]
        written = [found.result() if pool else found for found in drawn]
        run.made.images = [*run.made.images, *written]  # new: a result given out keeps its own
