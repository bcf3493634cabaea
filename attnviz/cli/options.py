"""Options several commands share, declared once (`Annotated[..., typer.Option(help=...)]`).

An option's help is one short line, what `--help` shows, then (after a \f) the rest, which
docs/reference.md adds (`briefly`); its panel (`rich_help_panel`) is one of `app.PANELS`, or
none for a command's everyday options.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from attnviz.analysis.contributions import FUSIONS, MEASURES
from attnviz.analysis.pooling import POOLS
from attnviz.analysis.transforms import TRANSFORMS
from attnviz.cli.app import Panel
from attnviz.core.layer_map import STACKS
from attnviz.core.settings import DEVICE_MAPS, DTYPES, IMPLEMENTATIONS, QUANTIZATIONS
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


def briefly(short: str, more: str) -> str:
    """An option's help: `short`, the line --help shows, then `more`, which only
    docs/reference.md adds (--help stops at the \f between them)."""
    return f"{short}\f{more}"


def flag(name: str, help: str, panel: str | None = None) -> Any:
    """An on/off option, shown in help as a flag (no value), in --help's `panel`."""
    return typer.Option(name, help=help, metavar="", rich_help_panel=panel)


def valued(
    kind: Any,
    *names: str,
    help: str,
    metavar: str | None = None,
    panel: str | None = None,
    **more: Any,
) -> Any:
    """An option that takes a value and is None when not given (no default shown):
    `--name METAVAR`, in --help's `panel`; `more` as typer.Option takes it (min=1)."""
    option = typer.Option(*names, metavar=metavar, help=help, show_default=False,
                          rich_help_panel=panel, **more)  # fmt: skip
    return Annotated[kind | None, option]


ModelOpt = valued(
    str,
    "--model",
    "-m",
    help=briefly(
        "Folder, hub id, .gguf, smollm2; default: all-MiniLM-L6-v2.",
        "A local model directory, a Hugging Face hub id (cached or online), a .gguf file, "
        "or smollm2 (a bundled decoder LLM); all-MiniLM-L6-v2 is bundled.",
    ),
)
DeviceOpt = Annotated[
    Device, typer.Option(help="Where to run the model.", rich_help_panel=Panel.LOADING)
]


# Choices come from core's lists of load settings (attnviz.core.settings).
Implementation = Enum("Implementation", {name: name for name in IMPLEMENTATIONS}, type=str)
Dtype = Enum("Dtype", {name: name for name in DTYPES}, type=str)
DeviceMap = Enum("DeviceMap", {name: name for name in DEVICE_MAPS}, type=str)
Quantize = Enum("Quantize", {name: name for name in QUANTIZATIONS}, type=str)


ImplementationOpt = Annotated[
    Implementation,
    typer.Option(
        "--attention",
        rich_help_panel=Panel.LOADING,
        help=briefly(
            "How attention runs.",
            "sdpa (fast; attnviz records the probabilities inside the model's attention "
            "call, from its own q and k, in blocks of rows; layers nobody asks for run SDPA), "
            "flash_attention_2 (the same, those layers on flash-attn's kernels: CUDA, half "
            "precision) or eager (the model's own probabilities, held layer by layer; for "
            "comparison). docs/models.md says more.",
        ),
    ),
]
DtypeOpt = Annotated[
    Dtype,
    typer.Option(
        "--dtype",
        rich_help_panel=Panel.LOADING,
        help=briefly(
            "Weights' number format.",
            "auto is the checkpoint's own on a GPU and float32 on a CPU; bfloat16 and "
            "float16 halve the memory (the probabilities shown are still computed in "
            "float32).",
        ),
    ),
]
DeviceMapOpt = Annotated[
    DeviceMap | None,
    typer.Option(
        "--device-map",
        rich_help_panel=Panel.LOADING,
        help=briefly(
            "Spread a model too big for one device.",
            "accelerate puts the layers on the GPUs, the CPU and the disk (auto, balanced or "
            "sequential), within --max-memory.",
        ),
        show_default=False,
    ),
]
MaxMemoryOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--max-memory",
        metavar="DEVICE=SIZE",
        rich_help_panel=Panel.LOADING,
        help=briefly(
            "The most a device holds (--device-map).",
            "Repeatable (--max-memory 0=20GiB --max-memory cpu=60GiB); what does not fit "
            "goes to the disk.",
        ),
        show_default=False,
    ),
]
OffloadOpt = Annotated[
    Path | None,
    typer.Option(
        "--offload-folder",
        metavar="DIR",
        rich_help_panel=Panel.LOADING,
        help=briefly(
            "Where --device-map keeps the rest.",
            "The layers that fit in no device's memory, read back as each one runs.",
        ),
        show_default=False,
    ),
]
QuantizeOpt = Annotated[
    Quantize | None,
    typer.Option(
        "--quantize",
        rich_help_panel=Panel.LOADING,
        help=briefly("4- or 8-bit weights (bitsandbytes).", "CUDA GPUs only."),
        show_default=False,
    ),
]


def _numbers(what: str, short: str, example: str) -> Any:
    """A repeatable option of numbers: --layer/--layers/-l, --head/--heads/-H."""
    help = briefly(f"A {what} to use; repeat for more. Default: all.", f"For example {example}.")
    return valued(list[int], f"--{what}", f"--{what}s", short, metavar="N", help=help)


LayerOpt = _numbers("layer", "-l", "-l 0 -l 5")
HeadOpt = _numbers("head", "-H", "-H 2 -H 7")
SentencesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help=briefly(
            "Sentences (or --file), or pictures.",
            "With a vision model, picture files and folders of them.",
        ),
        show_default=False,
    ),
]
FileOpt = Annotated[
    str | None,
    typer.Option(
        "--file", "-f", metavar="FILE", help="Text file, one sentence per line; - reads stdin."
    ),
]
# The views' flags and help come from their registry (attnviz.analysis.transforms.TRANSFORMS).
WordsOpt = Annotated[bool, flag("--words", TRANSFORMS["words"].help, Panel.READING)]
HideOpt = Annotated[bool, flag("--hide-special", TRANSFORMS["hide-special"].help, Panel.READING)]
TruncateOpt = Annotated[
    bool, flag("--truncate", "Cut text longer than the model's limit (and say so).", Panel.READING)
]
JsonOpt = Annotated[bool, flag("--json", "Print the result as JSON on stdout.")]
CmapOpt = Annotated[
    str, typer.Option(help="Matplotlib colour map for heatmaps.", rich_help_panel=Panel.OUTPUT)
]
DpiOpt = Annotated[
    int,
    typer.Option(
        min=20,
        max=600,
        metavar="DPI",
        help="Image resolution (dots per inch).",
        rich_help_panel=Panel.OUTPUT,
    ),
]
FormatOpt = Annotated[
    ImageFormat, typer.Option("--format", help="Image file format.", rich_help_panel=Panel.OUTPUT)
]
ScaleOpt = Annotated[
    Scale,
    typer.Option(
        "--scale",
        rich_help_panel=Panel.OUTPUT,
        help=briefly(
            "Colours: 0–1, or each head's own max.",
            "absolute: 0–1 for every head; head: each head to its own max (the pattern of "
            "diffuse heads shows).",
        ),
    ),
]
QueryOpt = valued(
    str,
    "--query",
    "-q",
    metavar="TOKEN",
    help=briefly(
        "Ask about one token: where it looks in every head.",
        "A token as written (first occurrence), it#2 for the second, or a position; of a "
        "picture, a patch ROW,COL.",
    ),
)
MeasureOpt = Annotated[
    MeasureName,
    typer.Option(
        "--measure",
        rich_help_panel=Panel.MEASURES,
        help=briefly(
            "What the maps hold.",
            "; ".join(
                f"{m.name}: {m.help}" + (f" ({m.cite})" if m.cite else "")
                for m in MEASURES.values()
            )
            + ". docs/contributions.md says how each is computed.",
        ),
    ),
]
FusionName = Enum("FusionName", {name: name for name in FUSIONS}, type=str)
FusionOpt = Annotated[
    FusionName,
    typer.Option(
        "--fusion",
        rich_help_panel=Panel.MEASURES,
        help=briefly(
            "Rollout: how heads are fused.",
            "With --measure rollout: each layer's heads fused by their mean, max or min "
            "(jacobgil/vit-explain's head fusion).",
        ),
    ),
]
DiscardOpt = Annotated[
    float,
    typer.Option(
        "--discard",
        metavar="SHARE",
        rich_help_panel=Panel.MEASURES,
        help=briefly(
            "Rollout's discard ratio.",
            "With --measure rollout: the share of each layer's fused map set to 0 before the "
            "residual is added, its lowest entries (vit-explain's discard ratio, e.g. 0.9).",
        ),
    ),
]
StackName = Enum("StackName", {name: name for name in STACKS}, type=str)


StackOpt = valued(
    StackName,
    "--stack",
    panel=Panel.WRITING,
    help=briefly(
        "The stack of an encoder-decoder. [default: cross; show without a target: encoder]",
        "Encoder-decoder models (T5, BART, Marian): which attention to show: encoder "
        "(source × source), decoder (target × target, causal) or cross (target tokens "
        "reading the source). show reads the decoder's two only with --target or --generate.",
    ),
)
TargetOpt = valued(
    str,
    "--target",
    metavar="TEXT",
    panel=Panel.WRITING,
    help=briefly(
        "A continuation you give, read by teacher forcing.",
        "What a decoder reads after the prompt (each token's probability said), or the "
        "target an encoder-decoder model's decoder reads after its start token (a "
        "translation of the source).",
    ),
)
GenerateOpt = valued(
    int,
    "--generate",
    metavar="N",
    panel=Panel.WRITING,
    help=briefly(
        "The model writes N tokens; where it looked.",
        "At most N tokens, greedy (it stops at its end-of-text token), and the attention it "
        "used as it wrote: a decoder continues the prompt, an encoder-decoder model writes "
        "its target (what check does without --target, with N 40).",
    ),
)
SampleOpt = Annotated[
    bool,
    flag(
        "--sample",
        briefly(
            "Draw each token, not the likeliest.",
            "With --generate on a decoder: each token drawn from the model's distribution "
            "(no top-k or top-p).",
        ),
        Panel.WRITING,
    ),
]
TemperatureOpt = valued(
    float,
    "--temperature",
    metavar="T",
    panel=Panel.WRITING,
    help="With --sample: logits divided by T. [default: 1]",
)
SeedOpt = valued(
    int,
    "--seed",
    metavar="N",
    panel=Panel.WRITING,
    help=briefly("With --sample: seed the draw.", "The same command then writes the same text."),
)
BatchOpt = Annotated[
    int,
    typer.Option(
        "--batch-size",
        "-b",
        min=1,
        metavar="N",
        help="Sentences per forward pass.",
        rich_help_panel=Panel.READING,
    ),
]


TextArg = Annotated[
    str,
    typer.Argument(
        help=briefly(
            "The sentence to look at (- reads stdin), or a picture.",
            "A picture file, with a vision model (docs/vision.md).",
        ),
        show_default=False,
    ),
]
PromptArg = Annotated[
    str | None,
    typer.Argument(
        help=briefly(
            "The question about the picture (vision-language models).",
            "After a picture, with a vision-language model (LLaVA, Qwen2-VL, PaliGemma, …): "
            "the prompt goes through the processor's chat template as the model card would "
            "(--raw sends it as it is; docs/vision-language.md).",
        ),
        show_default=False,
    ),
]
RawOpt = Annotated[
    bool,
    flag(
        "--raw",
        briefly(
            "Send a picture's prompt as it is, not through the chat template.",
            "The prompt is then the model's whole input text: write its image token where the "
            "picture goes (or none, where the processor places it).",
        ),
        Panel.READING,
    ),
]

NoTowerOpt = Annotated[
    bool,
    flag(
        "--no-tower",
        briefly(
            "Leave the vision tower's heads unread.",
            "With a picture and a prompt: the vision tower's layers run the model's own "
            "attention, and none of its heads is recorded, drawn or printed; what reading a "
            "large tower costs: docs/vision-language.md.",
        ),
        Panel.READING,
    ),
]


def text_or_picture(
    argument: str, command: str, prompt: str | None = None
) -> tuple[str, Path | None]:
    """The text `command` (show, check) reads (- : stdin), or the picture an image file's
    name gives (its name as the text; the prompt about it, for a vision-language model)."""
    from attnviz.core.images import picture_argument, pictures_in
    from attnviz.core.inputs import read_text
    from attnviz.errors import InputError

    try:
        folder = "\n" not in argument and Path(argument).is_dir()
    except OSError:  # a long text is no file's name
        folder = False
    if folder and pictures_in([argument]) is not None:
        raise InputError(f"'{argument}' is a folder: {command} reads one picture (or a text); "
                         f"`attnviz export {argument} -m MODEL` and `attnviz report` read a "
                         "folder of pictures")  # fmt: skip
    picture = picture_argument(argument)
    if picture is None and prompt is not None:
        raise InputError(f"give one text, or a picture and a prompt about it ({command} "
                         'photo.png "What is on the table?")')  # fmt: skip
    if picture is not None and prompt is not None:
        return read_text(prompt), picture
    return (picture.name, picture) if picture is not None else (read_text(argument), None)


PairOpt = valued(
    str,
    "--pair",
    metavar="TEXT",
    panel=Panel.READING,
    help=briefly(
        "A second sentence (encoders).",
        "The model reads [CLS] TEXT [SEP] PAIR [SEP] with token types; the --html page can "
        "restrict to A→B, B→A, A→A, B→B.",
    ),
)
TopKOpt = Annotated[
    int, typer.Option("--top-k", "-k", min=1, metavar="N", help="Tokens listed per head.")
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Folder for the heatmap images.")]
NoImagesOpt = Annotated[bool, flag("--no-images", "Do not write images.")]
HtmlOpt = Annotated[
    bool,
    flag("--html", briefly("Also write attention.html, an interactive page.", "It works offline.")),
]
JobsOpt = valued(
    int,
    "--jobs",
    "-j",
    metavar="N",
    min=1,
    panel=Panel.OUTPUT,
    help=briefly(
        "Drawing processes. [default: one per core, at most 4]",
        "Started while the model loads; 1 draws in this process.",
    ),
)
AblateOpt = valued(
    list[str],
    "--ablate",
    metavar="L.H",
    panel=Panel.MEASURES,
    help=briefly(
        "Remove head H of layer L (repeatable).",
        "Its output set to 0: the maps show the model without it, and a decoder's loss and "
        "top-5 next tokens (an encoder's embedding) before and after are printed.",
    ),
)


WindowOpt = valued(
    str,
    "--window",
    metavar="START:END",
    panel=Panel.LONG,
    help=briefly(
        "Also the exact cells of tokens START … END−1.",
        "Queries and keys: the head figures (and the page) show them, while a long text's "
        "overview and layer grids are pooled.",
    ),
)
PoolName = Enum("PoolName", {name: name for name in POOLS}, type=str)
PoolOpt = Annotated[
    PoolName,
    typer.Option(
        "--pool",
        rich_help_panel=Panel.LONG,
        help=briefly(
            "A long text's cells pooled by max or mean.",
            "A long text's maps (over 512 tokens a side) are pooled: each cell the max of a "
            "block of cells (the strongest links show) or their mean.",
        ),
    ),
]


def style(fmt: ImageFormat, dpi: int, cmap: str, scale: Scale = Scale.absolute):
    from attnviz.outputs.figures import Style, check_cmap

    return Style(fmt=fmt.value, dpi=dpi, cmap=check_cmap(cmap), scale=scale.value)


@dataclass(frozen=True)
class Group:
    """Options several commands share, declared once: a command's parameter whose default is
    a Group stands for these options on the command line (`grouped`), and receives what
    `make` builds of their values."""

    make: Callable[..., Any]
    parameters: tuple[inspect.Parameter, ...]

    @classmethod
    def of(cls, make: Callable[..., Any], **options: tuple[Any, Any]) -> Group:
        """A group of options, each name=(annotation, default), in the order given."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return cls(make, tuple(inspect.Parameter(name, kind, annotation=annotation,
                                                 default=default)
                               for name, (annotation, default) in options.items()))  # fmt: skip


def load(
    model: str | None,
    device: Device = Device.auto,
    implementation: Any = Implementation.sdpa,
    dtype: Any = Dtype.auto,
    device_map: Any = None,
    max_memory: list[str] | None = None,
    offload_folder: Path | None = None,
    quantize: Any = None,
) -> Any:
    """The load settings (a core.settings.Load) from the options' values; `Load.refuse`
    checks them when the model is made, before anything loads."""
    from attnviz.core.settings import Load

    return Load(
        model, device.value, implementation.value, dtype.value,
        device_map.value if device_map is not None else None, tuple(max_memory or ()),
        str(offload_folder) if offload_folder is not None else None,
        quantize.value if quantize is not None else None,
    )  # fmt: skip


# How the model is loaded: --model, --device, --attention, --dtype, --device-map, --max-memory,
# --offload-folder and --quantize (a core.settings.Load).
LOAD = Group.of(
    load,
    model=(ModelOpt, None),
    device=(DeviceOpt, Device.auto),
    implementation=(ImplementationOpt, Implementation.sdpa),
    dtype=(DtypeOpt, Dtype.auto),
    device_map=(DeviceMapOpt, None),
    max_memory=(MaxMemoryOpt, None),
    offload_folder=(OffloadOpt, None),
    quantize=(QuantizeOpt, None),
)


def _select(layer: list[int] | None, head: list[int] | None) -> dict[str, Any]:
    return {"layers": tuple(layer) if layer else None, "heads": tuple(head) if head else None}


# --layer and --head: the part of the model asked for (a Request's `layers` and `heads`).
SELECT = Group.of(_select, layer=(LayerOpt, None), head=(HeadOpt, None))


def _measuring(measure: MeasureName, fusion: FusionName, discard: float) -> dict[str, Any]:
    return dict(measure=measure.value, fusion=fusion.value, discard=discard)


# --measure, --fusion and --discard: what the maps hold (a Request's fields).
MEASURING = Group.of(
    _measuring,
    measure=(MeasureOpt, MeasureName.weights),
    fusion=(FusionOpt, FusionName.mean),
    discard=(DiscardOpt, 0.0),
)


def _writing(generate: int | None, sample: bool, temperature: float | None,
             seed: int | None) -> dict[str, Any]:  # fmt: skip
    return dict(generate=generate, sample=sample, temperature=temperature, seed=seed)


# --generate, --sample, --temperature and --seed: the model writes after the text (a decoder's
# continuation, an encoder-decoder model's target), as a Request's fields.
WRITING = Group.of(
    _writing,
    generate=(GenerateOpt, None),
    sample=(SampleOpt, False),
    temperature=(TemperatureOpt, None),
    seed=(SeedOpt, None),
)
# --format, --dpi, --cmap and --scale: how figures are drawn (an outputs.figures.Style).
STYLE = Group.of(
    style,
    fmt=(FormatOpt, ImageFormat.png),
    dpi=(DpiOpt, 100),
    cmap=(CmapOpt, "viridis"),
    scale=(ScaleOpt, Scale.absolute),
)


def grouped(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with each parameter whose default is a `Group` replaced, in the signature
    Typer reads, by the group's options; called with those, `command` gets what the group
    makes of them in that parameter."""
    signature = inspect.signature(command, eval_str=True)
    groups = {name: p.default for name, p in signature.parameters.items()
              if isinstance(p.default, Group)}  # fmt: skip
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        found = groups.get(parameter.name)
        parameters += found.parameters if found is not None else [parameter]

    @functools.wraps(command)
    def run(**given: Any) -> Any:
        from attnviz.cli.app import fail
        from attnviz.errors import AttnvizError

        try:
            for name, group in groups.items():
                given[name] = group.make(**{p.name: given.pop(p.name) for p in group.parameters})
        except AttnvizError as error:  # a bad value (an unknown colour map): one line
            raise fail(error) from None
        return command(**given)

    run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return run
