"""OPT: a decoder with separate q, k, v and out projections; its learned positions are added
to the embeddings, so the scores have no position term. The released models normalise before
each block (do_layer_norm_before), OPT-350m after it (post-LN, as BART)."""

from __future__ import annotations

from typing import Any

from attnviz.core.adapters.base import LayerModules, separate
from attnviz.core.mha import LayerWeights

TYPES = ("opt",)
CAUSAL = True


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.decoder.layers[layer]
    own = block.self_attn
    norm = block.self_attn_layer_norm
    if model.config.do_layer_norm_before:  # pre-LN: the norm reads the residual stream
        return LayerModules(own, own.q_proj, own.out_proj, residual=norm)
    return LayerModules(own, own.q_proj, own.out_proj, norm=norm)


def weights(model: Any, layer: int) -> LayerWeights:
    """The textbook's layer: OPT scales Q_h by 1/√d_k before Q_h K_hᵀ, which is the same
    score."""
    own = modules(model, layer).attention
    return separate(own.num_heads, own.q_proj, own.k_proj, own.v_proj, own.out_proj)
