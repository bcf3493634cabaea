"""OPT: a decoder with separate q, k, v and out projections. The released models normalise
before each block (do_layer_norm_before), OPT-350m after it (post-LN, as BART)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("opt",)
CAUSAL = True


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.decoder.layers[layer]
    own = block.self_attn
    norm = block.self_attn_layer_norm
    if model.config.do_layer_norm_before:  # pre-LN: the norm reads the residual stream
        return LayerModules(own, own.q_proj, own.out_proj, residual=norm)
    return LayerModules(own, own.q_proj, own.out_proj, norm=norm)
