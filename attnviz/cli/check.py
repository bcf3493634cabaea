"""`attnviz check`: recompute attention layers from scratch and compare with the model."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer

from attnviz.cli.app import Command, Panel, app, fail, out_console
from attnviz.cli.options import (
    Device,
    DeviceMapOpt,
    DeviceOpt,
    Dtype,
    DtypeOpt,
    GenerateOpt,
    JsonOpt,
    LayerOpt,
    MaxMemoryOpt,
    ModelOpt,
    OffloadOpt,
    QuantizeOpt,
    TargetOpt,
    TruncateOpt,
    briefly,
    flag,
    load,
    text_or_picture,
)
from attnviz.core import layer_map
from attnviz.errors import AttnvizError

# Choices come from the layer map's stacks, plus "all" (check's default).
Stack = Enum("Stack", {name: name for name in (*layer_map.STACKS, "all")}, type=str)

SentenceArg = Annotated[
    str,
    typer.Argument(
        help=briefly(
            "The sentence to run through the model (- reads stdin), or a picture.",
            "A picture file, with a vision model (ViT, DeiT, DINOv2: docs/vision.md), read as "
            "`show` reads it.",
        ),
        show_default=False,
    ),
]
AllLayersOpt = Annotated[bool, flag("--all-layers", "Check every layer (the default).")]
ToleranceOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        metavar="MAX",
        help=briefly(
            "Largest error that passes; default: the dtype's.",
            "The largest absolute error; the model's dtype's by default: 1e-5 in float32 "
            "(half precision rounds the model's own numbers: docs/models.md).",
        ),
        show_default=False,
    ),
]
CheckStackOpt = Annotated[
    Stack | None,
    typer.Option(
        help="Encoder-decoders: the stack to check. Default: all.",
        show_default=False,
        rich_help_panel=Panel.WRITING,
    ),
]


@app.command(cls=Command)
def check(
    text: SentenceArg,
    layer: LayerOpt = None,
    all_layers: AllLayersOpt = False,
    tolerance: ToleranceOpt = None,
    model: ModelOpt = None,
    target: TargetOpt = None,
    generate: GenerateOpt = None,
    stack: CheckStackOpt = None,
    truncate: TruncateOpt = False,
    device: DeviceOpt = Device.auto,
    dtype: DtypeOpt = Dtype.auto,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_folder: OffloadOpt = None,
    quantize: QuantizeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Recompute attention layers from scratch (textbook formulas) and compare with the model.

    For each head h: Q_h = X W_Q^h + b, K_h, V_h alike; softmax(Q_h K_hᵀ / √d_k + mask) V_h;
    heads concatenated and multiplied by W_O. Exit code 0 when everything is within the
    tolerance, 1 on a mismatch.
    \f
    Compares each head's attention probabilities and the block's output (after W_O, before
    residual and LayerNorm) with the model's own. An encoder-decoder model (T5, BART,
    Marian) reads the text as its source, and every stack is checked: encoder, decoder
    (causal) and cross-attention (keys and values from the encoder's last hidden states); T5
    adds its relative position bias to unscaled scores. A vision model (ViT, DeiT, DINOv2)
    reads a picture file given instead of the text, as `show` reads it.
    """
    from attnviz.outputs import terminal
    from attnviz.pipelines.check import check as run_check
    from attnviz.pipelines.request import CheckRequest

    try:
        how = load(model, device, dtype=dtype, device_map=device_map, max_memory=max_memory,
                   offload_folder=offload_folder, quantize=quantize)  # fmt: skip
        text, picture = text_or_picture(text, "check")
        result = run_check(
            CheckRequest(
                how,
                text=text,
                picture=picture,
                target=target,
                generate=generate,
                layers=tuple(layer) if layer else None,
                all_layers=all_layers,
                stacks=() if stack is None else (stack.value,),
                truncate=truncate,
                tolerance=tolerance,
            )
        )
    except AttnvizError as error:
        raise fail(error) from None
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
    else:
        terminal.print_check(out_console, result)
    raise typer.Exit(0 if result.passed else 1)
