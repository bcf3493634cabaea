"""BART, mBART and Marian (opus-mt): an encoder and a decoder stack. BART and Marian normalise
after each block (post-LN), mBART before it (pre-LN). Three attention stacks: encoder self,
decoder self (causal), and cross-attention (decoder queries over the encoder's last hidden
states)."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("bart", "mbart", "marian")
CAUSAL = False
STACKS = ("encoder", "decoder", "cross")


def modules(model: Any, layer: int, stack: str) -> LayerModules:
    base = model.base_model
    block = (base.encoder if stack == "encoder" else base.decoder).layers[layer]
    own = block.encoder_attn if stack == "cross" else block.self_attn
    norm = block.encoder_attn_layer_norm if stack == "cross" else block.self_attn_layer_norm
    if model.config.model_type == "mbart":  # pre-LN: the norm reads the residual stream
        return LayerModules(own, own.q_proj, own.out_proj, residual=norm, kv_input=own.v_proj)
    return LayerModules(own, own.q_proj, own.out_proj, norm=norm, kv_input=own.v_proj)
