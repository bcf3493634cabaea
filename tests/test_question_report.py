"""`attnviz report QUESTIONS.jsonl` (issue 54, item 4): each head's share of the answer's
attention on the picture, its entropy over the patches and top-k patch share held to plain
loops over the model's eager attention; blocks of rows that agree; the visual sinks'
criterion on made-up draws; the files written; bad input in one line, nothing written."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import eager, picture, save

from attnviz.cli import app

runner = CliRunner()
PROMPTS = ("What is on the table?", "Is there a cat here?")


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm-models")
    return {kind: save(kind, root / kind) for kind in ("llava", "qwen2_vl")}


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    """Two pictures, two questions each (one about the second with a target), in a JSONL
    file beside them: paths relative to its folder."""
    folder = tmp_path_factory.mktemp("questions")
    (folder / "pictures").mkdir()
    picture(folder / "pictures" / "a.png", (128, 64), seed=1)
    picture(folder / "b.png", (96, 64), seed=2)
    lines = [{"picture": "pictures/a.png", "prompt": PROMPTS[0]},
             {"picture": "b.png", "prompt": PROMPTS[0], "target": "A cat."},
             {"picture": "pictures/a.png", "prompt": PROMPTS[1]},
             {"picture": "b.png", "prompt": PROMPTS[1]}]  # fmt: skip
    path = folder / "questions.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    return path


def _plain(folder, loaded, question, generate):
    """One question's numbers by plain loops over the eager attention of its whole text
    (prompt and answer): per layer and head, the mean over its rows of the picture's share,
    the patch entropy over ln(cells), the top-5 patch share, and each image token's received
    attention."""
    from attnviz.core import generation, vlm

    prompt = vlm.encode(loaded, question.picture, question.prompt)
    whole = prompt
    if question.target is not None or generate is not None:
        settings = generation.Settings(None if question.target else generate, question.target)
        whole, _ = generation.write(loaded, prompt, settings, [0, 1])
    weights = eager(folder, list(whole.ids), prompt.inputs).astype(np.float64)
    layout = whole.layout
    image, cells = layout.image_tokens(), layout.cells()
    if whole.continuation is not None:
        rows = range(whole.continuation.start - 1, len(whole.ids) - 1)
    else:
        rows = [r for r in range(max(image) + 1, len(whole.ids)) if not whole.special[r]]
    found = np.zeros((4, 2, 4))
    received = np.zeros((2, 4, len(image)))
    for layer in range(2):
        for head in range(4):
            for r in rows:
                row = weights[layer, head, r]
                over = sum(row[c] for c in cells)
                q = sorted((row[c] / over for c in cells), reverse=True)
                found[0, layer, head] += sum(row[t] for t in image)
                found[1, layer, head] -= sum(p * math.log(p) for p in q) / math.log(len(cells))
                found[2, layer, head] += sum(q[:5])
                received[layer, head] += [row[t] for t in image]
    return found / len(rows), received / len(rows)


@pytest.mark.parametrize(("kind", "generate"), [("llava", 2), ("qwen2_vl", None)])
def test_each_heads_numbers_are_plain_loops_over_eager_attention(
    vlm_dirs, questions, kind, generate
):
    """Over the answer's rows (written, given by a target) or the prompt's after the
    picture, the means over the questions equal plain loops over eager attention; the
    sinks ranked are each picture's image tokens by their least draw."""
    from attnviz.core.models import load_model
    from attnviz.core.questions import read_questions
    from attnviz.pipelines.question_report import build_question_report

    loaded = load_model(str(vlm_dirs[kind]), "cpu")
    read = read_questions(str(questions))
    report = build_question_report(loaded, read, generate=generate)
    assert (report.questions, report.pictures) == (4, 2)
    assert report.answered == (4 if generate else 1)
    each = [_plain(vlm_dirs[kind], loaded, q, generate) for q in read.items]
    expected = np.mean([numbers for numbers, _ in each], axis=0)
    for name, slot in (("share", 0), ("entropy", 1), ("top", 2)):
        assert np.abs(getattr(report, name) - expected[slot]).max() < 1e-5, name
    assert 0 < report.share.min() and report.share.max() < 1
    # a's draws: its two questions (lines 1 and 3), each token's least one ranks it
    least = np.minimum(*(draws_of(received) for _, received in (each[0], each[2])))
    ranked_a = [s for s in report.sinks if s.picture == "pictures/a.png"]
    for sink in ranked_a:
        assert sink.least == pytest.approx(least[sink.token], abs=1e-5)
    assert ranked_a[0].least == pytest.approx(least.max(), abs=1e-5)


def draws_of(received):
    """Each image token's draw by hand: its mean over layers and heads over the mean token."""
    mean = received.mean(axis=(0, 1))
    return mean / mean.mean()


def test_blocks_of_rows_give_the_same_numbers(vlm_dirs, questions):
    """A question's rows handed to its recorder in blocks of 1, 7 and every row agree."""
    import torch

    from attnviz.analysis.picture_heads import Question, text_rows
    from attnviz.core import vlm
    from attnviz.core.models import load_model

    loaded = load_model(str(vlm_dirs["llava"]), "cpu")
    encoded = vlm.encode(loaded, questions.parent / "b.png", PROMPTS[1])
    weights = torch.from_numpy(eager(vlm_dirs["llava"], list(encoded.ids), encoded.inputs))
    rows = text_rows(len(encoded), encoded.layout, encoded.special, None)
    n = len(encoded)
    found = []
    for size in (1, 7, n):
        recorder = Question([0, 1], 4, encoded.layout, rows)
        for layer in (0, 1):
            for start in range(0, n, size):
                recorder.receive_rows(layer, start, weights[layer, :, start : start + size][None])
        found.append(recorder.result())
    for other in found[1:]:
        for name in ("share", "entropy", "top", "received"):
            assert np.abs(getattr(other, name) - getattr(found[0], name)).max() < 1e-12


def _answered(draw_rows, n_heads=2):
    """An Answered whose received attention per image token is `draw_rows` (one a layer)
    for every head."""
    from attnviz.analysis.picture_heads import Answered

    received = np.repeat(np.asarray(draw_rows, float)[:, None, :], n_heads, axis=1)
    share = received.sum(-1)
    return Answered((0,), share, share * 0, share * 0, received)


def test_a_sink_draws_in_every_question_about_its_picture():
    """Token 0 draws ≥ 5 × uniform in both questions: a sink. Token 1 draws as much in one
    question alone: not one. One question about a picture names no sink. A head's sink
    share is the part of its picture share on the sinks."""
    from attnviz.analysis.picture_heads import QuestionSums, picture_sinks

    uniform = [0.01] * 10
    first = _answered([[0.2, 0.2, *uniform[2:]], [0.2, 0.01, *uniform[2:]]])
    second = _answered([[0.2, 0.01, *uniform[2:]]] * 2)
    labels = [f"({i}, 0)" for i in range(10)]
    ranked = picture_sinks("a.png", labels, [first, second])
    assert [s.token for s in ranked if s.sink] == [0]
    draws_0 = [draws_of(a.received)[0] for a in (first, second)]
    assert ranked[0].least == pytest.approx(min(draws_0)) and ranked[0].least >= 5
    assert ranked[0].mean == pytest.approx(np.mean(draws_0))
    one = ranked[1]
    assert one.token == 1 and one.mean > 1 and not one.sink and one.least < 5
    assert not any(s.sink for s in picture_sinks("a.png", labels, [first]))
    sums = QuestionSums([0, 1], 2)
    sums.add("a.png", labels, [first, second], 0)
    on_sinks = np.mean([a.received[..., 0] / a.received.sum(-1) for a in (first, second)], 0)
    assert np.abs(sums.sums[3] / 2 - on_sinks).max() < 1e-12


def test_report_over_questions_writes_its_files(vlm_dirs, questions, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", str(questions), "-m", str(vlm_dirs["llava"]), "-o",
                                 str(out), "--generate", "2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "4 questions about 2 pictures · 4 answered" in said
    written = {"heads.csv", "heads.json", "sinks.csv", "report.md", "picture-share.png",
               "done.json"}  # fmt: skip
    assert {p.name for p in out.iterdir()} == written
    found = json.loads((out / "heads.json").read_text())
    assert found["questions"] == 4 and found["generate"] == 2
    with open(out / "heads.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == ["layer", "head", "picture_share", "patch_entropy",
                              "top5_patch_share", "sink_share"]  # fmt: skip
    assert [float(row["picture_share"]) for row in table] == [
        row["picture_share"] for row in found["heads"]
    ]
    with open(out / "sinks.csv", newline="") as handle:
        sinks = list(csv.DictReader(handle))
    assert [float(s["least_draw"]) for s in sinks] == sorted(
        (float(s["least_draw"]) for s in sinks), reverse=True
    )
    assert "## Visual sink tokens" in (out / "report.md").read_text()
    assert (out / "picture-share.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    qwen = str(vlm_dirs["qwen2_vl"])
    again = runner.invoke(app, ["report", "-f", str(questions), "-m", qwen, "-o", str(out),
                                "--layer", "1", "--head", "2", "--json"])  # fmt: skip
    assert again.exit_code == 0, again.output
    (only,) = json.loads(again.output)["heads"]
    assert (only["layer"], only["head"], json.loads(again.output)["answered"]) == (1, 2, 1)


@pytest.mark.parametrize(
    ("lines", "args", "said"),
    [
        (['{"picture": "gone.png", "prompt": "Why?"}'], [], "line 1: no picture gone.png"),
        (['{"picture": "a.png", "prompt": "Why?"}', "{oops"], [], "line 2: not JSON"),
        (['{"picture": "a.png"}'], [], 'line 1: no "prompt"'),
        (['{"picture": "a.png", "prompt": "Why?", "answer": "x"}'], [], "unknown key 'answer'"),
        (['{"picture": "a.png", "prompt": " "}'], [], "line 1: the prompt is empty"),
        (['{"picture": "notes.png", "prompt": "Why?"}'], [], "line 1: "),  # said by PIL
        (
            ['{"picture": "a.png", "prompt": "Why?"}'],
            ["--words"],
            "--words is not available in attnviz report over pictures",
        ),
        (['{"picture": "a.png", "prompt": "Why?"}'], ["--generate", "0"], "1 or more, not 0"),
        (
            ['{"picture": "a.png", "prompt": "Why?"}'],
            ["-m", None],
            "is a text model: it reads "
            "no picture; a file of pictures and questions is for a vision-language model",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(vlm_dirs, tmp_path, lines, args, said):
    picture(tmp_path / "a.png", (64, 64))
    (tmp_path / "notes.png").write_text("not a picture")
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    model = ["-m", str(vlm_dirs["llava"])] if "-m" not in args else []
    args = [arg for arg in args if arg not in ("-m", None)]  # -m None: the bundled text model
    result = runner.invoke(app, ["report", str(path), *model, *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert said in message and "\n" not in message, message
    assert not out.exists()


def test_generate_in_a_text_report_is_refused(tmp_path):
    result = runner.invoke(app, ["report", "A sentence.", "--generate", "3", "-o",
                                 str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2
    assert "--generate in attnviz report answers the questions" in " ".join(result.output.split())
