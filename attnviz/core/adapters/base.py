"""What every architecture's adapter provides, and the helpers they share.

An adapter is a module with:
- `TYPES`: the config `model_type`s it reads; `CAUSAL`: whether they are decoders;
- `modules(model, layer) -> LayerModules`: the layer's attention module (whose output holds
  the probabilities (B, H, T, T)), the projection whose input is the block's input X, and
  W_O, whose output is the block's output before residual and normalisation;
- `weights(model, layer) -> LayerWeights`: W_Q, W_K, W_V, W_O and biases in the `X @ W + b`
  convention of `attnviz.core.mha`, with what the family adds, or an UnsupportedModelError naming
  what the from-scratch attention does not compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.core.mha import LayerWeights


@dataclass(frozen=True, eq=False)
class LayerModules:
    """One layer's modules: its attention (whose output is (…, probabilities (B, H, T, T))),
    the projection whose input is X, and W_O, whose output is the block's output."""

    attention: Any
    q: Any
    o: Any


def linear(module: Any) -> tuple[Any, Any]:
    """(W, b) with W of shape (in, out): nn.Linear stores (out, in), GPT-2's Conv1D (in, out)."""
    import torch

    if isinstance(module, torch.nn.Linear):
        weight = module.weight.detach().T
    else:
        weight = module.weight.detach()
    bias = module.bias.detach() if module.bias is not None else torch.zeros(weight.shape[1])
    return weight, bias


def separate(n_heads: int, q: Any, k: Any, v: Any, o: Any) -> LayerWeights:
    """The weights of a layer with separate Q, K, V and O projections (one head per column
    block, no extras)."""
    (w_q, b_q), (w_k, b_k), (w_v, b_v), (w_o, b_o) = (linear(m) for m in (q, k, v, o))
    return LayerWeights(w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, n_heads)
