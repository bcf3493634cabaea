"""The numbers of the page's "inside one head" view, from the from-scratch attention.

The forward pass that extracts a text's attention also hands on every layer's input X
(`InsideSteps` is a `capture` recorder); `attnviz.core.mha.attention_head` (the function
`multi_head_attention` itself uses) turns X into each head's Q_h, K_h, V_h and
probabilities, and the probabilities are compared with the model's own, query by query.

An encoder-decoder model's stacks each have their own (`InsideSteps(…, stack=…)`): in
cross-attention Q_h comes from the target's tokens and K_h, V_h from the source's (the
encoder's last hidden states), so K_h and V_h have a row per source token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Encoded, SourceTarget
    from attnviz.core.model_info import LoadedModel

# Q, K and V of every layer are float32 and barely compress: past this many raw bytes the
# page leaves the view out (and says so) rather than grow past its size budget.
INSIDE_BUDGET = 6 * 2**20


@dataclass(frozen=True, eq=False)
class Inside:
    """Every head's Q_h, K_h, V_h over the text's tokens, and how far our softmax is from
    the model's (in cross-attention, K_h and V_h over the source's tokens, `key_tokens`)."""

    tokens: tuple[str, ...]
    q: np.ndarray  # (L, H, T, d_k) float32
    k: np.ndarray  # (L, H, S, d_k) float32; S = T except in cross-attention
    v: np.ndarray  # (L, H, S, d_k) float32
    errors: np.ndarray  # (L, H, T) max over keys of |ours − model's| for each query
    scores: tuple[dict[str, float | None], ...] = ()  # per layer: scale, softcap, window, band
    stack: str | None = None  # encoder-decoder models: "encoder", "decoder" or "cross"
    key_tokens: tuple[str, ...] | None = None  # cross-attention: the source's tokens
    bias: np.ndarray | None = None  # (H, T, S) T5's relative position bias B_h, every layer's


# Why a decoder's prompt with a generated or given continuation has no inside view: its pass
# keeps each layer's q and k (`core.generation`), not the layer's input the view starts from.
CONTINUED = (
    "left out: the inside view starts from each layer's input, which the pass that writes "
    "(or reads) a continuation does not keep; run the whole text without --generate/--target"
)


def inside_size(n_layers: int, width: int, n_queries: int, n_keys: int | None = None) -> int:
    """Raw bytes of Q, K and V for every layer, as the page stores them: `width` = H · d_k
    values per token and layer (not d_model: Qwen3 and Gemma heads are wider than d_model / H),
    Q_h a row per query, K_h and V_h a row per key (`n_keys`: cross-attention's source)."""
    return n_layers * width * (n_queries + 2 * (n_keys or n_queries)) * 4


def left_out(size: int, of: str = "every layer") -> str | None:
    """Why the page leaves out an inside view of `size` raw bytes (Q, K and V `of` what),
    or None if it fits."""
    if size <= INSIDE_BUDGET:
        return None
    return (
        f"left out: Q, K and V of {of} would add {size / 2**20:.1f} MiB to this page "
        f"(the limit is {INSIDE_BUDGET / 2**20:.0f} MiB); use a shorter text, or "
        "`attnviz check` for the numbers"
    )


class InsideSteps:
    """A capture recorder: recomputes every head of every layer of each text in a batch from
    scratch as the forward pass produces the layer's input and probabilities (as `check`
    does), with RoPE, grouped K/V heads, sliding windows and T5's relative position bias
    where the model has them.

    Each text is cropped to its own tokens first (batches are right-padded), so its numbers
    are those of its own positions 0…n−1. A text the page leaves the view out for (over
    INSIDE_BUDGET, or an architecture the from-scratch attention cannot read) gets the reason
    from `result` instead, and costs the pass nothing. With `stack` (an encoder-decoder
    model's "encoder", "decoder" or "cross"), the batch is of sources and targets.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        batch: Sequence[Encoded] | Sequence[SourceTarget],
        stack: str | None = None,
    ) -> None:
        from attnviz.core import families
        from attnviz.errors import UnsupportedModelError

        info = loaded.info.of_stack(stack)
        self.stack, self.causal, self.n_layers = stack, info.causal, info.n_layers
        self.sides = [_sides(item, stack) for item in batch]  # (queries, keys) of each text
        at = () if stack is None else (stack,)  # a model with one stack: no stack argument
        try:  # an unsupported architecture refuses here; each layer is read as it runs
            self.weights = families.EachLayer(loaded.model, *at)
            width = self.weights.first.w_q.shape[1]  # H · d_k
            self.sizes = [
                inside_size(info.n_layers, width, len(queries), len(keys))
                for queries, keys in self.sides
            ]  # raw bytes of each text's Q, K and V
            self.reasons = [left_out(size) for size in self.sizes]
        except UnsupportedModelError as error:
            self.weights, self.sizes = {}, [0] * len(self.sides)
            self.reasons = [f"left out: {error}"] * len(self.sides)
        self.kinds = ("input", "probs", *(("kv_input",) if stack == "cross" else ()))
        self.steps = [
            {"q": [], "k": [], "v": [], "errors": [], "scores": [], "bias": None}
            for _ in self.sides
        ]

    @property
    def wants(self) -> dict[int, tuple[str, ...]]:
        """Every layer's input and probabilities while a text still wants the view; else
        nothing, and the pass costs nothing."""
        if all(reason is not None for reason in self.reasons):
            return {}
        return {layer: self.kinds for layer in range(self.n_layers)}

    def leave_out(self, row: int, reason: str) -> None:
        """Leave text `row` without the view (before the pass), for `reason`."""
        self.reasons[row] = reason

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        import numpy as np
        import torch

        from attnviz.core.mha import attention_head, relative_bias, rope_angles, visible_keys

        w = self.weights[layer].double()
        scale = w.scale if w.scale is not None else w.d_k**-0.5
        for row, ((queries, keys), steps) in enumerate(zip(self.sides, self.steps)):
            if self.reasons[row] is not None:
                continue
            n, m = len(queries), len(keys)
            x = tensors["input"][row : row + 1, :n].double()  # (1, T, d_model)
            source = tensors.get("kv_input")  # cross-attention: the encoder's last states
            source = source[row : row + 1, :m].double() if source is not None else None
            model_probs = tensors["probs"][row : row + 1, :, :n, :m]  # (1, H, T, S)
            allowed = visible_keys(1, n, causal=self.causal, window=w.window, n_keys=m,
                                   band=w.band)  # fmt: skip
            angles = rope_angles(w.rope, n) if w.rope is not None else None
            bias = relative_bias(w.relative, n, m) if w.relative is not None else None  # (H, T, S)
            steps["scores"].append({"scale": scale, "softcap": w.softcap, "window": w.window,
                                    "band": w.band})  # fmt: skip
            if bias is not None:
                steps["bias"] = bias.numpy().astype(np.float32)
            heads = [
                attention_head(x, w, h, allowed, angles, source, None if bias is None else bias[h])
                for h in range(w.n_heads)
            ]
            for name in ("q", "k", "v"):
                per_head = [getattr(head, name)[0].numpy() for head in heads]  # (T or S, d_k)
                steps[name].append(np.stack(per_head).astype(np.float32))  # (H, T or S, d_k)
            diff = (torch.stack([h.probs[0] for h in heads]) - model_probs[0].double()).abs()
            steps["errors"].append(diff.amax(dim=-1).numpy())  # (H, T)

    def result(self, row: int = 0) -> Inside | str:
        """The inside-one-head numbers of the batch's text `row`, or why they are left out."""
        import numpy as np

        if self.reasons[row] is not None:
            return self.reasons[row]
        steps = self.steps[row]
        q, k, v, errors = (np.stack(steps[name]) for name in ("q", "k", "v", "errors"))
        queries, keys = self.sides[row]
        return Inside(
            queries.tokens, q, k, v, errors, tuple(steps["scores"]), self.stack,
            keys.tokens if self.stack == "cross" else None, steps["bias"],
        )  # fmt: skip


class StacksInside:
    """An encoder-decoder model's page recorders, one InsideSteps per stack (encoder,
    decoder, cross), made for the batch the pass runs on (`extract_seq2seq(…, also=…)` calls
    it with the encoded source and target) and fed by the pass that extracts the page's
    weights.

    The three stacks share one INSIDE_BUDGET, so the page grows no more than a one-stack
    page: a text whose three stacks' Q, K and V together exceed it goes without the view on
    every stack, and the page says why.
    """

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.steps: dict[str, InsideSteps] = {}

    def __call__(self, batch: Sequence[SourceTarget]) -> list[InsideSteps]:
        from attnviz.core.layer_map import STACKS

        self.steps = {stack: InsideSteps(self.loaded, batch, stack) for stack in STACKS}
        for row in range(len(batch)):
            size = sum(steps.sizes[row] for steps in self.steps.values())
            reason = left_out(size, "every layer of 3 stacks")
            for steps in self.steps.values():
                if reason is not None and steps.reasons[row] is None:
                    steps.leave_out(row, reason)
        return list(self.steps.values())

    def results(self, row: int = 0) -> dict[str, Inside | str]:
        """Each stack's inside-one-head numbers of the batch's text `row`, or why not."""
        return {stack: steps.result(row) for stack, steps in self.steps.items()}


def _sides(item: Encoded | SourceTarget, stack: str | None) -> tuple[Encoded, Encoded]:
    """The tokens a stack's queries and keys are: a text's own for a model with one stack;
    the source's in the encoder, the target's in the decoder, both in cross-attention."""
    if stack is None:
        return item, item
    if stack == "encoder":
        return item.source, item.source
    if stack == "cross":
        return item.target, item.source
    return item.target, item.target
