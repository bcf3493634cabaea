"""Per-head figure throughput: attnviz's renderer against the naive matplotlib loop.

The naive loop is what people write today: for every head a new figure with token labels,
a colour bar, tight_layout, savefig, close. Both sides draw the same heads of the same real
attention (bundled model) at the same pixel size with the same labels. Medians of --runs.
Run: .venv/bin/python bench/bench_export.py [--runs 5] [--heads 24]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SENTENCE = "The committee, after considerable debate, approved the 2026 budget on Tuesday."


def naive_loop(att, heads, folder: Path, size_px: tuple[int, int], dpi: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width, height = size_px[0] / dpi, size_px[1] / dpi
    for layer, head in heads:
        fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
        im = ax.imshow(att.weights[layer, head], cmap="viridis", vmin=0, vmax=1)
        n = len(att.tokens)
        ax.set_xticks(range(n), att.tokens, rotation=90)
        ax.set_yticks(range(n), att.tokens)
        ax.set_title(f"layer {layer} · head {head}")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(folder / f"naive-{layer}-{head}.png", dpi=dpi)
        plt.close(fig)


def ours(att, heads, folder: Path) -> tuple[int, int]:
    from attnviz.outputs.figures import HeadFigure, Style, head_title

    figure = HeadFigure(att, Style())
    for layer, head in heads:
        grid = att.weights[layer, head]
        figure.save(grid, head_title(layer, head, grid), folder / f"ours-{layer}-{head}.png")
    size = figure.frames.canvas.get_width_height()
    figure.close()
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--heads", type=int, default=72, help="head figures per run (one sentence)")
    args = parser.parse_args()

    from attnviz.core.extract import extract
    from attnviz.core.models import load_model

    att = extract(load_model(None, "cpu"), SENTENCE)
    n_layers, n_heads = att.weights.shape[:2]
    heads = [(i // n_heads % n_layers, i % n_heads) for i in range(args.heads)]
    naive_s, ours_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = ours(att, heads[:1], folder)  # warm-up; also gives the pixel size to match
        naive_loop(att, heads[:1], folder, size, 100)
        for _ in range(args.runs):  # interleaved, so both see the same machine state
            start = time.perf_counter()
            naive_loop(att, heads, folder, size, 100)
            naive_s.append((time.perf_counter() - start) / len(heads))
            start = time.perf_counter()
            ours(att, heads, folder)
            ours_s.append((time.perf_counter() - start) / len(heads))
        from PIL import Image

        naive_px = Image.open(folder / "naive-0-0.png").size
    naive, fast = statistics.median(naive_s), statistics.median(ours_s)
    print(
        f"per-head figures, {len(att.tokens)} tokens, {size[0]}×{size[1]} px "
        f"(naive {naive_px[0]}×{naive_px[1]}), {args.heads} heads a run, median of {args.runs}"
    )
    print("| renderer | ms per figure | figures/s | speed-up |")
    print("|---|---|---|---|")
    print(f"| naive matplotlib loop | {naive * 1000:.1f} | {1 / naive:.1f} | 1.0× |")
    speedup = naive / fast
    print(
        f"| attnviz HeadFigure (one process) | {fast * 1000:.1f} | {1 / fast:.1f} "
        f"| {speedup:.1f}× |"
    )
    for jobs in (1, 2):
        per_figure = export_per_figure(jobs, args.runs)
        print(
            f"| `attnviz export --figures heads --jobs {jobs}` (end to end, 8 sentences) | "
            f"{per_figure * 1000:.1f} | {1 / per_figure:.1f} | {naive / per_figure:.1f}× |"
        )
    sys.stdout.flush()


def export_per_figure(jobs: int, runs: int) -> float:
    """Seconds per head figure of a whole `attnviz export` run, model loading excluded."""
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.pipelines.export import ExportOptions, export

    lines = (
        Path(__file__)
        .parent.parent.joinpath("attnviz", "data", "sentences.txt")
        .read_text()
        .splitlines()
    )
    chosen = Sentences(
        tuple(Sentence(i + 1, i + 1, t) for i, t in enumerate(lines[:8])), 0, "bench"
    )
    timings = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            summary = export(
                chosen, Path(tmp), options=ExportOptions(figures=("heads",)), jobs=jobs
            )
            timings.append(summary.render_seconds / summary.figures)
    return statistics.median(timings)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
