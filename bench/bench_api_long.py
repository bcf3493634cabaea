"""The API's weights of every layer and head at 1k–4k tokens of SmolLM2, against the pass
TransformerLens's `run_with_cache` and BertViz make: transformers' eager attention with
`output_attentions=True`.

Each side runs in a fresh process that loads SmolLM2 (from the converted cache, warmed first)
and then times one call over the same text (the samples corpus repeated and cut to N tokens):

    eager   `model(ids, output_attentions=True)` on the model loaded with eager attention;
            the 30 (1, 9, T, T) tensors kept as they come, not stacked (what a cache holds)
    api     `attnviz.attention(text, model="smollm2")`: every map held in one numpy array
    file    `attnviz.attention(text, model="smollm2", to=…/attention.npy)`: written to disk
            block by block, `weights` its memory map (the page cache is the kernel's, not the
            process's)

Time is the call alone (the model loaded before it); peak is the process's (its RSS, the
model's weights included), sampled and from the kernel. A side whose maps would not fit in
the memory available (`api` refuses) is reported as refused. The floor is the maps
themselves: L·H·T²·4 bytes. Rounds rotate the order of the sides; ratios are within a round.
Run: .venv/bin/python bench/bench_api_long.py [--runs 3] [--lengths 1024,2048,4096] [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
from _rss import measure
from bench_smollm2 import long_text

SIDES = ("eager", "api", "file")
CALL = r"""
import sys, time
side, text_file, out = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(text_file).read()
import torch
if side == "eager":  # unguarded: not run where its maps would take the machine's memory
    from attnviz.core import memory
    from attnviz.core.models import load_model
    from attnviz.core.tokens import encode, pad
    loaded = load_model("smollm2", "cpu", "eager")
    inputs = pad(loaded, [encode(loaded, text)])
    n = inputs["input_ids"].shape[1]
    if 30 * 9 * n * n * 4 * 1.1 + 2**30 > memory._system_available():
        print("REFUSED not run: its maps would not fit in the memory available")
        raise SystemExit(0)
    start = time.perf_counter()
    with torch.inference_mode():
        kept = loaded.model(**inputs, output_attentions=True).attentions
    seconds = time.perf_counter() - start
    assert len(kept) == 30
else:
    import attnviz
    from attnviz.api import _load
    from attnviz.core import models
    from attnviz.errors import MemoryLimitError
    models.get(_load("smollm2", "cpu")).load()
    start = time.perf_counter()
    try:
        a = attnviz.attention(text, model="smollm2", device="cpu",
                              to=out + "/attention.npy" if side == "file" else None)
    except MemoryLimitError as refused:
        print("REFUSED", refused)
        raise SystemExit(0)
    seconds = time.perf_counter() - start
    assert a.weights.shape[:2] == (30, 9)
print("SECONDS", seconds)
"""


def _call(side: str, text_file: Path) -> tuple[float | None, float]:
    """(seconds of the call or None where refused, peak RSS GiB) of one fresh process."""
    with tempfile.TemporaryDirectory() as out:
        log = Path(out) / "log"
        cmd = ["sh", "-c", f'"$0" -c "$1" "$2" "$3" "$4" > {log} 2>&1 || cat {log} >&2',
               sys.executable, CALL, side, str(text_file), out]  # fmt: skip
        _, peak_mib = measure(cmd)
        said = log.read_text()
    seconds = [float(line.split()[1]) for line in said.splitlines() if line.startswith("SECONDS")]
    if not seconds and "REFUSED" not in said:
        raise SystemExit(f"{side} failed:\n{said[-1500:]}")
    return (seconds[0] if seconds else None), peak_mib / 1024


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--lengths", default="1024,2048,4096")
    args = options.parse_args()
    lengths = [256, 512] if args.quick else [int(n) for n in args.lengths.split(",")]
    runs = 1 if args.quick else args.runs
    header("The API's weights of every head at long lengths against eager output_attentions",
           args)  # fmt: skip
    _call("api", _text_file(64))  # converts SmolLM2 into its cache once, untimed
    print("| tokens | maps (GiB) | side | seconds (median) | peak GiB (median) | ÷ eager time "
          "(min / median / max) |")  # fmt: skip
    print("|---|---|---|---|---|---|", flush=True)
    for n in lengths:  # each length's rows as soon as they are measured
        text_file = _text_file(n)
        got: dict[str, list] = {side: [] for side in SIDES}
        for order in rounds(runs, SIDES):
            for side in order:
                got[side].append(_call(side, text_file))
        eager = [s for s, _ in got["eager"]]
        for side in SIDES:
            secs = [s for s, _ in got[side]]
            peaks = statistics.median(p for _, p in got[side])
            if any(s is None for s in secs):
                print(f"| {n:,} | {floor(n):.2f} | {side} | refused | {peaks:.2f} | |", flush=True)
                continue
            ratio = "1"
            if side != "eager":
                ratio = "–" if None in eager else spread(ratios(secs, eager), bold=True)
            print(f"| {n:,} | {floor(n):.2f} | {side} | {statistics.median(secs):.1f} | "
                  f"{peaks:.2f} | {ratio} |", flush=True)  # fmt: skip
    footer()


def floor(n: int) -> float:
    """The maps alone, GiB: SmolLM2's 30 layers × 9 heads of n × n float32."""
    return 30 * 9 * n * n * 4 / 2**30


def _text_file(n: int) -> Path:
    path = Path(tempfile.gettempdir()) / f"attnviz-bench-api-{n}.txt"
    if not path.exists():
        path.write_text(long_text(n))
    return path


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
