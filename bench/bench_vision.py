"""`attnviz show` of a 224 × 224 picture on a ViT-B/16-sized random model (12 layers × 12
heads, 197 tokens), every figure written, against the bare script it is built on: load the
model and its image processor, prepare the picture, one eager forward pass with attentions.

The model is random (no pretrained vision weights are reachable here): its size and shapes
are ViT-B/16's, which is what the time depends on. Each run is a fresh process; a round runs
both once, in an order rotated every round; the ratio is taken within a round, then min /
median / max over the rounds. Peak memory: the largest sum of RSS over the process and its
drawing workers (see _rss.py), medians over the rounds.
Run: .venv/bin/python bench/bench_vision.py [--runs 3] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
BARE = r"""
import sys
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModel
folder, path = sys.argv[1], sys.argv[2]
processor = AutoImageProcessor.from_pretrained(folder)
model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
with Image.open(path) as image:
    pixels = processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
with torch.inference_mode():
    out = model(pixel_values=pixels, output_attentions=True)
assert len(out.attentions) == model.config.num_hidden_layers
import os
os._exit(0)
"""


def _model(folder: Path, quick: bool) -> None:
    """A random ViT-B/16-sized model (smaller with --quick) and its processor, in `folder`."""
    import torch
    from transformers import AutoConfig, AutoModel, ViTImageProcessor

    size = dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                intermediate_size=768) if quick else {}  # fmt: skip
    config = AutoConfig.for_model("vit", image_size=224, patch_size=16, **size)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)


def _picture(path: Path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (224, 224, 3), np.uint8)).save(path)


def main() -> None:
    args = parser(__doc__, runs=3).parse_args()
    if args.quick:
        args.runs = 2
    header("show of a 224 × 224 picture against a bare forward pass (ViT-B/16 size)", args)
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        work = Path(tmp)
        model, path = work / "vit", work / "picture.png"
        _model(model, args.quick)
        _picture(path)
        sides = {
            "show": [ATTNVIZ, "show", str(path), "-m", str(model), "-o", str(work / "out")],
            "bare": [sys.executable, "-c", BARE, str(model), str(path)],
        }
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        peaks: dict[str, list[float]] = {name: [] for name in sides}
        for order in rounds(args.runs, list(sides)):
            for name in order:
                took, peak = measure(sides[name])
                seconds[name].append(took)
                peaks[name].append(peak)
        written = len(list((work / "out").glob("*/*.png")))
    print(f"`show` wrote {written} figures (overview, layer grids, head figures, CLS over the "
          "picture per layer).\n")  # fmt: skip
    print(
        "| | show ÷ bare (min / median / max) | show s | bare s | show peak MiB | bare peak MiB |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| 224 × 224, 197 tokens | {spread(ratios(seconds['show'], seconds['bare']), bold=True)}"
        f" | {statistics.median(seconds['show']):.1f} | {statistics.median(seconds['bare']):.1f}"
        f" | {statistics.median(peaks['show']):.0f} | {statistics.median(peaks['bare']):.0f} |"
    )
    footer()


if __name__ == "__main__":
    main()
