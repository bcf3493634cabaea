"""`attnviz serve`'s work for one request, on the model loaded once: a text's attention as
JSON-ready values (`/api/attention`), or the interactive page's data (`/api/page`).

No HTTP here: `attnviz/server` reads requests, queues them and calls these functions in its
one model thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.core.models import Model
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.request import ServeRequest
    from attnviz.pipelines.tiles import Holder

# The keys a request may carry, with the type each takes (a missing key takes its default).
KEYS = {
    "text": "a string",
    "pair": "a string or null",
    "words": "true or false",
    "hide_special": "true or false",
    "truncate": "true or false",
    "layers": "a list of layer numbers or null",
    "measure": "a string",
    "generate": "a number of tokens or null",
    "target": "a string or null",
    "sample": "true or false",
    "temperature": "a number or null",
    "seed": "a whole number or null",
}


# The keys of a text read for tiles alone (/api/text).
TEXT_KEYS = ("text", "pair", "truncate")


@dataclass(frozen=True)
class Question:
    """One request: the text and how to read it, as `attnviz.attention()` takes them."""

    text: str
    pair: str | None = None
    words: bool = False
    hide_special: bool = False
    truncate: bool = False
    layers: tuple[int, ...] | None = None
    measure: str = "weights"
    # a decoder's continuation: written by the model (greedy, or sampled) or given
    generate: int | None = None
    target: str | None = None
    sample: bool = False
    temperature: float | None = None
    seed: int | None = None

    @classmethod
    def of(cls, body: Any, keys: Sequence[str] = tuple(KEYS)) -> Question:
        """The question a decoded JSON body asks, refusing wrong keys and types in one line
        (`keys`: those it may carry; /api/text's are TEXT_KEYS)."""
        from attnviz.analysis.contributions import get
        from attnviz.core.attention import require_text
        from attnviz.pipelines.tiles import TEXT, checked

        checked(body, {key: KEYS[key] for key in keys}, _fits, TEXT, '{"text": "The cat sat."}')
        question = cls(
            **{key: value for key, value in body.items() if key != "layers"},
            layers=tuple(body["layers"]) if body.get("layers") is not None else None,
        )
        require_text(question.text)
        if question.pair is not None:
            require_text(question.pair, '"pair"')
        get(question.measure)
        checks.against(question.request(None))
        return question

    def request(self, model: Model | None, style: Style | None = None) -> ServeRequest:
        """The run this question asks `model` for (its page drawn in `style`)."""
        from attnviz.core.settings import Load
        from attnviz.pipelines.request import ServeRequest

        load = model.settings if model is not None else Load()
        fields = {key: getattr(self, key) for key in KEYS}
        return ServeRequest(load, **fields, style=style)


def _fits(key: str, value: Any) -> bool:
    whole = isinstance(value, int) and not isinstance(value, bool)
    if key == "text" or key == "measure":
        return isinstance(value, str)
    if key in ("pair", "target"):
        return value is None or isinstance(value, str)
    if key in ("generate", "seed"):
        return value is None or whole
    if key == "temperature":
        return value is None or whole or isinstance(value, float)
    if key == "layers":
        return value is None or (
            isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
    return isinstance(value, bool)


def _run(model: Model, question: Question, consumers: list[Any], style: Style | None = None):
    """The question's text read by `model` in one pass, with `consumers`."""
    from attnviz.pipelines import readers

    request = question.request(model, style)
    checks.before_loading(request, model)
    return readers.run(request, consumers)


def attention(model: Model, question: Question, holder: Holder | None = None) -> dict[str, Any]:
    """The text's attention as `attnviz.attention()` gives it, as JSON-ready values: weights
    nested [layer][head][query][key] (for alti and rollout [layer][1][query][key], one map a
    layer), the model's own float32 numbers. With a `holder`, the pass also keeps the text's
    X for tiles (`pipelines.tiles`), and "tiles" says what is held."""
    from attnviz.analysis.contributions import MEASURES

    keep = _keep(question, holder)
    shown = _run(model, question, keep).shown
    measure = MEASURES[shown.measure]
    return {
        "model": shown.info.as_dict(),
        **shown.info.ran(),
        "measure": measure.name,
        "unit": measure.unit,
        "per_layer": measure.per_layer,
        "text": shown.text,
        "pair": shown.pair,
        "tokens": list(shown.tokens),
        "special": [bool(s) for s in shown.special],
        "segments": list(shown.segments) if shown.segments else None,
        "layers": shown.held_layers(),  # the model layer of each entry of "weights"
        "weights": shown.weights.tolist(),  # (L, H, T, T), or (L, 1, T, T) per layer
        "notes": list(shown.notes),
        **_tiles(keep),
    }


# Past this many cells (chosen layers × heads × T²: SmolLM2's 270 heads past 498 tokens) the
# served page is answered from tiles alone: its matrix view, drawn by the server's tiles.
TILES_ONLY_CELLS = 2**26


def page(
    model: Model,
    question: Question,
    scale: str = "absolute",
    cmap: str = "viridis",
    holder: Holder | None = None,
) -> dict[str, Any]:
    """The interactive page's data for the text (`outputs.html.page.page_data`, what
    `attnviz show --html` embeds): every measure and the inside view, from one forward pass.
    With a `holder`, the pass also keeps the text's X for tiles; a text past TILES_ONLY_CELLS is
    then read for tiles alone (`tiles_only`)."""
    from attnviz.outputs.figures import Style
    from attnviz.outputs.html.page import page_data
    from attnviz.pipelines.consumers.page import Page

    if holder is not None and _past_the_page(model, question):
        return tiles_only(model, question, holder, scale, cmap)
    page = Page(question.request(model))
    keep = _keep(question, holder)
    run = _run(model, question, [page, *keep], Style(scale=scale, cmap=cmap))
    att, options = page.contents(run)
    return {**page_data(att, **options), **_tiles(keep)}


def _keep(question: Question, holder: Holder | None) -> list[Any]:
    """The consumer that keeps the pass's X for tiles, where there is a holder."""
    from attnviz.pipelines.tiles import Keep

    return [Keep(question.request(None), holder)] if holder is not None else []


def _tiles(keep: list[Any]) -> dict[str, Any]:
    """What an answer says of tiles: the held text, or why this one is not held."""
    if not keep:
        return {}
    return {"tiles": keep[0].answer(), "tiles_note": keep[0].why}


def _past_the_page(model: Model, question: Question) -> bool:
    """Whether the page's data for the question would pass TILES_ONLY_CELLS (tokenised only)."""
    from attnviz.core.tokens import encode

    checks.before_loading(question.request(model), model)
    loaded = model.load()
    if loaded.info.seq2seq:
        return False
    n = len(encode(loaded, question.text, question.truncate, question.pair))
    if question.generate is not None or question.target is not None:  # no tiles: refused
        from attnviz.errors import InputError

        more = question.generate or len(loaded.tokenizer(question.target)["input_ids"])
        layers = loaded.info.pick_layers(list(question.layers) if question.layers else None)
        if len(layers) * loaded.info.n_heads * (n + more) ** 2 > TILES_ONLY_CELLS:
            raise InputError(
                f"a prompt and continuation of about {n + more} tokens are past what the page "
                "carries whole, and a continuation is not read for tiles: choose fewer layers, "
                "or use attnviz show"
            )
        return False
    layers = loaded.info.pick_layers(list(question.layers) if question.layers else None)
    return len(layers) * loaded.info.n_heads * n * n > TILES_ONLY_CELLS


def tiles_only(
    model: Model, question: Question, holder: Holder, scale: str, cmap: str
) -> dict[str, Any]:
    """The page's data for a text past TILES_ONLY_CELLS: its tokens and the page's frame, no
    heads (`weights` null); the text is read for tiles alone, and the page's matrix view
    draws each head from tiles (pooled over the whole text, exact cells where zoomed)."""
    import numpy as np

    from attnviz.analysis.contributions import MEASURES, values_of
    from attnviz.core.attention import Attention
    from attnviz.outputs.html.page import page_frame
    from attnviz.pipelines.tiles import read

    found = read(model, holder, question)
    info = model.load().info
    n = len(found["tokens"])
    notes = list(found["notes"])
    if question.words or question.hide_special:
        notes.append("words and hide special are not applied to tiles: the map shows tokens")
    frame = Attention(
        text=found["text"],
        tokens=tuple(found["tokens"]),
        special=np.array(found["special"], dtype=bool),
        weights=np.zeros((0, info.n_heads, n, n), np.float32),  # no heads travel
        info=info,
        unit="token",
        words=(),
        word_labels=(),
        notes=tuple(notes),
        pair=found["pair"],
    )
    norm = MEASURES["norm"]
    measures = {}
    if values_of(model.load()) is not None:  # norm needs each head's values and W_O
        measures["norm"] = {"unit": norm.unit, "help": norm.help, "cite": norm.cite,
                            "per_layer": False, "top": None}  # fmt: skip
    return {
        **page_frame(frame, scale, cmap),
        "pair": found["pair"],
        "tokens": found["tokens"],
        "special": found["special"],
        "segments": found["segments"],
        "layers": info.n_layers,
        "layer_ids": list(range(info.n_layers)),
        "heads": info.n_heads,
        "encoding": "float32",
        "weights": None,
        "inside": None,
        "inside_note": "left out: this text is read for tiles alone",
        "measure": question.measure if question.measure in measures else "weights",
        "measures": measures,
        "tiles_only": (
            f"{n} tokens are past what the page carries whole ({TILES_ONLY_CELLS:,} cells of "
            "layers × heads × tokens²): the matrix view draws each head from the server's tiles"
        ),
        "tiles": found["tiles"],
        "tiles_note": None,
    }
