"""The one-stack `report`'s pass over a corpus, in parts: read the corpus once (which texts fit,
their lengths, the batches), run any part of its batches into `ReportSums`, and measure head
importance on any part of its texts. One process runs every part; a distributed run's ranks
and `report --shard` each run one (`pipelines.distributed`).

A text's numbers depend on the batch it is padded in (float32 kernels see other shapes), so
the batches are the corpus's, fixed before it is split: a part is a run of whole batches, and
every text is measured exactly as one process measures it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, TextTooLongError

if TYPE_CHECKING:
    from attnviz.analysis.importance import ImportanceRun, ImportanceSums
    from attnviz.analysis.probes import ProbeResult
    from attnviz.analysis.report import Report
    from attnviz.analysis.report_sums import ReportSums
    from attnviz.analysis.roles import Thresholds
    from attnviz.core.attention import Encoded
    from attnviz.core.inputs import Sentences
    from attnviz.core.model_info import LoadedModel, ModelInfo
    from attnviz.core.treebank import Treebank

# What encode_words had to do to a treebank sentence, as the report counts it.
CUT = "cut to the model's limit (--truncate); arcs and mentions past the cut left out"
STAND_INS = "had a word the tokenizer drops, given as its unknown token"


@dataclass(frozen=True)
class Corpus:
    """A corpus as the model reads it: the texts that fit (their positions among the input's
    items, in order: a text's index below is its place in `kept`), their token counts, the
    notes on those skipped, what encoding did to treebank sentences, and the batches."""

    kept: tuple[int, ...]
    lengths: tuple[int, ...]
    skipped: tuple[str, ...]
    notes: tuple[str, ...]
    batch_size: int

    @property
    def batches(self) -> list[range]:
        """The batches of the pass, of indices into `kept`, `batch_size` each."""
        n, size = len(self.kept), self.batch_size
        return [range(s, min(s + size, n)) for s in range(0, n, size)]

    def costs(self) -> list[int]:
        """Each batch's padded tokens: what its forward pass computes on."""
        return [len(batch) * max(self.lengths[i] for i in batch) for batch in self.batches]


def encode_item(
    loaded: LoadedModel, sentences: Sentences | Treebank, item: int, truncate: bool
) -> Encoded:
    """The input's item `item` encoded as the report reads it (a treebank's as its words)."""
    from attnviz.core.tokens import encode, encode_words
    from attnviz.core.treebank import Treebank

    sentence = sentences.items[item]
    if isinstance(sentences, Treebank):
        return encode_words(loaded, sentence.words, sentence.space_after, sentence.text, truncate)
    return encode(loaded, sentence.text, truncate)


def read_corpus(
    loaded: LoadedModel,
    sentences: Sentences | Treebank,
    batch_size: int,
    truncate: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> Corpus:
    """Tokenise every text once, noting (and warning of) those too long for the model."""
    kept, lengths, skipped = [], [], []
    changed: dict[str, int] = {}  # what encode_words had to do, sentences each
    for item, sentence in enumerate(sentences.items):
        try:
            encoded = encode_item(loaded, sentences, item, truncate)
        except TextTooLongError as error:
            note = f"{sentences.origin}, line {sentence.line}: skipped, {error}"
            skipped.append(note)
            if on_warning:
                on_warning(note)
            continue
        kept.append(item)
        lengths.append(len(encoded))
        for kind, happened in ((STAND_INS, encoded.stand_ins > 0), (CUT, encoded.truncated)):
            if happened:  # in the order of the notes
                changed[kind] = changed.get(kind, 0) + 1
    if not kept:
        raise InputError("no sentence fits the model: every one was too long (try --truncate)")
    notes = tuple(f"{n} sentence(s) {kind}" for kind, n in changed.items())
    return Corpus(tuple(kept), tuple(lengths), tuple(skipped), notes, batch_size)


def split(costs: Sequence[int], parts: int) -> list[range]:
    """`parts` runs of consecutive items, each as close to an equal share of the total cost as
    whole items allow (a part may be empty where there are fewer items than parts)."""
    total = sum(costs)
    cuts, done, item = [0], 0, 0
    for part in range(1, parts):
        while item < len(costs) and done + costs[item] / 2 < total * part / parts:
            done += costs[item]
            item += 1
        cuts.append(item)
    cuts.append(len(costs))
    return [range(cuts[k], cuts[k + 1]) for k in range(parts)]


def run_part(
    loaded: LoadedModel,
    sentences: Sentences | Treebank,
    corpus: Corpus,
    batches: Sequence[int],
    words: bool = False,
    truncate: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> ReportSums:
    """The sums of the corpus's batches `batches` (indices into `corpus.batches`): every head's
    metrics on the view the report shows (`words`), special shares and mixing ratios on
    tokens, sinks and reach, and a treebank's syntax and coreference, from one pass a batch."""
    import numpy as np

    from attnviz.analysis.contributions import CorpusContributions
    from attnviz.analysis.linguistics import LinguisticSums
    from attnviz.analysis.metrics import MetricSums
    from attnviz.analysis.reach import ReachRecorder, ReachSums
    from attnviz.analysis.report_sums import ReportSums
    from attnviz.analysis.transforms import transform, word_view
    from attnviz.core.extract import attend
    from attnviz.core.treebank import Treebank

    contributions = CorpusContributions(loaded)  # special shares and mixing ratios
    linguistic = LinguisticSums() if isinstance(sentences, Treebank) else None
    sums = ReportSums(MetricSums(), contributions.sums, ReachSums(), linguistic)
    every_layer = list(range(loaded.info.n_layers))
    for b in batches:
        indices = list(corpus.batches[b])
        batch = [encode_item(loaded, sentences, corpus.kept[i], truncate) for i in indices]
        streams = _streams(loaded, batch, words, linguistic is not None)
        # long texts are summed from blocks of rows (no map held whole), a text at a time, so
        # that the memory does not grow with the batch either
        groups = [[row] for row in range(len(batch))] if streams else [range(len(batch))]
        for group in groups:
            rows = [batch[row] for row in group]
            also = contributions.recorders([np.array(item.special, dtype=bool) for item in rows])
            reach = ReachRecorder(every_layer, loaded.info.n_heads, [len(item) for item in rows])
            first = 0 in [indices[row] for row in group]  # the corpus's first text: the example
            streamed = _Streamed(example=first) if streams else None
            if streamed is not None:
                found = streamed.read(loaded, rows, [*also, reach])
            else:
                found = attend(loaded, rows, also=[*also, reach])
            for row, (att, text_reach) in enumerate(zip(found, reach.finish())):
                index = indices[group[row]]
                stats = streamed.stats[row] if streamed is not None else None
                contributions.add(row, att, index, stats.special_shares() if stats else None)
                shown = transform(att, words)
                metrics = (stats.metric_sums, stats.metric_counts[:, 0]) if stats else None
                repeats = (stats.repeats, stats.repeat_counts[:, 0]) if stats else None
                sums.metrics.add(shown, index, metrics, repeats)
                sums.reach.add(index, text_reach)
                if sums.linguistic is not None:
                    view = shown if words else word_view(att)
                    sums.linguistic.add(view, sentences.items[corpus.kept[index]], index)
                if index == 0:  # a long text's: the exact cells of its first tokens
                    sums.example = streamed.example(row, shown) if streamed else shown
                if on_progress:
                    on_progress(1)
    return sums


def _streams(loaded: LoadedModel, batch: list[Any], words: bool, treebank: bool) -> bool:
    """Whether a batch whose maps would take over `core.memory.STREAM_ABOVE` is read a text
    at a time in blocks of rows (`_Streamed`), or held (a short batch; --words and a
    treebank's word views need every map whole)."""
    from attnviz.core import memory

    info, width = loaded.info, max(len(item) for item in batch)
    held = len(batch) * info.n_layers * info.n_heads * width * width * memory.FLOAT
    return held > memory.STREAM_ABOVE and not words and not treebank


class _Streamed:
    """A batch read in blocks of rows: each text's head metrics and special shares by weight
    summed as the pass makes them (`analysis.summary.HeadStats`); its Attention holds no maps
    (a zero-size stand-in of their shape). The report's example figures take the exact cells
    of the corpus's first text's first EXAMPLE tokens (`analysis.window`), kept only where
    `example` says the batch holds that text."""

    EXAMPLE = 256

    def __init__(self, example: bool) -> None:
        self.keeps_example = example  # whether the batch holds the text the figures draw

    def read(self, loaded: LoadedModel, batch: list[Any], recorders: list[Any]) -> list[Any]:
        import numpy as np

        from attnviz.analysis.summary import HeadStats
        from attnviz.analysis.window import WindowCells
        from attnviz.core import capture, memory
        from attnviz.core.extract import text_attention
        from attnviz.core.tokens import pad

        info, layers = loaded.info, list(range(loaded.info.n_layers))
        texts = []
        for item in batch:
            n = len(item)
            stand_in = np.broadcast_to(np.zeros((), np.float32), (len(layers), info.n_heads, n, n))
            texts.append(text_attention(item, info, layers, stand_in))
        self.stats = [HeadStats(att, len(layers), info.n_heads) for att in texts]
        self.wants = {layer: ("rows", "entropy") for layer in layers}
        self.firsts = [WindowCells(layers, info.n_heads, 0, min(self.EXAMPLE, len(item)))
                       if self.keeps_example else None for item in batch]  # fmt: skip
        width = max(len(item) for item in batch)
        block = memory.stream_rows(info.n_heads * len(batch), width)
        capture.run(loaded, pad(loaded, batch), [*recorders, self], block_rows=block)
        return texts

    def example(self, row: int, att: Any) -> Any:
        """Batch row `row`'s first tokens, exact: what the report's example figures draw."""
        from attnviz.analysis.window import window_attention

        cells = self.firsts[row]
        return window_attention(att, cells.held, cells.start, cells.end)

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        return None

    def receive_rows(self, layer: int, start: int, rows: Any, entropy: Any) -> None:
        for row, stats in enumerate(self.stats):  # rows (B, H, b, W): each text's own
            n = len(stats.att.tokens)
            if start < n:
                own = rows[row, :, : n - start, :n]  # (H, b, W)
                stats.add(start, own, layer, entropy[row, :, : n - start])
                if self.firsts[row] is not None:
                    self.firsts[row].add(layer, start, own.numpy())


def importance_runs(
    loaded: LoadedModel,
    sentences: Sentences | Treebank,
    corpus: Corpus,
    methods: list[str],
    part: tuple[int, int] = (0, 1),
    truncate: bool = False,
    **options: Any,
) -> dict[str, tuple[ImportanceRun, range]]:
    """Each importance method's run over the corpus's texts, and which of its batches of texts
    part `part` = (k, n) of the work holds (the whole for (0, 1)): only those texts are
    encoded. `options`: ablation, layers, heads."""
    from attnviz.analysis.importance import ImportanceRun, batches_of

    batches = batches_of(corpus.lengths)  # every method's
    costs = [len(rows) * max(corpus.lengths[i] for i in rows) for rows in batches]
    mine = split(costs, part[1])[part[0]]
    texts = {
        i: encode_item(loaded, sentences, corpus.kept[i], truncate)
        for b in mine
        for i in batches[b]
    }
    return {
        method: (ImportanceRun(loaded, texts, corpus.lengths, method, **options), mine)
        for method in methods
    }


def measure_importance(
    runs: dict[str, tuple[ImportanceRun, range]],
    means: Callable[[str, ImportanceSums], ImportanceSums] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, ImportanceSums]:
    """Each run's sums over its part; `means(method, sums)` gives the sums of every part's
    clean pass, for mean ablation (one process: its own)."""
    found = {}
    for method, (run, mine) in runs.items():
        sums = run.clean(mine, on_progress)
        if method == "ablation":
            everyone = means(method, sums) if means is not None else sums
            run.ablate(sums, mine, run.means(everyone), on_progress)
        found[method] = sums
    return found


def finish(
    info: ModelInfo,
    sums: ReportSums,
    corpus: Corpus,
    *,
    texts_per_rank: tuple[int, ...],
    treebank: Any = None,
    probes: ProbeResult | None = None,
    objectives: dict[str, str] | None = None,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    thresholds: Thresholds | None = None,
    min_count: int = 100,
    margin: float = 0.1,
    ablation: str = "zero",
    **ignored: Any,
) -> Report:
    """The report of the whole corpus from the sums of all its parts (no model needed): each
    importance method's scores by the objective named in `objectives`; `treebank` (its
    `has_syntax`, `has_coreference` and `notes`) where the corpus was one. `ignored` takes the
    options that only the pass uses."""
    from attnviz.analysis.importance import OBJECTIVES, score
    from attnviz.analysis.report_sums import build

    chosen_layers, chosen_heads = info.pick_layers(layers), info.pick_heads(heads)
    importance = {
        method: score(
            found,
            info,
            OBJECTIVES[(objectives or {})[method]],
            method,
            ablation,
            chosen_layers,
            chosen_heads,
            len(corpus.kept),
        )  # fmt: skip
        for method, found in sums.importance.items()
    }
    return build(
        sums, info, layers=layers, heads=heads, thresholds=thresholds, skipped=corpus.skipped,
        texts_per_rank=texts_per_rank, probes=probes, importance=importance, treebank=treebank,
        min_count=min_count, margin=margin, notes=corpus.notes,
    )  # fmt: skip


def probes_of(loaded: LoadedModel) -> Any:
    """A causal model's induction and duplicate-token probes; None for an encoder."""
    if not loaded.info.causal:
        return None
    from attnviz.analysis.probes import run_probes

    return run_probes(loaded)


def objectives(loaded: LoadedModel, methods: list[str]) -> dict[str, str]:
    """The objective each importance method measures on `loaded`, by method."""
    from attnviz.analysis.importance import check_method

    return {method: check_method(loaded, method).name for method in methods}
