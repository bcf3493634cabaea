"""`attnviz serve`'s work for one request, on the model loaded once: a text's attention as
JSON-ready values (`/api/attention`), or the interactive page's data (`/api/page`).

No HTTP here: `attnviz/server` reads requests, queues them and calls these functions in its
one model thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError
from attnviz.pipelines import features

if TYPE_CHECKING:
    from attnviz.core.models import Model
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.request import Request

# The keys a request may carry, with the type each takes (a missing key takes its default).
KEYS = {
    "text": "a string",
    "pair": "a string or null",
    "words": "true or false",
    "hide_special": "true or false",
    "truncate": "true or false",
    "layers": "a list of layer numbers or null",
    "measure": "a string",
}


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

    @classmethod
    def of(cls, body: Any) -> Question:
        """The question a decoded JSON body asks, refusing wrong keys and types in one line."""
        from attnviz.analysis.contributions import get
        from attnviz.core.attention import require_text

        if not isinstance(body, dict):
            raise InputError('the body must be a JSON object such as {"text": "The cat sat."}')
        unknown = sorted(set(body) - set(KEYS))
        if unknown:
            raise InputError(f"unknown key {unknown[0]!r}: the keys are {', '.join(KEYS)}")
        if "text" not in body:
            raise InputError('"text" is missing: give the sentence to read')
        wrong = [key for key, value in body.items() if not _fits(key, value)]
        if wrong:
            raise InputError(f'"{wrong[0]}" must be {KEYS[wrong[0]]}')
        question = cls(
            **{key: value for key, value in body.items() if key != "layers"},
            layers=tuple(body["layers"]) if body.get("layers") is not None else None,
        )
        require_text(question.text)
        if question.pair is not None:
            require_text(question.pair, '"pair"')
        get(question.measure)
        features.refuse(question.request(None))
        return question

    def request(self, model: Model | None, style: Style | None = None) -> Request:
        """The run this question asks `model` for (its page drawn in `style`)."""
        from attnviz.pipelines.request import Load, Request

        load = model.settings if model is not None else Load()
        fields = {key: getattr(self, key) for key in KEYS}
        return Request("serve", load, **fields, style=style)


def _fits(key: str, value: Any) -> bool:
    if key == "text" or key == "measure":
        return isinstance(value, str)
    if key == "pair":
        return value is None or isinstance(value, str)
    if key == "layers":
        return value is None or (
            isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
    return isinstance(value, bool)


def _run(model: Model, question: Question, consumers: list[Any], style: Style | None = None):
    """The question's text read by `model` in one pass, with `consumers`."""
    from attnviz.pipelines import sources

    request = question.request(model, style)
    features.refuse_early(request, model)
    return sources.run(request, consumers)


def attention(model: Model, question: Question) -> dict[str, Any]:
    """The text's attention as `attnviz.attention()` gives it, as JSON-ready values: weights
    nested [layer][head][query][key] (for alti and rollout [layer][1][query][key], one map a
    layer), the model's own float32 numbers."""
    from attnviz.analysis.contributions import MEASURES

    shown = _run(model, question, []).shown
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
    }


def page(
    model: Model, question: Question, scale: str = "absolute", cmap: str = "viridis"
) -> dict[str, Any]:
    """The interactive page's data for the text (`outputs.html.page.page_data`, what
    `attnviz show --html` embeds): every measure and the inside view, from one forward pass."""
    from attnviz.outputs.figures import Style
    from attnviz.outputs.html.page import page_data
    from attnviz.pipelines.consumers.page import Page

    page = Page(question.request(model))
    att, options = page.contents(_run(model, question, [page], Style(scale=scale, cmap=cmap)))
    return page_data(att, **options)
