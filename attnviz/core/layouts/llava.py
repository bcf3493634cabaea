"""LLaVA: the picture's crop as one grid of patches, the vision tower's patch side apart
(336 / 14: 24 × 24), the CLS feature dropped (`vision_feature_select_strategy` "default")
or kept as one more token before the grid ("full"). Its CLIP tower reads the crop as one
sequence: CLS, then the grid."""

from __future__ import annotations

from typing import Any

from attnviz.core.layouts.base import (
    Inputs,
    Layout,
    Part,
    image_token,
    one_grid,
    positions,
    seen_box,
)

TYPES = ("llava", "vipllava")


def read(ids: list[int], inputs: Inputs, config: Any, processor: Any,
         size: tuple[int, int]) -> tuple[tuple[Part, ...], tuple[int, ...]]:  # fmt: skip
    """The one grid of the prompt's image tokens, and the CLS token's index where it is kept."""
    found = positions(ids, image_token(config, processor))
    height, width = inputs["pixel_values"].shape[-2:]
    patch = config.vision_config.patch_size
    grid = (height // patch, width // patch)
    marks = tuple(found[: len(found) - grid[0] * grid[1]])  # the CLS feature, if kept
    cells = tuple(found[len(marks) :])
    return (Part("", cells, grid, seen_box(processor.image_processor, size)),), marks


def tower(inputs: Inputs, config: Any, layout: Layout, before: int) -> tuple:
    """The tower's one sequence, its CLS a mark, its grid over the crop."""
    return one_grid(inputs, config, layout.parts[0], before)
