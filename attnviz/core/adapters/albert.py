"""ALBERT: one set of attention weights shared by groups of layers."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError

TYPES = ("albert",)
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    config = model.config
    # ALBERT shares weights: layers are split evenly over num_hidden_groups groups.
    group = int(layer / (config.num_hidden_layers / config.num_hidden_groups))
    block = model.base_model.encoder.albert_layer_groups[group].albert_layers[0].attention
    return LayerModules(block, block.query, block.dense, norm=block.LayerNorm)


def weights(model: Any, layer: int) -> LayerWeights:
    config = model.config
    if config.inner_group_num != 1:
        raise UnsupportedModelError("ALBERT with inner_group_num > 1 is not supported by check")
    mods = modules(model, layer)
    own = mods.attention
    return separate(config.num_attention_heads, own.query, own.key, own.value, mods.o)
