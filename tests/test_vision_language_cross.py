"""Mllama's cross-attention over the picture (issue 54 item 2): its cross-attention layers,
read in the run's passes by attnviz's attention function, equal the model's eager attention
(the prompt, each generated step, a target; a picture cut into two tiles, one with an empty
tile, one whose second tile is part padding); each key sits on the cell of the picture its
processor cut it from (a bright patch moves the key the map names); the figures over the
picture are the eager rows on their cells; `show` writes and prints them."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import eager, input_of, picture, save

from attnviz.cli import app

PROMPT = "What is on the table?"
# (width, height): two tiles side by side; one tile and an empty one; two, the second part
# padding (the picture resized to 43 × 28 on a canvas of 56 × 28)
SIZES = {"wide": (128, 64), "square": (64, 64), "padded": (100, 64)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save("mllama", tmp_path_factory.mktemp("mllama") / "mllama")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("pictures")
    return {name: picture(root / f"{name}.png", size, seed=n)
            for n, (name, size) in enumerate(SIZES.items())}  # fmt: skip


def _run(folder, path, how):
    """`show`'s reader over the picture and the prompt (with its answer, `how`): the run,
    whose `cross` is the cross-attention layers as attnviz read them."""
    from attnviz.core.settings import Load
    from attnviz.pipelines import readers
    from attnviz.pipelines.consumers.pictures import Pictures
    from attnviz.pipelines.request import ShowRequest

    asked = {"prompt": {}, "generate": {"generate": 3}, "target": {"target": "A cat"},
             "eager": {"generate": 3}}[how]  # fmt: skip
    load = Load(str(folder), implementation="eager" if how == "eager" else "sdpa")
    request = ShowRequest(load, text=PROMPT, picture=path, prompt=PROMPT, images=False, **asked)
    return readers.run(request, [Pictures(request)])


@pytest.fixture(scope="module")
def answered(folder, photos):
    """The wide picture's answer of three written tokens, and the eager cross rows."""
    run = _run(folder, photos["wide"], "generate")
    return run.cross, eager(folder, list(run.encoded.ids), run.encoded.inputs, cross=True)


@pytest.mark.parametrize("name,how", [("wide", "prompt"), ("wide", "generate"),
                                      ("wide", "target"), ("square", "generate"),
                                      ("square", "eager"), ("padded", "prompt")])  # fmt: skip
def test_the_cross_layers_equal_the_models_eager_attention(folder, photos, name, how):
    """Every cross-attention row, the prompt's and each written (or given) token's, equals
    the model's eager one within 1e-5 and sums to 1; the empty tile's keys get 0 from every
    token that sees the picture (its mask hides them, in generation's last step too, and in
    the pass over the whole text that eager attention (`eager`) reads its rows from)."""
    from attnviz.core.cross_picture import seen

    run = _run(folder, photos[name], how)
    cross, whole = run.cross, run.encoded
    expected = eager(folder, list(whole.ids), whole.inputs, cross=True)  # (1, H, T, S)
    assert cross.weights.shape == expected.shape == (1, 4, len(whole), 34)
    assert np.abs(cross.weights - expected).max() < 1e-5
    np.testing.assert_allclose(cross.weights.sum(-1), 1.0, atol=1e-5)
    if how != "prompt":
        assert whole.continuation is not None and len(whole) > len(run.raw.tokens) - 1
    parts = cross.layout.parts
    if name == "square":  # one tile of 4 × 4 after its CLS (keys 0-16), an empty one (17-33)
        assert [p.tokens for p in parts] == [tuple(range(1, 17))] and cross.layout.marks == (0,)
        assert any("(4 × 4), each after its CLS, and 17 of empty tiles" in n for n in whole.notes)
        sees = seen(whole)
        assert sees[-3:].all() and not sees[0]  # the answer sees it; the chat's start does not
        assert (cross.weights[:, :, sees, 17:] == 0).all()
    else:
        assert [p.name for p in parts] == ["tile 0,0", "tile 0,1"]
        assert cross.layout.marks == (0, 17) and parts[1].tokens[0] == 18
        right = parts[1].box[3]
        assert right == (1.0 if name == "wide" else pytest.approx(56 / 43))


def _cross_inputs(loaded, image):
    """The keys' states the cross-attention layers read for `image` (the vision tower's
    output, projected), one row a key, (S, d)."""

    def keys(args, kwargs):
        states = kwargs["cross_attention_states"]
        return states.reshape(-1, states.shape[-1])

    return input_of(loaded, loaded.model.get_decoder(), image, PROMPT, keys)


def test_a_bright_patch_moves_the_key_cut_from_it(folder):
    """With the vision tower's attention outputs set to 0 (each key's state made of its own
    patch alone), a bright square on one cell of a grey picture (100 × 64: the second tile
    part padding) changes the state the cross-attention layers read at that cell's key more
    than at any other key of its tile, in each tile."""
    import torch

    from attnviz.core.models import model

    loaded = model(str(folder)).load()  # kept loaded for the other tests: restored below
    mixing = {name: parameter for name, parameter in loaded.model.named_parameters()
              if "vision_model" in name and ".self_attn.o_proj." in name}  # fmt: skip
    kept = {name: parameter.detach().clone() for name, parameter in mixing.items()}
    with torch.no_grad():
        for parameter in mixing.values():
            parameter.zero_()
    try:
        _bright(loaded)
    finally:
        with torch.no_grad():
            for name, parameter in mixing.items():
                parameter.copy_(kept[name])


def _bright(loaded):
    import torch
    from PIL import Image

    from attnviz.core import vlm

    width, height = SIZES["padded"]
    grey = np.full((height, width, 3), 90, np.uint8)
    layout = vlm.encode(loaded, Image.fromarray(grey), PROMPT).cross.layout
    before = _cross_inputs(loaded, Image.fromarray(grey))
    for part in layout.parts:
        rows, cols = part.grid
        top, left, bottom, right = part.box
        ys = (top + (bottom - top) * (np.arange(rows)[:, None] + [0.3, 0.7]) / rows) * height
        xs = (left + (right - left) * (np.arange(cols)[:, None] + [0.3, 0.7]) / cols) * width
        on_x = [c for c in range(cols) if xs[c, 1] <= width]  # the cells on the picture
        inside = [(r, c) for r in range(rows) for c in on_x]
        assert len(inside) >= rows * 2, part.name
        for row, col in (inside[0], inside[-1], inside[len(inside) // 2]):
            bright = grey.copy()
            (y0, y1), (x0, x1) = np.round(ys[row]).astype(int), np.round(xs[col]).astype(int)
            bright[y0:y1, x0:x1] = 255
            moved = _cross_inputs(loaded, Image.fromarray(bright)) - before
            change = torch.linalg.vector_norm(moved, dim=-1)
            assert int(change.argmax()) == part.tokens[row * cols + col], (part.name, row, col)


def test_the_overlay_is_the_eager_cross_rows_on_their_cells(answered):
    """picture-answer-layer-0.png of the cross-attention layer: the mean of the rows that
    wrote the answer equals eager's; each key's value lies on the pixels of its cell (the
    grid read back from the painted values, each tile's); the panels' pixels are the picture
    under those values' colours on the figure's one scale, titled with the eager share on
    the patches."""
    from PIL import Image

    from attnviz.analysis.picture_share import answer_rows, looked
    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import _shown_size, blend_values, layout_figure, resized
    from attnviz.outputs.figures.raster import figure_png

    cross, expected = answered
    layout, style = cross.layout, Style()
    rows = list(answer_rows(cross))
    mean = looked(cross, 0, tuple(rows))  # (H, S)
    want = expected[0][:, rows].mean(axis=1)  # (H, S): eager's
    np.testing.assert_allclose(mean, want, atol=1e-5)
    size = _shown_size(layout.pixels.shape[:2], style.dpi)
    painted = [layout.painted(mean[head], size) for head in range(4)]
    for head in range(4):
        for part in layout.parts:
            top, left, bottom, right = part.box
            ys = (top + (bottom - top) * (np.arange(part.grid[0]) + 0.5) / part.grid[0]) * size[0]
            xs = (left + (right - left) * (np.arange(part.grid[1]) + 0.5) / part.grid[1]) * size[1]
            grid = painted[head][ys.astype(int)][:, xs.astype(int)]
            assert np.abs(grid - want[head, list(part.tokens)].reshape(part.grid)).max() < 1e-5
    fig = layout_figure(cross, 0, [0, 1, 2, 3], mean, "the answer", style)
    panels = [a for a in fig.artists if hasattr(a, "pixels")]
    titles = [t.get_text() for t in fig.texts if t.get_text().startswith("head ")]
    assert len(panels) == len(titles) == 4
    scale = max(float(p.max()) for p in painted)
    pixels = resized(layout.pixels, size)
    with Image.open(io.BytesIO(figure_png(fig))) as opened:
        rendered = np.asarray(opened.convert("RGB"))
    for head, panel in enumerate(panels):
        blended = blend_values(pixels, painted[head], style.colour_map(), scale, None)
        assert np.array_equal(panel.pixels, blended)
        h, w = blended.shape[:2]
        top_row = rendered.shape[0] - panel.bottom - h  # the PNG's rows run down
        placed = rendered[top_row + 2 : top_row + h - 2, panel.left + 2 : panel.left + w - 2]
        assert np.array_equal(placed, blended[2:-2, 2:-2])  # inside the frame
        share = expected[0, head, rows][:, layout.cells()].sum(-1).mean()
        assert f"patches {share:.0%}" in titles[head]
    assert "cross-attention layer 0" in " ".join(t.get_text() for t in fig.texts)


def test_show_draws_and_prints_the_cross_attention(folder, photos, tmp_path):
    """`show` over Mllama's picture writes the cross-attention layer's figure over the
    picture and its share plot, prints its patches' share and says how the picture is read;
    --json carries the shares."""
    out = tmp_path / "out"
    args = ["show", str(photos["wide"]), PROMPT, "-m", str(folder), "--generate", "2"]
    result = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Cross-attention on the picture's patches" in result.output
    assert "read by 1 cross-attention layer(s) (the model's layer 1)" in result.output
    (drawn,) = out.iterdir()
    assert sorted(p.name for p in drawn.glob("picture-*")) == [
        "picture-answer-layer-0.png", "picture-share.png"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--no-images", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)["cross"]
    assert found["layers"] == 1 and len(found["key_tokens"]) == 34
    assert found["key_tokens"][:2] == ["tile 0,0 CLS", "tile 0,0 (0, 0)"]
    assert np.array(found["patch_share"]).shape == (1, 4)


# ---------- the page (answer.js over the cross-attention layers) ----------


@pytest.fixture(scope="module")
def cross_page(folder, photos, answered, tmp_path_factory):
    """`show … --generate 3 --html`'s page of the wide picture, and its data; the answer
    written is `answered`'s (greedy), whose eager cross rows the page is held to."""
    from test_html import _data

    out = tmp_path_factory.mktemp("cross-page")
    args = ["show", str(photos["wide"]), PROMPT, "-m", str(folder), "--generate", "3",
            "--html", "--no-images", "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (page,) = out.glob("*/attention.html")
    return page, _data(page.read_text(encoding="utf-8"))


def test_the_page_carries_the_eager_cross_rows_and_their_shares(cross_page, answered):
    """The page's `cross`: every head's rows over the 34 keys, float32, equal to the model's
    eager cross-attention within 1e-5; each tile's patches on the keys the map names (each
    CLS left out); the whole answer's rows then each word's, with the eager share on the
    patches; answer.js comes once, with no view over image tokens (Mllama has none)."""
    from test_html import _unpack

    from attnviz.analysis.picture_share import answer_rows

    page, data = cross_page
    cross, expected = answered
    entry = data["cross"]
    assert "layout" not in data
    assert page.read_text(encoding="utf-8").count("function drawAnswer") == 1
    assert data["tokens"] == list(cross.tokens)  # the same answer as `answered`'s
    assert (entry["keys"], entry["layers"], entry["heads"]) == (34, 1, 4)
    assert entry["encoding"] == "float32"
    n = len(cross.tokens)
    for head in range(4):
        rows = _unpack(entry["weights"][0][head], "<f4").reshape(n, 34)
        assert np.abs(rows - expected[0, head]).max() < 1e-5
    assert [p["tokens"] for p in entry["parts"]] == [list(range(1, 17)), list(range(18, 34))]
    start = cross.continuation.start
    views = entry["views"]
    assert [v["rows"] for v in views] == [list(answer_rows(cross)),
                                          *[[t - 1] for t in range(start, n)]]  # fmt: skip
    cells = cross.layout.cells()
    for v in views:
        want = expected[:, :, v["rows"]][..., cells].sum(-1).mean(-1)  # (1, H)
        np.testing.assert_allclose(np.array(v["share"]), want, atol=1e-5)


def test_the_page_draws_each_cross_head_over_the_picture(browser, cross_page):
    """In chromium: the page opens on the whole answer in the cross-attention layer, every
    head's canvas the picture under the mean of the page's rows over the keys, each patch's
    key on its cell, on the layer's one scale; clicking a word draws the row that wrote it;
    each caption gives the share on the patches, and the plot's mean line their mean."""
    from test_html import Opened, _unpack
    from test_picture_page import _painted
    from test_vision_language_views import over_expected

    page, data = cross_page
    entry = data["cross"]
    n = len(data["tokens"])
    weights = np.stack([_unpack(blob, "<f4").reshape(n, 34) for blob in entry["weights"][0]])
    shown = Opened(browser, page, every_head=False)
    try:
        shown.page.wait_for_selector("body[data-answer='ready']")

        def check(view: int) -> None:
            rows = entry["views"][view]["rows"]
            means = [sum(weights[head, q].astype(np.float64) for q in rows) / len(rows)
                     for head in range(4)]  # fmt: skip
            want = over_expected(entry, means)
            for head in range(4):
                drawn = _painted(shown, f"#answer-heads canvas[data-head='{head}']")
                assert np.array_equal(drawn, want[head]), (view, head)
            captions = shown.page.eval_on_selector_all(
                "#answer-heads figcaption", "cs => cs.map((c) => c.textContent)"
            )
            share = entry["views"][view]["share"][0]
            assert captions == [f"H{h} · patches {100 * share[h]:.1f}%" for h in range(4)]
            mean = json.loads(shown.page.get_attribute("#answer-share", "data-mean"))
            np.testing.assert_allclose(mean, [np.mean(share)], atol=1e-12)

        check(0)
        assert "Cross-attention layer 0" in shown.page.inner_text("#answer-title")
        n_renders = int(shown.page.get_attribute("#answer-view", "data-renders"))
        shown.page.click(".answer-word[data-view='2']")
        shown.page.wait_for_selector(f"#answer-view[data-renders='{n_renders + 1}']")
        check(2)
    finally:
        shown.close()
    assert shown.errors == []
    assert shown.requests == [shown.url], "the page made a request besides its own file"


# ---------- the API ----------


def test_the_api_hands_out_the_cross_layers_and_their_map(folder, photos, answered):
    """`attnviz.attention(prompt, picture=…, model=Mllama)`: `weights` the self-attention
    layers, `cross` the cross-attention layers from the same pass, equal to the eager rows
    within 1e-5, with each key's label and the key-to-cell map; its page (to_html(), made
    from the result's own weights) has the answer's view of them."""
    from test_html import _data, _unpack

    import attnviz

    cross, expected = answered
    a = attnviz.attention(PROMPT, picture=str(photos["wide"]), model=str(folder), generate=3)
    assert a.tokens == cross.tokens and a.weights.shape[:2] == (2, 4)  # self-attention layers
    assert a.cross is not None and a.cross.stack == "cross"
    assert np.abs(a.cross.weights - expected).max() < 1e-5
    assert a.cross.key_tokens[:2] == ("tile 0,0 CLS", "tile 0,0 (0, 0)")
    assert [p.tokens for p in a.cross.layout.parts] == [tuple(range(1, 17)), tuple(range(18, 34))]
    assert any("the API's result holds them as `cross`" in note for note in a.notes)
    entry = _data(a.to_html())["cross"]
    assert entry["keys"] == 34
    page_rows = _unpack(entry["weights"][0][0], "<f4").reshape(len(a.tokens), 34)
    assert np.abs(page_rows - expected[0, 0]).max() < 1e-5
    assert "&quot;cross&quot;: {" in a._repr_mimebundle_()["text/html"]  # a notebook cell's


# ---------- export over pictures and questions ----------


def test_export_writes_each_questions_cross_layers(folder, photos, answered, tmp_path):
    """`export questions.jsonl --generate 3 --save-raw` on Mllama: each question's folder
    holds its cross-attention layer over the picture and the share plot (as `show` draws
    them), cross.json (each key's label and cell, the eager shares on the patches) and
    `cross_attention` in attention.npz, the eager rows within 1e-5."""
    cross, expected = answered
    lines = tmp_path / "questions.jsonl"
    lines.write_text(json.dumps({"picture": str(photos["wide"]), "prompt": PROMPT}) + "\n")
    out = tmp_path / "export"
    args = ["export", str(lines), "-m", str(folder), "--generate", "3", "--save-raw",
            "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (done,) = [p for p in out.iterdir() if p.is_dir()]
    assert {"picture-answer-layer-0.png", "picture-share.png", "cross.json"} <= {
        p.name for p in done.iterdir()}  # fmt: skip
    raw = np.load(done / "attention.npz")
    assert list(raw["tokens"]) == list(cross.tokens)  # the same answer as `answered`'s
    assert raw["cross_attention"].shape == (1, 4, len(cross.tokens), 34)
    assert np.abs(raw["cross_attention"] - expected).max() < 1e-5
    fields = json.loads((done / "cross.json").read_text(encoding="utf-8"))
    assert fields["parts"][1]["keys"] == list(range(18, 34)) and fields["marks"] == [0, 17]
    rows, cells = fields["rows"], cross.layout.cells()
    want = expected[:, :, rows][..., cells].sum(-1).mean(-1)  # (1, H)
    np.testing.assert_allclose(np.array(fields["patch_share"]), want, atol=1e-5)


@pytest.mark.parametrize("command", ["report", "compare"])
def test_report_and_compare_refuse_mllama_in_one_line(folder, photos, tmp_path, command):
    """`report` and `compare` over Mllama's pictures and questions read no cross-attention
    layers: refused in one line that says so and names what does read them, exit 2, nothing
    written."""
    lines = tmp_path / "questions.jsonl"
    lines.write_text(json.dumps({"picture": str(photos["wide"]), "prompt": PROMPT}) + "\n")
    given = {"report": [str(lines)], "compare": [str(photos["wide"]), PROMPT, "What is it?"]}
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [command, *given[command], "-m", str(folder), "-o", str(out)])
    assert result.exit_code == 2, result.output
    said = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "reads the picture in cross-attention layers" in said[0]
    assert "Traceback" not in result.output and not out.exists()


def test_past_the_budget_the_pages_cross_rows_are_8_bit_steps(answered, monkeypatch):
    """Past the page's float32 budget the cross rows travel as 8-bit steps of each head's
    largest weight (the page's other blobs' encoding): every row within half a step of the
    float32 ones, which equal eager's."""
    from test_html import _unpack

    from attnviz.outputs.html import page

    cross, expected = answered
    exact = page.cross_entry(cross)
    monkeypatch.setattr(page, "EXACT_BUDGET", cross.weights.size * 4 - 1)
    stepped = page.cross_entry(cross)
    assert (exact["encoding"], stepped["encoding"]) == ("float32", "uint8")
    n = len(cross.tokens)
    for head in range(4):
        rows = _unpack(exact["weights"][0][head], "<f4").reshape(n, 34)
        blob = _unpack(stepped["weights"][0][head], "u1")
        top = blob[:4].view("<f4")[0]
        steps = blob[4:].reshape(n, 34) * (top / 255)
        assert top == rows.max() and np.abs(steps - rows).max() <= top / 510 + 1e-7
        assert np.abs(rows - expected[0, head]).max() < 1e-5
