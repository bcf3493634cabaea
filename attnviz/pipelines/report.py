"""`attnviz report`: what each head does over a corpus, as numbers, roles, figures and Markdown.

An encoder-decoder model reads `source<TAB>target` lines: its encoder and decoder
self-attention get positional roles, its cross-attention alignment metrics
(`attnviz.analysis.alignment`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import (
    MetricSums,
)
from attnviz.analysis.roles import (
    Thresholds,
    assign_roles,
)
from attnviz.errors import InputError, TextTooLongError
from attnviz.outputs.files import prepare_dir
from attnviz.pipelines import features

if TYPE_CHECKING:
    from attnviz.analysis.reach import Reach
    from attnviz.core.attention import Attention
    from attnviz.core.inputs import Sentences
    from attnviz.core.models import LoadedModel, Model
    from attnviz.core.treebank import Treebank
    from attnviz.outputs.figures import Style
    from attnviz.pipelines.request import Request

from attnviz.analysis.report import CrossReport, Report, Seq2SeqReport
from attnviz.outputs.report_files import write_report, write_seq2seq_report

# What encode_words had to do to a treebank sentence, as the report counts it.
CUT = "cut to the model's limit (--truncate); arcs and mentions past the cut left out"
STAND_INS = "had a word the tokenizer drops, given as its unknown token"


def report(
    model: Model, sentences: Sentences | Treebank, out: Path, style: Style, **options: Any
) -> tuple[Report | Seq2SeqReport, list[Path]]:
    """Load the model, build the report over `sentences` and write it to `out`; an
    encoder-decoder model's over the sentences read as `source<TAB>target` pairs."""
    from attnviz.core.models import describe

    asked = _request(sentences, options)
    spec = describe(model.name)
    features.refuse(asked, spec)
    if spec is not None and spec.seq2seq:  # bad lines refused before anything is written
        sentences = _pairs(sentences)
    else:
        model.refuse_early(options.get("layers"), options.get("heads"))
    prepare_dir(out)
    loaded = model.load()
    features.refuse(asked, loaded.info)  # a hub id: its files said nothing before it loaded
    if not loaded.info.seq2seq:
        result = build_report(loaded, sentences, **options)
        return result, write_report(result, out, style)
    if spec is None:
        sentences = _pairs(sentences)
    seq2seq = build_seq2seq_report(loaded, sentences, **options)
    return seq2seq, write_seq2seq_report(seq2seq, out, style)


def _request(sentences: Sentences | Treebank, options: dict[str, Any]) -> Request:
    """The request `features.refuse` checks: what of the options combines with what."""
    from attnviz.core.treebank import Treebank
    from attnviz.pipelines.request import Request

    layers, heads = options.get("layers"), options.get("heads")
    return Request("report", layers=tuple(layers) if layers else None,
                   heads=tuple(heads) if heads else None, words=bool(options.get("words")),
                   importance=options.get("importance"),
                   treebank=isinstance(sentences, Treebank))  # fmt: skip


def _pairs(sentences: Sentences) -> Sentences:
    """The sentences as source-target pairs (an encoder-decoder model's report)."""
    from attnviz.core.inputs import split_pairs

    return split_pairs(sentences)


def build_seq2seq_report(
    loaded: LoadedModel,
    pairs: Sentences,
    thresholds: Thresholds | None = None,
    batch_size: int = 16,
    truncate: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    **ignored: Any,
) -> Seq2SeqReport:
    """Run every source-target pair through an encoder-decoder model (teacher forcing, one
    batched pass for all three stacks), summing the encoder's and decoder's head metrics
    and the cross-attention's alignment metrics, by weight and by norm ‖α f(x)‖, as it goes
    (flat memory).

    A pair too long for the model is skipped with a note, as `build_report` skips a sentence.
    `ignored` takes the one-stack options `report` refused when they were set.
    """
    from dataclasses import replace

    import numpy as np

    from attnviz.analysis.alignment import AlignmentSums
    from attnviz.analysis.contributions import CorpusContributions, Measured, get, shares
    from attnviz.core.adapters import STACKS
    from attnviz.core.extract import attend_stacks, batched
    from attnviz.core.seq2seq import encode_source_target

    skipped: list[str] = []

    def encoded():
        for pair in pairs.items:
            try:
                yield encode_source_target(loaded, pair.text, pair.target, truncate=truncate)
            except TextTooLongError as error:
                note = f"{pairs.source}, line {pair.line}: skipped, {error}"
                skipped.append(note)
                if on_warning:
                    on_warning(note)

    sums = {"encoder": MetricSums(), "decoder": MetricSums()}
    # each self-attention stack's special shares, from the same pass
    contributions = {stack: CorpusContributions(loaded, stack) for stack in sums}
    alignment, by_norm = AlignmentSums(), AlignmentSums()
    example: dict[str, Attention] = {}
    cross_layers = list(range(loaded.info.of_stack("cross").n_layers))
    for batch in batched(encoded(), batch_size):
        # cross-attention's norms ‖α f(x)‖ from the same pass (Kobayashi et al. 2020)
        widths = (max(len(item.target) for item in batch), max(len(item.source) for item in batch))
        norms = Measured(loaded, get("norm"), cross_layers, len(batch), *widths, stack="cross")
        also: list = [norms]
        for stack, corpus in contributions.items():
            side = "source" if stack == "encoder" else "target"
            special = [np.array(getattr(item, side).special, dtype=bool) for item in batch]
            also += corpus.recorders(special)
        for row, found in enumerate(attend_stacks(loaded, batch, STACKS, also=also)):
            for stack, stack_sums in sums.items():
                stack_sums.add(found[stack])
                contributions[stack].add(row, found[stack])
            cross = found["cross"]
            alignment.add(cross)
            n_target, n_source = cross.weights.shape[-2:]
            held = norms.held[row, :, :, :n_target, :n_source]  # (L, H, T, S)
            by_norm.add(shares(replace(cross, weights=held, measure="norm")))
            example = example or found
            if on_progress:
                on_progress(1)
    if not example:
        raise InputError("no pair fits the model: every one was too long (try --truncate)")
    chosen = thresholds or Thresholds()
    reports = {}
    for stack, stack_sums in sums.items():
        means = stack_sums.means()
        info = loaded.info.of_stack(stack)
        reports[stack] = Report(
            info=info,
            unit="token",
            sentences=stack_sums.sentences,
            queries=stack_sums.queries,
            skipped=tuple(skipped),
            means=means,
            roles=tuple(assign_roles(means, chosen)),
            thresholds=chosen,
            example=example[stack],
            layers=tuple(range(info.n_layers)),
            heads=tuple(range(info.n_heads)),
            special=contributions[stack].special(),
        )
    cross = CrossReport(
        loaded.info.of_stack("cross"), alignment.means(), example["cross"], by_norm.means()
    )
    read = sums["encoder"].sentences  # every stack read every pair
    return Seq2SeqReport(loaded.info, read, tuple(skipped), reports, cross)


def build_report(
    loaded: LoadedModel,
    sentences: Sentences | Treebank,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    words: bool = False,
    thresholds: Thresholds | None = None,
    batch_size: int = 16,
    truncate: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    min_count: int = 100,
    margin: float = 0.1,
    importance: str | None = None,
    ablation: str = "zero",
    on_importance: Callable[[int, int], None] | None = None,
) -> Report:
    """Run every sentence through the model, summing head metrics as it goes (flat memory).

    Metrics are summed for every head (one vectorised pass); roles and files cover the
    chosen `layers` and `heads` (default: all). A treebank's sentences are read as its
    words, and its syntax and coreference are measured too (`attnviz.analysis.linguistics`).
    `importance` ("ablation", "gradient" or "both") also measures which heads matter to the
    model's objective on the same texts (`attnviz.analysis.importance`; `ablation` zero or
    mean), reporting `on_importance(batches done, batches)` as it goes.
    """
    import numpy as np

    from attnviz.analysis.importance import methods_of

    methods = methods_of(importance) if importance else []
    from attnviz.analysis.contributions import CorpusContributions
    from attnviz.analysis.linguistics import LinguisticSums
    from attnviz.analysis.reach import ReachRecorder
    from attnviz.analysis.reach import mean as mean_reach
    from attnviz.analysis.transforms import transform, word_view
    from attnviz.core.extract import attend, batched
    from attnviz.core.tokens import encode, encode_words
    from attnviz.core.treebank import Treebank

    chosen_layers = loaded.info.pick_layers(layers)
    chosen_heads = loaded.info.pick_heads(heads)
    if methods:
        from attnviz.analysis.importance import check_method

        for method in methods:
            check_method(loaded, method)  # before the corpus's pass, not after it
    skipped: list[str] = []
    treebank = sentences if isinstance(sentences, Treebank) else None
    waiting: deque = deque()  # the treebank sentences (and encodings) on their way
    kept: list = []  # the encoded texts, for importance (a few hundred bytes each)

    def encoded():
        for sentence in sentences.items:
            try:
                if treebank:
                    encoded_words = encode_words(
                        loaded, sentence.words, sentence.space_after, sentence.text, truncate
                    )
                    # before the yield: a batch may run right after
                    waiting.append((sentence, encoded_words))
                    item = encoded_words
                else:
                    item = encode(loaded, sentence.text, truncate)
                if methods:
                    kept.append(item)
                yield item
            except TextTooLongError as error:
                note = f"{sentences.source}, line {sentence.line}: skipped, {error}"
                skipped.append(note)
                if on_warning:
                    on_warning(note)

    sums = MetricSums()
    linguistic = LinguisticSums()
    changed: dict[str, int] = {}  # what encode_words had to do, sentences each
    example = None
    # special shares and mixing ratios, on tokens, from the same pass
    contributions = CorpusContributions(loaded)
    every_layer = list(range(loaded.info.n_layers))
    reaches: list[Reach] = []  # sinks and reach of each text, from blocks of rows
    for batch in batched(encoded(), batch_size):
        also = contributions.recorders([np.array(item.special, dtype=bool) for item in batch])
        reach = ReachRecorder(every_layer, loaded.info.n_heads, [len(item) for item in batch])
        for row, att in enumerate(attend(loaded, batch, also=[*also, reach])):
            contributions.add(row, att)
            shown = transform(att, words)
            sums.add(shown)
            if treebank:
                sentence, encoded_words = waiting.popleft()
                linguistic.add(shown if words else word_view(att), sentence)
                for kind, happened in (
                    (STAND_INS, encoded_words.stand_ins > 0),  # in the order of the notes
                    (CUT, encoded_words.truncated),
                ):
                    if happened:
                        changed[kind] = changed.get(kind, 0) + 1
            example = example or shown
            if on_progress:
                on_progress(1)
        reaches += reach.finish()
    if example is None:
        raise InputError("no sentence fits the model: every one was too long (try --truncate)")
    means = sums.means()
    chosen = thresholds or Thresholds()
    probes = None
    if loaded.info.causal:
        from attnviz.analysis.probes import run_probes

        probes = run_probes(loaded)
    wanted = {(layer, head) for layer in chosen_layers for head in chosen_heads}
    found = assign_roles(means, chosen, probes.scores if probes is not None else None)
    roles = [r for r in found if (r.layer, r.head) in wanted]
    measured = {}
    if methods:
        from attnviz.analysis.importance import importance as head_importance

        for method in methods:
            measured[method] = head_importance(
                loaded, kept, method, ablation, layers, heads, on_progress=on_importance
            )
    return Report(
        info=loaded.info,
        unit=example.unit,
        sentences=sums.sentences,
        queries=sums.queries,
        skipped=tuple(skipped),
        means=means,
        roles=tuple(roles),
        thresholds=chosen,
        example=example,
        layers=tuple(chosen_layers),
        heads=tuple(chosen_heads),
        probes=probes,
        special=contributions.special(),
        mixing=contributions.mixing(),
        reach=mean_reach(reaches),
        importance=measured.get("ablation"),
        importance_gradient=measured.get("gradient"),
        linguistics=linguistic.result(
            treebank, min_count, margin, tuple(f"{n} sentence(s) {k}" for k, n in changed.items())
        )
        if treebank
        else None,
    )
