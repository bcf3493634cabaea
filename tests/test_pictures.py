"""Pictures in (a vision model's image): tokens and patch grid, the recorded probabilities
against the model's eager `output_attentions`, the views over the picture, bad input."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner
from vision_models import PREFIX, TYPES, picture
from vision_models import eager as _eager

import attnviz
from attnviz.cli import app

runner = CliRunner()


@pytest.mark.parametrize("model_type", list(TYPES))
def test_recorded_probabilities_equal_eager_and_the_grid_leaves_the_others_out(
    vision_dirs, tmp_path, model_type
):
    path = picture(tmp_path / "photo.png")
    att = attnviz.attention(str(path), model=str(vision_dirs[model_type]), device="cpu")
    eager = _eager(vision_dirs[model_type], model_type, path)
    prefix = PREFIX[model_type]
    assert att.weights.shape == eager.shape == (2, 4, len(prefix) + 16, len(prefix) + 16)
    assert np.abs(att.weights - eager).max() <= 1e-5
    assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)
    assert list(att.tokens[: len(prefix)]) == prefix and att.tokens[len(prefix)] == "(0, 0)"
    assert att.tokens[-1] == "(3, 3)" and att.picture.grid == (4, 4)
    assert att.picture.first == len(prefix) and att.picture.pixels.shape == (32, 32, 3)
    # Each overlay's grid is the row's patch keys, reshaped; registers and CLS never in it.
    row = eager[1, 2, 0]
    grid = att.picture.patches(att.weights[1, 2, 0])
    assert grid.shape == (4, 4)
    assert np.abs(grid - row[len(prefix) :].reshape(4, 4)).max() <= 1e-5
    assert att.picture.index(2, 3) == len(prefix) + 2 * 4 + 3


def test_the_overlays_draw_the_rows_eager_gives(vision_dirs, tmp_path):
    """The values each panel of the CLS overlay and of a patch's overlay draws are the
    eager rows over the patches (DINOv2 with registers: 5 tokens before the patches), and
    each panel's pixels are the picture under those values' colours."""
    from PIL import Image

    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import blend, overlay_figure, query_rows
    from attnviz.outputs.figures.raster import figure_png

    kind = "dinov2_with_registers"
    path = picture(tmp_path / "photo.png")
    att = attnviz.attention(str(path), model=str(vision_dirs[kind]), device="cpu")
    eager = _eager(vision_dirs[kind], kind, path)
    style = Style()
    for query in (0, att.picture.index(1, 2)):
        rows = query_rows(att, 1, query)  # (H, T)
        grids = np.stack([att.picture.patches(rows[head]) for head in range(4)])  # the panels
        top = float(grids.max())
        fig = overlay_figure(att, 1, [0, 1, 2, 3], query, style)
        panels = [a for a in fig.artists if hasattr(a, "pixels")]  # placed as whole pixels
        titles = [t.get_text() for t in fig.texts if t.get_text().startswith("head ")]
        assert len(panels) == len(titles) == 4
        with Image.open(io.BytesIO(figure_png(fig))) as opened:
            rendered = np.asarray(opened.convert("RGB"))
        for head, image in enumerate(panels):
            assert np.abs(grids[head] - eager[1, head, query, 5:].reshape(4, 4)).max() <= 1e-5
            blended = blend(att.picture.pixels, grids[head], 8, style.colour_map(), top)
            # 32 × 32 pixels drawn at the panel's 220 × 220: pixel i of the panel is pixel
            # i · 32 // 220 of the picture (nearest)
            nearest = np.arange(220) * 32 // 220
            expected = blended[nearest][:, nearest]
            assert np.array_equal(image.pixels, expected)
            top_row = rendered.shape[0] - image.bottom - 220  # the PNG's rows run down
            placed = rendered[top_row : top_row + 220, image.left : image.left + 220]
            inside = np.zeros((220, 220), bool)  # all but the frame and the query's outline
            inside[2:-2, 2:-2] = True
            if query != 0:  # patch (1, 2): 55 panel pixels a patch side
                inside[55 - 2 : 110 + 2, 110 - 2 : 165 + 2] = False
            assert np.array_equal(placed[inside], expected[inside])
            assert f"reg3 {eager[1, head, query, 4]:.0%}" in titles[head]


def test_a_picture_that_is_not_square_follows_the_processors_resize(tmp_path):
    """DINOv2's processor without its centre crop keeps the picture's shape: 64 × 48 becomes
    42 × 32 pixels, 4 × 5 patches of 8 (DINOv2 interpolates its position embeddings)."""
    import transformers
    from transformers import AutoConfig, AutoModel
    from vision_models import _VIT

    folder = tmp_path / "dinov2"
    config = AutoConfig.for_model("dinov2", **_VIT)
    AutoModel.from_config(config).save_pretrained(folder)
    transformers.BitImageProcessor(
        size={"shortest_edge": 32}, do_center_crop=False
    ).save_pretrained(folder)
    path = picture(tmp_path / "wide.png", size=(64, 48))
    att = attnviz.attention(str(path), model=str(folder), device="cpu")
    eager = _eager(folder, "dinov2", path)
    assert att.picture.grid == (4, 5) and att.picture.pixels.shape == (32, 42, 3)
    assert att.weights.shape == eager.shape == (2, 4, 21, 21)
    assert np.abs(att.weights - eager).max() <= 1e-5


def test_show_draws_the_cls_and_a_patchs_view_over_the_picture(vision_dirs, tmp_path):
    path = picture(tmp_path / "photo.png")
    model = vision_dirs["deit"]
    out = tmp_path / "out"
    result = runner.invoke(app, ["show", str(path), "-m", str(model), "-o", str(out),
                                 "--query", "1,2", "-j", "2"])  # drawing processes  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 × 4 patches of 8 × 8" in result.output
    (folder,) = out.iterdir()
    names = {p.name for p in folder.iterdir()}
    for layer in (0, 1):
        assert {f"picture-layer-{layer}.png", f"picture-1-2-layer-{layer}.png"} <= names
    done = json.loads((folder / "done.json").read_text())
    assert any(name.endswith("picture-1-2-layer-1.png") for name in done["record"]["files"])


@pytest.mark.parametrize(
    ("given", "model", "said"),
    [
        ("photo.png", None, "reads text, not pictures"),
        ("A sentence.", "vit", "is a vision model: it reads pictures, not text"),
        ("broken.png", "vit", "not a picture attnviz can read"),
        ("missing.png", "vit", "no picture at missing.png"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(vision_dirs, tmp_path, monkeypatch, given, model, said):
    monkeypatch.chdir(tmp_path)
    picture(tmp_path / "photo.png")
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    args = ["show", given, "-o", "out"] + (["-m", str(vision_dirs[model])] if model else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2  # the line, wrapped at most once
    assert not (tmp_path / "out").exists()


def test_mean_attention_distance_equals_a_plain_loop_over_patch_pairs(vision_dirs, tmp_path):
    import math

    from attnviz.analysis.vision import vision_heads

    kind = "dinov2_with_registers"
    att = attnviz.attention(str(picture(tmp_path / "p.png")), model=str(vision_dirs[kind]),
                            device="cpu")  # fmt: skip
    found = {(h.layer, h.head): h for h in vision_heads(att, [0, 1], [0, 1, 2, 3])}
    first, (rows, cols), patch = att.picture.first, att.picture.grid, att.picture.patch
    for (layer, head), summary in found.items():
        distances, sinks, locals_ = [], [], []
        for q in range(rows * cols):
            row = att.weights[layer, head, first + q]
            over = sum(row[first + k] for k in range(rows * cols))
            total, near = 0.0, 0.0
            for k in range(rows * cols):
                (qr, qc), (kr, kc) = divmod(q, cols), divmod(k, cols)
                total += row[first + k] / over * math.hypot(qr - kr, qc - kc) * patch
                if abs(qr - kr) <= 1 and abs(qc - kc) <= 1:
                    near += row[first + k]
            distances.append(total)
            sinks.append(sum(row[:first]))
            locals_.append(near)
        assert abs(summary.distance - sum(distances) / len(distances)) <= 1e-4
        assert abs(summary.sink - sum(sinks) / len(sinks)) <= 1e-5
        assert abs(summary.local - sum(locals_) / len(locals_)) <= 1e-5
        cls = att.weights[layer, head, 0]
        assert [label for label, _ in summary.cls_outside] == PREFIX[kind]
        assert summary.cls_top[0][1] == pytest.approx(float(cls[first:].max()), abs=1e-6)


def test_roles_follow_their_rules():
    from attnviz.analysis.vision import role_of

    assert role_of(0.6, 0.9, 10.0, 10.0) == "sink"  # sink is tried first
    assert role_of(0.4, 0.5, 1.0, 10.0) == "local"
    assert role_of(0.4, 0.4, 7.5, 10.0) == "global"
    assert role_of(0.4, 0.4, 7.4, 10.0) == "mixed"


def test_show_lists_what_each_head_does_on_the_picture_last_layer_first(vision_dirs, tmp_path):
    path = picture(tmp_path / "photo.png")
    result = runner.invoke(app, ["show", str(path), "-m", str(vision_dirs["vit"]), "--json",
                                 "--no-images"])  # fmt: skip
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)["picture"]
    assert found["grid"] == [4, 4] and found["first_patch"] == 1 and found["size"] == [32, 32]
    assert [(h["layer"], h["head"]) for h in found["heads"]][:2] == [(0, 0), (0, 1)]
    assert {h["role"] for h in found["heads"]} <= {"sink", "local", "global", "mixed"}
    shown = runner.invoke(app, ["show", str(path), "-m", str(vision_dirs["vit"]), "--no-images"])
    assert "What each head does on this picture (last layer first)" in shown.output
    rows = [line.split()[:2] for line in shown.output.split("last layer first")[1].splitlines()]
    assert rows.index(["1", "0"]) < rows.index(["0", "0"])
    assert max(len(line) for line in shown.output.splitlines()) <= 80  # CliRunner's width


def test_the_api_takes_a_pil_image_as_it_takes_its_file(vision_dirs, tmp_path):
    from PIL import Image

    path = picture(tmp_path / "photo.png")
    model = str(vision_dirs["vit"])
    with Image.open(path) as image:
        given = attnviz.attention(image, model=model, device="cpu")
    read = attnviz.attention(str(path), model=model, device="cpu")
    assert np.array_equal(given.weights, read.weights) and given.tokens == read.tokens
    assert given.picture.name == "image" and read.picture.name == "photo.png"


@pytest.mark.parametrize(
    "option",
    [
        ["--hide-special"],
        ["--words"],
        ["--pair", "A sentence."],
        ["--measure", "alti"],
    ],  # fmt: skip
)
def test_the_options_a_picture_cannot_take_are_refused_in_one_line(vision_dirs, tmp_path, option):
    path = picture(tmp_path / "photo.png")
    result = runner.invoke(app, ["show", str(path), "-m", str(vision_dirs["vit"]), "-o",
                                 str(tmp_path / "out"), *option])  # fmt: skip
    assert result.exit_code == 2 and f"{option[0]}" in result.output, result.output
    assert "is for text" in result.output and not (tmp_path / "out").exists()


def test_a_picture_given_to_a_text_model_says_which_models_read_pictures(tmp_path):
    path = picture(tmp_path / "photo.png")
    result = runner.invoke(app, ["check", str(path)])  # the bundled model: an encoder of text
    assert result.exit_code == 2 and "reads text, not pictures" in result.output
    assert "give the picture to a vision model (-m DIR of a ViT" in result.output


def test_the_api_says_a_missing_picture_is_missing(vision_dirs, tmp_path):
    from attnviz.errors import InputError

    with pytest.raises(InputError, match="no picture at"):
        attnviz.attention(str(tmp_path / "missing.png"), model=str(vision_dirs["vit"]))


def test_siglip_has_no_cls_view_and_says_so(vision_dirs, tmp_path):
    path = picture(tmp_path / "photo.png")
    out = tmp_path / "out"
    result = runner.invoke(app, ["show", str(path), "-m", str(vision_dirs["siglip"]), "-o",
                                 str(out), "-j", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no CLS token" in result.output
    (folder,) = out.iterdir()
    assert not list(folder.glob("picture-*.png"))


def test_the_picture_kept_is_the_one_the_model_saw(vision_dirs, tmp_path):
    """Undoing the processor's normalisation gives back the resized picture's pixels (ViT's
    processor resizes 64 × 48 to 32 × 32 and normalises by 0.5 / 0.5)."""
    from PIL import Image
    from transformers import AutoImageProcessor

    path = picture(tmp_path / "photo.png")
    att = attnviz.attention(str(path), model=str(vision_dirs["vit"]), device="cpu")
    processor = AutoImageProcessor.from_pretrained(vision_dirs["vit"])
    with Image.open(path) as image:
        resized = processor(images=image.convert("RGB"), do_normalize=False, do_rescale=False,
                            return_tensors="np")["pixel_values"][0]  # fmt: skip
    expected = np.clip(np.round(resized.transpose(1, 2, 0)), 0, 255).astype(np.uint8)
    assert np.abs(att.picture.pixels.astype(int) - expected.astype(int)).max() <= 1


def test_a_vit_mae_is_refused_in_one_line(tmp_path):
    """ViT-MAE's encoder sees a random quarter of the patches: not the picture's grid."""
    import transformers
    from transformers import AutoConfig, AutoModel
    from vision_models import _VIT

    folder = tmp_path / "mae"
    AutoModel.from_config(AutoConfig.for_model("vit_mae", **_VIT)).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    path = picture(tmp_path / "photo.png")
    result = runner.invoke(app, ["show", str(path), "-m", str(folder), "--no-images"])
    assert result.exit_code == 2 and "is a ViT-MAE" in result.output, result.output


def test_pictures_in_reads_files_and_folders_and_says_what_it_skipped(tmp_path):
    from attnviz.core.images import pictures_in
    from attnviz.errors import InputError

    folder = tmp_path / "photos"
    folder.mkdir()
    picture(folder / "b.png")
    picture(folder / "a.jpg")
    (folder / "notes.txt").write_text("not a picture")
    (folder / "more").mkdir()
    picture(folder / "more" / "d.png")
    one = picture(tmp_path / "c.png")
    found = pictures_in([str(folder), str(one)])
    assert [p.name for p in found.paths] == ["a.jpg", "b.png", "c.png"]
    assert [p.name for p in found.skipped] == ["notes.txt"]
    assert "skipped 1 file(s) not named as pictures (notes.txt" in found.note()
    assert "and 1 sub-folder(s), not entered (more)" in found.note()
    assert pictures_in(["The cat sat.", "A dog ran."]) is None
    with pytest.raises(InputError, match="not both"):
        pictures_in([str(one), "The cat sat."])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no picture"):
        pictures_in([str(empty)])


def _vit_explain(attentions, fusion, discard):
    """jacobgil/vit-explain's rollout, as its vit_rollout.py writes it, over (L, H, T, T)."""
    import torch

    result = torch.eye(attentions.shape[-1], dtype=torch.float64)[None]
    for attention in torch.from_numpy(attentions).double()[:, None]:
        fused = getattr(attention, fusion)(dim=1)
        fused = fused[0] if fusion == "mean" else fused.values
        flat = fused.view(fused.size(0), -1)
        _, indices = flat.topk(int(flat.size(-1) * discard), -1, False)
        indices = indices[indices != 0]
        flat[0, indices] = 0
        a = (fused + torch.eye(fused.size(-1), dtype=torch.float64)) / 2
        a = a / a.sum(dim=-1)[..., None]
        result = torch.matmul(a, result)
        yield result[0].numpy()


@pytest.mark.parametrize(("fusion", "discard"), [("max", 0.9), ("min", 0.5), ("mean", 0.0)])
def test_rollout_over_the_picture_is_vit_explains(vision_dirs, tmp_path, fusion, discard):
    path = picture(tmp_path / "photo.png")
    folder = vision_dirs["dinov2_with_registers"]
    att = attnviz.attention(str(path), model=str(folder), measure="rollout", fusion=fusion,
                            discard=discard, device="cpu")  # fmt: skip
    eager = _eager(folder, "dinov2_with_registers", path)
    plain = list(_vit_explain(eager, fusion, discard))
    assert att.per_layer and att.weights.shape == (2, 1, 21, 21)
    for layer, expected in enumerate(plain):
        assert np.abs(att.weights[layer, 0] - expected).max() <= 1e-5
    assert np.allclose(att.weights.sum(-1), 1.0, atol=1e-5)


def test_show_draws_rollout_over_the_picture_one_panel_a_layer(vision_dirs, tmp_path):
    path = picture(tmp_path / "photo.png")
    folder = vision_dirs["dinov2_with_registers"]
    result = CliRunner().invoke(app, ["show", str(path), "-m", str(folder), "--measure",
                                      "rollout", "--fusion", "max", "--discard", "0.9", "-q",
                                      "1,2", "-o", str(tmp_path / "out"), "-j", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "out").glob("*/picture-*"))
    assert written == ["picture-1-2-rollout.png", "picture-rollout.png"]
    assert "--hide-special" not in result.output
    result = CliRunner().invoke(app, ["show", str(path), "-m", str(folder), "--measure",
                                      "rollout", "--no-images"])  # fmt: skip
    said = " ".join(result.output.split())
    assert "What each layer's rollout does on this picture" in said
    assert "The tokens outside the patch grid take" in said  # named in the picture's views
    assert "--hide-special" not in said
