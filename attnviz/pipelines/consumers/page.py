"""`--html`: the interactive page, attention.html, from the same pass: every measure for
its switch and each layer's input for the inside view (every stack of an encoder-decoder
model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnviz.pipelines.consumers import Consumer, Run
from attnviz.pipelines.views import page_pool_size


class Page(Consumer):
    inside: Any = None  # InsideSteps (one stack) or StacksInside
    every: Any = None  # EveryMeasure (one stack)

    def every_stack(self, run: Run) -> bool:
        """Whether the pass reads every stack (an encoder-decoder model's page switches)."""
        return run.loaded.info.seq2seq

    def recorders(self, run: Run) -> list[Any]:
        from attnviz.analysis.contributions import PageParts
        from attnviz.analysis.inside import CONTINUED, StacksInside

        if run.loaded.info.seq2seq:
            self.inside = StacksInside(run.loaded)  # each stack's inside view
            return self.inside([run.encoded])
        n, info = len(run.encoded), run.loaded.info
        # pooled: the weights alone (each measure's maps are held whole); a continuation:
        # the weights alone, as the pass kept each layer's q and k
        alone = (self.request.continues or run.streamed
                 or page_pool_size(len(run.layers), info.n_heads, n, n) > 1)  # fmt: skip
        parts = PageParts(run.loaded, run.layers, [run.encoded], self.request.measure,
                          measures=not alone)  # fmt: skip
        self.inside, self.every = parts.inside, parts.every
        if self.request.continues:
            self.inside.leave_out(0, CONTINUED)
            return []
        return parts.recorders()

    def contents(self, run: Run) -> tuple[Any, dict[str, Any]]:
        """The page's attention and the rest of what `outputs.html` builds it from."""
        r, style = self.request, run.style
        if run.stacks is not None:
            stacks = {name: _view(r, att) for name, att in run.stacks.items()}
            options = dict(stacks=stacks, inside=self.inside.results(), scale=style.scale,
                           cmap=style.cmap)  # fmt: skip
            return stacks[run.shown.stack], options
        view = run.window if r.window is not None else (run.page_view or run.shown)
        # a picture and a prompt's tower, and Mllama's cross-attention layers over the
        # picture: whole whatever the maps' pooling
        tower, cross = run.made.tower, run.cross
        if self.every is None or view is not run.shown:  # pooled, or a window: its weights
            return view, dict(inside=self.inside.result(), scale=style.scale, cmap=style.cmap,
                              segments=view.segments, tower=tower, cross=cross)  # fmt: skip
        found = self.every.page(run.raw, run.shown, lambda att: _view(r, att), run.measure_recorder)
        return found.weights, dict(inside=self.inside.result(), scale=style.scale,
                                   cmap=style.cmap, segments=run.shown.segments,
                                   measures=found.others, lengths=found.lengths,
                                   initial=r.measure, tower=tower, cross=cross)  # fmt: skip

    def write(self, run: Run, folder: Path) -> None:
        from attnviz.outputs.html import write_page

        att, options = self.contents(run)
        run.made.page = write_page(att, folder / "attention.html", **options)


def _view(r: Any, att: Any) -> Any:
    from attnviz.analysis.transforms import transform

    return transform(att, r.words, r.hide_special)
