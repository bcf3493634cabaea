"""Every command on model types attnviz has no adapter for: a decoder (GPT-NeoX), one with
attention sinks (gpt-oss), an encoder with local and global layers (ModernBERT), saved to
folders as a user's checkpoints are, read through attnviz's attention function alone.
GPT-NeoX and ModernBERT have adapters now (`check` reads their weights:
tests/test_check_families.py); here they are read without them (`without_adapters`), as a
type with none is.

What needs a family's weight names (check's from-scratch attention) is refused in one line,
exit 2; everything else works: the measures of norms read v inside the attention call, W_O
by name and the norms around the block from the model itself, and head ablation acts inside
the attention function (checked against a copy whose output projection ignores the head).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests import any_models
from tests.conftest import _byte_level_tokenizer, _wordpiece_tokenizer

runner = CliRunner()
TEXT = "The cat sat on the mat because it was tired."
KINDS = {"gpt_neox": "decoder", "gpt_oss": "decoder", "modernbert": "encoder",
         "m2m_100": "seq2seq"}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def without_adapters():
    """The adapters of this file's model types taken away while its tests run."""
    from attnviz.core import layer_map

    with pytest.MonkeyPatch.context() as patched:
        for kind in KINDS:
            if kind in layer_map.BY_TYPE:
                patched.delitem(layer_map.BY_TYPE, kind)
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{model type: a folder with the tiny model (with its LM head) and a tokenizer}."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    loaders = {"decoder": AutoModelForCausalLM, "encoder": AutoModelForMaskedLM,
               "seq2seq": AutoModelForSeq2SeqLM}  # fmt: skip

    root = tmp_path_factory.mktemp("any-models")
    found = {}
    for kind, role in KINDS.items():
        tokenizer = _wordpiece_tokenizer() if role == "encoder" else _byte_level_tokenizer()
        overrides = {"vocab_size": len(tokenizer)}
        if role != "encoder":
            overrides.update(bos_token_id=0, eos_token_id=0, pad_token_id=0)
        if role == "seq2seq":
            overrides.update(decoder_start_token_id=0)
        found[kind] = any_models.save(kind, loaders[role], tokenizer, root / kind, **overrides)
    return found


def _ids(loaded, text: str) -> list[int]:
    from attnviz.core.tokens import encode

    return list(encode(loaded, text).ids)


def _eager(folder: str, text: str):
    """The model's own eager attention of `text`, (L, H, T, T), by transformers alone."""
    import torch

    from attnviz.core.models import load_model

    loaded = load_model(folder, "cpu", "eager")
    ids = _ids(loaded, text)
    with torch.no_grad():
        out = loaded.model(input_ids=torch.tensor([ids]), output_attentions=True)
    return np.stack([a[0].numpy() for a in out.attentions])


@pytest.mark.parametrize("kind", sorted(k for k, role in KINDS.items() if role != "seq2seq"))
def test_the_api_reads_any_model_as_its_eager_attention(kind, folders):
    found = attnviz.attention(TEXT, model=folders[kind], device="cpu")
    assert found.info.model_type == kind
    assert found.info.causal == (KINDS[kind] == "decoder")
    assert np.abs(found.weights - _eager(folders[kind], TEXT)).max() <= 1e-5
    if KINDS[kind] == "decoder":  # the upper triangle is exactly 0
        assert not np.triu(found.weights, k=1).any()
    if kind != "gpt_oss":  # its sinks take a share of each row
        assert np.allclose(found.weights.sum(axis=-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("kind", ["gpt_neox", "modernbert"])
def test_show_export_report_compare_run_on_any_model(kind, folders, tmp_path):
    model = folders[kind]
    shown = runner.invoke(app, ["show", TEXT, "-m", model, "-o", str(tmp_path / "s"),
                                "--layer", "1", "--html"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert list((tmp_path / "s").rglob("*.png")) and list((tmp_path / "s").rglob("*.html"))
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXT}\nA dog barked.\n", encoding="utf-8")
    exported = runner.invoke(app, ["export", "-f", str(texts), "-m", model,
                                   "-o", str(tmp_path / "e")])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    reported = runner.invoke(app, ["report", TEXT, "A dog barked.", "-m", model,
                                   "-o", str(tmp_path / "r"), "--json"])  # fmt: skip
    assert reported.exit_code == 0, reported.output
    compared = runner.invoke(app, ["compare", TEXT, "A dog barked.", "-m", model,
                                   "-o", str(tmp_path / "c")])  # fmt: skip
    assert compared.exit_code == 0, compared.output


def test_check_without_an_adapter_is_one_line_before_loading(folders, monkeypatch):
    from attnviz.core import models

    def not_loaded(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", not_loaded)
    said = "attnviz check recomputes attention from scratch with each family"
    result = runner.invoke(app, ["check", TEXT, "-m", folders["gpt_oss"]])
    assert "'gpt_oss' has none" in result.output
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("kind", ["gpt_neox", "modernbert"])
def test_the_norm_measure_reads_v_and_w_o_of_any_model(kind, folders):
    """Without an adapter, ‖f^h(x_j)‖ = ‖v^h_j W_O^h‖ from the v the model hands its
    attention and W_O found by name: those f rebuild what the model's own output projection
    writes (Σ_h Σ_j α^h_ij f^h(x_j) + b_O, hooked on the module), and `--measure norm` is
    α times their lengths; the special share by norm and the page's norm come with them."""
    import torch

    from attnviz.analysis.contributions import Values
    from attnviz.core import capture
    from attnviz.core.families.base import linear
    from attnviz.core.layer_map import generic
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode, pad

    loaded = load_model(folders[kind], "cpu")
    got: dict = {}
    written: dict = {}
    projections = [generic.output_projection(loaded.model, layer)
                   for layer in range(loaded.info.n_layers)]  # fmt: skip
    hooks = [p.register_forward_hook(lambda m, a, out, layer=layer: written.update({layer: out}))
             for layer, p in enumerate(projections)]  # fmt: skip
    try:
        recorder = capture.Each(range(loaded.info.n_layers), ("values", "probs"),
                                lambda layer, t: got.update({layer: t}))  # fmt: skip
        capture.run(loaded, pad(loaded, [encode(loaded, TEXT)]), [recorder])
    finally:
        for hook in hooks:
            hook.remove()
    norm = attnviz.attention(TEXT, model=folders[kind], device="cpu", measure="norm")
    reader = Values(loaded)
    assert reader.kind == "values"
    for layer, tensors in got.items():
        v, probs = tensors["values"][0].double(), tensors["probs"][0].double()  # (Hkv,S,d), (H,T,S)
        w_o, b_o = (t.double() for t in linear(projections[layer]))
        n_heads, d = probs.shape[0], v.shape[-1]
        f = torch.stack([v[h // (n_heads // v.shape[0])] @ w_o[h * d : (h + 1) * d]
                         for h in range(n_heads)])  # (H, S, d_model)  # fmt: skip
        rebuilt = torch.einsum("hts,hsd->td", probs, f) + b_o
        assert torch.allclose(rebuilt, written[layer][0].double(), atol=1e-4)
        expected = probs * f.norm(dim=-1)[:, None, :]  # α ‖f(x_j)‖
        assert np.abs(norm.weights[layer] - expected.numpy()).max() <= 1e-4
    shown = runner.invoke(app, ["show", TEXT, "-m", folders[kind], "--no-images", "--json"])
    assert json.loads(shown.stdout)["special_share"]["norm"] > 0


def test_the_norm_measure_without_an_adapter_equals_the_adapter_s(loaded_tiny, monkeypatch):
    """v and W_O by name (the path of a model with no adapter) against X through the family's
    W_V and W_O: Llama (grouped-query heads), GPT-2 (Conv1D), BERT (W_O in the attention
    module's sibling), the same lengths within 1e-5."""
    from attnviz.analysis.contributions import read_measure
    from attnviz.core import families
    from attnviz.core.tokens import encode

    for arch in ("llama", "gpt2", "bert"):
        loaded = loaded_tiny[arch]
        encoded = [encode(loaded, TEXT)]
        adapted = read_measure(loaded, encoded, "norm")[0].weights
        with monkeypatch.context() as patched:
            patched.setattr(families, "knows", lambda model: False)
            by_name = read_measure(loaded, encoded, "norm")[0].weights
        assert np.abs(adapted - by_name).max() <= 1e-5, arch


def test_alti_and_mixing_without_an_adapter_equal_the_adapter_s(loaded_tiny, monkeypatch):
    """The norms around each block read from the model itself (`residual.around`), with v and
    W_O by name, against what the adapters name: Llama (pre-LN), BERT (post-LN: the norm
    covers block + residual), Gemma 2 (the block normalised alone, then added): ALTI's
    contributions and the four mixing ratios equal within 1e-5."""
    from attnviz.analysis.contributions import read_measure
    from attnviz.core import layer_map
    from attnviz.core.tokens import encode

    for arch in ("llama", "bert", "gemma2"):
        loaded = loaded_tiny[arch]
        encoded = [encode(loaded, TEXT)]
        kept: list = []
        adapted = read_measure(loaded, encoded, "alti", keep=kept)[0].weights
        with monkeypatch.context() as patched:
            patched.delitem(layer_map.BY_TYPE, loaded.model.config.model_type)
            again: list = []
            read = read_measure(loaded, encoded, "alti", keep=again)[0].weights
        assert np.abs(adapted - read).max() <= 1e-5, arch
        for layer, found in kept[0].mixing.items():
            for ratio, other in zip(found.ratios, again[0].mixing[layer].ratios):
                assert (ratio - other).abs().max() <= 1e-5, arch


@pytest.mark.parametrize(
    "kind, form",
    [("gpt_neox", "pre"),  # parallel attention and feed-forward
     ("olmo2", "alone"), ("gemma3_text", "alone"),  # the block normalised, then added
     ("opt", "pre"), ("modernbert", "pre"),  # ModernBERT: its first layer's norm an identity
     ("xlm-roberta-xl", "pre"), ("ernie", "post"), ("mobilebert", None)],
)  # fmt: skip
def test_how_a_block_joins_the_stream_is_read_from_the_model(kind, form):
    """`residual.around` on tiny models of types without an adapter: each form found in every
    layer (pre-LN: no norm after the block; a norm of the block alone; post-LN: a norm of
    block + residual), the normalisation's numbers checked against its module as it is read;
    MobileBERT (bottlenecks between the stream and the block) refused in one line."""
    from attnviz.core import recording, residual
    from attnviz.core.layer_map import generic
    from attnviz.errors import UnsupportedModelError

    recording.register()
    model = any_models.build(kind)
    model.set_attn_implementation(recording.NAME)
    if form is None:
        with pytest.raises(UnsupportedModelError, match="cannot tell how layer 0"):
            residual.around(model, 0)
        return
    for layer in range(len(generic.callers(model))):
        found = residual.around(model, layer)  # the norm after the block, or None
        assert (found is None) == (form == "pre"), (kind, layer)
        assert (found is not None and found.covers_residual) == (form == "post"), (kind, layer)


@pytest.mark.parametrize(
    "failure",
    [lambda: __import__("torch").OutOfMemoryError("CUDA out of memory"),
     lambda: RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"),
     KeyboardInterrupt],
    ids=["gpu-out-of-memory", "cpu-out-of-memory", "ctrl-c"],
)  # fmt: skip
def test_a_failed_read_of_the_stream_is_not_remembered_as_a_refusal(failure, monkeypatch):
    """Issue 59 item 5: the pass over four tokens `residual.around` reads the model from
    runs out of memory, or is stopped by a Ctrl-C: that failure rises, and the next ask reads
    the model (it was stored as the model's refusal, and ALTI and the norms were off for the
    rest of the process). A model's own answer (its forward refuses the four tokens) is
    remembered: asked again, it is not run again."""
    from attnviz.core import capture, recording, residual
    from attnviz.errors import UnsupportedModelError

    recording.register()
    model = any_models.build("gpt_neox")
    model.set_attn_implementation(recording.NAME)
    trace, passes = capture.trace, []

    def failing(*args, **kwargs):
        raise failure()

    monkeypatch.setattr(capture, "trace", failing)
    with pytest.raises((RuntimeError, KeyboardInterrupt)):
        residual.around(model, 0)
    monkeypatch.setattr(capture, "trace", trace)
    assert residual.around(model, 0) is None  # GPT-NeoX is pre-LN: no norm after the block

    def refusing(*args, **kwargs):
        passes.append(1)
        raise TypeError("forward() missing 1 required positional argument: 'pixel_values'")

    del model._attnviz_around
    monkeypatch.setattr(capture, "trace", refusing)
    for _ in range(2):
        with pytest.raises(UnsupportedModelError, match="a pass over four tokens failed"):
            residual.around(model, 1)
    assert passes == [1]


@pytest.mark.parametrize("kind", ["gpt_neox", "modernbert"])
def test_alti_and_mixing_run_on_any_model(kind, folders, tmp_path):
    """`show --measure alti` and `report`'s mixing ratios on types with no adapter: rows of
    ALTI sum to 1, the report gives four mixing ratios a layer."""
    found = attnviz.attention(TEXT, model=folders[kind], device="cpu", measure="alti")
    assert np.allclose(found.weights.sum(axis=-1), 1.0, atol=1e-5)
    reported = runner.invoke(app, ["report", TEXT, "A dog barked.", "-m", folders[kind],
                                   "-o", str(tmp_path / "r"), "--json"])  # fmt: skip
    assert reported.exit_code == 0, reported.output
    said = json.loads(reported.stdout)
    mixing = said["mixing_ratio"]  # four ratios, one value a layer, each in [0, 1]
    assert mixing is not None and len(mixing) == 4, said
    assert all(len(ratios) == 2 and all(0 <= r <= 1 for r in ratios) for ratios in mixing.values())


def test_ablation_acts_inside_the_attention_function(folders):
    """`show --ablate 1.2` on GPT-NeoX: the loss after equals a copy whose output projection
    (attention.dense) ignores head 2 of layer 1, by a plain loop."""
    import torch

    from attnviz.core.models import load_model

    folder = folders["gpt_neox"]
    result = runner.invoke(app, ["show", TEXT, "-m", folder, "--ablate", "1.2", "--no-images",
                                 "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["ablation"]
    loaded = load_model(folder, "cpu", "eager")
    ids = _ids(loaded, TEXT)
    copied = copy.deepcopy(loaded.model)
    d_head = loaded.info.d_head
    with torch.no_grad():
        copied.gpt_neox.layers[1].attention.dense.weight[:, 2 * d_head : 3 * d_head] = 0
    for model, said in ((loaded.model, data["before"]), (copied, data["after"])):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        targets = torch.tensor(ids[1:])
        loss = -torch.log_softmax(logits[:-1], dim=-1)[torch.arange(len(targets)), targets]
        assert said == pytest.approx(float(loss.mean()), abs=1e-5)
    assert data["after"] != pytest.approx(data["before"], abs=1e-6)


@pytest.mark.parametrize("kind", ["gpt_oss", "modernbert"])
def test_serve_pages_and_tiles_of_any_model(kind, folders):
    """`serve`'s page of the text, and a tile of every head made from the queries and keys
    its pass kept: the API's cells (sinks and local windows too); norm tiles, the API's
    `--measure norm`."""
    from attnviz.core.models import model
    from attnviz.pipelines import serve, tiles
    from attnviz.pipelines.serve import Question
    from attnviz.pipelines.tiles import Holder, TileQuestion

    served, holder = model(folders[kind], "cpu"), Holder()
    answer = serve.page(served, Question(TEXT), holder=holder)
    api = attnviz.attention(TEXT, model=folders[kind], device="cpu")
    assert answer["tiles"]["tokens"] == len(api.tokens)
    n = len(api.tokens)
    for layer in range(api.info.n_layers):
        for head in range(api.info.n_heads):
            tile = tiles.tile(served, holder, TileQuestion(layer, head, q0=0, q1=n, k0=0, k1=n))
            found = np.array(tile["values"], dtype=np.float32)
            assert np.abs(found - api.pattern(layer, head)).max() <= 1e-6
    # norm tiles: ‖α f(x_j)‖ from the held lengths (v and W_O by name), the API's norm
    norm = attnviz.attention(TEXT, model=folders[kind], device="cpu", measure="norm")
    for layer in range(api.info.n_layers):
        tile = tiles.tile(served, holder, TileQuestion(layer, 1, q0=0, q1=n, k0=0, k1=n,
                                                       measure="norm"))  # fmt: skip
        found = np.array(tile["values"], dtype=np.float32)
        assert np.abs(found - norm.weights[layer, 1]).max() <= 1e-5


def test_an_encoder_decoder_without_an_adapter_reads_every_stack(folders, tmp_path):
    """M2M-100: cross-attention (the default stack) and the encoder's, each the model's own
    eager attention; `show --generate` writes a target and its page."""
    model = folders["m2m_100"]
    for stack in ("cross", "encoder", "decoder"):
        found = attnviz.attention(TEXT, model=model, device="cpu", target="A cat sat.",
                                  stack=stack)  # fmt: skip
        eager = attnviz.attention(TEXT, model=model, device="cpu", target="A cat sat.",
                                  stack=stack, implementation="eager")  # fmt: skip
        assert found.stack == stack and found.weights.shape == eager.weights.shape
        assert np.abs(found.weights - eager.weights).max() <= 1e-5
    shown = runner.invoke(app, ["show", TEXT, "-m", model, "--generate", "4", "--html",
                                "-o", str(tmp_path)])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert list(tmp_path.rglob("attention.html"))


def test_a_report_says_why_it_leaves_the_mixing_ratios_out(tmp_path):
    """MobileBERT (its blocks' bottlenecks fit no form `residual.around` reads): report.md
    and heads.json say why the mixing ratios are left out; the rest of the report is there."""
    from transformers import AutoModelForMaskedLM

    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.models import load_model
    from attnviz.pipelines.report import build_report

    tokenizer = _wordpiece_tokenizer()
    folder = any_models.save("mobilebert", AutoModelForMaskedLM, tokenizer, tmp_path / "m",
                             vocab_size=len(tokenizer))  # fmt: skip
    loaded = load_model(folder, "cpu")
    said: list[str] = []
    texts = Sentences(tuple(Sentence(i + 1, i + 1, t) for i, t in enumerate([TEXT])), 0, "texts")
    report = build_report(loaded, texts, on_warning=said.append)
    assert report.mixing is None and "cannot tell how layer 0" in report.mixing_left_out
    assert said == [f"the mixing ratios are left out: {report.mixing_left_out}"]
    assert report.as_dict()["mixing_ratio_left_out"] == report.mixing_left_out


def test_eager_attention_reads_a_continuation_and_serves_no_tiles(folders):
    """With --attention eager nothing reaches attnviz's function as the model writes: the
    prompt and its continuation are read in one more pass, equal to what the function keeps
    as it writes (a target, and --generate's tokens), and the server's page says why it holds
    no tiles (they are made from the q and k that function keeps)."""
    from attnviz.core.models import model
    from attnviz.pipelines import serve
    from attnviz.pipelines.serve import Question
    from attnviz.pipelines.tiles import Holder

    folder = folders["gpt_neox"]
    for asked in (dict(target="A dog barked."), dict(generate=4)):
        kept = attnviz.attention(TEXT, model=folder, device="cpu", **asked)
        eager = attnviz.attention(TEXT, model=folder, device="cpu", implementation="eager",
                                  **asked)  # fmt: skip
        assert eager.info.implementation == "eager" and eager.tokens == kept.tokens
        assert eager.continuation.start == kept.continuation.start
        assert np.abs(eager.weights - kept.weights).max() <= 1e-5
    answer = serve.page(model(folder, "cpu", "eager"), Question(TEXT), holder=Holder())
    assert answer["tiles"] is None and "runs eager attention here" in answer["tiles_note"]
