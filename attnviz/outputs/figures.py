"""Heatmap figures (matplotlib, object API, Agg): per head, per layer grid, and an overview.

Figures are built from arrays and labels. Per-head figures of one text share their size and
labels, so one figure is built per text and only the image, colour bar and title are redrawn
for each head (blitting); that is what makes batch export fast.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core.adapters import STACK_TITLES
from attnviz.outputs.files import write_atomic

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from attnviz.core.attention import Attention

FORMATS = ("png", "svg", "pdf")
# Fonts tried after DejaVu Sans for labels it has no glyph for (CJK, emoji), when installed.
FALLBACK_FONTS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Color Emoji", "Symbola")


SCALES = ("absolute", "head")

# Masked cells, a causal model's keys after the query (weights it cannot have), are drawn grey
# and hatched, never in a colour of the map. This grey is far from the low end of the usual
# maps (RGB distance ≥ 136 from viridis' dark purple, magma's black, Greys' and Blues' white,
# coolwarm's blue) and ≥ 39 from anywhere on the coloured ones; on the grey maps (Greys, gray,
# binary), where every grey is a weight, the white hatching tells it apart.
MASKED_GREY = "#a0a0a0"
MASKED_HATCH = "///"  # 18 lines an inch: ~6 px apart at 100 dpi
MASKED_HATCH_COLOUR = "#ffffff"
MASKED_NOTE = "masked: a causal model's query cannot see later keys"  # the page's legend
# A head removed from the pass (`show --ablate`) has no pattern: its panel is white,
# cross-hatched in light grey (unlike the masked cells' grey and white) and says "removed".
REMOVED_HATCH = "xx"
REMOVED_HATCH_COLOUR = "#c8c8c8"
REMOVED_NOTE = "removed (--ablate): its output was set to 0, so it has no pattern"  # the page's


@dataclass(frozen=True)
class Style:
    """How figures look: file format, resolution, colour map and colour scale.

    `scale` is "absolute" (0 to 1 for every head, so heads compare by eye) or "head" (each
    head's weights divided by its own maximum, so the pattern of a diffuse head shows).
    `top` is what 1 on the absolute scale stands for: 1 for weights and the measures whose
    rows sum to 1, the largest value of the text for `--measure norm` (a length).
    """

    fmt: str = "png"
    dpi: int = 100
    cmap: str = "viridis"
    scale: str = "absolute"
    top: float = 1.0

    def scaled(self, grid: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """One head's `[query, key]` weights as drawn on this style's colour scale; cells
        where `mask` (`masked_cells`) is True become NaN, drawn as masked."""
        import numpy as np

        if self.scale == "head":
            peak = float(grid.max())
            grid = grid / peak if peak > 0 else grid
        elif self.top != 1.0:
            grid = grid / self.top
        return grid if mask is None else np.where(mask, np.nan, grid)

    def colour_map(self) -> Any:
        """The style's matplotlib colour map, NaN (masked) drawn in MASKED_GREY."""
        import matplotlib

        return matplotlib.colormaps[self.cmap].with_extremes(bad=MASKED_GREY)

    def bar_label(self, att: Attention) -> str:
        """The colour bar's label: the measure's unit, and how it was scaled."""
        from attnviz.analysis.contributions import MEASURES

        unit = MEASURES[att.measure].unit
        if att.pooled is not None:
            unit = f"{unit}, {att.pooled[1]} of {att.pool_size}×{att.pool_size}"
        if self.scale == "head":
            return f"{unit} ÷ the {'layer' if att.per_layer else 'head'}'s max"
        if self.top != 1.0:
            return f"{unit} ÷ {self.top:.3g} (the text's largest)"
        return unit


# Thinned labels fall on round steps, so a label's position is easy to count on from.
LABEL_STEPS = (1, 2, 4, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000)
MIN_FONT_PT = 7.0  # the smallest label: about 10 px at the default 100 dpi
THINNED_FONT_PT = 8.0


@dataclass(frozen=True)
class Layout:
    """Sizes that adapt to the number of tokens so that long texts stay readable."""

    side_in: float  # heatmap side, inches
    font_pt: float
    label_step: int  # label every label_step-th token
    every: int = 1  # tokens a cell spans (a pooled map's block): labels give positions
    first: int = 0  # the text's position of the first cell (a window's start)

    @classmethod
    def for_tokens(cls, n: int, max_side_in: float = 10.24, dpi: int | None = None) -> Layout:
        """With `dpi`, the side is a whole number of pixels per cell, at least one: cells are
        drawn alike and none is dropped. The cap keeps a 512-token head near 1000 px, what a
        screen shows (labels are thinned to fit); `export --save-raw` keeps every number."""
        cell_in = min(0.32, max(0.12, 6.0 / max(n, 1)))
        side = min(max(n * cell_in, 3.0), max_side_in)
        if dpi is not None and n > 0:
            side = n * max(1, math.floor(side * dpi / n)) / dpi
        return cls.labelled(n, side)

    @classmethod
    def for_grid(cls, rows: int, cols: int, dpi: int | None = None) -> tuple[Layout, Layout]:
        """Layouts of the query (rows) and key (columns) axes of a (rows, cols) heatmap with
        square cells, sized as `for_tokens` sizes the longer side: the same whole number of
        pixels per cell on both axes. Equal to `for_tokens` for a square map."""
        longest = cls.for_tokens(max(rows, cols), dpi=dpi)
        if rows == cols:
            return longest, longest
        cell_in = longest.side_in / max(rows, cols, 1)
        return cls.labelled(rows, rows * cell_in), cls.labelled(cols, cols * cell_in)

    @classmethod
    def labelled(cls, n: int, side_in: float, max_font_pt: float = 10.0) -> Layout:
        """Labels for `n` tokens along `side_in` inches: every token while a row is tall
        enough for a readable font (at least MIN_FONT_PT); otherwise every k-th token at
        THINNED_FONT_PT, k the first round step that leaves a label's height between labels."""
        cell_pt = side_in * 72 / max(n, 1)
        font = min(max_font_pt, max(MIN_FONT_PT, cell_pt * 0.75))
        if cell_pt * 1.05 >= font:
            return cls(side_in, font, 1)
        font = min(max_font_pt, THINNED_FONT_PT)
        need = 2 * font / cell_pt
        step = next((s for s in LABEL_STEPS if s >= need), math.ceil(need))
        return cls(side_in, font, step)

    def ticks(self, tokens: tuple[str, ...]) -> tuple[list[int], list[str]]:
        """The labelled positions and their labels: each token, or when thinned (or pooled)
        every `label_step`-th cell with the position of its token ("40: fox")."""
        positions = list(range(0, len(tokens), self.label_step))
        if self.label_step == 1 and self.every == 1 and self.first == 0:
            return positions, [_short(t) for t in tokens]
        at = [self.first + i * self.every for i in positions]
        return positions, [f"{n}: {_short(tokens[i])}" for n, i in zip(at, positions)]

    def label_inches(self, tokens: tuple[str, ...]) -> float:
        """Room for the longest tick label, from DejaVu Sans' average glyph width (~0.62 em)."""
        longest = max((len(label) for label in self.ticks(tokens)[1]), default=1)
        return longest * 0.62 * self.font_pt / 72 + 0.1


def masked_cells(att: Attention) -> np.ndarray | None:
    """`[query, key]` True where a causal model's query cannot see the key: every key after
    the query (in the word view and without special tokens too, which keep the order); None
    for an encoder, which sees every key."""
    if not att.info.causal:
        return None
    import numpy as np

    n = len(att.tokens)
    return np.triu(np.ones((n, n), bool), k=1)


WRITTEN_COLOUR = "#00a651"  # a continuation's labels, and the lines before it


def _continuation_marks(ax: Any, att: Attention, rows: bool = True) -> list[Any]:
    """Where a decoder's continuation starts (`--generate`, `--target`): a line before its
    first key (and query, with `rows`) and its tick labels in green; the lines, which
    the figure redraws over each map."""
    c = att.continuation
    if c is None:
        return []
    first, every = (att.span[0] if att.span else 0), att.pool_size
    axes = [(ax.get_xticks(), ax.get_xticklabels())]
    if rows:
        axes.append((ax.get_yticks(), ax.get_yticklabels()))
    for ticks, labels in axes:
        for tick, label in zip(ticks, labels):
            if first + tick * every >= c.start:
                label.set_color(WRITTEN_COLOUR)
    at = (c.start - first) / every - 0.5  # the cell edge before the continuation's first
    if at <= -0.5:
        return []
    lines = [ax.axvline(at, color=WRITTEN_COLOUR, linewidth=1.2)]
    if rows:
        lines.append(ax.axhline(at, color=WRITTEN_COLOUR, linewidth=1.2))
    return lines


def _hatch(ax: Any, corners: list[tuple[float, float]]) -> Any:
    """The masked cells' hatching over the polygon `corners` (data coordinates) of `ax`."""
    from matplotlib.patches import Polygon

    return ax.add_patch(
        Polygon(corners, facecolor="none", edgecolor="none", linewidth=0, hatch=MASKED_HATCH,
                hatchcolor=MASKED_HATCH_COLOUR)
    )  # fmt: skip


def _removed_cover(
    ax: Any,
    bounds: tuple[float, float, float, float],
    size: float,
    text: str = "removed",
    axes_fraction: bool = False,
) -> tuple[Any, Any]:
    """A removed head's panel over `bounds` (x, y, width, height; data coordinates, or
    fractions of `ax` with `axes_fraction`): the cover and its label, both to toggle with
    `set_visible`. Drawn over the heatmap, which shows through nowhere."""
    from matplotlib.patches import Rectangle

    transform = ax.transAxes if axes_fraction else ax.transData
    x, y, width, height = bounds
    cover = ax.add_patch(
        Rectangle((x, y), width, height, transform=transform, facecolor="white",
                  edgecolor="none", linewidth=0, hatch=REMOVED_HATCH,
                  hatchcolor=REMOVED_HATCH_COLOUR, zorder=3)
    )  # fmt: skip
    label = ax.text(x + width / 2, y + height / 2, text, transform=transform, ha="center",
                    va="center", fontsize=size, zorder=4, clip_on=True,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5})  # fmt: skip
    return cover, label


def _above_diagonal(n: int, x0: float = 0, y0: float = 0) -> list[tuple[float, float]]:
    """The staircase around the cells above the diagonal of an n × n image whose first cell
    is centred on (x0, y0): the masked cells of a causal head."""
    steps = [(x0 + i + 0.5, y0 + i + d) for i in range(n - 1) for d in (-0.5, 0.5)]
    return [*steps, (x0 + n - 0.5, y0 + n - 1.5), (x0 + n - 0.5, y0 - 0.5)]


def _masked_key(fig: Any, x_in: float, y_in: float, text: str, size: float = 8) -> None:
    """A legend entry for masked cells: a hatched grey square with its bottom left corner at
    (`x_in`, `y_in`) inches from the figure's bottom left, `text` to its right."""
    from matplotlib.patches import Rectangle

    width, height = fig.get_figwidth(), fig.get_figheight()
    fig.add_artist(
        Rectangle((x_in / width, y_in / height), 0.18 / width, 0.18 / height,
                  transform=fig.transFigure, facecolor=MASKED_GREY, edgecolor="#404040",
                  linewidth=0.5, hatch=MASKED_HATCH, hatchcolor=MASKED_HATCH_COLOUR)
    )  # fmt: skip
    fig.text((x_in + 0.26) / width, (y_in + 0.09) / height, text, va="center", fontsize=size)


def _header(fig: Any, att: Attention, title: str = "", *more: str) -> Any:
    """The figure's title lines, top centre: `title` (11 pt; returned, to be set per frame),
    the context line (model, text, view) and any `more` lines (8 pt)."""
    height, width = fig.get_figheight(), fig.get_figwidth()

    def line(y_in: float, text: str, size: float) -> Any:
        return fig.text(0.5, 1 - y_in / height, text, ha="center", va="center", fontsize=size)

    context = context_line(att, width)
    # a line longer than the figure (a narrow one, a long view) in smaller type, down to 6 pt
    size = max(6.0, min(8.0, (width - 0.3) * 72 / (0.6 * len(context))))
    if size < 8.0:
        context = context_line(att, width, size)
    line(0.5, context, size)
    for n, text in enumerate(more, start=1):
        line(0.5 + 0.18 * n, text, 8)
    return line(0.25, title, 11)


def check_cmap(name: str) -> str:
    """Return `name` if matplotlib knows this colour map, else raise InputError naming some."""
    if name == Style.cmap:  # the default: no need to import matplotlib to know it (fast start)
        return name
    import matplotlib

    from attnviz.errors import InputError

    if name not in matplotlib.colormaps:
        raise InputError(
            f"unknown colour map '{name}'; try viridis, magma, inferno, Blues, Greys or Reds"
        )
    return name


def _configure_matplotlib() -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    families = ["DejaVu Sans"] + [f for f in FALLBACK_FONTS if f in installed]
    matplotlib.rcParams["font.family"] = families
    # Glyphs as the font draws them, not fitted to the pixel grid: the same letters to the eye
    # at these sizes, and a third less time a title (1.5 against 2.4 ms for a head's, redrawn
    # each frame: a tenth of the frame at 512 tokens).
    matplotlib.rcParams["text.hinting"] = "no_hinting"
    # Scripts that no installed font covers are drawn as boxes: not worth a warning per glyph.
    warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)


def _ticks(
    ax: Any,
    labels: tuple[str, ...],
    layout: Layout,
    x: bool = True,
    y: bool = True,
    keys: tuple[tuple[str, ...], Layout] | None = None,
) -> None:
    """Token labels down (queries) and across (keys); `keys` gives the key axis its own
    tokens and layout where they differ (cross-attention's source)."""
    key_labels, key_layout = keys if keys is not None else (labels, layout)
    if x:
        positions, shown = key_layout.ticks(key_labels)
        ax.set_xticks(positions, shown, rotation=90, fontsize=key_layout.font_pt)
    else:
        ax.set_xticks([])
    if y:
        positions, shown = layout.ticks(labels)
        ax.set_yticks(positions, shown, fontsize=layout.font_pt)
    else:
        ax.set_yticks([])


def _short(label: str, max_len: int = 16) -> str:
    return label if len(label) <= max_len else label[: max_len - 1] + "…"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, …, 11th, 12th, 13th, …, 21st."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def _label_note(layout: Layout, unit: str = "token") -> str:
    step = layout.label_step * layout.every  # a pooled map's cell spans `every` tokens
    if step == 1:
        return ""
    return f" (every {ordinal(step)} {unit} labelled)"


def view_description(att: Attention) -> str:
    """How the weights were derived from the model's: the measure, the unit and what was
    hidden."""
    from attnviz.analysis.contributions import MEASURES

    parts = ["word view" if att.unit == "word" else "token view"]
    if att.stack is not None:  # "cross-attention", "encoder self-attention"
        parts.insert(0, STACK_TITLES[att.stack].split(" (")[0].lower())
    if att.measure != "weights":
        measure = MEASURES[att.measure]
        parts.insert(0, f"{measure.name}: {measure.unit} ({measure.cite})")
    if att.hidden_special:
        parts.append("special tokens hidden, rows renormalised")
    if att.pooled is not None:
        parts.append(f"pooled: {att.pooling()}")
    if att.span is not None:
        first, end = att.span
        parts.append(f"window {first}:{end}, exact (keys outside it left out)")
    return ", ".join(parts)


def context_line(att: Attention, width_in: float, font_pt: float = 8.0) -> str:
    """Model, the text and the view, shortened to fit `width_in` inches: what a figure shows,
    read from its title."""
    fits = int(width_in * 72 / (font_pt * 0.6))  # DejaVu Sans: ~0.6 em a character
    rest = f"{att.info.name} · “” · {view_description(att)}"
    texts = [att.text] if att.target is None else [att.text, att.target]  # source → target
    room = max((fits - len(rest) - 4 * (len(texts) - 1)) // len(texts), 12)
    shown = []
    for text in texts:
        text = " ".join(text.split())
        shown.append(text[: room - 1].rstrip() + "…" if len(text) > room else text)
    return f"{att.info.name} · {' → '.join(f'“{t}”' for t in shown)} · {view_description(att)}"


def png_bytes(rgba: np.ndarray, dpi: int) -> bytes:
    """Encode an (height, width, 4) uint8 image as PNG: no row filter, deflate level 1.

    Twice as fast as Pillow's encoder on these figures: flat colour compresses well without
    filtering, and keeping the (opaque) alpha channel avoids a strided copy. Pixels are exact.
    Deflated by ISA-L (`isal`) where it is installed, six times as fast as zlib at its fastest
    level, in smaller files: zlib took half of a 512-token head's frame.
    """
    import struct
    import zlib

    import numpy as np

    try:
        from isal.isal_zlib import compress
    except ImportError:  # a platform without its wheels: the same stream, slower
        from zlib import compress

    height, width, _ = rgba.shape
    rows = np.empty((height, width * 4 + 1), np.uint8)  # each row: filter byte 0, then RGBA
    rows[:, 0] = 0
    rows[:, 1:] = rgba.reshape(height, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    per_metre = round(dpi / 0.0254)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)),
            chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)),
            chunk(b"IDAT", compress(rows, 1)),
            chunk(b"IEND", b""),
        )
    )


def _write_canvas_png(canvas: Any, dpi: int, handle: Any) -> None:
    """Write what an Agg canvas last drew as a PNG."""
    import numpy as np

    rgba = np.asarray(canvas.buffer_rgba())  # (height, width, 4)
    handle.write(png_bytes(rgba, dpi))


def _fixed_axes(
    inner: tuple[float, float], margins: tuple[float, float, float, float], dpi: int
) -> tuple[Any, Any]:
    """A figure with one axes of `inner` (width, height) inches and margins (left, bottom,
    right, top) in inches: a fixed layout costs one draw, where constrained layout costs three."""
    from matplotlib.figure import Figure

    left, bottom, right, top = margins
    width, height = left + inner[0] + right, bottom + inner[1] + top
    fig = Figure(figsize=(width, height), dpi=dpi)
    ax = fig.add_axes((left / width, bottom / height, inner[0] / width, inner[1] / height))
    return fig, ax


class _Frames:
    """A figure drawn once, then redrawn per frame by drawing only its `dynamic` artists.

    Heatmaps among them whose cells are whole pixels are painted straight into the canvas
    (`_paint_cells`), the same pixels Agg's nearest-neighbour resampling gives, without its
    detour through float RGBA images: at 512 tokens that is half of a frame's time.
    """

    def __init__(self, fig: Any, dynamic: list[Any], style: Style) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.image import AxesImage

        self.fig = fig
        self.canvas = FigureCanvasAgg(fig)
        self.dynamic = dynamic
        self.style = style
        self._background = None
        self._heatmaps = {id(a) for a in dynamic if isinstance(a, AxesImage)}

    def save(self, path: Path) -> Path:
        """Write the current state of the figure atomically to `path`."""
        if self.style.fmt != "png":
            return write_atomic(
                path, lambda h: self.fig.savefig(h, format=self.style.fmt, dpi=self.style.dpi)
            )
        self.lay_out()
        self.canvas.restore_region(self._background)
        for artist in self.dynamic:
            if id(artist) not in self._heatmaps or not _paint_cells(self.canvas, artist):
                self.fig.draw_artist(artist)
        return write_atomic(path, self._write_png)

    def lay_out(self) -> None:
        """Draw what every frame shares (all but the dynamic artists), once: before the first
        frame, or ahead of it, while there is nothing to draw yet (`render.prepare`)."""
        if self._background is not None or self.style.fmt != "png":
            return
        visible = [artist.get_visible() for artist in self.dynamic]
        for artist in self.dynamic:
            artist.set_visible(False)
        self.canvas.draw()
        self._background = self.canvas.copy_from_bbox(self.fig.bbox)
        for artist, shown in zip(self.dynamic, visible):
            artist.set_visible(shown)

    def _write_png(self, handle: Any) -> None:
        _write_canvas_png(self.canvas, self.style.dpi, handle)

    def close(self) -> None:
        self.fig.clear()


def _paint_cells(canvas: Any, image: Any) -> bool:
    """Paint a nearest-neighbour heatmap with whole pixels per cell into the Agg canvas: each
    cell's colour read from the colour map's table as matplotlib reads it (value × N, floored,
    in the data's precision; NaN, a masked cell, in the map's "bad" colour), repeated over its
    pixels. Return False, painting nothing, for any other image (the caller draws it the usual
    way).
    """
    import numpy as np
    from matplotlib.colors import Normalize

    data = np.asarray(image.get_array())
    norm = image.norm
    if (
        image.get_interpolation() != "nearest"
        or data.ndim != 2
        or data.dtype.kind != "f"
        or type(norm) is not Normalize
        or (norm.vmin, norm.vmax) != (0.0, 1.0)
        or image.get_alpha() is not None
        or image.origin != "upper"
    ):
        return False
    box = image.axes.get_window_extent()  # display pixels, origin bottom left
    height = canvas.get_width_height()[1]
    edges = np.array([box.x0, box.x1, height - box.y1, height - box.y0])  # left right top bottom
    whole = np.round(edges)
    if np.abs(edges - whole).max() > 1e-3:
        return False
    x0, x1, y0, y1 = (int(v) for v in whole)
    rows, cols = data.shape
    if (y1 - y0) % rows or (x1 - x0) % cols or (y1 - y0) // rows != (x1 - x0) // cols:
        return False
    masked = np.isnan(data)
    some = bool(masked.any())
    values = np.where(masked, data.dtype.type(0), data) if some else data
    # (an infinity fails these too)
    if not (values.min() >= 0 and values.max() <= 1):
        return False  # the map's under and over colours: matplotlib's business
    cmap = image.get_cmap()
    index = (values * data.dtype.type(cmap.N)).astype(np.int32)  # 0 to N (a value of 1)
    np.minimum(index, cmap.N - 1, out=index)
    if some:
        index[masked] = cmap.N
    table = np.empty((cmap.N + 1, 4), np.uint8)  # the map's N colours, then its bad one
    table[:-1] = cmap(np.arange(cmap.N), bytes=True)
    table[-1] = cmap(np.nan, bytes=True)
    # a pixel's 4 bytes read as one uint32: one value a pixel to look up and copy
    colours = table.view(np.uint32)[:, 0][index]  # (rows, cols)
    k = (x1 - x0) // cols
    pixels = np.asarray(canvas.buffer_rgba()).view(np.uint32)[..., 0]  # (height, width)
    # (rows, k, cols × k): splitting an axis is a view, so the writes reach the canvas; each
    # row of cells widened once, then written k times as whole pixel rows (3× as fast as
    # broadcasting over both axes)
    cells = pixels[y0:y1, x0:x1].reshape(rows, k, cols * k)
    cells[:] = colours.repeat(k, axis=1)[:, None, :]
    return True


class HeadFigure:
    """One reusable per-head figure for one text: query tokens down, key tokens across, colour bar.

    The title's first line names the head, the second the model, text and view. `save` can
    outline cells, e.g. the arcs of a dependency relation.
    """

    def __init__(self, att: Attention, style: Style) -> None:
        import numpy as np
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure

        _configure_matplotlib()
        tokens, keys, unit = att.tokens, att.key_tokens, att.unit
        n, n_keys = len(tokens), len(keys)
        layout, key_layout = Layout.for_grid(n, n_keys, dpi=style.dpi)
        first = att.span[0] if att.span else 0
        layout, key_layout = (
            replace(lay, every=att.pool_size, first=first) for lay in (layout, key_layout)
        )
        # Axis label + tick labels, in whole pixels so that every cell spans the same pixels.
        left = round((0.45 + layout.label_inches(tokens)) * style.dpi) / style.dpi
        bottom = round((0.45 + key_layout.label_inches(keys)) * style.dpi) / style.dpi
        top, right = 0.75, 1.25  # two title lines; colour bar with its ticks and label
        side, wide = layout.side_in, key_layout.side_in  # the map's height and width
        # a short map (few target tokens) keeps room for its title and colour bar
        dpi = style.dpi
        top += round(max(0.0, 1.6 - side) * dpi) / dpi
        left += round(max(0.0, (4.5 - wide - left - right) / 2) * dpi) / dpi
        width, height = left + wide + right, bottom + side + top
        fig = Figure(figsize=(width, height), dpi=style.dpi)
        ax = fig.add_axes((left / width, bottom / height, wide / width, side / height))
        self.image = ax.imshow(
            np.zeros((n, n_keys)), cmap=style.colour_map(), vmin=0.0, vmax=1.0,
            interpolation="nearest",
        )  # fmt: skip
        _ticks(ax, tokens, layout, keys=(keys, key_layout))
        written = _continuation_marks(ax, att)
        ax.set_xlabel(f"key ({unit} {_key_role(att)}){_label_note(key_layout, unit)}", fontsize=9)
        ax.set_ylabel(
            f"query ({unit} {'attending' if att.measure == 'weights' else 'built'}"
            f"{_query_side(att)})",
            fontsize=9,
        )
        self.mask = masked_cells(att)
        # A causal model's bar makes room below it for the masked cells' key.
        bar_y = 0.1 * side if self.mask is None else 0.55
        bar = fig.add_axes(
            (
                (left + wide + 0.15) / width,
                (bottom + bar_y) / height,
                0.18 / width,
                (0.9 * side - bar_y) / height,
            )
        )
        colorbar = fig.colorbar(self.image, cax=bar)
        colorbar.ax.tick_params(labelsize=8)
        colorbar.set_label(style.bar_label(att), fontsize=9)
        hatching = []
        if self.mask is not None:
            hatching.append(_hatch(ax, _above_diagonal(n)))
            _masked_key(fig, left + wide + 0.15, bottom, "masked:\nkey after\nthe query")
        self.title = _header(fig, att)
        self.style = style
        self.marks = ax.add_collection(
            PatchCollection([], facecolor="none", edgecolor="#ff2020", linewidth=1.6)
        )
        self.removed = _removed_cover(
            ax, (0, 0, 1, 1), 10, "removed (--ablate)\nits output was set to 0:\nno pattern",
            axes_fraction=True,
        )  # fmt: skip
        dynamic = [self.image, *hatching, *written, *self.removed, *ax.spines.values(),
                   self.marks, self.title]  # fmt: skip
        self.frames = _Frames(fig, dynamic, style)

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
        import numpy as np
        from matplotlib.figure import Figure

        _configure_matplotlib()
        n, n_keys = len(att.tokens), len(att.key_tokens)
        longest = max(n, n_keys)
        cols = min(len(heads), 4)
        rows = math.ceil(len(heads) / cols)
        layout = Layout.for_tokens(longest, max_side_in=10.0)
        # Laid out in whole pixels, panels with whole pixels per token where they fit: every
        # cell is drawn alike, and the heatmaps can be painted straight into the canvas (see
        # _Frames). Longer texts keep the panel's size and are resampled by matplotlib.
        # A cross-attention panel is as wide as its keys and as tall as its queries.
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
        gap_w, gap_h = round(0.15 * dpi), round(0.35 * dpi)  # panel titles sit in the gaps
        grid_w = cols * panel_w + (cols - 1) * gap_w
        spare = max(0, round(5.5 * dpi) - (left + grid_w + right)) // 2  # room for the title
        left, right = left + spare, right + spare
        width = left + grid_w + right
        height = bottom + rows * panel_h + (rows - 1) * gap_h + top
        fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
        self.heads = heads
        self.style = style
        self.images = []
        self.panel_titles = []
        self.covers = []  # each panel's cover for a removed head
        self.removed = att.removed
        self.mask = masked_cells(att)
        hatching, written = [], []
        for slot in range(len(heads)):
            row, col = divmod(slot, cols)
            x0 = left + col * (panel_w + gap_w)
            y0 = bottom + (rows - 1 - row) * (panel_h + gap_h)
            ax = fig.add_axes((x0 / width, y0 / height, panel_w / width, panel_h / height))
            image = ax.imshow(
                np.zeros((n, n_keys)), cmap=style.colour_map(), vmin=0.0, vmax=1.0,
                interpolation="nearest", aspect="auto",
            )  # fmt: skip
            self.images.append(image)
            if self.mask is not None:
                hatching.append(_hatch(ax, _above_diagonal(n)))
            self.covers.append(_removed_cover(ax, (0, 0, 1, 1), 9, axes_fraction=True))
            # Panel titles as figure texts: blitting redraws them alone.
            centre, above = (x0 + panel_w / 2) / width, (y0 + panel_h + 0.06 * dpi) / height
            self.panel_titles.append(fig.text(centre, above, "", ha="center", va="bottom",
                                              fontsize=9))  # fmt: skip
            last_row = row == rows - 1 or slot + cols >= len(heads)
            _ticks(ax, att.tokens, small, x=last_row, y=col == 0,
                   keys=(att.key_tokens, small_keys))  # fmt: skip
            written += _continuation_marks(ax, att)
        grid_h = rows * panel_h + (rows - 1) * gap_h
        bar = fig.add_axes(
            (
                (width - right + 0.2 * dpi) / width,
                (bottom + 0.2 * grid_h) / height,
                0.18 * dpi / width,
                0.6 * grid_h / height,
            )
        )
        fig.colorbar(self.images[0], cax=bar, label=style.bar_label(att))
        if self.mask is not None:
            below = (bottom + 0.2 * grid_h) / dpi - 0.5
            _masked_key(fig, (width - right) / dpi + 0.2, below, "masked:\nkey after\nthe query")
        note = f"{_counted(att)}{_label_note(small, att.unit)} · {_scale_note(style)}"
        self.info_name = att.info.name
        self.title = _header(fig, att, "", note)
        # Spines go after the images (and their hatching): a full draw paints them on top.
        spines = [spine for image in self.images for spine in image.axes.spines.values()]
        covers = [artist for cover in self.covers for artist in cover]
        dynamic = [*self.images, *hatching, *written, *covers, *spines, *self.panel_titles,
                   self.title]  # fmt: skip
        self.frames = _Frames(fig, dynamic, style)

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
    redrawn over the rest (`_Frames`), 40 ms at 512 tokens where a whole figure takes 100."""

    def __init__(self, att: Attention, layers: list[int], heads: list[int], style: Style) -> None:
        import matplotlib
        import numpy as np

        _configure_matplotlib()
        n, n_keys = len(att.tokens), len(att.key_tokens)
        panel_in = 1.0
        _, m, cell = _overview_cells(max(n, n_keys), style.dpi)
        inner = (len(heads) * panel_in, len(layers) * panel_in)
        side = max(0.2, (6.0 - inner[0]) / 2)  # room for the title over narrow grids
        causal = masked_cells(att) is not None
        bottom = 0.65 if causal else 0.35  # the masked cells' key below the panels
        fig, ax = _fixed_axes(inner, (0.45 + side, bottom, 0.15 + side, 0.65), style.dpi)
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
                    over += _removed_cover(ax, (c * cell - 0.5, r * cell - 0.5, cols_m, rows_m), 7)
                elif causal:
                    over.append(_hatch(ax, _above_diagonal(m, c * cell, r * cell)))
        if causal:
            _masked_key(fig, 0.45 + side, 0.12, "masked: key after the query (a causal model)")
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
        _header(fig, att, f"{chosen} · {_counted(att)} · each panel scaled to its own max")
        # hatching first, then each cover and its label: the order a whole draw takes them in
        over.sort(key=lambda artist: artist.get_zorder())
        self.frames = _Frames(fig, [self.image, *over], style)

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

    _configure_matplotlib()
    n = len(att.key_tokens)  # the keys: the source's in cross-attention
    if rows is None:
        rows = query_rows(att, index, layers, heads, style)
    first = att.span[0] if att.span else 0  # a window's labels give text positions
    layout = replace(Layout.for_tokens(n), every=att.pool_size, first=first)
    row_in = min(0.22, max(0.1, 12.0 / len(rows)))
    inner = (layout.side_in, max(len(rows) * row_in, 1.5))
    label_in = layout.label_inches(att.key_tokens)
    width = 0.9 + inner[0] + 1.3
    fig, ax = _fixed_axes(inner, (0.9, 0.45 + label_in, 1.3, 0.8), style.dpi)
    image = ax.imshow(
        rows, cmap=style.colour_map(), vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    _ticks(ax, att.key_tokens, layout, y=False)
    _continuation_marks(ax, att, rows=False)
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
            _removed_cover(ax, (-0.5, r - 0.5, n, 1), font)
    if att.info.causal and index < n - 1:
        after = [(index + 0.5, -0.5), (n - 0.5, -0.5), (n - 0.5, len(rows) - 0.5)]
        _hatch(ax, [*after, (index + 0.5, len(rows) - 0.5)])
        _masked_key(fig, 0.9 + inner[0] + 0.2, 0.15, "masked:\nkey after\nthe query")
    itself = ""
    if att.keys is None:  # in cross-attention the query is not among the keys
        ax.add_patch(
            Rectangle((index - 0.5, -0.5), 1, len(rows), fill=False, edgecolor="red", linewidth=1.2)
        )
        itself = "; red: the query itself"
    ax.set_xlabel(
        f"key ({att.unit} {_key_role(att)}){_label_note(layout, att.unit)}{itself}", fontsize=9
    )
    bar = fig.colorbar(image, ax=ax, fraction=0.25 / width, pad=0.2 / width)
    bar.set_label(style.bar_label(att), fontsize=9)
    every = "every layer" if att.per_layer else "every head"
    where = f"where “{att.tokens[index]}” (position {att.position(index)}) looks, in {every}"
    _header(fig, att, where)
    return fig


def figure_png(fig: Any) -> bytes:
    """A figure drawn and encoded as PNG bytes (the fast encoder)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return png_bytes(np.asarray(canvas.buffer_rgba()), int(fig.dpi))


def save_figure(fig: Any, path: Path, style: Style) -> Path:
    """Write a figure atomically in the chosen format (PNG by the fast encoder), then free it."""
    if style.fmt == "png":
        png = figure_png(fig)
        path = write_atomic(path, lambda handle: handle.write(png))
    else:
        path = write_atomic(path, lambda h: fig.savefig(h, format=style.fmt, dpi=style.dpi))
    fig.clear()
    return path


def _grid_axes(
    layers: list[int], heads: list[int], title: str, style: Style, right: float = 1.1
) -> tuple[Any, Any]:
    """A layers × heads grid figure: rows are the chosen layers, columns the chosen heads;
    `right` inches for a colour bar or legend."""
    _configure_matplotlib()
    cell = 0.62
    inner = (max(len(heads), 2) * cell, max(len(layers), 2) * cell)
    fig, ax = _fixed_axes(inner, (0.7, 0.6, right, 0.75), style.dpi)
    ax.set_xticks(range(len(heads)), [f"H{h}" for h in heads], fontsize=8)
    ax.set_yticks(range(len(layers)), [f"L{layer}" for layer in layers], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    return fig, ax


class MetricGrid:
    """One reusable layers × heads heatmap with the numbers written in, redrawn per metric."""

    def __init__(self, layers: list[int], heads: list[int], model: str, style: Style) -> None:
        import numpy as np

        self.model = model
        fig, ax = _grid_axes(layers, heads, "", style)
        self.image = ax.imshow(
            np.zeros((len(layers), len(heads))),
            cmap=style.cmap,
            vmin=0.0,
            vmax=1.0,
            aspect="auto",
        )
        self.numbers = [
            [ax.text(c, r, "", ha="center", va="center", fontsize=7) for c in range(len(heads))]
            for r in range(len(layers))
        ]
        width = fig.get_figwidth()
        bar = fig.colorbar(self.image, ax=ax, fraction=0.8 / width, pad=0.15 / width)
        self.title = fig.text(0.5, 1 - 0.35 / fig.get_figheight(), "", ha="center", va="center")
        texts = [text for row in self.numbers for text in row]
        dynamic = [self.image, *ax.spines.values(), *texts, bar.ax, self.title]
        self.frames = _Frames(fig, dynamic, style)

    def save(self, values: np.ndarray, name: str, help_text: str, path: Path) -> Path:
        """Draw one metric's means over the chosen `[layer, head]` cells and write the figure."""
        import numpy as np

        finite = values[np.isfinite(values)]
        top = float(finite.max()) if finite.size else 1.0
        vmax = 1.0 if top <= 1.0 else top  # shares on 0–1; entropy and distance on their range
        self.image.set_data(values)
        self.image.set_clim(0.0, vmax)
        for (r, c), value in np.ndenumerate(values):
            text = self.numbers[r][c]
            text.set_text(f"{value:.2f}" if np.isfinite(value) else "—")
            text.set_color("white" if np.isfinite(value) and value / vmax < 0.55 else "black")
        self.title.set_text(f"{name} — {help_text}\n{self.model}")
        return self.frames.save(path)

    def close(self) -> None:
        self.frames.close()


# What the role map says of a role measured elsewhere than on the corpus's texts: a decoder's
# induction role comes from the probe on repeated random tokens (report.md says so in full).
PROBED = " (probe)"


def role_map_figure(
    roles: Any, layers: list[int], heads: list[int], model: str, style: Style
) -> Any:
    """Each chosen head's role as a coloured cell with its short name and score; the legend
    says which roles come from the decoder probe rather than the corpus."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from attnviz.analysis.roles import EVERY_ROLE

    names = list(EVERY_ROLE)
    codes = np.zeros((len(layers), len(heads)))
    fig, ax = _grid_axes(layers, heads, f"Head roles — {model}", style, 1.9)
    for role in roles:
        r, c = layers.index(role.layer), heads.index(role.head)
        codes[r, c] = names.index(role.role)
        score = "" if role.score is None else f"\n{role.score:.2f}"
        ax.text(c, r, EVERY_ROLE[role.role].short + score, ha="center", va="center", fontsize=6.5)
    cmap = ListedColormap([EVERY_ROLE[n].colour for n in names])
    ax.imshow(codes, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto")
    present = sorted({r.role for r in roles}, key=names.index)
    ax.legend(
        handles=[
            Patch(color=EVERY_ROLE[n].colour, label=n + (PROBED if EVERY_ROLE[n].probed else ""))
            for n in present
        ],  # fmt: skip
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    return fig


def relation_figure(
    accuracy: np.ndarray,
    relations: list[str],
    panels: tuple[str, ...],
    layers: list[int],
    heads: list[int],
    title: str,
    style: Style,
) -> Any:
    """Heads × relations heatmaps, one panel per direction: each cell a head's accuracy.

    `accuracy` is (panel, relation, layer, head) over the chosen layers and heads; columns
    are the heads, grouped by layer; the best head of each row is outlined and labelled.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    _configure_matplotlib()
    n_rel, n_cols = len(relations), len(layers) * len(heads)
    labelled = n_cols <= 16  # every column named; otherwise one label per layer
    cell_w, cell_h = max(0.16, min(0.5, 9.0 / n_cols)), 0.24
    labels_h = 0.6 if labelled else 0.25  # rotated "L2 H8" labels, or one line per layer
    left, right, top, bottom, gap = 1.1, 1.1, 0.75, 0.3 + labels_h, 0.3 + labels_h
    inner_w, panel_h = n_cols * cell_w, n_rel * cell_h
    spare = max(0.0, 6.5 - (left + inner_w + right)) / 2  # room for the title
    left, right = left + spare, right + spare
    width = left + inner_w + right
    height = top + len(panels) * panel_h + (len(panels) - 1) * gap + bottom
    fig = Figure(figsize=(width, height), dpi=style.dpi)
    for p, panel in enumerate(panels):
        y0 = bottom + (len(panels) - 1 - p) * (panel_h + gap)
        ax = fig.add_axes((left / width, y0 / height, inner_w / width, panel_h / height))
        grid = accuracy[p].reshape(n_rel, n_cols)  # (R, layers × heads)
        image = ax.imshow(grid, cmap=style.cmap, vmin=0.0, vmax=1.0, aspect="auto",
                          interpolation="nearest")  # fmt: skip
        for r, c in enumerate(grid.argmax(axis=1)):
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="#ff2020",
                                   linewidth=1.2))  # fmt: skip
            ax.text(c, r, f"{grid[r, c]:.2f}".replace("0.", ".", 1), ha="center", va="center",
                    fontsize=5.5, color="black" if grid[r, c] > 0.55 else "white")  # fmt: skip
        for boundary in range(1, len(layers)):
            ax.axvline(boundary * len(heads) - 0.5, color="white", linewidth=1.0)
        ax.set_yticks(range(n_rel), relations, fontsize=7)
        if labelled:
            names = [f"L{layer} H{head}" for layer in layers for head in heads]
            ax.set_xticks(range(n_cols), names, rotation=90, fontsize=6)
        else:
            centres = [(i + 0.5) * len(heads) - 0.5 for i in range(len(layers))]
            ax.set_xticks(centres, [f"layer {layer}" for layer in layers], fontsize=7)
        ax.tick_params(length=0)
        ax.set_title(panel, fontsize=9, loc="left")
    if not labelled:
        fig.text(0.5, 0.12 / height, f"heads {heads[0]}–{heads[-1]} of each layer, left to "
                 "right; the best head of each row outlined", ha="center", fontsize=7)  # fmt: skip
    bar = fig.add_axes(((left + inner_w + 0.25) / width, bottom / height, 0.15 / width,
                        (height - top - bottom) / height))  # fmt: skip
    fig.colorbar(image, cax=bar, label="accuracy")
    fig.text(0.5, 1 - 0.3 / height, title, ha="center", va="center", fontsize=10)
    return fig


def importance_figure(
    scores: np.ndarray,
    ranks: np.ndarray,
    layers: list[int],
    heads: list[int],
    title: str,
    bar_label: str,
    style: Style,
    numbered: int = 10,
) -> Any:
    """Each chosen head's importance as a layers × heads map of square cells, the `numbered`
    most important heads marked with their rank. `scores` and `ranks` are over the chosen
    layers × heads.

    The longer of the two axes runs across, so a deep model (SmolLM2: 30 layers × 9 heads)
    gives a wide map rather than a tall sliver. A score below 0 (removing the head helps) is
    blue, above 0 red, on limits symmetric about 0: the colour bar is centred on 0 and equal
    colours are equal magnitudes on both sides (a two-slope scale would stretch −0.26 to look
    as strong as +1.0). Scores that are all ≥ 0 use the style's colour map from 0.
    """
    import numpy as np
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    _configure_matplotlib()
    across = len(layers) > len(heads)  # layers along x
    grid = scores.T if across else scores  # (rows, columns) as drawn
    numbers = ranks.T if across else ranks
    row_labels = [f"H{h}" for h in heads] if across else [f"L{layer}" for layer in layers]
    col_labels = [f"L{layer}" for layer in layers] if across else [f"H{h}" for h in heads]
    n_rows, n_cols = grid.shape
    cell = max(0.28, min(0.5, 9.0 / max(n_cols, 1)))  # inches, square
    inner_w, inner_h = n_cols * cell, n_rows * cell
    left, right, top, bottom = 0.75, 1.35, 0.6, 0.75
    spare = max(0.0, 6.5 - (left + inner_w + right)) / 2  # room for the title
    left, right = left + spare, right + spare
    width, height = left + inner_w + right, bottom + inner_h + top
    fig = Figure(figsize=(width, height), dpi=style.dpi)
    ax = fig.add_axes((left / width, bottom / height, inner_w / width, inner_h / height))
    finite = grid[np.isfinite(grid)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if low < 0:
        extent = max(-low, high)
        norm, cmap = Normalize(-extent, extent), "RdBu_r"
    else:
        norm, cmap = Normalize(0.0, high if high > 0 else 1.0), style.cmap
    image = ax.imshow(grid, cmap=cmap, norm=norm, aspect="equal", interpolation="nearest")
    font = min(7.0, cell * 72 * 0.4)
    for (r, c), rank in np.ndenumerate(numbers):
        if 0 < rank <= numbered:
            shade = image.cmap(image.norm(grid[r, c]))
            dark = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5
            ax.text(c, r, str(rank), ha="center", va="center", fontsize=font, fontweight="bold",
                    color="white" if dark else "black")  # fmt: skip
    labels = 8.0 if cell >= 0.4 else 7.0
    ax.set_xticks(range(n_cols), col_labels, fontsize=labels)
    ax.set_yticks(range(n_rows), row_labels, fontsize=labels)
    ax.tick_params(length=2)
    what = f"numbered: the {numbered} most important, by rank"
    ax.set_xlabel(f"layer  ({what})" if across else f"head  ({what})", fontsize=9)
    ax.set_ylabel("head" if across else "layer", fontsize=9)
    bar = fig.add_axes(((left + inner_w + 0.2) / width, bottom / height, 0.15 / width,
                        inner_h / height))  # fmt: skip
    colorbar = fig.colorbar(image, cax=bar)
    colorbar.ax.tick_params(labelsize=7)
    colorbar.set_label(bar_label, fontsize=8)
    fig.text(0.5, 1 - 0.3 / height, title, ha="center", va="center", fontsize=10)
    return fig


DIFFERENCE_LABEL = "B − A, centred on 0 (white: no change)\nred: more in B, blue: more in A"


def difference_figure(
    a_grid: np.ndarray, b_grid: np.ndarray, labels: list[str], title: str, style: Style
) -> Any:
    """One head on two aligned inputs: A's and B's `[query, key]` maps (U, U) on the style's
    colour map from 0 to 1, and B − A on a diverging map centred on 0, each with its bar."""
    from matplotlib.figure import Figure

    _configure_matplotlib()
    tokens = tuple(labels)
    layout = Layout.for_tokens(len(tokens))
    side, margin = layout.side_in, layout.label_inches(tokens)
    panel_w, gap, bar_w = side, 0.35, 0.9
    left, bottom, top = margin + 0.35, margin + 0.55, 0.9
    width = left + 3 * panel_w + 2 * (gap + bar_w) + bar_w
    height = bottom + side + top
    fig = Figure(figsize=(width, height), dpi=style.dpi)
    difference = b_grid - a_grid
    limit = float(abs(difference).max()) or 1e-6  # symmetric limits: 0 sits in the middle
    panels = (
        ("A", a_grid, style.cmap, 0.0, 1.0, "weight (rows renormalised over aligned keys)"),
        ("B", b_grid, style.cmap, 0.0, 1.0, "weight (rows renormalised over aligned keys)"),
        ("B − A", difference, "RdBu_r", -limit, limit, DIFFERENCE_LABEL),
    )
    for i, (name, grid, cmap, low, high, bar_label) in enumerate(panels):
        x0 = left + i * (panel_w + gap + bar_w)
        ax = fig.add_axes((x0 / width, bottom / height, panel_w / width, side / height))
        image = ax.imshow(grid, cmap=cmap, vmin=low, vmax=high, interpolation="nearest")
        _ticks(ax, tokens, layout, y=i == 0)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("key", fontsize=9)
        if i == 0:
            ax.set_ylabel("query", fontsize=9)
        cax = fig.add_axes(((x0 + panel_w + 0.1) / width, bottom / height, 0.15 / width,
                            side / height))  # fmt: skip
        bar = fig.colorbar(image, cax=cax)
        bar.set_label(bar_label, fontsize=8)
    fig.text(0.5, 1 - 0.35 / height, title, ha="center", va="center", fontsize=10)
    return fig


def divergence_figure(
    divergence: np.ndarray, layers: list[int], heads: list[int], title: str, style: Style
) -> Any:
    """How far each head's pattern moved: a layers × heads map of Jensen–Shannon divergence
    (nats) from 0, the value written in each cell."""
    import numpy as np

    fig, ax = _grid_axes(layers, heads, title, style, 1.2)
    top = float(divergence.max()) or 1e-6
    image = ax.imshow(divergence, cmap=style.cmap, vmin=0.0, vmax=top, aspect="auto",
                      interpolation="nearest")  # fmt: skip
    for (r, c), value in np.ndenumerate(divergence):
        ax.text(c, r, f"{value:.3f}".replace("0.", ".", 1), ha="center", va="center",
                fontsize=6, color="white" if value / top < 0.55 else "black")  # fmt: skip
    width = fig.get_figwidth()
    bar = fig.colorbar(image, ax=ax, fraction=0.8 / width, pad=0.15 / width)
    bar.set_label("Jensen–Shannon divergence (nats)", fontsize=8)
    return fig


def moved_or_matters_figure(
    divergence: np.ndarray,
    importance_a: np.ndarray,
    importance_b: np.ndarray,
    layers: list[int],
    importance_label: str,
    title: str,
    style: Style,
    named: int = 6,
) -> Any:
    """Every head as a point: how far it moved (divergence, x) against how much it matters
    (importance, y) in A and in B, joined by a line; the `named` heads that moved most and
    the most important in either are labelled."""
    import numpy as np

    _configure_matplotlib()
    fig, ax = _fixed_axes((5.5, 4.0), (0.9, 0.7, 0.3, 0.6), style.dpi)
    x = divergence.ravel()
    y_a, y_b = importance_a.ravel(), importance_b.ravel()
    for xi, ya, yb in zip(x, y_a, y_b):
        ax.plot([xi, xi], [ya, yb], color="#c0c0c0", linewidth=0.8, zorder=1)
    ax.scatter(x, y_a, s=14, color="#1f77b4", label="importance in A", zorder=2)
    ax.scatter(x, y_b, s=14, color="#d62728", marker="^", label="importance in B", zorder=2)
    n_heads = divergence.shape[1]
    wanted = set(np.argsort(-x, kind="stable")[:named]) | set(
        np.argsort(-np.fmax(y_a, y_b), kind="stable")[:named]
    )
    for i in sorted(wanted):
        ax.annotate(f"L{layers[i // n_heads]} H{i % n_heads}", (x[i], max(y_a[i], y_b[i])),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set_xlabel("moved: Jensen–Shannon divergence A→B (nats)", fontsize=9)
    ax.set_ylabel(importance_label, fontsize=8)
    ax.axhline(0, color="#808080", linewidth=0.6)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    return fig
