"""Llama-family decoders: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2.

RoPE turns Q_h and K_h; grouped-query attention shares key/value heads; Qwen3 normalises q and
k per head; Mistral, Qwen2/3 and Gemma2 may use sliding windows; Gemma2 soft-caps the scores
and scales them by query_pre_attn_scalar.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.families.base import linear, rope
from attnviz.core.layer_map.base import LayerModules
from attnviz.core.mha import LayerWeights
from attnviz.errors import UnsupportedModelError


def weights(model: Any, layer: int, mods: LayerModules) -> LayerWeights:
    attn = mods.attention
    projections = [linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
    (w_q, b_q), (w_k, b_k), (w_v, b_v) = projections
    return decoder_weights(model, attn, w_q, b_q, w_k, b_k, w_v, b_v)


def decoder_weights(model: Any, attn: Any, *qkv: Any) -> LayerWeights:
    """The layer's weights from its Q, K, V (W, b pairs flattened) and the module's extras."""
    config = model.config
    kind = config.model_type
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError(
            f"{kind} with bidirectional attention is not supported by check"
        )
    q_norm = getattr(attn, "q_norm", None)
    if q_norm is not None and type(q_norm).__name__ != "Qwen3RMSNorm":
        raise UnsupportedModelError(f"{kind}: check supports Qwen3's q/k RMSNorm only")
    w_o, b_o = linear(attn.o_proj)
    return LayerWeights(
        *qkv, w_o, b_o,
        n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        rope=rope(config, attn.head_dim),
        q_norm=q_norm.weight.detach() if q_norm is not None else None,
        k_norm=attn.k_norm.weight.detach() if q_norm is not None else None,
        norm_eps=q_norm.variance_epsilon if q_norm is not None else 1e-6,
        scale=attn.scaling,
        softcap=getattr(attn, "attn_logit_softcapping", None),
        window=window(config, attn),
    )  # fmt: skip


def window(config: Any, attn: Any) -> int | None:
    """The sliding window this layer's mask uses, or None: Mistral and Phi-3 apply
    config.sliding_window to every layer, Qwen2/3 and Gemma2 to their sliding layers."""
    if config.model_type in ("mistral", "phi3"):
        return getattr(config, "sliding_window", None)
    return getattr(attn, "sliding_window", None)
