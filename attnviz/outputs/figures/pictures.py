"""A vision model's attention drawn over its picture: per head, one token's attention (the CLS
token's, or a patch's with `--query ROW,COL`) over the patches, upsampled to the picture's
size, one grid of heads per layer (DINO's per-head maps, Caron et al. 2021).

The colour bar is the share of that token's attention a patch holds (the token's row as the
model made it, not renormalised over the patches); what the tokens outside the grid take
(CLS, DeiT's distillation token, registers) is named in each panel's title.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.labels import Labels
from attnviz.outputs.figures.raster import save_figure, whole_pixels
from attnviz.outputs.figures.style import Style, configure_matplotlib, figure_header

if TYPE_CHECKING:
    from attnviz.core.attention import Attention

PANEL_IN = 2.2  # a head's panel, inches a side (the picture's longer side)
ALPHA = 0.6  # the colours' share over the picture
TITLE_IN = 0.55  # above each panel: its title, up to three lines
HEADER_IN = 1.0  # above the panels: the figure's title and two context lines


def outside_shares(att: Attention, row: Any, per_line: int = 3) -> str:
    """What one row gives the tokens outside the patch grid, by name, `per_line` to a line:
    `CLS 12% · reg0 40% · reg1 3%`."""
    first = att.picture.first
    said = [f"{att.tokens[i]} {float(row[i]):.0%}" for i in range(first)]
    return "\n".join(" · ".join(said[i : i + per_line]) for i in range(0, len(said), per_line))


def query_rows(att: Attention, layer: int, query: int) -> Any:
    """(H, T): token `query`'s row in every head of `layer`."""
    return att.weights[att.slot(layer)][:, query]


def blend(pixels: Any, grid: Any, patch: int, cmap: Any, top: float) -> Any:
    """The picture under a grid's colours: each patch's value, on `cmap` from 0 to `top`,
    over its `patch` × `patch` pixels (ALPHA of it), (rows·patch, cols·patch, 3) uint8."""
    import numpy as np

    values = np.repeat(np.repeat(grid, patch, axis=0), patch, axis=1)
    return blend_values(pixels[: values.shape[0], : values.shape[1]], values, cmap, top)


def blend_values(pixels: Any, values: Any, cmap: Any, top: float, unseen: Any = None) -> Any:
    """The picture (h, w, 3) under each pixel's value's colour (h, w), on `cmap` from 0 to
    `top` (ALPHA of it), (h, w, 3) uint8; the `unseen` pixels ((h, w) bool: no token stands
    for them) under white instead, faded."""
    import numpy as np

    colours = cmap(np.clip(values / top, 0.0, 1.0))[..., :3] * 255.0  # a colour a pixel
    if unseen is not None:
        colours[unseen] = 255.0
    under = pixels.astype(np.float32)
    return np.round((1 - ALPHA) * under + ALPHA * colours).astype(np.uint8)


def overlay_figure(
    att: Attention, layer: int, heads: list[int], query: int, style: Style, rows_of: Any = None
):
    """Per head of `heads`, token `query`'s attention in layer `layer` over the patches, on
    the picture (the pixels its patches cover); the figure, drawn (not written). `rows_of`:
    `query_rows(att, layer, query)`, given where `att` carries no weights (a drawing
    process's copy)."""
    if rows_of is None:
        rows_of = query_rows(att, layer, query)
    what = "attention" if att.measure == "weights" else f"{att.measure} ‖α·f(x)‖"
    panels = [(f"head {head}", rows_of[head]) for head in heads]
    return _panels_figure(att, panels, query, style, f"layer {layer} · where "
                          f"{att.tokens[query]} looks", what)  # fmt: skip


def rollout_figure(att: Attention, layers: list[int], query: int, style: Style, how: str,
                   rows_of: Any = None):  # fmt: skip
    """Token `query`'s row of the rollout composed up to each of `layers` over the patches,
    one panel a layer, on the picture (`att`: a per-layer measure, `weights[slot, 0]`; `how`:
    its head fusion and discard ratio, said in the title); the figure, drawn."""
    if rows_of is None:
        rows_of = rollout_rows(att, layers, query)
    panels = [(f"layers 0–{layer}", rows_of[i]) for i, layer in enumerate(layers)]
    title = f"attention rollout ({how}) · where {att.tokens[query]} looks"
    return _panels_figure(att, panels, query, style, title, "rollout")


def rollout_rows(att: Attention, layers: list[int], query: int) -> Any:
    """(len(layers), T): token `query`'s row of the rollout composed up to each layer."""
    return att.weights[[att.slot(layer) for layer in layers], 0, query]


def pair_figure(a: Attention, b: Attention, layer: int, head: int, style: Style):
    """CLS's attention in one head over picture A and over picture B, side by side, on one
    colour scale (`compare` of two pictures, for a head that moved); the figure, drawn."""
    rows = [att.weights[att.slot(layer)][head, 0] for att in (a, b)]
    panels = [(f"A: {a.text}", rows[0]), (f"B: {b.text}", rows[1])]
    title = f"layer {layer} · head {head} · where CLS looks in A and in B"
    return _panels_figure(a, panels, 0, style, title, "attention", owners=[a, b])


@dataclass(frozen=True, eq=False)
class Panel:
    """One panel over a picture: its title, the picture under it ((h, w, 3) uint8), each of
    its pixels' value ((h, w)), the pixels no token stands for (`unseen`, (h, w) bool, None
    where every pixel is a token's: a crop's margins, drawn faded) and a red outline
    (`outline`: left, top, side in picture pixels; a patch as the query). `fixed`: the panel
    already blended ((h, w, 3) uint8), on a scale of its own (a difference), its values left
    out of the figure's scale."""

    title: str
    pixels: Any
    values: Any
    unseen: Any = None
    outline: tuple[float, float, float] | None = None
    fixed: Any = None


def _panels_figure(att: Attention, panels: list[tuple[str, Any]], query: int, style: Style,
                   title: str, what: str, owners: list[Attention] | None = None):  # fmt: skip
    """One panel per (name, row) of `panels` (a row: a value per token), the row over the
    patches blended over the picture, titled with its name, the patches' share and what the
    tokens outside the grid take; one colour bar for all, the share of `what`. `owners`:
    the attention each row is of, where the panels are of several pictures (each drawn at
    the size `att`'s picture is)."""
    import numpy as np

    picture = att.picture
    height, width = (n * picture.patch for n in picture.grid)
    owners = owners or [att] * len(panels)
    shown = []
    for (name, row), owner in zip(panels, owners):
        own = owner.picture
        grid = own.patches(row)
        values = np.repeat(np.repeat(grid, own.patch, axis=0), own.patch, axis=1)
        outside = outside_shares(owner, row)
        shown.append(Panel(f"{name} · patches {float(grid.sum()):.0%}"
                           + (f"\n{outside}" if outside else ""),
                           own.pixels[:height, :width], values,
                           outline=_query_box(own, query)))  # fmt: skip
    seen = f"{width} × {height} px, {picture.grid[0]} × {picture.grid[1]} patches"
    return panels_figure(att, shown, style, title, f"share of {att.tokens[query]}'s {what}",
                         f"the picture as the model saw it: {seen}")  # fmt: skip


def _query_box(picture: Any, query: int) -> tuple[float, float, float] | None:
    """A patch as the query: its box (left, top, side) in the picture's pixels."""
    if query < picture.first:
        return None
    row, col = divmod(query - picture.first, picture.grid[1])
    return (col * picture.patch, row * picture.patch, picture.patch)


def panels_figure(att: Attention, panels: list[Panel], style: Style, title: str, bar: str,
                  seen: str):  # fmt: skip
    """Each of `panels` blended over its picture, up to four a row, on one colour scale
    (0 to the largest value of any panel), the colour bar labelled `bar`; under the title
    the context line and `seen` (how the picture was read). The figure, drawn (not written).

    Each panel is the blended picture placed as whole pixels (`raster.whole_pixels`; one
    picture pixel to one figure pixel where that is near the panel's size, else resized to
    it, nearest), with its title and frame as figure artists: no axes a panel, which cost
    most of a figure's time."""
    from matplotlib.figure import Figure

    configure_matplotlib()
    dpi = style.dpi
    height, width = panels[0].values.shape
    top = max((float(panel.values.max()) for panel in panels if panel.fixed is None),
              default=0.0) or 1.0  # fmt: skip
    cols = min(len(panels), 4)
    rows = math.ceil(len(panels) / cols)
    scale = _scale(max(height, width), dpi)  # figure pixels a picture pixel
    panel_px = (max(1, round(height * scale)), max(1, round(width * scale)))
    panel_h, panel_w = panel_px[0] / dpi, panel_px[1] / dpi
    slot_w = max(panel_w, PANEL_IN) + 0.25  # a narrow picture keeps room for its titles
    grid_w = cols * slot_w
    fig_w = max(grid_w + 1.2, 5.5)  # the header's lines fit
    fig_h = HEADER_IN + rows * (panel_h + TITLE_IN) + 0.15
    margin = (fig_w - 1.2 - grid_w) / 2
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    cmap = style.colour_map()
    for slot, panel in enumerate(panels):
        r, c = divmod(slot, cols)
        left = round((margin + c * slot_w + (slot_w - panel_w) / 2) * dpi)  # whole pixels
        bottom = round((fig_h - HEADER_IN - (r + 1) * (panel_h + TITLE_IN) + 0.05) * dpi)
        blended = panel.fixed
        if blended is None:
            blended = blend_values(panel.pixels, panel.values, cmap, top, panel.unseen)
        placed = resized(blended, panel_px)
        if style.fmt == "png":  # straight into the canvas
            fig.add_artist(whole_pixels(placed, left, bottom))
        else:
            fig.figimage(placed, xo=left, yo=bottom, origin="upper")
        box = (left, bottom, panel_px[1], panel_px[0])
        _frame(fig, box, "black", 0.8)
        if panel.outline is not None:
            x, y, side = (n * scale for n in panel.outline)
            _frame(fig, (left + x, bottom + box[3] - y - side, side, side), "#ff2020", 1.5)
        fig.text((left + panel_px[1] / 2) / fig.bbox.width, (bottom + panel_px[0] + 3) /
                 fig.bbox.height, panel.title, fontsize=7, ha="center",
                 va="bottom")  # fmt: skip
    _colour_bar(fig, bar, top, cmap, rows * (panel_h + TITLE_IN))
    figure_header(fig, Labels.of(att), "", seen).set_text(title)
    return fig


def _scale(longest: int, dpi: int) -> float:
    """Figure pixels a picture pixel, for a picture whose longer side is `longest` pixels:
    one where that is near a panel's size, else the panel's size over it."""
    return 1.0 if PANEL_IN * dpi * 0.75 <= longest <= 3 * dpi else PANEL_IN * dpi / longest


def resized(pixels: Any, size: tuple[int, int]) -> Any:
    """`pixels` (h, w, 3) at `size` (rows, cols), nearest; as they are where they fit."""
    import numpy as np

    if pixels.shape[:2] == size:
        return pixels
    rows = (np.arange(size[0]) * pixels.shape[0] // size[0]).clip(0, pixels.shape[0] - 1)
    cols = (np.arange(size[1]) * pixels.shape[1] // size[1]).clip(0, pixels.shape[1] - 1)
    return pixels[rows[:, None], cols[None, :]]


def _frame(fig: Any, box: tuple[float, float, float, float], colour: str, width: float) -> None:
    """A rectangle's outline, `box` (left, bottom, width, height) in figure pixels."""
    from matplotlib.patches import Rectangle

    w, h = fig.bbox.width, fig.bbox.height
    edge = Rectangle((box[0] / w, box[1] / h), box[2] / w, box[3] / h, fill=False,
                     edgecolor=colour, linewidth=width, transform=fig.transFigure)  # fmt: skip
    fig.add_artist(edge)


def _colour_bar(fig: Any, label: str, top: float, cmap: Any, grid_h: float) -> None:
    """The colour bar right of the panels, 0 to `top`, labelled `label`."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig_w, fig_h = fig.get_figwidth(), fig.get_figheight()
    low = (fig_h - HEADER_IN - grid_h + 0.1) / fig_h
    bar = fig.add_axes(((fig_w - 0.9) / fig_w, low, 0.15 / fig_w, 0.8 * grid_h / fig_h))
    shown = ScalarMappable(Normalize(0.0, top), cmap)
    fig.colorbar(shown, cax=bar).set_label(label, fontsize=8)
    bar.tick_params(labelsize=7)


def save_rollout(att: Attention, layers: list[int], query: int, style: Style, how: str,
                 path: Path, rows_of: Any = None) -> Path:  # fmt: skip
    """Draw `rollout_figure` and write it atomically to `path` (in a drawing process too)."""
    return save_figure(rollout_figure(att, layers, query, style, how, rows_of), path, style)


def save_overlay(
    att: Attention,
    layer: int,
    heads: list[int],
    query: int,
    style: Style,
    path: Path,
    rows_of: Any = None,
) -> Path:
    """Draw `overlay_figure` and write it atomically to `path` (in a drawing process too)."""
    return save_figure(overlay_figure(att, layer, heads, query, style, rows_of), path, style)


def overlay_name(att: Attention, layer: int | None, query: int, fmt: str) -> str:
    """`picture-layer-L.png` for CLS's view; `picture-R-C-layer-L.png` for a patch's,
    `picture-reg2-layer-L.png` for another token outside the grid's; with `layer` None
    (rollout's one figure of every layer) `rollout` in place of `layer-L`."""
    picture = att.picture
    end = "rollout" if layer is None else f"layer-{layer}"
    if query == 0 and picture.first:
        return f"picture-{end}.{fmt}"
    if query < picture.first:
        return f"picture-{att.tokens[query]}-{end}.{fmt}"
    row, col = divmod(query - picture.first, picture.grid[1])
    return f"picture-{row}-{col}-{end}.{fmt}"


def rollout_how(fusion: str, discard: float) -> str:
    """Rollout's options as its figure's title says them."""
    return f"heads' {fusion}, {discard:.0%} of each map discarded"


def picture_tasks(att: Attention, folder: Path, layers: list[int], heads: list[int],
                  style: Style, queries: list[int], how: str) -> list[tuple]:  # fmt: skip
    """What draws each of `queries`' views over the picture: (function, its arguments),
    each layer's figure of the heads, or with a per-layer measure (rollout) one figure of
    the layers. The arguments carry `att` without its weights (`labels`), for a drawing
    process."""
    from dataclasses import replace

    labels = replace(att, weights=att.weights[:0])
    tasks = []
    for query in dict.fromkeys(queries):
        if att.per_layer:
            path = folder / overlay_name(att, None, query, style.fmt)
            rows = rollout_rows(att, layers, query)
            tasks.append((save_rollout, labels, layers, query, style, how, path, rows))
            continue
        tasks += [(save_overlay, labels, layer, heads, query, style,
                   folder / overlay_name(att, layer, query, style.fmt),
                   query_rows(att, layer, query)) for layer in layers]  # fmt: skip
    return tasks


def views_of(att: Attention, query: int | None) -> list[int]:
    """The tokens whose view over the picture is drawn: CLS (where the model has one), and
    `query` (an index) where one is asked for."""
    return ([0] if att.picture.first > 0 else []) + ([query] if query is not None else [])


def draw_pictures(att: Attention, folder: Path, layers: list[int], heads: list[int],
                  style: Style, query: int | None, how: str) -> list[Path]:  # fmt: skip
    """The views over the picture of CLS (where the model has one) and of `query`, drawn
    here, one after the other (`export`'s drawing of one picture)."""
    tasks = picture_tasks(att, folder, layers, heads, style, views_of(att, query), how)
    return [task[0](*task[1:]) for task in tasks]


# A vision-language model's prompt: its image tokens over the picture (`core.layouts`) ------
def layout_figure(att: Attention, layer: int, heads: list[int], rows_of: Any, whose: str,
                  style: Style, given: tuple[int, int] | None = None):  # fmt: skip
    """Per head of `heads`, its row `rows_of[head]` (a value per token) over the picture of a
    vision-language model's prompt, each image token's value over the pixels of its cell
    (`Layout.painted`; pixels no cell covers, a crop's margins, faded), one colour scale
    for the figure; `whose` says whose row it is, in the title; `given`: the picture's size
    (W, H) as given, where `att.layout` carries it smaller. The figure, drawn."""
    from attnviz.analysis.picture_share import shared, shared_what

    layout, keys = att.layout, shared(att)
    titles = [f"head {head} · {shared_what(att)} {float(rows_of[head][keys].sum()):.0%}"
              for head in heads]  # fmt: skip
    grids = " + ".join(f"{part.grid[0]} × {part.grid[1]}" for part in layout.parts)
    width, height = given or layout.pixels.shape[1::-1]
    cross = att.stack == "cross"  # the keys are the picture's (Mllama's)
    tokens = "keys of the cross-attention, patches of its tiles" if cross else "image tokens"
    seen = f"{layout.name}, {width} × {height} px: {len(layout.cells())} {tokens} ({grids})"
    bar = "attention on a patch's key" if cross else "attention on an image token"
    name = f"cross-attention layer {layer}" if cross else f"layer {layer}"
    return over_layout(att, layout, [rows_of[head] for head in heads], titles, style,
                       f"{name} · {whose}", bar, seen)  # fmt: skip


def over_layout(att: Attention, layout: Any, rows: list[Any], titles: list[str], style: Style,
                title: str, bar: str, seen: str):  # fmt: skip
    """One panel a row of `rows` (a value per token of `layout`: the prompt's image tokens,
    or a vision tower's), each token's value over the pixels of its cell (`Layout.painted`;
    pixels no cell covers, a crop's margins, faded), titled `titles`, on the figure's one
    colour scale (`panels_figure`, with `title`, `bar` and `seen`). The figure, drawn."""
    import numpy as np

    size = _shown_size(layout.pixels.shape[:2], style.dpi)
    pixels = resized(layout.pixels, size)
    unseen = layout.painted(np.ones(max(layout.cells()) + 1, np.float32), size) == 0
    unseen = unseen if unseen.any() else None
    panels = [Panel(name, pixels, layout.painted(row, size), unseen)
              for name, row in zip(titles, rows)]  # fmt: skip
    return panels_figure(att, panels, style, title, bar, seen)


def _shown_size(shape: tuple[int, int], dpi: int) -> tuple[int, int]:
    """A picture of `shape` (H, W) at the size its panels show it."""
    scale = _scale(max(shape), dpi)
    return max(1, round(shape[0] * scale)), max(1, round(shape[1] * scale))


def save_layout_figure(att: Attention, layer: int, heads: list[int], rows_of: Any, whose: str,
                       style: Style, given: tuple[int, int], path: Path) -> Path:  # fmt: skip
    """Draw `layout_figure` and write it atomically to `path` (in a drawing process too)."""
    figure = layout_figure(att, layer, heads, rows_of, whose, style, given)
    return save_figure(figure, path, style)


def layout_tasks(att: Attention, folder: Path, layers: list[int], heads: list[int],
                 style: Style, query: int | None) -> list[tuple]:  # fmt: skip
    """What draws a vision-language model's views over its picture, one figure a layer of
    the heads side by side: the mean of the answer's rows (`picture-answer-layer-L`: the
    rows that wrote each answer token, or the prompt's last row where there is no answer),
    and with `query` (an index) that token's own row (`picture-token-I-layer-L`). The
    arguments carry `att` without its weights and its picture at the panels' size."""
    from dataclasses import replace

    from attnviz.analysis.picture_share import answer_rows, looked, whose_rows

    layout = att.layout
    given = layout.pixels.shape[1::-1]  # (W, H)
    small = replace(layout, pixels=resized(layout.pixels, _shown_size(layout.pixels.shape[:2],
                                                                       style.dpi)))  # fmt: skip
    labels = replace(att, weights=att.weights[:0], layout=small)
    views = [("answer", answer_rows(att), whose_rows(att))]
    if query is not None:
        views.append((f"token-{query}", (query,), f"where {att.tokens[query]}@{query} looks"))
    return [(save_layout_figure, labels, layer, heads, looked(att, layer, rows), whose, style,
             given, folder / f"picture-{name}-layer-{layer}.{style.fmt}")
            for name, rows, whose in views for layer in layers]  # fmt: skip


# A vision-language model's vision tower (`analysis.tower`) ---------------------------------
def tower_figure(att: Attention, tower: Any, layer: int, rows: Any, heads: list[Any], cls: bool,
                 style: Style, given: tuple[int, int] | None = None):  # fmt: skip
    """Per head of the vision tower's layer `layer` (`heads`: its `VisionHead`s), its row
    `rows[head]` over the tower's tokens (CLS's row where `cls`, else each token's mean
    received attention) drawn over the picture, every patch's value on its cell
    (`tower.layout`), one colour scale for the figure; each panel titled with the head's
    role and mean attention distance (and CLS's share on the patches). `given`: the
    picture's size (W, H) as given, where `tower` carries it smaller. The figure, drawn."""
    layout = tower.layout
    cells = layout.cells()
    titles = []
    for head in heads:
        said = f"head {head.head} · {head.role} · {head.distance:.0f} px"
        if cls:  # each sequence's CLS row sums to 1 over it: their mean share on the patches
            share = float(rows[head.head][cells].sum()) / len(layout.marks)
            said += f"\nCLS on the patches {share:.0%}"
        titles.append(said)
    grids = " + ".join(f"{part.grid[0]} × {part.grid[1]}" for part in layout.parts)
    width, height = given or layout.pixels.shape[1::-1]
    seen = (f"{layout.name}, {width} × {height} px: the tower's {len(cells)} patches ({grids}), "
            f"{tower.patch} px a side as it read them")  # fmt: skip
    what = "where CLS looks" if cls else "what each patch receives, the mean over its queries"
    bar = "CLS's attention on a patch" if cls else "mean attention a patch receives"
    return over_layout(att, layout, [rows[head.head] for head in heads], titles, style,
                       f"vision tower · layer {layer} · {what}", bar, seen)  # fmt: skip


def save_tower_figure(att: Attention, tower: Any, layer: int, rows: Any, heads: list[Any],
                      cls: bool, style: Style, given: tuple[int, int],
                      path: Path) -> Path:  # fmt: skip
    """Draw `tower_figure` and write it atomically to `path` (in a drawing process too)."""
    figure = tower_figure(att, tower, layer, rows, heads, cls, style, given)
    return save_figure(figure, path, style)


def tower_tasks(att: Attention, view: Any, folder: Path, style: Style) -> list[tuple]:
    """What draws the vision tower's heads over the picture (`analysis.tower.TowerView`), one
    figure a tower layer (`tower-layer-L`), every head side by side. The arguments carry
    `att` without its weights and the tower's picture at the panels' size."""
    from dataclasses import replace

    layout = view.tower.layout
    given = layout.pixels.shape[1::-1]  # (W, H)
    small = replace(layout, pixels=resized(layout.pixels, _shown_size(layout.pixels.shape[:2],
                                                                      style.dpi)))  # fmt: skip
    tower = replace(view.tower, layout=small)
    labels = replace(att, weights=att.weights[:0])
    return [(save_tower_figure, labels, tower, layer, view.maps[layer], view.layer(layer),
             view.cls, style, given, folder / f"tower-layer-{layer}.{style.fmt}")
            for layer in range(view.n_layers)]  # fmt: skip


def share_figure(att: Attention, share: Any, layers: list[int], heads: list[int], whose: str,
                 style: Style):  # fmt: skip
    """The picture's share of attention by layer: `share` (L, H), for `layers` and `heads`,
    as lines against the layer (each head thin, their mean thick) and as a layer × head
    map with the numbers written in where they fit. The figure, drawn."""
    import numpy as np
    from matplotlib.figure import Figure

    configure_matplotlib()
    cell = 0.4 if len(heads) <= 16 else 0.2
    map_w, map_h = max(len(heads) * cell, 1.6), max(len(layers) * cell, 2.2)
    fig_w, fig_h = 0.8 + 3.6 + 1.0 + map_w + 1.1, 1.0 + map_h + 0.7
    fig = Figure(figsize=(fig_w, fig_h), dpi=style.dpi)
    lines = fig.add_axes((0.8 / fig_w, 0.7 / fig_h, 3.6 / fig_w, map_h / fig_h))
    for h in range(len(heads)):
        lines.plot(layers, share[:, h], color="0.7", linewidth=0.8,
                   label="a head" if h == 0 else None)  # fmt: skip
    lines.plot(layers, share.mean(axis=1), color="C0", linewidth=2.2, marker="o",
               label="mean of the heads")  # fmt: skip
    cross = att.stack == "cross"  # every key is the picture's: its patches' share is said
    lines.set_ylim(0.0, 1.0)
    lines.set_xlabel("cross-attention layer" if cross else "layer")
    lines.set_ylabel("share of the row on the picture's " + ("patches" if cross else "tokens"))
    lines.set_xticks(layers if len(layers) <= 16 else layers[:: math.ceil(len(layers) / 16)])
    lines.legend(fontsize=7, frameon=False, loc="upper right")
    grid = fig.add_axes((5.4 / fig_w, 0.7 / fig_h, map_w / fig_w, map_h / fig_h))
    shown = grid.imshow(share, cmap=style.colour_map(), vmin=0.0, vmax=1.0, aspect="auto")
    step = 1 if len(heads) <= 16 else math.ceil(len(heads) / 16)
    grid.set_xticks(range(0, len(heads), step), [f"H{h}" for h in heads[::step]], fontsize=7)
    step = 1 if len(layers) <= 24 else math.ceil(len(layers) / 24)
    grid.set_yticks(range(0, len(layers), step), [f"L{n}" for n in layers[::step]], fontsize=7)
    grid.set_xlabel("head")
    if len(heads) <= 16 and len(layers) <= 24:
        for (r, c), value in np.ndenumerate(share):
            grid.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=6,
                      color="white" if value < 0.55 else "black")  # fmt: skip
    bar = fig.add_axes(((fig_w - 0.8) / fig_w, 0.7 / fig_h, 0.12 / fig_w, map_h / fig_h))
    fig.colorbar(shown, cax=bar).ax.tick_params(labelsize=7)
    said = ("the share of cross-attention on the picture's patches (each tile's CLS left out), "
            "by layer") if cross else "the picture's share of attention, by layer"  # fmt: skip
    figure_header(fig, Labels.of(att), "", whose).set_text(said)
    return fig


def compare_figure(a: Attention, b: Attention, cells: tuple[Any, Any], shares: tuple[float, float],
                   names: tuple[str, str], title: str, style: Style):  # fmt: skip
    """One head's mean row over the picture in A and in B, renormalised over the cells (each
    cell's share of what the head gives the picture's patches: `cells`, A's and B's, in their
    layouts' order), on one colour scale, and B − A by cell on a diverging map centred on 0
    (red: more in B), over the picture for one picture, over white for two (their cells pair
    by place); `shares`: the picture's share of each side's row and `names` what each side
    is (its picture, or its question), in the panels' titles. B is drawn at A's size. The
    figure, drawn."""
    import numpy as np
    from matplotlib import colormaps

    layout = a.layout
    size = _shown_size(layout.pixels.shape[:2], style.dpi)

    def spread(att: Attention, values: Any) -> Any:  # a value per cell -> a row over tokens
        row = np.zeros(len(att.tokens))
        row[att.layout.cells()] = values
        return row

    def unseen(att: Attention) -> Any:
        found = att.layout.painted(np.ones(len(att.tokens), np.float32), size) == 0
        return found if found.any() else None

    panels = []
    for side, att, values, share, name in zip("AB", (a, b), cells, shares, names):
        painted = att.layout.painted(spread(att, values), size)
        panels.append(Panel(f"{side}: {name} · picture {share:.0%}",
                            resized(att.layout.pixels, size), painted, unseen(att)))  # fmt: skip
    same = b.layout.name == layout.name and np.array_equal(b.layout.pixels, layout.pixels)
    under = panels[0].pixels if same else np.full_like(panels[0].pixels, 255)
    difference = layout.painted(spread(a, cells[1] - cells[0]), size)
    limit = float(np.abs(difference).max()) or 1.0
    centred = (difference / limit + 1.0) / 2.0  # −limit … limit to 0 … 1, 0 at the middle
    fixed = blend_values(under, centred, colormaps["RdBu_r"], 1.0, panels[0].unseen)
    panels.append(Panel(f"B − A by cell · ±{limit:.2g} at full colour\nred: more in B, blue: "
                        "more in A", under, difference, fixed=fixed))  # fmt: skip
    grids = " + ".join(f"{part.grid[0]} × {part.grid[1]}" for part in layout.parts)
    seen = f"{len(layout.cells())} image tokens ({grids}), cells paired by place"
    bar = "share of the picture's cells"
    return panels_figure(a, panels, style, title, bar, seen)
