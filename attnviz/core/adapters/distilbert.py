"""DistilBERT."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights

TYPES = ("distilbert",)
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.transformer.layer[layer]
    own = block.attention
    return LayerModules(own, own.q_lin, own.out_lin, norm=block.sa_layer_norm)


def weights(model: Any, layer: int) -> LayerWeights:
    mods = modules(model, layer)
    own = mods.attention
    return separate(model.config.n_heads, own.q_lin, own.k_lin, own.v_lin, mods.o)
