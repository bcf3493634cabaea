"""A report over pictures and questions' figure: each head's share of attention on the
picture against its layer (`analysis.picture_heads`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnviz.outputs.figures.style import Style, configure_matplotlib, fixed_axes

if TYPE_CHECKING:
    import numpy as np


def share_figure(share: np.ndarray, sink_share: np.ndarray, layers: list[int], title: str,
                 style: Style) -> Any:  # fmt: skip
    """Each head's share of the answer's attention on the picture against its layer, one dot
    per head (a layer's heads spread a little sideways, in head order), the layer's mean as
    a line, and the part of each head's share that its picture's sink tokens hold as a
    hollow dot; `share` and `sink_share` are (len(layers), heads), `sink_share` a share of
    the picture's attention."""
    import numpy as np

    configure_matplotlib()
    fig, ax = fixed_axes((max(4.0, 0.45 * len(layers)), 3.6), (0.8, 0.6, 2.0, 0.7), style.dpi)
    n_heads = share.shape[1]
    spread = (np.arange(n_heads) / max(n_heads - 1, 1) - 0.5) * 0.36  # (H,) sideways
    x = np.arange(len(layers))[:, None] + spread[None]  # (L, H)
    ax.scatter(x, share, s=22, color="#1f77b4", alpha=0.85, linewidths=0, zorder=3,
               label="a head's share")  # fmt: skip
    on_sinks = share * sink_share  # the part of the share its sinks hold
    if on_sinks.max() > 0:
        ax.scatter(x, on_sinks, s=22, facecolors="none", edgecolors="#d62728", linewidths=0.8,
                   zorder=3, label="of it, on sink tokens")  # fmt: skip
    ax.plot(range(len(layers)), share.mean(axis=1), color="#404040", linewidth=1.0, zorder=2,
            label="the layer's mean")  # fmt: skip
    ax.set_xticks(range(len(layers)), [str(layer) for layer in layers])
    ax.tick_params(labelsize=8)
    ax.set_xlim(-0.6, len(layers) - 0.4)
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer (depth)", fontsize=9)
    ax.set_ylabel("share of attention on the picture", fontsize=9)
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.6, zorder=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    return fig
