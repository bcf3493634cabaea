"""A picture's views. A vision model's run: what each head does on it (`analysis.vision`),
and per layer each head's attention of the CLS token over the patches drawn over the picture,
with `--query ROW,COL` that patch's too; with `--measure rollout`, one figure of the rollout
composed up to each layer over the picture. A vision-language model's: per layer each head's
attention of the answer over the picture (the mean of the rows that wrote its tokens), with
`--query` that token's too, and the picture's share of the answer's attention per layer and
head (picture-share.png); and its vision tower's heads from the same pass (`consumers.tower`:
per tower layer, each head's CLS row or mean received attention over the picture,
tower-layer-L.png, titled with their roles and mean attention distance); Mllama's, whose
picture is read by cross-attention layers (`run.cross`), the same views of those layers (their
keys over the picture, the share on its patches)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    from attnviz.core.attention import Attention

# Why a streamed run (a long prompt) draws nothing over the picture.
STREAMED = ("no views over the picture: this run's maps were too large to hold, and were "
            "summed a block of rows at a time as the pass made them")  # fmt: skip


class Pictures(Consumer):
    def wants_cross(self) -> bool:
        return self.request.prompt is not None

    def finish(self, run: Run) -> None:
        from dataclasses import replace

        from attnviz.analysis.vision import vision_heads

        att = run.ranked  # norm: each row's lengths as shares
        if att.layout is not None and run.streamed and self.request.images:
            run.shown = replace(run.shown, notes=(*run.shown.notes, STREAMED))
        if run.cross is not None and self.request.query is not None:
            note = _unseen_query(run, self.request.query)
            if note is not None:
                run.shown = replace(run.shown, notes=(*run.shown.notes, note))
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
        from attnviz.outputs.figures.pictures import (
            layout_tasks,
            picture_tasks,
            rollout_how,
            tower_tasks,
            views_of,
        )

        att, jobs = run.ranked, self.request.jobs
        held = att.layout is not None and not run.streamed and not att.per_layer
        if not self.request.images:
            return
        tasks = []
        if att.picture is not None or held:
            asked = self.request.query
            query = find_query(att, asked) if asked is not None else None
            if att.picture is not None:
                how = rollout_how(self.request.fusion, self.request.discard)
                tasks = picture_tasks(att, folder, run.layers, run.heads, run.style,
                                      views_of(att, query), how)  # fmt: skip
            else:
                tasks = layout_tasks(att, folder, run.layers, run.heads, run.style, query)
        if run.made.tower is not None:
            tasks += tower_tasks(att, run.made.tower, folder, run.style)
        if run.cross is not None:  # Mllama's cross-attention layers, every one
            cross, asked = run.cross, self.request.query
            query = find_query(cross, asked) if asked is not None else None
            tasks += layout_tasks(cross, folder, cross.held_layers(), run.heads, run.style, query)
        if not tasks:
            return
        pool = None
        if jobs > 1:
            from attnviz.outputs.render import start_workers

            pool = start_workers(jobs)
        drawn = [pool.submit(*task) if pool else task[0](*task[1:]) for task in tasks]
        written = [found.result() if pool else found for found in drawn]
        if att.picture is None and held:
            written.append(_share_figure(run, att, run.layers, folder))
        if run.cross is not None:
            written.append(_share_figure(run, run.cross, run.cross.held_layers(), folder))
        run.made.images = [*run.made.images, *written]  # new: a result given out keeps its own


def _unseen_query(run: Run, asked: str) -> str | None:
    """What to say of `--query`'s token where it sees none of the picture (Mllama's mask: a
    token before it), whose cross-attention row is drawn all the same; None where it sees."""
    from attnviz.analysis.query import find_query
    from attnviz.core.cross_picture import seen

    query = find_query(run.cross, asked)
    if seen(run.encoded)[query]:
        return None
    return (f"{run.cross.tokens[query]}@{query} comes before the picture and sees none of it: "
            "its cross-attention row (drawn) is the model's uniform one over every key, and "
            "the model drops that row's output")  # fmt: skip


def _share_figure(run: Run, att: Attention, layers: list[int], folder: Path) -> Path:
    """picture-share.png: the picture's share of the answer's attention (`att`'s: the
    language model's, or its cross-attention's) by layer and head."""
    from attnviz.analysis.picture_share import picture_shares, whose_rows
    from attnviz.outputs.figures.pictures import share_figure
    from attnviz.outputs.figures.raster import save_figure

    found = picture_shares(att)
    slots = [found.layers.index(layer) for layer in layers]
    values = found.share[slots][:, run.heads]  # (L, H) of the chosen layers and heads
    figure = share_figure(att, values, layers, run.heads, whose_rows(att), run.style)
    return save_figure(figure, folder / f"picture-share.{run.style.fmt}", run.style)
