"""The naive script bench_export.py compares `attnviz export --figures heads` with: what people
write today to save one heatmap per head.

For each sentence, one forward pass with attentions, then for every head a new matplotlib
figure with token labels, a colour bar, tight_layout, savefig and close. Like attnviz, it
leaves without the interpreter's teardown (os._exit), so that the comparison is of the work.
Run: python bench/_naive_export.py MODEL_DIR SENTENCES.txt OUT SIZES_JSON LAYERS_JSON
  SIZES_JSON: [[width, height], ...] pixels, one per sentence (attnviz's own head figures');
  LAYERS_JSON: the layers to draw, [] for all.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def draw(weights, tokens: list[str], title: str, path: Path, size_px, dpi: int = 100) -> None:
    """One head's (query, key) weights as a labelled heatmap with a colour bar, the usual way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(size_px[0] / dpi, size_px[1] / dpi), dpi=dpi)
    im = ax.imshow(weights, cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90)
    ax.set_yticks(range(len(tokens)), tokens)
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def main() -> None:
    model_dir, source, out, sizes, layers = sys.argv[1:6]
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    texts = Path(source).read_text(encoding="utf-8").splitlines()
    for number, (text, size) in enumerate(zip(texts, json.loads(sizes), strict=True), 1):
        folder = Path(out) / f"{number:04d}"
        folder.mkdir(parents=True)
        inputs = tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            attentions = model(**inputs, output_attentions=True).attentions
        tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
        for layer in json.loads(layers) or range(len(attentions)):
            weights = attentions[layer][0].numpy()  # (H, T, T)
            for head in range(weights.shape[0]):
                title = f"layer {layer} · head {head}"
                draw(
                    weights[head],
                    tokens,
                    title,
                    folder / f"layer-{layer:02d}-head-{head:02d}.png",
                    size,
                )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
