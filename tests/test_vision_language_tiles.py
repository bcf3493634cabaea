"""LLaVA-NeXT's vision tower over its tiles (issue 54 item 3): the base image's sequence and
each tile's, recorded through attnviz's attention function, equal the tower's own eager
attention; each tile's tokens sit on the cells of the picture the processor cut the tile
from (a bright patch moves the right token, in the tiles that are part padding too); the
drawn maps (each sequence's CLS row) and the figure are the eager rows on their cells."""

from __future__ import annotations

import numpy as np
import pytest
from test_vision_language_tower import Whole, _tower_input
from vlm_models import picture, save, tower_eager

PROMPT = "What is on the table?"
SIZE = (128, 64)  # 1 × 3 tiles of 42 px: the picture 84 × 42 in the middle of 126 × 42


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save("llava_next", tmp_path_factory.mktemp("llava-next") / "llava_next")


@pytest.fixture(scope="module")
def read(folder, tmp_path_factory):
    """The tower's map, its layers recorded whole, attnviz's view and the eager tower."""
    from attnviz.analysis.tower import TowerRecorder
    from attnviz.core import layer_map, vlm
    from attnviz.core.capture import VISION
    from attnviz.core.extract import attend
    from attnviz.core.models import model

    photo = picture(tmp_path_factory.mktemp("pictures") / "photo.png", SIZE)
    loaded = model(str(folder)).load()
    encoded = vlm.encode(loaded, photo, PROMPT)
    tower = vlm.tower(loaded, encoded)
    n_layers = layer_map.n_layers(loaded.model, VISION)
    whole, recorder = Whole(n_layers, tower.lengths[0]), TowerRecorder(tower, n_layers, VISION)
    att = attend(loaded, [encoded], also=[whole, recorder])[0]
    assert recorder.unread is None
    return tower, whole.held, recorder.view(), tower_eager(folder, list(encoded.ids),
                                                           encoded.inputs), att  # fmt: skip


def test_every_tile_is_mapped_and_equals_the_eager_tower(read):
    """The base image and its three tiles, a sequence each (CLS, then 3 × 3 patches), each
    tile over the box it was cut from (the outer two half padding); every layer equals the
    eager tower; the drawn map is each sequence's CLS row, eager's."""
    tower, held, view, eager, _ = read
    parts = tower.layout.parts
    assert [p.name for p in parts] == ["global", "tile 0,0", "tile 0,1", "tile 0,2"]
    assert tower.lengths == (10, 10, 10, 10) and tower.layout.marks == (0, 10, 20, 30)
    assert [p.tokens[0] for p in parts] == [1, 11, 21, 31]
    for part, left in zip(parts[1:], (-0.25, 0.25, 0.75)):
        assert part.box == pytest.approx((0.0, left, 1.0, left + 0.5))
    assert view.cls
    for layer, expected in enumerate(eager):  # (4, H, 10, 10): a sequence a batch row
        assert expected.shape[0] == 4
        assert np.abs(held[layer] - expected).max() < 1e-5
        cls_rows = expected[:, :, 0].transpose(1, 0, 2).reshape(4, 40)  # (H, 40)
        np.testing.assert_allclose(view.maps[layer], cls_rows, atol=1e-5)
        for head in view.layer(layer):  # the base image's CLS: on itself, its entropy
            row = expected[0, head.head, 0].astype(np.float64)
            assert head.cls_outside == (("CLS", pytest.approx(row[0], abs=1e-6)),)
            assert head.cls_entropy == pytest.approx(-(row * np.log(row)).sum(), abs=1e-5)


def test_a_bright_patch_moves_the_tile_token_cut_from_it(folder):
    """A bright square on one cell of a grey picture changes the tower's input at that
    cell's token (by the map) more than at any other token of its tile, in every tile."""
    from PIL import Image

    from attnviz.core import vlm
    from attnviz.core.models import model

    loaded = model(str(folder)).load()
    width, height = SIZE
    grey = np.full((height, width, 3), 90, np.uint8)
    tower = vlm.tower(loaded, vlm.encode(loaded, Image.fromarray(grey), PROMPT))
    before = _tower_input(loaded, Image.fromarray(grey))
    assert before.shape[0] == sum(tower.lengths)
    for part in tower.layout.parts[1:]:
        rows, cols = part.grid
        top, left, bottom, right = part.box
        ys = (top + (bottom - top) * (np.arange(rows)[:, None] + [0.3, 0.7]) / rows) * height
        xs = (left + (right - left) * (np.arange(cols)[:, None] + [0.3, 0.7]) / cols) * width
        on_x = [c for c in range(cols) if xs[c, 0] >= 0 and xs[c, 1] <= width]
        assert on_x, part.name
        for row, col in ((0, on_x[0]), (rows - 1, on_x[-1])):
            bright = grey.copy()
            (y0, y1), (x0, x1) = np.round(ys[row]).astype(int), np.round(xs[col]).astype(int)
            bright[y0:y1, x0:x1] = 255
            moved = np.linalg.norm(_tower_input(loaded, Image.fromarray(bright)) - before, axis=-1)
            tokens = list(part.tokens)
            assert tokens[int(moved[tokens].argmax())] == part.tokens[row * cols + col], (
                part.name, row, col)  # fmt: skip


def test_the_tiles_figure_is_the_eager_cls_rows_on_their_cells(read):
    """tower-layer-1.png: each panel's pixels are the picture under the eager CLS rows
    painted on every sequence's cells (the base's and the tiles' added where they overlap),
    on the figure's one scale; each title gives the CLS rows' mean share on the patches."""
    import io

    from PIL import Image

    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import _shown_size, blend_values, resized, tower_figure
    from attnviz.outputs.figures.raster import figure_png

    tower, _, view, eager, att = read
    layout, style = tower.layout, Style()
    size = _shown_size(layout.pixels.shape[:2], style.dpi)
    rows = eager[1][:, :, 0].transpose(1, 0, 2).reshape(4, 40)  # (H, 40): eager CLS rows
    painted = [layout.painted(rows[head], size) for head in range(4)]
    fig = tower_figure(att, tower, 1, view.maps[1], view.layer(1), view.cls, style)
    panels = [a for a in fig.artists if hasattr(a, "pixels")]
    titles = [t.get_text() for t in fig.texts if t.get_text().startswith("head ")]
    scale = max(float(p.max()) for p in painted)
    unseen = layout.painted(np.ones(40, np.float32), size) == 0
    assert not unseen.any()  # the tiles and the base image cover the picture
    with Image.open(io.BytesIO(figure_png(fig))) as opened:
        rendered = np.asarray(opened.convert("RGB"))
    for head, panel in enumerate(panels):
        blended = blend_values(resized(layout.pixels, size), painted[head], style.colour_map(),
                               scale, None)  # fmt: skip
        assert np.abs(panel.pixels.astype(int) - blended).max() <= 1  # float32 sums' order
        h, w = blended.shape[:2]
        top_row = rendered.shape[0] - panel.bottom - h
        placed = rendered[top_row + 2 : top_row + h - 2, panel.left + 2 : panel.left + w - 2]
        assert np.array_equal(placed, panel.pixels[2:-2, 2:-2])
        share = rows[head][layout.cells()].sum() / 4
        assert f"CLS on the patches {share:.0%}" in titles[head]
