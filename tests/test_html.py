"""The interactive page: what it carries (Python side) and how it behaves in a real browser.

Browser tests drive Debian's chromium (or $ATTNVIZ_CHROMIUM) through playwright, one browser
for the session (the `browser` fixture in conftest.py, which test_serve.py shares). Off CI
they are skipped, loudly, when chromium or playwright is missing; with CI=true they fail.
Screenshots of every view are kept in tests/artifacts/ (gitignored).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests.conftest import eager

SENTENCE = "The animal didn't cross the street because it was too tired."
ARTIFACTS = Path(__file__).parent / "artifacts"
VIEWS = ("head", "model", "matrix", "query", "inside")


@pytest.fixture(scope="module")
def att(bundled):
    from attnviz.core.extract import extract

    return extract(bundled, SENTENCE)


@pytest.fixture(scope="module")
def inside(att, bundled):
    from attnviz.core.tokens import encode
    from tests.inside_steps import inside_of

    return inside_of(bundled, encode(bundled, SENTENCE))


@pytest.fixture(scope="module")
def page_file(att, inside, tmp_path_factory) -> Path:
    from attnviz.outputs.html import write_page

    return write_page(att, tmp_path_factory.mktemp("page") / "attention.html", inside=inside)


def _data(page: str) -> dict:
    opening = '<script type="application/json" id="attnviz-data">'
    found = re.search(re.escape(opening) + r"(.*?)</script>", page, re.S)
    return json.loads(found.group(1))


def _unpack(blob: str, dtype: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(blob)), dtype=dtype)


# ---------- the file itself ----------


def test_page_is_self_contained_with_a_strict_policy(page_file):
    page = page_file.read_text(encoding="utf-8")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp and "connect-src" not in csp
    # The only script allowed is the inlined page.js, by its hash; the data block is JSON.
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert "fetch(" not in script and "XMLHttpRequest" not in script and "import(" not in script
    assert not re.search(r"(src|href)=", page), "no element may point at another file"
    assert not re.search(r"https?://", page)
    assert len(page.encode()) < 1_500_000


def test_weights_in_the_page_are_the_models_float32(page_file, att):
    data = _data(page_file.read_text(encoding="utf-8"))
    assert data["encoding"] == "float32" and data["tokens"] == list(att.tokens)
    grid = _unpack(data["weights"][3][7], "<f4").reshape(len(att.tokens), -1)
    assert np.array_equal(grid, att.weights[3, 7])


def test_inside_steps_are_mha_and_match_the_model(inside, att, bundled):
    from attnviz.core import capture, families
    from attnviz.core.mha import multi_head_attention

    assert inside.errors.max() < 1e-5
    # q_h of head 2 is exactly columns 2·d_k… of X W_Q + b_Q, as multi_head_attention takes it.
    weights = families.layer_weights(bundled.model, 1)
    d_k = inside.q.shape[-1]
    from attnviz.core.tokens import encode, pad

    seen = {}
    recorder = capture.Each([1], ("input",), seen.__setitem__)
    capture.run(bundled, pad(bundled, [encode(bundled, SENTENCE)]), [recorder])
    x = seen[1]["input"].double()
    expected = (x @ weights.w_q.double() + weights.b_q.double())[0, :, 2 * d_k : 3 * d_k]
    assert np.allclose(inside.q[1, 2], expected.numpy(), atol=1e-5)
    # The softmax of our own q and k reproduces the model's probabilities.
    scores = inside.q[4, 5].astype(np.float64) @ inside.k[4, 5].T.astype(np.float64) / np.sqrt(d_k)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert np.abs(probs - att.weights[4, 5]).max() < 1e-5
    ours = multi_head_attention(x, weights.to_cpu())
    assert np.allclose(ours.probs[0, 5].numpy(), att.weights[1, 5], atol=1e-5)


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_long_text_page_is_quantised_small_and_says_so(bundled):
    from attnviz.core.extract import extract
    from attnviz.core.tokens import encode
    from attnviz.outputs.html import build_page
    from tests.inside_steps import inside_of

    long = extract(bundled, _long_text(), truncate=True)
    assert long.weights.shape[-1] == 512
    left_out = inside_of(bundled, encode(bundled, _long_text(), truncate=True))
    assert isinstance(left_out, str) and "MiB" in left_out
    page = build_page(long, inside=left_out)
    data = _data(page)
    assert len(page.encode()) <= 8 * 2**20
    assert data["encoding"] == "uint8" and "left out" in data["inside_note"]
    raw = _unpack(data["weights"][2][4], "u1")
    top = raw[:4].view("<f4")[0]
    grid = raw[4:].reshape(512, 512) * (top / 255)
    assert np.abs(grid - long.weights[2, 4]).max() <= top / 510 + 1e-7


def _long_text() -> str:
    corpus = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
    return " ".join(corpus.read_text(encoding="utf-8").split("\n"))


# ---------- CLI and API ----------


def test_show_html_without_images_writes_only_the_page(tmp_path):
    result = CliRunner().invoke(
        app, ["show", SENTENCE, "--no-images", "--html", "-o", str(tmp_path), "--scale", "head"]
    )
    assert result.exit_code == 0, result.output
    (folder,) = tmp_path.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["attention.html", "done.json"]
    assert "attention.html" in result.output.replace("\n", "")
    data = _data((folder / "attention.html").read_text(encoding="utf-8"))
    assert data["scale"] == "head" and data["inside"] is not None
    done = json.loads((folder / "done.json").read_text())
    assert done["record"]["files"] == [f"{folder.name}/attention.html"]


def test_export_html_writes_one_page_per_sentence(tmp_path):
    args = ["export", "One cat.", "Two dogs barked.", "--html", "--figures", "overview"]
    result = CliRunner().invoke(app, [*args, "--words", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    pages = sorted(tmp_path.glob("*/attention.html"))
    assert len(pages) == 2
    data = _data(pages[1].read_text(encoding="utf-8"))
    assert data["unit"] == "word"
    assert data["tokens"] == ["[CLS]", "Two", "dogs", "barked", ".", "[SEP]"]


def test_api_to_html_is_the_same_builder(bundled):
    att = attnviz.attention(SENTENCE, device="cpu")
    page = att.to_html()
    assert _data(page)["inside"]["tokens"] == list(att.tokens)  # the inside view is there
    assert page.startswith("<!doctype html>") and _data(page)["tokens"] == list(att.tokens)
    frame = att._repr_mimebundle_()["text/html"]  # the notebook's: the weights alone
    assert frame.startswith("<iframe srcdoc=") and "sandbox=" in frame


# ---------- in a real browser ----------


class Opened:
    """A page opened in the browser, recording console errors and every request."""

    def __init__(self, browser, path: Path, width: int = 1300, every_head: bool = True):
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        # A generous wait, not a speed test (bench/bench_html.py times the page).
        self.page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        # The head view opens on the layer's most focused head; most tests read every head's
        # lines, as a reader does after one click on "all".
        if every_head and self.page.locator(".head-toggle").count():
            n = self.renders()
            self.page.click("button:text-is('all')")
            self.settle(n + 1)

    def view(self, name: str) -> None:
        self.page.click(f"#tab-{name}")
        self.page.wait_for_selector(f"section#view-{name}")

    def settle(self, renders: int) -> None:
        self.page.wait_for_selector(f"body[data-renders='{renders}']")

    def renders(self) -> int:
        return int(self.page.get_attribute("body", "data-renders"))

    def pixels(self, selector: str) -> np.ndarray:
        import io

        from PIL import Image

        png = self.page.locator(selector).first.screenshot()
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)

    def canvas(self, selector: str, points: list[tuple[int, int]]) -> np.ndarray:
        """The RGB of a canvas at (x, y) points, read back from it (getImageData): what its
        script painted, before any scaling on screen. (points, 3) int."""
        rgb = self.page.evaluate(
            """([selector, points]) => {
                const ctx = document.querySelector(selector).getContext("2d");
                const rgb = ([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3));
                return points.map(rgb);
            }""",
            [selector, points],
        )
        return np.array(rgb, dtype=int)

    def clipped(self, selector: str) -> list[str]:
        """Elements under `selector` (itself included) that hide part of their content: a box
        with overflow other than visible whose content is wider or taller than the box."""
        return self.page.evaluate(
            """(selector) => [...document.querySelectorAll(`${selector}, ${selector} *`)]
                .filter((e) => {
                    const s = getComputedStyle(e);
                    const clips = s.overflowX !== "visible" || s.overflowY !== "visible";
                    const wide = e.scrollWidth > e.clientWidth + 1;
                    return clips && (wide || e.scrollHeight > e.clientHeight + 1);
                })
                .map((e) => `${e.tagName}.${e.className}: ${e.textContent.slice(0, 40)}`)""",
            selector,
        )

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def opened(browser, page_file):
    page = Opened(browser, page_file)
    yield page
    page.close()
    assert page.errors == []
    assert page.requests == [page.url], "the page made a request besides its own file"


def test_the_page_opens_on_its_fragment_and_keeps_it(browser, page_file, att):
    """A link names the view, layer, head and query: the page opens there and keeps the
    fragment current; without one, the head view shows the first layer's most focused head
    (the largest mean of its rows' largest weights), the others a click away."""
    opened = Opened(browser, page_file, every_head=False)
    try:
        pressed = opened.page.locator(".head-toggle[aria-pressed='true']").all_inner_texts()
        focus = att.weights[0].max(axis=-1).mean(axis=-1)  # (H,)
        assert pressed == [str(int(np.argmax(focus)))]
        assert "view=head&layer=0" in opened.page.url
    finally:
        opened.close()
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    try:
        page.goto(page_file.resolve().as_uri() + "#view=matrix&layer=3&head=1&query=5")
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        assert page.input_value("#layer") == "3" and page.input_value("#head") == "1"
        page.select_option("#head", "2")
        for _ in range(100):  # the page's CSP forbids evaluated strings: poll from here
            if "head=2" in page.url:
                break
            page.wait_for_timeout(50)
        assert "view=matrix&layer=3&head=2&query=5" in page.url
    finally:
        page.close()


def test_every_view_draws_without_errors_or_requests(opened):
    ARTIFACTS.mkdir(exist_ok=True)
    regions = {
        "head": "#lines",
        "model": ".model-grid",
        "matrix": "#matrix",
        "query": ".query-table",
        "inside": ".inside-table",
    }
    for name in VIEWS:
        opened.view(name)
        if name == "head":
            opened.page.hover(".tokens.q .token >> nth=10")  # "it"
        if name == "matrix":
            box = opened.page.locator("#matrix-over").bounding_box()
            opened.page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.35)
        opened.page.screenshot(path=str(ARTIFACTS / f"view-{name}.png"))
        region = opened.pixels(regions[name])
        # Not blank: the drawn region has many colours and a real spread of brightness.
        assert len(np.unique(region.reshape(-1, 3), axis=0)) > 20, name
        assert region.std() > 10, name


def _viridis() -> np.ndarray:
    """The colour map's 256 colours as matplotlib has them: (256, 3) int."""
    import matplotlib

    return matplotlib.colormaps["viridis"](range(256), bytes=True)[:, :3].astype(int)


def _cell_centres(n: int, size: int) -> list[tuple[int, int]]:
    """The canvas pixel at the centre of each cell of an n × n heatmap `size` px wide, in
    row-major [query, key] order: (x, y) = (key, query)."""
    cell = size / n
    return [(int((k + 0.5) * cell), int((q + 0.5) * cell)) for q in range(n) for k in range(n)]


def _expected_colours(grid: np.ndarray) -> np.ndarray:
    """Each cell's colour on the 0–1 scale: the map's entry round(weight × 255). (T·T, 3)"""
    index = np.minimum(255, np.floor(grid.astype(np.float64) * 255 + 0.5)).astype(int)
    return _viridis()[index.ravel()]


def test_matrix_pixels_are_the_weights_in_place(opened, att):
    """Issue 25: drawn transposed (`a[j*T+i]`), every count-based test passed. The pixels read
    back from the canvas must be each cell's own weight: query down, key across. Layer 0
    head 2 looks at the previous token, so a transposed matrix differs in most cells."""
    opened.view("matrix")
    n = opened.renders()
    opened.page.select_option("#head", "2")
    opened.settle(n + 1)
    grid = att.weights[0, 2]  # (T, T) [query, key]
    size = int(opened.page.get_attribute("#matrix", "width"))
    drawn = opened.canvas("#matrix", _cell_centres(len(att.tokens), size))
    assert (drawn == _expected_colours(grid)).all(axis=1).all()
    # The brightest cell of each row is that query's strongest key.
    lut = _viridis()
    index = np.abs(drawn[:, None, :] - lut[None]).sum(-1).argmin(-1).reshape(grid.shape)
    assert (index.argmax(axis=1) == grid.argmax(axis=1)).all()
    assert not np.array_equal(grid.argmax(axis=1), grid.argmax(axis=0))  # asymmetric enough


@pytest.mark.slow  # a page of its own in the real browser
def test_measure_switch_paints_each_measure_in_place(browser, bundled, tmp_path):
    """The page's measure switch: the matrix view's pixels are ALTI's composed map of the
    chosen layer, then norm's α·‖f(x)‖ of a head on the scale of the text's largest value."""
    from attnviz.analysis.contributions import EveryMeasure
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode
    from attnviz.outputs.html import write_page

    encoded = encode(bundled, SENTENCE)
    every = EveryMeasure(bundled, list(range(6)), [encoded], "weights")
    att = attend(bundled, [encoded], also=list(every.recorders.values()))[0]
    found = every.page(att, att, lambda a: a)
    path = write_page(
        found.weights, tmp_path / "measures.html", measures=found.others, lengths=found.lengths
    )
    opened = Opened(browser, path)
    try:
        opened.view("matrix")
        n = opened.renders()
        opened.page.select_option("#measure", "alti")
        opened.settle(n + 1)
        assert opened.page.locator("#head").count() == 0  # one map a layer: no head to choose
        opened.page.select_option("#layer", "5")
        opened.settle(n + 2)
        size = int(opened.page.get_attribute("#matrix", "width"))
        centres = _cell_centres(len(att.tokens), size)
        alti = found.others["alti"].weights[5, 0]
        assert (opened.canvas("#matrix", centres) == _expected_colours(alti)).all()
        assert "ALTI contribution: 0" in opened.page.inner_text("#view-matrix .legend")
        opened.page.select_option("#measure", "norm")
        opened.settle(n + 3)
        norm = found.others["norm"]
        drawn = opened.canvas("#matrix", centres)
        expected = _expected_colours(norm.weights[5, 0] / norm.weights.max())
        # the page multiplies float32 weights by float32 lengths: a colour step at most
        assert (np.abs(drawn - expected).max(axis=1) <= 8).all()
        assert (drawn == expected).all(axis=1).mean() > 0.95
        opened.view("head")
        opened.page.select_option("#measure", "rollout")
        assert "one map per layer" in opened.page.inner_text("#view-head")
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()


def test_encoder_views_have_a_colour_legend_without_masked_cells(opened):
    for view in ("model", "matrix"):
        opened.view(view)
        legend = opened.page.locator(f"#view-{view} .legend")
        assert legend.count() == 1 and "attention weight: 0" in legend.inner_text()
        bar = opened.canvas(f"#view-{view} .legend-bar", [(x, 7) for x in (0, 128, 255)])
        assert (bar == _viridis()[[0, 128, 255]]).all()
        assert opened.page.locator(f"#view-{view} .legend .masked").count() == 0


def test_switching_layer_head_and_view_changes_what_is_drawn(opened):
    before = opened.pixels("#lines")
    n = opened.renders()
    opened.page.keyboard.press("ArrowDown")  # layer 0 -> 1
    opened.settle(n + 1)
    assert opened.page.input_value("#layer") == "1"
    assert np.abs(opened.pixels("#lines") - before).sum() > 0
    opened.view("matrix")
    first = opened.pixels("#matrix")
    n = opened.renders()
    opened.page.select_option("#head", "8")
    opened.settle(n + 1)
    assert np.abs(opened.pixels("#matrix") - first).mean() > 1
    opened.view("model")
    opened.page.click(".thumb[data-layer='2'][data-head='9']")
    opened.page.wait_for_selector("section#view-matrix")
    assert opened.page.input_value("#layer") == "2" and opened.page.input_value("#head") == "9"


def test_hovering_a_token_keeps_only_its_lines(opened, att):
    everything = int(opened.page.get_attribute("#lines", "data-lines"))
    query = att.tokens.index("it")
    opened.page.hover(f".tokens.q .token >> nth={query}")
    only = int(opened.page.get_attribute("#lines", "data-lines"))
    # Exactly the lines of that query with visible weight (≥ 1/64) in the 12 heads of layer 0.
    assert only == int((att.weights[0, :, query] >= 1 / 64).sum())
    assert 0 < only < everything
    opened.page.hover(".tokens.k .token >> nth=2")
    assert int(opened.page.get_attribute("#lines", "data-lines")) == int(
        (att.weights[0, :, :, 2] >= 1 / 64).sum()
    )


def test_head_toggles_choose_whose_lines_are_drawn(opened, att):
    visible = att.weights[0] >= 1 / 64  # (H, T, T)
    n = opened.renders()
    opened.page.click(".head-toggle[data-head='0']")  # head 0 off
    opened.settle(n + 1)
    assert opened.page.get_attribute(".head-toggle[data-head='0']", "aria-pressed") == "false"
    assert int(opened.page.get_attribute("#lines", "data-lines")) == int(visible[1:].sum())
    opened.page.dblclick(".head-toggle[data-head='7']")  # only head 7
    opened.settle(n + 4)  # its two clicks toggle head 7 off and on, then the double-click
    pressed = opened.page.locator(".head-toggle[aria-pressed='true']").all_inner_texts()
    assert pressed == ["7"]
    assert int(opened.page.get_attribute("#lines", "data-lines")) == int(visible[7].sum())


def test_tooltip_shows_the_exact_weight(opened, att):
    opened.view("matrix")
    n = opened.renders()
    opened.page.select_option("#layer", "4")
    opened.settle(n + 1)
    opened.page.select_option("#head", "3")
    opened.settle(n + 2)
    size = len(att.tokens)
    box = opened.page.locator("#matrix-over").bounding_box()
    for query, key in [(10, 2), (0, 0), (size - 1, 5)]:
        x = box["x"] + (key + 0.5) * box["width"] / size
        y = box["y"] + (query + 0.5) * box["height"] / size
        opened.page.mouse.move(x, y)
        weight = opened.page.locator("#tooltip .weight")
        assert weight.get_attribute("data-query") == str(query)
        assert weight.get_attribute("data-key") == str(key)
        shown = float(weight.inner_text().split()[-1])
        assert shown == pytest.approx(float(att.weights[4, 3, query, key]), rel=1e-5, abs=1e-9)
        assert att.tokens[query] in opened.page.inner_text("#tooltip")


def test_inside_view_prints_the_cross_check(opened, inside):
    opened.view("inside")
    n = opened.renders()
    opened.page.select_option("#layer", "2")
    opened.settle(n + 1)
    opened.page.select_option("#query", "10")
    opened.settle(n + 2)
    q = [float(v) for v in opened.page.inner_text("#inside-q").split()]
    assert np.allclose(q, inside.q[2, 0, 10], atol=5e-4)
    checks = opened.page.locator(".check").all_inner_texts()
    errors = [float(v) for text in checks for v in re.findall(r"\d\.\d+e[+-]\d+", text)]
    assert len(errors) == 3 and max(errors) < 1e-5
    assert errors[0] == pytest.approx(inside.errors[2, 0, 10], rel=0.01)


def test_inside_view_cuts_no_number(opened, inside):
    """k_h and v_h (32 numbers each) used to sit in scrolling cells that cut numbers in half:
    each cell now shows whole numbers, the first six of the vector, then "… 26 more", and
    holds all 32 in its tooltip; nothing in the view hides part of its content."""
    opened.view("inside")
    n = opened.renders()
    opened.page.select_option("#layer", "2")
    opened.settle(n + 1)
    opened.page.select_option("#query", "10")
    opened.settle(n + 2)
    assert opened.clipped("#view-inside") == []
    rows = opened.page.locator(".inside-table tr").all()[1:]  # after the heading row
    assert len(rows) == len(inside.tokens)
    d_k = inside.k.shape[-1]
    for j, row in enumerate(rows):
        cells = row.locator("td.vec").all()
        for cell, vectors in zip(cells, (inside.k, inside.v)):  # k_h, v_h
            expected = vectors[2, 0, j]  # (d_k,) float32
            shown, more = cell.inner_text().split("…")
            assert [float(v) for v in shown.split()] == [round(float(x), 3) for x in expected[:6]]
            assert more.strip() == f"{d_k - 6} more"
            every = [float(v) for v in cell.get_attribute("title").split()]
            assert np.allclose(every, expected, atol=5e-4) and len(every) == d_k


def test_512_token_page_stays_interactive_labelled_and_unclipped(browser, bundled, tmp_path):
    from attnviz.core.extract import extract
    from attnviz.outputs.html import write_page

    long = extract(bundled, _long_text(), truncate=True)
    path = write_page(long, tmp_path / "long.html")
    assert path.stat().st_size <= 8 * 2**20
    opened = Opened(browser, path)
    try:
        # The header shows the start of the 6,000-character text, whole lines, nothing cut.
        assert opened.clipped("header") == []
        header, tabs = (opened.page.locator(s).bounding_box() for s in ("header", "nav"))
        assert header["y"] + header["height"] <= tabs["y"]
        assert header["height"] < 300
        opened.page.click("header button.more")
        assert opened.page.inner_text("header .text .body") == long.text
        assert opened.clipped("header") == []
        opened.page.click("header button.more")

        opened.view("model")
        opened.view("matrix")
        labels = _matrix_labels(opened, long.tokens)
        assert 10 <= len(labels) <= 40
        opened.page.mouse.move(*_centre(opened.page.locator("#matrix-over").bounding_box()))
        text = opened.page.inner_text("#tooltip .weight")
        assert "≈" in text and "±" in text
        query = int(opened.page.get_attribute("#tooltip .weight", "data-query"))
        key = int(opened.page.get_attribute("#tooltip .weight", "data-key"))
        assert opened.page.inner_text(".row-labels .hover") == f"{query}: {long.tokens[query]}"
        assert opened.page.inner_text(".col-labels .hover") == f"{key}: {long.tokens[key]}"
        opened.view("head")
        opened.page.hover(".tokens.q .token >> nth=100")
        assert 0 < int(opened.page.get_attribute("#lines", "data-lines")) <= 12 * 64
        opened.page.screenshot(path=str(ARTIFACTS / "long-head.png"))
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()


def _matrix_labels(opened: Opened, tokens: tuple[str, ...]) -> list[int]:
    """The matrix view's row and column labels: each names its token and position ("40:
    fox"), sits on that token's row (column), is at least 11 px and overlaps no other; the
    labelled positions are regular steps from 0. Returns them."""
    frame = opened.page.locator("#matrix").bounding_box()
    cell = frame["height"] / len(tokens)
    found = opened.page.evaluate(
        """() => ["row", "col"].map((side) => [
            ...document.querySelectorAll(`.${side}-labels div:not(.hover)`)].map((e) => {
                const r = e.getBoundingClientRect();
                return [e.textContent, +e.dataset.index, parseFloat(getComputedStyle(e).fontSize),
                        r.left, r.top, r.right, r.bottom]; }))"""
    )
    rows, cols = found
    assert [r[1] for r in rows] == [c[1] for c in cols]
    positions = [r[1] for r in rows]
    step = positions[1] - positions[0]
    assert positions == list(range(0, len(tokens), step))
    for side, labels in (("row", rows), ("col", cols)):
        for text, i, font, _, top, _, bottom in labels:
            assert text == f"{i}: {tokens[i][:15] + '…' if len(tokens[i]) > 16 else tokens[i]}"
            assert font >= 11
            if side == "row":  # centred on its row
                assert abs((top + bottom) / 2 - (frame["y"] + (i + 0.5) * cell)) < 2
        boxes = [label[3:] for label in labels]
        for a, b in zip(boxes, boxes[1:]):
            if side == "row":
                assert b[1] >= a[3], (a, b)  # the next row's label starts below this one
            else:  # rotated labels: the next starts to the right of this one's foot
                assert b[0] > a[0] + 8, (a, b)
    return positions


def _centre(box: dict) -> tuple[float, float]:
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


# ---------- sentence pairs ----------

PAIR = ("The cat sat on the mat.", "It was very happy there.")


def test_pair_feeds_token_types_and_marks_segments(bundled):
    import torch

    from attnviz.core.extract import extract

    att = extract(bundled, PAIR[0], pair=PAIR[1])
    sep = att.tokens.index("[SEP]")
    assert att.segments == (0,) * (sep + 1) + (1,) * (len(att.tokens) - sep - 1)
    enc = bundled.tokenizer(*PAIR, return_tensors="pt")
    assert enc["token_type_ids"].sum() > 0
    with torch.inference_mode(), eager(bundled.model):
        out = bundled.model(**enc, output_attentions=True)
    expected = torch.stack(out.attentions, dim=1)[0].numpy()  # (L, H, T, T)
    assert np.abs(att.weights - expected).max() < 1e-5  # recomputed from X (SDPA ran)


def test_pair_refused_for_a_decoder(tiny_model_dirs):
    args = ["show", "A cat.", "--pair", "A dog.", "-m", str(tiny_model_dirs["gpt2"])]
    result = CliRunner().invoke(app, [*args, "--no-images"])
    assert result.exit_code == 2 and "decoder" in result.output


def test_empty_pair_is_refused_before_any_folder_is_made(tmp_path):
    args = ["show", "A cat.", "--pair", "  ", "--html", "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--pair sentence is empty" in result.output
    assert not (tmp_path / "out").exists()


def test_pair_page_restricts_to_a_to_b(browser, bundled, tmp_path):
    from attnviz.core.extract import extract
    from attnviz.outputs.html import write_page

    att = extract(bundled, PAIR[0], pair=PAIR[1])
    path = write_page(att, tmp_path / "pair.html", segments=att.segments)
    opened = Opened(browser, path)
    try:
        seg = np.array(att.segments)
        n = opened.renders()
        opened.page.select_option("#pair", "AB")
        opened.settle(n + 1)
        a_to_b = (seg[:, None] == 0) & (seg[None, :] == 1)  # (query, key)
        visible = (att.weights[0] >= 1 / 64) & a_to_b  # (H, T, T)
        assert int(opened.page.get_attribute("#lines", "data-lines")) == int(visible.sum())
        opened.page.screenshot(path=str(ARTIFACTS / "pair-a-to-b.png"))
        heading = opened.page.locator("header .text").all_inner_texts()
        assert heading == [f"A {PAIR[0]}", f"B {PAIR[1]}"]
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()


def test_pair_page_title_names_both_sentences(bundled):
    from attnviz.core.extract import extract
    from attnviz.outputs.html import build_page

    att = extract(bundled, PAIR[0], pair=PAIR[1])
    title = re.search(r"<title>(.*?)</title>", build_page(att)).group(1)
    assert title == f"attnviz: A: {PAIR[0]} | B: {PAIR[1]}"
    assert _data(build_page(att))["pair"] == PAIR[1]
    a = "The committee, after considerable debate, approved the budget on Tuesday morning."
    b = "Paris is the capital of France, and Berlin is the capital of Germany since 1990."
    long = extract(bundled, a, pair=b)
    title = re.search(r"<title>(.*?)</title>", build_page(long)).group(1)
    # Each sentence cut to 45 characters at the last whole word, with "…" (counted by hand:
    # "debate, ap|proved" and "Berlin i|s" are where 44 characters end).
    assert title == (
        "attnviz: A: The committee, after considerable debate… | "
        "B: Paris is the capital of France, and Berlin…"
    )


def test_decoder_page_draws_later_keys_as_masked(browser, loaded_tiny, tmp_path):
    """A causal model's keys after the query: hatched grey in the matrix and the model view
    (not the colour of 0), said in both views' legends; every other cell is its weight."""
    from attnviz.core.extract import extract
    from attnviz.outputs.html import write_page

    att = extract(loaded_tiny["gpt2"], "The cat sat on the mat and the dog sat on the log.")
    n = len(att.tokens)
    path = write_page(att, tmp_path / "decoder.html")
    opened = Opened(browser, path)
    masked = {(160, 160, 160), (255, 255, 255)}  # MASKED_GREY and its white hatching
    try:
        opened.view("matrix")
        size = int(opened.page.get_attribute("#matrix", "width"))
        grid = att.weights[0, 0]  # (T, T) [query, key]
        drawn = opened.canvas("#matrix", _cell_centres(n, size)).reshape(n, n, 3)
        expected = _expected_colours(grid).reshape(n, n, 3)
        later = np.triu(np.ones((n, n), bool), k=1)  # key after query
        for q in range(n):
            for k in range(n):
                if later[q, k]:
                    assert tuple(drawn[q, k]) in masked, (q, k)
                else:
                    assert (drawn[q, k] == expected[q, k]).all(), (q, k)
        every = opened.canvas(
            "#matrix", [(x, y) for y in range(0, size, 7) for x in range(0, size, 5)]
        )
        assert {(255, 255, 255), (160, 160, 160)} <= {tuple(c) for c in every}  # hatched
        for view in ("matrix", "model"):
            opened.view(view)
            key = opened.page.locator(f"#view-{view} .legend .masked")
            assert "masked" in key.inner_text() and "later keys" in key.inner_text()
            swatch = {tuple(c) for c in opened.canvas(f"#view-{view} .legend .masked canvas",
                                                      [(x, 7) for x in range(14)])}  # fmt: skip
            assert swatch == masked
        thumb = ".thumb[data-layer='1'][data-head='3']"
        corner = opened.canvas(thumb, [(70, 3), (3, 70)])  # upper right masked, lower left not
        assert tuple(corner[0]) in masked and tuple(corner[1]) not in masked
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()


def test_page_without_the_inside_view_says_why(att, bundled, monkeypatch):
    from attnviz.core import families
    from attnviz.core.tokens import encode
    from attnviz.errors import UnsupportedModelError
    from attnviz.outputs.html import build_page
    from tests.inside_steps import inside_of

    def refuse(model, layer, stack=None):
        raise UnsupportedModelError("check does not know how to read 'x' attention")

    monkeypatch.setattr(families, "layer_weights", refuse)
    reason = inside_of(bundled, encode(bundled, SENTENCE))
    assert reason == "left out: check does not know how to read 'x' attention"
    data = _data(build_page(att, inside=reason))
    assert data["inside"] is None and data["inside_note"] == reason


@pytest.mark.parametrize("arch", ["llama", "gemma2", "phi3", "albert", "gpt2"])
def test_inside_steps_match_every_architecture(loaded_tiny, arch):
    """RoPE, grouped K/V heads, Gemma2's cap, Phi-3's partial RoPE, ALBERT's shared layers."""
    from attnviz.analysis.inside import Inside
    from attnviz.core.extract import extract
    from attnviz.core.tokens import encode
    from tests.inside_steps import inside_of

    loaded = loaded_tiny[arch]
    encoded = encode(loaded, "The cat sat on the mat.")
    inside = inside_of(loaded, encoded)
    assert isinstance(inside, Inside)
    assert inside.q.shape[:3] == (loaded.info.n_layers, loaded.info.n_heads, len(encoded))
    assert inside.errors.max() < 1e-5
    att = extract(loaded, "The cat sat on the mat.")
    assert inside.tokens == att.tokens


def test_page_of_chosen_layers_names_them(tmp_path):
    args = ["show", SENTENCE, "-l", "2", "-l", "4", "--no-images", "--html", "-o", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = _data(next(tmp_path.glob("*/attention.html")).read_text(encoding="utf-8"))
    assert data["layers"] == 2 and data["layer_ids"] == [2, 4]
    assert len(data["inside"]["q"]) == 6  # the inside view keeps every layer


def test_decoder_page_recomputes_the_models_softmax(browser, loaded_tiny, tmp_path):
    """Gemma2's own scale and soft cap, a sliding window, RoPE and grouped K/V heads: the
    page's softmax of mha.py's q and k still gives the model's weights."""
    from attnviz.core.extract import extract
    from attnviz.core.tokens import encode
    from attnviz.outputs.html import write_page
    from tests.inside_steps import inside_of

    loaded = loaded_tiny["gemma2"]
    text = "The cat sat on the mat and the dog sat on the log."
    att = extract(loaded, text)
    path = write_page(att, tmp_path / "gemma2.html", inside=inside_of(loaded, encode(loaded, text)))
    opened = Opened(browser, path)
    try:
        opened.view("inside")
        for layer in ("0", "1"):
            n = opened.renders()
            opened.page.select_option("#layer", layer)
            opened.settle(n + 1)
            n = opened.renders()
            opened.page.select_option("#query", str(len(att.tokens) - 1))
            opened.settle(n + 1)
            checks = " ".join(opened.page.locator(".check").all_inner_texts())
            errors = [float(v) for v in re.findall(r"\d\.\d+e[+-]\d+", checks)]
            assert len(errors) == 3 and max(errors) < 1e-5, checks
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()


# ---------- heads removed by show --ablate ----------


@pytest.mark.slow  # an ablated pass, then the page in the real browser
def test_a_removed_head_is_marked_in_every_view_and_drawn_in_none(browser, tmp_path):
    """Issue 31: `show --html --ablate 0.2` drew L0 H2's pattern in the page as if it were one.
    Every view now marks it (the hatched panel, "removed") and draws none of its weights;
    the other heads are drawn as before."""
    args = ["show", SENTENCE, "--ablate", "0.2", "--no-images", "--html", "-o", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    path = next(tmp_path.glob("*/attention.html"))
    data = _data(path.read_text(encoding="utf-8"))
    assert data["removed"]["heads"] == [[0, 2]]
    n = len(data["tokens"])
    weights = np.stack([_unpack(blob, "<f4").reshape(n, n) for blob in data["weights"][0]])
    hatched = {(255, 255, 255), (200, 200, 200)}  # white and REMOVED_HATCH_COLOUR
    opened = Opened(browser, path)
    try:
        # Head view: H2's toggle is marked, and the lines are the other heads' alone.
        assert "removed" in opened.page.get_attribute(".head-toggle[data-head='2']", "class")
        kept = [h for h in range(12) if h != 2]
        lines = int(opened.page.get_attribute("#lines", "data-lines"))
        assert lines == int((weights[kept] >= 1 / 64).sum())
        assert int((weights[2] >= 1 / 64).sum()) > 0  # it had lines to hide
        assert "H2: removed (--ablate)" in opened.page.inner_text("#view-head")
        # Model view: its thumbnail is the hatched panel (its corners hold no colour of the
        # colour map), its neighbour a heatmap; the legend names the panel.
        opened.view("model")
        corners = [(x, y) for x in (1, 2, 3, 4, 70, 71, 72, 73) for y in (1, 2, 3, 70, 71, 72)]
        thumb = ".thumb[data-layer='0'][data-head='{}']"
        assert {tuple(c) for c in opened.canvas(thumb.format(2), corners)} <= hatched
        assert opened.page.get_attribute(thumb.format(2), "data-removed") == "1"
        assert not {tuple(c) for c in opened.canvas(thumb.format(3), corners)} <= hatched
        assert "removed (--ablate)" in opened.page.inner_text("#view-model .legend")
        # Matrix view of L0 H2: the panel, no hover layer, not one weight's colour.
        opened.page.click(thumb.format(2))
        opened.page.wait_for_selector("section#view-matrix")
        size = int(opened.page.get_attribute("#matrix", "width"))
        every = opened.canvas(
            "#matrix", [(x, y) for y in range(0, size, 37) for x in (5, size - 5)]
        )
        assert {tuple(c) for c in every} <= hatched
        assert opened.page.locator("#matrix-over").count() == 0
        assert "its weights are not drawn" in opened.page.inner_text("#view-matrix")
        # Query view: its cell says removed and lists no key.
        opened.view("query")
        cell = opened.page.locator(".query-table tr >> nth=1").locator("td >> nth=2")
        assert cell.inner_text() == "removed" and cell.locator(".key").count() == 0
        # Inside one head: the steps are there, under a note that the head was removed.
        opened.view("inside")
        n_renders = opened.renders()
        opened.page.select_option("#head", "2")
        opened.settle(n_renders + 1)
        assert "was removed (--ablate)" in opened.page.inner_text("#view-inside")
        opened.page.screenshot(path=str(ARTIFACTS / "removed-inside.png"))
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()
