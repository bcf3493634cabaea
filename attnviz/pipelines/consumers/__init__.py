"""What a run makes, one consumer per thing: each asks for the recorders and the edit it
needs before the pass, reads what the pass gave, finishes its result and writes its files.

A pipeline calls every consumer's hooks in order, without knowing which features exist
(transformers' logits processors, Lightning's callbacks):

    early(model)        before the weights load (the tokenizer may refuse a query here)
    every_stack(run)    whether the pass reads every stack of an encoder-decoder model
    wants_tower()       whether the pass records a vision-language model's vision tower
                        (`run.tower`; asked before the text is encoded and answered)
    wants_cross()       whether the pass records Mllama's cross-attention layers over the
                        picture (`run.cross`; asked likewise)
    recorders(run)      capture recorders for the one pass (`core.capture`)
    edit(run)           a change to the pass (head ablation), or None
    read(run)           right after the pass, on `run.raw` (before --words / --hide-special)
    finish(run)         its result, from `run.shown`, into its field of `run.made`
    write(run, folder)  its files into the text's folder; writers run last, `Done` very last

`run.made` (`Made`) has one typed field per thing a consumer makes; `pipelines.show.ShowResult`
has the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.analysis.ablation import AblationView
    from attnviz.analysis.continuation import Written
    from attnviz.analysis.query import QueryView
    from attnviz.analysis.summary import HeadSummary
    from attnviz.analysis.tower import TowerRecorder, TowerView
    from attnviz.analysis.vision import VisionHead
    from attnviz.core.attention import Attention
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.models import Model
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.request import ShowRequest


@dataclass(eq=False)
class Made:
    """What the consumers made of one run, one field each (None: not asked for)."""

    summaries: list[HeadSummary] = field(default_factory=list)  # Summary: each head's
    # Contributions: (L, H) the share special tokens take, by weight and by norm ‖α f(x)‖
    special_by_weight: Any = None
    special_by_norm: Any = None
    mixing: dict[int, dict[str, float]] | None = None  # Contributions, alti: each layer's
    query: QueryView | None = None  # Query: where --query's token looks
    ablation: AblationView | None = None  # Ablation: the text with those heads removed
    # Ablation: (L, H) how far each kept head's pattern moved (JS divergence, nats)
    ablation_divergence: Any = None
    continuation: Written | None = None  # Continued: where each written token looked
    vision: list[VisionHead] | None = None  # Pictures: what each head does on a picture
    tower: TowerView | None = None  # Tower: a vision-language model's tower's heads
    images: list[Path] = field(default_factory=list)  # Images: the figures written
    page: Path | None = None  # Page: attention.html

    def as_fields(self) -> dict[str, Any]:
        """Each field by name (`ShowResult` has them all)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(eq=False)
class Run:
    """One text's run: the request, the loaded model, the encoded input and the layers
    chosen, then what the pass read and what the consumers made of it."""

    request: ShowRequest  # show's, or the server's page's (a ServeRequest)
    loaded: LoadedModel
    encoded: Any  # core.attention.Encoded, or SourceTarget (encoder-decoder models)
    layers: list[int]  # the chosen layers (of the chosen stack)
    # the measure's recorder (contributions.MeasureRecorder); None for the weights
    measure_recorder: Any = None
    # a vision-language model's vision tower, recorded in the pass that ran it (where a
    # consumer `wants_tower` and its family's tower is mapped); None otherwise
    tower: TowerRecorder | None = None
    # Mllama's cross-attention layers over the picture (`core.cross_picture`), as the pass
    # read them, where a consumer `wants_cross`; None otherwise
    cross: Attention | None = None
    raw: Attention | None = None  # as the pass read it
    stacks: dict[str, Attention] | None = None  # encoder-decoder models: each stack read
    shown: Attention | None = None  # after --words / --hide-special
    streamed: bool = False  # no map held whole: blocks of rows summed as the pass made them
    # what figures draw: `shown`, or pooled (`views.Views`); None where nothing draws it
    drawn: Attention | None = None
    page_view: Attention | None = None  # what the page carries: `shown`, or pooled coarser
    window: Attention | None = None  # --window's exact cells
    views: Any = None  # pipelines.views.Views: how the views are made
    heads: list[int] = field(default_factory=list)
    style: Style | None = None  # how figures are drawn (norm: 1 is the text's largest value)
    made: Made = field(default_factory=Made)  # what the consumers made of it

    @cached_property
    def ranked(self) -> Attention:
        """`shown` with a norm's rows as shares: what summaries and the query rank."""
        from attnviz.analysis.contributions import shares

        return shares(self.shown)


class Consumer:
    """A consumer that does nothing at any step; each consumer overrides its own."""

    def __init__(self, request: ShowRequest) -> None:
        self.request = request

    def early(self, model: Model) -> None:
        return None

    def every_stack(self, run: Run) -> bool:
        return False

    def wants_tower(self) -> bool:
        return False

    def wants_cross(self) -> bool:
        return False

    def recorders(self, run: Run) -> list[Any]:
        return []

    def edit(self, run: Run) -> Any:
        return None

    def read(self, run: Run) -> None:
        return None

    def finish(self, run: Run) -> None:
        return None

    def write(self, run: Run, folder: Path) -> None:
        return None


def encoded_ahead(request: ShowRequest, model: Model) -> tuple[Any, Any] | None:
    """The model's facts (`core.models.describe`) and the request's text as the model will
    read it, from the tokenizer alone, before the weights load (an `early` hook's input);
    None where the model's files do not say enough: not here, an encoder-decoder model, no
    tokenizer.json or no length limit."""
    from attnviz.core.models import describe
    from attnviz.core.tokens import encode_with

    spec = describe(model.name)
    if spec is None or spec.seq2seq or spec.tokenizer_file is None or spec.max_tokens is None:
        return None
    r = request
    return spec, encode_with(model.tokenizer(), spec, r.text, r.truncate, r.pair)
