"""`attnviz compare`: two texts through one model, or one text through two models, head by
head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.app import Command, app, fail, out_console
from attnviz.cli.options import (
    AttentionImpl,
    AttentionOpt,
    CmapOpt,
    Device,
    DeviceOpt,
    DpiOpt,
    FormatOpt,
    ImageFormat,
    JsonOpt,
    MeasureName,
    MeasureOpt,
    ModelOpt,
    QueryOpt,
    TruncateOpt,
    WordsOpt,
    flag,
    style,
)
from attnviz.core import models
from attnviz.errors import AttnvizError, InputError, Interrupted


@app.command(cls=Command)
def compare(
    text_a: Annotated[
        str | None,
        typer.Argument(help="Text A; - reads it from stdin.", show_default=False),
    ] = None,
    text_b: Annotated[
        str | None,
        typer.Argument(
            help="Text B (default with --against-model: text A again).", show_default=False
        ),
    ] = None,
    model: ModelOpt = None,
    against_model: Annotated[
        str | None,
        typer.Option(
            "--against-model",
            metavar="MODEL",
            help="A second model that reads text B (same layers and heads; a different "
            "tokenizer needs --words).",
            show_default=False,
        ),
    ] = None,
    file: Annotated[
        str | None,
        typer.Option(
            "--file",
            "-f",
            help="File of pairs, one a line: text A, a TAB, text B (with --against-model, a "
            "line without a TAB is one text for both); - reads stdin. Figures are means over "
            "the pairs.",
            show_default=False,
        ),
    ] = None,
    words: WordsOpt = False,
    measure: MeasureOpt = MeasureName.weights,
    query: QueryOpt = None,
    top: Annotated[
        int, typer.Option("--top", min=1, help="Heads listed and drawn: those that moved most.")
    ] = 6,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Keys listed per head.")] = 3,
    importance: Annotated[
        bool,
        flag(
            "--importance",
            "Also measure each head's importance (zero ablation: one pass per head) to each "
            "model's objective on its texts, to tell a head that moved from a head that matters.",
        ),
    ] = False,
    truncate: TruncateOpt = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the images.")] = Path(
        "attnviz-out"
    ),
    no_images: Annotated[bool, flag("--no-images", "Do not write images.")] = False,
    html: Annotated[
        bool,
        flag(
            "--html",
            "Also write compare.html (with -f, compare-N.html a pair): the interactive page "
            "with A, B and B − A in every view; it works offline.",
        ),
    ] = False,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    device: DeviceOpt = Device.auto,
    attention: AttentionOpt = AttentionImpl.sdpa,
    as_json: JsonOpt = False,
) -> None:
    """Compare attention head by head: two texts through one model (a minimal pair), or a
    text through two models (--against-model).

    Prints how far each head's pattern moved (the Jensen–Shannon divergence, in nats,
    between A's and B's row of each aligned query, averaged over the aligned queries), and
    the heads that moved most with their top keys in A and in B. Tokens are aligned where
    both texts have them; words put for one another are aligned whole; what has no partner
    is listed. Images go to `OUT/<slug>-<hash>/`: the divergence per head, and A, B and
    B − A for each head that moved most.
    """
    try:
        from attnviz.core.inputs import read_sentences, read_text, split_compare_pairs
        from attnviz.outputs import terminal
        from attnviz.pipelines.compare import compare as run_compare

        if file is not None:
            if text_a is not None:
                raise InputError("give two texts or --file, not both")
            pairs = split_compare_pairs(read_sentences(file, None), against_model is not None)
        elif text_a is None or (text_b is None and against_model is None):
            raise InputError(
                'give two texts (compare "A" "B"), one text and --against-model MODEL, or '
                "--file PAIRS.tsv"
            )
        else:
            first = read_text(text_a)
            pairs = [(first, read_text(text_b) if text_b is not None else first)]
        found = run_compare(
            models.model(model, device.value, attention.value),
            pairs,
            against=models.model(against_model, device.value, attention.value)
            if against_model
            else None,
            words=words,
            measure=measure.value,
            query=query,
            top=top,
            top_k=top_k,
            truncate=truncate,
            out=None if no_images and not html else out,
            images=not no_images,
            style=style(fmt, dpi, cmap),
            importance=importance,
            html=html,
        )
    except AttnvizError as error:
        raise fail(error) from None
    except KeyboardInterrupt:
        raise fail(Interrupted("nothing was written")) from None

    if as_json:
        typer.echo(json.dumps(found.as_dict(), ensure_ascii=False, indent=2))
        return
    console = out_console
    names = found.models
    who = names[0] if names[0] == names[1] else f"A: {names[0]}, B: {names[1]}"
    terminal.print_comparison_header(console, found.comparison, who)
    terminal.print_divergence_map(console, found.comparison.divergence, found.comparison.layers)
    terminal.print_moved(console, found.moved, len(found.comparison.pairs) > 1)
    if found.importance is not None:
        terminal.print_moved_importance(console, found.moved, *found.importance)
    if found.query is not None:
        terminal.print_compare_query(console, found.query, found.comparison.layers, top)
    pages = found.pages
    if found.images:
        console.print(
            f"wrote {len(found.images)} images to [bold]{found.folder}/[/]", highlight=False
        )
    if pages:
        named = pages[0] if len(pages) == 1 else f"{found.folder}/compare-N.html"
        console.print(f"wrote the interactive page{'s' if len(pages) > 1 else ''} [bold]{named}[/]",
                      highlight=False, soft_wrap=True)  # fmt: skip
