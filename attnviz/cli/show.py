"""`attnviz show`: one sentence, summarised per head in the terminal and drawn as heatmaps."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from attnviz.cli.app import Command, app, err_console, fail, out_console
from attnviz.cli.options import (
    LOAD,
    MEASURING,
    SELECT,
    STYLE,
    WRITING,
    AblateOpt,
    HideOpt,
    HtmlOpt,
    JobsOpt,
    JsonOpt,
    NoImagesOpt,
    NoTowerOpt,
    OutOpt,
    PairOpt,
    PoolName,
    PoolOpt,
    PromptArg,
    QueryOpt,
    RawOpt,
    StackOpt,
    TargetOpt,
    TextArg,
    TopKOpt,
    TruncateOpt,
    WindowOpt,
    WordsOpt,
    grouped,
    text_or_picture,
)
from attnviz.core.settings import Load
from attnviz.errors import AttnvizError, Interrupted
from attnviz.outputs.figures import Style


@app.command(cls=Command)
@grouped
def show(
    text: TextArg,
    prompt: PromptArg = None,
    load: Load = LOAD,
    select: dict = SELECT,
    query: QueryOpt = None,
    measuring: dict = MEASURING,
    pair: PairOpt = None,
    top_k: TopKOpt = 3,
    words: WordsOpt = False,
    hide_special: HideOpt = False,
    truncate: TruncateOpt = False,
    out: OutOpt = Path("attnviz-out"),
    no_images: NoImagesOpt = False,
    html: HtmlOpt = False,
    style: Style = STYLE,
    jobs: JobsOpt = None,
    ablate: AblateOpt = None,
    target: TargetOpt = None,
    writing: dict = WRITING,
    stack: StackOpt = None,
    window: WindowOpt = None,
    pool: PoolOpt = PoolName.max,
    as_json: JsonOpt = False,
    raw: RawOpt = False,
    no_tower: NoTowerOpt = False,
) -> None:
    """Show what every attention head looks at in one sentence, and write heatmaps.

    Prints, for each head, the tokens it attends to most; with one --layer and one --head it
    also draws that head's heatmap in the terminal. Images go to `OUT/<slug>-<hash>/`: an
    overview of all heads, one grid per layer, one figure per head.
    \f
    A text's folder holds only its last run's files. With a decoder, --generate N lets the
    model continue the text and shows where it looked as it wrote each token (--target
    TEXT: a continuation you give). With an encoder-decoder model (T5, BART, Marian) the
    text is the source; --target or --generate gives the target, and --stack picks the
    attention (cross-attention by default; without a target, the encoder's self-attention).
    """
    try:
        from attnviz.analysis.ablation import parse_head
        from attnviz.analysis.window import parse_window
        from attnviz.outputs import terminal
        from attnviz.outputs.render import default_jobs
        from attnviz.pipelines.request import ShowRequest
        from attnviz.pipelines.show import show as run_show

        text, picture = text_or_picture(text, "show", prompt)
        request = ShowRequest(load, text=text, picture=picture, pair=pair, raw=raw,
            prompt=text if prompt is not None else None,
            target=target, **writing, **select,
            stack=stack.value if stack is not None else None,
            truncate=truncate, words=words, hide_special=hide_special, **measuring,
            query=query, ablate=tuple(parse_head(given) for given in ablate or []), html=html,
            images=not no_images, top_k=top_k, out=None if no_images and not html else out,
            style=style, jobs=jobs or default_jobs(), pool=pool.value,
            window=parse_window(window) if window is not None else None, tower=not no_tower,
        )  # fmt: skip

        def print_summary(result) -> None:  # printed while the figures are drawn
            terminal.print_show(out_console, result, style.scale)

        result = run_show(request, on_summary=None if as_json else print_summary)
    except AttnvizError as error:
        raise fail(error) from None
    except KeyboardInterrupt:  # before any image was drawn (the pipeline counts those)
        raise fail(Interrupted("nothing was written")) from None

    if as_json:
        typer.echo(json.dumps(result.as_dict(), ensure_ascii=False, indent=2))
        written = [*result.images, *([result.page] if result.page else [])]
        if written:  # stdout stays the JSON; where the files went, one line on stderr
            err_console.print(f"wrote {len(written)} files to {result.folder}/", highlight=False,
                              soft_wrap=True)  # fmt: skip
    else:
        terminal.print_written(out_console, result.images, result.folder, result.page,
                               result.drawn, result.window)  # fmt: skip
