"""`attnviz show` end to end through Typer's CliRunner, and its failure modes."""

from __future__ import annotations

import json
import os
import re
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
    assert "What each head does on this text" in result.output
    assert "L5" in result.output and "H11" in result.output
    assert "wrote 79 images" in result.output


def test_show_json_matches_extraction(tmp_path, bundled):
    from attnviz.core.extract import extract

    text = "Time flies like an arrow."
    result = invoke("show", text, "--json", "--no-images", "-l", 1, "-H", 4, "-k", 2)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"]["n_heads"] == 12 and len(data["heads"]) == 1
    head = data["heads"][0]
    att = extract(bundled, text)
    grid = att.weights[1, 4]
    queries = [i for i in range(len(att.tokens)) if not att.special[i]]
    received = grid[queries].mean(axis=0)  # an encoder's query sees every key
    best = int(np.argmax(received))
    assert head["top"][0]["index"] == best
    assert head["top"][0]["weight"] == pytest.approx(float(received[best]), abs=1e-6)
    assert len(head["top"]) == 2
    previous = np.mean([grid[i, i - 1] for i in queries])
    assert head["scores"]["previous-token"] == pytest.approx(float(previous), abs=1e-6)
    assert head["pattern"]["role"] in {*head["scores"], "token", "mixed"}
    assert "non-special queries" in data["averaged"]


def test_single_head_draws_terminal_heatmap_and_detail(tmp_path):
    result = invoke("show", "Birds sing.", "--no-images", "-l", 0, "-H", 2)
    assert result.exit_code == 0, result.output
    assert "What each head does on this text" in result.output
    assert "previous-token" in result.output  # layer 0 head 2
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
    import attnviz.core.models

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model must not be loaded when the output folder is bad")

    monkeypatch.setattr(attnviz.core.models, "load_model", no_load)
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


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_a_folder_holds_only_its_last_run(tmp_path):
    text = "Stale files are confusing."
    assert invoke("show", text, "-o", tmp_path).exit_code == 0
    (folder,) = tmp_path.iterdir()
    assert len(list(folder.glob("*.png"))) == 79
    result = invoke("show", text, "-o", tmp_path, "-l", 2, "-H", 5, "--format", "svg")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["done.json", "layer-02-head-05.svg", "layer-02.svg", "overview.svg"]
    done = json.loads((folder / "done.json").read_text())
    assert done["settings"]["layers"] == [2] and done["settings"]["fmt"] == "svg"
    assert sorted(done["record"]["files"]) == sorted(f"{folder.name}/{n}" for n in names[1:])
    # An interrupted run wrote figures but no done.json: the next run still starts clean.
    (folder / "done.json").unlink()
    assert invoke("show", text, "-o", tmp_path, "-l", 1, "-H", 0).exit_code == 0
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["done.json", "layer-01-head-00.png", "layer-01.png", "overview.png"]


def test_similar_texts_do_not_share_a_folder(tmp_path):
    for text in ("The dog sat on the lazy dog.", "The dog sat on the lazy cat."):
        assert invoke("show", text, "-o", tmp_path, "-l", 0, "-H", 0).exit_code == 0
    assert len(list(tmp_path.iterdir())) == 2


def test_show_dash_reads_stdin():
    result = runner.invoke(app, ["show", "-", "--no-images", "--json"], input="Text from a pipe.\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokens"][1:5] == ["text", "from", "a", "pipe"]


@pytest.mark.parametrize("command", ["show", "check", "export", "report"])
def test_a_file_name_is_not_analysed_as_a_sentence(command, tmp_path):
    corpus = tmp_path / "sentences.txt"
    corpus.write_text("One sentence.\n")
    result = (
        invoke(command, corpus, "-o", tmp_path / "out")
        if command != "check"
        else invoke(command, corpus)
    )
    assert result.exit_code == 2
    assert f"'{corpus}' is a file name" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["-h"], ["show", "-h"], ["export", "-h"], ["report", "-h"]])
def test_dash_h_is_help_and_flags_look_like_flags(args):
    result = invoke(*args)
    assert result.exit_code == 0 and "Usage:" in result.output
    assert "<bool>" not in result.output


@pytest.mark.parametrize("command", ["export", "report"])
def test_help_shows_the_tab_between_source_and_target(command):
    assert "reads source<TAB>target lines" in " ".join(invoke(command, "-h").output.split())


def test_report_help_and_error_name_the_default_corpus_where_it_is(monkeypatch, tmp_path):
    import attnviz.data
    from attnviz.data import CORPUS

    text = " ".join(invoke("report", "-h").output.split())
    named = re.search(r"\(default: [^)]*?(\S+\.txt)\)", text).group(1)
    assert CORPUS.is_file() and CORPUS.as_posix().endswith("/" + named), named
    monkeypatch.setattr(attnviz.data, "CORPUS", tmp_path / "gone.txt")
    missing = invoke("report", "-o", tmp_path / "out")
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1
    assert f"the default corpus {named} is missing" in missing.output


def test_help_names_repeatable_options_and_head_short_flag():
    text = invoke("show", "-h").output
    assert "-H" in text and "repeat" in text


def test_version():
    from attnviz import __version__

    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"attnviz {__version__}"


EARLY = """
import sys
from typer.testing import CliRunner
from attnviz.cli import app
result = CliRunner().invoke(app, {args!r})
print(result.exit_code, "torch" in sys.modules, "transformers" in sys.modules)
print(result.output)
"""


@pytest.mark.parametrize(
    "args, message",
    [
        (["show", ""], "text is empty"),
        (["show", "hi", "-l", "6"], "layer 6 out of range"),
        (["show", "hi", "-H", "12"], "head 12 out of range"),
        (["show", "hi", "--cmap", "rainbowz"], "unknown colour map"),
        (["show", " ".join(["word"] * 600)], "602 tokens long; this model takes at most 512"),
        (["check", "hi", "-l", "9"], "layer 9 out of range"),
        (["export", "hi", "-H", "40", "-o", "{tmp}/e"], "head 40 out of range"),
        (["report", "hi", "-l", "7", "-o", "{tmp}/r"], "layer 7 out of range"),
        (["show", "hi", "-o", "{tmp}/blocker/sub"], "it is a file, not a folder"),
        (["show", "The cat sat.", "-q", "dog", "-l", "6"], "layer 6 out of range"),
        (["show", "hi", "--device-map", "auto", "--max-memory", "cpu150MB"], "DEVICE=SIZE"),
        (["check", "hi", "--max-memory", "cpu=1GB"], "add --device-map auto"),
    ],
)
def test_errors_that_need_no_weights_come_before_torch(args, message, tmp_path):
    (tmp_path / "blocker").write_text("a file")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run(
        [sys.executable, "-c", EARLY.format(args=args)], capture_output=True, text=True, check=True
    )
    status, output = done.stdout.split("\n", 1)
    assert status == "2 False False", output
    assert message in output


@pytest.mark.parametrize("command", ["show", "export", "report"])
def test_an_unwritable_out_is_one_line_on_stderr(command, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = subprocess.run(
        [sys.executable, "-m", "attnviz", command, "hi", "--out", str(blocker / "sub")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: cannot write under {blocker}: it is a file, not a folder; choose another --out"
    ]


def test_early_refusal_uses_the_model_directory_too(tiny_model_dirs):
    result = invoke("show", "hi", "-m", tiny_model_dirs["gpt2"], "-l", 2, "--no-images")
    assert result.exit_code == 2
    assert "layer 2 out of range: this model has layers 0–1" in result.output


def test_the_summary_comes_before_the_figures(tiny_model_dirs, tmp_path):
    """The command line prints the summary while the figures are drawn, not after them."""
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    seen = []

    def summary(partial):
        seen.append((len(partial.summaries), list(tmp_path.rglob("*.png")), partial.images))

    request = ShowRequest(Load(str(tiny_model_dirs["bert"])), text="The cat sat on the mat.",
                      out=tmp_path, jobs=2)  # fmt: skip
    result = show(request, on_summary=summary)
    ((heads, pngs_then, images_then),) = seen
    assert heads == len(result.summaries) > 0 and pngs_then == [] and images_then == []
    assert len(result.images) > 3 and all(path.exists() for path in result.images)


def _attnviz(*args, cwd):
    import os
    import shutil

    exe = shutil.which("attnviz", path=os.path.dirname(sys.executable))
    return subprocess.Popen(
        [exe, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )


@pytest.mark.slow  # real processes, signalled
def test_ctrl_c_while_drawing_exits_130_with_one_line(tmp_path):
    import signal
    import time

    # ~260 tokens: 79 figures take seconds to draw, so the signal lands while they are drawn
    # on any machine (at 7 tokens a fast one had drawn them all before a fixed sleep ended).
    text = " ".join(["The cat sat on the mat because it was tired."] * 24)
    process = _attnviz("show", text, "-j", "2", cwd=tmp_path)
    for line in process.stdout:  # the summary is printed before the figures are drawn
        if "every score" in line:  # its last line
            break
    deadline = time.monotonic() + 60
    while not list((tmp_path / "attnviz-out").glob("*/*.png")):  # drawing has begun
        assert process.poll() is None and time.monotonic() < deadline, "no figure appeared"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    (folder,) = (tmp_path / "attnviz-out").iterdir()
    written = len(list(folder.glob("*.png")))
    assert f"interrupted: {written} image(s) written to attnviz-out/" in err
    assert written < 79 and not (folder / "done.json").exists()
    assert not list(folder.glob(".*.part"))


def _mapped(pid: int, name: str) -> bool:
    """Whether the process has a file whose path holds `name` mapped (a library, weights)."""
    try:
        return name in open(f"/proc/{pid}/maps").read()
    except OSError:  # it has ended
        return False


@pytest.mark.slow  # real processes, signalled while they start and load the model
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/PID/maps")
@pytest.mark.parametrize("after", ["", "libtorch", "safetensors"])
def test_ctrl_c_while_starting_exits_130_with_one_line(tmp_path, after):
    """Signalled while attnviz starts (half a second in: torch is still loading on any
    machine), once torch's library is loaded, once the weights are mapped: each later phase
    is waited for, not a fixed delay, which a fast machine outran."""
    import signal
    import time

    process = _attnviz("show", "The cat sat on the mat.", cwd=tmp_path)
    deadline = time.monotonic() + 60
    time.sleep(0.5)  # past the interpreter's start, before which SIGINT simply kills
    while after and not _mapped(process.pid, after):
        assert process.poll() is None and time.monotonic() < deadline, f"{after} not mapped"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted: "), err


def test_one_text_two_models_and_a_pair_get_their_own_folders(tiny_model_dirs, tmp_path):
    text = "The cat sat on the mat."
    for extra in ([], ["-m", tiny_model_dirs["gpt2"]], ["--pair", "It was tired."]):
        result = invoke("show", text, "--no-images", "--html", "--out", tmp_path, *extra)
        assert result.exit_code == 0, result.output
    folders = sorted(tmp_path.glob("the-cat-sat-on-the-mat-*"))
    assert len(folders) == 3  # none wiped another
    assert all((folder / "attention.html").is_file() for folder in folders)


def test_pair_on_a_decoder_is_refused_before_loading(tiny_model_dirs, monkeypatch):
    from attnviz.core import models
    from attnviz.core.settings import Load
    from attnviz.errors import InputError
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    monkeypatch.setattr(models, "_MODELS", {})  # none loaded by an earlier test
    monkeypatch.setattr(models, "_KEPT", models._Kept())
    request = ShowRequest(Load(str(tiny_model_dirs["gpt2"]), "cpu"), text="hi",
                      pair="It was tired.", out=None)  # fmt: skip
    with pytest.raises(
        InputError, match="--pair in attnviz show works with encoders; .* is a decoder"
    ):
        show(request)
    assert models._KEPT.recent == {}  # nothing loaded


@pytest.mark.parametrize(
    "args, message",
    [
        (["show", "x", "--measure", "nrom"], "'nrom' is not one of 'weights', 'norm', 'alti'"),
        (["show", "x", "--jobs", "0"], "'--jobs' / '-j': Input should be greater than or equal"),
        (["show"], "Missing argument 'text'."),
        (["export", "x", "--figures", "bogus"], "'bogus' is not one of 'overview'"),
        (["bogus"], "No such command 'bogus'."),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("usage error: "), result.stderr
    assert message in lines[0] and lines[0].endswith("-h for help)")
