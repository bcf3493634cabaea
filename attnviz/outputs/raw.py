"""attention.npz: the numbers `attnviz export --save-raw` writes for each text or picture."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.files import write_atomic

if TYPE_CHECKING:
    from attnviz.core.attention import Attention


def save_raw(
    att: Attention,
    path: Path,
    layers: list[int],
    heads: list[int],
    sides: dict[str, tuple[str, ...]] | None = None,
    tower: Any = None,
    cross: Attention | None = None,
) -> Path:
    """attention.npz: the weights as `attention` (l, h, T, T), or another measure's values
    under its name (`norm` (l, h, T, T); `alti`, `rollout` (l, T, T): one map per layer).

    A decoder's continuation adds `continuation_start` (its first token's index) and
    `token_probs` (each continuation token's probability).
    An encoder-decoder model's stack adds `stack`, `key_tokens` and `key_special` (the
    source's, for cross-attention: `attention` is (l, h, T_target, S_source)) and `sides`,
    its `source_tokens` and `target_tokens`.
    A picture adds `grid` (rows, cols of patches), `first_patch` (the first patch's token) and
    `patch` (pixels a side). A picture and a prompt's vision `tower` (`analysis.tower.TowerView`)
    adds `tower_maps` (tower layer, head, tower token) float32, what tower-layer-L.png draws
    (CLS's row, or each token's mean received attention: tower.json says which, and where
    each token sits). Mllama's `cross`-attention layers over the picture add
    `cross_attention` (cross layer, head, T, keys) float32, every cross layer and the chosen
    heads (cross.json says which key sits on which cell)."""
    import numpy as np

    more: dict[str, Any] = {}
    if att.stack is not None:
        more = {"stack": np.array(att.stack), "key_tokens": np.array(att.key_tokens),
                "key_special": att.key_special}  # fmt: skip
        more |= {name: np.array(tokens) for name, tokens in (sides or {}).items()}
    if att.picture is not None:
        more |= {"grid": np.array(att.picture.grid), "first_patch": np.array(att.picture.first),
                 "patch": np.array(att.picture.patch)}  # fmt: skip
    if tower is not None:
        more["tower_maps"] = tower.maps
    if cross is not None:
        more["cross_attention"] = cross.weights[:, heads]  # (cross layers, h, T, keys)
    if att.continuation is not None:
        more |= {"continuation_start": np.array(att.continuation.start),
                 "token_probs": np.array(att.continuation.probs, np.float32)}  # fmt: skip

    values = att.weights[np.ix_([att.slot(layer) for layer in layers], heads)]  # (l, h, T, T)
    if att.per_layer:
        values = values[:, 0]  # (l, T, T)
    key = "attention" if att.measure == "weights" else att.measure
    return write_atomic(
        path,
        lambda handle: np.savez(
            handle,
            **{key: values},
            measure=np.array(att.measure),
            tokens=np.array(att.tokens),
            special=att.special,
            layers=np.array(layers),
            heads=np.array(heads),
            **more,
        ),
    )


def layout_json(layout: Any) -> str:
    """layout.json: where each image token of a picture and a prompt sits on the picture
    (`core.layouts.Layout`): the picture's name and size (width, height), each part's grid
    (rows, cols), box (top, left, bottom, right, shares of the picture) and token indices
    row by row, the marks (image tokens that stand for no patch), and each cell's token by
    its label."""
    import json

    height, width = layout.pixels.shape[:2]
    parts = [{"name": part.name, "grid": list(part.grid), "box": list(part.box),
              "tokens": list(part.tokens)} for part in layout.parts]  # fmt: skip
    found = {"family": layout.family, "picture": layout.name, "size": [width, height],
             "parts": parts, "marks": list(layout.marks),
             "cells": {label: index for index, label in layout.labels().items()}}  # fmt: skip
    return json.dumps(found, ensure_ascii=False, indent=1)
