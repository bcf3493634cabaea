"""`attnviz show`: one text through a model, summarised per head and drawn as heatmaps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import Interrupted
from attnviz.outputs.files import (
    TEXT_FILES,
    clear_previous,
    prepare_dir,
    text_folder_name,
    write_done,
)

if TYPE_CHECKING:
    from attnviz.analysis.importance import AblationView
    from attnviz.analysis.query import QueryView
    from attnviz.analysis.summary import HeadSummary
    from attnviz.core.attention import Attention
    from attnviz.core.models import Model
    from attnviz.outputs.figures import Style


@dataclass(frozen=True)
class ShowResult:
    """Everything `show` computed: the attention, per-head summaries and the images written."""

    attention: Attention  # after --words / --hide-special
    layers: list[int]
    heads: list[int]
    summaries: list[HeadSummary]
    folder: Path | None
    images: list[Path]
    query: QueryView | None = None
    page: Path | None = None  # attention.html, with html=True
    # (L, H) each: the share special tokens take, by weight and by norm ‖α f(x)‖
    special_by_weight: Any = None
    special_by_norm: Any = None
    mixing: dict[int, dict[str, float]] | None = None  # alti: each layer's mixing ratios
    ablation: AblationView | None = None  # with ablate: the text with those heads removed
    # with ablate: (L, H) how far each kept head's pattern moved (JS divergence, nats)
    ablation_divergence: Any = None

    def as_dict(self) -> dict[str, Any]:
        from attnviz.analysis.contributions import MEASURES
        from attnviz.analysis.summary import AVERAGED

        att = self.attention
        heads = [s.as_dict(att.key_tokens) for s in self.summaries]
        if self.query is not None:
            for entry, row in zip(heads, self.query.heads):
                entry["query_top"] = row.as_dict()
        measure = MEASURES[att.measure]
        special = {}
        if self.special_by_weight is not None:
            import numpy as np

            def per_head(values: Any) -> list[list[float | None]]:  # null: a removed head
                rows = values.round(6).tolist()
                return [[None if np.isnan(v) else v for v in row] for row in rows]

            special = {
                "special_share": {
                    "weights": float(np.nanmean(self.special_by_weight)),
                    "norm": float(np.nanmean(self.special_by_norm)),
                    "per_head_weights": per_head(self.special_by_weight),
                    "per_head_norm": per_head(self.special_by_norm),
                }
            }
        return {
            "model": att.info.as_dict(),
            "measure": {
                "name": measure.name,
                "unit": measure.unit,
                "per_layer": measure.per_layer,
                "help": measure.help,
                "cite": measure.cite,
            },
            "unit": att.unit,
            **_stack_fields(att),
            "tokens": list(att.tokens),
            "notes": list(att.notes),
            **({"query": self.query.as_dict()} if self.query is not None else {}),
            "averaged": AVERAGED + _MEASURED.get(measure.name, ""),
            **special,
            **({"mixing": self.mixing} if self.mixing is not None else {}),
            "heads": heads,
            "folder": str(self.folder) if self.folder is not None else None,
            "images": [str(p) for p in self.images],
            "page": str(self.page) if self.page is not None else None,
            **({"ablation": self._ablation_dict()} if self.ablation is not None else {}),
        }

    def _ablation_dict(self) -> dict[str, Any]:
        assert self.ablation is not None
        found = self.ablation.as_dict()
        if self.ablation_divergence is not None:  # NaN (a removed head) as null
            moved = self.ablation_divergence
            found["divergence"] = [[None if v != v else v for v in row] for row in moved.tolist()]
        return found


def _stack_fields(att: Attention) -> dict[str, Any]:
    """An encoder-decoder model's stack, target and key tokens (queries are `tokens`)."""
    if att.stack is None:
        return {}
    return {
        "stack": att.stack,
        "source": att.text,
        "target": att.target,
        "key_tokens": list(att.key_tokens),
    }


# What the summaries of a measure other than weights were computed on.
_MEASURED = {
    "norm": "; measure norm: each query's ‖α·f(x)‖ divided by the sum of its row (shares)",
    "alti": "; measure alti: one map per layer (head 0), composed from layer 0 up",
    "rollout": "; measure rollout: one map per layer (head 0), composed from layer 0 up",
}


def show(
    model: Model,
    text: str,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    top_k: int = 3,
    words: bool = False,
    hide_special_tokens: bool = False,
    truncate: bool = False,
    out: Path | None = Path("attnviz-out"),
    style: Style | None = None,
    query: str | None = None,
    images: bool = True,
    html: bool = False,
    pair: str | None = None,
    jobs: int = 1,
    on_summary: Callable[[ShowResult], None] | None = None,
    measure: str = "weights",
    ablate: list[tuple[int, int]] | None = None,
    target: str | None = None,
    generate: int | None = None,
    stack: str | None = None,
) -> ShowResult:
    """Extract one text's attention, summarise the chosen heads, write their heatmaps to `out`.

    Images go to `out/<slug>-<hash>/`, one folder per distinct text; the folder holds only
    the files of its last run (listed in its `done.json`). With `query` ("it", "it#2" or a
    position), also where that token looks in every chosen head, and its figure. `images`
    False writes no figures; `html` writes the interactive page `attention.html` there too.
    `pair` (encoders) reads `[CLS] text [SEP] pair [SEP]` with token types. `jobs` above 1
    draws the figures in that many worker processes, started before the model loads.
    `on_summary` gets the result without its files as soon as the summary is known, before
    any figure is drawn (the command line prints it while the figures are drawn).
    `measure` (`analysis.contributions.MEASURES`) is what the summary and figures show:
    the weights, or norm, alti or rollout. `ablate` ((layer, head) pairs) removes those heads
    (zero ablation): the attention and figures are the model's without them, and
    `ShowResult.ablation` says what changed (a decoder's loss and top-5 next tokens before and
    after; an encoder's embedding).
    An encoder-decoder model (T5, BART, Marian) reads `text` as its source and `target` as
    the decoder's input (teacher forcing), or writes its own target greedily (`generate`
    tokens at most; the default when neither is given); `stack` ("encoder", "decoder" or
    "cross", the default) is the attention shown.
    """
    from attnviz.analysis.contributions import refuse
    from attnviz.core.attention import require_text

    require_text(text)
    if pair is not None:
        require_text(pair, "the --pair sentence")
    chosen_measure = refuse(measure, hide_special_tokens)
    decoder_option = "--target" if target is not None else None
    decoder_option = "--generate" if generate is not None else decoder_option
    model.refuse_early(layers, heads, text, truncate, pair, stack, decoder_option)
    if ablate:
        model.refuse_early([layer for layer, _ in ablate], [head for _, head in ablate])
    # One folder per text, model, pair, measure and removed heads: `show TEXT -m smollm2`
    # keeps `show TEXT`'s images.
    key = None if chosen_measure.name == "weights" else chosen_measure.name
    removed_key = ",".join(f"{layer}.{head}" for layer, head in ablate) if ablate else None
    seq2seq_keys = (
        f"target:{target}" if target is not None else None,
        f"generate:{generate}" if generate is not None else None,
        f"stack:{stack}" if stack is not None else None,
    )
    name = text_folder_name(text, 40, model.folder_key, pair, key, removed_key, *seq2seq_keys)
    folder = prepare_dir(out / name) if out is not None else None
    if folder is not None and images and jobs > 1:
        from attnviz.outputs.render import start_workers

        start_workers(jobs)  # they import matplotlib while this process imports torch

    from attnviz.analysis.contributions import (
        mixing_means,
        shares,
    )
    from attnviz.analysis.query import find_query, query_view
    from attnviz.analysis.summary import summarise
    from attnviz.analysis.transforms import transform
    from attnviz.outputs.figures import Style
    from attnviz.outputs.render import render_text

    style = style or Style()
    if query is not None:  # a query naming no token: refused by the tokenizer, before the weights
        _check_query_early(model, text, query, truncate, pair, words, hide_special_tokens)
    loaded = model.load()
    if loaded.info.seq2seq or decoder_option is not None or stack is not None:
        refused = [
            (bool(ablate), "--ablate"),
            (html and chosen_measure.name != "weights", "--html with --measure"),
            (pair is not None, "--pair"),
        ]
        for given, option in refused:
            if given and loaded.info.seq2seq:
                from attnviz.errors import InputError

                raise InputError(
                    f"{option} is not built for encoder-decoder models yet; leave it out to see "
                    "their weights"
                )
        from attnviz.analysis.contributions import stack_values
        from attnviz.core.adapters import STACKS
        from attnviz.core.extract import extract_seq2seq
        from attnviz.core.models import DEFAULT_STACK

        values = stack_values(loaded, chosen_measure.name)
        if html and folder is not None:  # the page's stack switch: every stack, one pass
            from attnviz.analysis.inside import StacksInside

            page_inside = StacksInside(loaded)  # each stack's inside view, from the same pass
            page_stacks = extract_seq2seq(
                loaded, text, target, generate, STACKS, truncate, also=page_inside
            )
            attended = page_stacks[stack or DEFAULT_STACK].keep_layers(layers)
        else:
            chosen = (stack or DEFAULT_STACK,)
            attended = extract_seq2seq(
                loaded, text, target, generate, chosen, truncate, layers, values
            )[chosen[0]]
        encoded, inside, every, special, kept, compared = None, None, None, None, [], None
        moved = None
        if not (html and folder is not None):
            page_stacks = None
        chosen_layers = attended.held_layers()
    else:
        page_stacks = None
        (attended, encoded, inside, every, special, kept, compared, moved,
         chosen_layers) = _one_stack(
            loaded, text, truncate, pair, layers, html and folder is not None, chosen_measure,
            ablate, query,
        )  # fmt: skip
    shown = transform(attended, words, hide_special_tokens)
    chosen_heads = shown.heads_held(heads)
    ranked = shares(shown)  # a norm's rows as shares: what the summary and query rank
    summaries = summarise(ranked, chosen_layers, chosen_heads, top_k)
    asked = None
    if query is not None:
        index = find_query(shown, query)
        asked = query_view(ranked, index, chosen_layers, chosen_heads, top_k)
    alti = chosen_measure.name == "alti" and encoded is not None
    mixing = mixing_means(kept[0], 0, len(encoded)) if alti else None
    by_weight, by_norm = (special.by_weight[0], special.by_norm[0]) if special else (None, None)
    found = dict(
        special_by_weight=_without_removed(by_weight, shown, chosen_layers),
        special_by_norm=_without_removed(by_norm, shown, chosen_layers),
        mixing=mixing,
        ablation_divergence=moved,
    )
    if on_summary is not None:
        on_summary(
            ShowResult(
                shown,
                chosen_layers,
                chosen_heads,
                summaries,
                folder,
                [],
                asked,
                **found,
                ablation=compared,
            )
        )
    if chosen_measure.name == "norm" and style.scale == "absolute":
        from dataclasses import replace

        style = replace(style, top=float(shown.weights.max()) or 1.0)  # 1 = the largest
    written: list[Path] = []
    page = None
    if folder is not None:
        clear_previous(folder, text_folder=True)
        at = asked.index if asked is not None else None
        try:
            if images:
                written = render_text(
                    shown, folder, chosen_layers, chosen_heads, style, query=at, jobs=jobs
                )
        except KeyboardInterrupt:
            from attnviz.outputs.render import stop_workers

            stop_workers()  # the drawing processes finish what they started, then stop
            raise _interrupted(folder) from None
        if html and page_stacks is not None:
            from attnviz.outputs.html import write_page

            shown_stacks = {
                name: transform(att, words, hide_special_tokens)
                for name, att in page_stacks.items()
            }
            opened = shown_stacks[shown.stack]
            page = write_page(opened, folder / "attention.html", stacks=shown_stacks,
                              inside=page_inside.results(), scale=style.scale,
                              cmap=style.cmap)  # fmt: skip
        elif html:
            from attnviz.outputs.html import write_page

            assert every is not None
            found_page = every.page(
                attended,
                shown,
                lambda att: transform(att, words, hide_special_tokens),
                kept[0] if kept else None,
            )
            page = write_page(
                found_page.weights,
                folder / "attention.html",
                inside=inside.result(),
                scale=style.scale,
                cmap=style.cmap,
                segments=shown.segments,
                measures=found_page.others,
                lengths=found_page.lengths,
                initial=chosen_measure.name,
            )
        settings = {
            "model": shown.info.name,
            "text": text,
            "pair": pair,
            **({"target": target, "generate": generate, "stack": stack} if shown.stack else {}),
            "layers": chosen_layers,
            "heads": chosen_heads,
            "words": words,
            "hide_special": hide_special_tokens,
            "truncate": truncate,
            "query": query,
            "measure": chosen_measure.name,
            "ablate": [f"{layer}.{head}" for layer, head in ablate or []],
            "images": images,
            "html": html,
            **asdict(style),
        }
        record = {
            "text": text,
            **(
                {"target": shown.target, "key_tokens": list(shown.key_tokens)}
                if shown.stack
                else {}
            ),
            "tokens": list(shown.tokens),
            "files": [str(path.relative_to(folder.parent)) for path in written + [page] if path],
            "notes": list(shown.notes),
        }
        write_done(folder, settings, record)
    return ShowResult(
        shown,
        chosen_layers,
        chosen_heads,
        summaries,
        folder,
        written,
        asked,
        page,
        **found,
        ablation=compared,
    )


def _one_stack(loaded, text, truncate, pair, layers, page, chosen_measure, ablate, query):
    """A model with one attention stack: the text's attention (or measure), with what the
    page (when `page`), the special-token shares and --ablate take from the same pass."""
    import numpy as np

    from attnviz.analysis.contributions import EveryMeasure, SpecialShares, measured
    from attnviz.analysis.inside import InsideSteps
    from attnviz.analysis.query import find_query
    from attnviz.core.tokens import encode

    encoded = encode(loaded, text, truncate, pair)
    # The page's inside view takes each layer's input from the same forward pass.
    inside = InsideSteps(loaded, [encoded]) if page else None
    chosen_layers = loaded.info.pick_layers(layers)
    edit, compared, moved = None, None, None
    if ablate:
        from attnviz.analysis.importance import removing

        loaded.info.pick_layers([layer for layer, _ in ablate])  # what the files did not say
        loaded.info.pick_heads([head for _, head in ablate])
        edit = removing(loaded, ablate)
    # The share special tokens take, by weight and by norm, from the same pass.
    special = SpecialShares.of(loaded, chosen_layers, [np.array(encoded.special, dtype=bool)])
    kept: list = []
    also = [*([special] if special else []), *([inside] if inside else [])]
    # The page's measure switch: every other measure from the same pass.
    every = EveryMeasure(loaded, chosen_layers, [encoded], chosen_measure.name) if inside else None
    also += list(every.recorders.values()) if every else []
    attended = measured(loaded, [encoded], chosen_measure.name, layers, also, kept, edit)[0]
    if ablate:
        from dataclasses import replace

        from attnviz.analysis.compare import TwoRows, ablation_divergence
        from attnviz.analysis.importance import compare
        from attnviz.errors import InputError

        at = None
        if query is not None:
            try:
                at = [find_query(attended, query)]  # a token; --words queries fall back to all
            except InputError:
                at = None
        rows = TwoRows(chosen_layers, len(encoded))  # both rows' patterns, from that pass
        compared = compare(loaded, encoded, ablate, at, also=[rows])
        moved = ablation_divergence(attended, rows, ablate)
        removed = ", ".join(f"L{layer} H{head}" for layer, head in compared.heads)
        note = f"heads removed (zero ablation): {removed}"
        attended = replace(attended, notes=(*attended.notes, note), removed=compared.heads)
    return attended, encoded, inside, every, special, kept, compared, moved, chosen_layers


def _without_removed(values: Any, att: Attention, layers: list[int]) -> Any:
    """Per-head values (L, H) over `layers`, NaN for the heads removed from the pass: a head
    whose output was set to 0 gave nothing, special tokens included."""
    if values is None or not att.removed:
        return values
    values = values.astype("f8")  # a copy
    for layer, head in att.removed:
        if layer in layers:
            values[layers.index(layer), head] = float("nan")
    return values


def _check_query_early(model, text, query, truncate, pair, words, hide_special_tokens):
    """Refuse a query that names no token with the model's tokenizer alone, where its files
    are here (an encoder-decoder model's target may be its own: it is checked after)."""
    from attnviz.analysis.query import check_query
    from attnviz.core.models import describe
    from attnviz.core.tokens import encode_with

    spec = describe(model.name)
    if spec is None or spec.seq2seq or spec.tokenizer_file is None or spec.max_tokens is None:
        return
    encoded = encode_with(model.tokenizer(), spec, text, truncate, pair)
    if not encoded.truncated:  # where a text is cut is the loaded model's to say
        check_query(encoded, query, words, hide_special_tokens)


def _interrupted(folder: Path) -> Interrupted:
    """Ctrl-C while drawing: say how many images are complete (each is written whole or not
    at all); the folder has no done.json, so the next run draws them all again."""
    drawn = [p for p in folder.iterdir() if TEXT_FILES.fullmatch(p.name)]
    return Interrupted(
        f"{len(drawn)} image(s) written to {folder}/ before stopping; run the command again "
        "to draw them all"
    )
