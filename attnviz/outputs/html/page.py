"""Build the page: the attention data packed small, with the package's page.js and page.css
inlined, under a Content-Security-Policy that allows nothing from outside the file.

Weights travel per head, deflated and base64-encoded, so the browser decodes a head only when
a view shows it (`DecompressionStream`). Up to EXACT_BUDGET raw bytes they are float32, the
model's own numbers; past it each head is quantised to uint8 steps of its maximum (error at
most max/510, and the page says so wherever it prints a weight).

An encoder-decoder model's page carries its three attention stacks (`stacks`: encoder,
decoder and cross-attention), each with its own query and key tokens, counts, blobs and
inside-one-head numbers; the page opens on the one given as `att` and switches between them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import zlib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core.layer_map import STACKS  # an encoder-decoder page's stacks, in order
from attnviz.outputs.figures import (
    LABEL_STEPS,
    MASKED_GREY,
    MASKED_HATCH_COLOUR,
    MASKED_NOTE,
    REMOVED_HATCH_COLOUR,
    REMOVED_NOTE,
)
from attnviz.outputs.files import write_text_atomic

if TYPE_CHECKING:
    import numpy as np

    from attnviz.analysis.inside import Inside
    from attnviz.analysis.tower import TowerView
    from attnviz.core.attention import Attention

EXACT_BUDGET = 4 * 2**20  # float32 weights up to 4 MiB (≈120 tokens on 6 × 12 heads)
STACKS_LEFT_OUT = (
    "The measure switch is not on encoder-decoder pages yet: this page shows the attention weights."
)
NO_MODEL = "left out: the page was built without the model at hand"

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<noscript>This page draws attention with JavaScript; allow scripts for this local file.</noscript>
<script type="application/json" id="attnviz-data">{data}</script>
{scripts}
</body>
</html>
"""


def _asset(name: str) -> str:
    return resources.files("attnviz.outputs.html").joinpath(name).read_text(encoding="utf-8")


def _packed(array: np.ndarray) -> str:
    """Little-endian bytes of `array`, deflated (zlib) and base64-encoded."""
    return base64.b64encode(zlib.compress(array.tobytes(), 6)).decode("ascii")


def _head_blob(grid: np.ndarray, exact: bool) -> str:
    """One head (T, S; S is T but in cross-attention): float32 as it is, or the head's max
    (float32) then uint8 steps of it.

    Steps of the head's max rather than of each row's: diffuse rows then take few distinct
    bytes and deflate well (5 MB instead of 11 MB for 512 tokens on 6 × 12 heads).
    """
    import numpy as np

    if exact:
        return _packed(grid.astype("<f4"))
    top = np.array([grid.max()], dtype="<f4")
    steps = np.rint(grid / (top[0] if top[0] > 0 else 1) * 255).astype(np.uint8)
    return _packed(np.concatenate([top.view(np.uint8), steps.ravel()]))


def _colour_table(cmap: str) -> str:
    """The colour map as 256 hex RGB triples, so the page colours as the PNGs do."""
    import matplotlib

    colours = matplotlib.colormaps[cmap](range(256), bytes=True)  # (256, 4) uint8
    return "".join(f"{r:02x}{g:02x}{b:02x}" for r, g, b, _ in colours)


def _measures(
    att: Attention, measures: dict[str, Attention], lengths: np.ndarray | None, exact: bool
) -> dict[str, Any]:
    """The page's other measures: `norm` as each key's ‖f^h(x_j)‖ (L, H, T), which the page
    multiplies into the weights (exact, and T numbers a head instead of T²), or as blobs where
    the weights were merged into words; `alti` and `rollout` as one blob a layer."""
    from attnviz.analysis.contributions import MEASURES

    out: dict[str, Any] = {}
    for name, other in measures.items():
        measure = MEASURES[name]
        entry: dict[str, Any] = {
            "unit": measure.unit,
            "help": measure.help,
            "cite": measure.cite,
            "per_layer": measure.per_layer,
            "top": float(other.weights.max()) if not measure.summed else 1.0,
        }
        if name == "norm" and lengths is not None:
            entry["lengths"] = [[_packed(per.astype("<f4")) for per in layer] for layer in lengths]
        else:
            small = exact or measure.per_layer  # L maps, not L × H: float32 where it fits
            entry["encoding"] = (
                "float32"
                if small and other.weights[..., :1].size * len(other.tokens) * 4 <= EXACT_BUDGET
                else "uint8"
            )
            entry["blobs"] = [
                [_head_blob(per, entry["encoding"] == "float32") for per in layer]
                for layer in other.weights
            ]
        out[name] = entry
    return out


def page_data(
    att: Attention,
    inside: Inside | str | Mapping[str, Inside | str] | None = None,
    scale: str = "absolute",
    cmap: str = "viridis",
    segments: tuple[int, ...] | None = None,
    measures: dict[str, Attention] | None = None,
    lengths: np.ndarray | None = None,
    initial: str = "weights",
    stacks: dict[str, Attention] | None = None,
    tower: TowerView | None = None,
    cross: Attention | None = None,
) -> dict[str, Any]:
    """Everything the page script reads, as JSON-ready values.

    `att` holds the weights; `measures` the contribution measures by name (the page's
    measure switch offers those given), `lengths` each key's ‖f^h(x_j)‖ (L, H, T) for norm,
    and `initial` the measure the page opens with. `tower`, a vision-language model's vision
    tower's heads (`tower_entry`); `cross`, the cross-attention layers over the picture of a
    model that reads it there (Mllama's: `cross_entry`). With `stacks` (an encoder-decoder
    model's), see `stacks_data`; `inside` is then each stack's, by name.
    """
    from attnviz.analysis.inside import Inside

    if stacks is not None:
        if measures or lengths is not None or segments or isinstance(inside, Inside):
            raise ValueError("an encoder-decoder page shows weights only: no measures, "
                             "lengths or segments; its inside views by stack name")  # fmt: skip
        return stacks_data(att, stacks, scale, cmap, inside)
    if att.keys is not None:  # a single-stack page would label its keys with the queries
        raise ValueError("a cross-attention page needs all three stacks: pass stacks=")

    n_layers, n_heads, n_tokens, _ = att.weights.shape  # (L, H, T, T)
    exact = att.weights[..., :1].size * n_tokens * 4 <= EXACT_BUDGET
    data: dict[str, Any] = {
        **page_frame(att, scale, cmap),
        "pair": att.pair,
        "tokens": list(att.tokens),
        "special": [bool(s) for s in att.special],
        "segments": list(segments) if segments else None,
        "layers": n_layers,
        "layer_ids": att.held_layers(),  # the model layer of each slot of `weights`
        "heads": n_heads,
        "encoding": "float32" if exact else "uint8",
        "weights": [
            [_head_blob(att.weights[lay, h], exact) for h in range(n_heads)]
            for lay in range(n_layers)
        ],
        "inside": None,
        "measure": initial,
        "measures": _measures(att, measures or {}, lengths, exact),
        "continuation": continuation_entry(att),
    }
    if att.picture is not None:  # a picture's view over it, or why the page has none
        entry = picture_entry(att)
        if isinstance(entry, str):
            data["notes"].append(entry)
        else:
            data["picture"] = entry
    if att.layout is not None:  # a vision-language model's answer over its picture
        entry = layout_entry(att)
        if isinstance(entry, str):
            data["notes"].append(entry)
        else:
            data["layout"] = entry
    if cross is not None:  # Mllama's cross-attention layers over the picture
        data["cross"] = cross_entry(cross)
    if tower is not None:  # its vision tower's heads over the picture
        data["tower"] = tower_entry(tower)
    if isinstance(inside, Inside):
        data["inside"] = _inside_entry(inside)
    else:
        data["inside_note"] = inside or NO_MODEL
    return data


def continuation_entry(att: Attention) -> dict[str, Any] | None:
    """A decoder's continuation for the page (`--generate`, `--target`): where it starts (in
    tokens and in the text's characters), each token's probability, and how it came."""
    c = att.continuation
    if c is None:
        return None
    first = att.span[0] if att.span else 0
    # a pooled map's or a window's rows are not the text's tokens: marked, not stepped through
    exact = att.pool_size == 1 and first == 0
    return {**c.as_dict(), "start": (c.start - first) / att.pool_size, "text_at": c.text_at,
            "line": c.describe(att.unit), "steps": exact}  # fmt: skip


def _cut_down(att: Attention, whose: str) -> str:
    """Why a page whose maps are pooled or a window has no view over the picture."""
    how = att.pooling() or f"tokens {att.span[0]}–{att.span[1] - 1} of {att.token_counts()[0]}"
    return (f"No view over the picture on this page: its maps are cut down ({how}), so a "
            f"row is not one {whose}'s; the PNGs over the picture are exact.")  # fmt: skip


def picture_entry(att: Attention) -> dict[str, Any] | str:
    """A vision model's picture for the view over it (picture.js): the pixels its patches
    cover as the model saw them (RGB, deflated) and its patch grid; or why the page goes
    without that view (a pooled map's or a window's rows are not the patches' own)."""
    picture = att.picture
    if att.pooled is not None or att.span is not None:
        return _cut_down(att, "patch")
    rows, cols = picture.grid
    height, width = rows * picture.patch, cols * picture.patch
    pixels = picture.pixels[:height, :width]  # (H, W, 3) uint8; pixels no patch covers are cut
    return {
        "name": picture.name,
        "grid": [rows, cols],
        "first": picture.first,
        "patch": picture.patch,
        "size": [width, height],
        "cut": list(picture.pixels.shape[:2]) != [height, width],
        "pixels": _packed(pixels.astype("u1", copy=False)),
    }


LAYOUT_SIDE = 224  # a vision-language page's picture: its longer side at most, in pixels


def layout_entry(att: Attention) -> dict[str, Any] | str:
    """A vision-language model's picture for the view of its answer over it (answer.js):
    the picture at the page's size (RGB, deflated), each part's image tokens and the edges
    of their cells on it (`Layout.edges`), and the rows each view reads (`answer_views`).
    Or why the page goes without it (a pooled map's or a window's rows are not tokens')."""
    if att.pooled is not None or att.span is not None:
        return _cut_down(att, "token")
    image = att.layout.image_tokens()
    return {**over_picture(att.layout), "image_tokens": image, "views": answer_views(att)}


def cross_entry(cross: Attention) -> dict[str, Any]:
    """The cross-attention layers over the picture (Mllama's: `core.cross_picture`) for the
    answer's view (answer.js), with their own weights: the picture and each tile's keys on
    its cells (`over_picture`), the rows each view reads (`answer_views`, the shares on the
    patches), and every head's rows over the keys, (T, S) a head, float32 where the layers
    fit EXACT_BUDGET, else uint8 steps. Never pooled: a row is the token's own."""
    from attnviz.analysis.picture_share import shared

    n_layers, n_heads, _, n_keys = cross.weights.shape  # (cross layers, H, T, S)
    exact = cross.weights.size * 4 <= EXACT_BUDGET
    return {
        **over_picture(cross.layout),
        "image_tokens": shared(cross),
        "views": answer_views(cross),
        "keys": n_keys,
        "layers": n_layers,
        "layer_ids": cross.held_layers(),
        "heads": n_heads,
        "encoding": "float32" if exact else "uint8",
        "weights": [[_head_blob(per_head, exact) for per_head in layer] for layer in cross.weights],
    }


def answer_views(att: Attention) -> list[dict[str, Any]]:
    """The rows each view of the answer reads: the answer's (the mean of the rows that wrote
    its tokens; the prompt's last row where there is none), then each answer token's, the
    row that wrote it; with the share of each on the picture (its patches, in
    cross-attention: `picture_share.shared`), (L, H)."""
    from attnviz.analysis.picture_share import answer_rows, shared, whose_rows

    on_picture = att.weights[..., shared(att)].sum(axis=-1)  # (L, H, T): each row's share

    def view(label: str, rows: tuple[int, ...], about: str) -> dict[str, Any]:
        share = on_picture[:, :, list(rows)].mean(axis=-1)  # (L, H)
        return {"label": label, "rows": list(rows), "about": about, "share": share.tolist()}

    views = [view("the answer" if att.continuation else "the prompt's end", answer_rows(att),
                  whose_rows(att))]  # fmt: skip
    if att.continuation is not None:
        views += [view(att.tokens[t], (t - 1,), f"as it wrote {att.tokens[t]}@{t}, the row "
                       f"before it ({t - 1})") for t in range(att.continuation.start,
                                                              len(att.tokens))]  # fmt: skip
    return views


def over_picture(layout: Any) -> dict[str, Any]:
    """A layout's picture for a view of rows drawn over it (blobs.js's overlay): the picture
    at the page's size (its longer side at most LAYOUT_SIDE; RGB, deflated), and each part's
    tokens and the edges of their cells on it (`Layout.edges`)."""
    import numpy as np

    from attnviz.outputs.figures.pictures import resized

    height, width = layout.pixels.shape[:2]
    scale = min(1.0, LAYOUT_SIDE / max(height, width))
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    return {
        "name": layout.name,
        "given": [int(width), int(height)],
        "size": [size[1], size[0]],  # width, height
        "pixels": _packed(np.ascontiguousarray(resized(layout.pixels, size), dtype="u1")),
        "parts": [
            {
                "name": part.name,
                "tokens": list(part.tokens),
                "grid": list(part.grid),
                "ys": ys.tolist(),
                "xs": xs.tolist(),
            }
            for part, (ys, xs) in zip(layout.parts, layout.edges(size))
        ],  # fmt: skip
    }


def tower_entry(view: TowerView) -> dict[str, Any]:
    """A vision-language model's vision tower for the view of its heads over the picture
    (tower.js), from `analysis.tower.TowerView`: the picture and its patches' cells
    (`over_picture`), and per tower layer its heads' drawn rows over the tower's tokens (CLS's
    row where `cls`, else each token's mean received attention), (H, N) float32 deflated,
    with each head's role, mean attention distance in pixels and CLS's share on the patches.
    Its size grows with layers × heads × tower tokens, not with their square."""
    tower = view.tower
    cells = tower.layout.cells()
    return {
        **over_picture(tower.layout),
        "tokens": int(view.maps.shape[2]),
        "layers": view.n_layers,
        "patch": tower.patch,
        "cls": view.cls,
        "uniform": view.uniform,
        "maps": [_packed(maps.astype("<f4")) for maps in view.maps],  # (H, N) a layer
        "heads": [
            [
                {
                    "role": head.role,
                    "distance": head.distance,
                    "on_patches": float(view.maps[layer, head.head][cells].sum()),
                }
                for head in view.layer(layer)
            ]
            for layer in range(view.n_layers)
        ],
    }


def page_frame(att: Attention, scale: str, cmap: str) -> dict[str, Any]:
    """What every one-stack page says around its heads: the model, the text and how it is
    shown, the colours, and the heads the pass removed."""
    return {
        "model": att.info.as_dict(),
        "text": att.text,
        "unit": att.unit,
        "hidden_special": att.hidden_special,
        "notes": list(att.notes),
        "scale": scale,
        "cmap": cmap,
        "colours": _colour_table(cmap),
        # A causal model's keys after the query, drawn as in the PNGs.
        "masked": {"grey": MASKED_GREY, "hatch": MASKED_HATCH_COLOUR, "note": MASKED_NOTE},
        "label_steps": list(LABEL_STEPS),  # thinned labels on round steps, as in the PNGs
        # Heads the pass removed (show --ablate): every view marks them instead of a pattern.
        "removed": {
            "heads": [[layer, head] for layer, head in att.removed],
            "hatch": REMOVED_HATCH_COLOUR,
            "note": REMOVED_NOTE,
        },
    }


def _inside_entry(inside: Inside) -> dict[str, Any]:
    """The inside view's numbers: every model layer's Q_h, K_h, V_h per head, the errors and
    each layer's score settings; a stack's also its key tokens (cross-attention: the source's)
    and T5's relative position bias B_h (one (T, S) blob a head, every layer's)."""
    entry: dict[str, Any] = {
        "tokens": list(inside.tokens),
        "d_k": int(inside.q.shape[-1]),
        **{
            name: [
                [_packed(per_head.astype("<f4")) for per_head in per_layer]
                for per_layer in getattr(inside, name)
            ]  # every model layer
            for name in ("q", "k", "v")
        },
        "errors": _packed(inside.errors.astype("<f8")),
        "scores": list(inside.scores),  # per layer: scale, softcap, window, band
    }
    if inside.stack is not None:
        entry["heads"] = int(inside.q.shape[1])
        entry["key_tokens"] = list(inside.key_tokens or inside.tokens)
        entry["bias"] = (
            None if inside.bias is None else [_packed(per.astype("<f4")) for per in inside.bias]
        )
    return entry


def stacks_data(
    att: Attention,
    stacks: dict[str, Attention],
    scale: str = "absolute",
    cmap: str = "viridis",
    inside: Mapping[str, Inside | str] | str | None = None,
) -> dict[str, Any]:
    """An encoder-decoder page's data: each stack's query and key tokens, its layers, heads
    and blobs (cross-attention's (T, S) per head), opening on `att`'s stack.

    `stacks` holds the three stacks' Attentions by name; `att` is one of them (the stack
    `show --stack` chose; cross-attention by default) and stands for its own entry.
    `inside` holds each stack's inside-one-head numbers or why they are left out
    (`analysis.inside.StacksInside`), or one reason for all three. The three share the
    one-stack page's budget for Q, K and V (`INSIDE_BUDGET`): past it, every stack goes
    without the view and says why.
    """
    from attnviz.analysis.inside import Inside, left_out

    stacks = {**stacks, att.stack: att}
    if att.stack is None or sorted(stacks) != sorted(STACKS):
        raise ValueError(f"an encoder-decoder page needs the stacks {', '.join(STACKS)}")
    if isinstance(inside, Mapping):
        given = [found for found in inside.values() if isinstance(found, Inside)]
        size = sum(found.q.size + found.k.size + found.v.size for found in given) * 4  # float32
        inside = left_out(size, "every layer of 3 stacks") or inside
    # One encoding for the whole page: float32 while the three stacks fit the budget together.
    exact = sum(stacks[name].weights.size for name in STACKS) * 4 <= EXACT_BUDGET
    return {
        "model": att.info.as_dict(),
        "text": att.text,
        "target": att.target,
        "pair": None,
        "unit": att.unit,
        "hidden_special": att.hidden_special,
        "notes": list(att.notes),
        "stack": att.stack,
        "stacks": {
            name: _stack_entry(stacks[name], exact, _of_stack(inside, name)) for name in STACKS
        },
        "scale": scale,
        "cmap": cmap,
        "colours": _colour_table(cmap),
        "masked": {"grey": MASKED_GREY, "hatch": MASKED_HATCH_COLOUR, "note": MASKED_NOTE},
        "label_steps": list(LABEL_STEPS),
        "segments": None,
        "inside": None,
        "measures_note": STACKS_LEFT_OUT,
        "measure": "weights",
        "measures": {},
    }


def _of_stack(inside: Mapping[str, Inside | str] | str | None, stack: str) -> Inside | str:
    """One stack's inside numbers, or why the page goes without them."""
    if isinstance(inside, Mapping):
        return inside.get(stack) or NO_MODEL
    return inside or NO_MODEL


def _stack_entry(att: Attention, exact: bool, inside: Inside | str) -> dict[str, Any]:
    """One stack of an encoder-decoder page: its queries, keys, counts, weights and inside
    view (or why it is left out)."""
    from attnviz.analysis.inside import Inside

    n_layers, n_heads = att.weights.shape[:2]  # (L, H, T, S)
    if isinstance(inside, Inside) and inside.stack != att.stack:
        raise ValueError(f"the {att.stack} stack's inside view is the {inside.stack} stack's")
    return {
        "tokens": list(att.tokens),
        "special": [bool(s) for s in att.special],
        "key_tokens": list(att.key_tokens),
        "key_special": [bool(s) for s in att.key_special],
        "causal": att.info.causal,
        "layers": n_layers,
        "layer_ids": att.held_layers(),
        "heads": n_heads,
        "encoding": "float32" if exact else "uint8",
        "weights": [[_head_blob(per_head, exact) for per_head in layer] for layer in att.weights],
        "inside": _inside_entry(inside) if isinstance(inside, Inside) else None,
        "inside_note": None if isinstance(inside, Inside) else inside,
    }


def shortened(text: str, length: int) -> str:
    """`text` on one line, cut at a word boundary to at most `length` characters (with "…")."""
    text = " ".join(text.split())
    if len(text) <= length:
        return text
    cut = text[: length - 1]
    if " " in cut[length // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:.") + "…"


def page_title(att: Attention) -> str:
    """The page's <title>: the text, both sentences of a pair, or source → target, shortened."""
    if att.target is not None:
        return f"attnviz: {shortened(att.text, 45)} → {shortened(att.target, 45)}"
    if att.pair is None:
        return f"attnviz: {shortened(att.text, 70)}"
    return f"attnviz: A: {shortened(att.text, 45)} | B: {shortened(att.pair, 45)}"


def _csp_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def build_page(att: Attention, **options: Any) -> str:
    """The whole page for one text: data, script and style inline; nothing loads from outside.
    `options` are `page_data`'s: the inside view (`inside`, or why the page goes without it),
    `scale` and `cmap`, a pair's `segments`, the measure switch's `measures`, `lengths` and
    `initial`, an encoder-decoder model's `stacks`, a vision-language model's vision `tower`
    (`analysis.tower.TowerView`) and Mllama's `cross`-attention layers over the picture."""
    return _document(page_data(att, **options), page_title(att))


def live_page(
    model: dict[str, Any],
    measures: dict[str, str],
    limits: dict[str, int],
    against: dict[str, Any] | None = None,
) -> str:
    """The page `attnviz serve` serves: page.js in live mode, with live.js's form above the
    views, which asks the server for a text's data (`/api/page`, or `/api/compare` for two
    texts or two models) and draws it. `model` is the model's facts, `measures` each
    measure's help, `limits` what the server refuses, `against` the second model's facts
    (a server started with --against-model)."""
    live = {"model": model, "measures": measures, "limits": limits, "against": against}
    return _document({"live": live}, f"attnviz serve: {model['name']}", live=True)


def _document(data: dict[str, Any], title: str, live: bool = False) -> str:
    """The HTML around `data`: the package's script(s) and style inline, allowed by their
    hashes alone. Nothing may load from elsewhere; the live page may also fetch from its own
    origin (connect-src 'self')."""
    # A picture's view (picture.js, picture.css) comes on a picture's page alone, an answer's
    # over its picture (answer.js: over its image tokens, or Mllama's cross-attention layers)
    # and its vision tower's heads (tower.js) on a vision-language model's: a text's page is
    # the same file it was before pictures had a view. They decode the heads and draw over
    # the picture with blobs.js.
    views = [name for key, name in (("picture", "picture"), ("layout", "answer"),
                                    ("cross", "answer"), ("tower", "tower"))
             if data.get(key)]  # fmt: skip
    views = list(dict.fromkeys(views))  # answer.js draws the layout's view or the cross one
    named = ["page", *(["blobs", *views] if views else []), *(["live"] if live else [])]
    scripts = [_asset(f"{name}.js") for name in named]
    drawn = ["picture"] if views else []  # picture.css styles every view over a picture
    style = "".join(_asset(f"{name}.css") for name in ["page", *drawn])
    return TEMPLATE.format(
        csp=_csp(scripts, style, live),
        title=html.escape(title),
        style=style,
        data=json.dumps(data, ensure_ascii=False).replace("<", "\\u003c"),  # no "</script>"
        scripts="\n".join(f"<script>{script}</script>" for script in scripts),
    )


def _csp(scripts: list[str], style: str, live: bool = False) -> str:
    """The Content-Security-Policy of a page with these inline scripts and style."""
    hashes = " ".join(_csp_hash(script) for script in scripts)
    return (
        f"default-src 'none'; script-src {hashes}; style-src {_csp_hash(style)}; "
        + ("connect-src 'self'; " if live else "")
        + "img-src data:; base-uri 'none'; form-action 'none'"
    )


def write_page(att: Attention, path: Path, **options: Any) -> Path:
    """Write `build_page(att, **options)` to `path`, atomically."""
    return write_text_atomic(path, build_page(att, **options))
