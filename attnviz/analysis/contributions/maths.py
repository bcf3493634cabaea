"""The maths of the contribution measures, pure functions over tensors (see the package's
docstring for the definitions): each head's value vectors and their lengths, rollout's and
ALTI's layer steps, the mixing ratios (Kobayashi et al. 2021), the special shares by norm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


# ALTI works through this many (query, key, d_model) floats at a time.
BLOCK_FLOATS = 2**22


def value_heads(x: torch.Tensor, weights: Any) -> torch.Tensor:
    """v^h_j = x_j W_V^h + b_V^h for every query head: (B, T, H, d_k) from x (B, T, d_model)
    and a layer's `mha.LayerWeights` (query head h reads value head h // group)."""
    d_k, group = weights.d_k, weights.n_heads // weights.kv_heads
    v = x.to(weights.w_v.dtype) @ weights.w_v + weights.b_v  # every value head: (B, T, H_kv·d_k)
    return v.unflatten(-1, (weights.kv_heads, d_k)).repeat_interleave(group, dim=-2)


def head_lengths(heads: torch.Tensor, w_o: torch.Tensor) -> torch.Tensor:
    """‖v^h_j W_O^h‖, (B, H, T), of each head's values `heads` (B, T, H, d) and output
    projection `w_o` (H, d, d_model), without the (B, H, T, d_model) vectors: W_O^hᵀ = Q R
    (its QR factors, in float64), so v W_O^h = v Rᵀ Qᵀ, whose length is ‖v Rᵀ‖ (Q's columns
    are orthonormal): d × d products, not d × d_model."""
    import torch

    r = torch.linalg.qr(w_o.double().transpose(-2, -1), mode="r").R  # (H, min(d, d_model), d)
    found = torch.einsum("bthk,hjk->bhtj", heads.float(), r.float())
    return torch.linalg.vector_norm(found, dim=-1)


def rollout_layer(
    probs: torch.Tensor, fusion: str = "mean", discard: float = 0.0, lengths: Any = None
) -> torch.Tensor:
    """Ã = (heads fused + I), rows renormalised: (B, T, T) from (B, H, T, T).

    With vit-explain's options (jacobgil/vit-explain): `fusion` is the mean, max or min over
    heads; `discard` the share of each map's entries set to 0 before I is added, the lowest
    of the fused map's n × n (n: each batch row's length in `lengths`, else T), the first
    token's own entry (CLS to CLS) never. With the mean and nothing discarded this is
    Abnar & Zuidema's (mean_h α + I) renormalised."""
    import torch

    fused = {"mean": probs.mean, "max": probs.amax, "min": probs.amin}[fusion](dim=1)
    if discard > 0:
        fused = fused.clone()
        for row in range(fused.shape[0]):
            n = fused.shape[-1] if lengths is None else int(lengths[row])
            flat = fused[row, :n, :n].reshape(-1)  # a copy: written back below
            lowest = flat.topk(int(flat.numel() * discard), largest=False).indices
            flat[lowest[lowest != 0]] = 0
            fused[row, :n, :n] = flat.view(n, n)
    mixed = fused + torch.eye(probs.shape[-1], dtype=probs.dtype)
    return mixed / mixed.sum(dim=-1, keepdim=True)


@dataclass(frozen=True, eq=False)
class AltiLayer:
    """One layer's ALTI contributions (`alti_layer`) and the mixing ratios of its queries
    (`mixing_ratios`)."""

    contributions: torch.Tensor  # (B, T, T), rows sum to 1
    ratios: tuple[torch.Tensor, ...]  # (B, T) each, in the order of MIXING


def _linearised(
    vectors: torch.Tensor, residual: torch.Tensor, output: torch.Tensor, norm: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """G and ρ_i (see `alti_layer`): `vectors` (..., d) and the residual (B, T, d) through the
    normalisation after the block, up to each query's scale. It is linear in f, so `vectors`
    may be the value vectors f^h_j or the rows of W_O (f^h_j = v^h_j W_O^h)."""
    dtype = vectors.dtype
    residual = residual.to(dtype)
    shifted, rho = vectors, residual  # G and ρ
    if norm is not None:
        gain = norm.gain.to(dtype)
        if norm.centre:
            shifted = shifted - shifted.mean(dim=-1, keepdim=True)
            rho = rho - rho.mean(dim=-1, keepdim=True) if norm.covers_residual else rho
        shifted = gain * shifted
        if norm.covers_residual:
            rho = gain * rho
        else:  # Gemma2: t'_ij s(u_i) = g ⊙ Σ_h α f + [i = j] s(u_i) r_i
            rho = rho * norm.scale(output.to(dtype))
    return shifted, rho


def alti_layer(
    probs: torch.Tensor,
    values: torch.Tensor,
    residual: torch.Tensor,
    output: torch.Tensor,
    norm: Any,
) -> torch.Tensor:
    """ALTI's contributions of one layer (see the module's docstring), (B, T, T), from probs
    (B, H, T, T), value vectors (B, H, T, d), the residual stream r (B, T, d), the block's
    output after W_O (B, T, d) and the normalisation after the block (`families.Norm`, or
    None).

    The normalisation is linear in t once its divisor s(u_i) is fixed, so it is applied to the
    value vectors and the residual once, not to every (i, j) pair: a LayerNorm's centring and
    gain go into G^h_j = γ ⊙ (f^h(x_j) − mean) and ρ_i = γ ⊙ (r_i − mean). What is left, the
    division of row i by s(u_i), scales every t'_ij of that row alike, and c_ij's rows are
    normalised, so it changes nothing (Gemma2, whose residual is added after the norm, gets
    ρ_i = s(u_i) r_i instead: the same row scaling, undone).
    """
    import torch

    batch, _, length, d = values.shape
    shifted, rho = _linearised(values, residual, output, norm)
    step = max(1, BLOCK_FLOATS // max(1, length * d))
    contributions = torch.zeros(batch, length, length, dtype=values.dtype)
    for b in range(batch):
        by_key = shifted[b].transpose(0, 1)  # (T, H, d)
        for start in range(0, length, step):
            rows = torch.arange(start, min(start + step, length))
            n = len(rows)
            # contiguous: a batched product over a permuted view is hundreds of times slower
            weights = probs[b, :, rows].permute(2, 1, 0).contiguous()  # (T_key, n, H)
            t = torch.bmm(weights, by_key)  # t'_ij up to row i's scale: (T_key, n, d)
            t[rows, torch.arange(n)] += rho[b, rows]  # + [i = j] ρ_i
            y = t.sum(dim=0)  # y_i = Σ_j t'_ij: (n, d)
            distance = (t - y[None]).abs().sum(dim=-1)  # ‖y_i − t'_ij‖₁: (T_key, n)
            c = (y.abs().sum(dim=-1)[None] - distance).clamp(min=0).T  # (n, T)
            contributions[b, rows] = c / c.sum(dim=-1, keepdim=True).clamp(min=1e-30)
    return contributions


@dataclass(frozen=True, eq=False)
class Mixed:
    """What a layer's mixing ratios need of its vectors (float32): each key's f^h_j and G^h_j
    (the same through the normalisation after the block, linearised: `_linearised`), and
    each token's residual r_i and ρ_i (the residual through that normalisation)."""

    raw: torch.Tensor  # f^h_j: (B, T, H, d)
    linearised: torch.Tensor  # G^h_j: (B, T, H, d)
    residual: torch.Tensor  # r_i: (B, T, d)
    rho: torch.Tensor  # ρ_i: (B, T, d)

    def lengths(self) -> torch.Tensor:
        """‖f^h(x_j)‖: (B, H, T)."""
        return self.raw.norm(dim=-1).transpose(1, 2)


def mixed(
    v: torch.Tensor, w_o: torch.Tensor, residual: torch.Tensor, output: torch.Tensor, norm: Any
) -> Mixed:
    """A layer's `Mixed` from each head's values v (B, T, H, d_k) and W_O^h (H, d_k, d)
    (`Values.heads`), its residual stream, output after W_O (B, T, d each) and the
    normalisation after the block (or None). G^h_j is v^h_j times W_O^h through the
    normalisation, so no (B, H, T, d) vectors are shifted."""
    import torch

    g_o, rho = _linearised(w_o, residual.float(), output.float(), norm)
    f = torch.einsum("bthk,hkd->bthd", v, w_o)  # f^h_j: (B, T, H, d)
    g = torch.einsum("bthk,hkd->bthd", v, g_o)  # G^h_j
    return Mixed(f, g, residual.float(), rho.float())


# report's names of the mixing ratios, in `mixing_ratios`' order: Kobayashi et al. (2021)'s
# Attn-W, Attn-N, AttnRes-N and AttnResLn-N
MIXING = ("weights", "norm", "norm_residual", "norm_residual_layernorm")


def mixing_ratios(probs: torch.Tensor, found: Mixed) -> tuple[torch.Tensor, ...]:
    """One layer's mixing ratios for each query, (B, T) each, in the order of MIXING
    (`mixing_rows`), from probs (B, H, T, T) and the layer's `mixed` vectors. Query rows go
    a few at a time, each (B, H, rows, T) product within BLOCK_FLOATS."""
    import torch

    batch, n_heads, length, _ = probs.shape
    step = max(1, BLOCK_FLOATS // max(1, batch * n_heads * length))
    parts = [mixing_rows(probs[:, :, start : start + step], start, found)
             for start in range(0, length, step)]  # fmt: skip
    return tuple(torch.cat(found, dim=1) for found in zip(*parts))


def mixing_rows(rows: torch.Tensor, start: int, found: Mixed) -> tuple[torch.Tensor, ...]:
    """The mixing ratios of query rows start … start+b−1, (B, b) each, from their
    probabilities (B, H, b, W) (a decoder's block stops at its last query's key: W ≤ T), as
    Kobayashi et al. (2021, §5) define them: the length of the sum of what the other tokens
    pass on to token i, against that and what i passes on to itself,

        r_i = ‖Σ_{j≠i} v_ij‖ / (‖Σ_{j≠i} v_ij‖ + ‖v_ii‖),

    with v_ij = Σ_h α^h_ij f^h(x_j) (Attn-N); the residual r_i added to v_ii (AttnRes-N);
    each vector through the normalisation after the block, linearised, ρ_i added to the own
    one (AttnResLn-N: G for f; the division by s(u_i) scales the row alike, and cancels).
    Attn-W is 1 − mean_h α^h_ii. Σ_j v_ij is the heads' output for query i through W_O, so
    no (T, T, d) tensor is made."""
    import torch

    p = rows.double()
    width, queries = p.shape[-1], slice(start, start + p.shape[2])
    own_weight = p.diagonal(offset=start, dim1=-2, dim2=-1)  # α^h_ii: (B, H, b)

    def split(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ_{j≠i} v_ij, v_ii) of each query: (B, b, d) each, from vectors (B, T, H, d)."""
        every = torch.einsum("bhqk,bkhd->bqd", p, vectors[:, :width].double())
        own = torch.einsum("bhq,bqhd->bqd", own_weight, vectors[:, queries].double())
        return every - own, own

    def ratio(others: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        apart, alone = others.norm(dim=-1), own.norm(dim=-1)
        return apart / (apart + alone).clamp(min=1e-30)

    others, own = split(found.raw)
    others_ln, own_ln = split(found.linearised)
    return (
        1 - own_weight.mean(dim=1),
        ratio(others, own),
        ratio(others, own + found.residual[:, queries].double()),
        ratio(others_ln, own_ln + found.rho[:, queries].double()),
    )


def special_reads(lengths: Any, special: list[Any]) -> Any:
    """What `special_rows` reads of every row of a block (`core.reductions.KeySums`): each
    row's weight on its special keys, its Σ_j ‖α f(x_j)‖ and that over its special keys, from
    one table (B, H, 3, T) of each key's weights: 1 on a special key, ‖f^h(x_j)‖ (B, H, T), and
    ‖f^h(x_j)‖ on a special key; 0 past each batch row's tokens."""
    import torch

    from attnviz.core.reductions import KeySums

    lengths = torch.as_tensor(lengths).float()  # (B, H, T)
    marks = torch.zeros(lengths.shape[0], lengths.shape[2])  # (B, T): 1 on a special key
    real = torch.zeros_like(marks)  # 1 on each batch row's own tokens
    for row, marked in enumerate(special):
        marks[row, : len(marked)] = torch.from_numpy(marked.astype("f4"))
        real[row, : len(marked)] = 1.0
    length = lengths * real[:, None]
    table = torch.stack([marks[:, None].expand_as(length), length, length * marks[:, None]], 2)
    return KeySums(lambda start, stop, width: table[..., :width])


def special_rows(rows: Any, start: int, lengths: Any, special: list[Any],
                 sums: Any = None) -> Any:  # fmt: skip
    """What query rows start … start+b−1 (B, H, b, W) add to `special_share`
    (`analysis.summary.special_shares`) of each batch row's heads, by weight and by norm
    ‖α f(x)‖ (each row as shares, as `shares` makes them): the sums over the block's
    non-special queries, (2, B, H), from each key's ‖f^h(x_j)‖ (B, H, T, numpy) and each row's
    special tokens ((T_row,) bool). Divided by the number of non-special queries once every
    block is in, they are the shares (`special_means`). Each row's sums over keys are
    `special_reads`' (B, H, b, 3): `sums` where the pass read them, else read here."""
    import numpy as np
    import torch

    from attnviz.core.reductions import read

    if sums is None:
        (sums,) = read(rows, start, (special_reads(lengths, special),))
    found = np.zeros((2, len(special), rows.shape[1]))
    for row, marked in enumerate(special):
        queries = np.flatnonzero(~marked[start : start + rows.shape[2]])  # in the block
        if not len(queries):
            continue
        mine = sums[row]  # (H, b, 3): every row of the block, or its queries
        if len(queries) < mine.shape[1]:
            mine = mine.index_select(1, torch.from_numpy(queries))
        found[0, row] = mine[..., 0].sum(dim=-1, dtype=torch.float64).numpy()
        totals = mine[..., 1].double()  # (H, q): Σ_j ‖α f(x_j)‖
        found[1, row] = (mine[..., 2].double() / totals.clamp(min=1e-30)).sum(dim=-1).numpy()
    return found


def special_means(sums: Any, special: list[Any]) -> Any:
    """`special_rows`' sums (…, B, L, H) as means over each batch row's non-special queries
    (0 where a row has none)."""
    import numpy as np

    counts = np.array([int((~marked).sum()) for marked in special])  # (B,)
    return sums / np.maximum(counts, 1)[:, None, None]
