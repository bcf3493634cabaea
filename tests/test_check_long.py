"""`check` at any length (issue 61): past `memory.CHECK_WHOLE_LAYER` a layer is checked a
block of query rows at a time (`mha.RowBlocks` against the rows attnviz's function records),
with the same verdict as the whole check; the bound is set to 0 so tiny models cross it."""

from __future__ import annotations

import pytest
import torch

from attnviz.core import capture, families, memory
from attnviz.core.mha import RowBlocks, multi_head_attention
from attnviz.core.tokens import pad
from attnviz.pipelines.check import check_layers, in_blocks
from tests.conftest import perturbed_copy
from tests.test_check import random_batch

ARCHS = ["bert", "llama", "gpt2", "mistral", "gemma2", "qwen3", "albert"]


@pytest.mark.parametrize("size", [1, 7, None])
@pytest.mark.parametrize("arch", ["llama", "gemma2", "bert"])
def test_blocks_of_rows_are_the_whole_attention(loaded_tiny, arch, size):
    loaded = loaded_tiny[arch]
    batch = random_batch(loaded, [11, 8], seed=5)
    inputs = pad(loaded, batch)
    mask, causal = inputs["attention_mask"], loaded.info.causal
    seen = {}
    capture.run(loaded, inputs, [capture.Each([1], ("input",), seen.__setitem__)])
    weights = families.layer_weights(loaded.model, 1)
    whole = multi_head_attention(seen[1]["input"], weights, mask, causal)
    blocks = RowBlocks(seen[1]["input"], weights, mask, causal)
    step = size or 11
    rows = torch.cat([blocks.rows(s, min(s + step, 11)) for s in range(0, 11, step)], dim=2)
    torch.testing.assert_close(rows, whole.probs, atol=1e-12, rtol=0)
    torch.testing.assert_close(blocks.output(), whole.output, atol=1e-12, rtol=0)
    shapes = {name: shape for name, _, shape in blocks.shapes()}
    assert shapes == {name: shape for name, _, shape in whole.shapes}


@pytest.mark.parametrize("arch", ARCHS)
def test_past_the_bound_a_check_in_blocks_passes_as_the_whole_one(loaded_tiny, arch,
                                                                  monkeypatch):  # fmt: skip
    loaded = loaded_tiny[arch]
    batch = random_batch(loaded, [11, 5, 8], seed=7)
    layers = list(range(loaded.info.n_layers))
    assert not in_blocks(loaded, 3, 11)
    whole, whole_shapes = check_layers(loaded, batch, layers)
    monkeypatch.setattr(memory, "CHECK_WHOLE_LAYER", 0)
    assert in_blocks(loaded, 3, 11)
    found, shapes = check_layers(loaded, batch, layers)
    assert shapes == whole_shapes
    for ours, theirs in zip(found, whole, strict=True):
        assert ours.layer == theirs.layer
        assert max(ours.head_errors) <= 1e-5 and ours.output_error <= 1e-5, (arch, ours)


def test_a_check_in_blocks_still_finds_a_wrong_head(loaded_tiny, tiny_model_dirs, tmp_path,
                                                    monkeypatch):  # fmt: skip
    """Our side reads the first model's weights; the pass runs a model whose one head differs:
    that head, and only it, fails, past the bound as below it."""
    from attnviz.core.models import load_model

    loaded = loaded_tiny["llama"]
    changed = load_model(str(perturbed_copy(tiny_model_dirs["llama"], tmp_path / "c", 1, 2)),
                         "cpu")  # fmt: skip
    batch = random_batch(loaded, [11], seed=2)
    monkeypatch.setattr(memory, "CHECK_WHOLE_LAYER", 0)
    monkeypatch.setattr(families, "layer_weights",
                        lambda model, layer, stack=None, _real=families.layer_weights:
                        _real(loaded.model, layer, stack))  # fmt: skip
    found, _ = check_layers(changed, batch, [0, 1])
    assert max(found[0].head_errors) <= 1e-5
    assert found[1].failing_heads(1e-5) == [2]


def test_a_check_over_the_memory_is_one_line_before_the_model_loads(monkeypatch):
    from typer.testing import CliRunner

    from attnviz.cli import app
    from attnviz.core.models import Model

    monkeypatch.setattr(Model, "load", lambda self: pytest.fail("the model loaded"))
    monkeypatch.setenv(memory.ENV, "200MiB")
    done = CliRunner().invoke(app, ["check", "The cat sat on the mat."])
    assert done.exit_code == 2
    (line,) = done.output.strip().splitlines()
    assert "check of this text (9 tokens) needs about" in line and "200 MiB" in line


def test_the_estimate_of_a_long_check_is_bounded_by_its_blocks():
    """8,085 tokens of SmolLM2 (9 heads): in blocks, about 2 GiB beside the model;
    whole, one layer's maps alone would take 2.4 GB and ours in float64 more."""
    blocks = memory.check_estimate(9, 0, 8085, in_blocks=True).total
    whole = memory.check_estimate(9, 0, 8085, in_blocks=False).total
    assert memory.check_in_blocks(9, 8085) and not memory.check_in_blocks(9, 1720)
    assert blocks < 3 * memory.GiB < 10 * memory.GiB < whole
