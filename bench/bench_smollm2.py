"""SmolLM2 from its GGUF file: cold against warm load, and the memory of a long-context show.

Cold: the converted-model cache is empty (a fresh XDG_CACHE_HOME), so `load_model("smollm2")`
dequantises the GGUF file and writes the cache. Warm: the same call once the cache exists.
The bundled encoder is loaded the same way for scale. Each load runs in a fresh process and
is timed inside it (imports excluded). The cold loads each get a fresh cache folder, the warm
ones share one converted beforehand; a round runs the three once each, in an order rotated
every round, and each ratio is taken within a round (min / median / max over the rounds).

Memory: peak RSS (the sum over the process and its drawing workers, see _rss.py) of
`attnviz show --model smollm2 --layer 18` on a 2,048-token text (the samples corpus, repeated
and cut to 2,048 SmolLM2 tokens), without images and with them (--jobs 2, the default on 2
cores; --jobs-1 adds a run drawing in the main process); in rounds too, rotated. (The same
show of every layer with --no-images would need 4.5 GB for the attention alone, 30 × 9 ×
2,048² float32; not run.)
Run: .venv/bin/python bench/bench_smollm2.py [--runs 5] [--tokens 2048] [--jobs-1] [--quick]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread
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
    options = parser(__doc__, runs=5)
    options.add_argument("--tokens", type=int, default=2048)
    options.add_argument("--jobs-1", action="store_true", help="also show with images, --jobs 1")
    args = options.parse_args()
    if args.quick:
        args.runs, args.tokens = 1, 128  # one round: each cold load converts for ~15 s
    header("SmolLM2 from its GGUF file: load time and long-context memory", args)
    with tempfile.TemporaryDirectory() as tmp:
        warm_cache = f"{tmp}/cache-warm"
        load_seconds("smollm2", warm_cache)  # untimed: converts once, and reads the GGUF file
        loads: dict[str, list[float]] = {"bundled": [], "cold": [], "warm": []}
        for number, order in enumerate(rounds(args.runs, list(loads))):
            for name in order:
                model = "bundled" if name == "bundled" else "smollm2"
                cache = f"{tmp}/cache-{number}" if name == "cold" else warm_cache  # cold: empty
                loads[name].append(load_seconds(model, cache))
                if name == "cold":
                    shutil.rmtree(cache)  # 540 MB each
        print("Each load in a fresh process, imports excluded; ratios to the bundled encoder's "
              f"load in the same round, min / median / max over {args.runs} rounds\n")  # fmt: skip
        print("| load | **÷ bundled encoder** | seconds |")
        print("|---|---|---|")
        for label, name in (
            ("bundled all-MiniLM-L6-v2", "bundled"),
            ("smollm2 cold (GGUF → cache)", "cold"),
            ("smollm2 warm (from the cache)", "warm"),
        ):
            ratio = spread(ratios(loads[name], loads["bundled"]), 1, bold=True)
            print(f"| {label} | {ratio} | {spread(loads[name])} |")

        text_file = Path(tmp) / "long.txt"
        text_file.write_text(long_text(args.tokens))
        variants = {
            "--no-images": ["--no-images"],
            "with images (9 heads, layer grid, overview), --jobs 2": ["--jobs", "2"],
        }
        if args.jobs_1:
            variants["with images, --jobs 1"] = ["--jobs", "1"]
        peaks: dict[str, list[float]] = {name: [] for name in variants}
        for order in rounds(args.runs, list(variants)):
            for name in order:
                out = Path(tmp) / "out"
                peaks[name].append(show_peak_mib(text_file, out, variants[name], warm_cache))
                shutil.rmtree(out, ignore_errors=True)
        first = next(iter(variants))
        print(f"\nPeak RSS of `attnviz show - -m smollm2 --layer 18` on a {args.tokens}-token text "
              "(warm cache), summed over the process and its drawing workers; ratios within a "
              "round, min / median / max:\n")  # fmt: skip
        print(
            f"| `show -m smollm2 --layer 18`, {args.tokens} tokens | **÷ {first}** | peak RSS MiB |"
        )
        print("|---|---|---|")
        for name in variants:
            ratio = spread(ratios(peaks[name], peaks[first]), 2, bold=True)
            print(f"| {name} | {ratio} | {spread(peaks[name], 0)} |")
    footer()


if __name__ == "__main__":
    main()
