"""GPT-2: a fused c_attn (Conv1D, [Q | K | V]), causal."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import linear
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    config = model.config
    if not config.scale_attn_weights or config.scale_attn_by_inverse_layer_idx:
        raise UnsupportedModelError(
            "GPT-2 with non-standard score scaling (scale_attn_weights=False or "
            "scale_attn_by_inverse_layer_idx=True) is not supported by check"
        )
    weight, bias = linear(mods.q)  # (d_model, 3·d_model): [Q | K | V]
    d = weight.shape[0]
    (w_q, w_k, w_v), (b_q, b_k, b_v) = weight.split(d, dim=1), bias.split(d)
    w_o, b_o = linear(mods.o)
    return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, config.num_attention_heads)
