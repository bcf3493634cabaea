"""Per-head figures: `attnviz export` against the naive matplotlib script, whole processes.

The naive script (_naive_export.py) is what people write today: import torch and
transformers, load the bundled model, and for each sentence one forward pass with attentions,
then for every head a new figure with token labels, a colour bar, tight_layout, savefig,
close. `attnviz export --figures heads` does the same work on the same sentences (the 4th
and following of the samples corpus; by default the 4th alone, 72 figures), and each naive
figure has the pixel size of attnviz's figure of that sentence. Both are whole fresh
processes, imports and model load included, and both leave without the interpreter's
teardown. A round runs each side once, in an order
rotated every round; each ratio is taken within a round.

Second, the renderers alone in one process, model loaded and attention extracted beforehand:
attnviz's HeadFigure against the naive figure, the same heads of one sentence, same pixel
size, same labels.
Run: .venv/bin/python bench/bench_export.py [--runs 5] [--sentences 1] [--heads 12] [--quick]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import footer, header, parser, ratios, rounds, spread, wall
from _naive_export import draw

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
NAIVE = str(Path(__file__).with_name("_naive_export.py"))
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
SENTENCE = "The committee, after considerable debate, approved the 2026 budget on Tuesday."


def head_sizes(out: Path) -> list[list[int]]:
    """The pixel size of each sentence's head figures in an export folder, in manifest order."""
    from PIL import Image

    manifest = json.loads((out / "manifest.json").read_text())
    sizes = []
    for sentence in manifest["sentences"]:
        with Image.open(out / sentence["files"][0]) as image:
            sizes.append(list(image.size))
    return sizes


def whole_processes(args, tmp: Path) -> None:
    from attnviz.core.models import bundled_model_path

    lines = [line for line in SAMPLES.read_text().splitlines() if line.strip()]
    source = tmp / "sentences.txt"
    source.write_text("\n".join(lines[3 : 3 + args.sentences]) + "\n", encoding="utf-8")
    layer_options = [option for layer in args.layers for option in ("-l", str(layer))]

    def export(jobs: int, out: Path) -> list[str]:
        return [ATTNVIZ, "export", "-f", str(source), "-o", str(out), "--figures", "heads",
                "--jobs", str(jobs), *layer_options]  # fmt: skip

    wall(export(1, tmp / "warm-up"))  # untimed: warms the file cache, gives the sizes to match
    sizes = head_sizes(tmp / "warm-up")
    figures = len(list((tmp / "warm-up").glob("*/*.png")))
    model_dir = str(bundled_model_path())

    def naive(out: Path) -> list[str]:
        return [sys.executable, NAIVE, model_dir, str(source), str(out), json.dumps(sizes),
                json.dumps(args.layers)]  # fmt: skip

    commands = {
        "naive script": naive,
        "`attnviz export --figures heads --jobs 1`": lambda out: export(1, out),
        "`attnviz export --figures heads --jobs 2`": lambda out: export(2, out),
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for number, order in enumerate(rounds(args.runs, list(commands))):
        for name in order:
            side = list(commands).index(name)  # 0: the naive script
            times[name].append(wall(commands[name](tmp / f"round-{number}-side-{side}")))
    naive_figures = len(list((tmp / "round-0-side-0").glob("*/*.png")))
    if naive_figures != figures:
        raise SystemExit(f"the two sides wrote {naive_figures} and {figures} figures")

    naive = times["naive script"]
    print(f"Whole processes (imports, model load, forward passes, {figures} head figures of "
          f"{args.sentences} sentence(s), sizes {sizes}); ratios within a round, min / median / "
          f"max over {args.runs} rounds:\n")  # fmt: skip
    print("| run | **speed-up: naive s ÷ its s** | wall s | ms per figure |")
    print("|---|---|---|---|")
    for name, values in times.items():
        per_figure = [1000 * s / figures for s in values]
        speedup = spread(ratios(naive, values), bold=True) if values is not naive else "1"
        print(f"| {name} | {speedup} | {spread(values)} | {spread(per_figure, 1)} |")


def renderers(args) -> None:
    from attnviz.core.extract import extract
    from attnviz.core.models import load_model
    from attnviz.outputs.figures import HeadFigure, Labels, Style, head_title

    att = extract(load_model(None, "cpu"), SENTENCE)
    labels = Labels.of(att)
    n_layers, n_heads = att.weights.shape[:2]
    heads = [(i // n_heads % n_layers, i % n_heads) for i in range(args.heads)]

    def ours(chosen, folder: Path) -> tuple[int, int]:
        figure = HeadFigure(labels, Style())
        for layer, head in chosen:
            grid = att.weights[layer, head]
            title = head_title(labels, layer, head, grid)
            figure.save(grid, title, folder / f"ours-{layer}-{head}.png")
        size = figure.frames.canvas.get_width_height()
        figure.close()
        return size

    def naive(chosen, folder: Path) -> None:
        for layer, head in chosen:
            title = f"layer {layer} · head {head}"
            draw(
                att.weights[layer, head],
                att.tokens,
                title,
                folder / f"naive-{layer}-{head}.png",
                size,
            )

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = ours(heads[:1], folder)  # warm-up; also gives the pixel size to match
        naive(heads[:1], folder)
        sides = {"naive": lambda: naive(heads, folder), "attnviz": lambda: ours(heads, folder)}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for order in rounds(args.runs, list(sides)):
            for name in order:
                start = time.perf_counter()
                sides[name]()
                times[name].append(1000 * (time.perf_counter() - start) / len(heads))
    print(f"\nThe renderers alone, one process: {args.heads} head figures of one sentence "
          f"({len(att.tokens)} tokens, {size[0]}×{size[1]} px) a round:\n")  # fmt: skip
    print("| renderer | **speed-up** | ms per figure |")
    print("|---|---|---|")
    print(f"| naive matplotlib figure | 1 | {spread(times['naive'], 1)} |")
    speedup = spread(ratios(times["naive"], times["attnviz"]), 1, bold=True)
    print(f"| attnviz HeadFigure | {speedup} | {spread(times['attnviz'], 1)} |")


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--sentences", type=int, default=1, help="sentences, whole processes")
    options.add_argument("--layers", type=int, nargs="*", default=[], help="default: all")
    options.add_argument("--heads", type=int, default=12, help="head figures a round, renderers")
    args = options.parse_args()
    if args.quick:
        args.runs, args.sentences, args.layers, args.heads = 2, 1, [0], 12
    header("Per-head figures: `attnviz export` against the naive script", args)
    with tempfile.TemporaryDirectory() as tmp:
        whole_processes(args, Path(tmp))
    renderers(args)
    footer()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
