"""How each vision-language family lays its image tokens out over the picture: one module a
layout (`TYPES`, `read(ids, inputs, config, processor, size) -> (parts, marks)`), one line in
FAMILIES. `layout` reads a prompt's with its family's reader, or None for a family without
one (its text views are drawn; the picture's view is not, and the run says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnviz.core.layouts import idefics3, llava, llava_next, pooled, qwen2_vl
from attnviz.core.layouts.base import Inputs, Layout, Part

FAMILIES = (llava, llava_next, qwen2_vl, idefics3, pooled)
BY_TYPE = {kind: family for family in FAMILIES for kind in family.TYPES}

__all__ = ["BY_TYPE", "Layout", "Part", "layout"]


def layout(model_type: str, ids: Sequence[int], inputs: Inputs, config: Any, processor: Any,
           picture: Any, name: str) -> Layout | None:  # fmt: skip
    """Where each of the prompt's image tokens came from in `picture` (a PIL image), read by
    its family's reader; None where attnviz has no reader for `model_type`."""
    import numpy as np

    family = BY_TYPE.get(model_type)
    if family is None:
        return None
    parts, marks = family.read(list(ids), inputs, config, processor, picture.size)
    return Layout(model_type, np.asarray(picture), parts, marks, name)
