"""`attnviz export`: inputs, outputs, batching parity, resuming, interruption."""

from __future__ import annotations

import json
import os
import re
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
from tests.conftest import same_pictures

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


@pytest.fixture(scope="module")
def every_figure(tiny_model_dirs, tmp_path_factory):
    """SENTENCES exported with every figure by the tiny BERT, in one process: the folder and
    the command's result, read by the tests that need that run (none changes it)."""
    out = tmp_path_factory.mktemp("every-figure")
    result = _export(tiny_model_dirs["bert"], out)
    assert result.exit_code == 0, result.output
    return out, result


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_tree_manifest_and_counts(every_figure):
    out, result = every_figure
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders[0].startswith("0001-the-cat-sat-on-the-mat-") and len(folders) == 5
    per_sentence = 1 + 2 + 2 * 4  # overview, 2 layer grids, 8 heads
    assert _all_images_whole(out) == 5 * per_sentence
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 5 and manifest["counts"]["figures"] == 5 * per_sentence
    first = manifest["sentences"][0]
    assert first["tokens"][0] == "[CLS]" and len(first["files"]) == per_sentence
    assert all((out / f).is_file() for s in manifest["sentences"] for f in s["files"])
    csv_lines = (out / "manifest.csv").read_text(encoding="utf-8").splitlines()
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
    assert "nothing to do: 5 sentences already complete" in " ".join(again.output.split())
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
def test_jobs_give_the_same_files(tiny_model_dirs, every_figure, tmp_path):
    alone = every_figure[0]  # the same command, drawn in this process
    assert _export(tiny_model_dirs["bert"], tmp_path / "two", "--jobs", 2).exit_code == 0
    one = sorted(p.relative_to(alone) for p in alone.rglob("*.png"))
    two = sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*.png"))
    assert one == two
    name = one[-1]
    same_pictures(alone / name, tmp_path / "two" / name)


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


def _complete_everywhere(out, said):
    """The sentences an interrupted export calls complete, checked to be the same number in its
    message, in manifest.json's counts and rows, and as folders holding done.json."""
    n = int(re.search(r"(\d+) of \d+ sentences are complete", " ".join(said.split())).group(1))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["interrupted"] is True
    assert manifest["counts"]["written"] + manifest["counts"]["complete"] == n, (n, manifest)
    listed = [s["folder"] for s in manifest["sentences"] if s["status"] != "pending"]
    assert sorted(listed) == _sentence_folders(out) and len(listed) == n
    return n


def _interrupt_after(monkeypatch, n):
    """Ctrl-C right after the `n`th done.json is written, before export counts that sentence."""
    from attnviz.pipelines import export as pipeline

    real, written = pipeline.write_done, []

    def write_done(folder, settings, record):
        path = real(folder, settings, record)
        written.append(folder.name)
        if len(written) == n:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(pipeline, "write_done", write_done)
    return written


def test_ctrl_c_after_a_done_json_still_counts_that_sentence(
    tiny_model_dirs, tmp_path, monkeypatch
):
    tiny = tiny_model_dirs["bert"]
    _interrupt_after(monkeypatch, 2)
    result = _export(tiny, tmp_path, "--figures", "overview")
    assert result.exit_code == 130, result.output
    assert _complete_everywhere(tmp_path, result.output) == 2


def test_an_interrupted_run_lists_no_folder_of_other_settings(
    tiny_model_dirs, tmp_path, monkeypatch
):
    tiny = tiny_model_dirs["bert"]
    assert _export(tiny, tmp_path, "--figures", "overview", "--dpi", "40").exit_code == 0
    written = _interrupt_after(monkeypatch, 1)
    result = _export(tiny, tmp_path, "--figures", "overview", "--dpi", "30")
    assert result.exit_code == 130 and "1 of 5 sentences are complete" in result.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    listed = [s["folder"] for s in manifest["sentences"] if s["status"] != "pending"]
    assert listed == written and manifest["counts"]["written"] == 1
    monkeypatch.undo()
    resumed = _export(tiny, tmp_path, "--figures", "overview", "--dpi", "30")
    assert "4 written · 1 already complete" in " ".join(resumed.output.split())


@pytest.mark.slow  # a real process, started, signalled or killed
@pytest.mark.parametrize(
    ("sig", "jobs"), [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGKILL, 1)]
)
def test_interrupted_process_leaves_whole_files_and_resumes(tiny_model_dirs, tmp_path, sig, jobs):
    source = tmp_path / "in.txt"
    # Many cheap sentences (one overview each): a busy machine that starves this polling loop
    # for seconds still cannot finish them all before the signal lands (and a Ctrl-C Python
    # swallowed still stops export at its next text: `interrupts.asked`).
    total = 40
    source.write_text(
        "\n".join(f"Sentence number {i} is about cats and dogs." for i in range(total))
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnviz", "export", "-f", str(source), "-o", str(out),
               "-m", str(tiny_model_dirs["bert"]), "--batch-size", "1",
               "--figures", "overview", "--jobs", str(jobs)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(list(out.glob("*/done.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    finished = len(list(out.glob("*/done.json")))
    assert 2 <= finished < total, "the run must be stopped mid-way for this test to mean anything"
    if sig == signal.SIGINT:
        assert process.returncode == 130
        assert b"Traceback" not in err and err.count(b"interrupted: ") == 1, err
        # drawing processes finish their sentences after Ctrl-C: those count too
        assert _complete_everywhere(out, err.decode()) == finished
    for path in out.rglob("*.png"):  # whatever exists is whole (temp files are not images)
        with Image.open(path) as image:
            image.verify()
    # The same command resumes, here: what it reads is what the stopped process left (a
    # process of its own would only add seconds of importing torch again).
    resumed = runner.invoke(app, command[3:])
    assert resumed.exit_code == 0, resumed.output
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


def _sentence_folders(root):
    """Folders holding an exported sentence (its done.json), by name."""
    return sorted(p.parent.name for p in root.glob("*/done.json"))


def test_another_sentence_list_is_refused_and_overwrite_replaces_it(tiny_model_dirs, tmp_path):
    tiny = tiny_model_dirs["bert"]
    assert _export(tiny, tmp_path, "--figures", "overview", sentences=SENTENCES[:3]).exit_code == 0
    old = _sentence_folders(tmp_path)
    assert [name[:5] for name in old] == ["0001-", "0002-", "0003-"]
    (tmp_path / "notes.txt").write_text("mine")  # the user's files: never touched
    (tmp_path / old[2] / "my-notes.txt").write_text("mine too")
    manifest = (tmp_path / "manifest.json").read_bytes()

    new = ["A new sentence.", "And another one."]
    refused = _export(tiny, tmp_path, "--figures", "overview", sentences=new)
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    message = refused.output.strip()
    assert len(message.splitlines()) == 1, message
    assert "3 sentence folders" in message and "--out" in message and "--overwrite" in message
    assert _sentence_folders(tmp_path) == old  # nothing written, nothing removed
    assert (tmp_path / "manifest.json").read_bytes() == manifest

    replaced = _export(tiny, tmp_path, "--figures", "overview", "--overwrite", sentences=new)
    assert replaced.exit_code == 0, replaced.output
    text = " ".join(replaced.output.split())
    assert "removed 2 sentence folders of an earlier export" in text
    assert f"kept {tmp_path / old[2]}" in text  # it holds a file attnviz did not write
    folders = _sentence_folders(tmp_path)
    assert [name[:5] for name in folders] == ["0001-", "0002-"]  # each number once
    assert folders[0].startswith("0001-a-new-sentence-")
    assert folders[1].startswith("0002-and-another-one-")
    listed = json.loads((tmp_path / "manifest.json").read_text())["sentences"]
    assert [s["folder"] for s in listed] == folders and [s["text"] for s in listed] == new
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert [p.name for p in (tmp_path / old[2]).iterdir()] == ["my-notes.txt"]
    assert not (tmp_path / old[0]).exists() and not (tmp_path / old[1]).exists()


def test_a_longer_list_resumes_the_export_of_its_first_sentences(tiny_model_dirs, tmp_path):
    tiny = tiny_model_dirs["bert"]
    assert _export(tiny, tmp_path, "--figures", "overview", sentences=SENTENCES[:3]).exit_code == 0
    longer = _export(tiny, tmp_path, "--figures", "overview")
    assert longer.exit_code == 0, longer.output
    assert "2 written · 3 already complete" in " ".join(longer.output.split())
    listed = json.loads((tmp_path / "manifest.json").read_text())["sentences"]
    assert [s["text"] for s in listed] == SENTENCES
    assert [s["folder"] for s in listed] == _sentence_folders(tmp_path)


def test_rerun_of_a_complete_export_does_not_load_the_model(tiny_model_dirs, tmp_path, monkeypatch):
    from attnviz.core import models

    source = tmp_path / "in.txt"
    source.write_text("Fine line.\n\n" + " ".join(["word"] * 100) + "\nAnother fine line.\n")
    out = tmp_path / "out"
    args = ["export", "-f", str(source), "-m", str(tiny_model_dirs["bert"]), "-o", str(out),
            "--figures", "overview"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    first = json.loads((out / "manifest.json").read_text())

    def load(self):
        raise AssertionError("a complete export loaded the model")

    monkeypatch.setattr(models.Model, "load", load)
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    text = " ".join(again.output.split())
    assert "nothing to do: 2 sentences already complete with these settings" in text
    assert "1 too long (skipped)" in text
    assert "line 3: skipped, text is 102 tokens long" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sentences"] == first["sentences"]
    assert manifest["counts"]["complete"] == 2 and manifest["counts"]["too_long"] == 1

    # In a process of its own, the re-run does not even import torch.
    check = (
        "import sys; from attnviz.cli import app\n"
        "try: app(sys.argv[1:])\n"
        "except SystemExit as e: assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.run(
        [sys.executable, "-c", check, *args], env=env, capture_output=True, text=True
    )
    assert process.returncode == 0, process.stderr
    assert "nothing to do" in process.stdout
