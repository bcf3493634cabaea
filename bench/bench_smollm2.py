"""SmolLM2 from its GGUF file: cold against warm load, and the memory of a long-context show.

Cold: the converted-model cache is empty (a fresh XDG_CACHE_HOME), so `load_model("smollm2")`
dequantises the GGUF file and writes the cache. Warm: the same call once the cache exists.
The bundled encoder is loaded the same way for scale. Each load runs in a fresh process and
is timed inside it (imports excluded); medians of --runs.

Memory: peak RSS (the sum over the process and its drawing workers, see _rss.py) of
`attnviz show --model smollm2 --layer 18` on a
2,048-token text (the samples corpus, repeated and cut to 2,048 SmolLM2 tokens), with and
without images, against the same show of every layer with --no-images would need for the
attention alone (30 × 9 × 2,048² float32 = 4.5 GB; not run).
Run: .venv/bin/python bench/bench_smollm2.py [--runs 3] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _rss import measure

SAMPLES = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"

LOAD = (
    "import sys, time\n"
    "import torch, transformers  # imports are not the load\n"
    "from attnviz.core.models import load_model\n"
    "start = time.perf_counter()\n"
    "load_model(None if sys.argv[1] == 'bundled' else sys.argv[1], 'cpu')\n"
    "print(time.perf_counter() - start)\n"
)


def load_seconds(model: str, cache: str) -> float:
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, model], env=env, check=True, capture_output=True, text=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def long_text(n_tokens: int) -> str:
    """The samples corpus repeated and cut to exactly `n_tokens` SmolLM2 tokens."""
    from transformers import AutoTokenizer

    from attnviz.core.models import _locate

    tokenizer = AutoTokenizer.from_pretrained(_locate("smollm2")[0])  # the user's cache
    lines = [s for s in SAMPLES.read_text().splitlines() if s.strip()]
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer(" ".join(lines))["input_ids"]
    text = tokenizer.decode(ids[:n_tokens])
    while len(tokenizer(text)["input_ids"]) > n_tokens:  # decoding can merge pieces: trim
        text = text[: text.rfind(" ")]
    return text


def show_peak_mib(text_file: Path, out: Path, options: list[str], cache: str) -> float:
    attnviz = str(Path(sys.executable).with_name("attnviz"))
    command = [attnviz, "show", "-", "-m", "smollm2", "--layer", "18", "-o", str(out), *options]
    env = {**os.environ, "XDG_CACHE_HOME": cache}  # warm: converted by the loads above
    with open(text_file) as stdin:
        return measure(command, stdin=stdin, env=env)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cold, warm, bundled = [], [], []
        for run in range(args.runs):
            cache = f"{tmp}/cache-{run}"  # empty: a cold load converts
            cold.append(load_seconds("smollm2", cache))
            warm.append(load_seconds("smollm2", cache))
            bundled.append(load_seconds("bundled", cache))
        base = statistics.median(bundled)
        print("| load (fresh process, imports excluded) | median s | × bundled encoder |")
        print("|---|---|---|")
        for label, times in (
            ("bundled all-MiniLM-L6-v2", bundled),
            ("smollm2 cold (GGUF → cache)", cold),
            ("smollm2 warm (from the cache)", warm),
        ):
            median = statistics.median(times)
            print(f"| {label} | {median:.2f} | {median / base:.1f} |")

        text_file = Path(tmp) / "long.txt"
        text_file.write_text(long_text(args.tokens))
        print()
        print(f"| `show -m smollm2 --layer 18`, {args.tokens} tokens | peak RSS MiB |")
        print("|---|---|")
        for label, options in (
            ("--no-images", ["--no-images"]),
            ("with images (9 heads, layer grid, overview), --jobs 1", ["--jobs", "1"]),
            ("with images, --jobs 2 (the default on 2 cores)", ["--jobs", "2"]),
        ):
            peak = show_peak_mib(text_file, Path(tmp) / "out", options, f"{tmp}/cache-0")
            print(f"| {label} | {peak:.0f} |")


if __name__ == "__main__":
    main()
