"""The numbers of the page's "inside one head" view, from the from-scratch attention.

One forward pass records every layer's input X; `attnviz.core.mha.attention_head` (the function
`multi_head_attention` itself uses) turns it into each head's Q_h, K_h, V_h and probabilities,
and the probabilities are compared with the model's own, query by query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.extract import Encoded
    from attnviz.core.models import LoadedModel

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


def inside_size(n_layers: int, n_tokens: int, d_model: int) -> int:
    """Raw bytes of Q, K and V for every layer, as the page stores them."""
    return 3 * n_layers * n_tokens * d_model * 4


def inside_steps(loaded: LoadedModel, encoded: Encoded) -> Inside:
    """Recompute every head of every layer of `encoded` from scratch, keeping each step.

    Each layer is recomputed as soon as the forward pass has produced its input and
    probabilities (as `attnviz check` does), with RoPE, grouped K/V heads and sliding windows
    where the model has them.
    """
    import numpy as np
    import torch

    from attnviz.core import adapters
    from attnviz.core.extract import pad
    from attnviz.core.mha import attention_head, rope_angles, visible_keys

    model, info = loaded.model, loaded.info
    layers = list(range(info.n_layers))
    length = len(encoded)
    steps: dict[str, list] = {"q": [], "k": [], "v": [], "errors": [], "scores": []}

    def layer_steps(layer: int, seen: dict[str, Any]) -> None:
        x, model_probs = seen["input"].double(), seen["probs"]
        w = adapters.layer_weights(model, layer).to_cpu().double()
        allowed = visible_keys(1, length, causal=info.causal, window=w.window)
        angles = rope_angles(w.rope, length) if w.rope is not None else None
        scale = w.scale if w.scale is not None else w.d_k**-0.5
        steps["scores"].append({"scale": scale, "softcap": w.softcap, "window": w.window})
        heads = [attention_head(x, w, h, allowed, angles) for h in range(w.n_heads)]
        for name in ("q", "k", "v"):
            rows = [getattr(head, name)[0].numpy() for head in heads]  # (T, d_k) each
            steps[name].append(np.stack(rows).astype(np.float32))  # (H, T, d_k)
        diff = (torch.stack([h.probs[0] for h in heads]) - model_probs[0].double()).abs()
        steps["errors"].append(diff.amax(dim=-1).numpy())  # (H, T)

    hooks = adapters.each_layer(model, layers, layer_steps, kinds=("input", "probs"))
    with hooks, torch.inference_mode():
        model.base_model(**pad(loaded, [encoded]))
    q, k, v, errors = (np.stack(steps[name]) for name in ("q", "k", "v", "errors"))
    return Inside(encoded.tokens, q, k, v, errors, tuple(steps["scores"]))


def inside_for(att, loaded: LoadedModel | None = None) -> Inside | str:
    """The inside-one-head numbers for an Attention's text, or why the page leaves them out
    (over INSIDE_BUDGET, or an architecture the from-scratch attention cannot read).

    Token level whatever the Attention's view (words, hidden specials): the formulas run on
    the model's tokens. Without `loaded`, the model is the Attention's, loaded once per process.
    """
    from attnviz.core.extract import encode
    from attnviz.core.models import DEFAULT_MODEL, cached_model
    from attnviz.errors import UnsupportedModelError

    if loaded is None:
        loaded = cached_model(None if att.info.name == DEFAULT_MODEL else att.info.name)
    truncated = any(n.startswith("truncated") for n in att.notes)
    encoded = encode(loaded, att.text, truncate=truncated, pair=att.pair)
    size = inside_size(att.info.n_layers, len(encoded), att.info.d_model)
    if size > INSIDE_BUDGET:
        return (
            f"left out: Q, K and V of every layer would add {size / 2**20:.1f} MiB to this page "
            f"(the limit is {INSIDE_BUDGET / 2**20:.0f} MiB); use a shorter text, or "
            "`attnviz check` for the numbers"
        )
    try:
        return inside_steps(loaded, encoded)
    except UnsupportedModelError as error:
        return f"left out: {error}"
