"""The report's and compare's figures: grids of one number per layer and head (`MetricGrid`,
the role map, importance), relations, and differences between two attentions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.raster import Framed, Frames
from attnviz.outputs.figures.style import Layout, Style, configure_matplotlib, fixed_axes, set_ticks

if TYPE_CHECKING:
    import numpy as np


def _grid_axes(
    layers: list[int], heads: list[int], title: str, style: Style, right: float = 1.1
) -> tuple[Any, Any]:
    """A layers × heads grid figure: rows are the chosen layers, columns the chosen heads;
    `right` inches for a colour bar or legend."""
    configure_matplotlib()
    cell = 0.62
    inner = (max(len(heads), 2) * cell, max(len(layers), 2) * cell)
    fig, ax = fixed_axes(inner, (0.7, 0.6, right, 0.75), style.dpi)
    ax.set_xticks(range(len(heads)), [f"H{h}" for h in heads], fontsize=8)
    ax.set_yticks(range(len(layers)), [f"L{layer}" for layer in layers], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    return fig, ax


class MetricGrid(Framed):
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
        self.frames = Frames(fig, dynamic, style)

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

    configure_matplotlib()
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
    ranked: str = "most important",
) -> Any:
    """Each chosen head's importance (or another score: retrieval) as a layers × heads map of
    square cells, the `numbered` best heads (`ranked`, as the label says them) marked with
    their rank. `scores` and `ranks` are over the chosen
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

    configure_matplotlib()
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
    what = f"numbered: the {numbered} {ranked}, by rank"
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

    configure_matplotlib()
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
        set_ticks(ax, tokens, layout, y=i == 0)
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

    configure_matplotlib()
    fig, ax = fixed_axes((5.5, 4.0), (0.9, 0.7, 0.3, 0.6), style.dpi)
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


def distance_figure(
    distance: np.ndarray,
    roles: list[list[str]],
    layers: list[int],
    uniform: float,
    title: str,
    style: Style,
) -> Any:
    """Each head's mean attention distance in pixels against its layer, one dot per head
    coloured by its role (the ViT paper's Fig. 7, Dosovitskiy et al. 2021); `distance` and
    `roles` are (len(layers), heads). Dashed: uniform attention's distance; dotted: the
    share of it from which a head is global. A layer's heads are spread a little sideways,
    in head order, so that close values stay apart."""
    import numpy as np

    from attnviz.analysis.vision import GLOBAL_REACH, ROLE_LOOKS, ROLES

    configure_matplotlib()
    fig, ax = fixed_axes((max(4.0, 0.4 * len(layers)), 3.6), (0.8, 0.6, 1.9, 0.7), style.dpi)
    n_heads = distance.shape[1]
    spread = (np.arange(n_heads) / max(n_heads - 1, 1) - 0.5) * 0.36  # (H,) sideways
    x = np.arange(len(layers))[:, None] + spread[None]  # (L, H)
    kinds = np.array(roles)
    for role in ROLES:
        chosen = kinds == role
        if chosen.any():
            ax.scatter(x[chosen], distance[chosen], s=22, color=ROLE_LOOKS[role][0],
                       alpha=0.85, linewidths=0, label=role, zorder=3)  # fmt: skip
    ax.axhline(uniform, color="#404040", linestyle="--", linewidth=0.8, zorder=2,
               label="uniform attention")  # fmt: skip
    ax.axhline(GLOBAL_REACH * uniform, color="#404040", linestyle=":", linewidth=0.8, zorder=2,
               label=f"global from {GLOBAL_REACH:.0%} of it")  # fmt: skip
    ax.set_xticks(range(len(layers)), [str(layer) for layer in layers])
    ax.tick_params(labelsize=8)
    ax.set_xlim(-0.6, len(layers) - 0.4)
    ax.set_ylim(0, max(float(np.nanmax(distance)), uniform) * 1.08)
    ax.set_xlabel("layer (depth)", fontsize=9)
    ax.set_ylabel("mean attention distance (pixels)", fontsize=9)
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.6, zorder=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    return fig
