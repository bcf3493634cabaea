"""A vision-language model's views over its picture (issue 54 item 3): each head's attention
of the answer drawn over the picture, every image token's value on its cell, held to the
model's eager attention; the picture's share by layer as a plot; the files `show` writes."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import eager, picture, save

from attnviz.cli import app

PROMPT = "What is on the table?"
KINDS = ("llava", "qwen2_vl")


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-views")
    return {kind: save(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    return picture(tmp_path_factory.mktemp("pictures") / "photo.png", (128, 64))


@pytest.fixture(scope="module")
def answered(vlm_dirs, photo):
    """Each family's answer of three written tokens, as attnviz read it, and the model's
    eager attention over the same ids and inputs."""
    from attnviz.core import generation, vlm
    from attnviz.core.extract import attend
    from attnviz.core.models import model

    found = {}
    for kind in KINDS:
        loaded = model(str(vlm_dirs[kind])).load()
        prompt = vlm.encode(loaded, photo, PROMPT)
        settings = generation.Settings(tokens=3)
        whole, reading = generation.write(loaded, prompt, settings, range(loaded.info.n_layers))
        att = attend(loaded, [whole], reading=reading)[0]
        found[kind] = att, eager(vlm_dirs[kind], list(whole.ids), prompt.inputs)
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_the_overlay_is_the_eager_rows_on_their_cells(answered, kind):
    """Each panel of picture-answer-layer-1.png: the mean of the rows that wrote the answer
    equals eager's within 1e-5, every image token's value lies on the pixels of its cell
    of the picture (the grid read back from the painted values), and the panel's pixels
    are the picture under those values' colours on the figure's one scale."""
    from PIL import Image

    from attnviz.analysis.picture_share import answer_rows, looked
    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import _shown_size, blend_values, layout_figure, resized
    from attnviz.outputs.figures.raster import figure_png

    att, expected = answered[kind]
    layout, style = att.layout, Style()
    rows = answer_rows(att)
    assert rows == tuple(range(att.continuation.start - 1, len(att.tokens) - 1))
    mean = looked(att, 1, rows)  # (H, T)
    np.testing.assert_allclose(mean, expected[1][:, list(rows)].mean(axis=1), atol=1e-5)
    part = layout.parts[0]
    size = _shown_size(layout.pixels.shape[:2], style.dpi)
    top, left, bottom, right = part.box
    painted = [layout.painted(mean[head], size) for head in range(4)]
    for head in range(4):
        # each cell's centre pixel, read back as the grid: the eager row at its token
        ys = (top + (bottom - top) * (np.arange(part.grid[0]) + 0.5) / part.grid[0]) * size[0]
        xs = (left + (right - left) * (np.arange(part.grid[1]) + 0.5) / part.grid[1]) * size[1]
        grid = painted[head][ys.astype(int)][:, xs.astype(int)]
        eager_row = expected[1, head, list(rows)].mean(axis=0)
        want = eager_row[list(part.tokens)].reshape(part.grid)
        assert np.abs(grid - want).max() < 1e-5
    fig = layout_figure(att, 1, [0, 1, 2, 3], mean, "the answer", style)
    panels = [a for a in fig.artists if hasattr(a, "pixels")]
    titles = [t.get_text() for t in fig.texts if t.get_text().startswith("head ")]
    assert len(panels) == len(titles) == 4
    scale = max(float(p.max()) for p in painted)
    pixels = resized(layout.pixels, size)
    unseen = layout.painted(np.ones(len(att.tokens), np.float32), size) == 0
    with Image.open(io.BytesIO(figure_png(fig))) as opened:
        rendered = np.asarray(opened.convert("RGB"))
    for head, panel in enumerate(panels):
        blended = blend_values(pixels, painted[head], style.colour_map(), scale,
                               unseen if unseen.any() else None)  # fmt: skip
        assert np.array_equal(panel.pixels, blended)
        h, w = blended.shape[:2]
        top_row = rendered.shape[0] - panel.bottom - h  # the PNG's rows run down
        placed = rendered[top_row + 2 : top_row + h - 2, panel.left + 2 : panel.left + w - 2]
        assert np.array_equal(placed, blended[2:-2, 2:-2])  # inside the frame
        share = expected[1, head, list(rows)][:, layout.image_tokens()].sum(-1).mean()
        assert f"picture {share:.0%}" in titles[head]
    assert (kind == "llava") == bool(unseen.any())  # LLaVA's centre crop: the sides unseen


def test_the_share_plot_draws_the_eager_shares(answered):
    """picture-share.png's lines: each head's share and their mean by layer, the eager rows
    that wrote the answer summed over the image tokens; its map the same numbers."""
    from attnviz.analysis.picture_share import picture_shares, whose_rows
    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import share_figure

    att, expected = answered["qwen2_vl"]
    rows, image = list(picture_shares(att).rows), att.layout.image_tokens()
    want = expected[:, :, rows][..., image].sum(-1).mean(-1)  # (L, H)
    share = picture_shares(att).share
    fig = share_figure(att, share, [0, 1], [0, 1, 2, 3], whose_rows(att), Style())
    lines, grid = fig.axes[:2]
    drawn = [line.get_ydata() for line in lines.get_lines()]
    assert len(drawn) == 5  # four heads and their mean
    np.testing.assert_allclose(np.stack(drawn[:4], axis=1), want, atol=1e-5)
    np.testing.assert_allclose(drawn[4], want.mean(axis=1), atol=1e-5)
    np.testing.assert_allclose(grid.get_images()[0].get_array(), want, atol=1e-5)


def test_show_writes_the_views_over_the_picture(vlm_dirs, photo, tmp_path):
    """`show … --generate -o DIR` writes one figure over the picture a layer shown (the
    answer's mean) and the share plot; `--query` adds that token's own row, per layer."""
    out = tmp_path / "out"
    args = ["show", str(photo), PROMPT, "-m", str(vlm_dirs["qwen2_vl"]), "--generate", "2",
            "-o", str(out), "--layer", "1", "--query", "3"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    drawn = sorted(p.name for p in folder.glob("picture-*"))
    assert drawn == ["picture-answer-layer-1.png", "picture-share.png",
                     "picture-token-3-layer-1.png"]  # fmt: skip
    for name in drawn:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------- the page (answer.js) ----------


def _page_expected(att, entry, view: int, layer: int) -> np.ndarray:
    """What answer.js paints for each head (H, h, w, 3) int: the mean of the view's rows
    (float64 sums in order) over the picture (`over_expected`)."""
    rows = entry["views"][view]["rows"]
    values = []
    for head in range(att.weights.shape[1]):
        total = np.zeros(len(att.tokens))
        for q in rows:
            total += att.weights[layer, head, q].astype(np.float64)
        values.append(total / len(rows))
    return over_expected(entry, values)


def over_expected(entry, rows) -> np.ndarray:
    """What blobs.js's overlay paints for each row of values (a value a token) over a layout's
    picture (page.py's over_picture `entry`), (rows, h, w, 3) int: each value on its cell's
    pixels (parts that overlap added), coloured floor(v / top · 256) of the rows' largest
    value on a seen pixel, at 60 % over the picture, the pixels no cell covers under white."""
    from test_html import _unpack, _viridis

    width, height = entry["size"]
    under = _unpack(entry["pixels"], "u1").reshape(height, width, 3).astype(int)

    def painted(row):
        out = np.zeros((height, width))
        for part in entry["parts"]:
            ys, xs, cols = part["ys"], part["xs"], part["grid"][1]
            for n, token in enumerate(part["tokens"]):
                r, c = divmod(n, cols)
                out[ys[r] : ys[r + 1], xs[c] : xs[c + 1]] += row[token]
        return out

    seen = painted(np.ones(len(rows[0]))) > 0
    values = [painted(np.asarray(row, np.float64)) for row in rows]
    top = max(float(v[seen].max()) for v in values)
    found = []
    for v in values:
        index = np.minimum(255, np.floor(v / top * 256)).astype(int)
        over = np.where(seen[..., None], _viridis()[index], 255)
        found.append(np.floor((2 * under + 3 * over) / 5 + 0.5).astype(int))  # k/5: no tie
    return np.stack(found)


@pytest.fixture(scope="module")
def answer_page(answered, tmp_path_factory):
    """LLaVA's answer's page, from the recorded attention (held to eager above)."""
    from attnviz.outputs.html import write_page

    att = answered["llava"][0]
    return att, write_page(att, tmp_path_factory.mktemp("answer-page") / "attention.html")


def test_the_page_carries_the_answer_and_its_shares(answer_page, answered):
    """The page's data: the picture at the page's size, each part's cells' edges as the
    PNGs paint them, the whole answer's rows then each word's (the row before it), and
    the picture's share of each, the eager rows summed over the image tokens."""
    from test_html import _data

    from attnviz.analysis.picture_share import answer_rows

    att, page = answer_page
    expected = answered["llava"][1]
    html = page.read_text(encoding="utf-8")
    assert html.count("<script>") == 3 and "function drawAnswer" in html
    assert "drawPicture" not in html  # a vision transformer's view is not this page's
    entry = _data(html)["layout"]
    width, height = entry["size"]
    assert (width, height) == (128, 64) and entry["given"] == [128, 64]
    (ys, xs), part = att.layout.edges((height, width))[0], entry["parts"][0]
    assert part["ys"] == ys.tolist() and part["xs"] == xs.tolist() and part["grid"] == [6, 6]
    start = att.continuation.start
    views = entry["views"]
    words = [[t - 1] for t in range(start, start + 3)]  # the row before each word
    assert [v["rows"] for v in views] == [list(answer_rows(att)), *words]
    image = att.layout.image_tokens()
    for v in views:
        want = expected[:, :, v["rows"]][..., image].sum(-1).mean(-1)  # (L, H)
        np.testing.assert_allclose(np.array(v["share"]), want, atol=1e-5)


def test_the_page_draws_each_head_over_the_picture(browser, answer_page):
    """In chromium: the page opens on the whole answer in layer 0, every head's canvas the
    picture under that row's colours on the layer's one scale (the crop's margins faded);
    clicking a word draws the row that wrote it, choosing a layer draws that layer's; the
    share plot's mean line is the page's shares' mean over the heads."""
    from test_html import ARTIFACTS, Opened, _data
    from test_picture_page import _painted

    att, page = answer_page
    entry = _data(page.read_text(encoding="utf-8"))["layout"]
    shown = Opened(browser, page, every_head=False)
    try:
        shown.page.wait_for_selector("body[data-answer='ready']")
        ARTIFACTS.mkdir(exist_ok=True)
        shown.page.screenshot(path=str(ARTIFACTS / "answer-page.png"))

        def check(view: int, layer: int) -> None:
            want = _page_expected(att, entry, view, layer)
            for head in range(4):
                drawn = _painted(shown, f"#answer-heads canvas[data-head='{head}']")
                assert np.array_equal(drawn, want[head]), (view, layer, head)
            mean = shown.page.get_attribute("#answer-share", "data-mean")
            share = np.array(entry["views"][view]["share"]).mean(axis=1)
            np.testing.assert_allclose(np.array(json.loads(mean)), share, atol=1e-12)

        def rerendered(action) -> None:
            n = int(shown.page.get_attribute("#answer-view", "data-renders"))
            action()
            shown.page.wait_for_selector(f"#answer-view[data-renders='{n + 1}']")

        check(0, 0)
        rerendered(lambda: shown.page.click(".answer-word[data-view='2']"))
        assert "row before it" in shown.page.inner_text("#answer-title")
        check(2, 0)
        rerendered(lambda: shown.page.select_option("#answer-layer", "1"))
        check(2, 1)
    finally:
        shown.close()
    assert shown.errors == []
    assert shown.requests == [shown.url], "the page made a request besides its own file"
