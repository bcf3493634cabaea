"""`attnviz needle` (issue 56): retrieval heads on needle-in-a-haystack runs. The top key of
every row that wrote an answer token, as recorded in the pass, equals the argmax of the
model's own eager attention over prompt + answer; the scores equal a plain loop over that
eager attention; the command and the API give the same numbers; a run stopped part-way is
finished by the same command; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.analysis import retrieval
from attnviz.cli import app
from tests import any_models
from tests.conftest import _byte_level_tokenizer

runner = CliRunner()
NEEDLE = "The cat sat on the mat."
QUESTION = "Where did the cat sit?"
ASK = dict(needle_text=NEEDLE, question=QUESTION, answer_tokens=6)
OPTIONS = ["--needle-text", NEEDLE, "--question", QUESTION, "--answer-tokens", "6"]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> str:
    """A tiny random Llama (grouped-query heads, weights spread so rows have clear maxima)
    with a byte-level tokenizer and no chat template, taking 1,024 tokens."""
    from transformers import AutoModelForCausalLM

    tokenizer = _byte_level_tokenizer()
    tokenizer.model_max_length = 1024
    ids = dict(vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    folder = tmp_path_factory.mktemp("needle") / "llama"
    return any_models.save("llama", AutoModelForCausalLM, tokenizer, folder, **ids,
                           max_position_embeddings=1024)  # fmt: skip


def _eager_top(folder: str, prompt: list[int], written: list[int]) -> np.ndarray:
    """(N, L, H): transformers alone, eager attention over prompt + answer: each head's
    argmax in the row that wrote each answer token (row p − 1 for the token at p)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = [*prompt, *written]
    with torch.no_grad():  # the layers alone: no logits over every position (1 s on SmolLM2)
        out = model.base_model(input_ids=torch.tensor([ids]), output_attentions=True)
    att = torch.stack([a[0] for a in out.attentions])  # (L, H, T, T)
    rows = range(len(prompt) - 1, len(ids) - 1)
    return np.stack([att[:, :, r, : r + 1].argmax(dim=-1).numpy() for r in rows])


def _copies_by_loop(top: np.ndarray, written, prompt, start: int, stop: int) -> np.ndarray:
    """Wu et al.'s rule, a step at a time: a head counts the step when its top key is a
    needle token and that token is the one written."""
    n_steps, n_layers, n_heads = top.shape
    found = np.zeros((n_layers, n_heads), dtype=np.int64)
    for step in range(n_steps):
        for layer in range(n_layers):
            for head in range(n_heads):
                key = top[step, layer, head]
                if start <= key < stop and prompt[key] == written[step]:
                    found[layer, head] += 1
    return found


def test_the_rows_top_keys_are_the_eager_attention_s(decoder):
    """What `greedy` hands over, as the model writes, is the row that wrote each token: its
    argmax per head equals eager attention's over prompt + answer, every step, every head."""
    from attnviz.core import haystack as hay
    from attnviz.core.generation import greedy
    from attnviz.core.models import load_model

    loaded = load_model(decoder, "cpu")
    builder = hay.Builder(loaded.tokenizer, True, hay.read_haystack(None), NEEDLE, QUESTION)
    prompt = builder.build(builder.filled(400), 400, 50.0)
    info = loaded.info
    top = retrieval.TopKeys(info.n_layers, info.n_heads, len(prompt.ids) - 1)
    written = greedy(loaded, prompt.ids, 12, range(info.n_layers), top.take)
    assert len(written) == 12  # the tiny model never writes its end-of-text token here
    found = top.positions(len(written))
    expected = _eager_top(decoder, list(prompt.ids), written)
    assert found.shape == (12, info.n_layers, info.n_heads)
    assert (found == expected).all()
    assert len(np.unique(expected)) > 3  # the heads look at different keys: it could fail
    # the copy rule over every position of the prompt: steps counted, as a plain loop counts
    every = retrieval.copies(found, written, prompt.ids, 0, len(prompt.ids))
    assert (every == _copies_by_loop(expected, written, prompt.ids, 0, len(prompt.ids))).all()


def test_the_scores_are_a_loop_over_eager_attention(decoder):
    from attnviz.core import haystack as hay
    from attnviz.core.models import load_model

    runs = attnviz.needle(model=decoder, device="cpu", lengths=[300, 500], depths=2, **ASK).runs
    assert len(runs) == 4
    loaded = load_model(decoder, "cpu")
    builder = hay.Builder(loaded.tokenizer, True, hay.read_haystack(None), NEEDLE, QUESTION)
    for run in runs:
        prompt = builder.build(builder.filled(500), run.length, run.depth)
        assert (run.start, run.stop, run.tokens) == (prompt.start, prompt.stop, len(prompt.ids))
        assert loaded.tokenizer.decode(prompt.needle_ids).strip() == NEEDLE
        top = _eager_top(decoder, list(prompt.ids), list(run.written))
        loop = _copies_by_loop(top, run.written, prompt.ids, run.start, run.stop)
        assert (run.copies == loop).all()
        assert np.abs(run.scores - loop / (run.stop - run.start)).max() <= 1e-6


def test_the_copy_rule_and_the_recall():
    """Synthetic: two steps, 1 layer × 3 heads; the needle is positions 2 … 3 (ids 7, 8)."""
    prompt = [5, 6, 7, 8, 9]
    written = [7, 8]
    top = np.array([[[2, 3, 2]], [[3, 3, 1]]])  # (N=2, L=1, H=3)
    # head 0: copies both; head 1: points at 8 while 7 is written, then copies 8;
    # head 2: copies 7, then points outside the needle
    assert retrieval.copies(top, written, prompt, 2, 4).tolist() == [[2, 1, 1]]
    assert retrieval.run_scores(top, written, prompt, 2, 4).tolist() == [[1.0, 0.5, 0.5]]
    assert retrieval.recall(NEEDLE, "It sat on the mat.") == pytest.approx(4 / 6)
    assert retrieval.recall(NEEDLE, "the cat sat on the mat") == 1.0
    found = retrieval.retrieval_scores([np.ones((1, 2)), np.zeros((1, 2))], [True, False])
    assert found.scores.tolist() == [[1.0, 1.0]] and (found.runs, found.of) == (1, 2)
    assert retrieval.retrieval_scores([np.ones((1, 2))], [False]) is None
    drawn = retrieval.random_heads(3, 3, 4, seed=0, leave_out=[(0, 0), (1, 1)])
    assert len(set(drawn)) == 4 and not {(0, 0), (1, 1)} & set(drawn)


def test_the_command_and_the_api_say_the_same_and_a_re_run_resumes(decoder, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    """Every run counted (HELD 0: a random model recalls no needle), so that the scores,
    the ablation and their files exist; the command's --json is the API's result; a run
    stopped by Ctrl-C after one unit is finished by the same command, whose numbers are
    the uninterrupted run's."""
    from attnviz.core import generation

    monkeypatch.setattr(retrieval, "HELD", 0.0)
    out = tmp_path / "needle"
    args = ["needle", "-m", decoder, "--device", "cpu", *OPTIONS, "--lengths", "300",
            "--depths", "2", "--ablate-top", "2", "--seeds", "2", "-o", str(out)]  # fmt: skip
    calls = []
    real = generation.greedy

    def stopping(*given, **named):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*given, **named)

    monkeypatch.setattr(generation, "greedy", stopping)
    stopped = runner.invoke(app, args)
    assert stopped.exit_code == 130, stopped.output
    assert "the same command again finishes the rest" in stopped.output
    assert len(list((out / "runs").iterdir())) == 1 and not (out / "needle.json").exists()
    monkeypatch.setattr(generation, "greedy", real)
    done = runner.invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.output
    said = json.loads(done.stdout)
    assert len(said["runs"]) == 2 and len(said["ablation"]) == 3  # top-2 and 2 random draws
    api = attnviz.needle(model=decoder, device="cpu", lengths=[300], depths=2,
                         ablate_top=[2], seeds=2, **ASK)  # fmt: skip
    assert api.as_dict() == said
    names = {p.name for p in out.iterdir()}
    assert {"needle.json", "heads.csv", "ablation.csv", "report.md", "grid.png", "heads.png",
            "ablation.png", "runs", "ablation"} <= names  # fmt: skip
    assert json.loads((out / "needle.json").read_text()) == said
    # everything held now: a third run answers nothing again
    monkeypatch.setattr(generation, "greedy", lambda *a, **k: pytest.fail("ran again"))
    assert runner.invoke(app, args).exit_code == 0


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--lengths", "2k"], "its window is 1,024"),
        (["--lengths", "20"], "the needle does not fit"),
        (["--haystack", "/no/such/file.txt"], "no such file or folder"),
        (["--lengths", "1k,x"], "give token counts"),
        (["--attention", "eager"], "--attention eager"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(decoder, tmp_path, extra, said):
    out = tmp_path / "out"
    done = runner.invoke(app, ["needle", "-m", decoder, "--device", "cpu", *OPTIONS, *extra,
                               "-o", str(out)])  # fmt: skip
    assert done.exit_code == 2, done.output
    assert said in done.output and len(done.output.strip().splitlines()) == 1
    assert not out.exists()


def test_an_encoder_is_refused(tiny_model_dirs, tmp_path):
    done = runner.invoke(app, ["needle", "-m", str(tiny_model_dirs["bert"]), "-o",
                               str(tmp_path / "out")])  # fmt: skip
    assert done.exit_code == 2 and "not a decoder that writes text" in done.output
    assert not (tmp_path / "out").exists()


def test_a_short_haystack_is_repeated_and_said(decoder, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("One sentence here. Another one there.")
    done = runner.invoke(app, ["needle", "-m", decoder, "--device", "cpu", *OPTIONS,
                               "--haystack", str(short), "--lengths", "300", "--depths", "1",
                               "-o", str(tmp_path / "out")])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "is read" in done.output and "times over" in done.output


@pytest.mark.slow
def test_smollm2_scores_at_1k_tokens_are_the_eager_loop_s(smollm2_gguf):
    """SmolLM2 at 1,000 tokens: it answers with the needle, some heads copy it, and every
    head's score equals a plain loop over its eager attention of the same run."""
    from attnviz.core import haystack as hay
    from attnviz.core.models import load_model

    found = attnviz.needle(model="smollm2", device="cpu", lengths=[1000], depths=1,
                           answer_tokens=32)  # fmt: skip
    run = found.runs[0]
    assert run.held and found.retrieval is not None
    assert found.retrieval.scores.max() > 0.3
    loaded = load_model("smollm2", "cpu")
    builder = hay.Builder(loaded.tokenizer, True, hay.read_haystack(None), hay.NEEDLE,
                          hay.QUESTION)  # fmt: skip
    prompt = builder.build(builder.filled(1000), 1000, 50.0)
    folder = str(loaded.model.name_or_path)
    top = _eager_top(folder, list(prompt.ids), list(run.written))
    loop = _copies_by_loop(top, run.written, prompt.ids, run.start, run.stop)
    assert np.abs(run.scores - loop / (run.stop - run.start)).max() <= 1e-6
