"""GPT-NeoX (Pythia): one fused query_key_value, read after input_layernorm, causal. Attention
and feed-forward read the same stream and are added to it together (use_parallel_residual)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("gpt_neox",)
CAUSAL = True


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.layers[layer]
    own = block.attention
    return LayerModules(own, own.query_key_value, own.dense, residual=block.input_layernorm)
