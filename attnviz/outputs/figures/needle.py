"""The needle-in-a-haystack figures: the grid of runs (length × depth, coloured by how much
of the needle each answer recalls) and the ablation's recall against the number of heads
removed (the best retrieval heads against random ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.style import Style, configure_matplotlib

if TYPE_CHECKING:
    import numpy as np


def grid_figure(recalls: np.ndarray, lengths: Sequence[int], depths: Sequence[float],
                title: str, style: Style) -> Any:  # fmt: skip
    """Each run's recall of the needle (the share of its words in the answer), (depths,
    lengths): red (nothing of it) to green (all of it), the value written in each cell."""
    import numpy as np
    from matplotlib.figure import Figure

    configure_matplotlib()
    n_depths, n_lengths = recalls.shape
    cell_w, cell_h = max(0.7, min(1.2, 7.0 / n_lengths)), max(0.3, min(0.5, 6.0 / n_depths))
    left, right, top, bottom = 1.0, 1.0, 0.6, 0.8
    spare = max(0.0, 5.5 - (left + n_lengths * cell_w + right)) / 2  # room for the title
    left, right = left + spare, right + spare
    width, height = left + n_lengths * cell_w + right, bottom + n_depths * cell_h + top
    fig = Figure(figsize=(width, height), dpi=style.dpi)
    inner_w = n_lengths * cell_w
    ax = fig.add_axes((left / width, bottom / height, inner_w / width,
                       n_depths * cell_h / height))  # fmt: skip
    image = ax.imshow(recalls, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto",
                      interpolation="nearest")  # fmt: skip
    for (r, c), value in np.ndenumerate(recalls):
        ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(n_lengths), [f"{n:,}" for n in lengths], fontsize=8)
    ax.set_yticks(range(n_depths), [f"{d:g}%" for d in depths], fontsize=8)
    ax.set_xlabel("prompt length (tokens)", fontsize=9)
    ax.set_ylabel("needle depth", fontsize=9)
    bar = fig.add_axes(((left + inner_w + 0.2) / width, bottom / height, 0.15 / width,
                        n_depths * cell_h / height))  # fmt: skip
    colorbar = fig.colorbar(image, cax=bar)
    colorbar.ax.tick_params(labelsize=7)
    colorbar.set_label("recall", fontsize=8)
    fig.text(0.5, 1 - 0.3 / height, title, ha="center", va="center", fontsize=10)
    return fig


def ablation_figure(ks: Sequence[int], top: Sequence[float], random: Sequence[Sequence[float]],
                    clean: float, title: str, style: Style) -> Any:  # fmt: skip
    """Mean recall of the needle with the k best retrieval heads removed (`top`, one per k)
    and with k random heads (`random`: each k's draws, their mean drawn, their range shaded),
    against `clean`, nothing removed."""
    from matplotlib.figure import Figure

    configure_matplotlib()
    fig = Figure(figsize=(5.5, 3.6), dpi=style.dpi)
    ax = fig.add_axes((0.12, 0.16, 0.84, 0.72))
    means = [sum(draws) / len(draws) for draws in random]
    ax.fill_between(ks, [min(d) for d in random], [max(d) for d in random], color="tab:blue",
                    alpha=0.2, linewidth=0)  # fmt: skip
    ax.plot(ks, means, "o-", color="tab:blue", label="k random heads (mean, range of draws)")
    ax.plot(ks, top, "s-", color="tab:red", label="k best retrieval heads")
    ax.axhline(clean, color="grey", linestyle="--", linewidth=1, label="nothing removed")
    ax.set_xticks(list(ks), [str(k) for k in ks])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("heads removed (k)", fontsize=9)
    ax.set_ylabel("recall of the needle", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(title, fontsize=10)
    return fig
