"""`attnviz check`: recompute real layers with the from-scratch MHA and compare them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from attnviz.core.extract import Encoded
    from attnviz.core.mha import MHAResult
    from attnviz.core.models import LoadedModel, ModelInfo

DEFAULT_TOLERANCE = 1e-5


@dataclass(frozen=True)
class LayerCheck:
    """Max absolute errors of one layer: each head's probabilities, and the block's output."""

    layer: int
    head_errors: tuple[float, ...]
    output_error: float

    def passed(self, tolerance: float) -> bool:
        return max(self.head_errors) <= tolerance and self.output_error <= tolerance

    def failing_heads(self, tolerance: float) -> list[int]:
        return [h for h, error in enumerate(self.head_errors) if error > tolerance]


@dataclass(frozen=True)
class CheckResult:
    """The verdict of a check over some layers of one model, with the shapes of each step."""

    info: ModelInfo
    tokens: tuple[str, ...]
    tolerance: float
    layers: tuple[LayerCheck, ...]
    shapes: tuple[tuple[str, str, tuple[int, ...]], ...]  # (step, formula, shape)

    @property
    def passed(self) -> bool:
        return all(layer.passed(self.tolerance) for layer in self.layers)

    @property
    def max_error(self) -> float:
        return max(max(*lc.head_errors, lc.output_error) for lc in self.layers)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.info.as_dict(),
            "tokens": list(self.tokens),
            "tolerance": self.tolerance,
            "passed": self.passed,
            "max_error": self.max_error,
            "shapes": {name: list(shape) for name, _, shape in self.shapes},
            "layers": [
                {
                    "layer": lc.layer,
                    "head_errors": list(lc.head_errors),
                    "output_error": lc.output_error,
                    "passed": lc.passed(self.tolerance),
                }
                for lc in self.layers
            ],
        }


def compare(
    layer: int,
    model_probs: torch.Tensor,
    model_output: torch.Tensor,
    ours: MHAResult,
    key_mask: torch.Tensor,
) -> LayerCheck:
    """Max abs differences between the model's and our numbers, over real (unpadded) queries.

    model_probs (B, H, T, T), model_output (B, T, d_model), key_mask (B, T). The output's
    error is divided by its largest magnitude when that exceeds 1: a float32 model keeps about
    7 significant digits, so an output of 180 (SmolLM2 has some) is only known to ~1e-5.
    """
    real = key_mask.bool()  # (B, T): padded query rows are not part of any text
    probs_diff = (model_probs.double() - ours.probs).abs()  # (B, H, T, T)
    per_head = probs_diff.masked_fill(~real[:, None, :, None], 0).amax(dim=(0, 2, 3))  # (H,)
    output = model_output.double().masked_fill(~real[:, :, None], 0)  # (B, T, d_model)
    output_diff = (output - ours.output).abs().masked_fill(~real[:, :, None], 0)
    output_error = output_diff.max() / max(1.0, float(output.abs().max()))
    return LayerCheck(layer, tuple(float(e) for e in per_head), float(output_error))


def check_layers(
    loaded: LoadedModel, batch: Sequence[Encoded], layers: list[int]
) -> tuple[list[LayerCheck], tuple]:
    """Run the model once on a (padded) batch and check each chosen layer against our MHA.

    Each layer is checked as soon as the forward pass has produced its input, probabilities
    and output, and those are dropped: a long text's layers are never all held at once.
    """
    import torch

    from attnviz.core import adapters
    from attnviz.core.extract import pad
    from attnviz.core.mha import multi_head_attention

    model = loaded.model
    inputs = pad(loaded, batch)
    key_mask = inputs["attention_mask"].cpu()
    checks: dict[int, LayerCheck] = {}
    shapes: list[tuple] = []

    def check_layer(layer: int, seen: dict[str, Any]) -> None:
        weights = adapters.layer_weights(model, layer).to_cpu()
        ours = multi_head_attention(seen["input"], weights, key_mask, causal=loaded.info.causal)
        checks[layer] = compare(layer, seen["probs"], seen["output"], ours, key_mask)
        shapes[:] = ours.shapes

    hooks = adapters.each_layer(model, layers, check_layer)
    with hooks, torch.inference_mode():
        model.base_model(**inputs)
    return [checks[layer] for layer in layers], tuple(shapes)


def check(
    text: str,
    model: str | None = None,
    layers: list[int] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    truncate: bool = False,
    device: str = "auto",
) -> CheckResult:
    """Recompute the chosen layers (default: all) of `model` on `text` and compare."""
    from attnviz.core.extract import require_text
    from attnviz.core.models import refuse_early

    require_text(text)
    refuse_early(model, layers, None, text, truncate)

    from attnviz.core.extract import encode
    from attnviz.core.models import cached_model

    loaded = cached_model(model, device)
    chosen = loaded.info.pick_layers(layers)
    encoded = encode(loaded, text, truncate)
    checks, shapes = check_layers(loaded, [encoded], chosen)
    return CheckResult(loaded.info, encoded.tokens, tolerance, tuple(checks), shapes)
