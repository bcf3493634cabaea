"""`attnviz show` end to end through Typer's CliRunner, and its failure modes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from attnviz.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_show_bundled_writes_every_figure_and_summary(tmp_path):
    result = invoke("show", "The cat sat on the mat.", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    (folder,) = tmp_path.glob("the-cat-sat-on-the-mat-*")
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert len(pngs) == 1 + 6 + 72
    assert "overview.png" in pngs and "layer-05.png" in pngs and "layer-05-head-11.png" in pngs
    assert not list(folder.glob(".*.part"))
    with Image.open(folder / "layer-00-head-00.png") as image:
        assert image.format == "PNG" and min(image.size) > 200
    assert "Most-attended non-special token per head" in result.output
    assert "L5" in result.output and "H11" in result.output
    assert "wrote 79 images" in result.output


def test_show_json_matches_extraction(tmp_path, bundled):
    from attnviz.extract import extract

    text = "Time flies like an arrow."
    result = invoke("show", text, "--json", "--no-images", "-l", 1, "-H", 4, "-k", 2)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"]["n_heads"] == 12 and len(data["heads"]) == 1
    head = data["heads"][0]
    received = extract(bundled, text).weights[1, 4].mean(axis=0)
    best = int(np.argmax(received))
    assert head["top"][0]["index"] == best
    assert head["top"][0]["weight"] == pytest.approx(float(received[best]), abs=1e-6)
    assert len(head["top"]) == 2


def test_single_head_draws_terminal_heatmap_and_detail(tmp_path):
    result = invoke("show", "Birds sing.", "--no-images", "-l", 0, "-H", 2)
    assert result.exit_code == 0, result.output
    assert "What each head attends to" in result.output
    assert "layer 0 · head 2: each row is a query token" in result.output
    assert "scale 0" in result.output


def test_show_on_tiny_gpt2_with_words_and_hidden_specials(tiny_model_dirs, tmp_path):
    result = invoke(
        "show",
        "The cat sat on the mat.",
        "-m",
        tiny_model_dirs["gpt2"],
        "--words",
        "--out",
        tmp_path,
    )
    assert result.exit_code == 0, result.output
    assert "word view" in result.output
    assert len(list(tmp_path.glob("*/*.png"))) == 1 + 2 + 2 * 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["show", ""], "text is empty"),
        (["show", "   "], "text is empty"),
        (["show", "hi", "-l", "6"], "layer 6 out of range: this model has layers 0–5"),
        (["show", "hi", "-H", "12"], "head 12 out of range: this model has heads 0–11"),
        (["show", "hi", "-m", "./no/such/model"], "no model directory at ./no/such/model"),
        (["show", "hi", "-m", "nobody/no-model"], "download it once while online"),
        (["show", "hi", "--cmap", "rainbowz"], "unknown colour map 'rainbowz'"),
        (["show", " ".join(["word"] * 600)], "602 tokens long; this model takes at most 512"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = invoke(*args, "--no-images")
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2  # one message, maybe soft-wrapped


def test_unwritable_output_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import attnviz.models

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model must not be loaded when the output folder is bad")

    monkeypatch.setattr(attnviz.models, "load_model", no_load)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = invoke("show", "hi", "--out", blocker / "sub")
    assert result.exit_code == 2
    assert "it is a file, not a folder" in result.output


def test_truncate_says_what_it_cut():
    result = invoke("show", " ".join(["word"] * 600), "--truncate", "--no-images", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert len(data["tokens"]) == 512
    assert "kept the first 512 of 602 tokens" in data["notes"][0]


def test_python_dash_m_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "show" in done.stdout
