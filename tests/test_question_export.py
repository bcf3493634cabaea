"""`attnviz export QUESTIONS.jsonl` (issue 54, item 1): each picture and prompt's maps (and
the answer's, written or given) equal the model's eager attention; layout.json puts each
image token on its cell; its vision tower's maps equal the tower's eager attention; a re-run
resumes, a changed picture is redone, and so is every question with --no-tower; bad input is
one line, exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import eager, picture, save, tower_eager

from attnviz.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    return save("llava", tmp_path_factory.mktemp("vlm") / "llava")


def _questions(folder):
    picture(folder / "a.png", (128, 64), seed=1)
    picture(folder / "b.png", (96, 64), seed=2)
    lines = [{"picture": "a.png", "prompt": "What is on the table?"},
             {"picture": "b.png", "prompt": "Is there a cat?", "target": "A cat."}]  # fmt: skip
    path = folder / "q.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_each_questions_maps_equal_eager_attention_and_resume(llava, tmp_path):
    from attnviz.core import vlm
    from attnviz.core.models import load_model

    path, out = _questions(tmp_path), tmp_path / "out"
    args = ["export", str(path), "-m", str(llava), "-o", str(out), "--generate", "2",
            "--save-raw", "--figures", "overview"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 2
    loaded = load_model(str(llava), "cpu")
    for record, name in zip(manifest["sentences"], ("a.png", "b.png")):
        folder = out / record["folder"]
        assert record["picture"] == name
        assert {p.name for p in folder.iterdir()} == {"overview.png", "layout.json",
                                                       "attention.npz", "done.json",
                                                       "tower.json", "tower-layer-0.png",
                                                       "tower-layer-1.png"}  # fmt: skip
        saved = np.load(folder / "attention.npz")
        prompt = vlm.encode(loaded, tmp_path / name, record["text"])
        start = int(saved["continuation_start"])
        assert start == len(prompt.ids)
        tokens = saved["attention"].shape[-1]
        assert tokens == len(record["tokens"]) and tokens > start  # the answer's too
        expected = eager(llava, _whole_ids(loaded, prompt, record), prompt.inputs)
        assert np.abs(saved["attention"] - expected).max() < 1e-5
        layout = json.loads((folder / "layout.json").read_text())
        assert layout["picture"] == name and layout["parts"][0]["grid"] == [6, 6]
        for label, index in layout["cells"].items():
            assert record["tokens"][index] == label
        tower = json.loads((folder / "tower.json").read_text())
        assert tower["drawn"] == "cls" and tower["marks"] == [0] and len(tower["heads"]) == 8
        for layer, probs in enumerate(tower_eager(llava, list(prompt.ids), prompt.inputs)):
            cls_row = probs[0, :, 0]  # (H, N): CLS's row, what the figures draw
            assert np.abs(saved["tower_maps"][layer] - cls_row).max() < 1e-5
    assert manifest["sentences"][1]["continuation"]["how"] == "teacher-forced"
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "2 questions already complete" in again.output
    picture(tmp_path / "b.png", (96, 64), seed=3)  # b's bytes change: its question is redone
    third = runner.invoke(app, [*args, "--json"])
    assert third.exit_code == 0, third.output
    counts = json.loads(third.output)
    assert (counts["written"], counts["complete"]) == (1, 1)
    alone = runner.invoke(app, [*args, "--json", "--no-tower"])  # written with the tower: redone
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.output)["written"] == 2
    assert not list(out.glob("*/tower*"))


def _whole_ids(loaded, prompt, record):
    """The prompt's ids and the answer's, as the model wrote or was given it."""
    from attnviz.core import generation

    target = record["target"]
    settings = generation.Settings(None if target else 2, target)
    whole, _ = generation.write(loaded, prompt, settings, [0, 1])
    return list(whole.ids)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-m", None], "is a text model: it reads no picture"),
        (["--html"], "--html is not available in attnviz export over pictures and questions"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(llava, tmp_path, args, said):
    path, out = _questions(tmp_path), tmp_path / "out"
    model = ["-m", str(llava)] if "-m" not in args else []
    args = [arg for arg in args if arg not in ("-m", None)]
    result = runner.invoke(app, ["export", str(path), *model, *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert said in result.output and "\n" not in result.output.strip()
    assert not out.exists()
