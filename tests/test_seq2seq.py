"""Encoder-decoder models: the three attention stacks against transformers' own
`encoder_attentions`, `decoder_attentions` and `cross_attentions`, on tiny random T5, BART,
mBART and Marian models saved with real tokenizers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from seq2seq_models import SEQ2SEQ

from attnviz.core.extract import attend_stacks
from attnviz.core.seq2seq import encode_source_target, pad_pairs
from attnviz.errors import InputError, TextTooLongError
from tests.conftest import eager

STACKS = ("encoder", "decoder", "cross")
SOURCE, TARGET = "The cat sat on the mat.", "Die Katze saß auf der Matte."


def _reference(loaded, item) -> dict[str, np.ndarray]:
    """transformers' own attentions of one source and target, (L, H, T, S) per stack."""
    with torch.no_grad(), eager(loaded.model):
        out = loaded.model(**pad_pairs(loaded, [item]), output_attentions=True)
    found = zip(STACKS, (out.encoder_attentions, out.decoder_attentions, out.cross_attentions))
    return {stack: torch.stack(layers)[:, 0].numpy() for stack, layers in found}


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_every_stack_equals_transformers_batched_or_alone(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    items = [
        encode_source_target(loaded, SOURCE, TARGET),
        encode_source_target(loaded, "A quick brown fox!", "Ein Fuchs!"),
    ]
    batched = attend_stacks(loaded, items, STACKS)
    for item, found in zip(items, batched):
        reference = _reference(loaded, item)
        alone = attend_stacks(loaded, [item], STACKS)[0]
        for stack in STACKS:
            att = found[stack]
            assert att.weights.shape == reference[stack].shape
            np.testing.assert_allclose(att.weights, reference[stack], atol=1e-5)
            np.testing.assert_allclose(att.weights, alone[stack].weights, atol=1e-6)
            np.testing.assert_allclose(att.weights.sum(-1), 1.0, atol=1e-5)
            assert att.stack == stack and att.target == item.target.text


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_stacks_have_their_own_shapes_tokens_and_counts(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    item = encode_source_target(loaded, SOURCE, TARGET)
    found = attend_stacks(loaded, [item], STACKS)[0]
    n_source, n_target = len(item.source), len(item.target)
    encoder, decoder, cross = found["encoder"], found["decoder"], found["cross"]
    assert encoder.weights.shape[-2:] == (n_source, n_source)
    assert decoder.weights.shape[-2:] == (n_target, n_target)
    assert cross.weights.shape[-2:] == (n_target, n_source)
    # the decoder reads its start token, then the target; the target's EOS is not read
    assert item.target.ids[0] == loaded.model.config.decoder_start_token_id
    assert item.target.ids[-1] != loaded.model.config.eos_token_id
    assert cross.tokens == item.target.tokens and cross.key_tokens == item.source.tokens
    assert encoder.key_tokens == encoder.tokens == item.source.tokens
    # causal: no decoder query sees a later target token
    assert np.all(np.triu(decoder.weights, k=1) == 0)
    assert decoder.info.causal and not cross.info.causal and not encoder.info.causal
    for stack, att in found.items():
        _, n_layers, n_heads = next(e for e in loaded.info.stacks if e[0] == stack)
        assert att.weights.shape[:2] == (n_layers, n_heads)
        assert att.info.stack == stack


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_generate_reads_what_the_model_wrote_greedily(loaded_seq2seq, arch):
    loaded = loaded_seq2seq[arch]
    item = encode_source_target(loaded, SOURCE, generate=6)
    assert item.generated
    ids = torch.tensor([item.source.ids])
    with torch.no_grad():
        wrote = loaded.model.generate(
            input_ids=ids, max_new_tokens=6, do_sample=False, num_beams=1, use_cache=False
        )[0].tolist()
    eos = loaded.model.config.eos_token_id
    expected = wrote[:-1] if wrote[-1] == eos else wrote
    assert list(item.target.ids) == expected
    assert 1 <= len(item.target) <= 7
    # the attention it used is the attention of teacher forcing on what it wrote
    found = attend_stacks(loaded, [item], STACKS)[0]
    reference = _reference(loaded, item)
    for stack in STACKS:
        np.testing.assert_allclose(found[stack].weights, reference[stack], atol=1e-5)
    assert any("wrote the target itself" in note for note in found["cross"].notes)


def test_layers_are_checked_against_each_stack(loaded_seq2seq):
    loaded = loaded_seq2seq["bart"]  # 2 encoder layers of 4 heads, 3 decoder layers of 2
    item = encode_source_target(loaded, SOURCE, TARGET)
    assert attend_stacks(loaded, [item], ("cross",), layers=[2])[0]["cross"].layers == (2,)
    with pytest.raises(InputError, match="layer 2 out of range: this model has layers 0–1"):
        attend_stacks(loaded, [item], ("encoder",), layers=[2])
    with pytest.raises(InputError, match="head 2 out of range: this model has heads 0–1"):
        loaded.info.of_stack("cross").pick_heads([2])
    # d_model 32: 4 encoder heads of 8, 2 decoder heads of 16
    assert loaded.info.of_stack("encoder").d_head == 8
    assert loaded.info.of_stack("decoder").d_head == loaded.info.of_stack("cross").d_head == 16


def test_bad_input_is_one_clear_error(loaded_seq2seq, bundled):
    loaded = loaded_seq2seq["t5"]
    # (what a person is told comes first, from pipelines.features: these guard the core)
    with pytest.raises(ValueError, match="is not an encoder-decoder model"):
        encode_source_target(bundled, SOURCE, TARGET)
    with pytest.raises(ValueError, match="has one attention stack, not cross"):
        bundled.info.of_stack("cross")
    with pytest.raises(InputError, match="--target text is empty"):
        encode_source_target(loaded, SOURCE, "  ")
    with pytest.raises(TextTooLongError, match="target is 81 tokens long .* at most 64"):
        encode_source_target(loaded, SOURCE, " ".join(["cat"] * 80))


def test_the_files_tell_the_stacks_before_loading(seq2seq_dirs):
    from attnviz.core.models import describe

    spec = describe(str(seq2seq_dirs["marian"]))
    assert spec.stacks == (("encoder", 2, 4), ("decoder", 3, 2), ("cross", 3, 2))
    assert spec.of_stack("decoder").n_layers == 3
    with pytest.raises(InputError, match="layer 3 out of range"):
        spec.of_stack("cross").pick_layers([3])


def _run(*args):
    """`attnviz ARGS` run here, as a process would run it: its exit code, stdout and stderr."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from attnviz.cli import app

    done = CliRunner().invoke(app, list(args))
    return SimpleNamespace(returncode=done.exit_code, stdout=done.stdout, stderr=done.stderr)


def test_api_gives_each_stack(seq2seq_dirs, loaded_seq2seq):
    import attnviz

    folder = str(seq2seq_dirs["t5"])
    item = encode_source_target(loaded_seq2seq["t5"], SOURCE, TARGET)
    reference = _reference(loaded_seq2seq["t5"], item)
    for stack in (None, *STACKS):
        att = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET, stack=stack)
        np.testing.assert_allclose(att.weights, reference[stack or "cross"], atol=1e-5)
        assert att.stack == (stack or "cross")
    cross = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET)
    assert cross.key_tokens == item.source.tokens and cross.tokens == item.target.tokens
    # the word view and hidden special tokens keep rows summing to 1 on both sides
    for words, hide in ((True, False), (False, True), (True, True)):
        shown = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET,
                                  words=words, hide_special=hide)  # fmt: skip
        np.testing.assert_allclose(shown.weights.sum(-1), 1.0, atol=1e-5)
        assert shown.weights.shape[-2:] == (len(shown.tokens), len(shown.key_tokens))
    hidden = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET,
                               hide_special=True)  # fmt: skip
    assert "</s>" not in hidden.key_tokens and "<pad>" not in hidden.tokens
    # figures of a non-square map: one row per target token, one column per source token
    figure = cross.heatmap(1, 0)
    image = figure.axes[0].images[0].get_array()
    assert image.shape == (len(cross.tokens), len(cross.key_tokens))
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == list(cross.key_tokens)
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == list(cross.tokens)
    # the colour bar sits right of the map, whatever its width and height
    assert figure.axes[1].get_position().x0 > figure.axes[0].get_position().x1
    pixels = figure.axes[0].get_window_extent()
    cell_w, cell_h = pixels.width / len(cross.key_tokens), pixels.height / len(cross.tokens)
    assert cell_w == pytest.approx(cell_h) and cell_w == pytest.approx(round(cell_w))


def test_without_a_target_show_and_the_api_give_the_encoder(seq2seq_dirs, loaded_seq2seq,
                                                           monkeypatch):  # fmt: skip
    """No --target or --generate: nothing is written (the model's `generate` is never
    called), the attention is the encoder's self-attention, equal to transformers' own, and
    one line says how to see the decoder and cross-attention: the CLI and the API alike.
    With a target, cross-attention as before."""
    import json

    from typer.testing import CliRunner

    import attnviz
    from attnviz.cli import app
    from attnviz.core.extract import UNTARGETED

    folder, loaded = str(seq2seq_dirs["t5"]), loaded_seq2seq["t5"]

    def nothing_written(*args, **kwargs):
        raise AssertionError("the model wrote a target nobody asked for")

    monkeypatch.setattr(type(loaded.model), "generate", nothing_written)
    reference = _reference(loaded, encode_source_target(loaded, SOURCE, TARGET))["encoder"]
    att = attnviz.attention(SOURCE, model=folder, device="cpu")
    assert att.stack == "encoder" and att.target is None and att.key_tokens == att.tokens
    np.testing.assert_allclose(att.weights, reference, atol=1e-5)
    assert att.notes == (UNTARGETED,) and "\n" not in UNTARGETED
    runner = CliRunner()
    shown = runner.invoke(app, ["show", SOURCE, "-m", folder, "--device", "cpu", "--no-images",
                                "--json"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    said = json.loads(shown.output)
    assert said["stack"] == "encoder" and said["notes"] == [UNTARGETED]
    assert said["tokens"] == list(att.tokens)
    printed = runner.invoke(app, ["show", SOURCE, "-m", folder, "--device", "cpu",
                                  "--no-images"]).output  # fmt: skip
    assert "Encoder self-attention (source × source)\n" in printed
    assert "note: no target: this is the encoder's self-attention;" in printed
    targeted = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET)
    assert targeted.stack == "cross" and targeted.target == TARGET
    assert UNTARGETED not in targeted.notes


def test_the_decoder_s_stacks_without_a_target_are_refused_before_loading(seq2seq_dirs,
                                                                          monkeypatch):  # fmt: skip
    from typer.testing import CliRunner

    import attnviz
    from attnviz.cli import app
    from attnviz.core import models

    def not_loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(models, "load_model", not_loaded)
    monkeypatch.setattr(models, "_MODELS", {})
    monkeypatch.setattr(models, "_KEPT", models._Kept())
    folder = str(seq2seq_dirs["bart"])
    for stack in ("decoder", "cross"):
        said = (f"--stack {stack} reads the decoder, which needs a target: give --target TEXT, "
                "or --generate N to have the model write one")  # fmt: skip
        result = CliRunner().invoke(app, ["show", SOURCE, "-m", folder, "--stack", stack])
        assert result.exit_code == 2 and result.output.strip() == f"error: {said}"
        with pytest.raises(InputError, match=re.escape(said)):
            attnviz.attention(SOURCE, model=folder, stack=stack)


def test_show_cli_cross_attention_json_and_images(seq2seq_dirs, loaded_seq2seq, tmp_path):
    import json

    folder = str(seq2seq_dirs["bart"])
    result = _run("show", SOURCE, "-m", folder, "--target", TARGET, "--json", "-o", str(tmp_path),
                  "--device", "cpu", "-q", "Katze")  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    item = encode_source_target(loaded_seq2seq["bart"], SOURCE, TARGET)
    assert found["stack"] == "cross" and found["target"] == TARGET
    assert found["tokens"] == list(item.target.tokens)
    assert found["key_tokens"] == list(item.source.tokens)
    assert len(found["heads"]) == 3 * 2  # 3 decoder layers × 2 heads
    # a key the summary names is a source token
    assert all(entry["top"][0]["token"] in item.source.tokens for entry in found["heads"])
    assert found["query"]["token"] == "Katze"
    names = sorted(p.name for p in (tmp_path / found["folder"].split("/")[-1]).iterdir())
    assert "layer-02-head-01.png" in names and "overview.png" in names
    from PIL import Image

    picture = Image.open(Path(found["folder"]) / "layer-00-head-00.png")
    assert picture.height > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "x"], "--target in attnviz show works with decoders and encoder-decoder"),
        (["--generate", "5"], "--generate in attnviz show works with decoders and encoder-"),
        (
            ["--stack", "cross"],
            "--stack cross in attnviz show works with encoder-decoder .* is an encoder",
        ),
    ],
)
def test_show_refuses_decoder_options_on_one_stack_models(args, message, tmp_path):
    result = _run("show", SOURCE, *args, "-o", str(tmp_path / "out"), "--no-images")
    assert result.returncode == 2
    assert re.search(message, result.stderr) and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_show_refuses_what_is_not_built_and_a_too_long_target(seq2seq_dirs, tmp_path):
    folder = str(seq2seq_dirs["marian"])
    for args, message in (
        (["--measure", "alti"], "--measure alti in attnviz show works with encoders and decoders"),
        (["--target", " ".join(["cat"] * 80)], "target is [0-9]+ tokens long"),
        (["--stack", "encoder", "-l", "2"], "layer 2 out of range: this model has layers 0–1"),
    ):
        result = _run("show", SOURCE, "-m", folder, *args, "-o", str(tmp_path), "--no-images")
        assert result.returncode == 2, result.stderr
        assert re.search(message, result.stderr), result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_norm_of_cross_attention_equals_a_loop_over_heads_and_source_tokens(loaded_seq2seq, arch):
    """‖α_ij f^h(x_j)‖ with x_j the encoder's last hidden state of source token j, and
    f^h(x) = (x W_V^h + b_V^h) W_O^h, from the model's own parameters (Kobayashi et al. 2020)."""
    from attnviz.analysis.contributions import stack_values
    from attnviz.core import layer_map

    loaded = loaded_seq2seq[arch]
    items = [encode_source_target(loaded, SOURCE, TARGET),
             encode_source_target(loaded, "A quick brown fox!", "Ein Fuchs!")]  # fmt: skip
    values = stack_values(loaded, "norm")
    found = attend_stacks(loaded, items, ("cross", "encoder"), values=values)
    for item, stacks in zip(items, found):
        with torch.no_grad(), eager(loaded.model):
            out = loaded.model(**pad_pairs(loaded, [item]), output_attentions=True)
        x = out.encoder_last_hidden_state[0].double()  # (S, d_model)
        cross = stacks["cross"]
        assert cross.measure == "norm" and cross.weights.shape[-2:] == (len(item.target), len(x))
        for layer in range(cross.weights.shape[0]):
            own = layer_map.layer_modules(loaded.model, layer, "cross").attention
            v, o = (own.v, own.o) if "t5" in arch else (own.v_proj, own.out_proj)
            n_heads = cross.weights.shape[1]
            d_k = v.weight.shape[0] // n_heads
            probs = out.cross_attentions[layer][0].double()  # (H, T, S)
            for h in range(n_heads):
                rows = slice(h * d_k, (h + 1) * d_k)
                value = x @ v.weight[rows].double().T  # (S, d_k)
                if v.bias is not None:
                    value = value + v.bias[rows].double()
                f = value @ o.weight[:, rows].double().T  # (S, d_model)
                expected = probs[h] * f.norm(dim=-1)[None, :]
                np.testing.assert_allclose(cross.weights[layer, h], expected.detach(), atol=1e-5)
        assert stacks["encoder"].measure == "norm" and np.all(stacks["encoder"].weights >= 0)


def test_rollout_and_alti_are_refused_across_stacks(loaded_seq2seq):
    from attnviz.analysis.contributions import stack_values

    for measure in ("alti", "rollout"):
        with pytest.raises(InputError, match=f"--measure {measure} composes one stack's layers"):
            stack_values(loaded_seq2seq["bart"], measure)


def test_show_html_writes_the_stack_page_and_the_api_gives_it(seq2seq_dirs, loaded_seq2seq,
                                                               tmp_path):  # fmt: skip
    import json

    import attnviz

    folder = str(seq2seq_dirs["marian"])
    result = _run("show", SOURCE, "-m", folder, "--target", TARGET, "--html", "--no-images",
                  "--stack", "decoder", "-o", str(tmp_path), "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    page = Path(json.loads(result.stdout)["page"]).read_text(encoding="utf-8")
    data = json.loads(page.split('id="attnviz-data">')[1].split("</script>")[0])
    item = encode_source_target(loaded_seq2seq["marian"], SOURCE, TARGET)
    assert item.source.tokens[1] in page and item.target.tokens[2] in page
    assert data["stack"] == "decoder" and sorted(data["stacks"]) == sorted(STACKS)
    att = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET)
    assert "<script" in att.to_html()
    # a notebook's view of cross-attention: the overview (the page needs all three stacks)
    assert att._repr_mimebundle_()["text/html"].startswith('<img alt="Attention: ')
