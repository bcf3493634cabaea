"""A vision-language model's vision tower, read in the run's one pass (issue 54 items 3 and
5): its layers recorded through attnviz's attention function equal the tower's own eager
attention (CLIP's with its CLS, SigLIP's, Qwen2-VL's in merge windows, Qwen2.5-VL's in
windows run call by call, Idefics3's sub-images a batch row each), with the prompt alone and
in generation's prompt pass; each tower token on the cell of the picture it was cut from; the
views (what each head receives or where CLS looks, roles, mean attention distance) and the
tower's figure held to plain loops over the eager probabilities."""

from __future__ import annotations

import io

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import input_of, picture, save, tower_eager

from attnviz.cli import app

PROMPT = "What is on the table?"
KINDS = ("llava", "paligemma", "qwen2_vl", "qwen2_5_vl", "idefics3")


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-tower")
    return {kind: save(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    return picture(tmp_path_factory.mktemp("pictures") / "photo.png", (128, 64))


class Whole:
    """A test's recorder of the tower's every layer whole, (B, H, n, n) a layer over each
    sequence's n tokens, put together from its blocks call by call (a windowed layer's
    calls along the diagonal): what attnviz's own recorder never holds."""

    calls = True

    def __init__(self, n_layers, n):
        from attnviz.core.capture import ROWS, VISION

        self.stack, self.n = VISION, n
        self.wants = {layer: (ROWS,) for layer in range(n_layers)}
        self.held, self.at = {}, {}

    def receive(self, layer, tensors):
        pass

    def receive_rows(self, layer, start, rows, call=0):
        batch, heads, b, width = rows.shape
        at = self.at.setdefault(layer, [call, 0, width])
        if call != at[0]:
            at[:] = [call, at[1] + at[2], width]
        whole = self.held.setdefault(layer, np.zeros((batch, heads, self.n, self.n), np.float32))
        whole[:, :, at[1] + start : at[1] + start + b, at[1] : at[1] + width] = rows.numpy()


def _recorders(loaded, encoded):
    """The tower's map, a `Whole` and attnviz's own recorder (`analysis.tower`)."""
    from attnviz.analysis.tower import TowerRecorder
    from attnviz.core import layer_map, vlm
    from attnviz.core.capture import VISION

    tower = vlm.tower(loaded, encoded)
    n_layers = layer_map.n_layers(loaded.model, VISION)
    return tower, Whole(n_layers, tower.lengths[0]), TowerRecorder(tower, n_layers, VISION)


@pytest.fixture(scope="module")
def read(vlm_dirs, photo):
    """Each family's tower read with the prompt alone, in the pass that reads its language
    model: its map, the whole layers recorded, attnviz's view, the tower's own eager
    probabilities over the same inputs, and the language model's attention."""
    from attnviz.core import vlm
    from attnviz.core.extract import attend
    from attnviz.core.models import model

    found = {}
    for kind in KINDS:
        loaded = model(str(vlm_dirs[kind])).load()
        encoded = vlm.encode(loaded, photo, PROMPT)
        tower, whole, recorder = _recorders(loaded, encoded)
        att = attend(loaded, [encoded], also=[whole, recorder])[0]
        assert recorder.unread is None
        eager = tower_eager(vlm_dirs[kind], list(encoded.ids), encoded.inputs)
        found[kind] = tower, whole.held, recorder.view(), eager, att
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_the_towers_layers_are_its_eager_attention(read, kind):
    tower, held, view, eager, _ = read[kind]
    assert len(held) == len(eager) == view.n_layers == 2
    for layer, expected in enumerate(eager):
        assert held[layer].shape == expected.shape
        assert expected.shape[0] == len(tower.lengths)  # Idefics3: a sub-image a batch row
        assert np.abs(held[layer] - expected).max() < 1e-5
    if kind == "qwen2_5_vl":  # its windowed layer attends within windows: 0 between them
        assert (eager[0] == 0).mean() > 0.5 and (eager[1] > 0).all()


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
@pytest.mark.parametrize("how", ["generate", "target"])
def test_generation_reads_the_tower_in_its_prompt_pass(read, vlm_dirs, photo, kind, how):
    """With `--generate` (or `--target`) the tower runs in the prompt's pass alone, under
    generation's listener: its recorders are fed there, once, and equal the eager tower."""
    from attnviz.core import generation, vlm
    from attnviz.core.models import model

    loaded = model(str(vlm_dirs[kind])).load()
    prompt = vlm.encode(loaded, photo, PROMPT)
    _, whole, recorder = _recorders(loaded, prompt)
    settings = {"generate": generation.Settings(tokens=2),
                "target": generation.Settings(target="A cat")}[how]  # fmt: skip
    generation.write(loaded, prompt, settings, [0, 1], [whole, recorder])
    _, _, view, eager, _ = read[kind]
    for layer, expected in enumerate(eager):
        assert np.abs(whole.held[layer] - expected).max() < 1e-5
    np.testing.assert_allclose(recorder.view().maps, view.maps, atol=1e-6)


def _expected(tower, eager):
    """Plain loops over the eager probabilities: each layer's drawn map (L, H, N) (CLS's
    row, or each token's mean over its sequence's queries) and per head the patches' mean
    share outside the grid, on their 8 neighbours and own patch, and attention distance."""
    places = np.full((sum(tower.lengths), 2), -1)  # each token's cell, read off the parts
    for part in tower.layout.parts:
        for cell, token in enumerate(part.tokens):
            places[token] = divmod(cell, part.grid[1])
    starts = [sum(tower.lengths[:i]) for i in range(len(tower.lengths))]
    marks = list(tower.layout.marks)
    maps, numbers = [], []
    for probs in eager:  # (B, H, n, n)
        heads = probs.shape[1]
        drawn = np.zeros((heads, len(places)))
        sums, count = np.zeros((3, heads)), 0
        for seq in tower.sequences():
            first, n = starts[seq], tower.lengths[seq]
            block = probs[seq].astype(np.float64)  # (H, n, n)
            drawn[:, first : first + n] = block[:, marks[0] - first] if marks else block.mean(1)
            for q in range(n):
                if places[first + q, 0] < 0:
                    continue
                count += 1
                for k in range(n):
                    if places[first + k, 0] < 0:
                        sums[0] += block[:, q, k]
                        continue
                    dr, dc = places[first + q] - places[first + k]
                    total = sum(block[:, q, j] for j in range(n) if places[first + j, 0] >= 0)
                    sums[1] += block[:, q, k] * (max(abs(dr), abs(dc)) <= 1)
                    sums[2] += block[:, q, k] / total * np.hypot(dr, dc) * tower.patch
        maps.append(drawn)
        numbers.append(sums / count)
    return np.stack(maps), np.stack(numbers)  # (L, H, N), (L, 3, H)


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl", "idefics3"])
def test_the_towers_numbers_are_plain_loops_over_eager(read, kind):
    from attnviz.analysis.vision import role_of

    tower, _, view, eager, _ = read[kind]
    maps, numbers = _expected(tower, eager)
    np.testing.assert_allclose(view.maps, maps, atol=1e-5)
    assert view.cls == (kind == "llava")
    for head in view.heads:
        sink, local, reach = numbers[head.layer, :, head.head]
        assert (head.sink, head.local) == pytest.approx((sink, local), abs=1e-5)
        assert head.distance == pytest.approx(reach, abs=1e-3)
        assert head.role == role_of(sink, local, reach, view.uniform)
        if kind == "llava":  # CLS: token 0, then the patches
            row = eager[head.layer][0, head.head, 0].astype(np.float64)
            assert head.cls_outside[0][1] == pytest.approx(row[0], abs=1e-6)
            assert head.cls_entropy == pytest.approx(-(row * np.log(row)).sum(), abs=1e-5)
            best = int(row[1:].argmax())
            assert head.cls_top[0][0] == f"({best // 6}, {best % 6})"


def test_uniform_distance_is_the_mean_of_every_pair():
    from types import SimpleNamespace

    from attnviz.analysis.vision import distances, uniform_distance

    for grid, patch in (((6, 6), 14), ((4, 10), 14), ((1, 3), 7)):
        picture = SimpleNamespace(grid=grid, patch=patch)
        assert uniform_distance(grid, patch) == pytest.approx(distances(picture).mean())


@pytest.mark.parametrize("kind", KINDS)
def test_a_bright_patch_moves_the_tower_token_cut_from_it(vlm_dirs, kind):
    """A bright square on one cell of a grey picture changes the tower's attention input at
    that cell's token (by the family's map) more than at any other token of its part (each
    sub-image of Idefics3's, the window-ordered tokens of Qwen2.5-VL's)."""
    from PIL import Image

    from attnviz.core import vlm
    from attnviz.core.models import model

    loaded = model(str(vlm_dirs[kind])).load()
    size = (128, 64)
    grey = np.full((size[1], size[0], 3), 90, np.uint8)
    tower = vlm.tower(loaded, vlm.encode(loaded, Image.fromarray(grey), PROMPT))
    before = _tower_input(loaded, Image.fromarray(grey))
    assert before.shape[0] == sum(tower.lengths)
    for part in tower.layout.parts:
        rows, cols = part.grid
        top, left, bottom, right = part.box
        ys = (top + (bottom - top) * (np.arange(rows)[:, None] + [0.3, 0.7]) / rows) * size[1]
        xs = (left + (right - left) * (np.arange(cols)[:, None] + [0.3, 0.7]) / cols) * size[0]
        for row, col in ((rows - 1, cols - 1), (rows // 2, cols // 2 + 1)):
            bright = grey.copy()
            (y0, y1), (x0, x1) = np.round(ys[row]).astype(int), np.round(xs[col]).astype(int)
            bright[y0:y1, x0:x1] = 255
            moved = np.linalg.norm(_tower_input(loaded, Image.fromarray(bright)) - before, axis=-1)
            tokens = list(part.tokens)
            assert tokens[int(moved[tokens].argmax())] == part.tokens[row * cols + col]


def _tower_input(loaded, image):
    """What the tower's first attention module reads, a row a token of the tower, (N, d)."""
    from attnviz.core.capture import VISION
    from attnviz.core.layer_map import generic

    def tokens(args, kwargs):
        states = args[0] if args else kwargs["hidden_states"]
        return states.reshape(-1, states.shape[-1]).float().numpy()

    return input_of(loaded, generic.callers(loaded.model, VISION)[0], image, PROMPT, tokens)


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_the_tower_figure_is_the_eager_map_on_its_cells(read, kind):
    """Each panel of tower-layer-1.png: every tower token's value (eager's CLS row, or its
    mean received attention) on the pixels of its cell, read back at the cells' centres,
    and the panel's pixels the picture under those values' colours on the figure's one
    scale, in the PNG as written."""
    from PIL import Image

    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import _shown_size, blend_values, resized, tower_figure
    from attnviz.outputs.figures.raster import figure_png

    tower, _, view, eager, att = read[kind]
    maps, _ = _expected(tower, eager)
    layout, style = tower.layout, Style()
    part = layout.parts[0]
    size = _shown_size(layout.pixels.shape[:2], style.dpi)
    top, left, bottom, right = part.box
    ys = (top + (bottom - top) * (np.arange(part.grid[0]) + 0.5) / part.grid[0]) * size[0]
    xs = (left + (right - left) * (np.arange(part.grid[1]) + 0.5) / part.grid[1]) * size[1]
    painted = [layout.painted(view.maps[1][head], size) for head in range(4)]
    for head in range(4):
        grid = painted[head][ys.astype(int)][:, xs.astype(int)]
        want = maps[1, head][list(part.tokens)].reshape(part.grid)
        assert np.abs(grid - want).max() < 1e-5
    fig = tower_figure(att, tower, 1, view.maps[1], view.layer(1), view.cls, style)
    panels = [a for a in fig.artists if hasattr(a, "pixels")]
    titles = [t.get_text() for t in fig.texts if t.get_text().startswith("head ")]
    assert len(panels) == len(titles) == 4
    scale = max(float(p.max()) for p in painted)
    unseen = layout.painted(np.ones(sum(tower.lengths), np.float32), size) == 0
    with Image.open(io.BytesIO(figure_png(fig))) as opened:
        rendered = np.asarray(opened.convert("RGB"))
    for head, panel in enumerate(panels):
        blended = blend_values(resized(layout.pixels, size), painted[head], style.colour_map(),
                               scale, unseen if unseen.any() else None)  # fmt: skip
        assert np.array_equal(panel.pixels, blended)
        h, w = blended.shape[:2]
        top_row = rendered.shape[0] - panel.bottom - h  # the PNG's rows run down
        placed = rendered[top_row + 2 : top_row + h - 2, panel.left + 2 : panel.left + w - 2]
        assert np.array_equal(placed, blended[2:-2, 2:-2])
        assert f"{view.layer(1)[head].role}" in titles[head]
    assert (kind == "llava") == bool(unseen.any())  # LLaVA's centre crop: the sides unseen


def test_show_writes_the_towers_figures_and_json(vlm_dirs, photo, tmp_path):
    """`show PICTURE PROMPT --generate -o DIR` writes one figure a tower layer beside the
    answer's, in the drawing processes (listed in done.json, for the next run to remove),
    every tower layer and head whatever `--layer` and `--head` choose of the language
    model's; `--json` has every tower head."""
    import json

    out = tmp_path / "out"
    args = ["show", str(photo), PROMPT, "-m", str(vlm_dirs["qwen2_vl"]), "--generate", "2",
            "-o", str(out), "--json", "--layer", "1", "--head", "0"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    drawn = sorted(p.name for p in folder.glob("tower-*"))
    assert drawn == ["tower-layer-0.png", "tower-layer-1.png"]
    for name in drawn:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    files = json.loads((folder / "done.json").read_text())["record"]["files"]
    assert {f"{folder.name}/{name}" for name in drawn} <= set(files)  # the next run removes them
    found = json.loads(result.stdout)["tower"]
    assert found["drawn"] == "received" and found["sequences"] == [40]
    assert [(h["layer"], h["head"]) for h in found["heads"]] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
    ]


def test_the_terminal_says_each_tower_layer(read):
    """A line a tower layer: its heads' mean attention distance, least and most, and roles."""
    from rich.console import Console

    from attnviz.outputs.terminal.show import print_tower

    _, _, view, _, _ = read["qwen2_5_vl"]
    console = Console(width=100, file=io.StringIO(), color_system=None)
    print_tower(console, view)
    lines = console.file.getvalue().splitlines()
    assert lines[0].startswith("The vision tower's heads over the picture (4 × 10 patches of 14 px")
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["layer", "dist"])
    for layer in range(2):
        heads = view.layer(layer)
        reach = [head.distance for head in heads]
        row = lines[header + 1 + layer].split()
        assert row[:3] == [f"L{layer}", f"{np.mean(reach):.1f}",
                           f"{min(reach):.1f}–{max(reach):.1f}"]  # fmt: skip
        said = " ".join(row[3:])
        assert sum(int(n) for n in said.split()[1::3]) == 4, said
    assert "global 4" in lines[header + 2]  # the full layer; layer 0 attends within windows


def test_a_tower_without_a_map_is_one_line_and_the_rest_is_read(tmp_path, photo):
    """Mllama's tower (tiles, global layers) has no map: one note says its view is not
    drawn; the language model is read as before."""
    from attnviz.core import vlm
    from attnviz.core.models import model
    from attnviz.pipelines.readers import tower_recorder

    folder = save("mllama", tmp_path / "mllama")
    loaded = model(str(folder)).load()
    encoded, recorder = tower_recorder(loaded, vlm.encode(loaded, photo, PROMPT))
    assert recorder is None
    assert encoded.notes[-1].startswith("the vision tower's view is not drawn for mllama: ")


def test_a_windowed_layer_is_refused_to_a_recorder_that_reads_it_whole(read, vlm_dirs, photo):
    """Qwen2.5-VL's windowed layer runs one call a window: a rows recorder that does not
    read call by call is refused in one line at the second call, not handed each window as
    the layer's whole."""
    from attnviz.core import capture, vlm
    from attnviz.core.models import model
    from attnviz.core.tokens import pad
    from attnviz.errors import UnsupportedModelError

    loaded = model(str(vlm_dirs["qwen2_5_vl"])).load()
    encoded = vlm.encode(loaded, photo, PROMPT)
    whole = Whole(2, 40)
    whole.calls = False
    with pytest.raises(UnsupportedModelError, match="layer 0 of the vision stack of "
                       "'qwen2_5_vl' runs its attention in several calls"):  # fmt: skip
        capture.run(loaded, pad(loaded, [encoded]), [whole])


# ---------- --no-tower, the API's result and the page ----------


def test_no_tower_leaves_the_tower_unrecorded(vlm_dirs, photo, tmp_path, monkeypatch):
    """`show PICTURE PROMPT --no-tower` makes no recorder of the tower (its layers run the
    model's own attention), and writes and prints nothing of it; the answer's views are
    written as before."""
    import json

    from attnviz.analysis import tower

    def refused(*args, **kwargs):
        raise AssertionError("the tower was recorded with --no-tower")

    monkeypatch.setattr(tower.TowerRecorder, "__init__", refused)
    out = tmp_path / "out"
    args = ["show", str(photo), PROMPT, "-m", str(vlm_dirs["qwen2_vl"]), "--generate", "2",
            "-o", str(out), "--json", "--no-tower"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    assert not list(folder.glob("tower-*"))
    assert sorted(p.name for p in folder.glob("picture-answer-*")) == [
        "picture-answer-layer-0.png",
        "picture-answer-layer-1.png",
    ]
    found = json.loads(result.stdout)
    assert "tower" not in found and not any("tower" in note for note in found["notes"])


def test_the_api_hands_out_the_towers_view(read, vlm_dirs, photo):
    """`attnviz.attention(prompt, picture=…, model=VLM).tower` is the tower's view from the
    same pass: its maps the eager rows over the picture, its heads' roles and distances those
    `show --json` gives, and a notebook cell's page and `to_html()` draw it (and the
    answer's view); `tower=False` leaves it out,
    and the language model's weights are the same within 1e-5."""
    import attnviz

    tower, _, view, eager, att = read["llava"]
    found = attnviz.attention(PROMPT, picture=photo, model=str(vlm_dirs["llava"]))
    maps, _ = _expected(tower, eager)
    np.testing.assert_allclose(found.tower.maps, maps, atol=1e-5)
    said, want = found.tower.as_dict(), view.as_dict()
    assert [h["role"] for h in said["heads"]] == [h["role"] for h in want["heads"]]
    for mine, theirs in zip(said["heads"], want["heads"]):
        assert mine["mean_distance_px"] == pytest.approx(theirs["mean_distance_px"], abs=1e-3)
    np.testing.assert_allclose(found.weights, att.weights, atol=1e-5)
    assert "drawTower" in found._repr_mimebundle_()["text/html"]  # a notebook cell's page
    page = found.to_html()  # from its weights: read again as text, it would be another run's
    assert "function drawTower" in page and "function drawAnswer" in page
    alone = attnviz.attention(PROMPT, picture=photo, model=str(vlm_dirs["llava"]), tower=False)
    assert alone.tower is None
    np.testing.assert_allclose(alone.weights, found.weights, atol=1e-5)


@pytest.fixture(scope="module")
def tower_page(read, tmp_path_factory):
    """LLaVA's page with its tower (CLS's rows; the crop's sides faded), from the recorded
    view (held to eager above)."""
    from attnviz.outputs.html import write_page

    _, _, view, _, att = read["llava"]
    return write_page(att, tmp_path_factory.mktemp("tower-page") / "attention.html", tower=view)


def test_the_page_carries_the_towers_rows(read, tower_page):
    """The page's tower: the picture's cells' edges as the PNGs paint them, and per tower
    layer every head's row, the eager one within 1e-5, with its role and distance."""
    from test_html import _data, _unpack

    tower, _, view, eager, _ = read["llava"]
    html = tower_page.read_text(encoding="utf-8")
    assert html.count("<script>") == 4 and "function drawTower" in html
    entry = _data(html)["tower"]
    width, height = entry["size"]
    (ys, xs), part = tower.layout.edges((height, width))[0], entry["parts"][0]
    assert part["ys"] == ys.tolist() and part["xs"] == xs.tolist() and part["grid"] == [6, 6]
    assert entry["cls"] and entry["tokens"] == 37 and entry["layers"] == 2
    maps, _ = _expected(tower, eager)
    for layer in range(2):
        rows = _unpack(entry["maps"][layer], "<f4").reshape(4, 37)
        np.testing.assert_allclose(rows, maps[layer], atol=1e-5)
        assert [h["role"] for h in entry["heads"][layer]] == [h.role for h in view.layer(layer)]


def test_the_page_draws_each_tower_head_over_the_picture(browser, tower_page):
    """In chromium: the tower's section opens on its last layer, every head's canvas the
    picture under that head's row on the layer's one scale (the crop's sides faded);
    choosing a layer draws that layer's."""
    from test_html import ARTIFACTS, Opened, _data, _unpack
    from test_picture_page import _painted
    from test_vision_language_views import over_expected

    entry = _data(tower_page.read_text(encoding="utf-8"))["tower"]
    shown = Opened(browser, tower_page, every_head=False)
    try:
        shown.page.wait_for_selector("body[data-tower='ready']")
        ARTIFACTS.mkdir(exist_ok=True)
        shown.page.screenshot(path=str(ARTIFACTS / "tower-page.png"), full_page=True)

        def check(layer: int) -> None:
            rows = _unpack(entry["maps"][layer], "<f4").reshape(4, entry["tokens"])
            want = over_expected(entry, list(rows))
            for head in range(4):
                drawn = _painted(shown, f"#tower-heads canvas[data-head='{head}']")
                assert np.array_equal(drawn, want[head]), (layer, head)

        check(1)
        n = int(shown.page.get_attribute("#tower-view", "data-renders"))
        shown.page.select_option("#tower-layer", "0")
        shown.page.wait_for_selector(f"#tower-view[data-renders='{n + 1}']")
        check(0)
    finally:
        shown.close()
    assert shown.errors == []
    assert shown.requests == [shown.url], "the page made a request besides its own file"
