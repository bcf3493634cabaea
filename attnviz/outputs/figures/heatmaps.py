"""Attention heatmaps: one head (`HeadFigure`), one layer's grid of heads (`LayerFigure`),
the overview of every layer and head (`OverviewFigure`), one query's rows (`query_figure`).

Per-head figures of one text share their size and labels, so one figure is built per text
and only the image, colour bar and title are redrawn for each head (`raster.Frames`); that
is what makes batch export fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.raster import Frames, fixed_axes
from attnviz.outputs.figures.style import (
    MASKED_GREY,
    THINNED_FONT_PT,
    Layout,
    Style,
    above_diagonal,
    configure_matplotlib,
    continuation_marks,
    figure_header,
    hatch,
    label_note,
    masked_cells,
    masked_key,
    removed_cover,
    set_ticks,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from attnviz.core.attention import Attention


class HeadFigure:
    """One reusable per-head figure for one text: query tokens down, key tokens across, colour bar.

    The title's first line names the head, the second the model, text and view. `save` can
    outline cells, e.g. the arcs of a dependency relation.
    """

    def __init__(self, att: Attention, style: Style) -> None:
        import numpy as np
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure

        configure_matplotlib()
        n, n_keys = len(att.tokens), len(att.key_tokens)
        place = _HeadPlace.of(att, style)
        fig = Figure(figsize=(place.width, place.height), dpi=style.dpi)
        ax = fig.add_axes(place.map_box())
        self.image = ax.imshow(
            np.zeros((n, n_keys)), cmap=style.colour_map(), vmin=0.0, vmax=1.0,
            interpolation="nearest",
        )  # fmt: skip
        set_ticks(ax, att.tokens, place.layout, keys=(att.key_tokens, place.key_layout))
        written = continuation_marks(ax, att)
        _label_axes(ax, att, place.key_layout)
        self.mask = masked_cells(att)
        # A causal model's bar makes room below it for the masked cells' key.
        colorbar = fig.colorbar(self.image, cax=fig.add_axes(place.bar_box(self.mask is None)))
        colorbar.ax.tick_params(labelsize=8)
        colorbar.set_label(style.bar_label(att), fontsize=9)
        hatching = []
        if self.mask is not None:
            hatching.append(hatch(ax, above_diagonal(n)))
            masked_key(fig, place.left + place.wide + 0.15, place.bottom,
                       "masked:\nkey after\nthe query")  # fmt: skip
        self.title = figure_header(fig, att)
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

    def close(self) -> None:
        self.frames.close()


@dataclass(frozen=True)
class _HeadPlace:
    """Where a head figure's parts go, in inches: margins for the labels, the map's size
    (`wide` × `side`), the figure's."""

    layout: Layout  # the queries'
    key_layout: Layout
    left: float
    bottom: float
    wide: float
    side: float
    width: float
    height: float

    @classmethod
    def of(cls, att: Attention, style: Style) -> _HeadPlace:
        tokens, keys, dpi = att.tokens, att.key_tokens, style.dpi
        layout, key_layout = Layout.for_grid(len(tokens), len(keys), dpi=dpi)
        first = att.span[0] if att.span else 0
        layout, key_layout = (
            replace(lay, every=att.pool_size, first=first) for lay in (layout, key_layout)
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
        return cls(layout, key_layout, left, bottom, wide, side, width, height)

    def map_box(self) -> tuple[float, float, float, float]:
        """The map's axes, as fractions of the figure."""
        w, h = self.width, self.height
        return (self.left / w, self.bottom / h, self.wide / w, self.side / h)

    def bar_box(self, full: bool) -> tuple[float, float, float, float]:
        """The colour bar's axes: beside the map, `full` height, or raised above the key of
        masked cells."""
        bar_y = 0.1 * self.side if full else 0.55
        w, h = self.width, self.height
        return (
            (self.left + self.wide + 0.15) / w,
            (self.bottom + bar_y) / h,
            0.18 / w,
            (0.9 * self.side - bar_y) / h,
        )


def _label_axes(ax: Any, att: Attention, key_layout: Layout) -> None:
    """A head figure's axis labels: which tokens, and what they are to each other."""
    unit = att.unit
    ax.set_xlabel(f"key ({unit} {_key_role(att)}){label_note(key_layout, unit)}", fontsize=9)
    ax.set_ylabel(
        f"query ({unit} {'attending' if att.measure == 'weights' else 'built'}{_query_side(att)})",
        fontsize=9,
    )


def head_title(att: Attention, layer: int, head: int, grid: np.ndarray) -> str:
    """A head figure's first title line (a per-layer measure's map names its layers)."""
    if att.is_removed(layer, head):
        return f"layer {layer} · head {head} · removed (--ablate)"
    peak = f"max {float(grid.max()):.2f}"
    if att.per_layer:
        return f"layer {layer} · {att.measure}, layers 0–{layer} composed · {peak}"
    return f"layer {layer} · head {head} · {peak}"


def _key_role(att: Attention) -> str:
    """What a key is to its query under the measure: attended to, or contributing (and, in
    an encoder-decoder model, which text it is from)."""
    role = "attended to" if att.measure == "weights" else "contributing"
    side = {"encoder": "source ", "decoder": "target ", "cross": "source "}.get(att.stack, "")
    return f"{side}{role}" if not side else f"{role}, {side.strip()}"


def _query_side(att: Attention) -> str:
    """Which text the queries are from, in an encoder-decoder model ("" otherwise)."""
    return {"encoder": ", source", "decoder": ", target", "cross": ", target"}.get(att.stack, "")


def _scale_note(style: Style) -> str:
    if style.scale == "head":
        return "colour: each head scaled to its own max"
    if style.top != 1.0:
        return f"colour: 0–{style.top:.3g} (the text's largest) for every head"
    return "colour: 0–1 for every head"


class LayerFigure:
    """One reusable grid of all chosen heads of a layer for one text, one shared colour bar.

    Each panel's title gives that head's maximum; labels are thinned on long texts as in the
    per-head figures.
    """

    def __init__(self, att: Attention, heads: list[int], style: Style) -> None:
        from matplotlib.figure import Figure

        configure_matplotlib()
        place = _GridPlace.of(att, heads, style)
        dpi = style.dpi
        fig = Figure(figsize=(place.width / dpi, place.height / dpi), dpi=dpi)
        self.heads = heads
        self.style = style
        self.images = []
        self.panel_titles = []
        self.covers = []  # each panel's cover for a removed head
        self.removed = att.removed
        self.mask = masked_cells(att)
        hatching, written = [], []
        for slot in range(len(heads)):
            ax = self._add_panel(fig, att, place, slot)
            if self.mask is not None:
                hatching.append(hatch(ax, above_diagonal(len(att.tokens))))
            written += continuation_marks(ax, att)
        fig.colorbar(self.images[0], cax=fig.add_axes(place.bar_box()),
                     label=style.bar_label(att))  # fmt: skip
        if self.mask is not None:
            below = (place.bottom + 0.2 * place.grid_h) / dpi - 0.5
            masked_key(fig, (place.width - place.right) / dpi + 0.2, below,
                       "masked:\nkey after\nthe query")  # fmt: skip
        note = f"{_counted(att)}{label_note(place.small, att.unit)} · {_scale_note(style)}"
        self.info_name = att.info.name
        self.title = figure_header(fig, att, "", note)
        # Spines go after the images (and their hatching): a full draw paints them on top.
        spines = [spine for image in self.images for spine in image.axes.spines.values()]
        covers = [artist for cover in self.covers for artist in cover]
        dynamic = [*self.images, *hatching, *written, *covers, *spines, *self.panel_titles,
                   self.title]  # fmt: skip
        self.frames = Frames(fig, dynamic, style)

    def _add_panel(self, fig: Any, att: Attention, place: _GridPlace, slot: int) -> Any:
        """The axes of the head in `slot`: its image, removed-head cover, title, ticks."""
        import numpy as np

        row, col = divmod(slot, place.cols)
        ax = fig.add_axes(place.panel_box(slot))
        image = ax.imshow(
            np.zeros((len(att.tokens), len(att.key_tokens))), cmap=self.style.colour_map(),
            vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto",
        )  # fmt: skip
        self.images.append(image)
        self.covers.append(removed_cover(ax, (0, 0, 1, 1), 9, axes_fraction=True))
        # Panel titles as figure texts: blitting redraws them alone.
        centre, above = place.title_at(slot)
        self.panel_titles.append(fig.text(centre, above, "", ha="center", va="bottom",
                                          fontsize=9))  # fmt: skip
        last_row = row == place.rows - 1 or slot + place.cols >= len(self.heads)
        set_ticks(ax, att.tokens, place.small, x=last_row, y=col == 0,
                  keys=(att.key_tokens, place.small_keys))  # fmt: skip
        return ax

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

    def close(self) -> None:
        self.frames.close()


def overview_mosaic(
    att: Attention,
    layers: list[int],
    heads: list[int],
    dpi: int,
    one_layer: Callable[[int], Attention] | None = None,
) -> np.ndarray:
    """The overview's data: every chosen layer × head side by side, each scaled to its own
    maximum, NaN (drawn white) in the gaps, OVERVIEW_MASKED (drawn as masked) where a causal
    model's queries see none of the keys; `(rows, columns)` float32. `one_layer(layer)`, where
    given, is `att` with that layer's weights, read in turn (a drawing process maps them one
    layer at a time, not holding them all).

    Panels of long texts have more tokens than pixels; they are averaged down on the data
    (over the keys the queries can see), before colour mapping, so every pixel is a colour of
    the map (averaging colours would show colours the map does not have), and the mosaic stays
    small (at 512 tokens it would be 190 MB in float64).
    """
    import numpy as np

    n, n_keys = len(att.tokens), len(att.key_tokens)
    block, m, cell = _overview_cells(max(n, n_keys), dpi)
    gap = cell - m
    mosaic = np.full((len(layers) * cell - gap, len(heads) * cell - gap), np.nan, np.float32)
    seen = np.zeros((m * block, m * block), bool)  # the cells a panel cell averages
    mask = masked_cells(att)
    seen[:n, :n_keys] = True if mask is None else ~mask
    counts = seen.reshape(m, block, m, block).sum(axis=(1, 3))  # (m, m)
    # a cross-attention panel fills (queries, keys) of its m × m square; the rest is a gap
    outside = np.ones((m, m), bool)
    outside[: math.ceil(n / block), : math.ceil(n_keys / block)] = False
    padded = np.zeros((m * block, m * block), np.float32)  # beyond the text: always 0
    hidden = None if mask is None else ~seen[:n, :n_keys]
    for r, layer in enumerate(layers):
        held = att if one_layer is None else one_layer(layer)
        for c, head in enumerate(heads):
            if att.is_removed(layer, head):
                continue  # left NaN: the figure covers it
            grid = held.pattern(layer, head)  # (T, S)
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
    att: Attention,
    layers: list[int],
    heads: list[int],
    style: Style,
    mosaic: np.ndarray | None = None,
) -> Any:
    """Small multiples of every chosen layer × head, each panel scaled to its own maximum;
    `mosaic` is `overview_mosaic`'s, computed here when not given."""
    if mosaic is None:
        mosaic = overview_mosaic(att, layers, heads, style.dpi)
    return OverviewFigure(att, layers, heads, style).draw(mosaic)


class OverviewFigure:
    """The overview of one text, laid out once from its labels (`render.prepare` does it
    while the model loads), then drawn from its mosaic: the panels, their hatching and covers
    redrawn over the rest (`Frames`), 40 ms at 512 tokens where a whole figure takes 100."""

    def __init__(self, att: Attention, layers: list[int], heads: list[int], style: Style) -> None:
        import matplotlib
        import numpy as np

        configure_matplotlib()
        n, n_keys = len(att.tokens), len(att.key_tokens)
        panel_in = 1.0
        _, m, cell = _overview_cells(max(n, n_keys), style.dpi)
        inner = (len(heads) * panel_in, len(layers) * panel_in)
        side = max(0.2, (6.0 - inner[0]) / 2)  # room for the title over narrow grids
        causal = masked_cells(att) is not None
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
                      [att.head_label(h) for h in heads], fontsize=8)  # fmt: skip
        ax.set_yticks([i * cell + rows_m / 2 - 0.5 for i in range(len(layers))],
                      [f"L{layer}" for layer in layers], fontsize=8)  # fmt: skip
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        over = []  # drawn over the panels: covers of removed heads, a causal model's hatching
        for r, layer in enumerate(layers):
            for c, head in enumerate(heads):
                if att.is_removed(layer, head):
                    over += removed_cover(ax, (c * cell - 0.5, r * cell - 0.5, cols_m, rows_m), 7)
                elif causal:
                    over.append(hatch(ax, above_diagonal(m, c * cell, r * cell)))
        if causal:
            masked_key(fig, 0.45 + side, 0.12, "masked: key after the query (a causal model)")
        info = att.info
        every = len(layers) == info.n_layers and (att.per_layer or len(heads) == info.n_heads)
        chosen = (
            "all heads"
            if every
            else f"{len(layers)} of {info.n_layers} layers × {len(heads)} of {info.n_heads} heads"
        )
        if att.per_layer:
            some = f"{len(layers)} of {info.n_layers} layers"
            chosen = f"{att.measure} per layer" if every else some
        figure_header(fig, att, f"{chosen} · {_counted(att)} · each panel scaled to its own max")
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

    def close(self) -> None:
        self.frames.close()


@dataclass(frozen=True)
class _GridPlace:
    """Where a layer figure's panels go, in whole pixels, panels with whole pixels per token
    where they fit: every cell is drawn alike, and the heatmaps can be painted straight into
    the canvas (see Frames). Longer texts keep the panel's size and are resampled by
    matplotlib. A cross-attention panel is as wide as its keys and as tall as its queries."""

    cols: int
    rows: int
    panel_w: int
    panel_h: int
    small: Layout  # the queries' labels
    small_keys: Layout
    left: int
    bottom: int
    right: int
    width: int
    height: int
    dpi: float

    gap_w = 0.15  # inches between panels; the panel titles sit in the gaps between rows
    gap_h = 0.35

    @classmethod
    def of(cls, att: Attention, heads: list[int], style: Style) -> _GridPlace:
        n, n_keys = len(att.tokens), len(att.key_tokens)
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
        first = att.span[0] if att.span else 0
        small, small_keys = (
            replace(lay, every=att.pool_size, first=first) for lay in (small, small_keys)
        )
        left, bottom, top, right = (
            round(v * dpi)
            for v in (0.15 + small.label_inches(att.tokens),
                      0.15 + small_keys.label_inches(att.key_tokens), 1.1, 1.2)
        )  # fmt: skip
        gap_w, gap_h = round(cls.gap_w * dpi), round(cls.gap_h * dpi)
        grid_w = cols * panel_w + (cols - 1) * gap_w
        spare = max(0, round(5.5 * dpi) - (left + grid_w + right)) // 2  # room for the title
        left, right = left + spare, right + spare
        width = left + grid_w + right
        height = bottom + rows * panel_h + (rows - 1) * gap_h + top
        return cls(cols, rows, panel_w, panel_h, small, small_keys, left, bottom, right,
                   width, height, dpi)  # fmt: skip

    def _gaps(self) -> tuple[int, int]:
        return round(self.gap_w * self.dpi), round(self.gap_h * self.dpi)

    def _corner(self, slot: int) -> tuple[int, int]:
        row, col = divmod(slot, self.cols)
        gap_w, gap_h = self._gaps()
        x0 = self.left + col * (self.panel_w + gap_w)
        return x0, self.bottom + (self.rows - 1 - row) * (self.panel_h + gap_h)

    def panel_box(self, slot: int) -> tuple[float, float, float, float]:
        x0, y0 = self._corner(slot)
        w, h = self.width, self.height
        return (x0 / w, y0 / h, self.panel_w / w, self.panel_h / h)

    def title_at(self, slot: int) -> tuple[float, float]:
        """Where the panel's title goes: centred above it, as fractions of the figure."""
        x0, y0 = self._corner(slot)
        return (x0 + self.panel_w / 2) / self.width, (
            y0 + self.panel_h + 0.06 * self.dpi
        ) / self.height

    @property
    def grid_h(self) -> int:
        return self.rows * self.panel_h + (self.rows - 1) * self._gaps()[1]

    def bar_box(self) -> tuple[float, float, float, float]:
        w, h, dpi = self.width, self.height, self.dpi
        return (
            (w - self.right + 0.2 * dpi) / w,
            (self.bottom + 0.2 * self.grid_h) / h,
            0.18 * dpi / w,
            0.6 * self.grid_h / h,
        )


def _counted(att: Attention) -> str:
    """`2028 tokens`, `7 × 9 tokens` (cross-attention): the text's, a pooled map's too."""
    n, n_keys = att.token_counts()
    return f"{n} {att.unit}s" if att.keys is None else f"{n} × {n_keys} {att.unit}s"


def query_rows(
    att: Attention, index: int, layers: list[int], heads: list[int], style: Style
) -> np.ndarray:
    """The query figure's data: row (layer, head) is `att.pattern(layer, head)[index, :]` on
    the style's colour scale, NaN (masked) for the keys after it on a causal model;
    `(layers × heads, keys)`."""
    import numpy as np

    mask = masked_cells(att)
    after = None if mask is None else mask[index]  # (keys,)
    empty = np.full(len(att.key_tokens), np.nan)  # a removed head's row, covered in the figure
    return np.stack(
        [
            empty if att.is_removed(layer, h) else style.scaled(att.pattern(layer, h)[index], after)
            for layer in layers
            for h in heads
        ]
    )


def query_figure(
    att: Attention,
    index: int,
    layers: list[int],
    heads: list[int],
    style: Style,
    rows: np.ndarray | None = None,
) -> Any:
    """Where one query token looks in every chosen head: rows are layer·head, columns keys.

    `rows` is `query_rows`'s, computed here when not given; the query's own column is
    outlined, and lines separate the layers.
    """
    from matplotlib.patches import Rectangle

    configure_matplotlib()
    n = len(att.key_tokens)  # the keys: the source's in cross-attention
    if rows is None:
        rows = query_rows(att, index, layers, heads, style)
    first = att.span[0] if att.span else 0  # a window's labels give text positions
    layout = replace(Layout.for_tokens(n), every=att.pool_size, first=first)
    row_in = min(0.22, max(0.1, 12.0 / len(rows)))
    inner = (layout.side_in, max(len(rows) * row_in, 1.5))
    label_in = layout.label_inches(att.key_tokens)
    width = 0.9 + inner[0] + 1.3
    fig, ax = fixed_axes(inner, (0.9, 0.45 + label_in, 1.3, 0.8), style.dpi)
    image = ax.imshow(
        rows, cmap=style.colour_map(), vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    set_ticks(ax, att.key_tokens, layout, y=False)
    continuation_marks(ax, att, rows=False)
    font = min(8.0, max(4.0, row_in * 72 * 0.8))
    ax.set_yticks(
        range(len(rows)),
        [f"L{layer} {att.head_label(h)}".rstrip() for layer in layers for h in heads],
        fontsize=font,
    )
    for boundary in range(len(heads), len(rows), len(heads)):
        ax.axhline(boundary - 0.5, color="white", linewidth=1.2)
    for r, (layer, h) in enumerate((layer, h) for layer in layers for h in heads):
        if att.is_removed(layer, h):
            removed_cover(ax, (-0.5, r - 0.5, n, 1), font)
    if att.info.causal and index < n - 1:
        after = [(index + 0.5, -0.5), (n - 0.5, -0.5), (n - 0.5, len(rows) - 0.5)]
        hatch(ax, [*after, (index + 0.5, len(rows) - 0.5)])
        masked_key(fig, 0.9 + inner[0] + 0.2, 0.15, "masked:\nkey after\nthe query")
    itself = ""
    if att.keys is None:  # in cross-attention the query is not among the keys
        ax.add_patch(
            Rectangle((index - 0.5, -0.5), 1, len(rows), fill=False, edgecolor="red", linewidth=1.2)
        )
        itself = "; red: the query itself"
    ax.set_xlabel(
        f"key ({att.unit} {_key_role(att)}){label_note(layout, att.unit)}{itself}", fontsize=9
    )
    bar = fig.colorbar(image, ax=ax, fraction=0.25 / width, pad=0.2 / width)
    bar.set_label(style.bar_label(att), fontsize=9)
    every = "every layer" if att.per_layer else "every head"
    where = f"where “{att.tokens[index]}” (position {att.position(index)}) looks, in {every}"
    figure_header(fig, att, where)
    return fig
