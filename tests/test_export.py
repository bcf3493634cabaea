"""`attnviz export`: inputs, outputs, batching parity, resuming, interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.core.inputs import read_sentences
from attnviz.errors import InputError

runner = CliRunner()
SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog, twice!",
    "Héllo 世界 🙂",
    "Short.",
    "Birds sing in the morning while the town sleeps.",
]


def _export(tiny, out, *args, sentences=SENTENCES):
    return runner.invoke(
        app, ["export", *sentences, "-m", str(tiny), "-o", str(out), *map(str, args)]
    )


def _all_images_whole(root):
    images = [p for p in root.rglob("*.png")]
    for path in images:
        with Image.open(path) as image:
            image.verify()  # raises on a truncated or corrupt file
    assert not list(root.rglob(".*.part"))
    return len(images)


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_tree_manifest_and_counts(tiny_model_dirs, tmp_path):
    result = _export(tiny_model_dirs["bert"], tmp_path)
    assert result.exit_code == 0, result.output
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert folders[0].startswith("0001-the-cat-sat-on-the-mat-") and len(folders) == 5
    per_sentence = 1 + 2 + 2 * 4  # overview, 2 layer grids, 8 heads
    assert _all_images_whole(tmp_path) == 5 * per_sentence
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 5 and manifest["counts"]["figures"] == 5 * per_sentence
    first = manifest["sentences"][0]
    assert first["tokens"][0] == "[CLS]" and len(first["files"]) == per_sentence
    assert all((tmp_path / f).is_file() for s in manifest["sentences"] for f in s["files"])
    csv_lines = (tmp_path / "manifest.csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0].startswith("index,line,status,folder,n_tokens,tokens,files,text")
    assert len(csv_lines) == 6
    assert "5 sentences · 5 written" in " ".join(result.output.split())


def test_batched_export_equals_unbatched_attention(tiny_model_dirs, loaded_tiny, tmp_path):
    from attnviz.core.extract import extract

    result = _export(
        tiny_model_dirs["gpt2"], tmp_path, "--save-raw", "--batch-size", 3, "--figures", "overview"
    )
    assert result.exit_code == 0, result.output
    for folder in sorted(p for p in tmp_path.iterdir() if p.is_dir()):
        raw = np.load(folder / "attention.npz")
        text = SENTENCES[int(folder.name[:4]) - 1]
        alone = extract(loaded_tiny["gpt2"], text)
        assert raw["attention"].shape == alone.weights.shape
        np.testing.assert_allclose(raw["attention"], alone.weights, atol=1e-5)
        assert tuple(raw["tokens"]) == alone.tokens


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_rerun_skips_complete_and_overwrite_redoes(tiny_model_dirs, tmp_path):
    tiny = tiny_model_dirs["bert"]
    assert _export(tiny, tmp_path, "--figures", "heads").exit_code == 0
    stamp = (
        (next(tmp_path.glob("0002-a-quick-brown-fox-jumps-over-the-*")) / "done.json")
        .stat()
        .st_mtime_ns
    )
    again = _export(tiny, tmp_path, "--figures", "heads")
    assert "0 written · 5 already complete" in " ".join(again.output.split())
    assert (
        next(tmp_path.glob("0002-a-quick-brown-fox-jumps-over-the-*")) / "done.json"
    ).stat().st_mtime_ns == stamp
    redo = _export(tiny, tmp_path, "--figures", "heads", "--overwrite")
    assert "5 written · 0 already complete" in " ".join(redo.output.split())
    changed = _export(tiny, tmp_path, "--figures", "heads", "--layers", "1")
    assert "5 written" in " ".join(changed.output.split())  # other settings: not complete
    heads = sorted(
        p.name for p in next(tmp_path.glob("0001-the-cat-sat-on-the-mat-*")).glob("*.png")
    )
    assert heads == [f"layer-01-head-0{h}.png" for h in range(4)]  # old files were removed


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_jobs_give_the_same_files(tiny_model_dirs, tmp_path):
    tiny = tiny_model_dirs["bert"]
    assert _export(tiny, tmp_path / "one").exit_code == 0
    assert _export(tiny, tmp_path / "two", "--jobs", 2).exit_code == 0
    one = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.png"))
    two = sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*.png"))
    assert one == two
    name = one[-1]
    assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_too_long_lines_are_skipped_or_truncated_and_counted(tiny_model_dirs, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("Fine line.\n\n" + " ".join(["word"] * 100) + "\nAnother fine line.\n")
    args = [
        "export",
        "-f",
        str(source),
        "-m",
        str(tiny_model_dirs["bert"]),
        "--figures",
        "overview",
    ]
    skipped = runner.invoke(app, [*args, "-o", str(tmp_path / "a")])
    text = " ".join(skipped.output.split())
    assert skipped.exit_code == 0
    assert "line 3: skipped, text is 102 tokens long" in text
    assert (
        "2 written" in text and "1 too long (skipped)" in text and "1 blank lines skipped" in text
    )
    cut = runner.invoke(app, [*args, "-o", str(tmp_path / "b"), "--truncate"])
    text = " ".join(cut.output.split())
    assert "3 written" in text and "1 truncated" in text and "kept the first 64 of 102" in text


def test_reading_input(tmp_path, monkeypatch):
    good = tmp_path / "good.txt"
    good.write_text("one\n\n  \ntwo\n", encoding="utf-8")
    read = read_sentences(str(good), None)
    assert [s.text for s in read.items] == ["one", "two"] and read.blank == 2
    assert [s.line for s in read.items] == [1, 4]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\ncaf\xe9\n")
    with pytest.raises(InputError, match="line 3: not valid UTF-8"):
        read_sentences(str(bad), None)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match="has no sentences"):
        read_sentences(str(empty), None)
    with pytest.raises(InputError, match="no such file"):
        read_sentences(str(tmp_path / "missing.txt"), None)
    with pytest.raises(InputError, match="is a folder"):
        read_sentences(str(tmp_path), None)


@pytest.mark.parametrize(
    "args, message",
    [
        (["-f", "missing.txt"], "no such file: missing.txt"),
        (["-f", "."], "is a folder"),
        ([], "give sentences as arguments"),
        (["x", "-l", "5"], "layer 5 out of range: this model has layers 0–1"),
    ],
)
def test_cli_bad_input(tiny_model_dirs, tmp_path, args, message):
    result = runner.invoke(
        app, ["export", *args, "-m", str(tiny_model_dirs["bert"]), "-o", str(tmp_path)]
    )
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_stdin_and_unwritable_output(tiny_model_dirs, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = runner.invoke(
        app, ["export", "x", "-m", str(tiny_model_dirs["bert"]), "-o", str(blocker)]
    )
    assert bad.exit_code == 2 and "it is a file" in bad.output
    piped = runner.invoke(
        app,
        ["export", "-f", "-", "-m", str(tiny_model_dirs["bert"]), "-o", str(tmp_path / "o"),
         "--figures", "overview"],
        input="from stdin\n\nsecond\n",
    )  # fmt: skip
    assert piped.exit_code == 0 and "2 written" in " ".join(piped.output.split())


@pytest.mark.slow  # a real process, started, signalled or killed
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_process_leaves_whole_files_and_resumes(tiny_model_dirs, tmp_path, sig):
    source = tmp_path / "in.txt"
    # Many cheap sentences (one overview each): a busy machine that starves this polling loop
    # for seconds still cannot finish them all before the signal lands.
    total = 120
    source.write_text(
        "\n".join(f"Sentence number {i} is about cats and dogs." for i in range(total))
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnviz", "export", "-f", str(source), "-o", str(out),
               "-m", str(tiny_model_dirs["bert"]), "--batch-size", "1",
               "--figures", "overview"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(list(out.glob("*/done.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(sig)
    process.communicate(timeout=60)
    finished = len(list(out.glob("*/done.json")))
    assert 2 <= finished < total, "the run must be stopped mid-way for this test to mean anything"
    if sig == signal.SIGINT:
        assert process.returncode == 130
        assert json.loads((out / "manifest.json").read_text())["interrupted"] is True
    for path in out.rglob("*.png"):  # whatever exists is whole (temp files are not images)
        with Image.open(path) as image:
            image.verify()
    resumed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert resumed.returncode == 0, resumed.stderr
    text = " ".join(resumed.stdout.split())
    assert f"{total - finished} written · {finished} already complete" in text
    assert len(list(out.glob("*/done.json"))) == total
    assert _all_images_whole(out) == total


def test_json_prints_the_run_summary(tiny_model_dirs, tmp_path):
    result = _export(tiny_model_dirs["bert"], tmp_path, "--figures", "overview", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sentences"] == 5 and data["written"] == 5 and data["figures"] == 5
    assert data["manifest"] == str(tmp_path / "manifest.json")
    again = json.loads(
        _export(tiny_model_dirs["bert"], tmp_path, "--figures", "overview", "--json").stdout
    )
    assert again["complete"] == 5 and again["written"] == 0
