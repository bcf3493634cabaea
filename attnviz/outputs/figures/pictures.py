"""A vision model's attention drawn over its picture: per head, one token's attention (the CLS
token's, or a patch's with `--query ROW,COL`) over the patches, upsampled to the picture's
size, one grid of heads per layer (DINO's per-head maps, Caron et al. 2021).

The colour bar is the share of that token's attention a patch holds (the token's row as the
model made it, not renormalised over the patches); what the tokens outside the grid take
(CLS, DeiT's distillation token, registers) is named in each panel's title.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

    colours = cmap(np.clip(grid / top, 0.0, 1.0))[..., :3] * 255.0  # a colour a patch
    colours = np.repeat(np.repeat(colours, patch, axis=0), patch, axis=1)
    under = pixels[: colours.shape[0], : colours.shape[1]].astype(np.float32)
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


def _panels_figure(att: Attention, panels: list[tuple[str, Any]], query: int, style: Style,
                   title: str, what: str, owners: list[Attention] | None = None):  # fmt: skip
    """One panel per (name, row) of `panels` (a row: a value per token), the row over the
    patches blended over the picture, titled with its name, the patches' share and what the
    tokens outside the grid take; one colour bar for all, the share of `what`. `owners`:
    the attention each row is of, where the panels are of several pictures (each drawn at
    the size `att`'s picture is).

    Each panel is the blended picture placed as whole pixels (`raster.whole_pixels`; one
    picture pixel to one figure pixel where that is near the panel's size, else resized to
    it, nearest),
    with its title and frame as figure artists: no axes a panel, which cost most of a
    figure's time."""
    import numpy as np
    from matplotlib.figure import Figure

    configure_matplotlib()
    picture, dpi = att.picture, style.dpi
    height, width = (n * picture.patch for n in picture.grid)
    owners = owners or [att] * len(panels)
    grids = [owner.picture.patches(row) for owner, (_, row) in zip(owners, panels)]
    top = max(float(np.max(grid)) for grid in grids) or 1.0
    cols = min(len(panels), 4)
    rows = math.ceil(len(panels) / cols)
    longest = max(height, width)
    fits = PANEL_IN * dpi * 0.75 <= longest <= 3 * dpi
    scale = 1.0 if fits else PANEL_IN * dpi / longest  # figure pixels a picture pixel
    panel_px = (max(1, round(height * scale)), max(1, round(width * scale)))
    panel_h, panel_w = panel_px[0] / dpi, panel_px[1] / dpi
    slot_w = max(panel_w, PANEL_IN) + 0.25  # a narrow picture keeps room for its titles
    grid_w = cols * slot_w
    fig_w = max(grid_w + 1.2, 5.5)  # the header's lines fit
    fig_h = HEADER_IN + rows * (panel_h + TITLE_IN) + 0.15
    margin = (fig_w - 1.2 - grid_w) / 2
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    cmap = style.colour_map()
    for slot, ((name, row), owner) in enumerate(zip(panels, owners)):
        r, c = divmod(slot, cols)
        left = round((margin + c * slot_w + (slot_w - panel_w) / 2) * dpi)  # whole pixels
        bottom = round((fig_h - HEADER_IN - (r + 1) * (panel_h + TITLE_IN) + 0.05) * dpi)
        own = owner.picture
        placed = _resized(blend(own.pixels, grids[slot], own.patch, cmap, top), panel_px)
        if style.fmt == "png":  # straight into the canvas
            fig.add_artist(whole_pixels(placed, left, bottom))
        else:
            fig.figimage(placed, xo=left, yo=bottom, origin="upper")
        box = (left, bottom, panel_px[1], panel_px[0])
        _frame(fig, box, "black", 0.8)
        _outline_query(fig, own, query, box, scale)
        outside = outside_shares(owner, row)
        fig.text((left + panel_px[1] / 2) / fig.bbox.width, (bottom + panel_px[0] + 3) /
                 fig.bbox.height, f"{name} · patches {float(grids[slot].sum()):.0%}"
                 + (f"\n{outside}" if outside else ""), fontsize=7, ha="center",
                 va="bottom")  # fmt: skip
    _colour_bar(fig, att, query, what, top, cmap, rows * (panel_h + TITLE_IN))
    seen = f"{width} × {height} px, {picture.grid[0]} × {picture.grid[1]} patches"
    figure_header(fig, att, "", f"the picture as the model saw it: {seen}").set_text(title)
    return fig


def _resized(pixels: Any, size: tuple[int, int]) -> Any:
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


def _outline_query(fig: Any, picture: Any, query: int, box: tuple, scale: float) -> None:
    """A patch as the query: outlined in red on its panel (`box`, in figure pixels)."""
    if query >= picture.first:
        q_row, q_col = divmod(query - picture.first, picture.grid[1])
        side = picture.patch * scale
        left, top = box[0] + q_col * side, box[1] + box[3] - (q_row + 1) * side
        _frame(fig, (left, top, side, side), "#ff2020", 1.5)


def _colour_bar(fig: Any, att: Attention, query: int, what: str, top: float, cmap: Any,
                grid_h: float) -> None:  # fmt: skip
    """The colour bar right of the panels: the share of `query`'s `what`, 0 to `top`."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig_w, fig_h = fig.get_figwidth(), fig.get_figheight()
    low = (fig_h - HEADER_IN - grid_h + 0.1) / fig_h
    bar = fig.add_axes(((fig_w - 0.9) / fig_w, low, 0.15 / fig_w, 0.8 * grid_h / fig_h))
    shown = ScalarMappable(Normalize(0.0, top), cmap)
    fig.colorbar(shown, cax=bar).set_label(f"share of {att.tokens[query]}'s {what}", fontsize=8)
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
