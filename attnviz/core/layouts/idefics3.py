"""Idefics3 and SmolVLM: the picture stretched to whole sub-images (rows × cols of the
vision tower's side) and cut into them, then the whole picture squeezed into one more (the
global image); each sub-image's patches pixel-shuffled `scale_factor` × `scale_factor` into
one token each, row by row. The processor writes each sub-image as a fake token, its tag
(`<row_1_col_2>`, or `<global-img>` for the global image) and its image tokens; rows and
columns are read from the tags, as the processor wrote them. The vision tower reads each
sub-image as a sequence of its own (its own batch row), in the prompt's order: the
sub-image's grid of patches, no CLS."""

from __future__ import annotations

import re
from typing import Any

from attnviz.core.layouts.base import Inputs, Layout, Part, image_token, positions, square

TYPES = ("idefics3", "smolvlm")
TAG = re.compile(r"<row_(\d+)_col_(\d+)>")


def read(ids: list[int], inputs: Inputs, config: Any, processor: Any,
         size: tuple[int, int]) -> tuple[tuple[Part, ...], tuple[int, ...]]:  # fmt: skip
    """One grid a sub-image (`tile 0,1`: row 0, column 1) and the global image's
    (`global`); the fake tokens around them and their tags as marks."""
    fakes = positions(ids, processor.tokenizer.convert_tokens_to_ids(processor.fake_image_token))
    runs: list[list[int]] = []  # each sub-image's image tokens, in the prompt's order
    for index in positions(ids, image_token(config, processor)):
        if runs and runs[-1][-1] == index - 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    tags, marks = [], set(fakes)  # each run's tag: the tokens after the fake token before it
    for run in runs:
        start = max((fake for fake in fakes if fake < run[0]), default=run[0] - 1) + 1
        tags.append(TAG.search(processor.tokenizer.decode(ids[start : run[0]])))
        marks.update(range(start, run[0]))
    places = [(int(tag[1]) - 1, int(tag[2]) - 1) if tag else None for tag in tags]
    rows = max((place[0] for place in places if place), default=0) + 1
    cols = max((place[1] for place in places if place), default=0) + 1
    parts = []
    for run, place in zip(runs, places):
        grid = square(len(run), "image tokens of a sub-image")
        if place is None:  # the global image (`<global-img>`): the whole picture
            parts.append(Part("global", tuple(run), grid))
            continue
        row, col = place
        box = (row / rows, col / cols, (row + 1) / rows, (col + 1) / cols)
        parts.append(Part(f"tile {row},{col}", tuple(run), grid, box))
    return tuple(parts), tuple(sorted(marks))


def tower(inputs: Inputs, config: Any, layout: Layout, before: int) -> tuple:
    """One sequence a part of the prompt's layout, in its order: the sub-image's patches,
    the tower's patch side apart, over that part's box (SigLIP's: `before` is 0)."""
    from dataclasses import replace

    height, width = inputs["pixel_values"].shape[-2:]
    patch = config.vision_config.patch_size
    grid = (height // patch, width // patch)
    n = grid[0] * grid[1]
    parts = tuple(replace(part, tokens=tuple(range(i * n, (i + 1) * n)), grid=grid)
                  for i, part in enumerate(layout.parts))  # fmt: skip
    return parts, (), (n,) * len(parts)
