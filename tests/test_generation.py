"""A decoder's continuation (issue 46): `--generate` records the rows each generation step
used, `--target` reads a given continuation by teacher forcing; both equal the model's own
eager attention over prompt + continuation, on tiny random decoders saved as a user's
checkpoints: Llama with grouped-query heads, GPT-2, Gemma 2 with its sliding window (shorter
than the text: its cache holds the window alone) and soft cap, Phi (partial RoPE, no adapter)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests import any_models
from tests.conftest import _byte_level_tokenizer

runner = CliRunner()
PROMPT = "The cat sat on the mat"
KINDS = ("llama", "gpt2", "gemma2", "phi")
N = 9  # tokens written: the text passes Gemma 2's window of 4 by far


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """{model type: a folder with a tiny causal LM and a byte-level tokenizer}."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("decoders")
    tokenizer = _byte_level_tokenizer()
    ids = dict(vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return {kind: any_models.save(kind, AutoModelForCausalLM, tokenizer, root / kind, **ids)
            for kind in KINDS}  # fmt: skip


def _eager(folder: str, ids: list[int]):
    """transformers alone: the eager attention (L, H, T, T) and logits (T, V) of `ids`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return np.stack([a[0].numpy() for a in out.attentions]), out.logits[0], model


@pytest.mark.parametrize("kind", KINDS)
def test_generated_rows_are_the_eager_attention_and_the_ids_are_generate_s(kind, decoders):
    import torch

    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode, label_of

    found = attnviz.attention(PROMPT, model=decoders[kind], device="cpu", generate=N)
    loaded = load_model(decoders[kind], "cpu")
    prompt = list(encode(loaded, PROMPT).ids)
    c = found.continuation
    assert c is not None and c.written and c.start == len(prompt) and c.how == "greedy"
    assert found.weights.shape[2] == len(prompt) + len(c.probs)
    # the same ids as transformers' generate, greedy, from the eager model
    eager, _, model = _eager(decoders[kind], prompt)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                             dtype=torch.long), max_new_tokens=N, do_sample=False)  # fmt: skip
    ids = [int(i) for i in out[0]]
    written = [label_of(loaded.tokenizer.decode([i])) for i in ids[c.start :]]
    assert list(found.tokens[c.start :]) == written
    # every row (prompt and steps) equals one eager pass over prompt + what it wrote
    weights, logits, _ = _eager(decoders[kind], ids)
    assert np.abs(found.weights - weights).max() <= 1e-5
    assert np.allclose(found.weights.sum(axis=-1), 1.0, atol=1e-5)
    # each written token's probability, from the row before it
    chances = torch.softmax(logits[c.start - 1 : -1], dim=-1)
    expected = [float(chances[i, token]) for i, token in enumerate(ids[c.start :])]
    assert list(c.probs) == pytest.approx(expected, abs=1e-5)


def test_what_generate_wrote_is_what_the_pipeline_reads(decoders):
    """The tokens of the result are the ids transformers wrote (checked through the tokenizer:
    the generated part's labels decode from those ids)."""
    from attnviz.core import generation
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode

    loaded = load_model(decoders["llama"], "cpu")
    prompt = encode(loaded, PROMPT)
    whole, reading = generation.write(loaded, prompt, generation.Settings(N), [0, 1])
    assert whole.ids[: len(prompt)] == prompt.ids
    assert reading.length == len(whole) and len(reading.steps[0]) == len(whole) - len(prompt)
    assert [row.shape[-1] for row in reading.steps[1]] == list(range(len(prompt) + 1,
                                                                     len(whole) + 1))  # fmt: skip


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_a_target_is_read_by_teacher_forcing(kind, decoders):
    import torch

    found = attnviz.attention(PROMPT, model=decoders[kind], device="cpu", target="the cat sat")
    c = found.continuation
    assert c is not None and not c.written and c.how == "teacher-forced"
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode

    loaded = load_model(decoders[kind], "cpu")
    prompt = list(encode(loaded, PROMPT).ids)
    target = loaded.tokenizer(" the cat sat", add_special_tokens=False)["input_ids"]
    weights, logits, _ = _eager(decoders[kind], prompt + target)
    assert c.start == len(prompt) and len(c.probs) == len(target)
    assert np.abs(found.weights - weights).max() <= 1e-5
    chances = torch.softmax(logits[c.start - 1 : -1], dim=-1)
    assert list(c.probs) == pytest.approx([float(chances[i, t]) for i, t in enumerate(target)],
                                          abs=1e-5)  # fmt: skip


def test_a_seeded_sample_writes_the_same_text_twice_and_as_transformers_would(decoders):
    import torch

    def sampled(seed: int):
        return attnviz.attention(PROMPT, model=decoders["gpt2"], device="cpu", generate=N,
                                 sample=True, temperature=1.5, seed=seed)  # fmt: skip

    first, again = sampled(7), sampled(7)
    assert first.tokens == again.tokens and first.continuation.probs == again.continuation.probs
    assert first.continuation.how == "sampled at temperature 1.5, seed 7"
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode, label_of

    loaded = load_model(decoders["gpt2"], "cpu")
    prompt = list(encode(loaded, PROMPT).ids)
    _, _, model = _eager(decoders["gpt2"], prompt)
    torch.manual_seed(7)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                             dtype=torch.long), max_new_tokens=N, do_sample=True,
                             temperature=1.5, top_k=0, top_p=1.0)  # fmt: skip
    written = [label_of(loaded.tokenizer.decode([int(i)])) for i in out[0, len(prompt) :]]
    assert list(first.tokens[len(prompt) :]) == written


@pytest.mark.parametrize("block", [1, 7, 64])
def test_the_replay_is_the_same_in_blocks_of_any_size(block, decoders):
    from attnviz.core import capture, generation
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode, pad

    loaded = load_model(decoders["gemma2"], "cpu")
    whole, reading = generation.write(loaded, encode(loaded, PROMPT), generation.Settings(N),
                                      [0, 1])  # fmt: skip
    got: dict[int, np.ndarray] = {}
    recorder = capture.Each([0, 1], ("probs",), lambda layer, t: got.update({layer: t["probs"]}))
    capture.run(loaded, pad(loaded, [whole]), [recorder], block_rows=block, reading=reading)
    weights, _, _ = _eager(decoders["gemma2"], list(whole.ids))
    for layer in (0, 1):
        assert np.abs(got[layer][0].numpy() - weights[layer]).max() <= 1e-5


def test_show_lists_each_written_token_and_streams_a_long_prompt_alike(decoders, monkeypatch):
    from attnviz.core import memory
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    request = ShowRequest(Load(decoders["llama"], "cpu"), text=PROMPT, generate=N, out=None,
                      query="6")  # fmt: skip
    held = show(request)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    streamed = show(request)
    written, also = held.continuation, streamed.continuation
    assert (
        len(written.steps) == N and written.steps[0].position == held.attention.continuation.start
    )
    for a, b in zip(written.steps, also.steps, strict=True):
        assert (a.position, a.token, a.prob) == (b.position, b.token, b.prob)
        assert [t.index for t in a.looked] == [t.index for t in b.looked]
        assert [t.weight for t in b.looked] == pytest.approx([t.weight for t in a.looked], abs=1e-6)
        assert all(t.index != 0 for t in a.looked)  # the first token is left out
    for a, b in zip(held.summaries, streamed.summaries, strict=True):
        assert [t.index for t in a.top] == [t.index for t in b.top]
    # the mean over heads of the writing row, by hand
    att, first = held.attention, held.attention.continuation.start
    row = att.weights[:, :, first - 1, :first].mean(axis=(0, 1))
    assert written.steps[0].sink == pytest.approx(float(row[0]), abs=1e-6)
    assert written.steps[0].looked[0].index == int(np.argmax(row[1:]) + 1)


def test_the_cli_marks_the_continuation_and_writes_its_figures(decoders, tmp_path):
    model = decoders["phi"]
    result = runner.invoke(app, ["show", PROMPT, "-m", model, "--generate", "5", "--json",
                                 "--no-images", "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["continuation"]["generated"] and len(found["continuation"]["tokens"]) == 5
    result = runner.invoke(app, ["show", PROMPT, "-m", model, "--target", "the mat",
                                 "--layer", "1", "--head", "0", "-o", str(tmp_path),
                                 "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "given (teacher-forced)" in result.output and "▸" in result.output
    assert list(tmp_path.glob("*/layer-01-head-00.png"))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--generate", "3"], "--generate in attnviz show works with decoders and encoder-decoder"),
        (["--generate", "0"], "--generate takes a number of tokens of 1 or more"),
        (["--temperature", "0.5"], "--temperature needs --sample"),
        (["--generate", "3", "--sample", "--temperature", "0"], "--temperature must be above 0"),
        (["--generate", "3", "--target", "x"], "give either --target or --generate"),
        (["--generate", "3", "--measure", "norm"], "give either --generate or --measure norm"),
        (["--generate", "3", "--ablate", "0.1"], "give either --generate or --ablate"),
        (["--generate", "100"], "would make it"),
    ],
)
def test_bad_continuations_are_one_line_before_loading(args, said, decoders, tiny_model_dirs,
                                                       monkeypatch):  # fmt: skip
    from attnviz.core import models

    def not_loaded(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", not_loaded)
    model = str(tiny_model_dirs["bert"]) if args == ["--generate", "3"] else decoders["llama"]
    result = runner.invoke(app, ["show", PROMPT, "-m", model, *args])
    assert result.exit_code == 2, result.output
    assert said in result.output and len(result.output.strip().splitlines()) == 1


def test_serve_export_and_compare_continue_a_decoder_s_texts(decoders, tmp_path):
    from attnviz.core.models import model
    from attnviz.pipelines import serve
    from attnviz.pipelines.serve import Question
    from attnviz.pipelines.tiles import Holder

    folder = decoders["llama"]
    api = attnviz.attention(PROMPT, model=folder, device="cpu", generate=4)
    question = Question.of({"text": PROMPT, "generate": 4})
    answer = serve.page(model(folder, "cpu"), question, holder=Holder())
    assert answer["tokens"] == list(api.tokens) and answer["tiles"] is None
    assert answer["continuation"]["start"] == api.continuation.start
    assert answer["continuation"]["probs"] == [round(p, 6) for p in api.continuation.probs]
    assert "not held for tiles" in answer["tiles_note"]

    out = tmp_path / "export"
    result = runner.invoke(app, ["export", PROMPT, "A dog", "-m", folder, "--generate", "4",
                                 "--figures", "overview", "--save-raw", "-o", str(out),
                                 "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    first = json.loads((out / "manifest.json").read_text())["sentences"][0]
    assert first["tokens"] == list(api.tokens)
    assert first["continuation"]["start"] == api.continuation.start
    saved = np.load(next(out.glob("0001-*/attention.npz")))
    assert int(saved["continuation_start"]) == api.continuation.start
    assert np.abs(saved["attention"] - api.weights).max() == 0
    again = [PROMPT, "A dog", "-m", folder, "--figures", "overview", "--save-raw", "-o",
             str(out), "--device", "cpu"]  # fmt: skip
    result = runner.invoke(app, ["export", *again, "--generate", "4"])
    assert "nothing to do: 2 sentences already complete" in result.output  # the same settings
    result = runner.invoke(app, ["export", *again, "--generate", "5"])
    assert "2 written" in result.output  # another continuation: written again

    args = [PROMPT, "A dog sat on the mat", "-m", folder, "--generate", "3", "--no-images"]
    result = runner.invoke(app, ["compare", *args, "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compare", *args, "--device", "cpu"])
    a_line = next(line for line in result.output.splitlines() if line.startswith("  A: "))
    assert "▸" in a_line and "3 tokens generated (greedy)" in result.output


def test_the_page_marks_the_continuation_and_steps_through_it(browser, decoders, tmp_path):
    from attnviz.outputs.html import write_page

    att = attnviz.attention(PROMPT, model=decoders["gpt2"], device="cpu", generate=5)
    path = write_page(att, tmp_path / "page.html")
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        start = att.continuation.start
        marked = page.eval_on_selector_all(
            ".tokens.q .token.written", "ns => ns.map(n => +n.dataset.index)"
        )
        assert marked == list(range(start, len(att.tokens)))
        page.click("#tab-query")
        page.click("#stepper button:nth-of-type(3)")  # step through the written tokens
        page.wait_for_selector("#stepper strong")
        assert f"step 1 of 5: the model wrote “{att.tokens[start]}”" in page.inner_text(
            "#stepper"
        ).replace("\n", " ")
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#stepper:has-text('step 2 of 5')")
        assert page.input_value("#query") == str(start)  # the row that wrote token start + 1
        assert not errors
    finally:
        page.close()


def test_generation_stops_at_the_end_of_text_token_and_says_so(decoders, tmp_path):
    """A model made to favour its end-of-text token writes it before N tokens and stops: the
    token's row is there, and the result says why it ended."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(decoders["llama"])
    with torch.no_grad():
        model.lm_head.weight[model.config.eos_token_id] = model.lm_head.weight.abs().max() * 50
    model.save_pretrained(tmp_path / "stops")
    AutoTokenizer.from_pretrained(decoders["llama"]).save_pretrained(tmp_path / "stops")
    found = attnviz.attention(PROMPT, model=str(tmp_path / "stops"), device="cpu", generate=N)
    c = found.continuation
    n = len(c.probs)
    assert c.stopped and n < N and found.special[-1] and c.probs[-1] > 0.99
    assert c.describe() == f"{n} tokens generated (greedy), stopped at the end-of-text token"
    assert found.weights.shape[2] == c.start + n
    assert np.allclose(found.weights.sum(axis=-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("view", [dict(hide_special=True), dict(words=True)])
def test_the_table_counts_the_tokens_the_view_shows(decoders, view):
    """With --hide-special or --words the table's positions and tokens are the shown ones
    (the words' probabilities the products of their tokens'), not the model's token
    positions: the helper's new-user run found them out of step."""
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    request = ShowRequest(Load(decoders["llama"], "cpu"), text=PROMPT, generate=N, out=None,
                      **view)  # fmt: skip
    found = show(request)
    att, written = found.attention, found.continuation
    assert [s.position for s in written.steps] == list(range(att.continuation.start,
                                                             len(att.tokens)))  # fmt: skip
    for step in written.steps:
        assert step.token == att.tokens[step.position]
        assert all(t.token == att.tokens[t.index] and t.index < step.position for t in step.looked)
    assert [s.prob for s in written.steps] == list(att.continuation.probs)
    assert written.unit == att.unit and written.sink_left_out == bool(att.special[0])
