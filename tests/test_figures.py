"""Figures: the fast (blitted) path draws exactly what a full redraw draws; sizes adapt."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from attnviz.outputs.figures import HeadFigure, Labels, LayerFigure, Layout, Style, context_line
from attnviz.outputs.render import render_text
from tests.conftest import each_layer, overview_of, query_of, synthetic_attention


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
    figure = HeadFigure(Labels.of(att), style)
    for layer, head in [(0, 0), (1, 2), (0, 1)]:
        path = figure.save(
            att.weights[layer, head], f"layer {layer} · head {head}", tmp_path / "h.png"
        )
        blitted = _png(path)
        full = _full_redraw_png(figure.frames.fig, style.dpi)
        assert blitted.shape == full.shape
        # Identical but for anti-aliasing noise at the edges of redrawn artists.
        assert np.mean(np.abs(blitted - full) > 8) < 0.002


@pytest.mark.parametrize("n, causal", [(7, False), (40, False), (300, False), (40, True)])
def test_painted_heatmaps_are_the_pixels_matplotlib_draws(tmp_path, n, causal):
    """Heatmaps with whole pixels per cell are painted straight into the canvas: exactly the
    pixels Agg's own drawing gives, in the head and the layer figures, at any length, masked
    cells (NaN, a causal model's) included."""
    from dataclasses import replace

    from attnviz.outputs.figures.raster import _paint_cells

    att = _random_attention(np.random.default_rng(n), n=n)
    att = replace(att, info=replace(att.info, causal=causal))
    att.weights[0, 1] = np.eye(n)  # exact 0s and 1s: both ends of the colour map
    style = Style(cmap="magma", scale="head")
    labels = Labels.of(att)
    head, layer = HeadFigure(labels, style), LayerFigure(labels, [0, 1, 2], style)
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
    figure = LayerFigure(Labels.of(att), [0, 1, 2], style)
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
    figure = HeadFigure(Labels.of(att), Style(cmap="Greys"))
    image = _png(figure.save(att.weights[0, 0], "one-hot", tmp_path / "h.png"))
    bbox = figure.image.get_window_extent()
    height = image.shape[0]
    centres = np.arange(n) + 0.5
    xs = (bbox.x0 + centres * bbox.width / n).astype(int)  # key k's column of pixels
    ys = (height - (bbox.y0 + (n - centres) * bbox.height / n)).astype(int)  # query q's row
    dark = image[ys[:, None], xs[None, :]].mean(axis=-1) < 60  # (q, k); Greys: 1 is black
    assert (dark == (one_hot[0, 0] == 1.0)).all()


def test_layout_adapts_to_length():
    short, medium, long = (Layout.for_tokens(n) for n in (10, 100, 512))
    assert short.label_step == medium.label_step == 1
    assert long.label_step > 1  # 512 labels cannot all be readable: every k-th is drawn
    assert short.side_in < medium.side_in <= long.side_in <= 28.0
    assert min(short.font_pt, medium.font_pt, long.font_pt) >= 7.0
    for n in (7, 120, 512, 1024):  # whole pixels per cell, at least one, about 1000 px at most
        side_px = Layout.for_tokens(n, dpi=100).side_in * 100
        assert side_px == pytest.approx(round(side_px)) and round(side_px) % n == 0
        assert n <= side_px <= max(n, 1024)


def _labels_readable(fig, axis, n):
    """The tick labels of `axis` (an XAxis or YAxis) as drawn: at least 7 pt, none touching
    the next, each on a round step and naming its own position ("40: tok40")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    ticks = [t for t in axis.get_major_ticks() if t.label1.get_text()]
    positions = [round(t.get_loc()) for t in ticks]
    step = positions[1] - positions[0]
    assert positions == list(range(0, n, step)) and step in (1, 2, 4, 5, 10, 20, 25, 50)
    for position, tick in zip(positions, ticks):
        assert tick.label1.get_fontsize() >= 7
        assert tick.label1.get_text() == f"{position}: tok{position}"
    boxes = [t.label1.get_window_extent(renderer) for t in ticks]
    vertical = axis.axis_name == "y"
    for a, b in zip(boxes, boxes[1:]):
        gap = (a.y0 - b.y1) if vertical else (b.x0 - a.x1)  # y labels go down the figure
        assert gap > 0, (a, b)
    return len(ticks)


def test_512_token_figures_have_fewer_readable_labels(tmp_path):
    """A 512-token layer grid used to label every 22nd token at 5 pt (24 labels): now round
    steps, at 7 pt or more, none overlapping, each with its position; the head figure too."""
    n = 512
    att = _random_attention(np.random.default_rng(6), n_layers=1, n_heads=2, n=n)
    grid = LayerFigure(Labels.of(att), [0, 1], Style())
    grid.save(att.weights[0], 0, tmp_path / "l.png")
    ax = grid.images[0].axes
    assert 8 <= _labels_readable(grid.frames.fig, ax.yaxis, n) < 24
    assert 8 <= _labels_readable(grid.frames.fig, ax.xaxis, n) < 24
    head = HeadFigure(Labels.of(att), Style())
    head.save(att.weights[0, 0], "t", tmp_path / "h.png")
    ax = head.image.axes
    assert 8 <= _labels_readable(head.frames.fig, ax.yaxis, n) <= 60
    assert 8 <= _labels_readable(head.frames.fig, ax.xaxis, n) <= 60


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

    from attnviz.outputs.figures import save_figure

    n = 300  # more tokens than a panel has pixels
    weights = np.zeros((2, 3, n, n))
    weights[..., np.arange(n), np.arange(n)] = 1.0
    att = synthetic_attention(weights, [f"t{i}" for i in range(n)])
    for cmap in ("viridis", "magma"):
        style = Style(cmap=cmap)
        fig = overview_of(att, [0, 1], [0, 1, 2], style)
        ax = fig.axes[0]
        pixels = _axes_pixels(fig, ax, save_figure(fig, tmp_path / "o.png", style))
        lut = matplotlib.colormaps[cmap](np.linspace(0, 1, 256), bytes=True)[:, :3]
        allowed = {tuple(c) for c in lut.tolist()} | {(255, 255, 255)}
        found = {tuple(c) for c in np.unique(pixels, axis=0).tolist()}
        assert found - allowed == set(), cmap
        assert len(found & allowed) > 10  # the panels are drawn, not blank


@pytest.mark.parametrize("n, causal", [(7, False), (301, False), (301, True)])
def test_overview_panels_are_the_mean_of_their_blocks(n, causal):
    """Each overview cell is the mean, over the cells the queries see, of its block of the
    head's weights divided by the head's max (float64 here); masked blocks and gaps are
    marked, not averaged."""
    from dataclasses import replace

    from attnviz.outputs.figures import OVERVIEW_MASKED, overview_mosaic
    from attnviz.outputs.figures.heatmaps import _overview_cells

    att = _random_attention(np.random.default_rng(n), n=n)
    att = replace(att, info=replace(att.info, causal=causal))
    mosaic = overview_mosaic(Labels.of(att), each_layer(att, [1, 0]), [1, 0], [2, 0], 100)
    block, m, cell = _overview_cells(n, 100)
    seen = ~np.triu(np.ones((n, n), bool), 1) if causal else np.ones((n, n), bool)
    for r, layer in enumerate([1, 0]):
        for c, head in enumerate([2, 0]):
            grid = att.weights[layer, head].astype(np.float64)
            grid = grid / grid.max()
            panel = mosaic[r * cell : r * cell + m, c * cell : c * cell + m]
            for i in range(m):
                for j in range(m):
                    rows, keys = (slice(k * block, (k + 1) * block) for k in (i, j))
                    visible = seen[rows, keys]
                    if not visible.any():
                        assert panel[i, j] == OVERVIEW_MASKED
                    else:
                        mean = grid[rows, keys][visible].mean()
                        assert panel[i, j] == pytest.approx(mean, abs=1e-6)
    assert np.isnan(mosaic[:, m:cell]).all()  # the gap between two heads' panels


@pytest.mark.parametrize("causal", [False, True])
def test_an_overview_laid_out_ahead_draws_what_a_whole_figure_draws(tmp_path, causal):
    """`OverviewFigure` laid out from labels alone (a stand-in of the weights' shape, as
    `render.prepare` has them) then drawn from a mosaic writes the pixels of the whole figure,
    hatching and removed heads' covers included."""
    from dataclasses import replace

    from attnviz.outputs import figures

    att = _random_attention(np.random.default_rng(5), n=40)
    att = replace(att, info=replace(att.info, causal=causal), removed=((1, 1),))
    style = Style()
    layers, heads = [0, 1], [0, 1, 2]
    labels = Labels.of(replace(att, weights=att.weights[:0]))
    figure = figures.OverviewFigure(labels, layers, heads, style)
    figure.frames.lay_out()
    mosaic = figures.overview_mosaic(labels, each_layer(att, layers), layers, heads, style.dpi)
    blitted = _png(figure.save(mosaic, tmp_path / "ahead.png"))
    whole = overview_of(att, layers, heads, style)
    whole = _png(figures.save_figure(whole, tmp_path / "o.png", style))
    assert np.array_equal(blitted, whole)


def test_titles_carry_model_text_and_view(tmp_path):
    from attnviz.analysis.transforms import hide_special

    n = 5
    weights = np.full((2, 3, n, n), 1 / n)
    att = synthetic_attention(weights, ["[CLS]", "a", "b", "c", "[SEP]"], [1, 0, 0, 0, 1])
    hidden = hide_special(att)
    assert context_line(Labels.of(att), 8) == "synthetic · “synthetic” · token view"
    assert context_line(Labels.of(hidden), 8).endswith("special tokens hidden, rows renormalised")
    long_text = synthetic_attention(weights, ["a"] * n)
    object.__setattr__(long_text, "text", "word " * 100)
    long_labels = Labels.of(long_text)
    assert len(context_line(long_labels, 6)) <= 6 * 72 / (8 * 0.6)
    assert "…" in context_line(long_labels, 6)

    def texts(fig):
        return " ".join(t.get_text() for t in fig.texts)

    assert "all heads" in texts(overview_of(att, [0, 1], [0, 1, 2], Style()))
    subset = texts(overview_of(att, [1], [0, 2], Style()))
    assert "all heads" not in subset and "1 of 2 layers × 2 of 3 heads" in subset
    layer = LayerFigure(Labels.of(hidden), [0, 2], Style())
    layer.save(hidden.weights[1], 1, tmp_path / "l.png")
    assert "head 0 · max" in texts(layer.frames.fig) and "rows renormalised" in texts(
        layer.frames.fig
    )


def test_layer_grids_keep_thinned_labels_on_long_texts():
    n = 90
    att = _random_attention(np.random.default_rng(5), n_layers=1, n_heads=2, n=n)
    figure = LayerFigure(Labels.of(att), [0, 1], Style())
    ax = figure.images[0].axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert 10 <= len(labels) <= 30 and labels[0] == "0: tok0" and labels[1] == "4: tok4"
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
        figure = HeadFigure(Labels.of(att), Style(scale=scale))
        path = figure.save(att.weights[0, 0], scale, tmp_path / f"{scale}.png")
        pixels = _axes_pixels(figure.frames.fig, figure.image.axes, path)
        assert (top in {tuple(p) for p in pixels.tolist()}) == reaches_top, scale
        bar = figure.frames.fig.axes[1].get_ylabel()
        assert ("max" in bar) == (scale == "head")


# ---------- masked cells of causal models ----------

DECODER_TEXT = "The cat sat on the mat and the dog sat on the log."


def _masked(pixels: np.ndarray) -> np.ndarray:
    """Pixels of the masked cells' hatched grey: neutral, from MASKED_GREY (160) up to the
    white of the hatching (antialiased lines blend the two)."""
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return (r == g) & (g == b) & (r >= 159)


def _cell_blocks(png: np.ndarray, image, n: int) -> np.ndarray:
    """The pixels of each cell of a heatmap drawn with whole pixels per cell, 2 px in from its
    edges (where the axes' frame may be): (n, n, k - 4, k - 4, 3), indexed [query, key]."""
    box = image.get_window_extent()
    height = png.shape[0]
    x0, x1 = round(box.x0), round(box.x1)
    y0, y1 = round(height - box.y1), round(height - box.y0)
    k = (x1 - x0) // n
    assert (x1 - x0, y1 - y0) == (k * n, k * n) and k >= 8
    cells = png[y0:y1, x0:x1].reshape(n, k, n, k, 3).transpose(0, 2, 1, 3, 4)
    return cells[:, :, 2:-2, 2:-2]


def _check_masked_cells(blocks: np.ndarray, grid: np.ndarray, cmap: str) -> None:
    """Keys after the query: hatched grey (grey and its white hatching both present over the
    triangle, nothing else); every other cell: flat, the colour map's colour of its weight."""
    import matplotlib

    n = grid.shape[0]
    lut = matplotlib.colormaps[cmap]
    upper = np.triu(np.ones((n, n), bool), k=1)
    for q in range(n):
        for k in range(n):
            cell = blocks[q, k]
            if upper[q, k]:
                assert _masked(cell).all(), (q, k)
            else:
                expected = lut(np.float32(grid[q, k]), bytes=True)[:3]
                assert (cell == expected).all(), (q, k, cell[0, 0], expected)
    hatched = blocks[upper]  # (cells, k, k, 3)
    assert (hatched == 160).all(-1).any() and (hatched == 255).all(-1).any()


@pytest.mark.parametrize("cmap", ["viridis", "Greys", "magma"])
def test_decoder_heatmaps_draw_keys_after_the_query_as_masked(loaded_tiny, tmp_path, cmap):
    """A causal model's query cannot see later keys: those cells are hatched grey in the head
    and layer figures, not the colour of 0 (viridis' purple, Greys' white, magma's black),
    and the figures' keys say so; every visible cell keeps its weight's colour."""
    from attnviz.core.extract import extract

    att = extract(loaded_tiny["gpt2"], DECODER_TEXT)
    n = len(att.tokens)
    assert att.info.causal and n > 8
    style = Style(cmap=cmap)
    head = HeadFigure(Labels.of(att), style)
    grid = att.weights[1, 2]  # (T, T)
    blocks = _cell_blocks(_png(head.save(grid, "t", tmp_path / "h.png")), head.image, n)
    _check_masked_cells(blocks, grid, cmap)
    layer = LayerFigure(Labels.of(att), [0, 1, 2, 3], style)
    png = _png(layer.save(att.weights[1], 1, tmp_path / "l.png"))
    for h in (0, 3):
        _check_masked_cells(_cell_blocks(png, layer.images[h], n), att.weights[1, h], cmap)
    for figure in (head.frames.fig, layer.frames.fig):
        assert "masked" in " ".join(t.get_text() for t in figure.texts)


def test_encoder_heatmaps_have_no_masked_cells(tmp_path):
    att = _random_attention(np.random.default_rng(8), n=9)
    head = HeadFigure(Labels.of(att), Style())
    blocks = _cell_blocks(
        _png(head.save(att.weights[0, 0], "t", tmp_path / "h.png")), head.image, 9
    )
    assert not _masked(blocks).any()
    assert "masked" not in " ".join(t.get_text() for t in head.frames.fig.texts)


def test_decoder_query_and_overview_figures_mask_later_keys(loaded_tiny, tmp_path):
    """The query figure greys the keys after its query in every row; each overview panel
    greys its upper right and keeps its lower left in colour."""
    from attnviz.core.extract import extract
    from attnviz.outputs.figures import save_figure
    from attnviz.outputs.figures.heatmaps import _overview_cells

    att = extract(loaded_tiny["llama"], DECODER_TEXT)
    n, index = len(att.tokens), 5
    style = Style()
    fig = query_of(att, index, [0, 1], [0, 1, 2, 3], style)
    rows = 2 * 4
    height = fig.bbox.height  # saving clears the figure: positions first
    to_pixels = fig.axes[0].transData.transform  # data to display pixels, origin bottom left
    centres = [[to_pixels((j, r)) for j in range(n)] for r in range(rows)]  # cell (row, key)
    png = _png(save_figure(fig, tmp_path / "q.png", style))
    masked = np.array([[_masked(png[int(height - y), int(x)]) for x, y in row] for row in centres])
    assert (masked == (np.arange(n) > index)[None, :]).all()  # (rows, keys)
    fig = overview_of(att, [0, 1], [0, 1, 2, 3], style)
    _, m, cell = _overview_cells(n, style.dpi)
    height, to_pixels = fig.bbox.height, fig.axes[0].transData.transform
    corners = {}
    for r in range(2):
        for c in range(4):
            corners[r, c, "upper right"] = to_pixels((c * cell + m - 1, r * cell))
            corners[r, c, "lower left"] = to_pixels((c * cell, r * cell + m - 1))
    png = _png(save_figure(fig, tmp_path / "o.png", style))
    for (r, c, where), (x, y) in corners.items():
        pixel = png[int(height - y), int(x)]
        assert _masked(pixel) == (where == "upper right"), (r, c, where, pixel)


# ---------- heads removed by --ablate ----------


def _neutral(pixels: np.ndarray) -> np.ndarray:
    """Grey pixels (white, the removed cover's hatching, black text): no colour of viridis,
    magma or any coloured map, whose every entry has unequal channels."""
    return (pixels[..., 0] == pixels[..., 1]) & (pixels[..., 1] == pixels[..., 2])


def _removed_attention(causal=False):
    from dataclasses import replace

    att = _random_attention(np.random.default_rng(11), n_layers=2, n_heads=3, n=9)
    return replace(att, info=replace(att.info, causal=causal), removed=((0, 1),))


@pytest.mark.parametrize("causal", [False, True])
def test_a_removed_head_is_drawn_as_removed_not_as_a_pattern(tmp_path, causal):
    """A head whose output --ablate set to 0 gets a cover and "removed" in its title, in the
    head figure and in its panel of the layer grid; the heads drawn after it (the figures are
    reused, blitted) get their heatmaps back, and one drawn first keeps its cover."""
    from attnviz.outputs.figures import head_title

    att = _removed_attention(causal)
    labels = Labels.of(att)
    head = HeadFigure(labels, Style())
    for layer, h in [(0, 1), (0, 0), (0, 1), (1, 1)]:  # the removed head first, then again
        grid = att.weights[layer, h]
        title = head_title(labels, layer, h, grid)
        path = head.save(grid, title, tmp_path / "h.png", removed=att.is_removed(layer, h))
        inside = _axes_pixels(head.frames.fig, head.image.axes, path)
        assert _neutral(inside).all() == att.is_removed(layer, h), (layer, h)
        assert ("removed" in title) == att.is_removed(layer, h)
    layer_figure = LayerFigure(Labels.of(att), [0, 1, 2], Style())
    for layer in (0, 1, 0):
        path = layer_figure.save(att.weights[layer], layer, tmp_path / "l.png")
        titles = [t.get_text() for t in layer_figure.panel_titles]
        for h, image in enumerate(layer_figure.images):
            inside = _axes_pixels(layer_figure.frames.fig, image.axes, path)
            assert _neutral(inside).all() == att.is_removed(layer, h), (layer, h)
            assert ("removed" in titles[h]) == att.is_removed(layer, h)


def test_render_text_covers_a_removed_head_in_every_figure(tmp_path):
    """Through render_text (the way show draws): the removed head's own file has no heatmap
    (its coloured pixels are the colour bar's alone); its overview tile and query row are
    covered; the other heads are drawn."""
    from attnviz.outputs.figures import save_figure
    from attnviz.outputs.figures.heatmaps import _overview_cells

    att = _removed_attention()
    render_text(att, tmp_path, [0, 1], [0, 1, 2], Style(), jobs=1)

    def coloured(name):
        return int((~_neutral(_png(tmp_path / name))).sum())

    removed, kept = coloured("layer-00-head-01.png"), coloured("layer-00-head-00.png")
    assert removed < 0.2 * kept  # a 9 × 9 heatmap has many times the colour bar's pixels
    style = Style()
    fig = overview_of(att, [0, 1], [0, 1, 2], style)
    _, m, cell = _overview_cells(9, style.dpi)
    height, to_pixels = fig.bbox.height, fig.axes[0].transData.transform
    centres = {(r, c): to_pixels((c * cell + m / 2 - 1, r * cell + m / 2 - 1)) for r in (0, 1)
               for c in (0, 1, 2)}  # fmt: skip
    png = _png(save_figure(fig, tmp_path / "o.png", style))
    for (r, c), (x, y) in centres.items():
        tile = png[int(height - y) - 20 : int(height - y) + 20, int(x) - 20 : int(x) + 20]
        assert _neutral(tile).all() == (r == 0 and c == 1), (r, c)
    fig = query_of(att, 4, [0, 1], [0, 1, 2], style)
    height, to_pixels = fig.bbox.height, fig.axes[0].transData.transform
    rows = [[to_pixels((k, r)) for k in range(9)] for r in range(6)]
    png = _png(save_figure(fig, tmp_path / "q.png", style))
    for r, row in enumerate(rows):
        cells = np.array([png[int(height - y), int(x)] for x, y in row if abs(x - row[4][0]) > 8])
        assert _neutral(cells).all() == (r == 1), r  # row 1 is L0 H1


# ---------- report --importance's map ----------


def _importance_map(n_layers, n_heads, low=-0.26, high=1.0):
    from attnviz.outputs.figures import importance_figure

    rng = np.random.default_rng(n_layers * n_heads)
    scores = rng.uniform(low / 2, high / 2, size=(n_layers, n_heads))
    scores[0, 1], scores[-1, -1] = low, high
    ranks = np.zeros(scores.shape, int)
    ranks.ravel()[np.argsort(-scores.ravel())] = np.arange(1, scores.size + 1)
    title = "Head importance by zero ablation — a model"
    fig = importance_figure(scores, ranks, list(range(n_layers)), list(range(n_heads)), title,
                            "rise in loss (nats)", Style())  # fmt: skip
    return fig, scores


@pytest.mark.parametrize(("n_layers", "n_heads"), [(30, 9), (6, 12), (2, 4), (32, 32)])
def test_importance_map_has_square_cells_readable_labels_and_no_sliver(n_layers, n_heads):
    """SmolLM2's 30 × 9 heads made a 788 × 1995 px sliver whose colour bar squeezed the cells:
    now every cell is square, the figure is never taller than wide (the longer axis runs
    across), and the tick labels are at least 7 pt and do not overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, _ = _importance_map(n_layers, n_heads)
    ax = fig.axes[0]
    rows, cols = ax.images[0].get_array().shape
    assert sorted((rows, cols)) == sorted((n_layers, n_heads)) and cols >= rows
    box = ax.get_window_extent()
    assert box.width / cols == pytest.approx(box.height / rows, abs=0.5)  # pixels a cell
    width, height = fig.get_size_inches()
    assert height <= width
    renderer = FigureCanvasAgg(fig).get_renderer()
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        assert len(labels) in (rows, cols) and min(t.get_fontsize() for t in labels) >= 7
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
    named = " ".join(t.get_text() for t in (*ax.get_xticklabels(), *ax.get_yticklabels()))
    assert f"L{n_layers - 1}" in named and f"H{n_heads - 1}" in named


def test_importance_colour_bar_is_centred_on_zero_with_equal_halves():
    """Scores from −0.26 to 1.0: the limits are ±1.0, so 0 sits at the middle of the colour
    bar and a score and its negative are equally far from white (a two-slope scale drew
    −0.26 as dark a blue as 1.0 is red). All scores ≥ 0 keep the style's map from 0."""
    fig, scores = _importance_map(6, 12)
    image, bar = fig.axes[0].images[0], fig.axes[1]
    norm = image.norm
    assert (norm.vmin, norm.vmax) == (-1.0, 1.0)
    for x in (0.26, 0.5, 1.0):
        assert norm(x) - 0.5 == pytest.approx(0.5 - norm(-x))
    assert bar.get_ylim() == pytest.approx((-1.0, 1.0))
    box = bar.get_window_extent()
    zero = bar.transData.transform((0, 0))[1]
    assert zero == pytest.approx((box.y0 + box.y1) / 2, abs=0.5)
    assert image.get_cmap().name.startswith("RdBu_r")
    fig, _ = _importance_map(6, 12, low=0.0, high=0.1)
    image = fig.axes[0].images[0]
    assert (image.norm.vmin, image.norm.vmax) == (0.0, 0.1)
    assert image.get_cmap().name == Style().cmap


def test_labels_say_which_text_each_axis_is_from():
    """Cross-attention's labels, read once from its Attention: keys are the source's tokens,
    queries the target's; both sides counted, both texts in the context line; a measure
    other than the weights says its keys contribute and its queries are built."""
    from dataclasses import replace

    from attnviz.core.attention import Keys

    source = ("a", "b", "c", "d", "e")
    weights = np.full((1, 2, 3, 5), 0.2)  # (L, H, T, S): 3 target tokens read 5 source tokens
    att = synthetic_attention(weights, ["x", "y", "z"])
    keys = Keys("a b c d e", source, np.zeros(5, bool), tuple(range(5)), source)
    cross = replace(att, stack="cross", keys=keys, target="x y z", text="a b c d e")
    labels = Labels.of(cross)
    assert (labels.tokens, labels.key_tokens, labels.cross) == (("x", "y", "z"), source, True)
    assert labels.key_axis == "key (token attended to, source)"
    assert labels.query_axis == "query (token attending, target)"
    assert labels.counted == "3 × 5 tokens" and labels.texts == ("a b c d e", "x y z")
    said = "synthetic · “a b c d e” → “x y z” · cross-attention, token view"
    assert context_line(labels, 9) == said
    norm = Labels.of(replace(cross, measure="norm"))
    assert norm.key_axis == "key (token contributing, source)"
    assert norm.query_axis == "query (token built, target)"
    encoder = Labels.of(replace(att, stack="encoder"))
    assert encoder.key_axis == "key (token attended to, source)" and not encoder.cross
    assert Labels.of(att).key_axis == "key (token attended to)"  # a model of one stack
