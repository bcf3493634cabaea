"""`attnviz show`: one sentence, summarised per head in the terminal and drawn as heatmaps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

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
    GenerateOpt,
    HeadOpt,
    HideOpt,
    ImageFormat,
    JsonOpt,
    LayerOpt,
    MeasureName,
    MeasureOpt,
    ModelOpt,
    QueryOpt,
    Scale,
    ScaleOpt,
    StackOpt,
    TargetOpt,
    TruncateOpt,
    WordsOpt,
    flag,
    style,
)
from attnviz.core import models
from attnviz.errors import AttnvizError, Interrupted


@app.command(cls=Command)
def show(
    text: Annotated[
        str,
        typer.Argument(help="The sentence to look at; - reads it from stdin.", show_default=False),
    ],
    model: ModelOpt = None,
    layer: LayerOpt = None,
    head: HeadOpt = None,
    query: QueryOpt = None,
    measure: MeasureOpt = MeasureName.weights,
    pair: Annotated[
        str | None,
        typer.Option(
            "--pair",
            metavar="TEXT",
            help="A second sentence (encoders): the model reads [CLS] TEXT [SEP] PAIR [SEP] "
            "with token types; the --html page can restrict to A→B, B→A, A→A, B→B.",
            show_default=False,
        ),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Tokens listed per head.")] = 3,
    words: WordsOpt = False,
    hide_special: HideOpt = False,
    truncate: TruncateOpt = False,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the heatmap images.")] = Path(
        "attnviz-out"
    ),
    no_images: Annotated[bool, flag("--no-images", "Do not write images.")] = False,
    html: Annotated[
        bool, flag("--html", "Also write attention.html, an interactive page that works offline.")
    ] = False,
    fmt: FormatOpt = ImageFormat.png,
    dpi: DpiOpt = 100,
    cmap: CmapOpt = "viridis",
    scale: ScaleOpt = Scale.absolute,
    device: DeviceOpt = Device.auto,
    attention: AttentionOpt = AttentionImpl.sdpa,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            metavar="N",
            help="Drawing processes, started while the model loads [default: one per core, "
            "at most 4]; 1 draws in this process.",
            show_default=False,
        ),
    ] = None,
    ablate: Annotated[
        list[str] | None,
        typer.Option(
            "--ablate",
            metavar="L.H",
            help="Remove head H of layer L (its output set to 0; repeatable): the maps show "
            "the model without it, and a decoder's loss and top-5 next tokens (an encoder's "
            "embedding) before and after are printed.",
            show_default=False,
        ),
    ] = None,
    target: TargetOpt = None,
    generate: GenerateOpt = None,
    stack: StackOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show what every attention head looks at in one sentence, and write heatmaps.

    Prints, for each head, the tokens it attends to most; with one --layer and one --head it
    also draws that head's heatmap in the terminal. Images go to `OUT/<slug>-<hash>/` (one
    folder per distinct text, holding only its last run's files): an overview of all heads,
    one grid per layer, one figure per head. With an encoder-decoder model (T5, BART,
    Marian) the text is the source; --target or --generate gives the target, and --stack
    picks the attention (cross-attention by default).
    """

    def print_summary(result: Any) -> None:
        console = out_console
        terminal.print_header(console, result.attention)
        layers, heads, info = result.layers, result.heads, result.attention.info
        if result.query is not None:
            terminal.print_query(console, result.attention, result.query, layers, heads)
        elif result.attention.per_layer:
            terminal.print_special_share(
                console,
                result.attention,
                result.summaries,
                result.special_by_weight,
                result.special_by_norm,
            )
            terminal.print_head_details(console, result.attention, result.summaries)
        elif len(layers) == info.n_layers and len(heads) == info.n_heads:
            terminal.print_head_map(
                console,
                result.attention,
                result.summaries,
                layers,
                heads,
                by_weight=result.special_by_weight,
                by_norm=result.special_by_norm,
            )
        else:
            terminal.print_head_details(console, result.attention, result.summaries)
        if len(layers) == 1 and len(heads) == 1:
            terminal.print_heatmap(console, result.attention, layers[0], heads[0], scale.value)
        if result.ablation is not None:
            terminal.print_ablation(console, result.ablation)
        if result.ablation_divergence is not None:
            terminal.print_divergence_map(
                console, result.ablation_divergence, layers, terminal.ABLATION_TITLE
            )

    try:
        from attnviz.analysis.importance import parse_head
        from attnviz.core.inputs import read_text
        from attnviz.outputs import terminal
        from attnviz.outputs.render import default_jobs
        from attnviz.pipelines.show import show as run_show

        removed = [parse_head(given) for given in ablate or []]
        result = run_show(
            models.model(model, device.value, attention.value),
            read_text(text),
            layers=layer,
            heads=head,
            top_k=top_k,
            words=words,
            hide_special_tokens=hide_special,
            truncate=truncate,
            out=None if no_images and not html else out,
            style=style(fmt, dpi, cmap, scale),
            query=query,
            images=not no_images,
            html=html,
            pair=pair,
            jobs=jobs or default_jobs(),
            on_summary=None if as_json else print_summary,  # printed while figures are drawn
            measure=measure.value,
            ablate=removed,
            target=target,
            generate=generate,
            stack=stack.value if stack is not None else None,
        )
    except AttnvizError as error:
        raise fail(error) from None
    except KeyboardInterrupt:  # before any image was drawn (the pipeline counts those)
        raise fail(Interrupted("nothing was written")) from None

    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        return
    if result.images:
        out_console.print(
            f"wrote {len(result.images)} images to [bold]{result.folder}/[/]", highlight=False
        )
    if result.page is not None:
        out_console.print(
            f"wrote the interactive page [bold]{result.page}[/]", highlight=False, soft_wrap=True
        )
