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
loads and the loaded model's after; `fits` runs 5. A model's own load settings are checked
when it is made (`core.settings.Load.refuse`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attnviz.analysis.roles import DEFAULT_THRESHOLDS as DEFAULTS
from attnviz.core import memory
from attnviz.errors import InputError
from attnviz.outputs.files import check_writable
from attnviz.pipelines import features

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.models import Model
    from attnviz.pipelines.request import Request


def against(request: Request, facts: Any = None) -> None:
    """What does not combine in `request` (the feature table), against a model's `facts`:
    its files' before it loads (`ModelSpec`), the loaded model's after (`ModelInfo`: what
    the files could not say, a hub id's kind of model), or None (nothing known yet)."""
    features.refuse(request, facts)
    pictures(request, facts)


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
    if request.generate is not None and request.generate < 1:
        raise InputError(
            f"--generate takes a number of tokens of 1 or more, not {request.generate}"
        )
    spec = describe(model.name)
    against(request, spec)
    layers, heads = list(request.layers or ()) or None, list(request.heads or ()) or None
    text = request.text if request.picture is None else None
    model.check_files(layers, heads, text, request.truncate, request.stack_read)
    if features.asks(lambda r: r.ablate, request):  # show's
        model.check_files([layer for layer, _ in request.ablate],
                           [head for _, head in request.ablate])  # fmt: skip
    if texts is not None and request.picture is None:
        fits(request, model, texts)


# The options a picture cannot take, and why.
_TEXT_ONLY = (
    ("--hide-special", lambda r: r.hide_special, "a picture's views show what CLS, the "
     "distillation token and the registers take, by name"),
    ("--words", lambda r: r.words, "a picture's tokens are its patches"),
    ("--pair", lambda r: r.pair is not None, "a vision model reads one picture"),
    ("--measure alti", lambda r: r.measure == "alti", "it traces a text's residual stream"),
    # report's: a report over pictures sums each head's numbers of `analysis.vision`
    ("--treebank", lambda r: r.treebank, "its sentences carry the syntax it measures"),
    ("--importance", lambda r: r.importance is not None, "it measures a text objective (the "
     "next token's or the masked token's loss, a sentence embedding)"),
    ("--threshold", lambda r: r.thresholds is not None and r.thresholds.values != DEFAULTS,
     "a picture's heads get the roles of docs/vision.md, by rules of their own"),
    ("--truncate", lambda r: r.truncate, "the model's image processor sizes each picture"),
    ("--shard", lambda r: r.shard is not None, "a report over pictures runs in one process"),
    ("--partial/--resume", lambda r: r.partial is not None or r.resume,
     "a report over pictures runs in one process"),
    ("a launched run (torchrun, accelerate launch)", lambda r: r.launched,
     "a report over pictures runs in one process"),
)  # fmt: skip


def reads_pictures(request: Request) -> bool:
    """Whether `request` gives pictures: show's one, or the files and folders of export,
    compare and report."""
    return request.picture is not None or request.pictures is not None


def _text_options(request: Request) -> None:
    for option, given, why in _TEXT_ONLY:
        if features.asks(given, request):
            raise InputError(f"{option} is for text: {why}")


def pictures(request: Request, facts: Any) -> None:
    """Refuse a picture to a model that reads text, and text to one that reads pictures
    (`facts`: the model's files' or the loaded model's; None: not known yet)."""
    if reads_pictures(request) and request.prompt is None:
        _text_options(request)
    if facts is None:
        return
    prompted = getattr(facts, "prompted", False)  # a vision-language model: `core.vlm`
    if prompted and reads_pictures(request) and request.prompt is None:
        raise InputError(f"{facts.name} answers a prompt about a picture: give the prompt after "
                         'the picture (show photo.png "What is on the table?")')  # fmt: skip
    if request.prompt is not None and not prompted:
        kind = (
            "a vision model: it reads a picture alone"
            if getattr(facts, "pictures", False)
            else "a text model: it reads no picture"
        )
        raise InputError(f"{facts.name} is {kind}; a picture and a prompt are for a "
                         "vision-language model (LLaVA, Qwen2-VL, PaliGemma, …)")  # fmt: skip
    if prompted:
        return
    if reads_pictures(request) and not getattr(facts, "pictures", False):
        raise InputError(
            f"{facts.name} reads text, not pictures: give it {_TEXT[request.command]} to a "
            "vision model (-m DIR of a ViT, DeiT, DINOv2, CLIP …)"
        )
    if not reads_pictures(request) and getattr(facts, "pictures", False):
        raise InputError(
            f"{facts.name} is a vision model: it reads pictures, not text; give it "
            f"{_PICTURES.get(request.command, _ELSEWHERE)}"
        )


# What each command reads: text, and pictures where it reads them.
_TEXT = {
    "show": "a sentence, or give the picture",
    "check": "a sentence, or give the picture",
    "report": "sentences (or --file, --treebank), or give the pictures",
    "export": "sentences (or --file), or give the pictures",
    "compare": "two texts, or give the pictures",
}
_PICTURES = {"show": "an image file (.jpg, .png …)",
             "check": "an image file (.jpg, .png …)",
             "report": "picture files or folders of them (.jpg, .png …)",
             "export": "picture files or folders of them (.jpg, .png …)",
             "compare": "two picture files (.jpg, .png …)"}  # fmt: skip
_ELSEWHERE = ("a picture to `attnviz show` or `check`, pictures to `attnviz export`, `compare` "
              "or `report`, or a picture to the API (`serve` reads text)")  # fmt: skip


# The options a report, export or compare over pictures and questions cannot take: each is
# read alone, with its weights (a report sums the numbers of `analysis.picture_heads`).
_NOT_FOR_QUESTIONS = (
    ("--html", lambda r: r.html),
    ("--measure", lambda r: r.measure != "weights"),
    ("--query", lambda r: r.query is not None),
    ("--treebank", lambda r: r.treebank),
    ("--importance", lambda r: r.importance is not None),
    ("--threshold", lambda r: r.thresholds is not None and r.thresholds.values != DEFAULTS),
    ("--words", lambda r: r.words),
    ("--truncate", lambda r: r.truncate),
    ("--shard", lambda r: r.shard is not None),
    ("--partial/--resume", lambda r: r.partial is not None or r.resume),
    ("a launched run (torchrun, accelerate launch)", lambda r: r.launched),
    ("--against-model", lambda r: r.against is not None),
)
# What each command reads of pictures and questions, as its refusal of a model says it.
_ASKED = {"compare": "two pictures and a question, or a picture and two questions, are"}


def questions(request: Request, facts: Any) -> None:
    """Refuse a report, export or compare over pictures and questions (a JSONL file; compare's
    two pictures and a question, or a picture and two) that cannot run: an option it cannot
    take, --generate below 1, or (`facts`: the model's files' or the loaded
    model's; None: not known yet) a model that reads no picture and prompt."""
    for option, given in _NOT_FOR_QUESTIONS:
        if features.asks(given, request):
            raise InputError(f"{option} is not available in attnviz {request.command} over "
                             "pictures and questions")  # fmt: skip
    if request.generate is not None and request.generate < 1:
        raise InputError(
            f"--generate takes a number of tokens of 1 or more, not {request.generate}"
        )
    features.refuse(request, facts)
    if facts is not None and not getattr(facts, "prompted", False):
        kind = ("a vision model: it reads a picture alone" if getattr(facts, "pictures", False)
                else "a text model: it reads no picture")  # fmt: skip
        asked = _ASKED.get(request.command, "a file of pictures and questions is")
        raise InputError(f"{facts.name} is {kind}; {asked} for a vision-language model (LLaVA, "
                         "Qwen2-VL, PaliGemma, …)")  # fmt: skip


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
