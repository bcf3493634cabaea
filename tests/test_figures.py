"""Figures: the fast (blitted) path draws exactly what a full redraw draws; sizes adapt."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from attnviz.outputs.figures import HeadFigure, LayerFigure, Layout, Style
from attnviz.outputs.render import render_text
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


@pytest.mark.parametrize("n", [7, 40, 300])
def test_painted_heatmaps_are_the_pixels_matplotlib_draws(tmp_path, n):
    """Heatmaps with whole pixels per cell are painted straight into the canvas: exactly the
    pixels Agg's own drawing gives, in the head and the layer figures, at any length."""
    from attnviz.outputs.figures import _paint_cells

    att = _random_attention(np.random.default_rng(n), n=n)
    att.weights[0, 1] = np.eye(n)  # exact 0s and 1s: both ends of the colour map
    style = Style(cmap="magma", scale="head")
    head, layer = HeadFigure(att, style), LayerFigure(att, [0, 1, 2], style)
    head.save(att.weights[0, 1], "t", tmp_path / "h.png")  # draws the background once
    layer.save(att.weights[0], 0, tmp_path / "l.png")
    for frames, images in ((head.frames, [head.image]), (layer.frames, layer.images)):
        canvas = frames.canvas
        for image in images:
            canvas.restore_region(frames._background)
            frames.fig.draw_artist(image)
            drawn = np.array(canvas.buffer_rgba())
            canvas.restore_region(frames._background)
            assert _paint_cells(canvas, image)
            assert np.array_equal(np.asarray(canvas.buffer_rgba()), drawn)
    image = head.image
    image.set_interpolation("antialiased")  # anything else is left to matplotlib
    assert not _paint_cells(head.frames.canvas, image)


def test_blitted_layer_figures_equal_full_redraws(tmp_path):
    att = _random_attention(np.random.default_rng(2))
    style = Style()
    figure = LayerFigure(att, [0, 1, 2], style)
    for layer in (1, 0):
        blitted = _png(figure.save(att.weights[layer], layer, tmp_path / "l.png"))
        full = _full_redraw_png(figure.frames.fig, style.dpi)
        assert np.mean(np.abs(blitted - full) > 8) < 0.002


@pytest.mark.parametrize("n", [6, 300])
def test_heatmap_pixels_follow_the_weights(tmp_path, n):
    """A one-hot head must light exactly one cell per row: the image is the data, not a stub.
    At 300 tokens too, where the figure is sized by its pixel budget: no cell is dropped."""
    one_hot = np.zeros((1, 1, n, n))
    one_hot[0, 0, np.arange(n), (np.arange(n) + 1) % n] = 1.0  # each token attends to the next
    att = synthetic_attention(one_hot, [f"t{i}" for i in range(n)])
    figure = HeadFigure(att, Style(cmap="Greys"))
    image = _png(figure.save(att.weights[0, 0], "one-hot", tmp_path / "h.png"))
    bbox = figure.image.get_window_extent()
    height = image.shape[0]
    centres = np.arange(n) + 0.5
    xs = (bbox.x0 + centres * bbox.width / n).astype(int)  # key k's column of pixels
    ys = (height - (bbox.y0 + (n - centres) * bbox.height / n)).astype(int)  # query q's row
    dark = image[ys[:, None], xs[None, :]].mean(axis=-1) < 60  # (q, k); Greys: 1 is black
    assert (dark == (one_hot[0, 0] == 1.0)).all()


def test_layout_adapts_to_length():
    short, medium, long = (Layout.for_tokens(n) for n in (10, 120, 512))
    assert short.label_step == medium.label_step == 1
    assert long.label_step > 1  # 512 labels cannot all be readable: every k-th is drawn
    assert short.side_in < medium.side_in <= long.side_in <= 28.0
    assert min(short.font_pt, medium.font_pt, long.font_pt) >= 5.0
    for n in (7, 120, 512, 1024):  # whole pixels per cell, at least one, about 1000 px at most
        side_px = Layout.for_tokens(n, dpi=100).side_in * 100
        assert side_px == pytest.approx(round(side_px)) and round(side_px) % n == 0
        assert n <= side_px <= max(n, 1024)


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_render_text_writes_all_files_in_each_format(tmp_path):
    att = _random_attention(np.random.default_rng(3))
    for fmt in ("png", "svg", "pdf"):
        files = render_text(att, tmp_path, [0, 1], [0, 2], Style(fmt=fmt))
        assert len(files) == 1 + 2 + 4
        assert all(f.suffix == f".{fmt}" and f.stat().st_size > 1000 for f in files)
    assert not list(tmp_path.glob(".*.part"))


def test_blitted_metric_grids_equal_full_redraws(tmp_path):
    from attnviz.outputs.figures import MetricGrid

    grid = MetricGrid([0, 1, 2], [0, 1, 2, 3], "synthetic", Style())
    rng = np.random.default_rng(4)
    for name, scale in (("share", 1.0), ("distance", 6.0)):  # two colour ranges
        values = rng.random((3, 4)) * scale
        blitted = _png(grid.save(values, name, "help", tmp_path / "m.png"))
        full = _full_redraw_png(grid.frames.fig, 100)
        assert np.mean(np.abs(blitted - full) > 8) < 0.002, name


def _axes_pixels(fig, ax, path):
    """The pixels inside `ax` (1 px in from its edges) of the PNG saved at `path`."""
    image = np.asarray(Image.open(path).convert("RGB"))
    box = ax.get_window_extent()
    height = image.shape[0]
    x0, x1 = int(np.ceil(box.x0)) + 1, int(box.x1) - 1
    y0, y1 = int(height - box.y1) + 1, int(height - box.y0) - 1
    return image[y0:y1, x0:x1].reshape(-1, 3)


def test_overview_pixels_are_colours_of_the_map(tmp_path):
    """Long texts are averaged down on the data: no blended colours (a brown 1.0 diagonal)."""
    import matplotlib

    from attnviz.outputs.figures import overview_figure, save_figure

    n = 300  # more tokens than a panel has pixels
    weights = np.zeros((2, 3, n, n))
    weights[..., np.arange(n), np.arange(n)] = 1.0
    att = synthetic_attention(weights, [f"t{i}" for i in range(n)])
    for cmap in ("viridis", "magma"):
        style = Style(cmap=cmap)
        fig = overview_figure(att, [0, 1], [0, 1, 2], style)
        ax = fig.axes[0]
        pixels = _axes_pixels(fig, ax, save_figure(fig, tmp_path / "o.png", style))
        lut = matplotlib.colormaps[cmap](np.linspace(0, 1, 256), bytes=True)[:, :3]
        allowed = {tuple(c) for c in lut.tolist()} | {(255, 255, 255)}
        found = {tuple(c) for c in np.unique(pixels, axis=0).tolist()}
        assert found - allowed == set(), cmap
        assert len(found & allowed) > 10  # the panels are drawn, not blank


def test_titles_carry_model_text_and_view(tmp_path):
    from attnviz.analysis.transforms import hide_special
    from attnviz.outputs.figures import context_line, overview_figure

    n = 5
    weights = np.full((2, 3, n, n), 1 / n)
    att = synthetic_attention(weights, ["[CLS]", "a", "b", "c", "[SEP]"], [1, 0, 0, 0, 1])
    hidden = hide_special(att)
    assert context_line(att, 8) == "synthetic · “synthetic” · token view"
    assert context_line(hidden, 8).endswith("special tokens hidden, rows renormalised")
    long_text = synthetic_attention(weights, ["a"] * n)
    object.__setattr__(long_text, "text", "word " * 100)
    assert len(context_line(long_text, 6)) <= 6 * 72 / (8 * 0.6) and "…" in context_line(
        long_text, 6
    )

    def texts(fig):
        return " ".join(t.get_text() for t in fig.texts)

    assert "all heads" in texts(overview_figure(att, [0, 1], [0, 1, 2], Style()))
    subset = texts(overview_figure(att, [1], [0, 2], Style()))
    assert "all heads" not in subset and "1 of 2 layers × 2 of 3 heads" in subset
    layer = LayerFigure(hidden, [0, 2], Style())
    layer.save(hidden.weights[1], 1, tmp_path / "l.png")
    assert "head 0 · max" in texts(layer.frames.fig) and "rows renormalised" in texts(
        layer.frames.fig
    )


def test_layer_grids_keep_thinned_labels_on_long_texts():
    n = 90
    att = _random_attention(np.random.default_rng(5), n_layers=1, n_heads=2, n=n)
    figure = LayerFigure(att, [0, 1], Style())
    ax = figure.images[0].axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert 10 <= len(labels) <= 30 and labels[0] == "tok0"
    note = " ".join(t.get_text() for t in figure.frames.fig.texts)
    assert "every 4th token labelled" in note


def test_ordinals():
    from attnviz.outputs.figures import ordinal

    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 102, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "102nd", "111th",
    ]  # fmt: skip


def test_head_scale_stretches_a_diffuse_head(tmp_path):
    """On the head scale a head whose max is 0.2 reaches the top colour; on 0–1 it does not."""
    n = 5
    weights = np.full((1, 1, n, n), 0.8 / (n - 1))
    weights[0, 0, :, 0] = 0.2  # max 0.2
    att = synthetic_attention(weights, [f"t{i}" for i in range(n)])
    import matplotlib

    top = tuple(matplotlib.colormaps["viridis"](1.0, bytes=True)[:3])
    for scale, reaches_top in (("absolute", False), ("head", True)):
        figure = HeadFigure(att, Style(scale=scale))
        path = figure.save(att.weights[0, 0], scale, tmp_path / f"{scale}.png")
        pixels = _axes_pixels(figure.frames.fig, figure.image.axes, path)
        assert (top in {tuple(p) for p in pixels.tolist()}) == reaches_top, scale
        bar = figure.frames.fig.axes[1].get_ylabel()
        assert ("max" in bar) == (scale == "head")
