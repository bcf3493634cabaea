"""Every command and API function at 1k, 4k and 8k (8,085) tokens of SmolLM2: peak memory and time,
or the one line it refuses with (issue 61: within memory or refused, never killed).

Each run is a fresh process over the samples corpus repeated and cut to N tokens (text B of
compare: the same with one word changed, a minimal pair); peak is the process tree's RSS
(`_rss.measure`), time the whole run, the model's load included (from the converted cache).
A run that exits 2 is refused: its line is kept. One round (`--runs` more).
Run: .venv/bin/python bench/bench_lengths.py [--lengths 1024,4096,8085] [--only show,check]
(8,085 tokens: SmolLM2's 8,192 less the BOS attnviz puts first and some room, as bench_long)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser
from _rss import measure
from bench_smollm2 import long_text

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
API = r"""
import sys, attnviz
from attnviz.errors import AttnvizError
a, b, what = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
try:
    if what == "attention":
        attnviz.attention(a, model="smollm2", device="cpu")
    else:
        attnviz.compare(a, b, model="smollm2", device="cpu")
except AttnvizError as refused:
    print(refused, file=sys.stderr)
    raise SystemExit(2)
"""


def commands(a: Path, b: Path, out: str) -> dict[str, list[str]]:
    """Each command's line over text A (and B), writing into `out`."""
    m = ["-m", "smollm2"]
    return {
        "show": [ATTNVIZ, "show", f"@{a}", *m, "--no-images"],
        "show --html": [ATTNVIZ, "show", f"@{a}", *m, "--html", "-o", out],
        "export": [ATTNVIZ, "export", "-f", str(a), *m, "-o", out, "--figures", "overview"],
        "report": [ATTNVIZ, "report", "-f", str(a), *m, "-o", out],
        "compare": [ATTNVIZ, "compare", f"@{a}", f"@{b}", *m, "--no-images"],
        "check": [ATTNVIZ, "check", f"@{a}", *m],
        "attention()": [sys.executable, "-c", API, str(a), str(b), "attention"],
        "compare()": [sys.executable, "-c", API, str(a), str(b), "compare"],
    }


def run(command: list[str]) -> tuple[float, float, str]:
    """(seconds, peak GiB, '' or the refusal's line) of one fresh run."""
    stdin = None
    if any(part.startswith("@") for part in command):  # a text from a file, on stdin
        at = next(i for i, part in enumerate(command) if part.startswith("@"))
        path = command[at][1:]
        if sum(part.startswith("@") for part in command) == 1:
            command = [*command[:at], "-", *command[at + 1 :]]
            stdin = open(path)  # closed below
        else:  # compare: both texts as arguments
            command = [part if not part.startswith("@") else Path(part[1:]).read_text()
                       for part in command]  # fmt: skip
    try:
        seconds, peak = measure(command, stdin=stdin)
        return seconds, peak / 1024, ""
    except SystemExit as failed:  # _rss raises it with the stderr's tail
        said = str(failed).strip().splitlines()[-1] if str(failed).strip() else "failed"
        said = said.split(" failed: ", 1)[-1]  # the command's own line
        return float("nan"), float("nan"), said
    finally:
        if stdin is not None:
            stdin.close()


def main() -> None:
    options = parser(__doc__, runs=1)
    options.add_argument("--lengths", default="1024,4096,8085")
    options.add_argument("--only", default="", help="commands, comma-separated")
    args = options.parse_args()
    lengths = [256, 512] if args.quick else [int(n) for n in args.lengths.split(",")]
    header("Every command at 1k, 4k and 8k tokens of SmolLM2: peak and time", args)
    print("| command | tokens | seconds | peak GiB | refused with |")
    print("|---|---|---|---|---|")
    for n in lengths:
        a, b = _pair(n)
        with tempfile.TemporaryDirectory() as out:
            for name, command in commands(a, b, out).items():
                if args.only and name.split()[0] not in args.only.split(","):
                    continue
                found = [run(command) for _ in range(args.runs)]
                said = found[0][2]
                secs = statistics.median(f[0] for f in found)
                peak = statistics.median(f[1] for f in found)
                if said:
                    print(f"| {name} | {n:,} | – | – | {said[:110]}… |", flush=True)
                else:
                    print(f"| {name} | {n:,} | {secs:.0f} | {peak:.2f} | |", flush=True)
    footer()


def _pair(n: int) -> tuple[Path, Path]:
    """Text A of `n` tokens and B: A with its middle word changed."""
    folder = Path(tempfile.gettempdir())
    a, b = folder / f"attnviz-bench-lengths-{n}-a.txt", folder / f"attnviz-bench-lengths-{n}-b.txt"
    if not a.exists():
        text = long_text(n)
        words = text.split(" ")
        words[len(words) // 2] = "however"
        a.write_text(text)
        b.write_text(" ".join(words))
    return a, b


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
