"""The verdict of `check`: our from-scratch attention against the model's own numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from attnviz.core.mha import MHAResult
    from attnviz.core.model_info import ModelInfo

DEFAULT_TOLERANCE = 1e-5
# The tolerance `check` holds a model to by the dtype its layers compute in, and why. Our side
# is float64 from the model's own captured X and weights, so what is left is the model's own
# rounding: a half-precision model rounds its Q, K and scores before its softmax (a score's
# error grows with its size, and trained models have scores of 40 and more), and its
# probabilities after. docs/models.md has the errors measured on SmolLM2.
TOLERANCES = {
    "float32": (DEFAULT_TOLERANCE, "float32 keeps 24 significant bits (about 7 digits)"),
    "float16": (
        1e-2,
        "a float16 model rounds its scores to 11 significant bits before its softmax (a score "
        "of 40 by up to ±0.02) and its probabilities after",
    ),
    "bfloat16": (
        5e-2,
        "a bfloat16 model rounds its scores to 8 significant bits before its softmax (a score "
        "of 40 by up to ±0.16) and its probabilities after",
    ),
}


def tolerance_for(dtype: str) -> float:
    """The tolerance `check` holds a model whose layers compute in `dtype` to."""
    return TOLERANCES[dtype][0]


@dataclass(frozen=True)
class LayerCheck:
    """Max absolute errors of one layer: each head's probabilities, and the block's output."""

    layer: int
    head_errors: tuple[float, ...]
    output_error: float
    stack: str | None = None  # encoder-decoder models: "encoder", "decoder" or "cross"

    def passed(self, tolerance: float) -> bool:
        return max(self.head_errors) <= tolerance and self.output_error <= tolerance

    def failing_heads(self, tolerance: float) -> list[int]:
        return [h for h, error in enumerate(self.head_errors) if error > tolerance]


@dataclass(frozen=True)
class CheckResult:
    """The verdict of a check over some layers of one model, with the shapes of each step.

    An encoder-decoder model's result holds one result per stack checked (`stacks`, each
    with its stack's info, query tokens and steps; cross-attention's keys are the source's
    tokens); its own `layers` are all of theirs, `tokens` the source's and `target_tokens`
    the decoder's.
    """

    info: ModelInfo
    tokens: tuple[str, ...]
    tolerance: float
    layers: tuple[LayerCheck, ...]
    shapes: tuple[tuple[str, str, tuple[int, ...]], ...]  # (step, formula, shape)
    stack: str | None = None  # the stack these layers are of (None: the model's one)
    key_tokens: tuple[str, ...] | None = None  # cross-attention: the source's tokens
    stacks: tuple[CheckResult, ...] = ()  # encoder-decoder: one result per stack
    target_tokens: tuple[str, ...] = ()  # encoder-decoder: the decoder's tokens
    # the model's probabilities read a block of rows at a time from attnviz's attention
    # function (a long text), not whole from its eager attention
    in_blocks: bool = False

    @property
    def passed(self) -> bool:
        return all(layer.passed(self.tolerance) for layer in self.layers)

    @property
    def max_error(self) -> float:
        return max(max(*lc.head_errors, lc.output_error) for lc in self.layers)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"model": self.info.as_dict(), **self.info.ran(),
                                 "tokens": list(self.tokens)}  # fmt: skip
        if self.stacks:
            found["target_tokens"] = list(self.target_tokens)
        found.update(tolerance=self.tolerance, passed=self.passed, max_error=self.max_error,
                     probabilities="in blocks" if self.in_blocks else "eager")  # fmt: skip
        if self.stacks:
            found["stacks"] = [part._numbers() for part in self.stacks]
        else:
            found.update(self._numbers())
        return found

    def _numbers(self) -> dict[str, Any]:
        """The steps' shapes and each layer's errors (with the stack's name and its tokens,
        for one stack of an encoder-decoder model)."""
        found: dict[str, Any] = {}
        if self.stack is not None:
            found.update(stack=self.stack, passed=self.passed, max_error=self.max_error,
                         tokens=list(self.tokens))  # fmt: skip
            if self.key_tokens is not None:
                found["key_tokens"] = list(self.key_tokens)
        found["shapes"] = {name: list(shape) for name, _, shape in self.shapes}
        found["layers"] = [
            {
                **({"stack": lc.stack} if lc.stack is not None else {}),
                "layer": lc.layer,
                "head_errors": list(lc.head_errors),
                "output_error": lc.output_error,
                "passed": lc.passed(self.tolerance),
            }
            for lc in self.layers
        ]
        return found


def compare(
    layer: int,
    model_probs: torch.Tensor,
    model_output: torch.Tensor,
    ours: MHAResult,
    query_mask: torch.Tensor,
    stack: str | None = None,
) -> LayerCheck:
    """Max abs differences between the model's and our numbers, over real (unpadded) queries.

    model_probs (B, H, T, S), model_output (B, T, d_model), query_mask (B, T). The output's
    error is divided by its largest magnitude when that exceeds 1: a float32 model keeps about
    7 significant digits, so an output of 180 (SmolLM2 has some) is only known to ~1e-5.
    """
    real = query_mask.bool()  # (B, T): padded query rows are not part of any text
    padded = ~real[:, :, None]  # (B, T, 1)
    per_head = []  # a head at a time: one (B, T, S) float64 difference, not four (B, H, T, S)
    for head in range(model_probs.shape[1]):
        diff = model_probs[:, head].double().sub_(ours.probs[:, head]).abs_()  # (B, T, S)
        per_head.append(diff.masked_fill_(padded, 0).amax())
    output = model_output.double().masked_fill(~real[:, :, None], 0)  # (B, T, d_model)
    output_diff = (output - ours.output).abs().masked_fill(~real[:, :, None], 0)
    output_error = output_diff.max() / max(1.0, float(output.abs().max()))
    return LayerCheck(layer, tuple(float(e) for e in per_head), float(output_error), stack)
