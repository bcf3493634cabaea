"""`attnviz compare`: two texts through one model (a minimal pair), or texts through two
models: how far each head's pattern moved, per head and averaged over the pairs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analysis.compare import refuse_models
from attnviz.core.tokens import encode
from attnviz.outputs.files import prepare_dir
from attnviz.pipelines import checks
from attnviz.pipelines.readers import read_texts

if TYPE_CHECKING:
    from attnviz.analysis.compare import Comparison, Moved, QueryMoves
    from attnviz.analysis.importance import Importance
    from attnviz.pipelines.compare_questions import QuestionCompareResult
    from attnviz.pipelines.request import CompareRequest

OVERVIEW = "divergence"  # the overview figure's file name, without its extension


@dataclass(frozen=True)
class CompareResult:
    """Everything `compare` computed: the comparison, its most moved heads, the query's rows
    (with `query`) and the images written."""

    comparison: Comparison
    models: tuple[str, str]  # the names of the models that read A and B
    measure: str
    moved: list[Moved]
    query: QueryMoves | None
    folder: Path | None
    images: list[Path]
    importance: tuple[Importance, Importance] | None = None  # with importance: A's and B's
    pages: tuple[Path, ...] = ()  # with html: each pair's page

    def as_dict(self) -> dict[str, Any]:
        layers = self.comparison.layers
        return {
            "model": self.models[0],
            "against_model": self.models[1] if self.models[1] != self.models[0] else None,
            "measure": self.measure,
            "view": self.comparison.a.unit,
            **self.comparison.as_dict(),
            "moved": [m.as_dict() for m in self.moved],
            **({"query": self.query.as_dict(layers)} if self.query is not None else {}),
            **({"importance": self._importance_dict()} if self.importance else {}),
            "folder": str(self.folder) if self.folder is not None else None,
            "images": [str(p) for p in self.images],
            "pages": [str(p) for p in self.pages],
        }

    def _importance_dict(self) -> dict[str, Any]:
        assert self.importance is not None
        a, b = self.importance
        return {
            "a": {**a.as_dict(), "scores": a.scores.tolist()},
            "b": {**b.as_dict(), "scores": b.scores.tolist()},
            "clean_change": b.clean - a.clean,
            "change": (b.scores - a.scores).tolist(),
        }


def compare(request: CompareRequest) -> CompareResult | QuestionCompareResult:
    """Read each pair's text A with the request's model and text B with its `against` model
    (default: the same), compare them head by head (`analysis.compare`) and draw the
    divergence per head and the `top` heads that moved most (A, B and B − A) into its `out`.

    `words` compares whole words (needed when the two models' tokenizers differ); `measure`
    is a per-head measure (weights or norm); `query` a token of A whose row is followed (over
    several pairs, in every pair whose A has it: the mean). `importance` also measures each
    head's importance (zero ablation) to each model's objective on its texts: a head that
    moved can then be told from a head that matters. `html` also writes the interactive page
    of each pair (A, B and B − A in every view, `outputs.html.compare`). Two pictures and a
    question, or a picture and two (`questions`), are `compare_questions`'."""
    if request.questions is not None:  # a vision-language model's pictures and questions
        from attnviz.pipelines.compare_questions import compare_questions

        return compare_questions(request)
    from attnviz.analysis.compare import compare_pairs, follow_query, moved_heads
    from attnviz.analysis.transforms import transform
    from attnviz.core import models

    r = request
    model, other = r.model(), models.get(r.against or r.load)
    checks.before_compare(r, model, other)
    _fits(r, model, other)
    loaded, loaded_b = model.load(), other.load()
    for facts in (loaded.info, loaded_b.info):
        checks.against(r, facts)
    refuse_models(loaded, loaded_b, r.words)
    encoded_a = [_encode(loaded, r, a) for a, _ in r.pairs]
    encoded_b = [_encode(loaded_b, r, b) for _, b in r.pairs]
    html = r.html and r.out is not None
    insides = None
    if in_blocks(r, loaded, encoded_a + encoded_b):
        comparison = _compared_in_blocks(loaded, loaded_b, r, encoded_a, encoded_b)
    else:
        if loaded_b is loaded:  # one model: A and B share the passes (and the inside view)
            found, insides = read_texts(loaded, r, encoded_a + encoded_b, html)
            read_a, read_b = found[: len(r.pairs)], found[len(r.pairs) :]
        else:
            read_a, insides = read_texts(loaded, r, encoded_a, html)
            read_b, inside_b = read_texts(loaded_b, r, encoded_b, html)
            insides = insides + inside_b if html else None
        pairs = [(transform(a, r.words), transform(b, r.words)) for a, b in zip(read_a, read_b)]
        comparison = compare_pairs(pairs)
    moved = moved_heads(comparison, r.top, r.top_k)
    asked = follow_query(comparison, r.query, r.top_k) if r.query is not None else None
    matters = None
    if r.importance:
        from attnviz.analysis.importance import importance as head_importance

        matters = (head_importance(loaded, encoded_a), head_importance(loaded_b, encoded_b))
    names = (loaded.info.name, loaded_b.info.name)
    folder, written, pages = None, [], []
    if r.out is not None and (r.images or html):
        folder, written, pages = _draw(r, model, other, comparison, moved, names, matters,
                                       insides)  # fmt: skip
    return CompareResult(comparison, names, r.measure, moved, asked, folder, written, matters,
                         tuple(pages))  # fmt: skip


def in_blocks(request: CompareRequest, loaded: Any, encoded: list[Any]) -> bool:
    """Whether the pairs are compared a block of rows at a time (`analysis.compare_blocks`),
    no map held whole: the weights of tokens as read (no --words, --html, picture or
    continuation), and a pair's maps would take more than `memory.STREAM_ABOVE`."""
    from attnviz.core import memory

    if not _can_go_in_blocks(request):
        return False
    info, n = loaded.info, len(encoded) // 2
    kept = len(info.pick_layers(list(request.layers) if request.layers else None))
    lengths = [(len(a), len(b)) for a, b in zip(encoded[:n], encoded[n:])]
    return memory.compare_in_blocks(kept, info.n_heads, lengths)


def _can_go_in_blocks(request: CompareRequest) -> bool:
    """Whether what is asked can be compared in blocks: the weights of tokens as read (no
    --words, --measure, --html, picture or continuation)."""
    r = request
    html = r.html and r.out is not None
    return not (r.measure != "weights" or r.words or r.continues or r.pictures is not None
                or html)  # fmt: skip


def _fits(request: CompareRequest, model: Any, other: Any) -> None:
    """Refuse, one line, a comparison that would not fit in memory, from the models' files
    before they load (`memory.compare_estimate`: in blocks, or held whole)."""
    from attnviz.core import memory
    from attnviz.core.models import describe

    specs = [describe(m.name) for m in (model, other)]
    if request.pictures is not None or any(
        s is None or s.seq2seq or s.tokenizer_file is None for s in specs
    ):
        return
    spec, spec_b = specs
    count_a = spec.count_lengths([a for a, _ in request.pairs])
    count_b = spec_b.count_lengths([b for _, b in request.pairs])
    if spec.max_tokens is not None and request.truncate:
        count_a = [min(n, spec.max_tokens) for n in count_a]
        count_b = [min(n, spec_b.max_tokens or n) for n in count_b]
    lengths = list(zip(count_a, count_b))
    kept = len(spec.pick_layers(list(request.layers) if request.layers else None))
    blocks = _can_go_in_blocks(request) and memory.compare_in_blocks(kept, spec.n_heads, lengths)
    weights = request.load.weights_held(spec)
    if other is not model:
        weights += (request.against or request.load).weights_held(spec_b)
    # eager attention, asked for or the type's (`ModelSpec.eager_only`), makes layers whole
    eager = any(
        load.implementation == "eager" or s.eager_only
        for load, s in ((request.load, spec), (request.against or request.load, spec_b))
    )
    found = memory.compare_estimate(kept, spec.n_heads, weights, lengths, blocks, eager,
                                    two_passes=other is not model)  # fmt: skip
    longest = max(max(pair) for pair in lengths)
    how = "" if blocks else (
        "; the weights of tokens as read (no --words, --measure, --html) compare long "
        "texts in blocks of rows")  # fmt: skip
    memory.refuse_estimate(found, f"compare of {len(lengths)} pair(s) (up to {longest:,} "
                           "tokens)", f"compare shorter texts{how}")  # fmt: skip


def _compared_in_blocks(loaded: Any, loaded_b: Any, request: CompareRequest,
                        encoded_a: list[Any], encoded_b: list[Any]) -> Comparison:  # fmt: skip
    """Each pair compared a block of rows at a time, its maps pooled where they would be drawn
    larger than a figure can show (`pipelines.views`): A and B in one padded pass where one
    model reads both, else each read by its model at once, the two passes in step."""
    import numpy as np

    from attnviz.analysis.compare import combine
    from attnviz.analysis.compare_blocks import PairBlocks
    from attnviz.core import capture, memory
    from attnviz.core.extract import text_attention
    from attnviz.core.tokens import pad
    from attnviz.pipelines.views import image_pool_size

    info = loaded.info
    layers = info.pick_layers(list(request.layers) if request.layers else None)
    no_map = np.zeros((len(layers), info.n_heads, 0, 0), np.float32)  # tokens and facts alone
    found = []
    for a, b in zip(encoded_a, encoded_b):
        text_a = text_attention(a, info, layers, no_map)
        text_b = text_attention(b, loaded_b.info, layers, no_map)
        # four kinds of pooled map (A's, B's, and both sides' unit grids) share what the
        # figures of one text may hold
        maps = 4 * len(layers)
        sizes = [image_pool_size(maps, info.n_heads, len(e), len(e)) for e in (a, b)]
        units = min(len(a), len(b))  # at most: the alignment's units
        sizes.append(image_pool_size(maps, info.n_heads, units, units))
        pair = PairBlocks(text_a, text_b, layers, (0, 1), tuple(sizes), request.query)
        # a block of both texts' rows within memory.STREAM_BLOCK, in one pass or in two
        rows = memory.stream_rows(2 * info.n_heads, max(len(a), len(b)))
        if loaded_b is loaded:
            capture.run(loaded, pad(loaded, [a, b]), [pair], block_rows=rows)
        else:
            _in_step(pair, ((loaded, a), (loaded_b, b)), rows)
        found.append(pair.result())
    return combine(found)


def _in_step(pair: Any, sides: tuple[tuple[Any, Any], ...], rows: int) -> None:
    """A read by its model here and B by its own in a thread, at once, the two passes kept
    within a block of each other (`compare_blocks.Lockstep`); a failure of either is raised
    here, and stops the other at its next block."""
    import threading

    from attnviz.analysis.compare_blocks import Lockstep, Stopped
    from attnviz.core import capture
    from attnviz.core.tokens import pad

    step = Lockstep(pair)
    errors: list[BaseException | None] = [None, None]

    def read(side: int) -> None:
        loaded, encoded = sides[side]
        try:
            capture.run(loaded, pad(loaded, [encoded]), [step.sides[side]], block_rows=rows)
        except BaseException as error:  # raised in the caller's thread below
            errors[side] = error
            step.end(side, failed=True)
        else:
            step.end(side)

    other = threading.Thread(target=read, args=(1,), name="attnviz-compare-b", daemon=True)
    other.start()
    try:
        read(0)
        other.join()
    except BaseException:  # Ctrl-C while waiting for B's pass: stop it
        step.end(0, failed=True)
        raise
    raised = [error for error in errors if error is not None and not isinstance(error, Stopped)]
    if raised:
        raise raised[0]


def _encode(loaded: Any, request: CompareRequest, text: str) -> Any:
    """A text as `loaded` reads it, or a picture (`request.pictures`: `text` is its path)."""
    if request.pictures is not None:
        from attnviz.core.images import encode_picture

        return encode_picture(loaded, text)
    return encode(loaded, text, request.truncate)


def _draw(request, model, other, comparison, moved, models, matters, insides):
    """The figures (`request.images`) and, with `insides` (each text's inside view: A's, then
    B's), each pair's page, written into one folder per comparison (holding only its last
    run's files): the folder, the figures' paths and the pages'."""
    from attnviz.outputs.figures import Style
    from attnviz.outputs.files import (
        clear_previous,
        text_folder_name,
        write_done,
        write_text_atomic,
    )

    r = request
    style, pairs, measure, words = r.style or Style(), list(r.pairs), r.measure, r.words
    keys = [b for _, b in pairs] + [a for a, _ in pairs[1:]]
    against = other.folder_key if other is not model else None
    name = text_folder_name(pairs[0][0], 40, "compare", *keys, model.folder_key,
                            against and f"against:{against}", measure,
                            "words" if words else None,
                            "importance" if matters else None)  # fmt: skip
    pages = []
    if insides is not None:  # built first: a page over its size is refused before any file
        from attnviz.outputs.html.compare import compare_pages

        pages = compare_pages(comparison, insides, models, style.scale, style.cmap)
    folder = prepare_dir(r.out / name)
    clear_previous(folder, text_folder=True)
    written = []
    if r.images:
        written = _figures(folder, pairs, comparison, moved, measure, style, models, matters)
    pages = [write_text_atomic(folder / page_name, page) for page_name, page in pages]
    settings = {"model": models[0], "against_model": models[1], "pairs": [list(p) for p in pairs],
                "measure": measure, "words": words, "importance": matters is not None,
                "images": r.images, "html": insides is not None, **asdict(style)}  # fmt: skip
    record = {"files": [str(path.relative_to(folder.parent)) for path in written + pages]}
    write_done(folder, settings, record)
    return folder, written, pages


def _figures(folder, pairs, comparison, moved, measure, style, models, matters):
    """The overview of divergence per head, each moved head's A, B and B − A, and with
    `matters` the importance figures; the paths written."""
    from attnviz.outputs.figures import (
        difference_figure,
        divergence_figure,
        importance_figure,
        moved_or_matters_figure,
        save_figure,
    )

    who = models[0] if models[0] == models[1] else f"A: {models[0]}, B: {models[1]}"
    over = f"mean over {len(pairs)} pairs" if len(pairs) > 1 else "A → B"
    layers, heads = comparison.layers, list(range(comparison.divergence.shape[1]))
    title = f"How far each head moved ({over}; {measure})\n{who}"
    written = [save_figure(divergence_figure(comparison.divergence, layers, heads, title, style),
                           folder / f"{OVERVIEW}.{style.fmt}", style)]  # fmt: skip
    for m in moved:
        pair = comparison.pairs[m.pair]
        slot = layers.index(m.layer)
        where = f"pair {m.pair + 1}, " if len(pairs) > 1 else ""
        title = (f"L{m.layer} H{m.head}: JS divergence {pair.divergence[slot, m.head]:.4f} "
                 f"nats ({where}{measure}; {who})")  # fmt: skip
        if pair.unit_size > 1:
            title += f"\neach cell the mean of {pair.unit_size} × {pair.unit_size} aligned tokens"
        figure = difference_figure(pair.grids_a[slot, m.head], pair.grids_b[slot, m.head],
                                   pair.grid_labels(), title, style)  # fmt: skip
        path = folder / f"layer-{m.layer}-head-{m.head}-compare.{style.fmt}"
        written.append(save_figure(figure, path, style))
        if pair.a.picture is not None and pair.a.picture.first and pair.b.picture.first:
            from attnviz.outputs.figures.pictures import pair_figure

            figure = pair_figure(pair.a, pair.b, m.layer, m.head, style)  # CLS over each
            path = folder / f"layer-{m.layer}-head-{m.head}-pictures.{style.fmt}"
            written.append(save_figure(figure, path, style))
    if matters is not None:
        for side, found, who_read in (("a", matters[0], models[0]), ("b", matters[1], models[1])):
            title = f"Head importance by {found.how} ({side.upper()}) — {who_read}"
            figure = importance_figure(found.scores, found.ranks(), layers, heads, title,
                                       found.measure, style)  # fmt: skip
            path = folder / f"importance-{side}.{style.fmt}"
            written.append(save_figure(figure, path, style))
        figure = moved_or_matters_figure(comparison.divergence, matters[0].scores,
                                         matters[1].scores, layers, matters[0].measure,
                                         f"Moved or matters? ({who})", style)  # fmt: skip
        written.append(save_figure(figure, folder / f"moved-or-matters.{style.fmt}", style))
    return written
