"""What each token contributes, not only where heads look: the norm, ALTI and rollout measures.

Head h's output for query i is Σ_j α^h_ij f^h(x_j), with f^h(x) = (x W_V^h + b_V^h) W_O^h
(under grouped-query attention, W_V^h is the head's shared value head; RoPE does not touch
values). A key with a large weight α and a short f(x) passes on little. Each measure is one
`Measure` in MEASURES:

    weights  α^h_ij, per head (rows sum to 1)
    norm     ‖α^h_ij f^h(x_j)‖ = α^h_ij ‖f^h(x_j)‖, per head (Kobayashi et al. 2020)
    alti     per layer, with the residual and the normalisation after the block (Ferrando et
             al. 2022, ALTI), composed from layer 0 up: R_0 = C_0, R_l = C_l R_{l−1}
    rollout  per layer, heads averaged with the residual as I (Abnar & Zuidema 2020):
             Ã_l = (mean_h α_l + I) rows renormalised, R_0 = Ã_0, R_l = Ã_l R_{l−1}

ALTI decomposes the vector the layer's attention block writes for token i:

    t_ij = Σ_h α^h_ij f^h(x_j) + [i = j] r_i        r_i: the residual stream at i

where r is the block's input X in a post-LN encoder (BERT: u_i = Σ_j t_ij + b_O is its
LayerNorm's input) and the stream before the input norm in a pre-LN decoder (Llama: x_j is
that norm's output, and u_i = Σ_j t_ij + b_O is the stream after the block). The
normalisation after the block is linearised with the real input's scale, as Kobayashi et al.
(2021) do: t'_ij = γ ⊙ (t_ij − mean(t_ij)) / s(u_i) for a LayerNorm (s: the standard
deviation with eps; an RMSNorm neither centres nor has a bias, s is the root mean square);
Gemma2 normalises the block's output alone and then adds r_i unnormalised. A pre-LN decoder
has no normalisation here: t' = t. Then, with y_i = Σ_j t'_ij,

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − t'_ij‖₁), rows normalised to sum to 1.

The biases (b_O, and the LayerNorm's β and its share of b_O) belong to no token and are left
out of y_i, as in ALTI. Everything is computed from the captured tensors of one forward pass;
no (T, T, d_model) tensor is held whole: ALTI works through the queries in blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.core.memory import held_bytes, held_what, require
from attnviz.errors import InputError

if TYPE_CHECKING:
    import torch

    from attnviz.core.models import LoadedModel


@dataclass(frozen=True)
class Measure:
    """One way to say how much key j feeds query i: its name (`--measure NAME`), help, unit
    (colour bars, JSON), whether it has a head axis, and the capture kinds it needs."""

    name: str
    help: str
    unit: str
    per_layer: bool  # one map per layer (cumulative from layer 0), no head axis
    kinds: tuple[str, ...]
    cite: str

    @property
    def summed(self) -> bool:
        """Whether each row sums to 1 (a norm's rows do not)."""
        return self.name != "norm"


MEASURES = {
    m.name: m
    for m in (
        Measure(
            "weights",
            "attention weights α, per head (rows sum to 1)",
            "attention weight",
            False,
            ("probs",),
            "",
        ),
        Measure(
            "norm",
            "‖α·f(x)‖ per head: the weight times the length of what the key passes on",
            "‖α·f(x)‖",
            False,
            ("input", "probs"),
            "Kobayashi et al. 2020",
        ),
        Measure(
            "alti",
            "per layer, with the residual and normalisation, composed from layer 0 up",
            "ALTI contribution",
            True,
            ("input", "probs", "output", "residual"),
            "Ferrando et al. 2022",
        ),
        Measure(
            "rollout",
            "per layer, heads averaged with the residual as I, composed from layer 0 up",
            "attention rollout",
            True,
            ("probs",),
            "Abnar & Zuidema 2020",
        ),
    )
}
DEFAULT = "weights"
# ALTI works through this many (query, key, d_model) floats at a time.
BLOCK_FLOATS = 2**22


def get(name: str) -> Measure:
    """The measure called `name`, or a one-line error naming the choices."""
    if name not in MEASURES:
        raise InputError(f"unknown measure '{name}'; choose one of: {', '.join(MEASURES)}")
    return MEASURES[name]


def value_heads(x: torch.Tensor, weights: Any) -> torch.Tensor:
    """v^h_j = x_j W_V^h + b_V^h for every query head: (B, T, H, d_k) from x (B, T, d_model)
    and a layer's `mha.LayerWeights` (query head h reads value head h // group)."""
    d_k, group = weights.d_k, weights.n_heads // weights.kv_heads
    v = x.to(weights.w_v.dtype) @ weights.w_v + weights.b_v  # every value head: (B, T, H_kv·d_k)
    return v.unflatten(-1, (weights.kv_heads, d_k)).repeat_interleave(group, dim=-2)


def value_vectors(x: torch.Tensor, weights: Any) -> torch.Tensor:
    """f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h for every head: (B, H, T, d_model) from x (B, T,
    d_model) and a layer's `mha.LayerWeights` (query head h reads value head h // group)."""
    import torch

    w_o = weights.w_o.reshape(weights.n_heads, weights.d_k, -1)  # W_O^h: (H, d_k, d_model)
    return torch.einsum("bthk,hkd->bhtd", value_heads(x, weights), w_o)


class Values:
    """Each head's values and W_O^h, layer by layer, from what the pass hands over: X through
    the family's W_V and W_O where attnviz has an adapter (`value_heads`), else the values v
    the model handed its own attention, through W_O found by name
    (`adapters.generic.OUTPUT_PROJECTIONS`: any model whose attention attnviz records).
    `kind` is the capture kind it reads; `weights` the adapter's, or None."""

    def __init__(self, loaded: LoadedModel, stack: str | None = None) -> None:
        from attnviz.core import adapters, capture
        from attnviz.core.adapters import generic
        from attnviz.errors import UnsupportedModelError

        model = loaded.model
        self.weights: Any = None
        if adapters.knows(model):
            self.weights = adapters.EachLayer(model, stack)
            self.kind = "input" if stack is None else "source"
            return
        names = ", ".join(generic.OUTPUT_PROJECTIONS)
        if not capture.records(model):
            raise UnsupportedModelError(
                "without an adapter, each head's values are read inside attnviz's attention "
                f"function; '{model.config.model_type}' runs eager attention here (leave "
                "--attention eager out)"
            )
        count = adapters.n_layers(model, stack)
        self._projections = [
            generic.output_projection(model, layer, stack) for layer in range(count)
        ]
        if any(found is None for found in self._projections):
            raise UnsupportedModelError(
                f"'{model.config.model_type}' has no output projection attnviz finds by name "
                f"in its attention modules (it looks for {names})"
            )
        self.kind = "values"

    def heads(self, layer: int, tensors: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(v^h_j (B, T, H, d_k), W_O^h (H, d_k, d_model)) of `layer`, float32, from its
        tensors of the pass (query head h reads value head h // G)."""
        from attnviz.core.adapters.base import linear

        if self.weights is not None:
            weights = self.weights[layer]
            v = value_heads(tensors[self.kind].float(), weights)
            return v, weights.w_o.float().reshape(weights.n_heads, weights.d_k, -1)
        values = tensors["values"].float()  # (B, H_kv, S, d)
        w_o = linear(self._projections[layer])[0].float()  # (H·d, d_model)
        d = values.shape[-1]
        n_heads = w_o.shape[0] // d
        v = values.transpose(1, 2).repeat_interleave(n_heads // values.shape[1], dim=2)
        return v, w_o.reshape(n_heads, d, -1)

    def vectors(self, layer: int, tensors: dict[str, Any]) -> torch.Tensor:
        """f^h(x_j) = v^h_j W_O^h of every head: (B, H, T, d_model)."""
        import torch

        v, w_o = self.heads(layer, tensors)
        return torch.einsum("bthk,hkd->bhtd", v, w_o)

    def of(self, layer: int, tensors: dict[str, Any]) -> torch.Tensor:
        """‖f^h(x_j)‖ of `layer`, (B, H, S) float32, from its tensors of the pass."""
        if self.weights is not None:
            return value_vectors(tensors[self.kind].float(), self.weights[layer]).norm(dim=-1)
        return value_lengths(tensors["values"], self._projections[layer])


def values_of(loaded: LoadedModel, stack: str | None = None) -> Values | None:
    """`Values` of the model (of `stack`), or None where attnviz cannot read each head's
    values and W_O (a measure of norms then has nothing to work with)."""
    from attnviz.errors import UnsupportedModelError

    try:
        return Values(loaded, stack)
    except UnsupportedModelError:
        return None


def value_lengths(values: torch.Tensor, projection: Any) -> torch.Tensor:
    """‖v^h_j W_O^h‖ for every query head, (B, H, S), from the values the model handed its
    attention (B, H_kv, S, d) and its output projection (W_O^h: rows h·d … (h+1)·d of W in
    `X @ W` form; query head h reads value head h // G). A head at a time: no (B, H, S,
    d_model) tensor."""
    import torch

    from attnviz.core.adapters.base import linear

    w_o, _ = linear(projection)  # (H·d, d_model); the bias is added once, no key's
    batch, kv_heads, length, d = values.shape
    n_heads = w_o.shape[0] // d
    group = n_heads // kv_heads
    lengths = torch.empty(batch, n_heads, length)
    for h in range(n_heads):
        v = values[:, h // group].float()  # (B, S, d)
        lengths[:, h] = (v @ w_o[h * d : (h + 1) * d].float()).norm(dim=-1)
    return lengths


def rollout_layer(probs: torch.Tensor) -> torch.Tensor:
    """Ã = (mean over heads of α + I), rows renormalised: (B, T, T) from (B, H, T, T)."""
    import torch

    mixed = probs.mean(dim=1) + torch.eye(probs.shape[-1], dtype=probs.dtype)
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
    output after W_O (B, T, d) and the normalisation after the block (`adapters.Norm`, or
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


class Measured:
    """The recorder that turns one forward pass into a measure's values: `held` is (B, L, H,
    T, T) for a per-head measure, (B, L, 1, T, T) for a per-layer one (L: the chosen layers;
    per-layer measures compose every layer from 0 up to the last chosen one)."""

    def __init__(
        self,
        loaded: LoadedModel,
        measure: Measure,
        layers: list[int],
        n_batch: int,
        width: int,
        key_width: int | None = None,
        stack: str | None = None,
    ) -> None:
        import numpy as np

        from attnviz.core import residual

        self.measure = measure
        self.per_layer = measure.per_layer
        self.stack = stack  # an encoder-decoder model's stack (norm only): keys are (B, S)
        self.slot = {layer: i for i, layer in enumerate(layers)}
        needed = range(max(layers) + 1) if measure.per_layer else layers
        kinds = measure.kinds
        model = loaded.model
        self._norms = {}
        self._values: Values | None = None
        if "input" in measure.kinds:  # each head's values: X through W_V, or v as handed over
            from attnviz.errors import UnsupportedModelError

            try:
                self._values = Values(loaded, stack)
            except UnsupportedModelError as error:
                raise UnsupportedModelError(
                    f"--measure {measure.name} is not defined here: it needs each head's value "
                    f"and output weights, and {error}"
                ) from None
            try:
                if measure.name == "alti":
                    self._norms = {layer: residual.norm_after(model, layer) for layer in needed}
            except UnsupportedModelError as error:
                raise UnsupportedModelError(
                    f"--measure alti is not defined here: it needs the residual stream and the "
                    f"normalisation around each block, and {error}"
                ) from None
            kinds = tuple(self._values.kind if kind == "input" else kind for kind in kinds)
        self.wants = {layer: kinds for layer in needed}
        heads = 1 if measure.per_layer else loaded.info.of_stack(stack).n_heads
        keys = width if key_width is None else key_width
        shape = (n_batch, len(layers), heads, width, keys)
        require(held_bytes(shape), held_what(shape))
        self.held = np.empty(shape, np.float32)
        self.mixing: dict[int, AltiLayer] = {}  # alti: each composed layer's mixing ratios
        # norm: each key's ‖f^h(x_j)‖, (B, L, H, S): what the page multiplies into the weights
        self.lengths = np.empty((n_batch, len(layers), heads, keys), np.float32)
        self._composed: torch.Tensor | None = None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        import torch

        name = self.measure.name
        probs = tensors["probs"].float()
        if name == "weights":
            values = probs
        elif name == "norm":
            lengths = self._values.of(layer, tensors)  # (B, H, S)
            if layer in self.slot:
                self.lengths[:, self.slot[layer]] = lengths.numpy()
            values = probs * lengths[:, :, None, :]  # ‖α f(x_j)‖ = α ‖f(x_j)‖
        else:
            if name == "rollout":
                step = rollout_layer(probs)
            else:
                norm, (v, w_o) = self._norms[layer], self._values.heads(layer, tensors)
                residual, output = tensors["residual"].float(), tensors["output"].float()
                vectors = torch.einsum("bthk,hkd->bhtd", v, w_o)  # f^h(x_j)
                step = alti_layer(probs, vectors, residual, output, norm)
                ratios = mixing_ratios(probs, mixed(v, w_o, residual, output, norm))
                self.mixing[layer] = AltiLayer(step, ratios)
            previous = self._composed
            self._composed = step if previous is None else step @ previous  # R_l = C_l R_{l−1}
            values = self._composed[:, None]
        if layer in self.slot:
            self.held[:, self.slot[layer]] = values.numpy()


def special_rows(rows: Any, start: int, lengths: Any, special: list[Any]) -> Any:
    """What query rows start … start+b−1 (B, H, b, W) add to `special_share`
    (`analysis.summary.special_shares`) of each batch row's heads, by weight and by norm
    ‖α f(x)‖ (each row as shares, as `shares` makes them): the sums over the block's
    non-special queries, (2, B, H), from each key's ‖f^h(x_j)‖ (B, H, T, numpy) and each row's
    special tokens ((T_row,) bool). Divided by the number of non-special queries once every
    block is in, they are the shares (`special_means`)."""
    import numpy as np
    import torch

    found = np.zeros((2, len(special), rows.shape[1]))
    for row, marked in enumerate(special):
        n = len(marked)
        queries = np.flatnonzero(~marked[start : start + rows.shape[2]])  # in the block
        if not len(queries):
            continue
        grid = rows[row, :, :, :n]  # (H, q, W): every row of the block, or its queries
        if len(queries) < grid.shape[1]:
            grid = grid.index_select(1, torch.from_numpy(queries))
        width = grid.shape[-1]  # a decoder's W ≤ T keys
        keys = torch.from_numpy(np.flatnonzero(marked[:width]))
        length = torch.as_tensor(lengths[row, :, :width]).to(grid.dtype)  # (H, W): ‖f(x_j)‖
        on_special = grid.index_select(-1, keys)  # (H, q, specials)
        found[0, row] = on_special.sum(dim=-1, dtype=torch.float64).sum(dim=-1).numpy()
        totals = (grid @ length[..., None])[..., 0].double()  # (H, q): Σ_j ‖α f(x_j)‖
        normed = (on_special * length[:, None, keys]).sum(dim=-1, dtype=torch.float64)
        found[1, row] = (normed / totals.clamp(min=1e-30)).sum(dim=-1).numpy()
    return found


def special_means(sums: Any, special: list[Any]) -> Any:
    """`special_rows`' sums (…, B, L, H) as means over each batch row's non-special queries
    (0 where a row has none)."""
    import numpy as np

    counts = np.array([int((~marked).sum()) for marked in special])  # (B,)
    return sums / np.maximum(counts, 1)[:, None, None]


class SpecialShares:
    """The recorder behind the summary's line on special tokens: for each chosen layer and head,
    the mean over non-special queries of the share special keys get, by weight and by norm
    ‖α f(x)‖ (each row as shares, as `shares` makes them): `by_weight` and `by_norm`, (B, L, H)
    each. Summed from blocks of query rows as the pass hands them out (after each layer's X,
    which gives each key's ‖f^h(x_j)‖), so no layer's whole matrix is held for it."""

    def __init__(self, loaded: LoadedModel, layers: list[int], special: list[Any]) -> None:
        import numpy as np

        from attnviz.core.capture import ROWS

        self._reader = Values(loaded)  # each key's ‖f^h(x_j)‖
        self.wants = {layer: (self._reader.kind, ROWS) for layer in layers}
        self.slot = {layer: i for i, layer in enumerate(layers)}
        self._special = [np.asarray(marked, dtype=bool) for marked in special]  # (T_row,) bool
        shape = (2, len(special), len(layers), loaded.info.n_heads)
        self._sums = np.zeros(shape)  # by weight, by norm: summed over non-special queries
        self._lengths: Any = None  # the layer's ‖f^h(x_j)‖, (B, H, T)

    @classmethod
    def of(cls, loaded: LoadedModel, layers: list[int], special: list[Any]) -> SpecialShares | None:
        """The recorder, or None where the model's value weights cannot be read (the summary
        then gives the share by weight alone)."""
        from attnviz.errors import UnsupportedModelError

        try:
            return cls(loaded, layers, special)
        except UnsupportedModelError:
            return None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        self._lengths = self._reader.of(layer, tensors).numpy()

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        """Query rows start … start+b−1 of `layer`, (B, H, b, S)."""
        self._sums[:, :, self.slot[layer]] += special_rows(
            rows, start, self._lengths, self._special
        )

    @property
    def by_weight(self) -> Any:
        return special_means(self._sums[0], self._special).astype("f4")

    @property
    def by_norm(self) -> Any:
        return special_means(self._sums[1], self._special).astype("f4")


class ContributionSums:
    """report's special shares and mixing ratios as sums over the texts, each text's at its
    index in the corpus (`analysis.ordered`), so that parts summed apart `merge` into the
    same bits. `mixing`: whether mixing ratios are measured; `by_norm`: whether the value
    weights could be read (special shares by norm)."""

    def __init__(self, n_layers: int, n_heads: int, mixing: bool, by_norm: bool) -> None:
        from attnviz.analysis.ordered import OrderedSum

        self.shape = (n_layers, n_heads)
        self.by_norm = by_norm
        self.special_sums = OrderedSum()  # of (2, L, H) per text: by weight, by norm
        self.texts = 0  # with a non-special query: where the share is defined
        self.mixing_sums = OrderedSum() if mixing else None  # of (3, L) per text, × tokens
        self.tokens = 0  # summed over every token

    def add(self, index: int, special: Any, mixing: Any, n_tokens: int) -> None:
        """Text `index`'s special shares (2, L, H) (None: no non-special query) and the sum
        of its tokens' mixing ratios (3, L) (None: not measured), over its `n_tokens`."""
        self.special_sums.add(index, special)
        self.texts += special is not None
        if self.mixing_sums is not None:
            self.mixing_sums.add(index, mixing)
            self.tokens += n_tokens if mixing is not None else 0

    def merge(self, other: ContributionSums) -> ContributionSums:
        merged = ContributionSums(*self.shape, self.mixing_sums is not None, self.by_norm)
        merged.special_sums = self.special_sums.merge(other.special_sums)
        merged.texts = self.texts + other.texts
        if self.mixing_sums is not None and other.mixing_sums is not None:
            merged.mixing_sums = self.mixing_sums.merge(other.mixing_sums)
            merged.tokens = self.tokens + other.tokens
        return merged

    def special(self) -> Any:
        """(2, L, H): each head's special share by weight and by norm ‖α f(x)‖, means over the
        texts (NaN where undefined: no text with a non-special query; by norm, unreadable
        value weights)."""
        import numpy as np

        total = self.special_sums.total()
        found = total / self.texts if self.texts else np.full((2, *self.shape), np.nan)
        if not self.by_norm:
            found[1] = np.nan
        return found

    def mixing(self) -> Any:
        """(4, L): each layer's mixing ratios in the order of MIXING, means over every token of
        every text; None for a stack of an encoder-decoder model or unreadable value weights."""
        if self.mixing_sums is None or not self.tokens:
            return None
        return self.mixing_sums.total() / self.tokens


def mixing_left_out(loaded: LoadedModel) -> str | None:
    """Why `report` leaves a one-stack model's mixing ratios out (it cannot read each head's
    values and W_O, or how a block joins the residual stream), or None: they are measured."""
    from attnviz.core import residual
    from attnviz.errors import UnsupportedModelError

    if loaded.info.seq2seq:
        return None  # defined for one-stack models only (docs/seq2seq.md)
    if values_of(loaded) is None:
        return "attnviz cannot read each head's values and W_O of this model"
    try:
        for layer in range(loaded.info.n_layers):
            residual.norm_after(loaded.model, layer)
    except UnsupportedModelError as error:
        return str(error)
    return None


class CorpusContributions:
    """report's special shares and mixing ratios over a corpus, batch by batch (flat memory):
    `recorders(special)` before a batch's pass, `add(row, att)` for each of its texts after it,
    then `special()` and `mixing()` (the sums themselves: `sums`). `stack`: an
    encoder-decoder model's self-attention stack (special shares only: mixing ratios are for
    one-stack models). A batch's `mixed` vectors of each layer serve both."""

    def __init__(self, loaded: LoadedModel, stack: str | None = None) -> None:
        from attnviz.core import residual

        info = loaded.info.of_stack(stack)
        self._stack = stack
        self._values = values_of(loaded, stack)  # for norm and mixing
        self._norms: dict[int, Any] | None = None  # the normalisation after each block
        if stack is None and self._values is not None and mixing_left_out(loaded) is None:
            model = loaded.model
            self._norms = {
                layer: residual.norm_after(model, layer) for layer in range(info.n_layers)
            }
        mixing = self._norms is not None
        by_norm = self._values is not None
        self.sums = ContributionSums(info.n_layers, info.n_heads, mixing, by_norm)
        self._n_layers = info.n_layers
        self._added = 0
        self._batch: _ContributionPass | None = None

    def recorders(self, special: list[Any]) -> list[Any]:
        """One batch's recorders, from its texts' special masks ((T_row,) bool, of the
        queries: the source's for the encoder, the target's for the decoder)."""
        if self._values is None:
            return []
        self._batch = _ContributionPass(
            self._values, self._n_layers, self._norms, special, self._stack
        )
        return [self._batch]

    def add(self, row: int, att: Any, index: int | None = None, by_weight: Any = None) -> None:
        """Batch row `row`'s text, whose attention (all layers, tokens) is `att`, at its
        `index` in the corpus (default: after the texts added so far); `by_weight`, its
        special shares by weight (L, H) where `att` holds no maps (a long text's, summed from
        blocks of rows)."""
        import numpy as np

        from attnviz.analysis.summary import special_shares

        batch = self._batch
        n = len(att.tokens)
        mixing = None
        if self.sums.mixing_sums is not None and batch is not None:
            mixing = batch.mixing[row] * n  # each token weighs the same
        special = None
        if (~att.special).any():
            if by_weight is None:
                by_weight = special_shares(att.weights, ~att.special, att.key_special)  # (L, H)
            by_norm = batch.by_norm[row] if batch is not None else np.zeros_like(by_weight)
            special = np.stack([by_weight, by_norm])
        self.sums.add(self._added if index is None else index, special, mixing, n)
        self._added += 1

    def special(self) -> Any:
        return self.sums.special()

    def mixing(self) -> Any:
        return self.sums.mixing()


class _ContributionPass:
    """One batch's recorder for `CorpusContributions`: each layer's special shares by norm
    (B, L, H) and, given the normalisations after the blocks (`norms`: one-stack models), the
    mean over each row's tokens (special ones too) of its mixing ratios (B, 4, L), one
    layer's own quantity, nothing composed. `weights`: each layer's `mha.LayerWeights`.
    Summed from blocks of query rows as the pass hands them out (after each layer's X, which
    gives each key's vectors), so no layer's whole matrix is held for it."""

    def __init__(
        self,
        values: Values,
        n_layers: int,
        norms: dict[int, Any] | None,
        special: list[Any],
        stack: str | None,
    ) -> None:
        import numpy as np

        from attnviz.core.capture import ROWS

        self.stack = stack
        self._values, self._norms = values, norms
        self._special = [np.asarray(marked, dtype=bool) for marked in special]
        kinds = (values.kind, ROWS, *(("output", "residual") if norms is not None else ()))
        self.wants = {layer: kinds for layer in range(n_layers)}
        self._by_norm = None  # sums over queries, (B, L, H) once the first layer is in
        self._mixing = np.zeros((len(special), len(MIXING), n_layers))  # sums over tokens
        self._n_layers = n_layers
        self._lengths: Any = None  # the layer's ‖f^h(x_j)‖, (B, H, T)
        self._mixed: Mixed | None = None

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        import numpy as np

        if self._norms is None:
            self._lengths = self._values.of(layer, tensors).numpy()
        else:
            residual, output = tensors["residual"], tensors["output"]
            v, w_o = self._values.heads(layer, tensors)
            self._mixed = mixed(v, w_o, residual, output, self._norms[layer])
            self._lengths = self._mixed.lengths().numpy()
        if self._by_norm is None:
            shape = (len(self._special), self._n_layers, self._lengths.shape[1])
            self._by_norm = np.zeros(shape)

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        """Query rows start … start+b−1 of `layer`, (B, H, b, W)."""
        self._by_norm[:, layer] += special_rows(rows, start, self._lengths, self._special)[1]
        if self._mixed is None:
            return
        # the padded batch at once: a text's queries give its padding keys no weight, so
        # their ratios are the text's own (`test_report_contributions`: batch sizes agree)
        ratios = mixing_rows(rows, start, self._mixed)  # (B, b) each
        for row, marked in enumerate(self._special):
            mine = slice(0, max(0, len(marked) - start))  # the block's queries of this text
            for k, ratio in enumerate(ratios):
                self._mixing[row, k, layer] += float(ratio[row, mine].sum())

    @property
    def by_norm(self) -> Any:
        return special_means(self._by_norm, self._special)

    @property
    def mixing(self) -> Any:
        import numpy as np

        return self._mixing / np.array([len(marked) for marked in self._special])[:, None, None]


def measured(
    loaded: LoadedModel,
    batch: list[Any],
    measure: str = DEFAULT,
    layers: list[int] | None = None,
    also: list[Any] | None = None,
    keep: list[Measured] | None = None,
    edit: Any = None,
) -> list[Any]:
    """Each encoded text's `Attention` whose weights are `measure`'s values (one forward pass;
    recorders in `also` are fed by it too). `keep` gets the measure's recorder (ALTI's
    mixing ratios are on it); `edit` changes the model as it runs (`capture.run`: heads
    removed)."""
    from attnviz.core.extract import attend

    chosen = get(measure)
    if chosen.name == DEFAULT:
        return attend(loaded, batch, layers, also=also or [], edit=edit)

    def make(layers: list[int], n_batch: int, width: int) -> Measured:
        made = Measured(loaded, chosen, layers, n_batch, width)
        if keep is not None:
            keep.append(made)
        return made

    return attend(loaded, batch, layers, also=also or [], values=make, edit=edit)


def refuse_on_stacks(measure: str) -> Measure:
    """The measure called `measure`, refusing one not defined on an encoder-decoder model's
    stacks (before the model loads)."""
    chosen = get(measure)
    if chosen.name not in (DEFAULT, "norm"):
        raise InputError(
            f"--measure {chosen.name} composes one stack's layers and is not defined across an "
            "encoder-decoder model's stacks; use weights or norm"
        )
    return chosen


def stack_values(loaded: LoadedModel, measure: str) -> Any:
    """For `extract.attend_stacks`: a factory of recorders giving `measure`'s values on an
    encoder-decoder model's stacks (None for the weights). Of the contribution measures,
    norm is defined there (cross-attention's values are made of the encoder's output);
    ALTI and rollout compose one stack's layers with its residual stream, which
    cross-attention adds to the decoder's, and are refused."""
    chosen = refuse_on_stacks(measure)
    if chosen.name == DEFAULT:
        return None

    def make(stack: str, layers: list[int], n_batch: int, width: int, key_width: int):
        return Measured(loaded, chosen, layers, n_batch, width, key_width, stack)

    return make


def shares(att: Any) -> Any:
    """A norm's rows as shares (each row divided by its sum), what the summaries and the
    query's tables rank: the measures whose rows already sum to 1 are returned as they are."""
    from dataclasses import replace

    import numpy as np

    if MEASURES[att.measure].summed:
        return att
    totals = att.weights.sum(axis=-1, keepdims=True)
    return replace(att, weights=(att.weights / np.where(totals > 0, totals, 1.0)).astype("f4"))


def refuse(measure: str, hide_special: bool = False) -> Measure:
    """The measure called `measure`, refusing what it cannot be combined with (before the
    model loads)."""
    chosen = get(measure)
    if hide_special and not chosen.summed:
        raise InputError(
            f"--hide-special renormalises rows to sum to 1, and {chosen.name}'s rows are "
            "lengths; use it with --measure weights, alti or rollout"
        )
    return chosen


def mixing_means(recorder: Measured, row: int, n: int) -> dict[int, dict[str, float]]:
    """Each layer's mean mixing ratio over the first `n` tokens of batch row `row`: how much of
    a token's update comes from other tokens (`mixing_rows`), by weights, by norms, with the
    residual, and with the residual and normalisation (Kobayashi et al. 2021's Attn-W,
    Attn-N, AttnRes-N and AttnResLn-N)."""
    return {
        layer: {name: float(ratios[row, :n].mean()) for name, ratios in zip(MIXING, found.ratios)}
        for layer, found in sorted(recorder.mixing.items())
    }


@dataclass(frozen=True, eq=False)
class PageMeasures:
    """Every measure of one text for the interactive page's switch: the weights, the others
    by name, and each key's ‖f^h(x_j)‖ for norm (None where it cannot stand for the norm: a
    word view, whose norms are sums over pieces)."""

    weights: Any  # Attention
    others: dict[str, Any]  # name -> Attention
    lengths: Any = None  # (L, H, T)


class EveryMeasure:
    """Recorders for the measures a pass does not make already (`chosen` is made by
    `measured`), so that one forward pass over a batch of `width` padded tokens gives each
    text's page all four: those the model allows (norm: v and W_O, `ValueLengths`; ALTI:
    X and the norms around the block, which attnviz reads through its adapters only)."""

    def __init__(
        self, loaded: LoadedModel, layers: list[int], batch: list[Any], chosen: str
    ) -> None:
        from attnviz.errors import UnsupportedModelError

        width = max(len(encoded) for encoded in batch)  # as `tokens.pad` pads
        self.recorders = {}
        for name, measure in MEASURES.items():
            if name == chosen:
                continue
            try:  # a measure this model cannot give (ALTI without an adapter) is left out
                self.recorders[name] = Measured(loaded, measure, layers, len(batch), width)
            except UnsupportedModelError:
                continue

    def page(
        self, raw: Any, shown: Any, transform: Any, kept: Measured | None = None, row: int = 0
    ) -> PageMeasures:
        """Batch row `row`'s measures for its page: `shown` is the chosen measure as the
        command shows it, `raw` the same before `transform` (words, hide-special), which is
        applied to the others in the same way. Norm is left out where special tokens are hidden
        (its rows are lengths, which hiding would renormalise)."""
        from dataclasses import replace

        n = len(raw.tokens)
        made = {shown.measure: shown}
        for name, recorder in self.recorders.items():
            if name == "norm" and shown.hidden_special:
                continue
            values = replace(
                raw,
                weights=recorder.held[row][..., :n, :n],
                measure=name,
                per_layer=recorder.per_layer,
            )
            made[name] = transform(values)
        norm = self.recorders.get("norm") or kept
        lengths = None
        if shown.unit == "token" and not shown.hidden_special and norm is not None:
            lengths = norm.lengths[row][..., :n]
        weights = made.pop("weights")
        return PageMeasures(weights, made, lengths)


def page_pass(
    loaded: LoadedModel, encoded: Any, measure: str, layers: list[int] | None, transform: Any
) -> tuple[Any, PageMeasures, Any]:
    """One text's interactive page from one forward pass: the chosen measure as `transform`
    shows it, every measure for the page's switch, and the inside view's numbers (`Inside`,
    or why it is left out). `attnviz show --html` makes the same from its own pass."""
    from attnviz.analysis.inside import InsideSteps

    chosen = loaded.info.pick_layers(layers)
    inside = InsideSteps(loaded, [encoded])
    every = EveryMeasure(loaded, chosen, [encoded], measure)
    kept: list[Measured] = []
    also = [inside, *every.recorders.values()]
    raw = measured(loaded, [encoded], measure, layers, also, kept)[0]
    shown = transform(raw)
    return shown, every.page(raw, shown, transform, kept[0] if kept else None), inside.result()
