"""The heatmaps: an overview, one grid per layer, one figure per head (and the query's),
drawn in worker processes that start while the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import Interrupted
from attnviz.outputs.files import TEXT_FILES
from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    from attnviz.core.models import Model


class Images(Consumer):
    def early(self, model: Model) -> None:
        if self.request.jobs > 1:
            from attnviz.outputs.render import start_workers

            start_workers(self.request.jobs)  # they import matplotlib while torch loads

    def write(self, run: Run, folder: Path) -> None:
        from attnviz.outputs.render import render_text, stop_workers

        asked = run.result.get("query")
        at = asked.index if asked is not None else None
        drawn, window, jobs = run.drawn, run.window, self.request.jobs
        try:
            if window is None or drawn is window:
                found = render_text(drawn, folder, run.layers, run.heads, run.style, query=at,
                                    jobs=jobs)  # fmt: skip
            else:  # the whole text pooled; each head (and the query) in the window, exact
                at = at - window.span[0] if at is not None and _inside(at, window) else None
                found = render_text(drawn, folder, run.layers, run.heads, run.style,
                                    ("overview", "layers"), jobs=jobs)  # fmt: skip
                found += render_text(window, folder, run.layers, run.heads, run.style,
                                     ("heads",), query=at, jobs=jobs)  # fmt: skip
            run.result["images"] = found
        except KeyboardInterrupt:
            stop_workers()  # the drawing processes finish what they started, then stop
            raise _interrupted(folder) from None


def _inside(index: int, window: Any) -> bool:
    first, end = window.span
    return first <= index < end


def _interrupted(folder: Path) -> Interrupted:
    """Ctrl-C while drawing: say how many images are complete (each is written whole or not
    at all); the folder has no done.json, so the next run draws them all again."""
    drawn = [p for p in folder.iterdir() if TEXT_FILES.fullmatch(p.name)]
    return Interrupted(
        f"{len(drawn)} image(s) written to {folder}/ before stopping; run the command again "
        "to draw them all"
    )
