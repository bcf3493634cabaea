"""A command's run as one frozen request: what is read, by which model, which part of it, what
is made of it and where it goes. The command line, the API and the server build it the same
way; `checks` refuses what cannot run (the table of what combines with what among it), and
a pipeline runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# How the model is loaded (name, device, attention, dtype, device map, memory, offload folder,
# quantisation) is core's `Load`, since core loads it (its registry keys on every setting);
# a request carries one.
from attnviz.core.settings import Load

if TYPE_CHECKING:
    from attnviz.core.models import Model
    from attnviz.outputs.figures import Style

COMMANDS = ("show", "export", "report", "check", "compare", "serve")


@dataclass(frozen=True)
class Request:
    """One run of `command`. A field left at its default is not asked for; which fields are
    features, and what each combines with, is `features.FEATURES`."""

    command: str
    load: Load = field(default_factory=Load)
    # What is read: one text (with a pair, or a target), or many (export, report, compare).
    text: str | None = None  # a picture's: its file's name
    picture: Any = None  # a vision model's picture: a path or a PIL image (`core.images`)
    pictures: Any = None  # report: a vision model's pictures (`core.images.Pictures`)
    pair: str | None = None  # encoders: [CLS] text [SEP] pair [SEP]
    target: str | None = None  # the decoder's input (encoder-decoder), what follows the prompt
    generate: int | None = None  # the model writes its own target, or continues the prompt
    sample: bool = False  # decoders' --generate: drawn, not greedy
    temperature: float | None = None  # with sample (None: 1)
    seed: int | None = None  # with sample: a reproducible draw
    sentences: Any = None  # core.inputs.Sentences, or a core.treebank.Treebank (report)
    pairs: tuple[tuple[str, str], ...] = ()  # compare: (text A, text B)
    against: Load | None = None  # compare: the model that reads text B
    # Which part of the model.
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    stack: str | None = None  # encoder-decoder models: encoder, decoder or cross
    stacks: tuple[str, ...] = ()  # check: the stacks to check (or "all")
    all_layers: bool = False  # check: --all-layers (the default, said)
    # How the text is read and what is made of it.
    truncate: bool = False
    words: bool = False
    hide_special: bool = False
    measure: str = "weights"
    fusion: str = "mean"  # --measure rollout: heads fused by their mean, max or min
    discard: float = 0.0  # --measure rollout: the share of each map's lowest entries dropped
    query: str | None = None
    ablate: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs removed from the pass
    html: bool = False
    images: bool = True
    window: tuple[int, int] | None = None  # --window START:END: exact cells of a long text
    pool: str = "max"  # a long text's maps pooled by each block's max, or mean
    figures: tuple[str, ...] | None = None  # export: the figure kinds (None: all)
    save_raw: bool = False  # export: attention.npz
    importance: str | None = None  # report: ablation, gradient or both; compare: "ablation"
    ablation: str = "zero"  # report --importance: zero or mean
    treebank: bool = False  # report: `sentences` is a CoNLL-U treebank
    thresholds: Any = None  # report: analysis.roles.Thresholds
    min_count: int = 100  # report --treebank
    margin: float = 0.1  # report --treebank
    shard: str | None = None  # report --shard I/N: one share of the corpus alone
    partial: Path | None = None  # report in parts: where the shares' sums are kept
    resume: bool = False  # report in parts: keep what the partials hold already
    launched: bool = False  # report: one rank of a run under a launcher (torchrun, accelerate)
    tolerance: float | None = None  # check (None: the model's dtype's, analysis.check)
    top: int = 6  # compare: heads listed and drawn
    top_k: int = 3  # tokens listed per head
    # Where it goes, and how fast.
    out: Path | None = None
    style: Style | None = None
    jobs: int = 1
    batch_size: int = 8
    overwrite: bool = False  # export

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
    def decoder_option(self) -> str | None:
        """The option that gives an encoder-decoder model's target, if one was given."""
        if self.target is not None:
            return "--target"
        return "--generate" if self.generate is not None else None
