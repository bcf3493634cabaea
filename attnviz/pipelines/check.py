"""`attnviz check`: recompute real layers with the from-scratch MHA and compare them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnviz.analysis.check import DEFAULT_TOLERANCE, CheckResult, LayerCheck, compare

if TYPE_CHECKING:
    from attnviz.core.attention import Encoded
    from attnviz.core.models import LoadedModel, Model


def check_layers(
    loaded: LoadedModel, batch: Sequence[Encoded], layers: list[int]
) -> tuple[list[LayerCheck], tuple]:
    """Run the model once on a (padded) batch and check each chosen layer against our MHA.

    Each layer is checked as soon as the forward pass has produced its input, probabilities
    and output, and those are dropped: a long text's layers are never all held at once.
    """
    from attnviz.core import adapters, capture
    from attnviz.core.mha import multi_head_attention
    from attnviz.core.tokens import pad

    inputs = pad(loaded, batch)
    key_mask = inputs["attention_mask"].cpu()
    checks: dict[int, LayerCheck] = {}
    shapes: list[tuple] = []

    def check_layer(layer: int, seen: dict[str, Any]) -> None:
        weights = adapters.layer_weights(loaded.model, layer).to_cpu()
        ours = multi_head_attention(seen["input"], weights, key_mask, causal=loaded.info.causal)
        checks[layer] = compare(layer, seen["probs"], seen["output"], ours, key_mask)
        shapes[:] = ours.shapes

    capture.run(loaded, inputs, [capture.Each(layers, ("input", "probs", "output"), check_layer)])
    return [checks[layer] for layer in layers], tuple(shapes)


def check(
    model: Model,
    text: str,
    layers: list[int] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    truncate: bool = False,
) -> CheckResult:
    """Recompute the chosen layers (default: all) of `model` on `text` and compare."""
    from attnviz.core.attention import require_text

    require_text(text)
    model.refuse_early(layers, None, text, truncate)

    from attnviz.core.tokens import encode

    loaded = model.load()
    chosen = loaded.info.pick_layers(layers)
    encoded = encode(loaded, text, truncate)
    checks, shapes = check_layers(loaded, [encoded], chosen)
    return CheckResult(loaded.info, encoded.tokens, tolerance, tuple(checks), shapes)
