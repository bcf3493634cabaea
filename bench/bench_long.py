"""Long texts on SmolLM2 (issue 33): `attnviz show - -m smollm2 --html` against a bare
transformers script that loads the same model and runs one SDPA forward pass over the same
text with no attentions, side by side; and time and peak memory of `show` at 512 … 8,192
tokens on the new path (SDPA, recomputed in blocks; long texts streamed and pooled) against
`--attention eager` (transformers' eager kernel computes each layer's probabilities, H × T × T
at once, and attnviz reads them), eager up to `--eager-up-to` tokens; `report -m smollm2`
on 3 and on 6 texts of 2,000 tokens (its peak should not grow with the number of texts); and
`show` on the bundled model at 512 tokens, the new path against eager (`--parts` picks).

Each run is a fresh process; peak memory is the sum of RSS over the process tree (its drawing
processes included, `_rss.py`). The side-by-side part runs `--runs` rounds, rotated; the
table of lengths runs each length once.

Run: .venv/bin/python bench/bench_long.py [--runs 3] [--tokens 8085]
     [--lengths 512 1024 2048 4096 8192] [--eager-up-to 4096] [--plot PNG]
     [--report-tokens 2000] [--report-texts 3 6] [--parts side lengths report bundled]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))

# What anyone would write: the converted SmolLM2 folder attnviz keeps, SDPA, no attentions,
# leaving without the interpreter's teardown as attnviz does.
BARE = r"""
import os, sys, torch
from transformers import AutoModel, AutoTokenizer
path, text = sys.argv[1], sys.stdin.read()
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
with torch.inference_mode():
    model(**tokenizer(text, return_tensors="pt"))
os._exit(0)
"""


def text_of(n_tokens: int, tokenizer) -> str:
    """The samples corpus, repeated as often as needed, cut where SmolLM2 reads it as exactly
    `n_tokens` tokens (its BOS, which attnviz adds, included)."""
    sentences = [line.strip() for line in SAMPLES.read_text().splitlines() if line.strip()]
    corpus = " ".join(sentences)
    while len(tokenizer(corpus)["input_ids"]) < n_tokens + 8:
        corpus = corpus + " " + corpus
    pieces = tokenizer(corpus, add_special_tokens=False, return_offsets_mapping=True)
    ends = [end for _, end in pieces["offset_mapping"]]
    return corpus[: ends[n_tokens - 2]]  # n − 1 pieces and attnviz's BOS


def _run(command: list[str], text: str) -> tuple[float, float, bool]:
    """(wall s, peak MiB, whether it succeeded) of one fresh run reading `text` on stdin: a
    run that fails (refused, killed) is reported as such, and the benchmark goes on."""
    with tempfile.TemporaryFile("w+") as stdin:
        stdin.write(text)
        stdin.seek(0)
        try:
            wall, peak = measure(command, stdin=stdin)
        except SystemExit as failed:
            print(f"<!-- failed: {str(failed).splitlines()[-1] if str(failed) else ''} -->")
            return float("nan"), float("nan"), False
    return wall, peak, True


def _cells(found: tuple[float, float, bool]) -> str:
    return f"{found[0]:.1f} | {found[1]:.0f}" if found[2] else "failed | –"


def _plot(path: str, table: list[tuple[int, tuple, tuple | None]]) -> None:
    """Time and peak memory against length, new path and eager, side by side: a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for name, at, style in (("new path (SDPA, recomputed in blocks)", 1, "o-"),
                            ("--attention eager", 2, "s--")):  # fmt: skip
        points = [(row[0], row[at]) for row in table if row[at] is not None and row[at][2]]
        lengths = [n for n, _ in points]
        left.plot(lengths, [found[0] for _, found in points], style, label=name)
        right.plot(lengths, [found[1] / 1024 for _, found in points], style, label=name)
    for axis, label in ((left, "wall time, s"), (right, "peak memory, GiB (process tree)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks([n for n, _, _ in table], [f"{n:,}" for n, _, _ in table])
        axis.set_xlabel("tokens")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    left.legend()
    figure.suptitle("attnviz show - -m smollm2 --no-images, one fresh process per point")
    figure.savefig(path, dpi=110)
    print(f"\nPlot: {path}")


PARTS = ("side", "lengths", "report", "bundled")


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--tokens", type=int, default=8085, help="the side-by-side text")
    options.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    options.add_argument("--eager-up-to", type=int, default=4096, help="longest eager run")
    options.add_argument("--plot", help="also draw the table of lengths to this PNG")
    options.add_argument("--report-tokens", type=int, default=2000, help="each report text")
    options.add_argument("--report-texts", type=int, nargs="+", default=[3, 6])
    options.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = options.parse_args()
    if args.quick:
        args.runs, args.tokens, args.lengths = 1, 512, [256, 512]
        args.report_tokens, args.report_texts = 256, [1, 2]
    header("Long texts on SmolLM2: `show --html` against a bare SDPA forward pass", args)

    from transformers import AutoTokenizer
    from transformers.utils import logging

    from attnviz.core import gguf_cache

    logging.set_verbosity_error()
    folder = str(gguf_cache.converted("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with tempfile.TemporaryDirectory() as tmp:
        if "side" in args.parts:
            _side_by_side(text_of(args.tokens, tokenizer), args.tokens, args.runs, folder, tmp)
        if "lengths" in args.parts:
            table = _lengths(args.lengths, args.eager_up_to, tokenizer)
            if args.plot:
                _plot(args.plot, table)
        if "report" in args.parts:
            _report(args.report_tokens, args.report_texts, tokenizer, tmp)
        if "bundled" in args.parts:
            _bundled(512, max(args.runs, 5) if not args.quick else 1, tokenizer)
    footer()


def _rotated(sides: dict[str, list[str]], text: str, n_rounds: int) -> tuple[dict, dict]:
    """Each side's wall seconds and peak MiB, one fresh run a round, in rotated order."""
    runs: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in sides}
    for order in rounds(n_rounds, list(sides)):
        for name in order:
            runs[name].append(_run(sides[name], text))
    walls = {name: [wall for wall, _, _ in found] for name, found in runs.items()}
    peaks = {name: [peak for _, peak, _ in found] for name, found in runs.items()}
    return walls, peaks


def _side_by_side(text: str, n_tokens: int, n_rounds: int, folder: str, tmp: str) -> None:
    """`show --html` against the bare SDPA script on the same text, rounds rotated."""
    sides = {
        "show --html": [ATTNVIZ, "show", "-", "-m", "smollm2", "--html", "-o", tmp],
        "bare": [sys.executable, "-c", BARE, folder],
    }
    walls, peaks = _rotated(sides, text, n_rounds)
    print(f"{n_tokens:,} tokens, one fresh process each; min / median / max over the rounds.\n")
    print("| | wall s | peak MiB (process tree) | ÷ bare, wall |")
    print("|---|---|---|---|")
    for name in sides:
        ratio = spread(ratios(walls[name], walls["bare"]), bold=True)
        print(f"| {name} | {spread(walls[name], 1)} | {spread(peaks[name], 0)} | {ratio} |")


def _lengths(lengths: list[int], eager_up_to: int, tokenizer) -> list:
    """`show --no-images` at each length, the new path and eager (as far as `eager_up_to`)."""
    print("\nEach length once, fresh processes; `show -m smollm2 --no-images` (the pass, "
          "the summary and the terminal):\n")  # fmt: skip
    print("| tokens | new path s | new path MiB | eager s | eager MiB |")
    print("|---|---|---|---|---|")
    table = []
    for n in lengths:
        piece = text_of(n, tokenizer)
        new = [ATTNVIZ, "show", "-", "-m", "smollm2", "--no-images"]
        found = _run(new, piece)
        by_eager = _run([*new, "--attention", "eager"], piece) if n <= eager_up_to else None
        table.append((n, found, by_eager))
        eager_cells = _cells(by_eager) if by_eager is not None else "not run | –"
        print(f"| {n:,} | {_cells(found)} | {eager_cells} |", flush=True)
    return table


def _bundled(n_tokens: int, n_rounds: int, tokenizer) -> None:
    """`show` on the bundled model (images and all) at `n_tokens`, the new path against
    `--attention eager`, rounds rotated: the new path should be no slower and no larger."""
    from transformers import AutoTokenizer

    from attnviz.core.models import bundled_model_path

    bundled = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    words = text_of(n_tokens * 2, tokenizer).split()
    while len(bundled(" ".join(words))["input_ids"]) > n_tokens:
        words = words[:-1]
    text = " ".join(words)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            "sdpa (default)": [ATTNVIZ, "show", "-", "-o", tmp],
            "--attention eager": [ATTNVIZ, "show", "-", "-o", tmp, "--attention", "eager"],
        }
        walls, peaks = _rotated(sides, text, n_rounds)
    eager = "--attention eager"
    print(f"\n`attnviz show -` on the bundled model, {len(bundled(text)['input_ids'])} tokens, "
          "all 79 images; min / median / max over the rounds:\n")  # fmt: skip
    print("| | wall s | ÷ eager, wall | peak MiB (process tree) | ÷ eager, peak |")
    print("|---|---|---|---|---|")
    for name in sides:
        wall = spread(ratios(walls[name], walls[eager]), bold=True)
        peak = spread(ratios(peaks[name], peaks[eager]), bold=True)
        print(f"| {name} | {spread(walls[name], 2)} | {wall} | {spread(peaks[name], 0)} | {peak} |")


def _report(n_tokens: int, counts: list[int], tokenizer, tmp: str) -> None:
    """`report -m smollm2` on `count` texts of `n_tokens` tokens each (default batch size):
    its peak should not grow with the number of texts."""
    print(f"\n`attnviz report -f TEXTS -m smollm2`, texts of {n_tokens:,} tokens, one run each:\n")
    print("| texts | wall s | peak MiB (process tree) |")
    print("|---|---|---|")
    text = text_of(n_tokens, tokenizer).replace("\n", " ")
    for count in counts:
        path = Path(tmp) / f"texts-{count}.txt"
        path.write_text((text + "\n") * count)
        out = Path(tmp) / f"report-{count}"
        command = [ATTNVIZ, "report", "-f", str(path), "-m", "smollm2", "--out", str(out)]
        found = _run(command, "")
        print(f"| {count} | {_cells(found)} |", flush=True)


if __name__ == "__main__":
    main()
