"""`attnviz report` over pictures: each head's numbers held to plain loops over the model's
eager attention, batches and blocks of rows that agree, the files it writes, bad input."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner
from vision_models import PREFIX, picture
from vision_models import eager as eager_rows

from attnviz.cli import app

runner = CliRunner()
DINO = "dinov2_with_registers"


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of two pictures of different content (and sizes), and a file to skip."""
    folder = tmp_path_factory.mktemp("photos")
    picture(folder / "a.png", size=(64, 48), seed=1)
    picture(folder / "b.jpg", size=(40, 56), seed=2)
    (folder / "notes.txt").write_text("not a picture")
    return folder


@pytest.fixture(scope="module")
def dino_report(vision_dirs, photos):
    """The report over `photos` by the tiny DINOv2 with 4 registers, and the model."""
    from attnviz.core.images import pictures_in
    from attnviz.core.models import load_model
    from attnviz.pipelines.picture_report import build_picture_report

    loaded = load_model(str(vision_dirs[DINO]), "cpu")
    return build_picture_report(loaded, pictures_in([str(photos)])), loaded


def _loop(weights, first, grid, patch):
    """One head's numbers on one picture from its (T, T) weights, pair by pair: mean
    attention distance (each row over the patch keys), sink and local shares, and CLS's
    entropy, what renormalising would leave out (distance without it)."""
    rows, cols = grid
    n = rows * cols
    distance, unnormalised, sink, local = 0.0, 0.0, 0.0, 0.0
    for q in range(n):
        row = weights[first + q]
        over = sum(row[first + k] for k in range(n))
        for k in range(n):
            (qr, qc), (kr, kc) = divmod(q, cols), divmod(k, cols)
            far = math.hypot(qr - kr, qc - kc) * patch
            distance += row[first + k] / over * far
            unnormalised += row[first + k] * far
            local += row[first + k] if abs(qr - kr) <= 1 and abs(qc - kc) <= 1 else 0.0
        sink += sum(row[:first])
    entropy = -sum(p * math.log(p) for p in weights[0] if p > 0)
    return distance / n, sink / n, local / n, entropy, unnormalised / n


def test_each_heads_numbers_are_plain_loops_over_eager_attention_averaged_over_pictures(
    vision_dirs, photos, dino_report
):
    report, _ = dino_report
    first, grid, patch = len(PREFIX[DINO]), (4, 4), 8
    assert report.pictures == 2 and report.grids == (grid,) and report.patch == patch
    assert report.outside == tuple(PREFIX[DINO]) and "notes.txt" in report.skipped[0]
    eager = [eager_rows(vision_dirs[DINO], DINO, photos / name).astype(np.float64)
             for name in ("a.png", "b.jpg")]  # fmt: skip
    assert not np.allclose(eager[0], eager[1], atol=1e-3)  # two pictures, two attentions
    for layer in range(2):
        for head in range(4):
            found = [_loop(e[layer, head], first, grid, patch) for e in eager]
            distance, sink, local, entropy, unnormalised = np.mean(found, axis=0)
            assert abs(report.distance[layer, head] - distance) <= 1e-5
            assert abs(report.sink[layer, head] - sink) <= 1e-6
            assert abs(report.local[layer, head] - local) <= 1e-6
            assert abs(report.cls_entropy[layer, head] - entropy) <= 1e-5
            # the registers and CLS take enough that leaving them in would show
            assert abs(report.distance[layer, head] - unnormalised) > 1e-2
            shares = np.mean([e[layer, head, 0, :first] for e in eager], axis=0)
            assert np.abs(report.cls_shares[:, layer, head] - shares).max() <= 1e-6


def test_batches_and_blocks_of_rows_give_the_same_numbers(vision_dirs, photos, dino_report):
    """One picture a pass equals both in one; a picture's rows summed in blocks of 1, 7 and
    every row equal the whole (`analysis.vision.patch_sums`)."""
    import attnviz
    from attnviz.analysis.vision import patch_sums
    from attnviz.core.images import pictures_in
    from attnviz.pipelines.picture_report import build_picture_report

    report, loaded = dino_report
    alone = build_picture_report(loaded, pictures_in([str(photos)]), batch_size=1)
    for name in ("distance", "sink", "local", "cls_entropy", "cls_shares"):
        assert np.abs(getattr(alone, name) - getattr(report, name)).max() <= 1e-6, name
    att = attnviz.attention(str(photos / "a.png"), model=str(vision_dirs[DINO]), device="cpu")
    weights = att.weights[1]  # (H, T, T)
    whole = patch_sums(weights, 0, att.picture)
    for size in (1, 7, weights.shape[1]):
        blocks = [patch_sums(weights[:, s : s + size], s, att.picture)
                  for s in range(0, weights.shape[1], size)]  # fmt: skip
        assert np.abs(sum(blocks) - whole).max() <= 1e-9


def test_pictures_of_several_sizes_pass_apart_and_average_what_show_says_of_each(tmp_path):
    """A processor that keeps each picture's shape gives grids of two sizes: they cannot share
    a pass, and the report is the mean of what `show` finds on each picture."""
    import transformers
    from transformers import AutoConfig, AutoModel
    from vision_models import _VIT

    import attnviz
    from attnviz.analysis.vision import vision_heads
    from attnviz.core.images import pictures_in
    from attnviz.core.models import load_model
    from attnviz.pipelines.picture_report import build_picture_report

    folder = tmp_path / "dinov2"
    AutoModel.from_config(AutoConfig.for_model("dinov2", **_VIT)).save_pretrained(folder)
    transformers.BitImageProcessor(size={"shortest_edge": 32}, do_center_crop=False
                                   ).save_pretrained(folder)  # fmt: skip
    paths = [picture(tmp_path / f"{i}.png", size=size, seed=i)
             for i, size in enumerate([(64, 48), (48, 64), (64, 48)])]  # fmt: skip
    loaded = load_model(str(folder), "cpu")
    report = build_picture_report(loaded, pictures_in([str(p) for p in paths]), batch_size=3)
    assert report.pictures == 3 and report.grids == ((4, 5), (5, 4))
    each = []
    for path in paths:
        att = attnviz.attention(str(path), model=str(folder), device="cpu")
        each.append([[h.distance, h.sink, h.local, h.cls_entropy]
                     for h in vision_heads(att, [0, 1], [0, 1, 2, 3])])  # fmt: skip
    mean = np.mean(each, axis=0).reshape(2, 4, 4)  # (L, H, numbers)
    found = np.stack([report.distance, report.sink, report.local, report.cls_entropy], -1)
    assert np.abs(found - mean).max() <= 1e-5


def test_report_over_a_folder_writes_the_analysis_numbers(
    vision_dirs, photos, dino_report, tmp_path
):
    report, _ = dino_report
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", str(photos), "-m", str(vision_dirs[DINO]), "-o",
                                 str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # as one line, however the terminal wrapped it
    assert "· 2 pictures · 4 × 4 patches of 8 × 8 px" in said
    assert "skipped 1 file(s) not named as pictures (notes.txt" in said
    assert {p.name for p in out.iterdir()} == {"heads.csv", "heads.json", "mean-distance.png",
                                                "done.json"}  # fmt: skip
    assert (out / "mean-distance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    found = json.loads((out / "heads.json").read_text())
    assert found["pictures"] == 2 and found["model"]["pictures"] is True
    assert found["heads"] == report.rows()
    heads = [(layer, head) for layer in range(2) for head in range(4)]
    assert [(r["layer"], r["head"]) for r in found["heads"]] == heads
    row = found["heads"][6]  # layer 1, head 2
    assert row["mean_distance_px"] == pytest.approx(report.distance[1, 2], abs=1e-12)
    assert row["cls_share_reg3"] == pytest.approx(report.cls_shares[4, 1, 2], abs=1e-12)
    assert row["role"] in ("sink", "local", "global", "mixed")
    with open(out / "heads.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert float(table[6]["mean_distance_px"]) == row["mean_distance_px"]
    assert list(table[0])[:4] == ["layer", "head", "role", "mean_distance_px"]


def test_chosen_heads_of_a_model_without_cls(vision_dirs, photos, tmp_path):
    """SigLIP has no CLS token: no CLS columns, nothing outside the grid to sink into."""
    model = str(vision_dirs["siglip"])
    result = runner.invoke(app, ["report", str(photos / "a.png"), "-m", model, "-o",
                                 str(tmp_path / "out"), "--layer", "1", "--head", "2",
                                 "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (only,) = json.loads(result.output)["heads"]
    assert (only["layer"], only["head"], only["sink"]) == (1, 2, 0.0)
    assert "cls_entropy" not in only and not [k for k in only if k.startswith("cls_share")]
    assert only["mean_distance_px"] > 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["{empty}", "-m", "{vit}"], "holds no picture"),
        (["{photo}"], "reads text, not pictures: give it sentences"),
        (["A sentence.", "-m", "{vit}"], "give it picture files or folders"),
        (["-m", "{vit}"], "give it picture files or folders"),
        (["{photo}", "A sentence.", "-m", "{vit}"], "give pictures (files or folders) or texts"),
        (["{broken}", "-m", "{vit}"], "no picture could be read: skipped"),
        (["{photo}", "-m", "{vit}", "--treebank", "t.conllu"], "--treebank is for text"),
        (["{photo}", "-m", "{vit}", "--importance", "ablation"], "--importance is for text"),
        (["{photo}", "-m", "{vit}", "--threshold", "local=0.6"], "--threshold is for text"),
        (["{photo}", "-m", "{vit}", "--words"], "--words is for text"),
        (["{photo}", "-m", "{vit}", "--truncate"], "--truncate is for text"),
        (["{photo}", "-m", "{vit}", "--shard", "1/2"], "--shard is for text"),
        (["{photo}", "-m", "{vit}", "-f", "s.txt"], "give pictures (files, folders) or --file"),
        (["{photo}", "-m", "{vit}", "--layer", "5"], "layer 5 out of range"),
    ],
)
def test_bad_input_gets_one_line_exit_2_and_writes_nothing(vision_dirs, tmp_path, args, said):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no picture here")
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    named = dict(empty=tmp_path / "empty", vit=vision_dirs["vit"], broken=tmp_path / "broken.png",
                 photo=picture(tmp_path / "photo.png"))  # fmt: skip
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", *(a.format(**named) for a in args), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) <= 3  # the line, wrapped at most twice
    assert not out.exists()


def test_the_apis_report_reads_a_folder_of_pictures_as_the_cli_does(vision_dirs, tmp_path):
    import attnviz

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        picture(folder / f"p{i}.png", seed=i)
    model = str(vision_dirs["vit"])
    found = attnviz.report(folder, model=model)
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", str(folder), "-m", model, "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads((out / "heads.json").read_text())
    assert len(written["heads"]) == 8 and found.as_dict()["heads"] == written["heads"]
