"""PaliGemma and Gemma 3: the picture resized whole to a square, its patches (PaliGemma's)
or their average over a square of them (Gemma 3's 64 × 64 pooled to 16 × 16) one token each,
row by row; Gemma 3's start and end of image around them. Their SigLIP tower reads the
resized picture as one sequence of patches, no CLS."""

from __future__ import annotations

from typing import Any

from attnviz.core.layouts.base import Inputs, Layout, Part, image_token, one_grid, positions, square

TYPES = ("paligemma", "gemma3")


def read(ids: list[int], inputs: Inputs, config: Any, processor: Any,
         size: tuple[int, int]) -> tuple[tuple[Part, ...], tuple[int, ...]]:  # fmt: skip
    """The one square grid of image tokens, and Gemma 3's start and end of image."""
    found = positions(ids, image_token(config, processor))
    grid = square(len(found), "image tokens")
    marks = []
    for name in ("boi_token_index", "eoi_token_index", "boi_token_id", "eoi_token_id"):
        token = getattr(config, name, None)
        if isinstance(token, int):
            marks += positions(ids, token)
    return (Part("", tuple(found), grid),), tuple(sorted(set(marks)))


def tower(inputs: Inputs, config: Any, layout: Layout, before: int) -> tuple:
    """The picture's sequence of patches over the whole picture. (Gemma 3's pan-and-scan
    crops would be sequences after it; its processor's defaults turn pan and scan off unless
    a call asks for it, and `vlm.encode` does not: none come.)"""
    return one_grid(inputs, config, layout.parts[0], before, inputs["pixel_values"].shape[0])
