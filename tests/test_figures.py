"""Figures: the fast (blitted) path draws exactly what a full redraw draws; sizes adapt."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from attnviz.figures import HeadFigure, LayerFigure, Layout, Style, render_text
from tests.conftest import synthetic_attention


def _full_redraw_png(fig, dpi) -> np.ndarray:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return np.asarray(Image.open(buffer).convert("RGB"), dtype=int)


def _png(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=int)


def _random_attention(rng, n_layers=2, n_heads=3, n=7):
    logits = rng.normal(size=(n_layers, n_heads, n, n)) * 2
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return synthetic_attention(weights, [f"tok{i}" for i in range(n)])


def test_blitted_head_figures_equal_full_redraws(tmp_path):
    att = _random_attention(np.random.default_rng(1))
    style = Style()
    figure = HeadFigure(att, style)
    for layer, head in [(0, 0), (1, 2), (0, 1)]:
        path = figure.save(
            att.weights[layer, head], f"layer {layer} · head {head}", tmp_path / "h.png"
        )
        blitted = _png(path)
        full = _full_redraw_png(figure.frames.fig, style.dpi)
        assert blitted.shape == full.shape
        # Identical but for anti-aliasing noise at the edges of redrawn artists.
        assert np.mean(np.abs(blitted - full) > 8) < 0.002


def test_blitted_layer_figures_equal_full_redraws(tmp_path):
    att = _random_attention(np.random.default_rng(2))
    style = Style()
    figure = LayerFigure(att, [0, 1, 2], style)
    for layer in (1, 0):
        blitted = _png(figure.save(att.weights, layer, tmp_path / "l.png"))
        full = _full_redraw_png(figure.frames.fig, style.dpi)
        assert np.mean(np.abs(blitted - full) > 8) < 0.002


def test_heatmap_pixels_follow_the_weights(tmp_path):
    """A one-hot head must light exactly one cell per row: the image is the data, not a stub."""
    n = 6
    one_hot = np.zeros((1, 1, n, n))
    one_hot[0, 0, np.arange(n), (np.arange(n) + 1) % n] = 1.0  # each token attends to the next
    att = synthetic_attention(one_hot, [f"t{i}" for i in range(n)])
    figure = HeadFigure(att, Style(cmap="Greys"))
    image = _png(figure.save(att.weights[0, 0], "one-hot", tmp_path / "h.png"))
    bbox = figure.image.get_window_extent()
    height = image.shape[0]
    cell_w, cell_h = bbox.width / n, bbox.height / n
    for q in range(n):
        for k in range(n):
            x = int(bbox.x0 + (k + 0.5) * cell_w)
            y = int(height - (bbox.y0 + (n - q - 0.5) * cell_h))
            dark = image[y, x].mean() < 60  # Greys: weight 1 is black, weight 0 is white
            assert dark == (k == (q + 1) % n), (q, k, image[y, x])


def test_layout_adapts_to_length():
    short, medium, long = (Layout.for_tokens(n) for n in (10, 120, 512))
    assert short.label_step == medium.label_step == 1
    assert long.label_step > 1  # 512 labels cannot all be readable: every k-th is drawn
    assert short.side_in < medium.side_in <= long.side_in <= 28.0
    assert min(short.font_pt, medium.font_pt, long.font_pt) >= 5.0


def test_render_text_writes_all_files_in_each_format(tmp_path):
    att = _random_attention(np.random.default_rng(3))
    for fmt in ("png", "svg", "pdf"):
        files = render_text(att, tmp_path, [0, 1], [0, 2], Style(fmt=fmt))
        assert len(files) == 1 + 2 + 4
        assert all(f.suffix == f".{fmt}" and f.stat().st_size > 1000 for f in files)
    assert not list(tmp_path.glob(".*.part"))


def test_blitted_metric_grids_equal_full_redraws(tmp_path):
    from attnviz.figures import MetricGrid

    grid = MetricGrid([0, 1, 2], [0, 1, 2, 3], "synthetic", Style())
    rng = np.random.default_rng(4)
    for name, scale in (("share", 1.0), ("distance", 6.0)):  # two colour ranges
        values = rng.random((3, 4)) * scale
        blitted = _png(grid.save(values, name, "help", tmp_path / "m.png"))
        full = _full_redraw_png(grid.frames.fig, 100)
        assert np.mean(np.abs(blitted - full) > 8) < 0.002, name
