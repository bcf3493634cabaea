"""Multi-head attention from scratch, as the textbook writes it (Vaswani et al., 2017, §3.2),
plus the steps today's decoders add.

    head_h = softmax(Q_h K_hᵀ / √d_k + mask) V_h,   Q_h = X W_Q^h + b_Q^h  (same for K, V)
    MultiHead(X) = Concat(head_1, …, head_H) W_O + b_O

Modern decoders (Llama, Mistral, Qwen, Gemma, Phi-3) change four things, each a few lines
below: rotary position embeddings (RoPE) turn Q_h and K_h by angles that grow with the
position; grouped-query attention (GQA) lets several query heads share one key/value head;
d_k (`head_dim`) need not be d_model / H; and some add an RMSNorm on Q_h and K_h (Qwen3), a
sliding window (Mistral, Gemma2), a soft cap on the scores and their own score scale (Gemma2).

Encoders have their own: ModernBERT turns Q_h and K_h by RoPE too, and its local layers let a
query see only the keys within a band of positions on both sides of it (`band`).

Encoder-decoder models (T5, BART, Marian) have three stacks: encoder self-attention, decoder
self-attention (causal) and cross-attention, whose keys and values are made of the
encoder's last hidden states (`source`) while its queries come from the decoder's X. T5
leaves the scores unscaled and adds a learned relative position bias B_h (`RelativeBias`).

Plain tensor operations only (no nn.MultiheadAttention, no scaled_dot_product_attention),
in float64, so it can check a real model's layer number by number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU, a floating-point one in float32 at least; one that is both
    already is returned as it is, not copied."""
    import torch

    if not tensor.is_floating_point():
        return tensor.cpu()
    return tensor.to("cpu", torch.promote_types(tensor.dtype, torch.float32))


@dataclass(frozen=True, eq=False)
class Rope:
    """Rotary position embedding of one head: its first `2 · len(inv_freq)` dimensions turn.

    Dimension pair (i, i + half) turns by the angle position · inv_freq[i], with the
    rotate-half convention of transformers; positions count from 0.
    """

    inv_freq: torch.Tensor  # (rotary_dim / 2,) the frequencies θ_i = base^(−2i / rotary_dim)
    scaling: float = 1.0  # cos and sin are multiplied by it (1 except for YaRN-style scaling)


@dataclass(frozen=True, eq=False)
class RelativeBias:
    """T5's relative position bias (Raffel et al., 2020, §2.1): one learned number per head
    and bucket of the distance j − i from query i to key j, added to the scores.

    The first layer of a stack holds the table, the stack's other layers reuse it; the
    encoder's buckets tell both directions apart, the decoder's (causal) only look back.
    """

    table: torch.Tensor  # (num_buckets, H): the bias of each bucket for each head
    bidirectional: bool
    max_distance: int  # distances from here on share the last bucket


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One attention layer's parameters in the `X @ W + b` convention.

    W_Q is (d_model, H·d_k): columns h·d_k … (h+1)·d_k belong to query head h. W_K and W_V are
    (d_model, H_kv·d_k), one block of columns per key/value head; W_O is (H·d_k, d_model).
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
    n_kv_heads: int | None = None  # None: as many as query heads (no grouping)
    rope: Rope | None = None
    q_norm: torch.Tensor | None = None  # (d_k,) RMSNorm weight on each Q_h (Qwen3)
    k_norm: torch.Tensor | None = None  # (d_k,) and on each K_h
    norm_eps: float = 1e-6
    scale: float | None = None  # the scores' factor; None: 1 / √d_k
    softcap: float | None = None  # scores → softcap · tanh(scores / softcap) (Gemma2)
    window: int | None = None  # a query sees only the last `window` keys (sliding window)
    # a query sees only the keys at most `band` positions before or after it (ModernBERT's
    # local layers: an encoder's sliding window, ±local_attention / 2)
    band: int | None = None
    relative: RelativeBias | None = None  # T5: a bias on the scores by relative position

    @property
    def d_k(self) -> int:
        return self.w_q.shape[1] // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    def to_cpu(self) -> LayerWeights:
        """The same weights on the CPU, in float32 at least (a half-precision model's upcast):
        what the recompute, the measures and the inside view compute with."""
        moved = {
            f.name: on_cpu(getattr(self, f.name))
            for f in fields(self)
            if hasattr(getattr(self, f.name), "cpu")
        }
        if self.rope is not None:
            moved["rope"] = replace(self.rope, inv_freq=on_cpu(self.rope.inv_freq))
        if self.relative is not None:
            moved["relative"] = replace(self.relative, table=on_cpu(self.relative.table))
        return replace(self, **moved)

    def double(self) -> LayerWeights:
        """The same weights in float64, what the formulas below compute in."""
        doubled = {
            f.name: getattr(self, f.name).double()
            for f in fields(self)
            if hasattr(getattr(self, f.name), "double")
        }
        if self.relative is not None:
            doubled["relative"] = replace(self.relative, table=self.relative.table.double())
        return replace(self, **doubled)


@dataclass(frozen=True, eq=False)
class HeadSteps:
    """One head's computation, step by step (each (B, T, d_k), (B, S, d_k) or (B, T, S): T
    queries, S keys; S = T in self-attention)."""

    q: torch.Tensor  # Q_h, after RoPE (and norm) where the model has them
    k: torch.Tensor  # K_h of the key/value head this query head uses
    v: torch.Tensor  # V_h
    scores: torch.Tensor  # scaled (and capped, and biased) scores, masked keys at −inf
    probs: torch.Tensor  # softmax over keys
    output: torch.Tensor  # head_h = probs V_h


@dataclass(frozen=True, eq=False)
class MHAResult:
    """The attention probabilities of every head, the block's output, and each step's shape."""

    probs: torch.Tensor  # (B, H, T, S)
    output: torch.Tensor  # (B, T, d_model), after W_O, before residual and LayerNorm
    shapes: tuple[tuple[str, str, tuple[int, ...]], ...]  # (step, formula, shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / √(mean(x²) + eps) · weight, over the last dimension."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt() * weight


def rope_angles(rope: Rope, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position · θ_i for positions 0 … length−1: each (T, rotary_dim).

    The angles are rounded to float32 as the model rounds them: at position 2,000 float32
    angles are off by up to 1e-4 rad, enough to move a sharp head's probabilities by more
    than 1e-5. Everything after is float64.
    """
    import torch

    positions = torch.arange(length, dtype=torch.float32)
    angles = (positions[:, None] * rope.inv_freq.float()[None, :]).double()  # (T, rotary_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # the same angle for dims i and i + half
    return angles.cos() * rope.scaling, angles.sin() * rope.scaling


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x_i, x_{i+half}) of x's first rotary_dim dims by its angle (RoPE).

    x (B, T, d_k); cos, sin (T, rotary_dim). Dimensions past rotary_dim pass unchanged.
    """
    import torch

    turned, passed = x[..., : cos.shape[-1]], x[..., cos.shape[-1] :]
    first, second = turned.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)  # (x_i, x_j) → (−x_j, x_i)
    return torch.cat([turned * cos + rotated_half * sin, passed], dim=-1)


def relative_bucket(
    distance: torch.Tensor, bidirectional: bool, n_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucket of each distance d = j − i from query i to key j (an integer tensor).

    Bidirectional (the encoder): keys after the query (d > 0) take the upper half of the n
    buckets, so n := n / 2 for each side, and r = |d|. Causal (the decoder): only keys at or
    before the query are seen, r = max(−d, 0). Then, with e = n / 2 buckets of one distance
    each and the rest logarithmically wider up to max_distance:

        bucket(r) = r                                                        if r < e
        bucket(r) = min(n − 1, e + ⌊ln(r / e) / ln(max_distance / e) · (n − e)⌋)   otherwise

    The logarithm is taken in float32, as the model takes it, so that a distance on a
    bucket's edge lands on the side the model puts it.
    """
    import torch

    upper = torch.zeros_like(distance)
    if bidirectional:
        n_buckets //= 2
        upper = (distance > 0).long() * n_buckets  # keys after the query: the upper half
        r = distance.abs()
    else:
        r = (-distance).clamp(min=0)  # keys after the query share bucket 0 (masked anyway)
    exact = n_buckets // 2
    log_ratio = torch.log(r.float() / exact) / math.log(max_distance / exact)  # float32
    far = (exact + (log_ratio * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return upper + torch.where(r < exact, r, far)


def relative_bias(
    relative: RelativeBias, n_queries: int, n_keys: int, start: int = 0
) -> torch.Tensor:
    """B_h[i, j] = table[bucket(j − i), h] for every head h: (H, T, S); the queries are
    positions start … start + n_queries − 1."""
    import torch

    queries = torch.arange(start, start + n_queries)
    distance = torch.arange(n_keys)[None, :] - queries[:, None]  # (T, S): j − i
    n_buckets = relative.table.shape[0]
    buckets = relative_bucket(distance, relative.bidirectional, n_buckets, relative.max_distance)
    return relative.table[buckets].permute(2, 0, 1)  # (T, S, H) → (H, T, S)


def attention_head(
    x: torch.Tensor,
    w: LayerWeights,
    h: int,
    allowed: torch.Tensor,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
    source: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> HeadSteps:
    """Head h of `x` (B, T, d_model), in float64: which keys each query may see is
    `allowed` (B, T, S); `angles` are RoPE's cos and sin (from `rope_angles`); `source`
    (B, S, d_model) is what keys and values are made of where that is not X (cross-attention:
    the encoder's last hidden states); `bias` (T, S) is head h's B_h (T5, `relative_bias`)."""
    kv_input = x if source is None else source  # self-attention: X; cross-attention: source
    k, v = head_keys(kv_input, w, h // (w.n_heads // w.kv_heads), angles)
    return head_rows(x, k, v, w, h, allowed, angles, bias)


def head_keys(
    kv_input: torch.Tensor,
    w: LayerWeights,
    g: int,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K_g and V_g of key/value head g (GQA: query head h uses g = h // (H / H_kv)), each
    (B, S, d_k), from what the keys are made of, `kv_input` (B, S, d_model)."""
    kv_cols = slice(g * w.d_k, (g + 1) * w.d_k)
    k = kv_input @ w.w_k[:, kv_cols] + w.b_k[kv_cols]  # K_h = X W_K^h + b: (B, S, d_k)
    v = kv_input @ w.w_v[:, kv_cols] + w.b_v[kv_cols]  # V_h: (B, S, d_k)
    if w.q_norm is not None:  # RMSNorm over each head's d_k dims, before RoPE
        k = rms_norm(k, w.k_norm, w.norm_eps)
    if angles is not None:  # RoPE: K_h turned by its keys' positions
        k = rotate(k, *angles)
    return k, v


def head_rows(
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: LayerWeights,
    h: int,
    allowed: torch.Tensor,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
    bias: torch.Tensor | None = None,
) -> HeadSteps:
    """Head h's rows for the queries `x` (B, T, d_model: every query, or a block of them)
    over its key/value head's K_h and V_h (`head_keys`): `allowed`, `angles` and `bias` are
    those queries' (B, T, S), (T, rotary_dim) and (T, S)."""
    q_cols = slice(h * w.d_k, (h + 1) * w.d_k)
    q = x @ w.w_q[:, q_cols] + w.b_q[q_cols]  # Q_h = X W_Q^h + b: (B, T, d_k)
    if w.q_norm is not None:  # RMSNorm over each head's d_k dims, before RoPE
        q = rms_norm(q, w.q_norm, w.norm_eps)
    if angles is not None:  # RoPE: Q_h turned by its queries' positions
        q = rotate(q, *angles)
    scale = w.scale if w.scale is not None else 1 / math.sqrt(w.d_k)
    scores = q @ k.transpose(-2, -1) * scale  # Q_h K_hᵀ / √d_k (T5: unscaled): (B, T, S)
    if w.softcap is not None:  # Gemma2 squashes the scores into (−cap, cap)
        scores = w.softcap * (scores / w.softcap).tanh()
    if bias is not None:  # T5: + B_h, by each key's distance from the query
        scores = scores + bias
    scores = scores.masked_fill(~allowed, float("-inf"))  # masked keys get no weight
    exps = (scores - scores.max(dim=-1, keepdim=True).values).exp()  # shifted: same softmax
    probs = exps / exps.sum(dim=-1, keepdim=True)  # softmax over keys
    return HeadSteps(q, k, v, scores, probs, probs @ v)  # head_h = probs V_h: (B, T, d_k)


def visible_keys(
    batch: int,
    length: int,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    n_keys: int | None = None,
    start: int = 0,
    band: int | None = None,
) -> torch.Tensor:
    """Which keys each query may see, (B, T_query, T_key): not padding, not later keys when
    causal, only the last `window` keys (the query's own included) with a sliding window, and
    only the keys at most `band` positions away on either side with a band (an encoder's
    local layer). `n_keys` is T_key where the keys are not the queries (cross-attention's
    source); the queries are positions start … start + length − 1 (a block of rows)."""
    import torch

    allowed = torch.ones(batch, length, n_keys or length, dtype=torch.bool)
    if key_mask is not None:
        allowed &= key_mask.bool()[:, None, :]
    query = torch.arange(start, start + length)[:, None]
    key = torch.arange(n_keys or length)[None, :]
    if causal:
        allowed &= key <= query
    if window is not None:
        allowed &= key > query - window
    if band is not None:  # |j − i| ≤ band: keys before and after the query alike
        allowed &= (key - query).abs() <= band
    return allowed


def multi_head_attention(
    x: torch.Tensor,
    weights: LayerWeights,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
    source: torch.Tensor | None = None,
) -> MHAResult:
    """Compute multi-head attention of `x` (B, T, d_model) with the formulas above.

    `key_mask` (B, S) is 1 for real keys and 0 for padding; `causal` stops a query from
    seeing later keys. Keys and values are made of `x` (self-attention, S = T) or of
    `source` (B, S, d_model): cross-attention's encoder states.
    """
    import torch

    x = x.double()
    source = source.double() if source is not None else None
    w = weights.double()
    batch, length, _ = x.shape
    n_keys = length if source is None else source.shape[1]
    allowed = visible_keys(batch, length, key_mask, causal, w.window, n_keys, band=w.band)
    angles = rope_angles(w.rope, length) if w.rope is not None else None
    bias = relative_bias(w.relative, length, n_keys) if w.relative is not None else None

    steps = [
        attention_head(x, w, h, allowed, angles, source, None if bias is None else bias[h])
        for h in range(w.n_heads)
    ]
    concat = torch.cat([s.output for s in steps], dim=-1)  # Concat(head_1 … head_H): (B, T, H·d_k)
    output = concat @ w.w_o + w.b_o  # (B, T, d_model)
    return MHAResult(
        probs=torch.stack([s.probs for s in steps], dim=1),
        output=output,
        shapes=_shapes(x, source, w, steps[0], bias, concat, output),
    )


def _shapes(x, source, w, first, bias, concat, output) -> tuple:
    """(step, formula, shape) of each step, as `check` prints them; the optional steps only
    where the layer has them."""
    steps = [("X", "layer input", tuple(x.shape))]
    if source is not None:
        steps.append(("source", "encoder's last hidden states", tuple(source.shape)))
    steps.append(("W_Q^h", "query weights of one head", tuple(w.w_q[:, : w.d_k].shape)))
    steps.append(("Q_h", "X W_Q^h + b_Q^h (K_h, V_h alike)", tuple(first.q.shape)))
    if source is not None:
        steps.append(("K_h, V_h", "source W_K^h + b_K^h (V_h alike)", tuple(first.k.shape)))
    elif w.kv_heads != w.n_heads:
        groups = w.n_heads // w.kv_heads
        steps.append(("K_h, V_h", f"one per {groups} query heads (GQA)", tuple(first.k.shape)))
    if w.rope is not None:
        turned = 2 * w.rope.inv_freq.shape[0]  # partial RoPE: the other dims pass unturned
        some = f" (their first {turned} of {w.d_k} dims)" if turned < w.d_k else ""
        steps.append(("RoPE", f"Q_h, K_h turned by position{some}", tuple(first.q.shape)))
    scores = "Q_h K_hᵀ" if w.scale == 1 else "Q_h K_hᵀ / √d_k"  # T5 leaves them unscaled
    if bias is not None:
        steps.append(
            ("B_h", "table[bucket(j − i), h]: relative position bias", tuple(bias.shape[1:]))
        )
        scores += " + B_h"
    return (
        *steps,
        ("scores", f"{scores} + mask", tuple(first.scores.shape)),
        ("head_h", "softmax(scores) V_h", tuple(first.output.shape)),
        ("concat", "Concat(head_1 … head_H)", tuple(concat.shape)),
        ("output", "concat W_O + b_O", tuple(output.shape)),
    )


class RowBlocks:
    """One self-attention layer from scratch a block of query rows at a time, for a text
    whose maps are too large to hold (`check` of a long text): K_h and V_h are made once,
    each block's probabilities from its own Q_h, and every head's output rows are kept
    (B, T, H·d_k) for the layer's output at the end. No (B, H, T, S) map is ever made."""

    def __init__(self, x: torch.Tensor, weights: LayerWeights,
                 key_mask: torch.Tensor | None = None, causal: bool = False) -> None:  # fmt: skip
        import torch

        self.x, self.w = x.double(), weights.double()
        self.key_mask, self.causal = key_mask, causal
        batch, length, _ = self.x.shape
        self.angles = rope_angles(self.w.rope, length) if self.w.rope is not None else None
        self.keys = [head_keys(self.x, self.w, g, self.angles) for g in range(self.w.kv_heads)]
        self.heads = torch.zeros(batch, length, self.w.n_heads * self.w.d_k, dtype=torch.float64)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Every head's probabilities of queries start … stop−1, (B, H, b, S), their heads'
        outputs kept."""
        import torch

        w, batch, length = self.w, self.x.shape[0], self.x.shape[1]
        allowed = visible_keys(batch, stop - start, self.key_mask, self.causal, w.window,
                               length, start, w.band)  # fmt: skip
        angles = None
        if self.angles is not None:
            angles = (self.angles[0][start:stop], self.angles[1][start:stop])
        bias = relative_bias(w.relative, stop - start, length, start) if w.relative else None
        group = w.n_heads // w.kv_heads
        steps = [
            head_rows(
                self.x[:, start:stop],
                *self.keys[h // group],
                w,
                h,
                allowed,
                angles,
                None if bias is None else bias[h],
            )  # fmt: skip
            for h in range(w.n_heads)
        ]
        self.heads[:, start:stop] = torch.cat([s.output for s in steps], dim=-1)
        return torch.stack([s.probs for s in steps], dim=1)  # (B, H, b, S)

    def output(self) -> torch.Tensor:
        """The layer's output, Concat(head_1 … head_H) W_O + b_O: (B, T, d_model), once every
        block's rows were made."""
        return self.heads @ self.w.w_o + self.w.b_o

    def shapes(self) -> tuple:
        """(step, formula, shape) of each step over the whole text, as `check` prints them
        (made of shapes alone: nothing of that size is computed)."""
        import torch

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, device="meta")

        w, (batch, length, _) = self.w, self.x.shape
        d_k = w.d_k
        first = HeadSteps(empty(batch, length, d_k), empty(batch, length, d_k),
                          empty(batch, length, d_k), empty(batch, length, length),
                          empty(batch, length, length), empty(batch, length, d_k))  # fmt: skip
        bias = empty(w.n_heads, length, length) if w.relative is not None else None
        concat, output = self.heads, empty(batch, length, w.w_o.shape[1])
        return _shapes(self.x, None, w, first, bias, concat, output)
