"""A picture's page (`show picture --html`, `Attention.to_html()`): the view over the picture
(picture.js) in a real browser, on a tiny DINOv2 with 4 registers (tokens CLS, reg0–reg3,
then 4 × 4 patches): the pixels are the picture under the recorded row's colours, the patch
cells hold that row, hovering and clicking a patch draw its row, the registers are named with
their shares and never drawn in the grid, and the head grid has a panel per head.

`attnviz.attention(...).weights` is the recorded attention, which tests/test_pictures.py holds
equal to the model's eager attention. Screenshots go to tests/artifacts/ (gitignored).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from vision_models import picture

import attnviz
from tests.test_html import ARTIFACTS, Opened, _data, _unpack, _viridis

KIND = "dinov2_with_registers"
FIRST = 5  # CLS, reg0–reg3


@pytest.fixture(scope="module")
def made(vision_dirs, tmp_path_factory):
    """The picture, its attention (attention()) and its page (to_html(), the API's)."""
    root = tmp_path_factory.mktemp("picture-page")
    path = str(picture(root / "photo.png"))
    att = attnviz.attention(path, model=str(vision_dirs[KIND]), device="cpu")
    page = root / "attention.html"
    page.write_text(att.to_html(), encoding="utf-8")
    return att, page


@pytest.fixture
def opened(browser, made):
    shown = Opened(browser, made[1], every_head=False)
    shown.page.wait_for_selector("body[data-picture='ready']")
    yield shown
    shown.close()
    assert shown.errors == []
    assert shown.requests == [shown.url], "the page made a request besides its own file"


def _blend(att, row: np.ndarray, top: float) -> np.ndarray:
    """What the page paints for `row` (over every token) on the scale 0–`top`: each pixel
    round(0.4 · picture + 0.6 · colour), the colour map's entry floor(v / top · 256) of its
    patch's value (matplotlib's pick). (H, W, 3) int."""
    p = att.picture
    index = np.minimum(255, np.floor(p.patches(row).astype(np.float64) / top * 256)).astype(int)
    colours = _viridis()[np.repeat(np.repeat(index, p.patch, 0), p.patch, 1)]
    under = p.pixels[: colours.shape[0], : colours.shape[1]].astype(int)
    return np.floor((2 * under + 3 * colours) / 5 + 0.5).astype(int)  # k/5: never a tie


def _painted(opened, selector: str) -> np.ndarray:
    """A canvas's pixels as its script painted them (getImageData): (H, W, 3) int."""
    width, height, rgba = opened.page.evaluate(
        """(selector) => {
            const c = document.querySelector(selector);
            const all = c.getContext("2d").getImageData(0, 0, c.width, c.height);
            return [c.width, c.height, Array.from(all.data)];
        }""",
        selector,
    )
    return np.array(rgba, dtype=int).reshape(height, width, 4)[..., :3]


def _cells(opened) -> np.ndarray:
    """The patch cells' values, in their grid: (rows, cols) float32."""
    values = opened.page.eval_on_selector_all(".patch-cell", "cs => cs.map((c) => c.dataset.value)")
    return np.array(values, dtype=np.float64).astype(np.float32).reshape(4, 4)


def _percent(*values: np.float32) -> str:
    """Values' sum as the page prints a share: summed in float64 in their order, as the page
    sums them, then one decimal of its percentage."""
    return f"{100 * sum(float(v) for v in values):.1f}%"


def _layer_top(att, layer: int, query: int) -> float:
    """The PNGs' scale: the largest patch value of `query`'s row over the layer's heads."""
    return float(att.weights[layer, :, query, FIRST:].max())


def _rerendered(opened, action) -> None:
    n = int(opened.page.get_attribute("#picture-view", "data-renders"))
    action()
    opened.page.wait_for_selector(f"#picture-view[data-renders='{n + 1}']")


def test_the_picture_under_cls_s_recorded_row(opened, made):
    """The page opens on layer 0, head 0, CLS: its pixels are the picture under that row's
    colours on the PNGs' scale, each cell holds the recorded value of its patch, and the
    registers are named with their shares, outside the 16 cells."""
    import matplotlib

    from attnviz.outputs.figures.pictures import blend

    att, viridis = made[0], matplotlib.colormaps["viridis"]
    ARTIFACTS.mkdir(exist_ok=True)
    opened.page.screenshot(path=str(ARTIFACTS / "picture-page.png"))
    row = att.weights[0, 0, 0]
    assert np.array_equal(_cells(opened), att.picture.patches(row))
    painted = _painted(opened, "#picture")
    assert np.array_equal(painted, _blend(att, row, _layer_top(att, 0, 0)))
    # picture-layer-0.png's head 0 (float colours): within one level of 255
    png = blend(att.picture.pixels, att.picture.patches(row), 8, viridis, _layer_top(att, 0, 0))
    assert np.abs(painted - png.astype(int)).max() <= 1
    assert opened.page.locator(".patch-cell").count() == 16
    outside = opened.page.eval_on_selector_all(
        "#picture-outside tr",
        "rs => rs.map((r) => [r.cells[0].textContent, r.dataset.value, r.cells[1].textContent])",
    )
    assert [name for name, _, _ in outside] == ["CLS", "reg0", "reg1", "reg2", "reg3"]
    assert np.array_equal(np.float32([v for _, v, _ in outside]), row[:FIRST])
    assert [share for _, _, share in outside] == [_percent(v) for v in row[:FIRST]]
    held = opened.page.inner_text("#picture-patches")
    assert f"The 16 patches hold {_percent(*row[FIRST:])} of CLS's attention" in held
    legend = opened.page.inner_text("#picture-legend")
    assert legend.startswith("share of CLS's attention a patch holds: 0")
    assert float(legend.split()[-1]) == pytest.approx(_layer_top(att, 0, 0), rel=5e-3)


def test_hovering_previews_a_patchs_row_and_a_click_pins_it(opened, made):
    att, _ = made
    query = att.picture.index(1, 2)
    cls_row, own_row = att.picture.patches(att.weights[0, 0, 0]), att.weights[0, 0, query]
    opened.page.hover(".patch-cell[data-row='1'][data-col='2']")
    assert np.array_equal(_cells(opened), att.picture.patches(own_row))
    own_top = _layer_top(att, 0, query)
    assert np.array_equal(_painted(opened, "#picture"), _blend(att, own_row, own_top))
    assert "where patch (1, 2) looks (hovered" in opened.page.inner_text("#picture-query")
    tip = opened.page.inner_text("#picture-tip")
    given = re.search(r"CLS → \(1, 2\): ([\d.e-]+)", tip)
    assert float(given.group(1)) == pytest.approx(float(att.weights[0, 0, 0, query]), rel=1e-5)
    opened.page.mouse.move(5, 5)  # off the picture: CLS again
    assert np.array_equal(_cells(opened), cls_row)
    _rerendered(opened, lambda: opened.page.click(".patch-cell[data-row='1'][data-col='2']"))
    opened.page.mouse.move(5, 5)
    assert np.array_equal(_cells(opened), att.picture.patches(own_row))  # pinned: it stays
    assert opened.page.get_attribute("#picture", "data-query") == str(query)
    assert "pinned" in opened.page.get_attribute(".patch-cell >> nth=6", "class")
    _rerendered(opened, lambda: opened.page.click(".patch-cell[data-row='1'][data-col='2']"))
    opened.page.mouse.move(5, 5)
    assert np.array_equal(_cells(opened), cls_row)  # a second click: back to CLS


def test_the_head_grid_has_a_panel_per_head_and_a_click_shows_it(opened, made):
    att, _ = made
    panels = opened.page.locator(".picture-head")
    assert panels.count() == 4
    top = _layer_top(att, 0, 0)  # one scale for the layer's panels, as in the PNGs
    for head in range(4):
        drawn = _painted(opened, f".picture-head[data-head='{head}'] canvas")
        assert np.array_equal(drawn, _blend(att, att.weights[0, head, 0], top)), head
        caption = panels.nth(head).inner_text()
        assert caption == f"H{head} · patches {_percent(*att.weights[0, head, 0, FIRST:])}"
    _rerendered(opened, lambda: panels.nth(2).click())
    assert opened.page.get_attribute("#picture", "data-head") == "2"
    assert np.array_equal(_cells(opened), att.picture.patches(att.weights[0, 2, 0]))
    assert opened.page.get_attribute(".picture-head[data-head='2']", "aria-pressed") == "true"
    _rerendered(opened, lambda: opened.page.select_option("#picture-layer", "1"))
    assert np.array_equal(_cells(opened), att.picture.patches(att.weights[1, 2, 0]))
    reg2 = opened.page.locator("#picture-outside button:text-is('reg2')")
    _rerendered(opened, reg2.click)  # a register's own row, drawn over the patches
    assert np.array_equal(_cells(opened), att.picture.patches(att.weights[1, 2, 3]))


def test_eight_bit_weights_are_shown_with_their_bound(browser, made, tmp_path, monkeypatch):
    """Past the page's float32 budget each head is 8-bit steps of its max: the cells hold the
    stepped values (within max/510 of the recorded ones) and the numbers say "≈" and ±."""
    from attnviz.outputs.html import page

    att, _ = made
    monkeypatch.setattr(page, "EXACT_BUDGET", 0)
    path = tmp_path / "attention.html"
    path.write_text(page.build_page(att), encoding="utf-8")
    data = _data(path.read_text(encoding="utf-8"))
    assert data["encoding"] == "uint8" and data["picture"]["grid"] == [4, 4]
    raw = _unpack(data["weights"][0][0], "u1")
    step = float(raw[:4].view("<f4")[0])
    shown = Opened(browser, path, every_head=False)
    try:
        shown.page.wait_for_selector("body[data-picture='ready']")
        cells = _cells(shown)
        assert np.abs(cells - att.picture.patches(att.weights[0, 0, 0])).max() <= step / 510 + 1e-7
        assert not np.array_equal(cells, att.picture.patches(att.weights[0, 0, 0]))
        text = shown.page.inner_text("#picture-outside")
        assert re.search(r"CLS\s+≈[\d.]+%\s+≈[\d.]+ \(±", text), text
        # the patches' share: 1 less the 5 tokens outside the grid (summing the 16 stepped
        # patch values would drift), so within their bound and never past 100%
        said = shown.page.inner_text("#picture-patches")
        held = float(re.search(r"hold ≈([\d.]+)%", said).group(1))
        exact = 100 * float(att.weights[0, 0, 0, 5:].sum())
        assert held <= 100 and abs(held - exact) <= 100 * 5 * step / 510 + 0.05, said
        assert shown.errors == []
    finally:
        shown.close()


def test_the_page_carries_the_picture_and_a_texts_page_is_as_before(made):
    """The picture travels as the pixels its patches cover; picture.js, blobs.js (its
    decoding) and picture.css come on a picture's page alone (a text's page is the file it
    was), answer.js on a vision-language model's alone."""
    from attnviz.outputs.html.page import _document, page_data

    att, page = made
    html = page.read_text(encoding="utf-8")
    data = _data(html)
    pixels = _unpack(data["picture"]["pixels"], "u1").reshape(32, 32, 3)
    assert np.array_equal(pixels, att.picture.pixels) and data["picture"]["first"] == FIRST
    assert html.count("<script>") == 3 and "function drawPicture" in html
    assert "const attnvizBlobs" in html and "drawAnswer" not in html
    text = _document({"tokens": ["a"]}, "a text")
    assert text.count("<script>") == 1 and "drawPicture" not in text and "picture-frame" not in text
    pooled = page_data(replace(att, pooled=(2, "max")))
    assert "picture" not in pooled and "No view over the picture" in pooled["notes"][-1]
