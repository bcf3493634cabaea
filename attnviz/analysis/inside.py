"""The numbers of the page's "inside one head" view, from the from-scratch attention.

The forward pass that extracts a text's attention also hands on every layer's input X
(`InsideSteps` is a `capture` recorder); `attnviz.core.mha.attention_head` (the function
`multi_head_attention` itself uses) turns X into each head's Q_h, K_h, V_h and
probabilities, and the probabilities are compared with the model's own, query by query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Encoded
    from attnviz.core.models import LoadedModel, ModelInfo

# Q, K and V of every layer are float32 and barely compress: past this many raw bytes the
# page leaves the view out (and says so) rather than grow past its size budget.
INSIDE_BUDGET = 6 * 2**20


@dataclass(frozen=True, eq=False)
class Inside:
    """Every head's Q_h, K_h, V_h over the text's tokens, and how far our softmax is from
    the model's."""

    tokens: tuple[str, ...]
    q: np.ndarray  # (L, H, T, d_k) float32
    k: np.ndarray  # (L, H, T, d_k) float32
    v: np.ndarray  # (L, H, T, d_k) float32
    errors: np.ndarray  # (L, H, T) max over keys of |ours − model's| for each query
    scores: tuple[dict[str, float | None], ...] = ()  # per layer: scale, softcap, window


def inside_size(info: ModelInfo, n_tokens: int) -> int:
    """Raw bytes of Q, K and V for every layer, as the page stores them: H · d_k values per
    token and layer (not d_model: Qwen3 and Gemma heads are wider than d_model / H)."""
    return 3 * info.n_layers * n_tokens * info.n_heads * info.d_head * 4


def left_out(info: ModelInfo, n_tokens: int) -> str | None:
    """Why the page leaves the inside view out for a text of `n_tokens`, or None if it fits."""
    size = inside_size(info, n_tokens)
    if size <= INSIDE_BUDGET:
        return None
    return (
        f"left out: Q, K and V of every layer would add {size / 2**20:.1f} MiB to this page "
        f"(the limit is {INSIDE_BUDGET / 2**20:.0f} MiB); use a shorter text, or "
        "`attnviz check` for the numbers"
    )


class InsideSteps:
    """A capture recorder: recomputes every head of every layer of each text in a batch from
    scratch as the forward pass produces the layer's input and probabilities (as `check`
    does), with RoPE, grouped K/V heads and sliding windows where the model has them.

    Each text is cropped to its own tokens first (batches are right-padded), so its numbers
    are those of its own positions 0…n−1. A text the page leaves the view out for (over
    INSIDE_BUDGET, or an architecture the from-scratch attention cannot read) gets the reason
    from `result` instead, and costs the pass nothing.
    """

    def __init__(self, loaded: LoadedModel, batch: Sequence[Encoded]) -> None:
        from attnviz.core import adapters
        from attnviz.errors import UnsupportedModelError

        self.causal = loaded.info.causal
        self.batch = list(batch)
        self.reasons = [left_out(loaded.info, len(encoded)) for encoded in self.batch]
        try:  # the weights are read up front: an unsupported architecture refuses here
            self.weights = [
                adapters.layer_weights(loaded.model, layer).to_cpu().double()
                for layer in range(loaded.info.n_layers)
            ]
        except UnsupportedModelError as error:
            self.weights = []
            self.reasons = [f"left out: {error}"] * len(self.batch)
        every_layer = range(loaded.info.n_layers)
        needed = any(reason is None for reason in self.reasons)
        self.wants = {layer: ("input", "probs") for layer in every_layer} if needed else {}
        self.steps = [{"q": [], "k": [], "v": [], "errors": [], "scores": []} for _ in batch]

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        import numpy as np
        import torch

        from attnviz.core.mha import attention_head, rope_angles, visible_keys

        w = self.weights[layer]
        scale = w.scale if w.scale is not None else w.d_k**-0.5
        for row, (encoded, steps) in enumerate(zip(self.batch, self.steps)):
            if self.reasons[row] is not None:
                continue
            n = len(encoded)
            x = tensors["input"][row : row + 1, :n].double()  # (1, n, d_model)
            model_probs = tensors["probs"][row : row + 1, :, :n, :n]  # (1, H, n, n)
            allowed = visible_keys(1, n, causal=self.causal, window=w.window)
            angles = rope_angles(w.rope, n) if w.rope is not None else None
            steps["scores"].append({"scale": scale, "softcap": w.softcap, "window": w.window})
            heads = [attention_head(x, w, h, allowed, angles) for h in range(w.n_heads)]
            for name in ("q", "k", "v"):
                per_head = [getattr(head, name)[0].numpy() for head in heads]  # (n, d_k) each
                steps[name].append(np.stack(per_head).astype(np.float32))  # (H, n, d_k)
            diff = (torch.stack([h.probs[0] for h in heads]) - model_probs[0].double()).abs()
            steps["errors"].append(diff.amax(dim=-1).numpy())  # (H, n)

    def result(self, row: int = 0) -> Inside | str:
        """The inside-one-head numbers of the batch's text `row`, or why they are left out."""
        import numpy as np

        if self.reasons[row] is not None:
            return self.reasons[row]
        steps = self.steps[row]
        q, k, v, errors = (np.stack(steps[name]) for name in ("q", "k", "v", "errors"))
        return Inside(self.batch[row].tokens, q, k, v, errors, tuple(steps["scores"]))


def inside_of(loaded: LoadedModel, encoded: Encoded) -> Inside | str:
    """The inside-one-head numbers of one text by a forward pass of their own (for an
    Attention made without them: a notebook's `to_html()`), or why they are left out."""
    from attnviz.core import capture
    from attnviz.core.tokens import pad

    steps = InsideSteps(loaded, [encoded])
    if steps.wants:
        capture.run(loaded, pad(loaded, [encoded]), [steps])
    return steps.result()
