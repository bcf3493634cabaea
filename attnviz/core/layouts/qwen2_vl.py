"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: the picture resized whole to a multiple of the patch
side, its patches merged `merge_size` × `merge_size` into one token each; the grid is the
processor's `image_grid_thw` (frames, patch rows, patch columns) over the merge size. The
vision tower reads the patches before they merge, as one sequence in merge windows
(transformers' `get_vision_position_ids`: each patch's row and column, in the tower's
order); Qwen2.5-VL's in windows of them (`get_vision_window_index`), some layers attending
within a window alone."""

from __future__ import annotations

from typing import Any

from attnviz.core.layouts.base import Inputs, Layout, Part, image_token, positions

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


def tower(inputs: Inputs, config: Any, layout: Layout, before: int) -> tuple:
    """The tower's one sequence of patches (no token before them: `before` is 0), each on
    its cell of the grid of patches (`image_grid_thw`) over the whole picture, by the rows
    and columns the tower's rotary positions are made of (permuted into windows where the
    config has them)."""
    from dataclasses import replace

    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    vision, grid_thw = config.vision_config, inputs["image_grid_thw"][:1]
    merge = vision.spatial_merge_size
    places = get_vision_position_ids(grid_thw, merge)  # (N, 2): (row, col), the tower's order
    if getattr(vision, "fullatt_block_indexes", None) is not None:  # Qwen2.5-VL's windows
        order, _ = get_vision_window_index(grid_thw, merge, vision.window_size, vision.patch_size)
        places = places.view(-1, merge * merge, 2)[order].reshape(-1, 2)
    _, rows, cols = (int(n) for n in grid_thw[0])
    if len(places) != rows * cols:
        raise ValueError(f"{len(places)} patches of the tower are no one frame of {rows} × {cols}")
    tokens = [0] * (rows * cols)  # each cell's token, row by row
    for token, (row, col) in enumerate(places.tolist()):
        tokens[row * cols + col] = token
    part = replace(layout.parts[0], tokens=tuple(tokens), grid=(rows, cols))
    return (part,), (), (len(tokens),)
