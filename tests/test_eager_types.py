"""Model types whose attention bypasses transformers' attention interface (BLOOM, Falcon before
transformers 5.25, MPT, GPT-Neo, XGLM, DeBERTa-v2, MPNet, RoFormer: `any_models.BYPASS`) run
eager with `output_attentions`: attnviz finds each layer's attention module from the model's
own attentions and reads the probabilities from its output. Tiny random models (two layers)
saved as a user's checkpoints are; the API and `show` give transformers' own eager
`output_attentions`, and every command runs on them. Falcon from transformers 5.25 on goes
through the interface, and attnviz reads it there (SDPA): the same checks hold.

The memory estimate counts that eager holds a layer's whole scores and probabilities, and a
run that would not fit is refused in one line before the weights load.
"""

from __future__ import annotations

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
KINDS = {"bloom": "decoder", "falcon": "decoder", "mpt": "decoder", "gpt_neo": "decoder",
         "xglm": "decoder", "deberta-v2": "encoder", "mpnet": "encoder",
         "roformer": "encoder"}  # fmt: skip
EXACT = 1e-5


def _path(kind: str) -> str:
    """The attention attnviz runs `kind` with: eager where it bypasses the interface in the
    installed transformers, else SDPA through the interface."""
    return "eager" if kind in any_models.BYPASS else "sdpa"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{model type: a folder with the tiny model (with its LM head) and a tokenizer}."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    root = tmp_path_factory.mktemp("eager-types")
    found = {}
    for kind, role in KINDS.items():
        tokenizer = _wordpiece_tokenizer() if role == "encoder" else _byte_level_tokenizer()
        overrides = {"vocab_size": len(tokenizer)}
        loader = AutoModelForMaskedLM if role == "encoder" else AutoModelForCausalLM
        if role == "decoder":
            overrides.update(bos_token_id=0, eos_token_id=0, pad_token_id=0)
        found[kind] = any_models.save(kind, loader, tokenizer, root / kind, **overrides)
    return found


def _ids(folder: str, text: str) -> list[int]:
    """The ids attnviz reads `text` as (a decoder's BOS put first)."""
    from attnviz.core.models import model
    from attnviz.core.tokens import encode

    return list(encode(model(folder, "cpu").load(), text).ids)


def _eager(folder: str, ids: list[int]) -> np.ndarray:
    """transformers' own eager attention of `ids`, (L, H, T, T), the model loaded by
    transformers alone."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    masked = "ForMaskedLM" in AutoConfig.from_pretrained(folder).architectures[0]
    loader = AutoModelForMaskedLM if masked else AutoModelForCausalLM
    model = loader.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return np.stack([layer[0].numpy() for layer in out.attentions])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_api_gives_the_model_s_own_eager_attention(kind, folders):
    found = attnviz.attention(TEXT, model=folders[kind], device="cpu")
    assert found.info.model_type == kind and found.info.implementation == _path(kind)
    assert found.info.causal == (KINDS[kind] == "decoder")
    own = _eager(folders[kind], _ids(folders[kind], TEXT))
    assert found.weights.shape == own.shape
    assert np.abs(found.weights - own).max() <= EXACT
    assert np.allclose(found.weights.sum(axis=-1), 1.0, atol=EXACT)
    if KINDS[kind] == "decoder":  # the upper triangle is exactly 0
        assert not np.triu(found.weights, k=1).any()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_show_gives_the_model_s_own_eager_attention(kind, folders):
    """`show --json --query`: each head's strongest link and the query's top keys are cells
    of transformers' own eager attention; the header says it ran eager."""
    query = 3
    shown = runner.invoke(app, ["show", TEXT, "-m", folders[kind], "--device", "cpu",
                                "--no-images", "--json", "--query", str(query)])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    said = json.loads(shown.output)
    assert said["attention"] == _path(kind) and said["model"]["model_type"] == kind
    own = _eager(folders[kind], _ids(folders[kind], TEXT))
    assert len(said["heads"]) == own.shape[0] * own.shape[1]
    for head in said["heads"]:
        cells = own[head["layer"], head["head"]]
        link = head["strongest_link"]
        assert abs(link["weight"] - cells[link["query"], link["key"]]) <= EXACT
        for top in head["query_top"]:
            assert abs(top["weight"] - cells[query, top["index"]]) <= EXACT


def test_export_report_compare_and_a_continuation_run_on_bloom(folders, tmp_path):
    """export's attention.npz is the eager attention of each line; report (with importance
    by ablation), compare and show's page run; a target is read as the model reads prompt +
    target, and --generate writes."""
    model = folders["bloom"]
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXT}\nA dog barked.\n", encoding="utf-8")
    exported = runner.invoke(app, ["export", "-f", str(texts), "-m", model, "--save-raw",
                                   "--figures", "overview", "-o", str(tmp_path / "e")])  # fmt: skip
    assert exported.exit_code == 0, exported.output
    raws = sorted((tmp_path / "e").rglob("attention.npz"))
    assert len(raws) == 2
    for raw, text in zip(raws, (TEXT, "A dog barked.")):
        saved = np.load(raw)["attention"]
        assert np.abs(saved - _eager(model, _ids(model, text))).max() <= EXACT
    reported = runner.invoke(app, ["report", TEXT, "A dog barked.", "-m", model, "--importance",
                                   "ablation", "-o", str(tmp_path / "r")])  # fmt: skip
    assert reported.exit_code == 0, reported.output
    assert (tmp_path / "r" / "report.md").is_file()
    compared = runner.invoke(app, ["compare", TEXT, "A dog barked.", "-m", model,
                                   "-o", str(tmp_path / "c")])  # fmt: skip
    assert compared.exit_code == 0, compared.output
    shown = runner.invoke(app, ["show", TEXT, "-m", model, "--html", "--layer", "1",
                                "--generate", "3", "-o", str(tmp_path / "s")])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert list((tmp_path / "s").rglob("attention.html"))
    target = attnviz.attention(TEXT, model=model, device="cpu", target="A dog.")
    ids = _ids(model, TEXT) + _target_ids(model, TEXT, "A dog.")
    assert target.continuation is not None and len(target.tokens) == len(ids)
    assert np.abs(target.weights - _eager(model, ids)).max() <= EXACT


def _target_ids(folder: str, prompt: str, target: str) -> list[int]:
    from attnviz.core.generation import target_ids
    from attnviz.core.models import model

    return target_ids(model(folder, "cpu").load(), prompt, target)


def test_what_needs_attnviz_s_function_says_why_in_one_line(folders):
    """Each head's values (the norm measures) and the queries and keys tiles are made of are
    handed over inside attnviz's attention function, which these models never call: the
    measure is refused in one line, and the server's page comes without tiles, saying why."""
    from attnviz.core.models import model
    from attnviz.pipelines import serve
    from attnviz.pipelines.serve import Question
    from attnviz.pipelines.tiles import Holder

    refused = runner.invoke(app, ["show", TEXT, "-m", folders["gpt_neo"], "--measure", "norm",
                                  "--no-images"])  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert "'gpt_neo' computes its attention in its own code" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    answer = serve.page(model(folders["deberta-v2"], "cpu"), Question(TEXT), holder=Holder())
    assert answer["tiles"] is None
    assert "'deberta-v2' runs eager attention here" in answer["tiles_note"]


def test_a_type_whose_maps_are_not_the_text_s_square_is_refused_in_one_line(tmp_path):
    """Longformer hands back a band of keys around each query, (B, H, T, window): no module's
    output holds (T, T) maps, so it is refused once loaded, in one line."""
    from transformers import AutoModelForMaskedLM

    from attnviz.errors import UnsupportedModelError

    tokenizer = _wordpiece_tokenizer()
    folder = any_models.save("longformer", AutoModelForMaskedLM, tokenizer, tmp_path / "m",
                             vocab_size=len(tokenizer))  # fmt: skip
    with pytest.raises(UnsupportedModelError, match=r"^\S+ \('longformer'\) computes its "
                       r"attention in its own code, and none of its modules hands out each "
                       r"layer's \(T, T\) probabilities"):  # fmt: skip
        attnviz.attention(TEXT, model=folder, device="cpu")


def test_the_memory_estimate_counts_eager_s_whole_layer(folders, monkeypatch):
    """The files say the type runs eager, so the estimate before loading counts its layer's
    scores and probabilities: a limit that the interface's estimate fits is refused for it,
    in one line, before the weights load."""
    from dataclasses import replace

    from attnviz.core import memory, models
    from attnviz.core.settings import Load
    from attnviz.errors import MemoryLimitError

    spec = models.describe(folders["bloom"])
    assert spec.eager_only
    n = spec.count_tokens(TEXT)
    weights = Load().weights_held(spec)
    asked = memory.Asked(images=False)
    eager = memory.estimate(spec.n_layers, spec.n_heads, weights, n, replace(asked, eager=True))
    plain = memory.estimate(spec.n_layers, spec.n_heads, weights, n, asked)
    grid = spec.n_heads * n * n * memory.FLOAT  # one layer's maps
    assert eager.total - plain.total == (memory.EAGER_LAYER - 2) * grid
    monkeypatch.setenv(memory.ENV, str(eager.total - 1))
    memory.refuse(replace(spec, eager_only=False), Load(), [TEXT], asked)  # fits
    with pytest.raises(MemoryLimitError, match="needs about"):
        memory.refuse(spec, Load(), [TEXT], asked)

    def not_loaded(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", not_loaded)
    monkeypatch.setattr(models, "_MODELS", {})
    monkeypatch.setattr(models, "_KEPT", models._Kept())
    shown = runner.invoke(app, ["show", TEXT, "-m", folders["bloom"], "--no-images"])
    assert shown.exit_code == 2, shown.output
    assert "needs about" in shown.output and len(shown.output.strip().splitlines()) == 1


def test_a_streamed_or_held_eager_run_counts_a_whole_layer(monkeypatch):
    """A long text's streamed run holds blocks of rows, but a model running eager makes each
    layer whole first; so does the API's, beside the maps it holds."""
    from attnviz.core import memory
    from attnviz.errors import MemoryLimitError

    layers, heads, n = 30, 9, 4096
    long = memory.Asked()
    assert memory.streams(layers, heads, n, long)
    eager = memory.estimate(layers, heads, 0, n, memory.Asked(eager=True))
    plain = memory.estimate(layers, heads, 0, n, long)
    layer = heads * n * n * memory.FLOAT
    assert eager.total - plain.total == memory.EAGER_LAYER * layer
    monkeypatch.setattr(memory, "_own_rss", lambda: 0)
    monkeypatch.setenv(memory.ENV, str(3 * layer + 1 * memory.GiB))  # 2 layers held fit
    memory.check_held(2, layers, heads, n, to_file=False)
    with pytest.raises(MemoryLimitError, match="take .* held whole"):
        memory.check_held(2, layers, heads, n, to_file=False, eager=True)


PAIRS = (
    ("the keys to the cabinet are on the table and the cat sat on the mat",
     "the key to the cabinets is on the table and the cat sat on the mat"),
    ("the cat sat on the mat", "a big black cat sat quietly on the mat near the door"),
)  # fmt: skip


@pytest.mark.parametrize("kind", ["bloom", "deberta-v2"])
def test_compare_in_blocks_cuts_eager_s_whole_maps_into_rows(kind, folders, monkeypatch,
                                                             tmp_path):  # fmt: skip
    """`compare` of long texts (past `memory.STREAM_ABOVE`, set to 0 here) reads A and B in one
    padded pass a block of rows at a time; a type that runs eager hands capture each layer's
    whole maps, which it cuts into those blocks: the comparison is the one held whole."""
    from dataclasses import replace

    from attnviz.core import memory
    from attnviz.core.settings import Load
    from attnviz.pipelines.compare import compare
    from attnviz.pipelines.request import CompareRequest

    request = CompareRequest(Load(folders[kind], "cpu"), pairs=PAIRS, out=tmp_path / "held",
                             top=3, query="sat")  # fmt: skip
    held = compare(request)
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    blocks = compare(replace(request, out=tmp_path / "blocks"))
    assert all(p.texts is not None for p in blocks.comparison.pairs)  # it did go in blocks
    assert all(p.texts is None for p in held.comparison.pairs)
    one, other = held.comparison, blocks.comparison
    np.testing.assert_allclose(other.divergence, one.divergence, atol=1e-6)
    for p, q in zip(one.pairs, other.pairs, strict=True):
        np.testing.assert_allclose(q.a.weights, p.a.weights, atol=1e-6)
        np.testing.assert_allclose(q.b.weights, p.b.weights, atol=1e-6)
        np.testing.assert_allclose(q.rows, p.rows, atol=1e-6)
        assert q.tokens == p.tokens
    np.testing.assert_allclose(blocks.query.divergence, held.query.divergence, atol=1e-6)


def test_compare_s_and_check_s_estimates_count_eager_s_whole_layer(folders, monkeypatch):
    """Before loading, `compare` in blocks counts the layer a type that runs eager makes whole
    for A and B at once (a limit the interface's estimate fits is refused, in one line), and
    `check` estimates such a type read whole, never in blocks."""
    from dataclasses import replace

    from attnviz.core import memory, models
    from attnviz.core.settings import Load
    from attnviz.pipelines import check
    from attnviz.pipelines.request import CheckRequest

    spec = models.describe(folders["bloom"])
    lengths = [tuple(spec.count_lengths(list(PAIRS[0])))]
    weights = Load().weights_held(spec)
    plain = memory.compare_estimate(spec.n_layers, spec.n_heads, weights, lengths, True)
    eager = memory.compare_estimate(spec.n_layers, spec.n_heads, weights, lengths, True, True)
    longest = max(lengths[0])
    layer = spec.n_heads * longest * longest * memory.FLOAT
    assert eager.total - plain.total == 2 * memory.EAGER_LAYER * layer

    monkeypatch.setattr(models.Model, "load", lambda self: pytest.fail("the model loaded"))
    monkeypatch.setattr(memory, "STREAM_ABOVE", 0)
    monkeypatch.setenv(memory.ENV, str(eager.total - 1))
    memory.refuse_estimate(plain, "compare", "")  # the interface's estimate fits
    done = runner.invoke(app, ["compare", *PAIRS[0], "-m", folders["bloom"], "--device", "cpu",
                               "--no-images"])  # fmt: skip
    assert done.exit_code == 2, done.output
    (line,) = done.output.strip().splitlines()
    assert "compare of 1 pair(s)" in line and "needs about" in line

    asked: list[bool] = []

    def estimate(n_heads, weights, n_tokens, in_blocks):
        asked.append(in_blocks)
        return memory.Estimate(0, 0)

    monkeypatch.setattr(memory, "check_in_blocks", lambda *args: True)
    monkeypatch.setattr(memory, "check_estimate", estimate)
    request = CheckRequest(Load(folders["bloom"], "cpu"), text=TEXT)
    check._fits(spec, request)  # eager: whole
    check._fits(replace(spec, eager_only=False), request)  # the interface: in blocks
    assert asked == [False, True]
