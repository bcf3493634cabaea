"""`check` on the families docs/models.md names first beside BERT and Llama: GPT-NeoX (Pythia:
a fused QKV interleaved head by head, partial RoPE), OPT (pre-LN, and OPT-350m's post-LN),
ModernBERT (global layers and local ones: a band of ±3 keys and a RoPE base of their own),
and the vision transformers ViT, DeiT and DINOv2 (without and with registers), which read a
picture. Tiny random checkpoints of two layers, saved as a user's are: every head and the
block's output within 1e-5, one head made wrong fails alone, each step a family adds is
needed to pass, and the measures read through the new adapters equal those read without one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from attnviz.core import families, layer_map, memory
from attnviz.pipelines.check import check_layers, in_blocks
from tests import any_models
from tests.conftest import _byte_level_tokenizer, _wordpiece_tokenizer
from tests.test_check import random_batch

runner = CliRunner()
TEXT = "The cat sat on the mat because it was tired."
# {name: (model type, config overrides)}: the text models saved below
TEXT_MODELS = {
    "gpt_neox": ("gpt_neox", {}),
    "opt": ("opt", {}),
    "opt-post-ln": ("opt", {"do_layer_norm_before": False}),  # OPT-350m's order
    "modernbert": ("modernbert", {}),  # layer 0 global, layer 1 local: ±3 keys
}
PICTURE_MODELS = ("vit", "deit", "dinov2", "dinov2_with_registers")  # tests/vision_models.py
EXACT = 1e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{name: a folder with the tiny model (with its LM head) and a tokenizer}."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    root = tmp_path_factory.mktemp("check-families")
    found = {}
    for name, (kind, overrides) in TEXT_MODELS.items():
        if kind == "modernbert":
            tokenizer, loader = _wordpiece_tokenizer(), AutoModelForMaskedLM
            ids = {}
        else:
            tokenizer, loader = _byte_level_tokenizer(), AutoModelForCausalLM
            ids = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)
        found[name] = any_models.save(kind, loader, tokenizer, root / name,
                                      vocab_size=len(tokenizer), **ids, **overrides)  # fmt: skip
    return found


@pytest.fixture(scope="module")
def loaded(folders):
    from attnviz.core.models import load_model

    return {name: load_model(folder, "cpu") for name, folder in folders.items()}


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    from vision_models import picture

    return picture(tmp_path_factory.mktemp("photo") / "photo.png")


def _wrong_head(monkeypatch, layer: int, head: int, change=None) -> None:
    """Our side reads `layer`'s weights with head `head`'s W_Q moved (or, with `change`,
    `change(weights)` in its place); the model runs its own."""
    real = families.layer_weights

    def moved(model, at, stack=None):
        weights = real(model, at, stack)
        if at != layer:
            return weights
        if change is not None:
            return change(model, weights)
        w_q, d_k = weights.w_q.clone(), weights.d_k
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn(w_q.shape[0], d_k, generator=generator)
        w_q[:, head * d_k : (head + 1) * d_k] += 0.5 * noise  # head's queries only
        return replace(weights, w_q=w_q)

    monkeypatch.setattr(families, "layer_weights", moved)


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_every_head_and_the_output_match_on_a_padded_batch(loaded, name):
    model = loaded[name]
    batch = random_batch(model, [11, 5, 8], seed=3)
    checks, shapes = check_layers(model, batch, [0, 1])
    for lc in checks:
        assert max(lc.head_errors) <= EXACT and lc.output_error <= EXACT, (name, lc)
    assert dict((step, shape) for step, _, shape in shapes)["scores"] == (3, 11, 11)
    if name == "gpt_neox":  # what check prints of its partial RoPE
        formulas = {step: formula for step, formula, _ in shapes}
        assert formulas["RoPE"] == "Q_h, K_h turned by position (their first 4 of 8 dims)"


def test_what_the_adapters_read_of_each_family(loaded):
    """GPT-NeoX turns 4 of each head's 8 dims (rotary_pct 0.5); ModernBERT's local layer has a
    band of 3 (local_attention 6) and its own RoPE base, its global layer none of either."""
    neox = families.layer_weights(loaded["gpt_neox"].model, 0)
    assert 2 * len(neox.rope.inv_freq) == 4 and neox.d_k == 8
    modern = [families.layer_weights(loaded["modernbert"].model, layer) for layer in (0, 1)]
    assert (modern[0].band, modern[1].band) == (None, 3)
    assert not torch.equal(modern[0].rope.inv_freq, modern[1].rope.inv_freq)
    assert modern[0].rope.inv_freq[1] == pytest.approx(160_000.0**-0.25)  # global_rope_theta
    assert modern[1].rope.inv_freq[1] == pytest.approx(10_000.0**-0.25)  # local_rope_theta


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_one_wrong_head_fails_alone(loaded, name, monkeypatch):
    model = loaded[name]
    _wrong_head(monkeypatch, 1, 2)
    checks, _ = check_layers(model, random_batch(model, [11, 8], seed=4), [0, 1])
    assert checks[0].passed(EXACT)
    assert checks[1].failing_heads(EXACT) == [2] and not checks[1].passed(EXACT)


def _gpt2_split(model, weights):
    """GPT-NeoX's fused projection read as GPT-2's [Q | K | V], not head by head."""
    from attnviz.core.families.base import linear

    weight, bias = linear(layer_map.layer_modules(model, 0).q)
    width = weight.shape[0]
    (w_q, w_k, w_v), (b_q, b_k, b_v) = weight.split(width, dim=1), bias.split(width)
    return replace(weights, w_q=w_q, b_q=b_q, w_k=w_k, b_k=b_k, w_v=w_v, b_v=b_v)


def _whole_rope(model, weights):
    """RoPE over all of each head's dims, not its first rotary_pct."""
    from attnviz.core.mha import Rope

    theta = model.config.rope_parameters["rope_theta"]
    exponents = torch.arange(0, weights.d_k, 2).float() / weights.d_k
    return replace(weights, rope=Rope(inv_freq=1.0 / theta**exponents))


def _global_rope(model, weights):
    """The local layer turned with the global layers' RoPE base."""
    return replace(weights, rope=families.layer_weights(model, 0).rope)


@pytest.mark.parametrize(
    "name, layer, change",
    [
        ("gpt_neox", 0, _gpt2_split),  # the heads' q, k and v taken as [Q | K | V]
        ("gpt_neox", 0, _whole_rope),  # every dim turned
        ("modernbert", 1, lambda _, weights: replace(weights, band=None)),  # no band
        ("modernbert", 1, lambda _, weights: replace(weights, band=None, window=3)),  # causal
        ("modernbert", 1, _global_rope),  # the local layer's own base left out
    ],
)  # fmt: skip
def test_each_step_a_family_adds_matters(loaded, name, layer, change, monkeypatch):
    """Leaving out or getting wrong any one step the family adds fails the check."""
    model = loaded[name]
    batch = random_batch(model, [11, 8], seed=5)
    assert check_layers(model, batch, [layer])[0][0].passed(EXACT)
    _wrong_head(monkeypatch, layer, 0, change)
    assert not check_layers(model, batch, [layer])[0][0].passed(EXACT)


@pytest.mark.parametrize("name", ["gpt_neox", "modernbert"])
def test_past_the_bound_a_check_in_blocks_passes(loaded, name, monkeypatch):
    """A layer checked a block of rows at a time (`mha.RowBlocks`: the band and partial RoPE
    of a block's queries) passes as the whole one does."""
    from attnviz.core import recording

    model = loaded[name]
    batch = random_batch(model, [11, 5, 8], seed=6)
    monkeypatch.setattr(memory, "CHECK_WHOLE_LAYER", 0)
    monkeypatch.setattr(recording, "BLOCK_ROWS", 4)  # blocks of 4, 4 and 3 rows
    assert in_blocks(model, 3, 11)
    checks, _ = check_layers(model, batch, [0, 1])
    for lc in checks:
        assert max(lc.head_errors) <= EXACT and lc.output_error <= EXACT, (name, lc)


@pytest.mark.parametrize("kind", PICTURE_MODELS)
def test_a_picture_is_checked(vision_dirs, photo, kind):
    from vision_models import PREFIX

    found = attnviz.check(str(photo), model=str(vision_dirs[kind]), device="cpu")
    assert found.passed and found.max_error <= EXACT and len(found.layers) == 2
    assert list(found.tokens) == [*PREFIX[kind], *(f"({r}, {c})" for r in range(4)
                                                   for c in range(4))]  # fmt: skip


@pytest.mark.parametrize("kind", ["vit", "dinov2"])
def test_a_wrong_head_fails_on_a_picture_whole_and_in_blocks(vision_dirs, photo, kind,
                                                             monkeypatch):  # fmt: skip
    _wrong_head(monkeypatch, 1, 2)
    found = attnviz.check(str(photo), model=str(vision_dirs[kind]), device="cpu")
    assert not found.passed and not found.in_blocks
    assert found.layers[0].passed(EXACT) and found.layers[1].failing_heads(EXACT) == [2]
    monkeypatch.setattr(memory, "CHECK_WHOLE_LAYER", 0)
    found = attnviz.check(str(photo), model=str(vision_dirs[kind]), device="cpu")
    assert found.in_blocks and found.layers[1].failing_heads(EXACT) == [2]


@pytest.mark.parametrize("name", [*TEXT_MODELS, *PICTURE_MODELS])
def test_the_cli_check_passes(folders, vision_dirs, photo, name):
    if name in TEXT_MODELS:
        args = ["check", TEXT, "-m", folders[name]]
    else:
        args = ["check", str(photo), "-m", str(vision_dirs[name])]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "PASS: 2 layer(s), every head and output within 1e-05" in result.output


def test_a_picture_and_a_text_go_to_their_own_models(folders, vision_dirs, photo):
    """check refuses a text to a vision model, and a picture to a text model, in one line."""
    said = runner.invoke(app, ["check", TEXT, "-m", str(vision_dirs["vit"])])
    assert said.exit_code == 2 and "it reads pictures, not text" in said.output
    said = runner.invoke(app, ["check", str(photo), "-m", folders["opt"]])
    assert said.exit_code == 2 and "reads text, not pictures" in said.output


@pytest.mark.parametrize("measure", ["norm", "alti"])
def test_the_measures_through_the_adapters_equal_those_read_without(loaded, measure,
                                                                    monkeypatch):  # fmt: skip
    """The norms (X through the adapter's W_V and W_O, against v and W_O by name) and ALTI with
    its mixing ratios (the adapter's norms around the block, against those read from the
    model itself, `core.residual`): the same within 1e-5 on every new text family."""
    from attnviz.analysis.contributions import read_measure
    from attnviz.core.tokens import encode

    for name, model in loaded.items():
        encoded = [encode(model, TEXT)]
        kept: list = []
        adapted = read_measure(model, encoded, measure, keep=kept)[0].weights
        with monkeypatch.context() as patched:
            patched.delitem(layer_map.BY_TYPE, model.model.config.model_type)
            again: list = []
            read = read_measure(model, encoded, measure, keep=again)[0].weights
        assert np.abs(adapted - read).max() <= EXACT, name
        for layer, found in (kept[0].mixing or {}).items():
            for ratio, other in zip(found.ratios, again[0].mixing[layer].ratios):
                assert (ratio - other).abs().max() <= EXACT, name


def test_the_page_s_inside_view_of_a_local_layer_shows_its_band(browser, folders, tmp_path):
    """ModernBERT's local layer on the page's inside view (built on the from-scratch
    attention, which the adapter gives it now): the query's keys are the 7 within ±3, and the
    page's own softmax over them, ours and the model's agree within 1e-5."""
    import re

    from tests.test_html import Opened

    shown = runner.invoke(app, ["show", TEXT, "-m", folders["modernbert"], "--html",
                                "--no-images", "-o", str(tmp_path)])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    opened = Opened(browser, next(tmp_path.rglob("attention.html")))
    try:
        opened.view("inside")
        n = opened.renders()
        opened.page.select_option("#layer", "1")
        opened.settle(n + 1)
        opened.page.select_option("#query", "6")
        opened.settle(n + 2)
        rows = opened.page.locator(".inside-table td.tok").all_inner_texts()
        assert [int(row.split(":")[0]) for row in rows] == list(range(3, 10))
        assert "keys within ±3 (a local layer)" in opened.page.inner_text("#view-inside")
        checks = opened.page.locator(".check").all_inner_texts()
        errors = [float(v) for text in checks for v in re.findall(r"\d\.\d+e[+-]\d+", text)]
        assert len(errors) == 3 and max(errors) < EXACT
        assert opened.errors == []
    finally:
        opened.close()


def test_models_doc_names_every_family_check_covers():
    """docs/models.md lists the adapters' model types: every type of the registry, no other."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    start = doc.index("The adapters know, one module a family:")
    listed = re.findall(r"`([a-z][a-z0-9_-]*)`", doc[start : doc.index("`tests/test_check.py`")])
    assert sorted(listed) == sorted(families.SUPPORTED)


def test_every_family_the_layer_map_names_has_its_weights():
    """A family is one module in each place (docs/models.md): the layer map's (where its
    layers are) and the families' (their weights), each registered once."""
    assert set(families.FAMILIES) == set(layer_map.NAMED)
    assert len(set(families.FAMILIES.values())) == len(families.FAMILIES)
    assert families.SUPPORTED == layer_map.SUPPORTED
