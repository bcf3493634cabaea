"""Every check before a run, in one module: what a request is refused for, in one line
(InputError, exit 2), before anything loads where the model's files can tell, and again once
the model has loaded for what they could not (a hub id not on this machine yet). In the
order a user meets them:

1. the text: given, Unicode and not empty (a sentence pair's, a target's; compare's
   pairs);
2. its values: a known measure, --generate of 1 or more;
3. what combines with what, by command and kind of model (`features`: the table);
4. layers and heads in range, a text within the model's limit (the model's files);
5. a run that fits in memory, estimated from the files (`core.memory`);
6. report: the importance methods the loaded model can be measured by (`before_pass`).

`before_loading` runs 1–4 for one text (`show`, the API, `serve`) and 5 where it is given
the texts (`show`; `export` calls `fits` on its sentences itself; the API and `serve` do not
refuse by memory); `before_compare` for
compare's pairs; `against(request, facts)` runs 3 on a model's facts, its files' before it
loads and the loaded model's after, asking the feature table once each time with the facts it
holds (`questions` the same for a run over pictures and questions, after its value); `fits`
runs 5. A model's own load settings are checked when it is made
(`core.settings.Load.refuse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnviz.core import memory
from attnviz.errors import InputError
from attnviz.outputs.files import check_writable
from attnviz.pipelines import features

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.models import Model
    from attnviz.pipelines.request import Request


def against(request: Request, facts: Any = None) -> frozenset[str]:
    """What does not combine in `request`, asked of the feature table once (`features.refuse`:
    the table, and what a picture, a prompt or a file of questions can take) with a model's
    `facts`: its files' before it loads (`ModelSpec`), the loaded model's after (`ModelInfo`:
    what the files could not say, a hub id's kind of model), or None (nothing known yet). The
    names of the features `request` asks for."""
    return features.refuse(request, facts)


def _generates(request: Request) -> None:
    """Refuse --generate below 1."""
    if request.generate is not None and request.generate < 1:
        raise InputError(
            f"--generate takes a number of tokens of 1 or more, not {request.generate}"
        )


def ranges(model: Model, layers: list[int] | None, heads: list[int] | None) -> None:
    """Refuse a layer or head out of range, from the model's files (`Model.check_files`)."""
    model.check_files(layers, heads)


def fits(request: Request, model: Model, texts: Sequence[str]) -> None:
    """Refuse a run over `texts` that would not fit in memory, estimated from the model's
    files before its weights load (`core.memory`)."""
    from attnviz.core.models import describe

    memory.refuse(describe(model.name), model.settings, list(texts), memory.Asked.of(request),
                  request.truncate, request.pair)  # fmt: skip


def before_loading(request: Request, model: Model, texts: Sequence[str] | None = None) -> None:
    """Refuse bad input before anything loads: an empty text (or one that is not Unicode),
    an unknown measure, what does not combine (the feature table, on the model's files),
    layers and heads out of range, a text too long; with `texts`, a run over them that
    would not fit in memory."""
    from attnviz.analysis.contributions import with_rollout
    from attnviz.core.attention import require_text
    from attnviz.core.models import describe

    if request.text is not None and request.picture is None:
        require_text(request.text)
    if request.pair is not None:
        require_text(request.pair, "the --pair sentence")
    if request.target is not None:
        require_text(request.target, "the --target text")
    with_rollout(request.measure, request.fusion, request.discard)  # refuses a bad one
    _generates(request)
    spec = describe(model.name)
    asked = against(request, spec)
    layers, heads = list(request.layers or ()) or None, list(request.heads or ()) or None
    text = request.text if request.picture is None else None
    model.check_files(layers, heads, text, request.truncate, request.stack_read)
    if "ablate" in asked:  # show's
        model.check_files([layer for layer, _ in request.ablate],
                           [head for _, head in request.ablate])  # fmt: skip
    if texts is not None and request.picture is None:
        fits(request, model, texts)


def questions(request: Request, facts: Any) -> None:
    """Refuse a report, export or compare over pictures and questions (a JSONL file; compare's
    two pictures and a question, or a picture and two) that cannot run: --generate below 1,
    then what does not combine (the feature table's rules for pictures and questions, against
    the model's `facts`: its files' or the loaded model's; None: not known yet)."""
    _generates(request)
    features.refuse(request, facts)


def before_compare(request: Request, model: Model, other: Model) -> None:
    """Refuse before anything loads: no pairs, an empty text, an unknown measure, what does
    not combine (the feature table), a text too long for its model, an unwritable --out."""
    from attnviz.analysis.contributions import get
    from attnviz.core.attention import require_text

    pairs = request.pairs
    if not pairs:
        raise InputError("no pairs to compare")
    for number, (a, b) in enumerate(pairs, start=1):
        where = f" of pair {number}" if len(pairs) > 1 else ""
        require_text(a, f"text A{where}")
        require_text(b, f"text B{where}")
    get(request.measure)
    for option, given in (("--target", request.target is not None), ("--raw", request.raw)):
        if given:
            raise InputError(f"{option} in attnviz compare is for pictures and questions: "
                             'compare a.png b.png "What is on it?"')  # fmt: skip
    against(request)
    read = ((model, [a for a, _ in pairs]), (other, [b for _, b in pairs]))
    for reader, texts in read if request.pictures is None else ():  # a picture: its grid
        for text in texts:
            reader.check_files(text=text, truncate=request.truncate)
    if request.out is not None and (request.images or request.html):
        check_writable(request.out)  # made when its files are written


def before_pass(
    loaded: LoadedModel, layers: list[int] | None, heads: list[int] | None, importance: str | None
) -> list[str]:
    """The importance methods asked for, refusing bad layers, heads and methods before the
    corpus's pass, not after it."""
    from attnviz.analysis.importance import check_method, methods_of

    loaded.info.pick_layers(layers)
    loaded.info.pick_heads(heads)
    methods = methods_of(importance) if importance else []
    for method in methods:
        check_method(loaded, method)
    return methods
