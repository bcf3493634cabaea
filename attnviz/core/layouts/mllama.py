"""Mllama (Llama 3.2 Vision): the picture resized to fit a canvas of tiles (the image
processor's best arrangement of rows × columns of its tile side, `aspect_ratio_ids`), padded
at the bottom and right, cut into those tiles row by row, and padded with empty tiles up to
`max_image_tiles` (`aspect_ratio_mask` 0). The prompt holds no token of the picture (its one
`<|image|>` says where it goes): the language model reads the vision tower's output in its
cross-attention layers, whose keys are every tile's tokens in turn, a CLS then the tile's
grid of patches (the tower's side ÷ its patch side a side; the tower's padding patches are
cut off before the language model reads them). `cross` maps each of those keys to its cell.
"""

from __future__ import annotations

from typing import Any

from attnviz.core.layouts.base import Inputs, Part

TYPES = ("mllama",)


def cross(inputs: Inputs, config: Any, processor: Any,
          size: tuple[int, int]) -> tuple[tuple[Part, ...], tuple[int, ...], int]:  # fmt: skip
    """One grid a tile of the picture (`tile r,c`) over the box of the picture the
    processor cut it from (past the picture where the tile holds padding), each tile's CLS a
    mark, and the number of keys: an empty tile's keys are neither (the model's mask hides
    them). ValueError where the processor's outputs are not one picture's."""
    from transformers.models.mllama.image_processing_pil_mllama import (
        get_all_supported_aspect_ratios,
        get_image_size_fit_to_canvas,
    )

    pixels = inputs["pixel_values"]  # (B, images, tiles, 3, side, side)
    if pixels.dim() != 6 or pixels.shape[1] != 1:
        raise ValueError(f"pixel values of shape {tuple(pixels.shape)} are not one picture's tiles")
    tiles, tile = int(pixels.shape[2]), int(pixels.shape[-1])
    images = processor.image_processor
    arrangements = get_all_supported_aspect_ratios(images.max_image_tiles)
    down, across = arrangements[int(inputs["aspect_ratio_ids"][0, 0]) - 1]  # tiles
    kept = int(inputs["aspect_ratio_mask"][0, 0].sum())
    if kept != down * across:
        raise ValueError(f"the processor's mask keeps {kept} tiles of a {down} × {across} "
                         "arrangement")  # fmt: skip
    vision = config.vision_config
    side = vision.image_size // vision.patch_size  # a tile's patches down and across
    each = side * side + 1  # a tile's keys: its CLS, then its grid
    width, height = size
    # the picture as the processor resized it onto the canvas (its top left)
    seen_h, seen_w = get_image_size_fit_to_canvas(height, width, down * tile, across * tile, tile)
    parts = []
    for n in range(down * across):
        row, col = divmod(n, across)
        box = (row * tile / seen_h, col * tile / seen_w,
               (row + 1) * tile / seen_h, (col + 1) * tile / seen_w)  # fmt: skip
        first = n * each + 1
        parts.append(Part(f"tile {row},{col}", tuple(range(first, first + side * side)),
                          (side, side), box))  # fmt: skip
    marks = tuple(n * each for n in range(down * across))
    return tuple(parts), marks, tiles * each
