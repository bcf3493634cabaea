"""What finding retrieval heads costs over the answers alone: `attnviz needle -m smollm2
--lengths 1k,2k --depths 5` as a pipeline (`pipelines.needle.needle`, no output folder: the
10 prompts, each answered greedily with every layer's writing rows heard and their top keys
kept, and the scores), against the same 10 prompts answered by the same `greedy` with no
layer heard (attnviz's function running SDPA in every layer), each side in a fresh process,
side by side in each round (order rotated), timed inside the process once the model is
loaded. Both sides write the same answers (checked). The issue's bound: ≤ 1.3×.

Run: .venv/bin/python bench/bench_needle.py [--runs 3] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure

SIDE = """
import sys, time
from attnviz.core import haystack as hay
from attnviz.core.generation import greedy
from attnviz.core.models import load_model
from attnviz.core.settings import Load
from attnviz.pipelines.needle import needle
from attnviz.pipelines.request import NeedleRequest
side, lengths, n_depths, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
asked = hay.parse_lengths(lengths)
depths = hay.depths(n_depths)
loaded = load_model("smollm2", "cpu")
if side == "needle":
    request = NeedleRequest(Load("smollm2", "cpu"), lengths=asked, depths=depths)
    start = time.perf_counter()
    found, _ = needle(request)
    seconds = time.perf_counter() - start
    answers = [list(run.written) for run in found.runs]
else:
    builder = hay.Builder(loaded.tokenizer, True, hay.read_haystack(None), hay.NEEDLE,
                          hay.QUESTION)
    start = time.perf_counter()
    filled = builder.filled(max(asked))
    answers = [greedy(loaded, builder.build(filled, n, d).ids, 48) for n in asked
               for d in depths]
    seconds = time.perf_counter() - start
open(result, "w").write(f"{seconds}\\n{answers}")
"""


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--lengths", default="1k,2k")
    options.add_argument("--depths", type=int, default=5)
    args = options.parse_args()
    if args.quick:
        args.lengths, args.depths = "300", 2
    header("needle on SmolLM2 against its answers alone", args)
    sides = ["answers", "needle"]
    times: dict[str, list[float]] = {side: [] for side in sides}
    peaks: dict[str, list[float]] = {side: [] for side in sides}
    written = set()
    with tempfile.TemporaryDirectory() as tmp:
        for order in rounds(args.runs, sides):
            for side in order:
                out = Path(tmp) / "out.txt"
                command = [sys.executable, "-c", SIDE, side, args.lengths, str(args.depths),
                           str(out)]  # fmt: skip
                _, peak = measure(command)
                seconds, answers = out.read_text().split("\n", 1)
                times[side].append(float(seconds))
                peaks[side].append(peak)
                written.add(answers)
    if len(written) != 1:
        raise SystemExit("the two sides wrote different answers")
    print(
        f"--lengths {args.lengths} --depths {args.depths}: the whole test against the same "
        f"prompts' answers alone; ratios in the same round, min / median / max over "
        f"{args.runs} rounds; seconds exclude the model's load, peak RSS includes it\n"
    )
    print("| side | **÷ answers** | seconds (median) | peak RSS MiB (median) |")
    print("|---|---|---|---|")
    for side in sides:
        ratio = spread(ratios(times[side], times["answers"]), 2, bold=True)
        print(f"| {side} | {ratio} | {statistics.median(times[side]):.2f} | "
              f"{statistics.median(peaks[side]):.0f} |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
