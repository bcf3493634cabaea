"""GPT-NeoX (Pythia): one fused query_key_value whose output holds each head's [q_h | k_h | v_h]
side by side, head after head (not [Q | K | V] as GPT-2's); partial RoPE (rotary_pct of each
head's dims turn, the rest pass); causal."""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import linear, rope
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    """W_Q, W_K and W_V taken apart from the fused projection, whose columns are, per head h,
    q_h (d_k columns), then k_h, then v_h."""
    config = model.config
    own = mods.attention
    n_heads, d_k = config.num_attention_heads, own.head_size
    weight, bias = linear(own.query_key_value)  # (d_model, H·3·d_k): [q_0 k_0 v_0 | q_1 …]
    d_model = weight.shape[0]
    by_head = weight.reshape(d_model, n_heads, 3, d_k)  # (d_model, H, q/k/v, d_k)
    biases = bias.reshape(n_heads, 3, d_k)  # (H, q/k/v, d_k)
    w_q, w_k, w_v = (by_head[:, :, i].reshape(d_model, n_heads * d_k) for i in range(3))
    b_q, b_k, b_v = (biases[:, i].reshape(n_heads * d_k) for i in range(3))
    w_o, b_o = linear(own.dense)
    return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads,
                        rope=rope(config, d_k), scale=own.scaling)  # fmt: skip
