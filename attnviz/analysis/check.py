"""The verdict of `check`: our from-scratch attention against the model's own numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from attnviz.core.mha import MHAResult
    from attnviz.core.models import ModelInfo

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
