"""What a run draws of its attention: every head's map as it is, or pooled where it is longer
than a picture or the page can show (`analysis.pooling`), and the exact cells of a window
(`--window START:END`, or around `--query` on a long text; `analysis.window`).

A run that holds its maps whole (`run.streamed` False) pools and cuts them at the end; a
streamed one gets the same numbers from recorders fed by the pass, a block of rows at a time.
The views land on the run: `run.drawn` (figures, the terminal's heatmap), `run.page_view`
(the page) and `run.window`. A view nothing draws is not made: `run.drawn` is None where no
figure is drawn (`--no-images`) and the terminal draws no heatmap (one layer and one head).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.core.attention import Attention

Run = Any  # pipelines.consumers.Run (which imports this module: no import back)

# The cells of every head's pooled map the figures are drawn from at most (256 MiB of
# float32): a model of many heads pools its figures further than MAX_SIDE.
IMAGE_CELLS = 64 * 2**20
# The cells of every head the page carries at most (about 5 MB once deflated, within its
# 8 MB): a longer text's page is pooled to fit.
PAGE_CELLS = 20 * 2**20


def image_pool_size(n_layers: int, n_heads: int, n: int, n_keys: int) -> int:
    """How many cells a cell of the figures pools along each axis: 1 while every head's map
    fits within IMAGE_CELLS (and MAX_SIDE a side)."""
    return _pool_size(IMAGE_CELLS, n_layers * n_heads, n, n_keys)


def page_pool_size(n_layers: int, n_heads: int, n: int, n_keys: int) -> int:
    """How many cells a cell of the page pools along each axis: 1 while every head's map fits
    within PAGE_CELLS (and MAX_SIDE a side)."""
    return _pool_size(PAGE_CELLS, n_layers * n_heads, n, n_keys)


def _pool_size(cells: int, maps: int, n: int, n_keys: int) -> int:
    from attnviz.analysis.pooling import MAX_SIDE, pool_size

    side = max(1, math.isqrt(cells // max(1, maps)))
    return pool_size(n, n_keys, min(side, MAX_SIDE))


class Views:
    """The views of one run: their pooling and window, their recorders (a streamed run), and
    `finish`, which puts them on the run."""

    def __init__(self, run: Run, n: int, n_keys: int) -> None:
        """The views of `run`'s attention over `n` queries and `n_keys` keys (its tokens, or
        its words)."""
        from attnviz.analysis.window import around, check_window

        r = run.request
        self.how, self.causal = r.pool, run.loaded.info.causal
        self.layers, self.n_heads = run.layers, run.loaded.info.n_heads
        self.draws = _draws(run)
        self.image_size = image_pool_size(len(run.layers), self.n_heads, n, n_keys)
        size = page_pool_size(len(run.layers), self.n_heads, n, n_keys)
        self.page_size = size if r.html else None
        self.span = r.window
        if self.span is None and r.query is not None and self.image_size > 1:  # a long text
            from attnviz.analysis.query import find_query

            self.span = around(find_query(run.shown or run.raw, r.query), n)
        if self.span is not None:
            check_window(*self.span, n)
        self.pooled: dict[int, Any] = {}  # size -> analysis.pooling.Pooled
        self.cells: Any = None  # analysis.window.WindowCells

    def recorders(self, n: int) -> list[Any]:
        """A streamed run's recorders: the pooled maps of each size asked for, the window."""
        from attnviz.analysis.pooling import Pooled
        from attnviz.analysis.window import WindowCells

        for size in {self.image_size if self.draws else None, self.page_size} - {None}:
            self.pooled[size] = Pooled(self.layers, self.n_heads, n, n, size, self.how,
                                       self.causal)  # fmt: skip
        if self.span is not None:
            self.cells = WindowCells(self.layers, self.n_heads, *self.span)
        return [*self.pooled.values(), *([self.cells] if self.cells else [])]

    def finish(self, run: Run) -> None:
        """Put the views on the run: from the recorders, or from `run.shown` held whole."""
        from attnviz.analysis.window import window_attention, window_of

        shown = run.shown
        run.drawn = self._pooled(shown, self.image_size) if self.draws else None
        run.page_view = self._pooled(shown, self.page_size) if self.page_size else None
        if self.span is not None:
            if self.cells is not None:
                run.window = window_attention(shown, self.cells.held, *self.span)
            else:
                run.window = window_of(shown, *self.span)

    def _pooled(self, att: Attention, size: int) -> Attention:
        """`att` pooled `size` × `size`: from the recorders of a streamed run (size 1: its
        exact cells), else from `att`'s own maps (as it is for size 1)."""
        from attnviz.analysis.pooling import pooled_attention

        if size not in self.pooled:
            return pooled(att, size, self.how, self.causal)
        return pooled_attention(att, self.pooled[size].stacked(att.held_layers()))


def _draws(run: Run) -> bool:
    """Whether anything draws the run's maps (`run.drawn`): its figures, or the terminal's
    heatmap of one head, which it draws where one layer and one head are chosen."""
    r = run.request
    n_heads = len(r.heads) if r.heads else run.loaded.info.n_heads
    return r.images or (len(run.layers) == 1 and n_heads == 1)


def pooled(att: Attention, size: int, how: str = "max", causal: bool = False) -> Attention:
    """`att`'s maps, held whole, pooled `size` × `size` by each block's `how` (max or mean;
    `causal`: the blocks past the diagonal are masked, not 0): `att` itself for 1."""
    from attnviz.analysis.pooling import pool, pooled_attention

    if size == 1:
        return att
    return pooled_attention(att, pool(att.weights, size, how, causal))  # its layers in order


# Why a notebook's page of an Attention has no inside view (the page says it there).
NOTEBOOK_INSIDE = (
    "left out: attention() keeps no layer's input, which this view is computed from; "
    "a.to_html() reads the text again for the whole page"
)
PROMPTED_INSIDE = (
    "left out: a picture and a prompt's page is made from the result's own weights (its "
    "layers' inputs are not kept); attnviz show PICTURE PROMPT --html reads them in its pass"
)


def notebook_page(att: Attention, inside: str = NOTEBOOK_INSIDE, tower: Any = None,
                  scale: str = "absolute", cmap: str = "viridis",
                  cross: Attention | None = None) -> str:  # fmt: skip
    """The page of an Attention held whole, from its weights alone (no pass: the inside view
    is left out, saying `inside`, and the measure switch has its one measure), pooled as
    `show --html` pools a long text's page, in `scale` and `cmap`; with a vision-language
    model's `tower` (`analysis.tower.TowerView`), its heads over the picture, and Mllama's
    `cross`-attention layers over the picture, the answer's view of them."""
    from attnviz.outputs.html import build_page

    n_layers, n_heads, n, n_keys = att.weights.shape
    size = 1 if att.pooled is not None else page_pool_size(n_layers, n_heads, n, n_keys)
    view = pooled(att, size, "max", att.info.causal)
    return build_page(view, inside=inside, segments=view.segments, tower=tower, scale=scale,
                      cmap=cmap, cross=cross)  # fmt: skip
