"""`attnviz compare` through a vision-language model (issue 54, item 1): two pictures with one
question, or one picture with two questions. Each side's picture share and the per-cell
Jensen–Shannon divergence equal plain loops over the model's eager attention on tiny LLaVA
and Qwen2-VL, over the answer's rows (written, given, or the prompt's last row); bad input is
one line, exit 2, nothing written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner
from vlm_models import eager, picture, save

from attnviz.cli import app

runner = CliRunner()
QUESTION, OTHER, TARGET = "What is on the table?", "Is there a cat?", "A cat."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vlm")
    return {kind: save(kind, folder / kind) for kind in ("llava", "qwen2_vl")}


@pytest.fixture
def pictures(tmp_path):
    """Two pictures of one size (one grid in both families) and one of another."""
    return [picture(tmp_path / name, size, seed) for name, size, seed in
            (("a.png", (128, 64), 1), ("b.png", (128, 64), 2), ("c.png", (96, 64), 3))]  # fmt: skip


def _expected(folder, picture_path, prompt, generate=None, target=None):
    """One side by plain loops over eager attention: the mean answer row's share of the
    picture (L, H) and its cells renormalised (L, H, C), over the rows that wrote the answer
    (or the prompt's last row)."""
    from attnviz.core import generation, vlm
    from attnviz.core.models import load_model

    loaded = load_model(str(folder), "cpu")
    prompt_encoded = vlm.encode(loaded, picture_path, prompt)
    whole = prompt_encoded
    if generate is not None or target is not None:
        settings = generation.Settings(generate, target)
        whole, _ = generation.write(loaded, prompt_encoded, settings, [0, 1])
    probs = eager(folder, list(whole.ids), prompt_encoded.inputs)  # (L, H, T, T)
    n = probs.shape[-1]
    start = len(prompt_encoded.ids)
    rows = list(range(start - 1, n - 1)) if n > start else [n - 1]
    layout = prompt_encoded.layout
    layers, heads = probs.shape[:2]
    share = np.zeros((layers, heads))
    cells = np.zeros((layers, heads, len(layout.cells())))
    for layer in range(layers):
        for head in range(heads):
            mean = [sum(float(probs[layer, head, r, k]) for r in rows) / len(rows)
                    for k in range(n)]  # fmt: skip
            share[layer, head] = sum(mean[k] for k in layout.image_tokens())
            on = [mean[k] for k in layout.cells()]
            cells[layer, head] = [v / sum(on) for v in on]
    return share, cells, list(whole.tokens)


def _js(p, q):
    """Jensen–Shannon divergence (nats), a plain loop."""
    total = 0.0
    for x, y in zip(p, q):
        m = (x + y) / 2
        total += (x * math.log(x / m) if x > 0 else 0.0) + (y * math.log(y / m) if y > 0 else 0.0)
    return total / 2


def _check(found, side_a, side_b):
    share_a, cells_a, tokens_a = side_a
    share_b, cells_b, tokens_b = side_b
    assert found["a"]["tokens"] == tokens_a and found["b"]["tokens"] == tokens_b
    assert np.abs(np.array(found["share_a"]) - share_a).max() < 1e-5
    assert np.abs(np.array(found["share_b"]) - share_b).max() < 1e-5
    assert np.abs(np.array(found["share_change"]) - (share_b - share_a)).max() < 1e-5
    layers, heads = cells_a.shape[:2]
    divergence = np.array([[_js(cells_a[i, h], cells_b[i, h]) for h in range(heads)]
                           for i in range(layers)])  # fmt: skip
    assert np.abs(np.array(found["divergence"]) - divergence).max() < 1e-5
    assert divergence.min() > 1e-4  # the two sides differ: a wrong row or cell would show
    moved = found["moved"][0]
    most = np.unravel_index(divergence.argmax(), divergence.shape)
    assert (moved["layer"], moved["head"]) == most


@pytest.mark.parametrize(("kind", "answer"), [("llava", ["--generate", "2"]),
                                              ("qwen2_vl", ["--target", TARGET])])  # fmt: skip
def test_two_pictures_one_question_equal_eager_attention(models, pictures, tmp_path, kind, answer):
    out = tmp_path / "out"
    args = ["compare", str(pictures[0]), str(pictures[1]), QUESTION, "-m", str(models[kind]),
            *answer, "-o", str(out), "--top", "2", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["compared"] == "two pictures, one question"
    generate = int(answer[1]) if answer[0] == "--generate" else None
    target = answer[1] if answer[0] == "--target" else None
    sides = [_expected(models[kind], path, QUESTION, generate, target) for path in pictures[:2]]
    _check(found, *sides)
    assert found["a"]["continuation"]["how"] == ("greedy" if generate else "teacher-forced")
    names = {path.split("/")[-1] for path in found["images"]}
    moved = [f"layer-{m['layer']}-head-{m['head']}-pictures.png" for m in found["moved"]]
    assert names == {"divergence.png", *moved}
    for path in found["images"]:
        with open(path, "rb") as image:
            assert image.read(8) == b"\x89PNG\r\n\x1a\n"


def test_one_picture_two_questions_equal_eager_attention(models, pictures, tmp_path):
    """Qwen2-VL answering each question (the CLI), and LLaVA's prompts' last rows (the API,
    which returns the same numbers as the JSON)."""
    import attnviz

    out = tmp_path / "out"
    args = ["compare", str(pictures[0]), QUESTION, OTHER, "-m", str(models["qwen2_vl"]),
            "--generate", "2", "-o", str(out), "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["compared"] == "one picture, two questions"
    sides = [_expected(models["qwen2_vl"], pictures[0], q, 2) for q in (QUESTION, OTHER)]
    _check(found, *sides)
    compared = attnviz.compare(QUESTION, OTHER, picture=pictures[0], model=str(models["llava"]))
    sides = [_expected(models["llava"], pictures[0], q) for q in (QUESTION, OTHER)]
    _check(compared.as_dict(), *sides)
    assert compared.a.rows == (len(sides[0][2]) - 1,)  # the prompt's last row
    assert "moved most: L" in str(compared)


def test_the_same_picture_and_question_twice_moved_nowhere(models, pictures):
    import attnviz

    same = attnviz.compare(QUESTION, picture=(pictures[0], pictures[0]), model=str(models["llava"]))
    assert np.all(same.divergence == 0) and np.all(same.change == 0)
    assert same.moved(3) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["a", "b", QUESTION], "is a text model: it reads no picture; two pictures and a question"),
        (["a", "c", QUESTION, "-m", "qwen2_vl"], "a.png is read as 2 × 5 image tokens and c.png "
         "as 2 × 3: compare pairs the two pictures' cells by place"),
        (["a", "b", QUESTION, "-m", "llava", "--html"], "--html is not available in attnviz "
         "compare over pictures and questions"),
        (["a", "b", QUESTION, "-m", "llava", "--against-model", "llava"], "--against-model is "
         "not available in attnviz compare over pictures and questions"),
        (["a", QUESTION, "b"], "a picture comes first and a question last"),
        ([QUESTION, OTHER, "--target", TARGET], "--target in attnviz compare is for pictures"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_written(models, pictures, tmp_path, args, said):
    named = {"a": pictures[0], "b": pictures[1], "c": pictures[2], **models}
    out = tmp_path / "out"
    args = [str(named.get(arg, arg)) for arg in args]
    result = runner.invoke(app, ["compare", *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert said in result.output and "\n" not in result.output.strip()
    assert not out.exists()
