"""`attnviz serve`'s compare request (`/api/compare`): text A and text B through the model,
or one text through the model and the server's second model (`--against-model`), compared
head by head as `attnviz compare` compares them, answered with the compare page's data
(`outputs.html.compare.compare_data`, what `compare --html` embeds).

No HTTP here: `attnviz/server` reads the request, queues it and calls `page` in its one model
thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.models import Model

# The keys a compare request may carry, with the type each takes (a missing key: its default).
KEYS = {
    "text": "a string",
    "b": "a string or null",
    "against_model": "true or false",
    "words": "true or false",
    "truncate": "true or false",
    "measure": "a string",
}


@dataclass(frozen=True)
class CompareQuestion:
    """One compare request: text A, text B (None: text A again, for two models), whether B
    is read by the server's second model, and how both are read."""

    text: str
    b: str | None = None
    against_model: bool = False
    words: bool = False
    truncate: bool = False
    measure: str = "weights"

    @classmethod
    def of(cls, body: Any) -> CompareQuestion:
        """The question a decoded JSON body asks, refusing wrong keys, types and measures in
        one line."""
        from attnviz.analysis.contributions import get
        from attnviz.core.attention import require_text
        from attnviz.pipelines import checks
        from attnviz.pipelines.request import CompareRequest

        if not isinstance(body, dict):
            raise InputError('the body must be a JSON object such as {"text": "A", "b": "B"}')
        unknown = sorted(set(body) - set(KEYS))
        if unknown:
            raise InputError(f"unknown key {unknown[0]!r}: the keys are {', '.join(KEYS)}")
        if "text" not in body:
            raise InputError('"text" is missing: give text A')
        for key, value in body.items():
            fits = isinstance(value, bool) if KEYS[key] == "true or false" else (
                isinstance(value, str) or (value is None and key == "b"))  # fmt: skip
            if not fits:
                raise InputError(f'"{key}" must be {KEYS[key]}')
        question = cls(**body)
        require_text(question.text, "text A")
        if question.b is not None:
            require_text(question.b, '"b"')
        elif not question.against_model:
            raise InputError('"b" is missing: give text B, or "against_model": true to read '
                             "text A with the server's second model")  # fmt: skip
        get(question.measure)
        checks.against(CompareRequest(words=question.words, measure=question.measure))
        return question


def page(
    model: Model,
    against: Model | None,
    question: CompareQuestion,
    scale: str = "absolute",
    cmap: str = "viridis",
) -> dict[str, Any]:
    """The compare page's data for the question: A read by `model`, B by `against` when the
    question asks for it (else by `model`: one pass for both), each with its inside view."""
    from attnviz.analysis.compare import compare_pair, refuse_models
    from attnviz.analysis.transforms import transform
    from attnviz.core.tokens import encode
    from attnviz.outputs.html.compare import compare_data
    from attnviz.pipelines.readers import read_texts
    from attnviz.pipelines.request import CompareRequest

    if question.against_model and against is None:
        raise InputError('this server reads one model: give "b" (text B), or start the server '
                         "with a second model to compare two models")  # fmt: skip
    loaded = model.load()
    loaded_b = against.load() if question.against_model and against is not None else loaded
    refuse_models(loaded, loaded_b, question.words)
    a = encode(loaded, question.text, question.truncate)
    b = encode(loaded_b, question.b if question.b is not None else question.text, question.truncate)
    asked = CompareRequest(measure=question.measure, batch_size=2)
    if loaded_b is loaded:
        found, insides = read_texts(loaded, asked, [a, b], inside=True)
    else:
        found, insides = read_texts(loaded, asked, [a], inside=True)
        more, inside_b = read_texts(loaded_b, asked, [b], inside=True)
        found, insides = found + more, (insides or []) + (inside_b or [])
    shown = [transform(att, question.words) for att in found]
    return compare_data(
        compare_pair(*shown),
        inside=(insides[0], insides[1]),
        models=(loaded.info.name, loaded_b.info.name),
        scale=scale,
        cmap=cmap,
    )
