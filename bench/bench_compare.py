"""What `attnviz compare` costs against two `attnviz show --no-images` runs of the same texts.

One process, the bundled model loaded once: for one minimal pair, and for every pair of
samples/minimal_pairs.tsv, `pipelines.compare.compare` (no images) is timed against
`pipelines.show.show` (no images) on text A and then on text B of each pair, which is what
comparing two `show` runs by eye costs. The two sides alternate in order every round. The
issue's target is a ratio ≤ 1.2. Ratios within a round, then min / median / max over the rounds.
Run: .venv/bin/python bench/bench_compare.py [--runs 7] [--quick]
"""

from __future__ import annotations

import time
from pathlib import Path

from _common import ROOT, footer, header, parser, ratios, rounds, spread

PAIR = ("The keys to the cabinet are on the table.", "The key to the cabinets is on the table.")
PAIRS_FILE = ROOT / "samples" / "minimal_pairs.tsv"


def main() -> None:
    options = parser(__doc__, runs=7)
    args = options.parse_args()
    if args.quick:
        args.runs = 2
    header("`attnviz compare` against two `attnviz show --no-images` runs", args)

    from attnviz.core import models
    from attnviz.core.settings import Load
    from attnviz.pipelines.compare import compare
    from attnviz.pipelines.request import CompareRequest, ShowRequest
    from attnviz.pipelines.show import show

    load = Load(None, "cpu")
    models.get(load).load()
    lines = Path(PAIRS_FILE).read_text(encoding="utf-8").splitlines()
    every = [tuple(line.split("\t")) for line in lines if line.strip()]
    cases = {"one pair": [PAIR], f"{len(every)} pairs (minimal_pairs.tsv)": every}
    if args.quick:
        cases = {"one pair": [PAIR], "4 pairs": every[:4]}

    def run_compare(pairs):
        compare(CompareRequest(load, pairs=tuple(pairs), images=False))

    def run_shows(pairs):
        for a, b in pairs:
            show(ShowRequest(load, text=a, images=False))
            show(ShowRequest(load, text=b, images=False))

    sides = {"compare": run_compare, "two shows": run_shows}
    for pairs in cases.values():  # warm: first calls import and build what later calls reuse
        run_compare(pairs[:1])
        run_shows(pairs[:1])
    seconds = {(case, side): [] for case in cases for side in sides}
    for order in rounds(args.runs, list(sides)):
        for case, pairs in cases.items():
            for side in order:
                start = time.perf_counter()
                sides[side](pairs)
                seconds[(case, side)].append(time.perf_counter() - start)

    print(f"bundled model (6 layers × 12 heads), CPU, loaded once; ratios within a round, "
          f"min / median / max over {args.runs} rounds\n")  # fmt: skip
    print("| texts | `compare` ÷ two `show --no-images` per pair | compare s | two shows s |")
    print("|---|---|---|---|")
    for case in cases:
        mine, theirs = seconds[(case, "compare")], seconds[(case, "two shows")]
        print(f"| {case} | {spread(ratios(mine, theirs), bold=True)} | {spread(mine, 3)} | "
              f"{spread(theirs, 3)} |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
