"""attnviz's attention function: the probabilities recorded inside the model's own attention
call, from the model's own q and k, as the model runs.

transformers 5 sends the attention of most model types through one registry
(`AttentionInterface`): each attention module calls the function registered under its
config's `_attn_implementation` with its q (B, H, T, d), k and v (B, H_kv, S, d) after RoPE
and norms, the mask, and the layer's extras (`scaling`, `softcap`, T5's `position_bias`,
gpt-oss's `s_aux` sink logits). attnviz registers `attention` below under NAME, with
`sdpa_mask` as its mask function (without a mask function registered for a name,
transformers builds no mask at all: the causal and padding masks would be dropped).

During a pass (`listening`) the function asks its `Listener` which site (stack, layer) the
calling module is and whether anyone wants that layer's probabilities:
- a layer nobody wants runs the model's fast attention (`fast`, SDPA), untouched;
- a wanted layer's probabilities are made a block of query rows at a time, in float32, as
  the model's eager function makes them (scale, soft cap, position bias, mask, sinks,
  softmax), each block handed to the listener, and the layer's output is those blocks
  times V: the whole (B, H, T, S) matrix of a layer never exists unless a recorder keeps it.
Grouped-query heads are grouped, not copied: a key head's G query heads are one product.

An `edit` (head ablation, importance gates) acts on the heads' outputs (B, T, H·d_head)
before they leave the function, that is before the module's output projection W_O.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from attnviz.core.settings import FLASH

if TYPE_CHECKING:
    import torch

NAME = "attnviz"
# The same function, with transformers' eager masks (additive floats), for a model that
# transformers runs without SDPA: such a model may read its mask itself (NLLB-MoE's router
# takes the padding from it) in the eager format.
EAGER_MASKS = "attnviz_eager"
NAMES = (NAME, EAGER_MASKS)
BLOCK_ROWS = 256  # query rows a block: 256 rows of 9 heads over 8,192 keys are 75 MB of float32
# Where a block is PANEL_WIDTH keys wide or more, its scores are multiplied PANEL_ROWS query
# rows at a time on the CPU (`_products`).
PANEL_WIDTH, PANEL_ROWS = 2048, 48

# A block's rows: (start, probabilities (B, H, b, W) float32, entropies (B, H, b) or None)
Block = tuple[int, Any, Any]


class Listener(Protocol):
    """What one pass wants from the function (`core.capture` makes it)."""

    fast: str | None  # what layers nobody wants run: "sdpa" (flash_attention_2), or None:
    # the blocks here, recording nothing (a model transformers runs without SDPA)
    block_rows: int
    entropy: bool  # whether blocks carry each row's entropy

    def site(self, module: Any) -> Any:
        """The calling module's site (stack, layer), or None: not one attnviz reads."""

    def wants(self, site: Any, shape: tuple[int, int, int, int]) -> bool:
        """Whether `site`'s probabilities, (B, H, T, S) in all, are wanted (in blocks)."""

    def scores(self, site: Any, scores: Scores, value: Any) -> None:
        """`site`'s queries and keys as the model handed them over (kept where a recorder
        asks for them: `serve`'s tiles make any head's rows from them later), and its values
        v (B, H_kv, S, d) (the norm measure's f^h(x_j) = v_j W_O^h)."""

    def reductions(self, site: Any) -> tuple:
        """What `site`'s recorders read of each block (`core.reductions`): made with the
        block where the function can (`Scores.read_rows`), handed to `block` as `found`.
        Optional: a listener without it (generation's) is handed the rows alone."""

    def block(self, site: Any, start: int, rows: Any, entropy: Any, found: Any = None) -> None:
        """Rows start … start+b−1 of every head, (B, H, b, W), W ≤ S keys; `found`, what
        `reductions(site)` asked of them where the function read it, in its order."""

    def done(self, site: Any, heads: Any) -> Any:
        """`site` has run: its heads' outputs (B, T, H·d_head); what the output projection
        reads instead (an edit's), or `heads` itself."""


_LISTENER: contextvars.ContextVar[Listener | None] = contextvars.ContextVar(
    "attnviz_listener", default=None
)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """`listener` hears every call of the function in this thread while the context lasts."""
    register()
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


_registered = False


def register() -> None:
    """Register the function and its mask function with transformers (once a process)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    for name, mask in ((NAME, sdpa_mask), (EAGER_MASKS, eager_mask)):
        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, mask)
    _registered = True


def implementation(model: Any) -> str:
    """The name `model` runs attnviz's function under: with SDPA's boolean masks, or with
    eager's additive ones where transformers runs the model without SDPA."""
    return NAME if getattr(model, "_supports_sdpa", True) else EAGER_MASKS


def attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention of `module`: (output (B, T, H, d), None), as transformers' attention
    functions return it; a wanted layer's probabilities handed to the listener on the way."""
    # what the model handed over, made into one Scores before the listener hears of the call
    scores = Scores(query, key, attention_mask, scaling,
                    _causal(module, query, attention_mask, is_causal), position_bias, softcap,
                    s_aux)  # fmt: skip
    listener = _LISTENER.get()
    site = listener.site(module) if listener is not None else None
    shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])  # (B, H, T, S)
    wanted = site is not None and listener.wants(site, shape)
    if site is not None:
        listener.scores(site, scores, value)
    # SDPA computes neither soft caps nor sinks: such a layer runs here whether wanted or not
    fast = listener.fast if listener is not None else "sdpa"
    if wanted or fast is None or softcap is not None or s_aux is not None:
        output = in_blocks(
            scores,
            value,
            listener.block_rows if listener is not None else BLOCK_ROWS,
            (lambda *block: listener.block(site, *block)) if wanted else None,
            bool(wanted and listener.entropy),
            (lambda: listener.reductions(site))
            if wanted and hasattr(listener, "reductions")
            else None,
        )
    else:
        from transformers import AttentionInterface

        if fast == FLASH:
            module, attention_mask = _as_flash(module), padding_of(attention_mask)
        output, _ = AttentionInterface._global_mapping[fast](
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, position_bias=position_bias, **kwargs,
        )  # fmt: skip
    if site is not None:
        batch, length = output.shape[:2]
        heads = output.reshape(batch, length, -1)  # (B, T, H·d): W_O's input
        edited = listener.done(site, heads)
        if edited is not heads:
            output = edited.reshape(output.shape)
    return output, None


class _With:
    """`base` with some of its attributes read as other values (what a wrapper reads of it);
    the rest are `base`'s own."""

    def __init__(self, base: Any, **given: Any) -> None:
        self.__dict__.update(given, _base=base)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def _as_flash(module: Any) -> Any:
    """`module` as transformers' flash wrapper reads it: that wrapper loads the kernels of
    the implementation its module's config names, and the model's names attnviz's function
    (NAME), which it would look for as a kernel of that name."""
    return _With(module, config=_With(module.config, _attn_implementation=FLASH))


def padding_of(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The (B, S) padding mask flash attention takes (True: a real key), from the (B or 1,
    1, T, S) mask made for attnviz's function (SDPA's booleans, or additive floats): a key
    no query sees is padding (a real key is seen at least by its own query, or by the one
    query of a step); None where every key is real (flash's causal flag does the rest)."""
    import torch

    if mask is None or mask.dim() == 2:
        return mask
    sees = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    real = sees.any(dim=-2)[:, 0]  # (B or 1, S)
    return None if bool(real.all()) else real


def _causal(module: Any, query: Any, mask: Any, is_causal: bool | None) -> bool:
    """Whether a layer without a mask is causal, as SDPA decides it (transformers'
    `sdpa_attention_forward`): more than one query, no mask, and the module says so."""
    said = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(query.shape[2] > 1 and mask is None and said)


@dataclass(frozen=True, eq=False)
class Scores:
    """One layer's queries and keys as the model hands them to its attention, with what
    turns their products into probabilities as the model's eager attention does: the
    scale, Gemma 2's soft cap, T5's position bias, the mask (boolean: True sees; or
    additive), a causal mask where there is none and `causal` (query i sees keys 0 … i),
    gpt-oss's sink logit per head (one more key, dropped after the softmax)."""

    query: torch.Tensor  # (B, H, T, d)
    key: torch.Tensor  # (B, H_kv, S, d): key head g serves query heads g·G … g·G + G − 1
    mask: torch.Tensor | None  # (B or 1, 1, T or 1, S)
    scaling: float | None = None  # None: 1 / √d
    causal: bool = False
    position_bias: torch.Tensor | None = None  # (B or 1, H, T, S)
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # (H,)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, T, S): the shape of the layer's whole probability matrix."""
        batch, n_heads, length, _ = self.query.shape
        return batch, n_heads, length, self.key.shape[2]

    def head(self, head: int) -> Scores:
        """Query head `head` alone, with its key head: H times fewer products."""
        kv = head // (self.query.shape[1] // self.key.shape[1])
        one = slice(head, head + 1)
        bias = self.position_bias
        if bias is not None and bias.shape[1] > 1:
            bias = bias[:, one]
        sinks = self.sinks[one] if self.sinks is not None else None
        return replace(self, query=self.query[:, one], key=self.key[:, kv : kv + 1],
                       position_bias=bias, sinks=sinks)  # fmt: skip

    def cpu(self) -> Scores:
        """The same on the CPU, detached (what a recorder keeps)."""

        def moved(t: Any) -> Any:
            return t.detach().cpu() if t is not None else None

        return replace(
            self, query=moved(self.query), key=moved(self.key), mask=moved(self.mask),
            position_bias=moved(self.position_bias), sinks=moved(self.sinks),
        )  # fmt: skip

    def sees(self, start: int, stop: int, width: int) -> torch.Tensor:
        """(B or 1, 1, b, W) True where query start … stop−1 sees key 0 … W−1."""
        import torch

        sees, additive = self._mask(start, stop, width)
        if additive is not None:
            return additive > torch.finfo(torch.float32).min / 2
        if sees is None:
            return torch.ones(1, 1, stop - start, width, dtype=torch.bool)
        return sees.expand(-1, 1, stop - start, width)

    def _mask(self, start: int, stop: int, width: int) -> tuple[Any, Any]:
        """(which keys rows start … stop−1 see, as booleans, or None: all; the additive mask
        of those rows, float32, where the model gave one instead)."""
        import torch

        mask = self.mask
        if mask is None:
            if not self.causal:
                return None, None
            causal = torch.ones(stop - start, width, dtype=torch.bool, device=self.query.device)
            return causal.tril_(start)[None, None], None  # (1, 1, b, W)
        given = mask[..., :width] if mask.shape[-2] == 1 else mask[..., start:stop, :width]
        if given.dtype == torch.bool:  # one row for every query (MobileBERT) or one a query
            return given, None
        return None, given.float()

    @property
    def trimmed(self) -> bool:
        """Whether each query row sees the keys up to its own alone (a causal layer with no
        mask): a block's rows then stop at its last query's key."""
        return self.causal and self.mask is None

    def _raw(self, start: int, stop: int) -> torch.Tensor:
        """The scaled products q·kᵀ of query rows start … stop−1, (B, H, b, W) float32,
        contiguous; W is S, or `stop` where the rows are `trimmed`."""
        batch, n_heads, length, n_keys = self.shape
        kv_heads, d_k = self.key.shape[1], self.query.shape[-1]
        groups, rows = n_heads // kv_heads, stop - start
        width = min(stop, n_keys) if self.trimmed else n_keys
        scale = d_k**-0.5 if self.scaling is None else self.scaling
        # a key head's G query heads as one product: (B, H_kv, G·b, d) by its keys
        # q scaled before the product: a pass over d columns, not over W (float32 rounding
        # of the scale's product, 1e-7 of a score)
        q = self.query[:, :, start:stop].float() * scale
        q = q.reshape(batch, kv_heads, groups * rows, d_k)
        scores = _products(q, self.key[:, :, :width].float())
        return scores.view(batch, n_heads, rows, width)

    def read_rows(self, start: int, stop: int, entropy: bool = False,
                  asked: tuple = ()) -> tuple[torch.Tensor, Any, list[Any] | None]:  # fmt: skip
        """`rows`, with what the recorders read of them (`asked`, `core.reductions`): made in
        one compiled pass over the block where `core.fused` can, (probs, entropies, what
        `asked` reads); else `rows`' two and None (the recorders' reads are then made from
        the rows by `reductions.read`)."""
        from attnviz.core import fused

        if fused.applies(self):
            return fused.block(self._raw(start, stop), start, self.trimmed, entropy, asked)
        return (*self.rows(start, stop, entropy), None)

    def rows(self, start: int, stop: int, entropy: bool = False) -> tuple[torch.Tensor, Any]:
        """The probabilities of query rows start … stop−1 of every head, (B, H, b, W) float32
        (half-precision q and k upcast), and with `entropy` each row's −Σ p ln p, (B, H, b).
        A row that sees no key is all 0. W is S, or for a causal layer with no mask `stop`:
        the later keys would all be 0, and are not computed."""
        import torch

        batch, n_heads = self.shape[:2]
        rows, trimmed = stop - start, self.trimmed
        scores = self._raw(start, stop)
        width = scores.shape[-1]
        if self.softcap is not None:  # Gemma 2: the scores squashed into (−cap, cap)
            scores = torch.tanh(scores.div_(self.softcap)).mul_(self.softcap)
        if self.position_bias is not None:  # T5: a bias by relative position
            scores = scores + self.position_bias[:, :, start:stop, :width].float()
        hidden = torch.finfo(torch.float32).min
        sees = None
        if trimmed:  # every row sees the keys before the block: mask the block's own alone
            later = torch.ones(rows, width - start, dtype=torch.bool, device=scores.device).triu_(1)
            scores[..., start:width].masked_fill_(later, hidden)
        else:
            sees, additive = self._mask(start, stop, width)
            if additive is not None:  # a float mask: 0 or very negative
                scores = scores + additive
            if sees is not None:
                scores.masked_fill_(~sees, hidden)
        if self.sinks is not None:  # gpt-oss: each head's sink logit, one more key, dropped
            sink = self.sinks.float().view(1, n_heads, 1, 1).expand(batch, n_heads, rows, 1)
            both = torch.cat([scores, sink], dim=-1)
            probs = torch.softmax(both - both.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
            entropies = torch.special.entr(probs).sum(dim=-1) if entropy else None
        else:
            probs, entropies = torch.softmax(scores, dim=-1), None
            if entropy:  # −Σ p ln p = ln Z − Σ p s: no logarithm or exponential of every
                # cell (hidden keys: p = 0 and a finite s, so they add 0)
                log_z = _log_z(scores, probs, trimmed)
                entropies = log_z - torch.einsum("bhqk,bhqk->bhq", probs, scores)
        if sees is not None:  # a row that sees no key (padding) is 0, not uniform
            empty = ~sees.any(dim=-1)  # (B or 1, 1, b)
            if bool(empty.any()):
                probs = probs.masked_fill(empty[..., None], 0.0)
                if entropies is not None:
                    entropies = entropies.masked_fill(empty, 0.0)
        return probs, entropies


def _log_z(scores: torch.Tensor, probs: torch.Tensor, first_seen: bool) -> torch.Tensor:
    """ln Z of each row, (B, H, b), from its scores and the softmax's probabilities: since
    p_j = exp(s_j − ln Z), ln Z = s_j − ln p_j for any key j the row sees. Where every row
    sees key 0 (`first_seen`: a causal layer with no mask) and no p_0 is below 1e-30 (its
    logarithm keeps float32's relative precision), that is one column: no pass over the
    block; else key j is each row's largest (two maxima over the block)."""
    import torch

    if first_seen:
        first = probs[..., 0]
        if bool((first > 1e-30).all()):
            return scores[..., 0] - torch.log(first)
    return scores.amax(dim=-1) - torch.log(probs.amax(dim=-1))


def _products(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q·kᵀ, (B, H_kv, R, W) from q (B, H_kv, R, d) and k (B, H_kv, W, d). Long rows are
    multiplied a panel of PANEL_ROWS query rows at a time, each written straight into the
    result: at 8,192 keys a block of SmolLM2's took 0.39 s in panels of 48 rows against
    0.62 s as one batched product (2 CPU cores)."""
    import torch

    if k.shape[2] < PANEL_WIDTH or q.device.type != "cpu":
        return q @ k.transpose(-2, -1)
    batch, kv_heads, length = q.shape[:3]
    found = torch.empty(batch, kv_heads, length, k.shape[2])
    for b in range(batch):
        for h in range(kv_heads):
            by_key = k[b, h].t()
            for first in range(0, length, PANEL_ROWS):
                rows = slice(first, first + PANEL_ROWS)
                torch.mm(q[b, h, rows], by_key, out=found[b, h, rows])
    return found


def in_blocks(
    scores: Scores,
    value: torch.Tensor,
    block_rows: int = BLOCK_ROWS,
    take: Callable[..., None] | None = None,
    entropy: bool = False,
    asked: Callable[[], tuple] | None = None,
) -> torch.Tensor:
    """The attention output (B, T, H, d) in the query's dtype, computed a block of
    `block_rows` query rows at a time in float32: each block's probabilities (with their
    entropies where `entropy` asks, and what `asked()` names the recorders read of each
    block, `Scores.read_rows`) go to `take(start, rows, entropies[, found])` first, then
    times V."""
    import torch

    query = scores.query
    batch, n_heads, length, _ = query.shape
    kv_heads = scores.key.shape[1]
    groups = n_heads // kv_heads
    v = value.float()  # (B, H_kv, S, d)
    out = torch.empty(batch, n_heads, length, value.shape[-1], device=query.device)
    for start in range(0, length, block_rows):
        stop = min(start + block_rows, length)
        reads = asked() if asked is not None else ()
        probs, entropies, found = scores.read_rows(start, stop, entropy, reads)
        if take is not None:
            given = found is not None and asked is not None  # a listener that reads them
            take(start, probs, entropies, *((found,) if given else ()))
        rows, width = stop - start, probs.shape[-1]
        weighted = probs.reshape(batch, kv_heads, groups * rows, width) @ v[:, :, :width]
        out[:, :, start:stop] = weighted.view(batch, n_heads, rows, -1)  # (B, H, b, d)
    return out.to(query.dtype).transpose(1, 2).contiguous()  # (B, T, H, d)
