"""Options several commands share, declared once (`Annotated[..., typer.Option(help=...)]`)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer

from attnviz.analysis.contributions import MEASURES
from attnviz.analysis.transforms import TRANSFORMS
from attnviz.core.adapters import STACKS
from attnviz.outputs.figures import FORMATS, SCALES


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


# Choices come from the figures' own lists.
ImageFormat = Enum("ImageFormat", {name: name for name in FORMATS}, type=str)
Scale = Enum("Scale", {name: name for name in SCALES}, type=str)
# Choices and help come from the measures' registry (attnviz.analysis.contributions).
MeasureName = Enum("MeasureName", {name: name for name in MEASURES}, type=str)


def flag(name: str, help: str) -> Any:
    """An on/off option, shown in help as a flag (no value)."""
    return typer.Option(name, help=help, metavar="")


ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Local model directory, Hugging Face hub id (cached or online), a .gguf file, "
        "or smollm2 (a bundled decoder LLM). Default: the bundled all-MiniLM-L6-v2.",
        show_default=False,
    ),
]
DeviceOpt = Annotated[Device, typer.Option(help="Where to run the model.")]


class AttentionImpl(str, Enum):
    sdpa = "sdpa"
    eager = "eager"


AttentionOpt = Annotated[
    AttentionImpl,
    typer.Option(
        "--attention",
        help="The model's attention: sdpa (fast; attnviz recomputes the probabilities from "
        "each layer's input, in blocks of rows) or eager (the model's own probabilities, "
        "held layer by layer; for comparison). docs/models.md says more.",
    ),
]
LayerOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--layer",
        "--layers",
        "-l",
        metavar="N",
        help="A layer to use; repeat for more (-l 0 -l 5). Default: all.",
        show_default=False,
    ),
]
HeadOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--head",
        "--heads",
        "-H",
        metavar="N",
        help="A head to use; repeat for more (-H 2 -H 7). Default: all.",
        show_default=False,
    ),
]
SentencesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Sentences (or use --file).", show_default=False),
]
FileOpt = Annotated[
    str | None,
    typer.Option("--file", "-f", help="Text file, one sentence per line; - reads stdin."),
]
# The views' flags and help come from their registry (attnviz.analysis.transforms.TRANSFORMS).
WordsOpt = Annotated[bool, flag("--words", TRANSFORMS["words"].help)]
HideOpt = Annotated[bool, flag("--hide-special", TRANSFORMS["hide-special"].help)]
TruncateOpt = Annotated[
    bool, flag("--truncate", "Cut text longer than the model's limit (and say so).")
]
JsonOpt = Annotated[bool, flag("--json", "Print the result as JSON on stdout.")]
CmapOpt = Annotated[str, typer.Option(help="Matplotlib colour map for heatmaps.")]
DpiOpt = Annotated[int, typer.Option(min=20, max=600, help="Image resolution (dots per inch).")]
FormatOpt = Annotated[ImageFormat, typer.Option("--format", help="Image file format.")]
ScaleOpt = Annotated[
    Scale,
    typer.Option(
        "--scale",
        help="Heatmap colours: absolute (0–1 for every head) or head (each head to its own "
        "max; the pattern of diffuse heads shows).",
    ),
]
QueryOpt = Annotated[
    str | None,
    typer.Option(
        "--query",
        "-q",
        metavar="TOKEN",
        help="Ask about one token: where it looks in every head. A token as written "
        "(first occurrence), it#2 for the second, or a position.",
        show_default=False,
    ),
]
MeasureOpt = Annotated[
    MeasureName,
    typer.Option(
        "--measure",
        help="What to show: "
        + "; ".join(
            f"{m.name}: {m.help}" + (f" ({m.cite})" if m.cite else "") for m in MEASURES.values()
        )
        + ". docs/contributions.md says how each is computed.",
    ),
]
StackName = Enum("StackName", {name: name for name in STACKS}, type=str)


StackOpt = Annotated[
    StackName | None,
    typer.Option(
        "--stack",
        help="Encoder-decoder models (T5, BART, Marian): which attention to show: encoder "
        "(source × source), decoder (target × target, causal) or cross (target tokens reading "
        "the source). [default: cross]",
        show_default=False,
    ),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        metavar="TEXT",
        help="Encoder-decoder models: the target the decoder reads after its start token "
        "(teacher forcing), e.g. a translation of the source.",
        show_default=False,
    ),
]
GenerateOpt = Annotated[
    int | None,
    typer.Option(
        "--generate",
        min=1,
        metavar="N",
        help="Encoder-decoder models: let the model write its own target greedily, at most N "
        "tokens, and show the attention it used (what happens without --target, with N 40).",
        show_default=False,
    ),
]
BatchOpt = Annotated[
    int, typer.Option("--batch-size", "-b", min=1, help="Sentences per forward pass.")
]


def style(fmt: ImageFormat, dpi: int, cmap: str, scale: Scale = Scale.absolute):
    from attnviz.outputs.figures import Style, check_cmap

    return Style(fmt=fmt.value, dpi=dpi, cmap=check_cmap(cmap), scale=scale.value)
