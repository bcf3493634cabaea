"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: the picture resized whole to a multiple of the patch
side, its patches merged `merge_size` × `merge_size` into one token each; the grid is the
processor's `image_grid_thw` (frames, patch rows, patch columns) over the merge size."""

from __future__ import annotations

from typing import Any

from attnviz.core.layouts.base import Inputs, Part, image_token, positions

TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def read(ids: list[int], inputs: Inputs, config: Any, processor: Any,
         size: tuple[int, int]) -> tuple[tuple[Part, ...], tuple[int, ...]]:  # fmt: skip
    """The one grid of merged patches (a picture is one frame)."""
    found = positions(ids, image_token(config, processor))
    _, rows, cols = (int(n) for n in inputs["image_grid_thw"][0])
    merge = getattr(processor.image_processor, "merge_size", None)
    merge = merge or config.vision_config.spatial_merge_size
    grid = (rows // merge, cols // merge)
    return (Part("", tuple(found), grid),), ()
