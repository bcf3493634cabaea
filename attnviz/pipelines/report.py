"""`attnviz report`: what each head does over a corpus, as numbers, roles, figures and Markdown."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from importlib import resources
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

if TYPE_CHECKING:
    from attnviz.core.inputs import Sentences
    from attnviz.core.models import LoadedModel, Model
    from attnviz.core.treebank import Treebank
    from attnviz.outputs.figures import Style

from attnviz.analysis.report import Report
from attnviz.outputs.report_files import write_report

# The default corpus ships inside the package, so an installed wheel finds it too.
DEFAULT_CORPUS = Path(str(resources.files("attnviz.data").joinpath("sentences.txt")))


# What encode_words had to do to a treebank sentence, as the report counts it.
CUT = "cut to the model's limit (--truncate); arcs and mentions past the cut left out"
STAND_INS = "had a word the tokenizer drops, given as its unknown token"


def report(
    model: Model, sentences: Sentences, out: Path, style: Style, **options: Any
) -> tuple[Report, list[Path]]:
    """Load the model, build the report over `sentences` and write it to `out`."""
    model.refuse_early(options.get("layers"), options.get("heads"))
    prepare_dir(out)
    result = build_report(model.load(), sentences, **options)
    return result, write_report(result, out, style)


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
    from attnviz.analysis.importance import methods_of

    methods = methods_of(importance) if importance else []
    from attnviz.analysis.linguistics import LinguisticSums
    from attnviz.analysis.transforms import transform, word_view
    from attnviz.core.extract import extract_many
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
    for att in extract_many(loaded, encoded(), batch_size):
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
        importance=measured.get("ablation"),
        importance_gradient=measured.get("gradient"),
        linguistics=linguistic.result(
            treebank, min_count, margin, tuple(f"{n} sentence(s) {k}" for k, n in changed.items())
        )
        if treebank
        else None,
    )
