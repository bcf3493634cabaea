"""Multi-head attention from scratch, as the textbook writes it (Vaswani et al., 2017, §3.2).

    head_h = softmax(Q_h K_hᵀ / √d_k + mask) V_h,   Q_h = X W_Q^h + b_Q^h  (same for K, V)
    MultiHead(X) = Concat(head_1, …, head_H) W_O + b_O

Plain tensor operations only (no nn.MultiheadAttention, no scaled_dot_product_attention),
in float64, so it can check a real model's layer number by number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One attention layer's parameters in the `X @ W + b` convention, all (d_model, d_model).

    Columns h·d_k … (h+1)·d_k of W_Q, W_K, W_V belong to head h; rows of W_O likewise.
    """

    w_q: torch.Tensor
    b_q: torch.Tensor
    w_k: torch.Tensor
    b_k: torch.Tensor
    w_v: torch.Tensor
    b_v: torch.Tensor
    w_o: torch.Tensor
    b_o: torch.Tensor
    n_heads: int

    def to_cpu(self) -> LayerWeights:
        moved = {name: getattr(self, name).cpu() for name in _MATRICES}
        return LayerWeights(**moved, n_heads=self.n_heads)


_MATRICES = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


@dataclass(frozen=True, eq=False)
class MHAResult:
    """The attention probabilities of every head, the block's output, and each step's shape."""

    probs: torch.Tensor  # (B, H, T, T)
    output: torch.Tensor  # (B, T, d_model), after W_O, before residual and LayerNorm
    shapes: tuple[tuple[str, str, tuple[int, ...]], ...]  # (step, formula, shape)


def multi_head_attention(
    x: torch.Tensor,
    weights: LayerWeights,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
) -> MHAResult:
    """Compute multi-head self-attention of `x` (B, T, d_model) with the formulas above.

    `key_mask` (B, T) is 1 for real tokens and 0 for padding; `causal` stops a query from
    seeing later keys.
    """
    import torch

    x = x.double()
    w = {name: getattr(weights, name).double() for name in _MATRICES}
    batch, length, d_model = x.shape
    n_heads = weights.n_heads
    d_k = d_model // n_heads

    # Which keys each query may see: (B, T_query, T_key).
    allowed = torch.ones(batch, length, length, dtype=torch.bool)
    if key_mask is not None:
        allowed &= key_mask.bool()[:, None, :]
    if causal:
        allowed &= torch.tril(torch.ones(length, length, dtype=torch.bool))

    heads, probs = [], []
    for h in range(n_heads):
        cols = slice(h * d_k, (h + 1) * d_k)
        q = x @ w["w_q"][:, cols] + w["b_q"][cols]  # Q_h: (B, T, d_k)
        k = x @ w["w_k"][:, cols] + w["b_k"][cols]  # K_h: (B, T, d_k)
        v = x @ w["w_v"][:, cols] + w["b_v"][cols]  # V_h: (B, T, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, T, T)
        scores = scores.masked_fill(~allowed, float("-inf"))  # masked keys get no weight
        scores = (
            scores - scores.max(dim=-1, keepdim=True).values
        )  # for exp's sake; softmax unchanged
        p = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)  # softmax over keys: (B, T, T)
        heads.append(p @ v)  # head_h: (B, T, d_k)
        probs.append(p)
    concat = torch.cat(heads, dim=-1)  # Concat(head_1, …, head_H): (B, T, d_model)
    output = concat @ w["w_o"] + w["b_o"]  # (B, T, d_model)

    shapes = (
        ("X", "layer input", tuple(x.shape)),
        ("W_Q^h", "query weights of one head", tuple(w["w_q"][:, cols].shape)),
        ("Q_h", "X W_Q^h + b_Q^h (K_h, V_h alike)", tuple(q.shape)),
        ("scores", "Q_h K_hᵀ / √d_k + mask", tuple(scores.shape)),
        ("head_h", "softmax(scores) V_h", tuple(heads[0].shape)),
        ("concat", "Concat(head_1 … head_H)", tuple(concat.shape)),
        ("output", "concat W_O + b_O", tuple(output.shape)),
    )
    return MHAResult(probs=torch.stack(probs, dim=1), output=output, shapes=shapes)
