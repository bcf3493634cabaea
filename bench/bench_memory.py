"""The memory a run is estimated to need before it starts (`attnviz.core.memory`) against the
peak it reaches, for the runs whose memory grows with the square of the text.

Each case runs twice as a fresh process: once with ATTNVIZ_MEMORY_LIMIT=1B, which makes the
command refuse before loading and say its estimate (the same call as any run makes), then
for real, its peak taken as the largest sum of RSS over the process and its drawing workers
(_rss.py). The ratio estimate ÷ peak says how far the estimate can be trusted: above 1 it
errs on the safe side. Texts are prefixes of the samples corpus of the given length.
Run: .venv/bin/python bench/bench_memory.py [--runs 1] [--quick] [--smollm2] [--long]
(--smollm2 adds SmolLM2 at 1,000 and 2,048 tokens; --long its 2,000-token show of all 30
layers, about 6 GB.)
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser
from _rss import measure

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"
ESTIMATE = re.compile(r"needs about ([0-9.,]+) (GiB|MiB)")


def text_of(n_tokens: int, count) -> str:
    """The longest prefix of the samples corpus (repeated as needed) that `count` says has at
    most `n_tokens` tokens."""
    words = " ".join(line.strip() for line in SAMPLES.read_text().splitlines() if line.strip())
    words = (words + " ") * (1 + 4 * n_tokens // max(1, len(words.split())))
    pieces = words.split()
    low, high = 1, len(pieces)
    while low < high:
        middle = (low + high + 1) // 2
        if count(" ".join(pieces[:middle])) <= n_tokens:
            low = middle
        else:
            high = middle - 1
    return " ".join(pieces[:low])


def estimated(command: list[str]) -> float:
    """The run's estimate in MiB, from its refusal under ATTNVIZ_MEMORY_LIMIT=1B."""
    env = {**os.environ, "ATTNVIZ_MEMORY_LIMIT": "1B"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    found = ESTIMATE.search(done.stderr)
    if done.returncode != 2 or found is None:
        raise SystemExit(f"{command[1]} did not say its estimate: {done.stderr[-300:]}")
    value = float(found.group(1).replace(",", ""))
    return value * 1024 if found.group(2) == "GiB" else value


def main() -> None:
    options = parser(__doc__, runs=1)
    options.add_argument("--smollm2", action="store_true", help="SmolLM2 at 1,000 and 2,048 tokens")
    options.add_argument("--long", action="store_true", help="SmolLM2, 2,000 tokens, all layers")
    args = options.parse_args()
    header("The memory estimate against the measured peak", args)

    from tokenizers import Tokenizer

    from attnviz.core.models import describe

    def counter(model: str | None):
        spec = describe(model)
        tokenizer = Tokenizer.from_file(str(spec.tokenizer_file))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return lambda text: len(tokenizer.encode(text).ids)

    bundled = counter(None)
    n = 128 if args.quick else 512
    long_text = text_of(n, bundled)
    with tempfile.TemporaryDirectory() as tmp:
        texts = Path(tmp) / "texts.txt"
        texts.write_text("\n".join([long_text] * 4) + "\n")
        out = str(Path(tmp) / "out")
        cases = [
            (f"show, {n} tokens, --no-images", ["show", long_text, "--no-images"]),
            (f"show, {n} tokens", ["show", long_text, "-o", out]),
            (
                f"show, {n} tokens, --html --no-images",
                ["show", long_text, "--html", "--no-images", "-o", out],
            ),  # fmt: skip
            (
                f"show, {n} tokens, --measure alti --no-images",
                ["show", long_text, "--measure", "alti", "--no-images"],
            ),  # fmt: skip
            (
                f"show, {n} tokens, --words --no-images",
                ["show", long_text, "--words", "--no-images"],
            ),
            (
                f"export, 4 texts of {n} tokens, --figures overview",
                ["export", "-f", str(texts), "--figures", "overview", "-o", out, "--overwrite"],
            ),  # fmt: skip
        ]
        if args.smollm2 or args.long:
            smollm2 = counter("smollm2")
            for tokens, layer in ((1000, None), (2048, "18")):
                text = text_of(tokens - 1, smollm2)  # attnviz puts BOS first
                chosen = ["--layer", layer] if layer else []
                name = " ".join(["show -m smollm2", *chosen]) + f", {tokens} tokens, --no-images"
                cases.append((name, ["show", text, "-m", "smollm2", *chosen, "--no-images"]))
        if args.long:
            text = text_of(1999, counter("smollm2"))
            cases.append(("show -m smollm2, 2000 tokens, --no-images",
                          ["show", text, "-m", "smollm2", "--no-images"]))  # fmt: skip
        rows = []
        for name, arguments in cases:
            command = [ATTNVIZ, *arguments]
            guess = estimated(command)
            peaks = [measure(command)[1] for _ in range(args.runs)]
            rows.append((name, guess, statistics.median(peaks), min(peaks), max(peaks)))
            print(f"  {name}: estimate {guess:.0f} MiB, peak {peaks} MiB", file=sys.stderr)

    print("| run | estimate MiB | peak MiB (median (min–max)) | **estimate ÷ peak** |")
    print("|---|---|---|---|")
    for name, guess, peak, low, high in rows:
        print(f"| {name} | {guess:,.0f} | {peak:,.0f} ({low:,.0f}–{high:,.0f}) | "
              f"**{guess / peak:.2f}** |")  # fmt: skip
    ratios = [guess / peak for _, guess, peak, _, _ in rows]
    print(f"\nestimate ÷ peak: {min(ratios):.2f} to {max(ratios):.2f} over {len(rows)} runs")
    footer()


if __name__ == "__main__":
    main()
