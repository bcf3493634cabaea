"""Ablation that starts each ablated copy at its ablated layer, from the clean pass's outputs
of the layers below (attnviz.analysis.importance._LowerLayers), gives the scores of full
passes through every layer; on tiny random models of 4 layers, so that a copy skips up to 3."""

from __future__ import annotations

import numpy as np
import pytest

# Three lengths, so that batches pad their texts to different widths.
TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!", "It rained."]
LAYERS = 4
ARCHS = ["bert", "bert-mlm", "distilbert", "gpt2", "llama", "gemma2", "phi3", "albert"]


@pytest.fixture(scope="module")
def deep(tiny_model_dirs, loaded_tiny, tmp_path_factory):
    """Tiny models of each architecture in ARCHS with 4 layers (the shared ones have 2):
    the shared tiny model's config and tokenizer, new random weights of 10× the usual spread,
    loaded as attnviz loads any model. "bert-mlm" is BERT with its masked-LM head (the
    masked-LM objective; plain "bert" is measured by its embedding's cosine)."""
    import torch
    from transformers import AutoConfig, BertForMaskedLM

    from attnviz.core.models import load_model

    root = tmp_path_factory.mktemp("deep-models")
    loaded = {}
    for arch in ARCHS:
        tiny = arch.removesuffix("-mlm")
        config = AutoConfig.from_pretrained(tiny_model_dirs[tiny])
        config.num_hidden_layers = LAYERS
        config.initializer_range = 0.2  # not 0.02: heads that move the objective visibly
        if getattr(config, "layer_types", None):  # Gemma2: sliding, full, sliding, full
            config.layer_types = (list(config.layer_types) * LAYERS)[:LAYERS]
        torch.manual_seed(1)
        model = (BertForMaskedLM if arch == "bert-mlm" else type(loaded_tiny[tiny].model))(config)
        model.save_pretrained(root / arch)
        loaded_tiny[tiny].tokenizer.save_pretrained(root / arch)
        loaded[arch] = load_model(str(root / arch), "cpu")
        assert loaded[arch].info.n_layers == LAYERS
    return loaded


def _encoded(loaded):
    from attnviz.core.tokens import encode

    return [encode(loaded, t) for t in TEXTS]


@pytest.mark.parametrize("ablation", ["zero", "mean"])
@pytest.mark.parametrize("arch", ARCHS)
def test_reuse_gives_the_scores_of_full_passes(deep, arch, ablation):
    """Every head, reuse against every layer run, within 1e-5: in one batch, and with two
    texts a batch (two batches of texts, the second's lower layers from a pass of its own;
    several batches per layer)."""
    from attnviz.analysis.importance import importance

    loaded = deep[arch]
    encoded = _encoded(loaded)
    for batch_size in (None, 2):
        reused = importance(loaded, encoded, ablation=ablation, batch_size=batch_size)
        full = importance(loaded, encoded, ablation=ablation, batch_size=batch_size,
                          reuse=False)  # fmt: skip
        assert np.isfinite(reused.scores).all()
        largest = np.abs(full.scores).max()
        assert largest > 1e-3  # the heads matter, so that the check can fail
        difference = np.abs(reused.scores - full.scores).max()
        # within 1e-5, and within 1e-4 of the largest score (BERT's embedding moves ~1e-5)
        assert difference <= min(1e-5, 1e-4 * largest)
        assert reused.clean == full.clean


def test_reuse_gives_the_scores_of_full_passes_on_some_heads(deep):
    """A choice of layers and heads, out of order: each batch starts at its own layer."""
    from attnviz.analysis.importance import importance

    loaded = deep["llama"]
    encoded = _encoded(loaded)
    chosen = dict(layers=[3, 1], heads=[2, 0], batch_size=3)
    reused = importance(loaded, encoded, **chosen).scores
    full = importance(loaded, encoded, reuse=False, **chosen).scores
    assert np.isfinite(reused[[1, 3]][:, [0, 2]]).all()
    np.testing.assert_allclose(reused, full, rtol=0, atol=1e-5)  # NaN where not chosen, alike


def _attention_calls(loaded, layer, run) -> int:
    """How often `layer`'s attention runs while `run()` does."""
    from attnviz.core import layer_map

    calls = []
    module = layer_map.layer_modules(loaded.model, layer).attention
    handle = module.register_forward_hook(lambda *_: calls.append(1))
    try:
        run()
    finally:
        handle.remove()
    return len(calls)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_ablated_copies_skip_the_layers_below(deep, arch):
    """Ablating layer 2's heads: with reuse, layers 0 and 1 run in the clean pass only (one
    batch of texts), layer 2 in every batch; without reuse, every layer in every batch."""
    from attnviz.analysis.importance import importance

    loaded = deep[arch]
    encoded = _encoded(loaded)
    chosen = dict(layers=[2], batch_size=4)  # 4 heads × 3 texts: 3 batches of 4 rows

    def calls(layer, reuse):
        return _attention_calls(
            loaded, layer, lambda: importance(loaded, encoded, reuse=reuse, **chosen)
        )

    # the embedding objective's reference embeddings take one more clean pass
    clean_passes = 2 if arch == "bert" else 1
    assert [calls(layer, True) for layer in range(3)] == [clean_passes] * 2 + [clean_passes + 3]
    assert [calls(layer, False) for layer in range(3)] == [clean_passes + 3] * 3


def test_shared_layers_run_every_layer(deep):
    """ALBERT's layers are one block called 4 times: no block per layer to start from, so
    every ablated copy runs every layer (the scores above show they still agree)."""
    from attnviz.analysis.importance import _layer_blocks

    albert, llama = deep["albert"], deep["llama"]
    assert _layer_blocks(albert.model, LAYERS) is None
    blocks = _layer_blocks(llama.model, LAYERS)
    assert blocks is not None and list(blocks) == list(llama.model.model.layers)


def test_blocks_are_put_back_after_a_run(deep):
    """After ablation, no block keeps a stand-in `forward`: the model runs as before."""
    import torch

    from attnviz.analysis.importance import importance
    from attnviz.core.tokens import pad

    loaded = deep["gpt2"]
    encoded = _encoded(loaded)
    inputs = pad(loaded, encoded)
    with torch.no_grad():
        before = loaded.model(**inputs).logits
    importance(loaded, encoded, layers=[3])
    assert not any("forward" in vars(block) for block in loaded.model.transformer.h)
    with torch.no_grad():
        assert torch.equal(loaded.model(**inputs).logits, before)
