"""The table of what a run can ask for: each feature's option, the commands and model
kinds it works with, what it excludes, and the consumer that makes it.

`refuse(request, facts)` checks a request against the table (`pipelines.checks.against` asks
it once a phase with the facts it holds: the model's files', `core.models.describe`, before
anything loads, and the loaded model's, for a hub id whose files were not here yet), and
answers with the features the request asks for; it never calls back into the checks. It says
which options combine, with rules beside the table: what a decoder's continuation cannot
take (`_refuse_on_a_continuation`: another measure, removed heads, a temperature of 0), the
options a picture cannot take and the models a picture, text or a prompt cannot be given
(`_TEXT_ONLY`, `_refuse_on_pictures`), the options a picture and a prompt take alone
(`_PROMPT_ONLY`) and those they cannot take (`_NOT_FOR_A_PROMPT`), the options a run over
pictures and questions cannot take and the models it needs (`_NOT_FOR_QUESTIONS`,
`_refuse_without_prompts`); rollout's --fusion and --discard are refused by the checks
(`contributions.with_rollout`). Its errors share one wording. A new option is one row here
and, when it makes something, one consumer module (`attnviz/pipelines/consumers/`), named
by its "module:Class" path so that `attnviz --help` imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.roles import DEFAULT_THRESHOLDS as DEFAULTS
from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.pipelines.request import Request

ENCODER, DECODER, SEQ2SEQ = "encoder", "decoder", "encoder-decoder"
ONE_STACK = frozenset({ENCODER, DECODER})
EVERY = frozenset({ENCODER, DECODER, SEQ2SEQ})
_A_KIND = {ENCODER: "an encoder", DECODER: "a decoder", SEQ2SEQ: "an encoder-decoder model"}
_KINDS = {
    frozenset({ENCODER}): "encoders",
    frozenset({DECODER}): "decoders",
    frozenset({SEQ2SEQ}): "encoder-decoder models (T5, BART, Marian)",
    ONE_STACK: "encoders and decoders (one attention stack)",
    frozenset({DECODER, SEQ2SEQ}): "decoders and encoder-decoder models",
}
# The commands whose whole run needs one attention stack.
COMMAND_KINDS = {"compare": ONE_STACK, "serve": ONE_STACK}
COMPOSED = ("alti", "rollout")  # the measures with one map per layer


@dataclass(frozen=True)
class Feature:
    """One thing a request can ask for.

    `option` is how a person asks for it (formatted with the request as `r`); `where` maps each
    command that offers it to the model kinds it works with there; `why` is said when a kind
    of model cannot take it, or it lacks what it `needs`; `elsewhere`, when a command does
    not offer it; `excludes` names the features it cannot be given with, and why; `needs`,
    those of which it needs one;
    `consumer` is the class that makes it in a run built of consumers (`show`, the server's
    page, the API), as "module:Class" (None: the reader reads it, `pipelines.readers`;
    export, report and compare write their files per text or per corpus)."""

    name: str
    option: str | Callable[[Request], str]
    given: Callable[[Request], bool]
    where: Mapping[str, frozenset[str]]
    excludes: tuple[tuple[str, str], ...] = ()
    needs: tuple[str, ...] = ()  # features of which it needs one
    why: str = ""  # said when a model kind cannot take it, or it lacks what it needs
    elsewhere: str = ""  # said when a command does not offer it
    consumer: str | None = None

    def label(self, request: Request) -> str:
        if callable(self.option):
            return self.option(request)
        return self.option.format(r=request)


ENCODERS, DECODERS, SEQ2SEQS = frozenset({ENCODER}), frozenset({DECODER}), frozenset({SEQ2SEQ})
WRITERS = frozenset({DECODER, SEQ2SEQ})  # models that write text after their input
_PAIR = "the model reads [CLS] text [SEP] pair [SEP]"
_EVERY_HEAD = "the report covers every head of every stack"
_NORM_ROWS = "--hide-special renormalises rows to sum to 1, and norm's rows are lengths"
_COMPOSED = (
    "it gives one map per layer, composed from layer 0 up through one stack's "
    "residual stream; use weights or norm"
)
_NO_TOWER = "it leaves a vision-language model's vision tower unread"
_CONSUMERS = "attnviz.pipelines.consumers"
_CONTINUED = f"{_CONSUMERS}.continuation:Continued"
_EACH_RANK = "under a launcher each rank takes its share already: leave --shard out"
_ONE_PROCESS = "an encoder-decoder model's report runs in one process"
_SHARDED_MEANS = (
    "each shard needs every other shard's mean head outputs before it ablates, which only "
    "the ranks of a launched run exchange (torchrun); use --ablation zero with --shard"
)

# fmt: off
FEATURES = {f.name: f for f in (
    Feature("pair", "--pair", lambda r: r.pair is not None,
            dict(show=ENCODERS, serve=ENCODERS), why=_PAIR),
    Feature("target", "--target", lambda r: r.target is not None,
            dict(show=WRITERS, check=SEQ2SEQS, serve=DECODERS, compare=DECODERS),
            excludes=(("generate", ""),), consumer=_CONTINUED),
    Feature("generate", "--generate", lambda r: r.generate is not None,
            dict(show=WRITERS, check=SEQ2SEQS, export=DECODERS, compare=DECODERS,
                 serve=DECODERS, report=DECODERS), consumer=_CONTINUED),
    Feature("sample", "--sample", lambda r: r.sample,
            dict(show=DECODERS, export=DECODERS, compare=DECODERS, serve=DECODERS),
            needs=("generate",), why="it draws the tokens --generate writes"),
    Feature("temperature", "--temperature", lambda r: r.temperature is not None,
            dict(show=DECODERS, export=DECODERS, compare=DECODERS, serve=DECODERS),
            needs=("sample",), why="greedy decoding takes the likeliest token at any "
            "temperature"),
    Feature("seed", "--seed", lambda r: r.seed is not None,
            dict(show=DECODERS, export=DECODERS, compare=DECODERS, serve=DECODERS),
            needs=("sample",), why="greedy decoding draws nothing"),
    Feature("stack", lambda r: f"--stack {r.stack or ','.join(r.stacks)}",
            lambda r: r.stack is not None or bool(r.stacks),
            dict(show=SEQ2SEQS, export=SEQ2SEQS, check=SEQ2SEQS)),
    Feature("layers", "--layer", lambda r: bool(r.layers),
            dict(show=EVERY, export=EVERY, check=EVERY, report=ONE_STACK, serve=ONE_STACK),
            excludes=(("all-layers", ""),), why=_EVERY_HEAD),
    Feature("all-layers", "--all-layers", lambda r: r.all_layers, dict(check=EVERY)),
    Feature("heads", "--head", lambda r: bool(r.heads),
            dict(show=EVERY, export=EVERY, report=ONE_STACK), why=_EVERY_HEAD),
    Feature("treebank", "--treebank", lambda r: r.treebank, dict(report=ONE_STACK),
            why="its report reads source<TAB>target lines (--file)"),
    Feature("words", "--words", lambda r: r.words, dict(show=EVERY, export=ONE_STACK,
            report=ONE_STACK, compare=ONE_STACK, serve=ONE_STACK)),
    Feature("hide-special", "--hide-special", lambda r: r.hide_special,
            dict(show=EVERY, export=ONE_STACK, serve=ONE_STACK),
            excludes=(("measure-norm", _NORM_ROWS),)),
    Feature("measure-norm", "--measure norm", lambda r: r.measure == "norm",
            dict(show=EVERY, export=EVERY, compare=ONE_STACK, serve=ONE_STACK)),
    Feature("measure-composed", "--measure {r.measure}", lambda r: r.measure in COMPOSED,
            dict(show=ONE_STACK, export=ONE_STACK, serve=ONE_STACK), why=_COMPOSED,
            elsewhere=_COMPOSED),
    Feature("query", "--query", lambda r: r.query is not None,
            dict(show=EVERY, export=ONE_STACK, compare=ONE_STACK),
            consumer=f"{_CONSUMERS}.query:Query"),
    Feature("window", "--window", lambda r: r.window is not None, dict(show=ONE_STACK),
            why="a window's queries and keys are one text's"),
    Feature("pool-mean", "--pool mean", lambda r: r.pool == "mean", dict(show=EVERY)),
    Feature("no-tower", "--no-tower", lambda r: not r.tower,
            dict(show=DECODERS, export=DECODERS), why=_NO_TOWER),
    Feature("ablate", "--ablate", lambda r: bool(r.ablate), dict(show=ONE_STACK),
            consumer=f"{_CONSUMERS}.ablation:Ablation"),
    Feature("html", "--html", lambda r: r.html, dict(show=EVERY, export=ONE_STACK,
            compare=ONE_STACK),
            consumer=f"{_CONSUMERS}.page:Page"),
    Feature("page-measure", "--html with --measure {r.measure}",
            lambda r: r.html and r.measure != "weights", dict(show=ONE_STACK, export=ONE_STACK),
            why="its page shows the weights of every stack"),
    Feature("importance", "--importance", lambda r: r.importance is not None,
            dict(report=ONE_STACK, compare=ONE_STACK)),
    Feature("mean-ablation", "--ablation mean",
            lambda r: r.importance in ("ablation", "both") and r.ablation == "mean",
            dict(report=ONE_STACK)),
    Feature("shard", "--shard", lambda r: r.shard is not None, dict(report=ONE_STACK),
            excludes=(("mean-ablation", _SHARDED_MEANS), ("launched", _EACH_RANK)),
            why=_ONE_PROCESS),
    Feature("launched", "a launched run (torchrun, accelerate launch)", lambda r: r.launched,
            dict(report=ONE_STACK), why=_ONE_PROCESS),
    Feature("partial", "--partial/--resume", lambda r: r.partial is not None or r.resume,
            dict(report=ONE_STACK), needs=("shard", "launched"),
            why="the shares' sums are kept only when the corpus is run in parts"),
)}
# fmt: on


def kind_of(facts: Any) -> str:
    """A model's kind from its facts (`ModelSpec` or `ModelInfo`)."""
    if facts.seq2seq:
        return SEQ2SEQ
    return DECODER if facts.causal else ENCODER


def given(request: Request) -> list[Feature]:
    """The features `request` asks for, in the table's order."""
    return [feature for feature in FEATURES.values() if asks(feature.given, request)]


def asks(test: Callable[[Any], Any], request: Request) -> bool:
    """`test(request)`; a request whose command has not the option `test` reads (a field of
    another command's request: `pipelines.request`) does not ask for it. Any other missing
    attribute (a misspelt field) is raised."""
    try:
        return bool(test(request))
    except AttributeError as error:
        from attnviz.pipelines.request import OPTIONS

        if error.name in OPTIONS and error.obj is request:
            return False
        raise


def reads_questions(request: Request) -> bool:
    """Whether `request` reads pictures and questions (export's and report's JSONL file,
    compare's two pictures and a question or a picture and two)."""
    return asks(lambda r: r.questions is not None, request)


def refuse(request: Request, facts: Any = None) -> frozenset[str]:
    """Raise one InputError for the first thing in `request` that does not combine: two
    features that exclude each other, a feature its command does not offer, an option of a
    picture and a prompt without them (`_PROMPT_ONLY`), or (with the
    model's `facts`) one its kind of model cannot take; then what a picture cannot take, or a
    model cannot be given (a picture, text, a prompt: `_refuse_on_pictures`), or, over
    pictures and questions, the options such a run cannot take (first) and a model that reads
    no picture and prompt (last). `facts` None (a hub id not on this machine yet): only what
    needs no model is checked. The names of the features `request` asks for."""
    command, asked = request.command, given(request)
    questions = reads_questions(request)
    if questions:
        _refuse_on_questions(request)
    names = {feature.name for feature in asked}
    for feature in asked:
        for other, why in feature.excludes:
            if other in names:
                both = f"give either {feature.label(request)} or "
                both += f"{FEATURES[other].label(request)}, not both"
                raise InputError(f"{both}: {why}" if why else both)
        if feature.needs and not names & set(feature.needs):
            needed = " or ".join(FEATURES[name].label(request) for name in feature.needs)
            raise InputError(f"{feature.label(request)} needs {needed}: {feature.why}")
        if command not in feature.where:
            reason = f": {feature.elsewhere}" if feature.elsewhere else ""
            raise InputError(f"{feature.label(request)} is not available in attnviz {command}"
                             f"{reason}")  # fmt: skip
    if not questions and request.prompt is None:
        _refuse_without_a_prompt(request)
    if facts is not None:
        _refuse_on_the_model(request, facts, asked)
    if not questions:
        _refuse_on_pictures(request, facts)
    elif facts is not None:
        _refuse_without_prompts(request, facts)
    return frozenset(names)


def _refuse_on_the_model(request: Request, facts: Any, asked: list[Feature]) -> None:
    """What the model's kind cannot take (its `facts`)."""
    command = request.command
    _refuse_without_adapter(request, facts)
    kind = kind_of(facts)
    if kind == DECODER:
        _refuse_on_a_continuation(request, facts)
    if kind == SEQ2SEQ:
        _refuse_a_decoder_without_a_target(request)
    if kind not in COMMAND_KINDS.get(command, EVERY):
        raise _wrong_kind(f"attnviz {command}", COMMAND_KINDS[command], facts, "")
    for feature in asked:
        if kind not in feature.where[command]:
            label = f"{feature.label(request)} in attnviz {command}"
            raise _wrong_kind(label, feature.where[command], facts, feature.why)


def _refuse_without_adapter(request: Request, facts: Any) -> None:
    """`check` (the from-scratch attention reads a family's weights by name) on a model type
    attnviz has no adapter for: one line, from its config alone. (The measures of norms read
    v inside the model's attention call, W_O by name and the norms around the block from
    the model itself: refused after loading where one is not found.)"""
    from attnviz.core.families import SUPPORTED

    kind = getattr(facts, "model_type", None)
    if kind is None or kind in SUPPORTED or request.command != "check":
        return
    raise InputError(
        "attnviz check recomputes attention from scratch with each family's weights, read "
        f"through attnviz's adapters; '{kind}' has none (it knows: "
        f"{', '.join(SUPPORTED)}; docs/models.md)"
    )


def _refuse_on_a_continuation(request: Request, facts: Any) -> None:
    """What a decoder's continuation (`core.generation`) does not keep or allow: its pass
    keeps each layer's q and k and each step's rows, not the inputs the measures of norms
    read, and no head is removed while it writes; a sampling temperature above 0; a prompt
    and N tokens past the model's limit (its tokenizer.json counting, before loading)."""
    if not request.continues:
        return
    option = "--generate" if request.generate is not None else "--target"
    if request.measure != "weights":
        raise InputError(
            f"give either {option} or --measure {request.measure}, not both: a continuation "
            "is read with its attention weights alone"
        )
    if asks(lambda r: r.ablate, request):
        raise InputError(f"give either {option} or --ablate, not both: no head is removed "
                         "while the model writes")  # fmt: skip
    if request.temperature is not None and not request.temperature > 0:
        raise InputError(f"--temperature must be above 0, not {request.temperature:g}")
    limit = getattr(facts, "max_tokens", None)
    if request.generate is not None and request.text is not None and limit is not None:
        count = getattr(facts, "count_tokens", None)
        n = count(request.text) if count is not None else None
        if n is not None:
            from attnviz.core.generation import check_room

            check_room(n, request.generate, limit)


def _refuse_a_decoder_without_a_target(request: Request) -> None:
    """`show`'s decoder or cross-attention of an encoder-decoder model with nothing for the
    decoder to read: without --target or --generate it reads the encoder alone
    (`Request.stack_read`), and writes nothing unasked."""
    if request.command == "show" and request.stack in ("decoder", "cross"):
        if not request.continues:
            raise InputError(
                f"--stack {request.stack} reads the decoder, which needs a target: give "
                "--target TEXT, or --generate N to have the model write one"
            )


def _wrong_kind(what: str, kinds: frozenset[str], facts: Any, why: str) -> InputError:
    said = (
        f"{what} works with {_KINDS[frozenset(kinds)]}; {facts.name} is {_A_KIND[kind_of(facts)]}"
    )
    return InputError(f"{said}: {why}" if why else said)


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


# The options a picture and a prompt take alone (a vision-language model's), and why.
_PROMPT_ONLY = (("--no-tower", lambda r: not r.tower, _NO_TOWER),)
# The options a picture and a prompt cannot take, and why.
_NOT_FOR_A_PROMPT = (
    ("--ablate", lambda r: bool(r.ablate), "it reads the text with and without the heads in "
     "one batch, and a picture and a prompt are read one at a time"),
)  # fmt: skip


def _refuse_without_a_prompt(request: Request) -> None:
    """An option of a picture and a prompt given without them (text, or a picture alone)."""
    for option, given, why in _PROMPT_ONLY:
        if asks(given, request):
            raise InputError(
                f"{option} is for a picture and a prompt: {why}; this run reads "
                f"{'a picture alone' if reads_pictures(request) else 'text'}"
            )


def reads_pictures(request: Request) -> bool:
    """Whether `request` gives pictures: show's one, or the files and folders of export,
    compare and report."""
    return request.picture is not None or request.pictures is not None


def _refuse_on_pictures(request: Request, facts: Any) -> None:
    """The options a picture cannot take; a picture to a model that reads text, and text to
    one that reads pictures (`facts`: the model's files' or the loaded model's; None: not known
    yet)."""
    if reads_pictures(request) and request.prompt is None:
        for option, given, why in _TEXT_ONLY:
            if asks(given, request):
                raise InputError(f"{option} is for text: {why}")
    if request.prompt is not None:
        for option, given, why in _NOT_FOR_A_PROMPT:
            if asks(given, request):
                raise InputError(f"{option} does not read a picture and a prompt: {why}")
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


def _refuse_on_questions(request: Request) -> None:
    """The options a run over pictures and questions cannot take."""
    for option, given in _NOT_FOR_QUESTIONS:
        if asks(given, request):
            raise InputError(f"{option} is not available in attnviz {request.command} over "
                             "pictures and questions")  # fmt: skip


def _refuse_without_prompts(request: Request, facts: Any) -> None:
    """A run over pictures and questions on a model that reads no picture and prompt."""
    if not getattr(facts, "prompted", False):
        kind = ("a vision model: it reads a picture alone" if getattr(facts, "pictures", False)
                else "a text model: it reads no picture")  # fmt: skip
        asked = _ASKED.get(request.command, "a file of pictures and questions is")
        raise InputError(f"{facts.name} is {kind}; {asked} for a vision-language model (LLaVA, "
                         "Qwen2-VL, PaliGemma, …)")  # fmt: skip


def consumers(request: Request) -> list[Any]:
    """The consumers of the features `request` asks for, made from the request, in the
    table's order (their modules imported only now)."""
    from importlib import import_module

    made = []
    for feature in given(request):
        if feature.consumer is not None:
            module, name = feature.consumer.split(":")
            made.append(getattr(import_module(module), name)(request))
    return made
