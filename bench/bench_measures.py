"""`attnviz show --measure norm|alti|rollout` against `show` (weights), whole processes.

Issue 21's targets: norm and alti take at most 1.5× the wall time of weights at 128 tokens,
and at 512 tokens peak memory at most 1.2× that of weights (no (T, T, d_model) tensor is held:
ALTI works through the queries in blocks).

Each run is a fresh `attnviz show TEXT --measure M` writing every figure (79 for weights and
norm, 7 for the per-layer alti and rollout). A round runs every measure once, in an order
rotated every round; ratios to weights are taken within a round, then min / median / max
over the rounds. Peak memory: the largest sum of RSS over the process and its drawing workers
(_rss.py), medians (min–max) of the rounds.
Run: .venv/bin/python bench/bench_measures.py [--runs 5] [--tokens 128 512] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure
from bench_show_vs_bare import text_of

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
MEASURES = ("weights", "norm", "alti", "rollout")


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    args = options.parse_args()
    if args.quick:
        args.runs, args.tokens = 2, [16]
    header("`attnviz show --measure` against `show` (weights)", args)

    from transformers import AutoTokenizer
    from transformers.utils import logging

    from attnviz.core.models import bundled_model_path

    logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.tokens:
            text = text_of(n, tokenizer)
            commands = {
                m: [ATTNVIZ, "show", text, "--measure", m, "--out", str(Path(tmp) / m)]
                for m in MEASURES
            }
            runs: dict[str, list[tuple[float, float]]] = {m: [] for m in MEASURES}
            for order in rounds(args.runs, list(MEASURES)):
                for m in order:
                    runs[m].append(measure(commands[m]))
            rows.append((n, runs))

    def seconds(runs: list[tuple[float, float]]) -> list[float]:
        return [wall for wall, _ in runs]

    def peaks(runs: list[tuple[float, float]]) -> list[float]:
        return [peak for _, peak in runs]

    others = MEASURES[1:]
    print("Ratios to `show` with weights, one per round; min / median / max over the rounds.\n")
    print("| tokens | " + " | ".join(f"**{m} ÷ weights** time" for m in others) + " | "
          + " | ".join(f"{m} ÷ weights peak memory" for m in others) + " |")  # fmt: skip
    print("|---" * (1 + 2 * len(others)) + "|")
    for n, runs in rows:
        time_cells = [
            spread(ratios(seconds(runs[m]), seconds(runs["weights"])), bold=True) for m in others
        ]
        memory_cells = [spread(ratios(peaks(runs[m]), peaks(runs["weights"]))) for m in others]
        print(f"| {n} | " + " | ".join(time_cells + memory_cells) + " |")
    print("\nWall seconds (min / median / max) and peak RSS MiB (median (min–max)), this machine"
          " and load only:\n")  # fmt: skip
    print("| tokens | measure | seconds | MiB |")
    print("|---|---|---|---|")
    for n, runs in rows:
        for m in MEASURES:
            mib = peaks(runs[m])
            print(
                f"| {n} | {m} | {spread(seconds(runs[m]))} | "
                f"{statistics.median(mib):.0f} ({min(mib):.0f}–{max(mib):.0f}) |"
            )
    footer()


if __name__ == "__main__":
    main()
