"""LLaVA-NeXT ("anyres"): the whole picture squeezed to one tile (the base grid), then the
picture resized into the best of the config's `image_grid_pinpoints` and cut into tiles,
their cells put side by side, the rows and columns that are only padding dropped
(unpadding), and an `image_newline` token after each row of cells.

The tiles and the unpadding are transformers' own functions, run on a grid of cell numbers,
so the cells kept are the model's; the picture's place on the tiles is its processor's.
Its CLIP tower reads the base image and each tile as a sequence of its own (CLS, then the
grid), the base first, each drawn over the box of the picture it covers."""

from __future__ import annotations

from typing import Any

from attnviz.core.layouts.base import Inputs, Layout, Part, image_token, one_grid, positions

TYPES = ("llava_next",)


def read(ids: list[int], inputs: Inputs, config: Any, processor: Any,
         size: tuple[int, int]) -> tuple[tuple[Part, ...], tuple[int, ...]]:  # fmt: skip
    """The base grid (`global`), the grid of the tiles' cells that show the picture
    (`tiles`), and each row's newline token as a mark."""
    import torch
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.modeling_llava_next import (
        get_anyres_image_grid_shape,
        unpad_image,
    )

    found = positions(ids, image_token(config, processor))
    vision = config.vision_config
    side = vision.image_size // vision.patch_size  # a tile's cells down and across
    height, width = (int(n) for n in inputs["image_sizes"][0])
    down, across = get_anyres_image_grid_shape((height, width), config.image_grid_pinpoints,
                                               vision.image_size)  # fmt: skip
    numbers = torch.arange(down * side * across * side).view(1, down * side, across * side)
    kept = unpad_image(numbers, (height, width))[0]  # (rows, cols): the cells kept
    rows, cols = kept.shape
    base, rest = found[: side * side], found[side * side :]
    if len(rest) != rows * (cols + 1):
        raise ValueError(f"{len(found)} image tokens are not LLaVA-NeXT's {side} × {side} base "
                         f"and {rows} rows of {cols} cells and a newline")  # fmt: skip
    newlines = rest[cols :: cols + 1]  # each row's last token
    cells = tuple(sorted(set(rest) - set(newlines)))
    first = divmod(int(kept[0, 0]), across * side)  # the first kept cell's row and column
    best = select_best_resolution((height, width), config.image_grid_pinpoints)
    box = _box((*first, rows, cols), (down * side, across * side), best, (height, width))
    return (Part("global", tuple(base), (side, side), _base_box(processor.image_processor)),
            Part("tiles", cells, (rows, cols), box)), tuple(newlines)  # fmt: skip


def _box(kept: tuple[int, int, int, int], canvas: tuple[int, int], best: tuple[int, int],
         picture: tuple[int, int]) -> tuple[float, float, float, float]:  # fmt: skip
    """The box of the picture the kept cells cover (`kept`: first row and column, rows and
    columns, of a `canvas` of cells over the `best` resolution's pixels): the processor
    resizes the picture to fit `best` and pads it evenly around. Whole cells are kept, so the
    box may reach a little past the picture (into the padding)."""
    import math

    (top, left, rows, cols), (height, width) = kept, picture
    # as the processor's get_patch_output_size: the side that fits exactly, the other rounded up
    if best[1] / width < best[0] / height:
        placed = (min(math.ceil(height * (best[1] / width)), best[0]), best[1])
    else:
        placed = (best[0], min(math.ceil(width * (best[0] / height)), best[1]))
    spans = []  # (start, end) down, then across
    for start, count, cells, full, seen in zip((top, left), (rows, cols), canvas, best, placed):
        pad, cell = (full - seen) // 2, full / cells
        spans.append(((start * cell - pad) / seen, ((start + count) * cell - pad) / seen))
    return (spans[0][0], spans[1][0], spans[0][1], spans[1][1])


def _base_box(image_processor: Any) -> tuple[float, float, float, float]:
    """The box of the picture the base grid covers: the picture squeezed whole to a square
    of the processor's size, then centre-cropped to its crop size."""
    size = image_processor.size
    side = size.get("height") or size.get("shortest_edge")
    crop = getattr(image_processor, "crop_size", None)
    if not getattr(image_processor, "do_center_crop", False) or not crop or not side:
        return (0.0, 0.0, 1.0, 1.0)
    top, left = (max(side - crop["height"], 0) / 2 / side, max(side - crop["width"], 0) / 2 / side)
    return (top, left, 1 - top, 1 - left)


def tower(inputs: Inputs, config: Any, layout: Layout, before: int) -> tuple:
    """The base image's sequence over the base grid's box, then each tile's (as many as
    transformers' `image_size_to_num_patches` cuts), row by row over the picture resized into
    the best of `image_grid_pinpoints` and padded evenly around: each tile's grid over the box
    of the picture it was cut from (reaching past it where the tile holds padding), each
    sequence's first `before` tokens (CLIP's CLS) marks."""
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    height, width = (int(n) for n in inputs["image_sizes"][0])
    vision = config.vision_config
    count = image_size_to_num_patches((height, width), config.image_grid_pinpoints,
                                      vision.image_size)  # fmt: skip
    (base,), marks, lengths = one_grid(inputs, config, layout.parts[0], before, count)
    best = select_best_resolution((height, width), config.image_grid_pinpoints)
    down, across = best[0] // vision.image_size, best[1] // vision.image_size
    if count != 1 + down * across:
        raise ValueError(f"{count} sequences of the tower are not LLaVA-NeXT's base image and "
                         f"{down} × {across} tiles")  # fmt: skip
    side, n = base.grid[0], lengths[0]  # a tile's cells a side; a sequence's tokens
    parts = [base]
    for tile in range(down * across):
        row, col = divmod(tile, across)
        box = _box((row * side, col * side, side, side), (down * side, across * side), best,
                   (height, width))  # fmt: skip
        first = (1 + tile) * n + before
        parts.append(Part(f"tile {row},{col}", tuple(range(first, first + side * side)),
                          base.grid, box))  # fmt: skip
    marks = tuple(seq * n + i for seq in range(count) for i in range(before))
    return tuple(parts), marks, lengths
