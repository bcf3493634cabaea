"""GPT-2: a fused c_attn (Conv1D, [Q | K | V]) read after ln_1, causal."""

from __future__ import annotations

from typing import Any

from attnviz.core.layer_map.base import LayerModules

TYPES = ("gpt2",)
CAUSAL = True


def modules(model: Any, layer: int) -> LayerModules:
    block = model.base_model.h[layer]
    own = block.attn
    return LayerModules(own, own.c_attn, own.c_proj, residual=block.ln_1)
