"""How each vision-language family lays its image tokens out over the picture: one module a
layout (`TYPES`, `read(ids, inputs, config, processor, size) -> (parts, marks)`), one line in
FAMILIES. `layout` reads a prompt's with its family's reader, or None for a family without
one (its text views are drawn; the picture's view is not, and the run says so).

Each module also maps its family's vision tower's tokens to the same picture
(`tower(inputs, config, layout, before) -> (parts, marks, lengths)`: the tower's grid of
patches over the box of each image its layout has, after `before` tokens: CLIP's CLS): `tower`
reads it into a `Tower`.

A family whose language model reads the picture in cross-attention layers (Mllama's) has no
image tokens in its prompt (no `read`): its module maps the keys of those layers instead
(`cross(inputs, config, processor, size) -> (parts, marks, keys)`), read by `cross`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnviz.core.layouts import idefics3, llava, llava_next, mllama, pooled, qwen2_vl
from attnviz.core.layouts.base import Inputs, Layout, Part, Tower

FAMILIES = (llava, llava_next, qwen2_vl, idefics3, pooled, mllama)
BY_TYPE = {kind: family for family in FAMILIES for kind in family.TYPES}

__all__ = ["BY_TYPE", "Layout", "Part", "Tower", "cross", "layout", "tower"]


def layout(model_type: str, ids: Sequence[int], inputs: Inputs, config: Any, processor: Any,
           picture: Any, name: str) -> Layout | None:  # fmt: skip
    """Where each of the prompt's image tokens came from in `picture` (a PIL image), read by
    its family's reader; None where attnviz has no reader for `model_type` (or its prompt
    holds no image tokens: Mllama's, `cross`)."""
    import numpy as np

    family = BY_TYPE.get(model_type)
    if family is None or not hasattr(family, "read"):
        return None
    parts, marks = family.read(list(ids), inputs, config, processor, picture.size)
    return Layout(model_type, np.asarray(picture), parts, marks, name)


def cross(model_type: str, inputs: Inputs, config: Any, processor: Any, picture: Any,
          name: str) -> tuple[Layout, int] | None:  # fmt: skip
    """Where each key of the language model's cross-attention layers came from in `picture`
    (a PIL image), for a family that reads its picture so (Mllama's), and how many keys they
    have; None for any other family."""
    import numpy as np

    family = BY_TYPE.get(model_type)
    if family is None or not hasattr(family, "cross"):
        return None
    parts, marks, keys = family.cross(inputs, config, processor, picture.size)
    return Layout(model_type, np.asarray(picture), parts, marks, name), keys


def tower(model_type: str, inputs: Inputs, config: Any, layout: Layout, before: int) -> Tower:
    """Where each token of the vision tower sits on the picture of `layout` (the prompt's,
    by its family's reader), read by the family's map; the tower puts `before` tokens before
    its patches (CLIP's CLS: `images.prefix_labels`). ValueError, its reason in one line, for
    a family without a map."""
    family = BY_TYPE.get(model_type)
    if family is None or not hasattr(family, "tower"):
        raise ValueError("attnviz has no map of its vision tower's tokens")
    parts, marks, lengths = family.tower(inputs, config, layout, before)
    drawn = Layout(model_type, layout.pixels, parts, marks, layout.name)
    return Tower(drawn, tuple(lengths), int(config.vision_config.patch_size))
