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
    ablation: AblationView | None = None  # with ablate: the text with those heads removed

    def as_dict(self) -> dict[str, Any]:
        from attnviz.analysis.summary import AVERAGED

        heads = [s.as_dict(self.attention.tokens) for s in self.summaries]
        if self.query is not None:
            for entry, row in zip(heads, self.query.heads):
                entry["query_top"] = row.as_dict()
        return {
            "model": self.attention.info.as_dict(),
            "unit": self.attention.unit,
            "tokens": list(self.attention.tokens),
            "notes": list(self.attention.notes),
            **({"query": self.query.as_dict()} if self.query is not None else {}),
            "averaged": AVERAGED,
            "heads": heads,
            "folder": str(self.folder) if self.folder is not None else None,
            "images": [str(p) for p in self.images],
            "page": str(self.page) if self.page is not None else None,
            **({"ablation": self.ablation.as_dict()} if self.ablation is not None else {}),
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
    ablate: list[tuple[int, int]] | None = None,
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
    `ablate` ((layer, head) pairs) removes those heads (zero ablation): the attention and
    figures are the model's without them, and `ShowResult.ablation` says what changed (a
    decoder's loss and top-5 next tokens before and after; an encoder's embedding).
    """
    from attnviz.core.attention import require_text

    require_text(text)
    if pair is not None:
        require_text(pair, "the --pair sentence")
    model.refuse_early(layers, heads, text, truncate, pair)
    if ablate:
        model.refuse_early([layer for layer, _ in ablate], [head for _, head in ablate])
    # One folder per text, model and pair: `show TEXT -m smollm2` keeps `show TEXT`'s images.
    name = text_folder_name(text, 40, model.folder_key, pair)
    folder = prepare_dir(out / name) if out is not None else None
    if folder is not None and images and jobs > 1:
        from attnviz.outputs.render import start_workers

        start_workers(jobs)  # they import matplotlib while this process imports torch

    from attnviz.analysis.inside import InsideSteps
    from attnviz.analysis.query import find_query, query_view
    from attnviz.analysis.summary import summarise
    from attnviz.analysis.transforms import transform
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode
    from attnviz.outputs.figures import Style
    from attnviz.outputs.render import render_text

    style = style or Style()
    loaded = model.load()
    encoded = encode(loaded, text, truncate, pair)
    # The page's inside view takes each layer's input from the same forward pass.
    inside = InsideSteps(loaded, [encoded]) if folder is not None and html else None
    edit, compared = None, None
    if ablate:
        from attnviz.analysis.importance import removing

        loaded.info.pick_layers([layer for layer, _ in ablate])  # what the files did not say
        loaded.info.pick_heads([head for _, head in ablate])
        edit = removing(loaded, ablate)
    attended = attend(loaded, [encoded], layers, also=[inside] if inside else [], edit=edit)[0]
    if ablate:
        from dataclasses import replace

        from attnviz.analysis.importance import compare
        from attnviz.errors import InputError

        at = None
        if query is not None:
            try:
                at = [find_query(attended, query)]  # a token; --words queries fall back to all
            except InputError:
                at = None
        compared = compare(loaded, encoded, ablate, at)
        removed = ", ".join(f"L{layer} H{head}" for layer, head in compared.heads)
        note = f"heads removed (zero ablation): {removed}"
        attended = replace(attended, notes=(*attended.notes, note))
    shown = transform(attended, words, hide_special_tokens)
    chosen_layers = shown.info.pick_layers(layers)
    chosen_heads = shown.info.pick_heads(heads)
    summaries = summarise(shown, chosen_layers, chosen_heads, top_k)
    asked = None
    if query is not None:
        index = find_query(shown, query)
        asked = query_view(shown, index, chosen_layers, chosen_heads, top_k)
    if on_summary is not None:
        on_summary(
            ShowResult(
                shown, chosen_layers, chosen_heads, summaries, folder, [], asked, None, compared
            )
        )
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
        if html:
            from attnviz.outputs.html import write_page

            page = write_page(
                shown,
                folder / "attention.html",
                inside=inside.result(),
                scale=style.scale,
                cmap=style.cmap,
                segments=shown.segments,
            )
        settings = {
            "model": shown.info.name,
            "text": text,
            "pair": pair,
            "layers": chosen_layers,
            "heads": chosen_heads,
            "words": words,
            "hide_special": hide_special_tokens,
            "truncate": truncate,
            "query": query,
            "ablate": [f"{layer}.{head}" for layer, head in ablate or []],
            "images": images,
            "html": html,
            **asdict(style),
        }
        record = {
            "text": text,
            "tokens": list(shown.tokens),
            "files": [str(path.relative_to(folder.parent)) for path in written + [page] if path],
            "notes": list(shown.notes),
        }
        write_done(folder, settings, record)
    return ShowResult(
        shown, chosen_layers, chosen_heads, summaries, folder, written, asked, page, compared
    )


def _interrupted(folder: Path) -> Interrupted:
    """Ctrl-C while drawing: say how many images are complete (each is written whole or not
    at all); the folder has no done.json, so the next run draws them all again."""
    drawn = [p for p in folder.iterdir() if TEXT_FILES.fullmatch(p.name)]
    return Interrupted(
        f"{len(drawn)} image(s) written to {folder}/ before stopping; run the command again "
        "to draw them all"
    )
