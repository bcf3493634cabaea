"""export over a folder of pictures and compare of two pictures, with a vision model."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner
from vision_models import picture

import attnviz
from attnviz.cli import app

runner = CliRunner()


def test_export_over_a_folder_of_pictures_batched_equals_alone_and_resumes(vision_dirs, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    paths = [picture(folder / f"p{i}.png", size=(64, 48), seed=i) for i in range(3)]
    (folder / "notes.txt").write_text("not a picture")
    (folder / "broken.png").write_bytes(b"no")
    model = str(vision_dirs["dinov2_with_registers"])
    out = tmp_path / "out"
    args = ["export", str(folder), "-m", model, "-o", str(out), "--save-raw", "-q", "1,2",
            "--batch-size", "2", "--figures", "overview"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "skipped 1 file(s) not named as pictures (notes.txt" in said
    assert "broken.png: not a picture attnviz can read" in said
    assert "4 pictures · 3 written" in said and "1 not readable (skipped)" in said
    manifest = json.loads((out / "manifest.json").read_text())
    written = [s for s in manifest["sentences"] if s["status"] == "written"]
    assert [s["text"] for s in written] == [str(p) for p in paths]
    for path, row in zip(paths, written):
        raw = np.load(out / row["folder"] / "attention.npz")
        alone = attnviz.attention(str(path), model=model, device="cpu")
        assert np.abs(raw["attention"] - alone.weights).max() <= 1e-5  # batched equals alone
        assert tuple(raw["grid"]) == (4, 4) and int(raw["first_patch"]) == 5
        names = sorted(p.name for p in (out / row["folder"]).glob("picture-*.png"))
        assert names == ["picture-1-2-layer-0.png", "picture-1-2-layer-1.png",
                         "picture-layer-0.png", "picture-layer-1.png"]  # fmt: skip
    again = runner.invoke(app, args)
    assert "3 already complete" in " ".join(again.output.split())
    picture(paths[1], size=(64, 48), seed=9)  # the same name, another picture: redone
    third = runner.invoke(app, args)
    assert "1 written · 2 already complete" in " ".join(third.output.split())


def test_compare_of_two_pictures_aligns_their_patches(vision_dirs, tmp_path):
    a, b = picture(tmp_path / "a.png", seed=1), picture(tmp_path / "b.png", seed=2)
    model = str(vision_dirs["vit"])
    result = runner.invoke(app, ["compare", str(a), str(b), "-m", model, "--no-images", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    one, two = (attnviz.attention(str(p), model=model, device="cpu") for p in (a, b))
    # every token aligned by grid position: the divergence is over the same 17 tokens' rows
    assert found["view"] == "token"
    divergence = np.array(found["divergence"])
    assert divergence.shape == (2, 4) and (divergence > 0).all()
    p, q = one.weights[1, 0], two.weights[1, 0]
    m = (p + q) / 2
    js = 0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)
    assert abs(divergence[1, 0] - js.mean()) <= 1e-4


def test_pictures_and_texts_are_refused_where_they_do_not_belong(vision_dirs, tmp_path):
    photo = picture(tmp_path / "photo.png")
    vit = str(vision_dirs["vit"])
    cases = [
        (["export", str(photo), "-o", str(tmp_path / "o1")], "reads text, not pictures"),
        (["export", "A sentence.", "-m", vit, "-o", str(tmp_path / "o2")], "give it picture files"),
        (["export", str(photo), "A sentence.", "-m", vit], "give pictures (files or folders)"),
        (["compare", str(photo), "-m", vit], "give two pictures"),
        (["compare", str(tmp_path), str(photo), "-m", vit], "two picture files, not folders"),
    ]
    for args, said in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
        assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_two_vision_models_compare_one_picture_by_grid_position(vision_dirs, tmp_path):
    photo = picture(tmp_path / "photo.png")
    args = ["compare", str(photo), "-m", str(vision_dirs["vit"]), "--against-model",
            str(vision_dirs["clip_vision_model"]), "--no-images", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert np.array(json.loads(result.output)["divergence"]).shape == (2, 4)


def test_a_picture_too_large_to_read_safely_is_one_line(vision_dirs, tmp_path, monkeypatch):
    from PIL import Image

    photo = picture(tmp_path / "photo.png")  # 64 × 48: past twice a limit of 100 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    result = runner.invoke(app, ["show", str(photo), "-m", str(vision_dirs["vit"])])
    assert result.exit_code == 2 and "too large to read safely" in result.output


def test_views_of_a_register_and_a_folder_given_to_show(vision_dirs, tmp_path):
    from attnviz.outputs.figures.pictures import overlay_name

    photo = picture(tmp_path / "photo.png")
    att = attnviz.attention(str(photo), model=str(vision_dirs["dinov2_with_registers"]))
    names = [overlay_name(att, 1, query, "png") for query in (0, 3, att.picture.index(1, 2))]
    assert names == ["picture-layer-1.png", "picture-reg2-layer-1.png",
                     "picture-1-2-layer-1.png"]  # fmt: skip
    assert overlay_name(att, None, 3, "png") == "picture-reg2-rollout.png"
    result = runner.invoke(app, ["show", str(tmp_path), "-m", str(vision_dirs["vit"])])
    assert result.exit_code == 2 and "is a folder: show reads one picture" in result.output


def test_the_apis_compare_reads_two_pictures(vision_dirs, tmp_path):
    a, b = picture(tmp_path / "a.png", seed=1), picture(tmp_path / "b.png", seed=2)
    model = str(vision_dirs["vit"])
    found = attnviz.compare(str(a), str(b), model=model)
    cli = runner.invoke(app, ["compare", str(a), str(b), "-m", model, "--no-images", "--json"])
    assert np.allclose(found.divergence, json.loads(cli.output)["divergence"], atol=1e-6)


def test_compare_draws_each_moved_heads_cls_over_both_pictures(vision_dirs, tmp_path):
    from attnviz.outputs.figures import Style
    from attnviz.outputs.figures.pictures import blend, pair_figure

    a, b = picture(tmp_path / "a.png", seed=1), picture(tmp_path / "b.png", seed=2)
    model = str(vision_dirs["vit"])
    out = tmp_path / "out"
    result = runner.invoke(app, ["compare", str(a), str(b), "-m", model, "--top", "1", "-o",
                                 str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(list(out.glob("*/layer-*-head-*-pictures.png"))) == 1
    one, two = (attnviz.attention(str(p), model=model, device="cpu") for p in (a, b))
    style = Style()
    fig = pair_figure(one, two, 1, 2, style)
    panels = [artist.pixels for artist in fig.artists if hasattr(artist, "pixels")]
    grids = [att.picture.patches(att.weights[1, 2, 0]) for att in (one, two)]
    top = max(float(grid.max()) for grid in grids)  # one colour scale for A and B
    nearest = np.arange(220) * 32 // 220  # 32 picture pixels drawn at 220
    for drawn, att, grid in zip(panels, (one, two), grids, strict=True):
        expected = blend(att.picture.pixels, grid, 8, style.colour_map(), top)
        assert np.array_equal(drawn, expected[nearest][:, nearest])
