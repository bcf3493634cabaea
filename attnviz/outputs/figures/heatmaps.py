"""Attention heatmaps: one head (`HeadFigure`), one layer's grid of heads (`LayerFigure`),
the overview of every layer and head (`OverviewFigure`), one query's rows (`query_figure`),
each drawn from arrays of weights and the text's `Labels`.

A figure is planned first (where its parts go and what its axes say: `_HeadPlace`,
`_GridPlace`, from style's `Layout`), then drawn with matplotlib and style's marks.

Per-head figures of one text share their size and labels, so one figure is built per text
and only the image, colour bar and title are redrawn for each head (`raster.Frames`); that
is what makes batch export fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.raster import Framed, Frames
from attnviz.outputs.figures.style import (
    MASKED_GREY,
    THINNED_FONT_PT,
    Layout,
    Style,
    above_diagonal,
    configure_matplotlib,
    continuation_marks,
    figure_header,
    fixed_axes,
    hatch,
    label_note,
    masked_key,
    removed_cover,
    set_ticks,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np

    from attnviz.outputs.figures.labels import Labels


def masked_cells(labels: Labels) -> np.ndarray | None:
    """`[query, key]` True where a causal model's query cannot see the key: every key after
    the query (in the word view and without special tokens too, which keep the order); None
    for an encoder, which sees every key."""
    if not labels.causal:
        return None
    import numpy as np

    n = len(labels.tokens)
    return np.triu(np.ones((n, n), bool), k=1)


class HeadFigure(Framed):
    """One reusable per-head figure for one text: query tokens down, key tokens across, colour bar.

    The title's first line names the head, the second the model, text and view. `save` can
    outline cells, e.g. the arcs of a dependency relation.
    """

    def __init__(self, labels: Labels, style: Style) -> None:
        import numpy as np
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure

        n, n_keys = len(labels.tokens), len(labels.key_tokens)
        self.mask = masked_cells(labels)
        place = _HeadPlace.of(labels, style)
        configure_matplotlib()
        fig = Figure(figsize=(place.width, place.height), dpi=style.dpi)
        ax = fig.add_axes(place.map_box)
        self.image = ax.imshow(
            np.zeros((n, n_keys)), cmap=style.colour_map(), vmin=0.0, vmax=1.0,
            interpolation="nearest",
        )  # fmt: skip
        set_ticks(ax, labels.tokens, place.layout, keys=(labels.key_tokens, place.key_layout))
        written = continuation_marks(ax, labels)
        ax.set_xlabel(place.key_axis, fontsize=9)
        ax.set_ylabel(place.query_axis, fontsize=9)
        colorbar = fig.colorbar(self.image, cax=fig.add_axes(place.bar_box))
        colorbar.ax.tick_params(labelsize=8)
        colorbar.set_label(style.bar_label(labels), fontsize=9)
        hatching = []
        if self.mask is not None:
            hatching.append(hatch(ax, above_diagonal(n)))
            masked_key(fig, place.left + place.wide + 0.15, place.bottom,
                       "masked:\nkey after\nthe query")  # fmt: skip
        self.title = figure_header(fig, labels)
        self.style = style
        self.marks = ax.add_collection(
            PatchCollection([], facecolor="none", edgecolor="#ff2020", linewidth=1.6)
        )
        self.removed = removed_cover(
            ax, (0, 0, 1, 1), 10, "removed (--ablate)\nits output was set to 0:\nno pattern",
            axes_fraction=True,
        )  # fmt: skip
        dynamic = [self.image, *hatching, *written, *self.removed, *ax.spines.values(),
                   self.marks, self.title]  # fmt: skip
        self.frames = Frames(fig, dynamic, style)

    def draw(
        self,
        grid: np.ndarray,
        title: str,
        marks: tuple[tuple[int, int], ...] = (),
        removed: bool = False,
    ) -> Any:
        """Set one head's `[query, key]` grid and title, outline the `(query, key)` cells in
        `marks`; return the Figure. A `removed` head's map is covered, its grid not drawn."""
        import numpy as np
        from matplotlib.patches import Rectangle

        shown = np.full_like(grid, np.nan) if removed else self.style.scaled(grid, self.mask)
        self.image.set_data(shown)
        for artist in self.removed:
            artist.set_visible(removed)
        self.title.set_text(title)
        self.marks.set_paths([Rectangle((k - 0.5, q - 0.5), 1, 1) for q, k in marks])
        return self.frames.fig

    def save(
        self,
        grid: np.ndarray,
        title: str,
        path: Path,
        marks: tuple[tuple[int, int], ...] = (),
        removed: bool = False,
    ) -> Path:
        """Draw one head's `[query, key]` grid (and `marks`) and write it atomically to `path`."""
        self.draw(grid, title, marks, removed)
        return self.frames.save(path)


@dataclass(frozen=True)
class _HeadPlace:
    """Where a head figure's parts go, in inches: margins for the labels, the map's size
    (`wide` × `side`), the figure's; the map's and the colour bar's axes as fractions of the
    figure; and the axis labels, which say how the ticks are thinned."""

    layout: Layout  # the queries'
    key_layout: Layout
    left: float
    bottom: float
    wide: float
    side: float
    width: float
    height: float
    map_box: tuple[float, float, float, float]
    bar_box: tuple[float, float, float, float]
    key_axis: str
    query_axis: str

    @classmethod
    def of(cls, labels: Labels, style: Style) -> _HeadPlace:
        tokens, keys, dpi = labels.tokens, labels.key_tokens, style.dpi
        layout, key_layout = Layout.for_grid(len(tokens), len(keys), dpi=dpi)
        layout, key_layout = (
            replace(lay, every=labels.every, first=labels.first) for lay in (layout, key_layout)
        )
        # Axis label + tick labels, in whole pixels so that every cell spans the same pixels.
        left = round((0.45 + layout.label_inches(tokens)) * dpi) / dpi
        bottom = round((0.45 + key_layout.label_inches(keys)) * dpi) / dpi
        top, right = 0.75, 1.25  # two title lines; colour bar with its ticks and label
        side, wide = layout.side_in, key_layout.side_in  # the map's height and width
        # a short map (few target tokens) keeps room for its title and colour bar
        top += round(max(0.0, 1.6 - side) * dpi) / dpi
        left += round(max(0.0, (4.5 - wide - left - right) / 2) * dpi) / dpi
        width, height = left + wide + right, bottom + side + top
        map_box = (left / width, bottom / height, wide / width, side / height)
        # A causal model's bar makes room below it for the masked cells' key.
        bar_y = 0.55 if labels.causal else 0.1 * side
        bar_box = ((left + wide + 0.15) / width, (bottom + bar_y) / height, 0.18 / width,
                   (0.9 * side - bar_y) / height)  # fmt: skip
        key_axis = f"{labels.key_axis}{label_note(key_layout, labels.unit)}"
        return cls(layout, key_layout, left, bottom, wide, side, width, height, map_box,
                   bar_box, key_axis, labels.query_axis)  # fmt: skip


def head_label(labels: Labels, head: int) -> str:
    """A head's short label, `H3`; empty for a per-layer measure's one map."""
    return "" if labels.per_layer else f"H{head}"


def head_title(labels: Labels, layer: int, head: int, grid: np.ndarray) -> str:
    """A head figure's first title line (a per-layer measure's map names its layers)."""
    if (layer, head) in labels.removed:
        return f"layer {layer} · head {head} · removed (--ablate)"
    peak = f"max {float(grid.max()):.2f}"
    if labels.per_layer:
        return f"layer {layer} · {labels.measure}, layers 0–{layer} composed · {peak}"
    return f"layer {layer} · head {head} · {peak}"


class LayerFigure(Framed):
    """One reusable grid of all chosen heads of a layer for one text, one shared colour bar.

    Each panel's title gives that head's maximum; labels are thinned on long texts as in the
    per-head figures.
    """

    def __init__(self, labels: Labels, heads: list[int], style: Style) -> None:
        import numpy as np
        from matplotlib.figure import Figure

        self.mask = masked_cells(labels)
        place = _GridPlace.of(labels, heads, style)
        configure_matplotlib()
        dpi = style.dpi
        fig = Figure(figsize=(place.width / dpi, place.height / dpi), dpi=dpi)
        self.heads = heads
        self.style = style
        self.images = []
        self.panel_titles = []
        self.covers = []  # each panel's cover for a removed head
        self.removed = labels.removed
        hatching, written = [], []
        n, n_keys = len(labels.tokens), len(labels.key_tokens)
        for box, (centre, above), x, y in place.panels:
            # each head's panel: its image, removed-head cover, title, ticks, marks
            ax = fig.add_axes(box)
            image = ax.imshow(
                np.zeros((n, n_keys)), cmap=style.colour_map(), vmin=0.0, vmax=1.0,
                interpolation="nearest", aspect="auto",
            )  # fmt: skip
            self.images.append(image)
            self.covers.append(removed_cover(ax, (0, 0, 1, 1), 9, axes_fraction=True))
            # Panel titles as figure texts: blitting redraws them alone.
            self.panel_titles.append(fig.text(centre, above, "", ha="center", va="bottom",
                                              fontsize=9))  # fmt: skip
            set_ticks(ax, labels.tokens, place.small, x=x, y=y,
                      keys=(labels.key_tokens, place.small_keys))  # fmt: skip
            if self.mask is not None:
                hatching.append(hatch(ax, above_diagonal(n)))
            written += continuation_marks(ax, labels)
        fig.colorbar(self.images[0], cax=fig.add_axes(place.bar_box),
                     label=style.bar_label(labels))  # fmt: skip
        if self.mask is not None:
            masked_key(fig, *place.key_at, "masked:\nkey after\nthe query")
        self.title = figure_header(fig, labels, "", place.note)
        # Spines go after the images (and their hatching): a full draw paints them on top.
        spines = [spine for image in self.images for spine in image.axes.spines.values()]
        covers = [artist for cover in self.covers for artist in cover]
        dynamic = [*self.images, *hatching, *written, *covers, *spines, *self.panel_titles,
                   self.title]  # fmt: skip
        self.frames = Frames(fig, dynamic, style)

    def draw(self, weights: np.ndarray, layer: int) -> Any:
        """Set `weights[head, query, key]`, the heads of layer `layer`; return the Figure.
        A removed head's panel is covered, its weights not drawn."""
        import numpy as np

        for image, title, cover, head in zip(
            self.images, self.panel_titles, self.covers, self.heads
        ):
            grid = weights[head]  # (T, S)
            removed = (layer, head) in self.removed
            for artist in cover:
                artist.set_visible(removed)
            if removed:
                image.set_data(np.full_like(grid, np.nan))
                title.set_text(f"head {head} · removed")
                continue
            image.set_data(self.style.scaled(grid, self.mask))
            title.set_text(f"head {head} · max {float(grid.max()):.2f}")
        self.title.set_text(f"layer {layer}")
        return self.frames.fig

    def save(self, weights: np.ndarray, layer: int, path: Path) -> Path:
        """Draw `weights[head, query, key]` of layer `layer` and write it to `path`."""
        self.draw(weights, layer)
        return self.frames.save(path)


def overview_mosaic(
    labels: Labels,
    weights: Iterable[np.ndarray],
    layers: list[int],
    heads: list[int],
    dpi: int,
) -> np.ndarray:
    """The overview's data: every chosen layer × head side by side, each scaled to its own
    maximum, NaN (drawn white) in the gaps, OVERVIEW_MASKED (drawn as masked) where a causal
    model's queries see none of the keys; `(rows, columns)` float32. `weights` gives each of
    `layers`' weights `[head, query, key]` in turn (a drawing process maps them one layer at
    a time, not holding them all).

    Panels of long texts have more tokens than pixels; they are averaged down on the data
    (over the keys the queries can see), before colour mapping, so every pixel is a colour of
    the map (averaging colours would show colours the map does not have), and the mosaic stays
    small (at 512 tokens it would be 190 MB in float64).
    """
    import numpy as np

    n, n_keys = len(labels.tokens), len(labels.key_tokens)
    mask = masked_cells(labels)
    block, m, cell = _overview_cells(max(n, n_keys), dpi)
    gap = cell - m
    mosaic = np.full((len(layers) * cell - gap, len(heads) * cell - gap), np.nan, np.float32)
    seen = np.zeros((m * block, m * block), bool)  # the cells a panel cell averages
    seen[:n, :n_keys] = True if mask is None else ~mask
    counts = seen.reshape(m, block, m, block).sum(axis=(1, 3))  # (m, m)
    # a cross-attention panel fills (queries, keys) of its m × m square; the rest is a gap
    outside = np.ones((m, m), bool)
    outside[: math.ceil(n / block), : math.ceil(n_keys / block)] = False
    padded = np.zeros((m * block, m * block), np.float32)  # beyond the text: always 0
    hidden = None if mask is None else ~seen[:n, :n_keys]
    for r, (layer, held) in enumerate(zip(layers, weights)):
        for c, head in enumerate(heads):
            if (layer, head) in labels.removed:
                continue  # left NaN: the figure covers it
            grid = held[head]  # (T, S)
            peak = grid.max()
            padded[:n, :n_keys] = grid
            if peak > 0:
                padded[:n, :n_keys] /= peak
            if hidden is not None:
                padded[:n, :n_keys][hidden] = 0
            sums = _block_sums(padded, m, block)  # (m, m)
            means = np.where(counts > 0, sums / np.maximum(counts, 1), OVERVIEW_MASKED)
            means[outside] = np.nan
            mosaic[r * cell : r * cell + m, c * cell : c * cell + m] = means
    return mosaic


def _block_sums(square: np.ndarray, m: int, block: int) -> np.ndarray:
    """The sums of a (m·block, m·block) array's block × block squares, (m, m): as `block`
    strided additions along each axis, five times as fast at 512 tokens as numpy's reduction
    over the reshaped axes (0.15 against 0.7 ms a panel)."""
    keys = square.reshape(m * block, m, block)
    across = keys[:, :, 0].copy()
    for j in range(1, block):
        across += keys[:, :, j]
    rows = across.reshape(m, block, m)
    sums = rows[:, 0].copy()
    for j in range(1, block):
        sums += rows[:, j]
    return sums


OVERVIEW_MASKED = -1.0  # below the colour scale: the map's "under" colour, MASKED_GREY


def _overview_cells(n: int, dpi: int) -> tuple[int, int, int]:
    """(block, m, cell): tokens averaged per panel cell, cells a panel side, and the panel's
    pitch in the mosaic (panel plus gap); a panel is 1 inch, about as many cells as pixels."""
    block = max(1, math.ceil(n / dpi))
    m = math.ceil(n / block)
    return block, m, m + max(1, m // 8)


def overview_figure(
    labels: Labels, mosaic: np.ndarray, layers: list[int], heads: list[int], style: Style
) -> Any:
    """Small multiples of every chosen layer × head, each panel scaled to its own maximum,
    from `overview_mosaic`'s mosaic."""
    return OverviewFigure(labels, layers, heads, style).draw(mosaic)


class OverviewFigure(Framed):
    """The overview of one text, laid out once from its labels (`render.prepare` does it
    while the model loads), then drawn from its mosaic: the panels, their hatching and covers
    redrawn over the rest (`Frames`), 40 ms at 512 tokens where a whole figure takes 100."""

    def __init__(self, labels: Labels, layers: list[int], heads: list[int], style: Style) -> None:
        import matplotlib
        import numpy as np

        n, n_keys = len(labels.tokens), len(labels.key_tokens)
        panel_in = 1.0
        _, m, cell = _overview_cells(max(n, n_keys), style.dpi)
        inner = (len(heads) * panel_in, len(layers) * panel_in)
        side = max(0.2, (6.0 - inner[0]) / 2)  # room for the title over narrow grids
        causal = labels.causal
        names = [head_label(labels, h) for h in heads]
        configure_matplotlib()
        bottom = 0.65 if causal else 0.35  # the masked cells' key below the panels
        fig, ax = fixed_axes(inner, (0.45 + side, bottom, 0.15 + side, 0.65), style.dpi)
        cmap = matplotlib.colormaps[style.cmap].with_extremes(bad="white", under=MASKED_GREY)
        shape = (len(layers) * cell - (cell - m), len(heads) * cell - (cell - m))  # the mosaic's
        self.image = ax.imshow(
            np.zeros(shape, np.float32),
            cmap=cmap,
            vmin=0.0,
            vmax=1.0,
            interpolation="antialiased",
            interpolation_stage="data",
        )
        # a cross-attention panel is (queries, keys) of its m × m square: label its centre
        block = math.ceil(max(n, n_keys) / m)
        rows_m, cols_m = math.ceil(n / block), math.ceil(n_keys / block)
        ax.set_xticks([i * cell + cols_m / 2 - 0.5 for i in range(len(heads))],
                      names, fontsize=8)  # fmt: skip
        ax.set_yticks([i * cell + rows_m / 2 - 0.5 for i in range(len(layers))],
                      [f"L{layer}" for layer in layers], fontsize=8)  # fmt: skip
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        over = []  # drawn over the panels: covers of removed heads, a causal model's hatching
        for r, layer in enumerate(layers):
            for c, head in enumerate(heads):
                if (layer, head) in labels.removed:
                    over += removed_cover(ax, (c * cell - 0.5, r * cell - 0.5, cols_m, rows_m), 7)
                elif causal:
                    over.append(hatch(ax, above_diagonal(m, c * cell, r * cell)))
        if causal:
            masked_key(fig, 0.45 + side, 0.12, "masked: key after the query (a causal model)")
        n_layers, n_heads = labels.n_layers, labels.n_heads
        every = len(layers) == n_layers and (labels.per_layer or len(heads) == n_heads)
        chosen = (
            "all heads"
            if every
            else f"{len(layers)} of {n_layers} layers × {len(heads)} of {n_heads} heads"
        )
        if labels.per_layer:
            some = f"{len(layers)} of {n_layers} layers"
            chosen = f"{labels.measure} per layer" if every else some
        title = f"{chosen} · {labels.counted} · each panel scaled to its own max"
        figure_header(fig, labels, title)
        # hatching first, then each cover and its label: the order a whole draw takes them in
        over.sort(key=lambda artist: artist.get_zorder())
        self.frames = Frames(fig, [self.image, *over], style)

    def draw(self, mosaic: np.ndarray) -> Any:
        """Set `overview_mosaic`'s mosaic; return the Figure."""
        self.image.set_data(mosaic)
        return self.frames.fig

    def save(self, mosaic: np.ndarray, path: Path) -> Path:
        """Draw `mosaic` and write the figure atomically to `path`."""
        self.draw(mosaic)
        return self.frames.save(path)


@dataclass(frozen=True)
class _GridPlace:
    """Where a layer figure's panels go, in whole pixels, panels with whole pixels per token
    where they fit: every cell is drawn alike, and the heatmaps can be painted straight into
    the canvas (see Frames). Longer texts keep the panel's size and are resampled by
    matplotlib. A cross-attention panel is as wide as its keys and as tall as its queries.
    Boxes are fractions of the figure; `note` is the line under the title."""

    small: Layout  # the queries' labels
    small_keys: Layout
    width: int
    height: int
    # each panel's axes box, its title's place (centred above it), and whether it has
    # tick labels across (the last row) and down (the first column)
    panels: tuple[tuple[tuple[float, ...], tuple[float, float], bool, bool], ...]
    bar_box: tuple[float, float, float, float]
    key_at: tuple[float, float]  # the masked cells' key, inches from the bottom left
    note: str

    gap_w = 0.15  # inches between panels; the panel titles sit in the gaps between rows
    gap_h = 0.35

    @classmethod
    def of(cls, labels: Labels, heads: list[int], style: Style) -> _GridPlace:
        n, n_keys = len(labels.tokens), len(labels.key_tokens)
        longest = max(n, n_keys)
        cols = min(len(heads), 4)
        rows = math.ceil(len(heads) / cols)
        layout = Layout.for_tokens(longest, max_side_in=10.0)
        dpi = style.dpi
        panel = round(max(2.6, layout.side_in * 0.55) * dpi)  # pixels, the longer side
        if longest <= panel:
            panel = longest * (panel // longest)
        panel_h, panel_w = (round(panel * count / longest) for count in (n, n_keys))
        small = Layout.labelled(n, panel_h / dpi, max_font_pt=THINNED_FONT_PT)
        small_keys = Layout.labelled(n_keys, panel_w / dpi, max_font_pt=THINNED_FONT_PT)
        small, small_keys = (
            replace(lay, every=labels.every, first=labels.first) for lay in (small, small_keys)
        )
        left, bottom, top, right = (
            round(v * dpi)
            for v in (0.15 + small.label_inches(labels.tokens),
                      0.15 + small_keys.label_inches(labels.key_tokens), 1.1, 1.2)
        )  # fmt: skip
        gap_w, gap_h = round(cls.gap_w * dpi), round(cls.gap_h * dpi)
        grid_w = cols * panel_w + (cols - 1) * gap_w
        spare = max(0, round(5.5 * dpi) - (left + grid_w + right)) // 2  # room for the title
        left, right = left + spare, right + spare
        w = left + grid_w + right
        h = bottom + rows * panel_h + (rows - 1) * gap_h + top
        panels = []
        for slot in range(len(heads)):
            row, col = divmod(slot, cols)
            x0 = left + col * (panel_w + gap_w)
            y0 = bottom + (rows - 1 - row) * (panel_h + gap_h)
            title_at = ((x0 + panel_w / 2) / w, (y0 + panel_h + 0.06 * dpi) / h)
            last_row = row == rows - 1 or slot + cols >= len(heads)
            panels.append(((x0 / w, y0 / h, panel_w / w, panel_h / h), title_at, last_row,
                           col == 0))  # fmt: skip
        grid_h = rows * panel_h + (rows - 1) * gap_h
        bar_box = ((w - right + 0.2 * dpi) / w, (bottom + 0.2 * grid_h) / h, 0.18 * dpi / w,
                   0.6 * grid_h / h)  # fmt: skip
        key_at = ((w - right) / dpi + 0.2, (bottom + 0.2 * grid_h) / dpi - 0.5)
        note = f"{labels.counted}{label_note(small, labels.unit)} · {style.scale_note()}"
        return cls(small, small_keys, w, h, tuple(panels), bar_box, key_at, note)


def query_rows(
    labels: Labels,
    weights: Iterable[np.ndarray],
    index: int,
    layers: list[int],
    heads: list[int],
    style: Style,
) -> np.ndarray:
    """The query figure's data: row (layer, head) is the head's row `index` on the style's
    colour scale, NaN (masked) for the keys after it on a causal model; `(layers × heads,
    keys)`. `weights` gives each of `layers`' weights `[head, query, key]` in turn."""
    import numpy as np

    mask = masked_cells(labels)
    after = None if mask is None else mask[index]  # (keys,)
    empty = np.full(len(labels.key_tokens), np.nan)  # a removed head's row, covered in the figure
    return np.stack(
        [
            empty if (layer, h) in labels.removed else style.scaled(held[h, index], after)
            for layer, held in zip(layers, weights)
            for h in heads
        ]
    )


def query_figure(
    labels: Labels,
    index: int,
    rows: np.ndarray,
    layers: list[int],
    heads: list[int],
    style: Style,
) -> Any:
    """Where one query token looks in every chosen head, from `query_rows`'s `rows`: rows
    are layer·head, columns keys; the query's own column is outlined, and lines separate the
    layers."""
    from matplotlib.patches import Rectangle

    n = len(labels.key_tokens)  # the keys: the source's in cross-attention
    names = [f"L{layer} {head_label(labels, h)}".rstrip() for layer in layers for h in heads]
    configure_matplotlib()
    layout = replace(Layout.for_tokens(n), every=labels.every, first=labels.first)
    row_in = min(0.22, max(0.1, 12.0 / len(rows)))
    inner = (layout.side_in, max(len(rows) * row_in, 1.5))
    label_in = layout.label_inches(labels.key_tokens)
    width = 0.9 + inner[0] + 1.3
    fig, ax = fixed_axes(inner, (0.9, 0.45 + label_in, 1.3, 0.8), style.dpi)
    image = ax.imshow(
        rows, cmap=style.colour_map(), vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    set_ticks(ax, labels.key_tokens, layout, y=False)
    continuation_marks(ax, labels, rows=False)
    font = min(8.0, max(4.0, row_in * 72 * 0.8))
    ax.set_yticks(range(len(rows)), names, fontsize=font)
    for boundary in range(len(heads), len(rows), len(heads)):
        ax.axhline(boundary - 0.5, color="white", linewidth=1.2)
    for r, (layer, h) in enumerate((layer, h) for layer in layers for h in heads):
        if (layer, h) in labels.removed:
            removed_cover(ax, (-0.5, r - 0.5, n, 1), font)
    if labels.causal and index < n - 1:
        after = [(index + 0.5, -0.5), (n - 0.5, -0.5), (n - 0.5, len(rows) - 0.5)]
        hatch(ax, [*after, (index + 0.5, len(rows) - 0.5)])
        masked_key(fig, 0.9 + inner[0] + 0.2, 0.15, "masked:\nkey after\nthe query")
    itself = ""
    if not labels.cross:  # in cross-attention the query is not among the keys
        ax.add_patch(
            Rectangle((index - 0.5, -0.5), 1, len(rows), fill=False, edgecolor="red", linewidth=1.2)
        )
        itself = "; red: the query itself"
    ax.set_xlabel(f"{labels.key_axis}{label_note(layout, labels.unit)}{itself}", fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.25 / width, pad=0.2 / width)
    bar.set_label(style.bar_label(labels), fontsize=9)
    every = "every layer" if labels.per_layer else "every head"
    position = labels.first + index
    where = f"where “{labels.tokens[index]}” (position {position}) looks, in {every}"
    figure_header(fig, labels, where)
    return fig
