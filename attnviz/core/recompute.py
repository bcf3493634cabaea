"""Attention probabilities recomputed from a layer's captured input X, in blocks of query rows.

The model runs its fast attention (SDPA), which keeps no probabilities. For each layer a
caller wants, `capture` hands X (and, in cross-attention, the encoder's states) here, and
the probabilities come back a block of query rows at a time (FlashAttention's tiling,
kvpress's `compute_window_attention`): the full (B, H, T, S) matrix of a layer exists only
if a caller asks for it, and L × H × T × T never does.

The formulas are those of `attnviz.core.mha` (which `check` proves against the model's own
eager attention, layer by layer), computed for all heads at once and in float32 rather than
one head at a time in float64: Q and K per head (biases, Qwen3's per-head RMSNorm, RoPE at
positions 0 … T−1), grouped-query sharing, the model's score scale, Gemma2's soft cap, T5's
relative bias, the causal, padding and sliding-window masks, softmax over keys. Half
precision inputs are upcast to float32 before Q and K are formed, so their product and the
softmax are float32 whatever the model runs in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attnviz.core.mha import relative_bias, rms_norm, rope_angles, rotate, visible_keys

if TYPE_CHECKING:
    import torch

    from attnviz.core.mha import LayerWeights

# Rows per block: 256 rows of 9 heads over 8,192 keys are 75 MB of float32.
BLOCK_ROWS = 256
# A block as wide as PANEL_WIDTH keys has its scores multiplied PANEL_ROWS query rows at a time.
PANEL_WIDTH, PANEL_ROWS = 2048, 48


@dataclass(frozen=True, eq=False)
class Projected:
    """One layer's queries and keys, every head, ready for blocks of rows."""

    q: torch.Tensor  # (B, H_kv, G, T, d_k), times the score scale: head g·G + j at [:, g, j]
    k: torch.Tensor  # (B, H_kv, 1, S, d_k)
    weights: LayerWeights
    key_mask: torch.Tensor | None  # (B, S) 1 for real keys
    causal: bool

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, T, S): the shape of the layer's whole probability matrix."""
        batch, kv_heads, groups, length, _ = self.q.shape
        return batch, kv_heads * groups, length, self.k.shape[3]


def project(
    x: torch.Tensor,
    weights: LayerWeights,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
    source: torch.Tensor | None = None,
) -> Projected:
    """Q_h and K_h of every head from X (B, T, d_model), in float32; keys from `source`
    (B, S, d_model) where they are not made of X (cross-attention)."""
    import torch

    w = weights
    x = x.float()
    kv_input = x if source is None else source.float()
    batch, length, _ = x.shape
    d_k, kv_heads = w.d_k, w.kv_heads
    groups = w.n_heads // kv_heads
    q = x @ w.w_q.float() + w.b_q.float()  # (B, T, H·d_k)
    k = kv_input @ w.w_k.float() + w.b_k.float()  # (B, S, H_kv·d_k)
    q = q.view(batch, length, w.n_heads, d_k).transpose(1, 2)  # (B, H, T, d_k)
    k = k.view(batch, -1, kv_heads, d_k).transpose(1, 2)  # (B, H_kv, S, d_k)
    if w.q_norm is not None:  # Qwen3: RMSNorm over each head's d_k dims, before RoPE
        q = rms_norm(q, w.q_norm.float(), w.norm_eps)
        k = rms_norm(k, w.k_norm.float(), w.norm_eps)
    if w.rope is not None:  # RoPE: turn Q_h and K_h by their positions' angles
        cos, sin = (angle.float() for angle in rope_angles(w.rope, max(length, k.shape[2])))
        q = rotate(q, cos[:length], sin[:length])
        k = rotate(k, cos[: k.shape[2]], sin[: k.shape[2]])
    scale = w.scale if w.scale is not None else 1 / math.sqrt(w.d_k)
    q = q.reshape(batch, kv_heads, groups, length, d_k) * scale  # (B, H_kv, G, T, d_k)
    k = k[:, :, None]  # (B, H_kv, 1, S, d_k): one key head serves its G query heads
    mask = key_mask.to(torch.bool) if key_mask is not None else None
    if mask is not None and bool(mask.all()):  # no padding: every key is real
        mask = None
    return Projected(q.contiguous(), k.contiguous(), w, mask, causal)


def one_head(weights: LayerWeights, head: int) -> LayerWeights:
    """Query head `head`'s share of a layer's weights, as a layer of one head: its columns of
    W_Q, its key/value head's of W_K and W_V, its rows of W_O (and its column of T5's bias
    table), so that `project` and `probability_rows` compute that head alone, H times fewer
    products than the whole layer, with the same formulas."""
    w = weights
    d_k, group = w.d_k, w.n_heads // w.kv_heads
    q = slice(head * d_k, (head + 1) * d_k)  # query head h's columns
    kv = slice((head // group) * d_k, (head // group + 1) * d_k)  # its shared key/value head's
    relative = w.relative
    if relative is not None:  # table: (buckets, H) -> (buckets, 1)
        relative = replace(relative, table=relative.table[:, head : head + 1])
    return replace(
        w,
        w_q=w.w_q[:, q], b_q=w.b_q[q], w_k=w.w_k[:, kv], b_k=w.b_k[kv],
        w_v=w.w_v[:, kv], b_v=w.b_v[kv], w_o=w.w_o[q], n_heads=1, n_kv_heads=1,
        relative=relative,
    )  # fmt: skip


def probability_rows(layer: Projected, start: int, stop: int) -> torch.Tensor:
    """The probabilities of query rows start … start+b−1 of every head, (B, H, rows, W),
    float32; each real row sums to 1 (a row that sees no key is all 0). W is S, or for a
    causal layer with no padding and no window `stop`: the keys after the block's last
    query would all be 0, and are not computed."""
    return _rows(layer, start, stop, entropy=False)[0]


def rows_and_entropy(layer: Projected, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`probability_rows`, and each row's entropy −Σ_k p_k ln p_k in nats, (B, H, rows)
    float32, taken from the softmax's own terms: with s_k the row's scores less their
    maximum and Z = Σ_k e^{s_k}, the entropy is ln Z − Σ_k e^{s_k} s_k / Z (two sums of
    non-negative terms, so no cancellation), one product over the row instead of a
    logarithm of every probability."""
    return _rows(layer, start, stop, entropy=True)  # type: ignore[return-value]


def _rows(layer: Projected, start: int, stop: int, entropy: bool) -> tuple[Any, Any]:
    import torch

    w = layer.weights
    batch, n_heads, _, n_keys = layer.shape
    trimmed = layer.causal and layer.key_mask is None and w.window is None and w.relative is None
    width = min(stop, n_keys) if trimmed else n_keys
    scores = _scores(layer, start, stop, width).view(batch, n_heads, stop - start, width)
    if w.softcap is not None:  # Gemma2 squashes the scores into (−cap, cap)
        scores = w.softcap * torch.tanh(scores / w.softcap)
    if w.relative is not None:  # T5: + B_h by each key's distance from the query
        relative = replace(w.relative, table=w.relative.table.float())
        scores = scores + relative_bias(relative, stop - start, n_keys, start)
    # Hidden keys get the lowest finite score, not −inf: e^s is 0 for them all the same,
    # and s · e^s stays 0 (the entropy's sum) where −inf · 0 would be NaN.
    hidden = torch.finfo(scores.dtype).min
    empty = None
    if trimmed:  # every row sees key 0: only the causal mask, within the block's own keys
        later = torch.ones(stop - start, width - start, dtype=torch.bool).triu_(1)  # k > i
        scores[..., start:width].masked_fill_(later, hidden)
    else:
        allowed = visible_keys(
            batch, stop - start, layer.key_mask, layer.causal, w.window, n_keys, start
        )  # (B, rows, S)
        scores.masked_fill_(~allowed[:, None], hidden)
        seen = allowed.any(dim=-1)  # (B, rows): a row of padding sees no key
        empty = None if bool(seen.all()) else ~seen
    if entropy:
        scores.sub_(scores.amax(dim=-1, keepdim=True))  # s ≤ 0, the largest 0
        probs = torch.exp(scores)
        total = probs.sum(dim=-1)  # Z ≥ 1
        found = torch.log(total) - scores.mul_(probs).sum(dim=-1) / total  # the scores spent
        probs.div_(total[..., None])
    else:
        probs, found = torch.softmax(scores, dim=-1), None
    if empty is not None:  # a row with no visible key is 0, not a uniform row
        probs.masked_fill_(empty[:, None, :, None], 0.0)
        if found is not None:
            found.masked_fill_(empty[:, None, :], 0.0)
    return probs, found


def _scores(layer: Projected, start: int, stop: int, width: int) -> torch.Tensor:
    """Q·Kᵀ of query rows start … stop−1 and the first `width` keys, (B, H_kv, G·rows, W): a
    key head's G query heads as one product (B, H_kv, G·rows, d_k) (a small copy) by its keys,
    not the keys broadcast to every query head (a copy of them each block).

    Long rows are multiplied a panel of PANEL_ROWS query rows at a time, each written
    straight into the block: at 8,085 tokens one layer's products took 0.46 s as batched
    products of 513 rows, 0.32 s in panels of 48 (SmolLM2's 3 key heads, 2 CPU cores)."""
    import torch

    batch, kv_heads = layer.q.shape[:2]
    q = layer.q[:, :, :, start:stop].reshape(batch, kv_heads, -1, layer.q.shape[-1])  # scaled
    keys = layer.k[:, :, 0, :width]  # (B, H_kv, W, d_k)
    if width < PANEL_WIDTH:
        return q @ keys.transpose(-2, -1)
    scores = torch.empty(*q.shape[:3], width)
    for b in range(batch):
        for h in range(kv_heads):
            by_key = keys[b, h].t()
            for first in range(0, q.shape[2], PANEL_ROWS):
                rows = slice(first, first + PANEL_ROWS)
                torch.mm(q[b, h, rows], by_key, out=scores[b, h, rows])
    return scores


def blocks(
    layer: Projected, block_rows: int = BLOCK_ROWS, entropy: bool = False
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor | None]]:
    """(start, probabilities of rows start … start+block_rows−1, their entropies where
    `entropy` asks for them, else None) over the layer's queries."""
    if block_rows < 1:
        raise ValueError(f"block_rows must be at least 1, not {block_rows}")
    length = layer.shape[2]
    for start in range(0, length, block_rows):
        stop = min(start + block_rows, length)
        if entropy:
            yield start, *rows_and_entropy(layer, start, stop)
        else:
            yield start, probability_rows(layer, start, stop), None
