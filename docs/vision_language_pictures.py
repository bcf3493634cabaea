"""The pictures of docs/vision-language.md, made from a tiny random LLaVA (no pretrained
weights are reachable where attnviz is built): tests/vlm_models.py's (2 layers × 4 heads, a
CLIP tower of 84 × 84 pixels in 14-pixel patches: 6 × 6 image tokens), its weights drawn at
random, and one drawn picture (a gradient, a disc and a bar). What the heads do is noise;
the views are what a trained model's would look like.

Mllama's cross-attention over the picture (vlm-cross.png) and LLaVA-NeXT's tower over its
tiles (vlm-tower-tiles.png) are drawn the same way from their tiny random models.

Run: .venv/bin/python docs/vision_language_pictures.py  (docs/vlm-answer.png, vlm-share.png,
vlm-tower.png, vlm-cross.png, vlm-tower-tiles.png)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent


def _picture(path: Path) -> None:
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:192, 0:256]
    pixels = np.zeros((192, 256, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = x * 255 // 256, y * 255 // 192, 120
    pixels[(x - 110) ** 2 + (y - 110) ** 2 < 1600] = (240, 220, 40)
    pixels[30:70, 150:220] = (30, 30, 200)
    Image.fromarray(pixels).save(path)


def main() -> None:
    sys.path.insert(0, str(DOCS.parent / "tests"))
    from vlm_models import save

    attnviz = [sys.executable, "-m", "attnviz"]
    with tempfile.TemporaryDirectory(prefix="vlm-pictures-") as tmp:
        work = Path(tmp)
        save("llava", work / "tiny-random-llava")
        _picture(work / "photo.png")
        # run in the folder, so that the figures' titles name "tiny-random-…", not a temp path
        subprocess.run([*attnviz, "show", "photo.png", "What is on the table?",
                        "-m", "tiny-random-llava", "--generate", "3", "-o", "show"],
                       check=True, stdout=subprocess.DEVNULL, cwd=work)  # fmt: skip
        (folder,) = (work / "show").iterdir()
        shutil.copyfile(folder / "picture-answer-layer-1.png", DOCS / "vlm-answer.png")
        shutil.copyfile(folder / "picture-share.png", DOCS / "vlm-share.png")
        shutil.copyfile(folder / "tower-layer-1.png", DOCS / "vlm-tower.png")
        for kind, drawn, name in (
            ("mllama", "picture-answer-layer-0.png", "vlm-cross.png"),
            ("llava_next", "tower-layer-1.png", "vlm-tower-tiles.png"),
        ):
            save(kind, work / f"tiny-random-{kind}")
            subprocess.run([*attnviz, "show", "photo.png", "What is on the table?",
                            "-m", f"tiny-random-{kind}", "--generate", "3", "-o",
                            f"show-{kind}"], check=True, stdout=subprocess.DEVNULL,
                           cwd=work)  # fmt: skip
            (folder,) = (work / f"show-{kind}").iterdir()
            shutil.copyfile(folder / drawn, DOCS / name)
    print(
        "wrote docs/vlm-answer.png, vlm-share.png, vlm-tower.png, vlm-cross.png and "
        "vlm-tower-tiles.png"
    )


if __name__ == "__main__":
    main()
