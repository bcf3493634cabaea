"""A command's run as one frozen request: what is read, by which model, which part of it, what
is made of it and where it goes. The command line, the API and the server build it the same
way; `checks` refuses what cannot run (the table of what combines with what among it), and
a pipeline runs it.

Each command has its own class: `ShowRequest`, `ExportRequest`, `ReportRequest`,
`CompareRequest`, `CheckRequest` and `ServeRequest` (a page of `show`'s, so it has show's
fields). Their shared core, `Request`, holds what the steps they share read (the checks, the
reader and capture, the consumers, the memory estimate); each class adds the options only its
command has, so an option of one command alone cannot be given to another (export's request
has no `ablate`). Of the core's fields a command offers only some: `features.FEATURES` says
which, and refuses the rest in one line before anything loads (`--pair` to check).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

# How the model is loaded (name, device, attention, dtype, device map, memory, offload folder,
# quantisation) is core's `Load`, since core loads it (its registry keys on every setting);
# a request carries one.
from attnviz.core.settings import Load

if TYPE_CHECKING:
    from attnviz.core.models import Model
    from attnviz.outputs.figures import Style


@dataclass(frozen=True)
class Request:
    """What every command's run shares. A field left at its default is not asked for; which
    fields are features, and what each combines with, is `features.FEATURES`."""

    command: ClassVar[str] = ""
    load: Load = field(default_factory=Load)
    # What is read: one text (with a pair, or a target), one picture or many (export, compare
    # and report's texts are their own fields).
    text: str | None = None  # a picture's: its file's name
    picture: Any = None  # a vision model's picture: a path or a PIL image (`core.images`)
    pictures: Any = None  # export, compare, report: a vision model's (`core.images.Pictures`)
    prompt: str | None = None  # a vision-language model's question about the picture (the text)
    raw: bool = False  # the prompt sent as it is, not through the chat template
    tower: bool = True  # a picture and a prompt: the vision tower's heads read (--no-tower)
    pair: str | None = None  # encoders: [CLS] text [SEP] pair [SEP]
    target: str | None = None  # the decoder's input (encoder-decoder), what follows the prompt
    generate: int | None = None  # the model writes its own target, or continues the prompt
    sample: bool = False  # decoders' --generate: drawn, not greedy
    temperature: float | None = None  # with sample (None: 1)
    seed: int | None = None  # with sample: a reproducible draw
    # Which part of the model.
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    stack: str | None = None  # encoder-decoder models: encoder, decoder or cross
    # How the text is read and what is made of it.
    truncate: bool = False
    words: bool = False
    hide_special: bool = False
    measure: str = "weights"
    fusion: str = "mean"  # --measure rollout: heads fused by their mean, max or min
    discard: float = 0.0  # --measure rollout: the share of each map's lowest entries dropped
    query: str | None = None
    html: bool = False
    images: bool = True
    top_k: int = 3  # tokens listed per head
    # Where it goes, and how fast.
    out: Path | None = None
    style: Style | None = None
    jobs: int = 1
    batch_size: int = 8

    def model(self) -> Model:
        """The model that reads the text (text A in compare)."""
        from attnviz.core import models

        return models.get(self.load)

    @property
    def continues(self) -> bool:
        """Whether the text is a prompt to continue (`--generate`, `--target`): on a decoder,
        `core.generation`; an encoder-decoder model's are its target (`core.seq2seq`)."""
        return self.generate is not None or self.target is not None

    @property
    def stack_read(self) -> str:
        """The stack of an encoder-decoder model that `show` reads: `stack` as asked; else
        cross-attention where the decoder has a target (`--target`, or `--generate`'s), else
        the encoder's self-attention: with no target the decoder has nothing to read."""
        from attnviz.core.model_info import DEFAULT_STACK

        if self.stack is not None:
            return self.stack
        return DEFAULT_STACK if self.continues else "encoder"


@dataclass(frozen=True)
class ShowRequest(Request):
    """`attnviz show` (and the API's `attention`): one text, or one picture."""

    command: ClassVar[str] = "show"
    ablate: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs removed from the pass
    window: tuple[int, int] | None = None  # --window START:END: exact cells of a long text
    pool: str = "max"  # a long text's maps pooled by each block's max, or mean


@dataclass(frozen=True)
class ServeRequest(ShowRequest):
    """A text the server's page reads: `show`'s run, with what `serve` offers of it."""

    command: ClassVar[str] = "serve"


@dataclass(frozen=True)
class ExportRequest(Request):
    """`attnviz export`: many texts or pictures, a folder each."""

    command: ClassVar[str] = "export"
    sentences: Any = None  # core.inputs.Sentences
    questions: Any = None  # core.questions.Questions: pictures and prompts (a JSONL file)
    figures: tuple[str, ...] | None = None  # the figure kinds (None: all)
    save_raw: bool = False  # attention.npz
    overwrite: bool = False  # replace another export's folders in --out


@dataclass(frozen=True)
class ReportRequest(Request):
    """`attnviz report`: which heads do what, over a corpus (or a folder of pictures)."""

    command: ClassVar[str] = "report"
    sentences: Any = None  # core.inputs.Sentences, or a core.treebank.Treebank
    treebank: bool = False  # `sentences` is a CoNLL-U treebank
    questions: Any = None  # core.questions.Questions: pictures and prompts (a JSONL file)
    thresholds: Any = None  # analysis.roles.Thresholds
    min_count: int = 100  # --treebank
    margin: float = 0.1  # --treebank
    importance: str | None = None  # ablation, gradient or both
    ablation: str = "zero"  # --importance: zero or mean
    shard: str | None = None  # --shard I/N: one share of the corpus alone
    partial: Path | None = None  # in parts: where the shares' sums are kept
    resume: bool = False  # in parts: keep what the partials hold already
    launched: bool = False  # one rank of a run under a launcher (torchrun, accelerate)


@dataclass(frozen=True)
class CompareRequest(Request):
    """`attnviz compare`: pairs of texts (or two pictures, or pictures and questions) head by
    head, or one text in two models."""

    command: ClassVar[str] = "compare"
    pairs: tuple[tuple[str, str], ...] = ()  # (text A, text B)
    # a vision-language model's two pictures and one question, or one picture and two
    # (`core.questions.QuestionPair`)
    questions: Any = None
    against: Load | None = None  # the model that reads text B
    importance: str | None = None  # "ablation" (zero ablation alone): each head's in A and in B
    top: int = 6  # heads listed and drawn


@dataclass(frozen=True)
class CheckRequest(Request):
    """`attnviz check`: the from-scratch attention against the model's own."""

    command: ClassVar[str] = "check"
    stacks: tuple[str, ...] = ()  # the stacks to check (or "all")
    all_layers: bool = False  # --all-layers: every layer, check's default, said outright
    tolerance: float | None = None  # None: the model's dtype's (analysis.check)


# Each command's request.
REQUESTS: dict[str, type[Request]] = {
    kind.command: kind
    for kind in (ShowRequest, ExportRequest, ReportRequest, CheckRequest, CompareRequest,
                 ServeRequest)
}  # fmt: skip
COMMANDS = tuple(REQUESTS)
# Every field of every command's request: an option one command may have and another not.
OPTIONS = frozenset(f.name for kind in REQUESTS.values() for f in fields(kind))


@dataclass(frozen=True)
class NeedleRequest:
    """`attnviz needle`: which heads fetch a fact from a long context (retrieval heads). Not a
    `Request`: it reads none of the texts, parts or views the other commands share (their
    features' table has nothing to offer it), only a model, a haystack and a needle."""

    command: ClassVar[str] = "needle"
    load: Load = field(default_factory=Load)
    haystack: str | None = None  # a text file or a folder of them; None: the bundled text
    needle: str | None = None  # None: core.haystack.NEEDLE
    question: str | None = None  # None: core.haystack.QUESTION
    lengths: tuple[int, ...] = (1000, 2000, 4000, 8000)  # prompt tokens, at most
    depths: tuple[float, ...] = ()  # % of the haystack before the needle; (): 11, 0 … 100
    answer_tokens: int = 48  # the most each answer writes
    ablate_top: tuple[int, ...] = ()  # k: the k best heads removed, against k random heads
    seeds: int = 3  # draws of k random heads
    out: Path | None = None  # the runs (resumable) and the files; None: nothing written
    style: Style | None = None

    def model(self) -> Model:
        from attnviz.core import models

        return models.get(self.load)
