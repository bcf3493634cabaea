"""What every figure shares: the figure options (`Style`), the layout of token labels
(`Layout`), the marks for masked, removed and written cells, titles and tick labels."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.outputs.figures.labels import Labels

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
        where `mask` (a causal model's keys after the query) is True become NaN, drawn as
        masked."""
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

    def bar_label(self, labels: Labels) -> str:
        """The colour bar's label: the measure's unit, and how it was scaled."""
        unit = labels.value_unit
        if self.scale == "head":
            return f"{unit} ÷ the {'layer' if labels.per_layer else 'head'}'s max"
        if self.top != 1.0:
            return f"{unit} ÷ {self.top:.3g} (the text's largest)"
        return unit

    def scale_note(self) -> str:
        """The colour scale in words, under a grid's title."""
        if self.scale == "head":
            return "colour: each head scaled to its own max"
        if self.top != 1.0:
            return f"colour: 0–{self.top:.3g} (the text's largest) for every head"
        return "colour: 0–1 for every head"


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


WRITTEN_COLOUR = "#00a651"  # a continuation's labels, and the lines before it


def continuation_marks(ax: Any, labels: Labels, rows: bool = True) -> list[Any]:
    """Where a decoder's continuation starts (`--generate`, `--target`): a line before its
    first key (and query, with `rows`) and its tick labels in green; the lines, which
    the figure redraws over each map."""
    start = labels.written_from
    if start is None:
        return []
    first, every = labels.first, labels.every
    axes = [(ax.get_xticks(), ax.get_xticklabels())]
    if rows:
        axes.append((ax.get_yticks(), ax.get_yticklabels()))
    for ticks, labels in axes:
        for tick, label in zip(ticks, labels):
            if first + tick * every >= start:
                label.set_color(WRITTEN_COLOUR)
    at = (start - first) / every - 0.5  # the cell edge before the continuation's first
    if at <= -0.5:
        return []
    lines = [ax.axvline(at, color=WRITTEN_COLOUR, linewidth=1.2)]
    if rows:
        lines.append(ax.axhline(at, color=WRITTEN_COLOUR, linewidth=1.2))
    return lines


def hatch(ax: Any, corners: list[tuple[float, float]]) -> Any:
    """The masked cells' hatching over the polygon `corners` (data coordinates) of `ax`."""
    from matplotlib.patches import Polygon

    return ax.add_patch(
        Polygon(corners, facecolor="none", edgecolor="none", linewidth=0, hatch=MASKED_HATCH,
                hatchcolor=MASKED_HATCH_COLOUR)
    )  # fmt: skip


def removed_cover(
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


def above_diagonal(n: int, x0: float = 0, y0: float = 0) -> list[tuple[float, float]]:
    """The staircase around the cells above the diagonal of an n × n image whose first cell
    is centred on (x0, y0): the masked cells of a causal head."""
    steps = [(x0 + i + 0.5, y0 + i + d) for i in range(n - 1) for d in (-0.5, 0.5)]
    return [*steps, (x0 + n - 0.5, y0 + n - 1.5), (x0 + n - 0.5, y0 - 0.5)]


def masked_key(fig: Any, x_in: float, y_in: float, text: str, size: float = 8) -> None:
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


def figure_header(fig: Any, labels: Labels, title: str = "", *more: str) -> Any:
    """The figure's title lines, top centre: `title` (11 pt; returned, to be set per frame),
    the context line (model, text, view) and any `more` lines (8 pt)."""
    height, width = fig.get_figheight(), fig.get_figwidth()

    def line(y_in: float, text: str, size: float) -> Any:
        return fig.text(0.5, 1 - y_in / height, text, ha="center", va="center", fontsize=size)

    context = context_line(labels, width)
    # a line longer than the figure (a narrow one, a long view) in smaller type, down to 6 pt
    size = max(6.0, min(8.0, (width - 0.3) * 72 / (0.6 * len(context))))
    if size < 8.0:
        context = context_line(labels, width, size)
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


def configure_matplotlib() -> None:
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


def fixed_axes(
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


def set_ticks(
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


def label_note(layout: Layout, unit: str = "token") -> str:
    step = layout.label_step * layout.every  # a pooled map's cell spans `every` tokens
    if step == 1:
        return ""
    return f" (every {ordinal(step)} {unit} labelled)"


def context_line(labels: Labels, width_in: float, font_pt: float = 8.0) -> str:
    """Model, the text and the view, shortened to fit `width_in` inches: what a figure shows,
    read from its title."""
    fits = int(width_in * 72 / (font_pt * 0.6))  # DejaVu Sans: ~0.6 em a character
    rest = f"{labels.model} · “” · {labels.view}"
    texts = labels.texts  # the source → the target
    room = max((fits - len(rest) - 4 * (len(texts) - 1)) // len(texts), 12)
    shown = []
    for text in texts:
        text = " ".join(text.split())
        shown.append(text[: room - 1].rstrip() + "…" if len(text) > room else text)
    return f"{labels.model} · {' → '.join(f'“{t}”' for t in shown)} · {labels.view}"
