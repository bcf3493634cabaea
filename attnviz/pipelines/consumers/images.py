"""The heatmaps: an overview, one grid per layer, one figure per head (and the query's),
drawn in worker processes that start while the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import Interrupted
from attnviz.outputs.files import TEXT_FILES
from attnviz.pipelines.consumers import Consumer, Run, encoded_ahead

if TYPE_CHECKING:
    from attnviz.core.models import Model


class Images(Consumer):
    def early(self, model: Model) -> None:
        """Start the drawing processes: they import matplotlib while torch loads, then lay
        out the text's figures from its tokens alone, where the figures will be of the text
        as read (not pooled, windowed, or another view: those are laid out when drawn)."""
        if self.request.jobs <= 1:
            return
        from attnviz.outputs.render import prepare, start_workers

        start_workers(self.request.jobs)
        ahead = _labels_ahead(self.request, model)
        if ahead is not None:
            prepare(*ahead, self.request.jobs)

    def write(self, run: Run, folder: Path) -> None:
        from attnviz.outputs.render import render_text, stop_workers

        asked = run.made.query
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
            run.made.images = [*run.made.images, *found]  # new: a result given out keeps its own
        except KeyboardInterrupt:
            stop_workers()  # the drawing processes finish what they started, then stop
            raise _interrupted(folder) from None


def _labels_ahead(request: Any, model: Model) -> tuple[Any, list[int], Any] | None:
    """The text's Attention with no weights (a stand-in of their shape), its heads and style,
    from the model's files and tokenizer before the weights load, where the figures will
    draw the text as read: the weights of a short text (nothing pooled or streamed), no
    window, word view, hidden special tokens, removed heads or other measure; else None."""
    import numpy as np

    from attnviz.core import memory
    from attnviz.core.extract import text_attention
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.views import image_pool_size

    r = request
    plain = r.measure == "weights" and not (r.words or r.hide_special or r.ablate or r.window)
    ahead = encoded_ahead(r, model) if plain else None
    if ahead is None:
        return None
    spec, encoded = ahead
    layers = spec.pick_layers(list(r.layers) if r.layers else None)
    heads = spec.pick_heads(list(r.heads) if r.heads else None)
    n = len(encoded)
    if (
        memory.streams(spec.n_layers, spec.n_heads, n, memory.Asked.of(r))
        or image_pool_size(len(layers), spec.n_heads, n, n) > 1
    ):
        return None
    stand_in = np.broadcast_to(np.zeros((), np.float32), (len(layers), spec.n_heads, n, n))
    return text_attention(encoded, spec, layers, stand_in), heads, r.style or Style()


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
