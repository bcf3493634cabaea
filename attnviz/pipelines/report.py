"""`attnviz report`: what each head does over a corpus, as numbers, roles, figures and Markdown.

An encoder-decoder model reads `source<TAB>target` lines: its encoder and decoder
self-attention get positional roles, its cross-attention alignment metrics
(`attnviz.analysis.alignment`).
"""

from __future__ import annotations

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
from attnviz.outputs.files import check_writable
from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.core.attention import Attention
    from attnviz.core.inputs import Sentences
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.treebank import Treebank
    from attnviz.pipelines.request import ReportRequest

from attnviz.analysis.report import CrossReport, Report, Seq2SeqReport
from attnviz.outputs.report_files import write_report, write_seq2seq_report


def report(request: ReportRequest, **callbacks: Any) -> tuple[Any, list[Path]]:
    """Load the model, build the report over `request.sentences` (a treebank's with its
    syntax and coreference) and write it to `request.out`; an encoder-decoder model's over
    the sentences read as `source<TAB>target` pairs; a vision model's over
    `request.pictures` (`pipelines.picture_report`). With `request.shard` ("I/N") or under a
    launcher, in parts (`pipelines.distributed.report_split`). `callbacks`: on_progress,
    on_warning, on_importance and on_ranks, as `build_report` and the parts take them."""
    from dataclasses import replace

    from attnviz.core.models import describe
    from attnviz.pipelines.distributed import launched, report_split

    request = replace(request, launched=launched() is not None)
    if request.questions is not None:  # a vision-language model's pictures and questions
        from attnviz.pipelines.question_report import question_report

        return question_report(request, **callbacks)
    if request.generate is not None:
        raise InputError("--generate in attnviz report answers the questions of a file of "
                         "pictures and prompts (QUESTIONS.jsonl, "
                         "docs/vision-language.md)")  # fmt: skip
    if request.pictures is not None:  # a vision model's report over pictures
        from attnviz.pipelines.picture_report import picture_report

        return picture_report(request, **callbacks)
    model, sentences = request.model(), request.sentences
    on_ranks = callbacks.pop("on_ranks", None)
    options = _options(request, callbacks)
    spec = describe(model.name)
    checks.against(request, spec)
    if spec is not None and spec.seq2seq:  # bad lines refused before anything is written
        sentences = _pairs(sentences)
    else:
        checks.ranges(model, options["layers"], options["heads"])
        checks.fits(request, model, [item.text for item in sentences.items])
    if request.shard is not None or request.launched:  # refused after loading, where needed
        return report_split(model, sentences, request.out, request.style, request.shard,
                            request.partial, request.resume, on_ranks, request=request,
                            **options)  # fmt: skip
    check_writable(request.out)  # made when its files are written
    loaded = model.load()
    checks.against(request, loaded.info)  # a hub id: its files said nothing before it loaded
    if not loaded.info.seq2seq:
        result = build_report(loaded, sentences, **options)
        return result, write_report(result, request.out, request.style)
    if spec is None:
        sentences = _pairs(sentences)
    seq2seq = build_seq2seq_report(loaded, sentences, **options)
    return seq2seq, write_seq2seq_report(seq2seq, request.out, request.style)


def _options(request: ReportRequest, callbacks: dict[str, Any]) -> dict[str, Any]:
    """What the report's builders take, from the request and its callbacks."""
    r = request
    return dict(layers=list(r.layers) if r.layers else None,
                heads=list(r.heads) if r.heads else None, words=r.words,
                thresholds=r.thresholds, batch_size=r.batch_size, truncate=r.truncate,
                min_count=r.min_count, margin=r.margin, importance=r.importance,
                ablation=r.ablation, **callbacks)  # fmt: skip


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
    from attnviz.core.extract import batched
    from attnviz.core.seq2seq import encode_source_target

    skipped: list[str] = []

    def encoded():
        for pair in pairs.items:
            try:
                yield encode_source_target(loaded, pair.text, pair.target, truncate=truncate)
            except TextTooLongError as error:
                note = f"{pairs.origin}, line {pair.line}: skipped, {error}"
                skipped.append(note)
                if on_warning:
                    on_warning(note)

    sums = _StackSums(loaded)
    for batch in batched(encoded(), batch_size):
        for _ in sums.add(batch):
            if on_progress:
                on_progress(1)
    if not sums.example:
        raise InputError("no pair fits the model: every one was too long (try --truncate)")
    return sums.report(thresholds or Thresholds(), tuple(skipped))


class _StackSums:
    """An encoder-decoder report's running sums: each self-attention stack's head metrics and
    special shares, cross-attention's alignment by weight and by norm, and an example pair."""

    def __init__(self, loaded: LoadedModel) -> None:
        from attnviz.analysis.alignment import AlignmentSums
        from attnviz.analysis.contributions import CorpusContributions

        self.loaded = loaded
        self.sums = {"encoder": MetricSums(), "decoder": MetricSums()}
        # each self-attention stack's special shares, from the same pass
        self.contributions = {stack: CorpusContributions(loaded, stack) for stack in self.sums}
        self.alignment, self.by_norm = AlignmentSums(), AlignmentSums()
        self.example: dict[str, Attention] = {}

    def add(self, batch: list[Any]) -> Any:
        """Read `batch` (source-target pairs) in one pass over every stack and add each pair;
        yields once a pair is added."""
        from dataclasses import replace

        import numpy as np

        from attnviz.analysis.contributions import MeasureRecorder, get, shares
        from attnviz.core.extract import attend_stacks
        from attnviz.core.layer_map import STACKS

        loaded, cross_layers = self.loaded, list(range(self.loaded.info.of_stack("cross").n_layers))
        # cross-attention's norms ‖α f(x)‖ from the same pass (Kobayashi et al. 2020)
        widths = (max(len(item.target) for item in batch), max(len(item.source) for item in batch))
        norms = MeasureRecorder(
            loaded, get("norm"), cross_layers, len(batch), *widths, stack="cross"
        )
        also: list = [norms]
        for stack, corpus in self.contributions.items():
            side = "source" if stack == "encoder" else "target"
            special = [np.array(getattr(item, side).special, dtype=bool) for item in batch]
            also += corpus.recorders(special)
        for row, found in enumerate(attend_stacks(loaded, batch, STACKS, also=also)):
            for stack, stack_sums in self.sums.items():
                stack_sums.add(found[stack])
                self.contributions[stack].add(row, found[stack])
            cross = found["cross"]
            self.alignment.add(cross)
            n_target, n_source = cross.weights.shape[-2:]
            held = norms.held[row, :, :, :n_target, :n_source]  # (L, H, T, S)
            self.by_norm.add(shares(replace(cross, weights=held, measure="norm")))
            self.example = self.example or found
            yield

    def report(self, chosen: Thresholds, skipped: tuple[str, ...]) -> Seq2SeqReport:
        """Every stack's report from the sums."""
        reports = {}
        for stack, stack_sums in self.sums.items():
            means = stack_sums.means()
            info = self.loaded.info.of_stack(stack)
            reports[stack] = Report(
                info=info,
                unit="token",
                sentences=stack_sums.sentences,
                queries=stack_sums.queries,
                skipped=skipped,
                means=means,
                roles=tuple(assign_roles(means, chosen)),
                thresholds=chosen,
                example=self.example[stack],
                layers=tuple(range(info.n_layers)),
                heads=tuple(range(info.n_heads)),
                special=self.contributions[stack].special(),
            )
        cross_info = self.loaded.info.of_stack("cross")
        cross = CrossReport(cross_info, self.alignment.means(), self.example["cross"],
                            self.by_norm.means())  # fmt: skip
        read = self.sums["encoder"].sentences  # every stack read every pair
        return Seq2SeqReport(self.loaded.info, read, skipped, reports, cross)


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

    One process runs every part of the corpus (`pipelines.corpus`); a distributed run splits
    them (`pipelines.distributed`) and gets the same numbers.
    """
    from dataclasses import replace

    from attnviz.analysis.contributions import mixing_left_out
    from attnviz.pipelines import corpus

    methods = checks.before_pass(loaded, layers, heads, importance)
    read = corpus.read_corpus(loaded, sentences, batch_size, truncate, on_warning)
    left_out = mixing_left_out(loaded)
    if left_out is not None and on_warning:
        on_warning(f"the mixing ratios are left out: {left_out}")
    every = range(len(read.batches))
    sums = corpus.run_part(loaded, sentences, read, every, words, truncate, on_progress)
    runs = corpus.importance_runs(loaded, sentences, read, methods, truncate=truncate,
                                  ablation=ablation, layers=layers, heads=heads)  # fmt: skip
    sums.importance = corpus.measure_importance(runs, on_progress=on_importance)
    report = corpus.finish(
        loaded.info, sums, read, texts_per_rank=(sums.texts,), treebank=sentences,
        probes=corpus.probes_of(loaded), objectives=corpus.objectives(loaded, methods),
        layers=layers, heads=heads,
        thresholds=thresholds, min_count=min_count, margin=margin, ablation=ablation,
    )  # fmt: skip
    return replace(report, mixing_left_out=left_out)
