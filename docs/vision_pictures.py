"""The pictures of docs/vision.md, made from a random model (no pretrained vision weights are
reachable where attnviz is built): a DINOv2-with-registers-shaped model (4 layers × 4 heads,
224 × 224 pictures in 16-pixel patches, 4 registers), its weights drawn at random, and three
drawn pictures (a gradient, a disc and a bar). What the heads do is noise; the views are
what a trained model's would look like.

Run: .venv/bin/python docs/vision_pictures.py  (docs/vision-cls.png, docs/vision-distance.png)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent


def _model(folder: Path) -> None:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model("dinov2_with_registers", hidden_size=64, num_hidden_layers=4,
                                  num_attention_heads=4, intermediate_size=128, image_size=224,
                                  patch_size=16, num_register_tokens=4)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    processor = transformers.BitImageProcessorPil(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}
    )
    processor.save_pretrained(folder)


def _pictures(folder: Path) -> None:
    import numpy as np
    from PIL import Image

    folder.mkdir()
    y, x = np.mgrid[0:240, 0:320]
    for i in range(3):
        pixels = np.zeros((240, 320, 3), np.uint8)
        pixels[..., 0], pixels[..., 1], pixels[..., 2] = x * 255 // 320, y * 255 // 240, 120
        pixels[(x - 100 - 60 * i) ** 2 + (y - 120) ** 2 < 2500] = (240, 220, 40)
        pixels[30:80, 220 - 30 * i : 300 - 30 * i] = (30, 30, 200)
        Image.fromarray(pixels).save(folder / f"picture-{i}.png")


def main() -> None:
    attnviz = [sys.executable, "-m", "attnviz"]
    with tempfile.TemporaryDirectory(prefix="vision-pictures-") as tmp:
        work = Path(tmp)
        _model(work / "model")
        _pictures(work / "pictures")
        first = work / "pictures" / "picture-0.png"
        run = dict(check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*attnviz, "show", str(first), "-m", str(work / "model"), "-l", "3",
                        "-o", str(work / "show")], **run)  # fmt: skip
        subprocess.run([*attnviz, "report", str(work / "pictures"), "-m", str(work / "model"),
                        "-o", str(work / "report")], **run)  # fmt: skip
        (shown,) = (work / "show").glob("*/picture-layer-3.png")
        shutil.copyfile(shown, DOCS / "vision-cls.png")
        shutil.copyfile(work / "report" / "mean-distance.png", DOCS / "vision-distance.png")
    print("wrote docs/vision-cls.png and docs/vision-distance.png")


if __name__ == "__main__":
    main()
