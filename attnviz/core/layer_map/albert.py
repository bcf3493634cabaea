"""ALBERT: one set of attention modules shared by groups of layers (post-LN)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("albert",)
CAUSAL = False


def modules(model: Any, layer: int) -> LayerModules:
    config = model.config
    # ALBERT shares weights: layers are split evenly over num_hidden_groups groups.
    group = int(layer / (config.num_hidden_layers / config.num_hidden_groups))
    block = model.base_model.encoder.albert_layer_groups[group].albert_layers[0].attention
    return LayerModules(block, block.query, block.dense, norm=block.LayerNorm)
