"""Two revisions of attnviz side by side: `show` at 512 tokens, `export` and `report`, each a
fresh `attnviz` process, to prove a refactor made nothing slower.

Each revision is checked out into a worktree of its own (`git worktree add`) and run with
this virtual environment, its code first on PYTHONPATH (as tests/same_outputs.py does). A
round runs every command once with each revision, in an order rotated every round; each
ratio (new ÷ base) is taken within a round, then min / median / max over the rounds.
Run: .venv/bin/python bench/bench_versions.py BASE [NEW] [--runs 5] [--quick]
(NEW: a revision, or the working tree when left out.)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, footer, header, parser, ratios, rounds, spread, wall

SAMPLES = ROOT / "attnviz" / "data" / "sentences.txt"
ATTNVIZ = [sys.executable, "-c", "import sys; from attnviz.cli import main; sys.exit(main())"]


def _checkout(revision: str | None, into: Path) -> Path:
    """A worktree of `revision` under `into`, or this checkout (the working tree) for None."""
    if revision is None:
        return ROOT
    folder = into / revision.replace("/", "-")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder),
                    revision], check=True, capture_output=True)  # fmt: skip
    return folder


def _commands(work: Path, quick: bool) -> dict[str, list[str]]:
    """Each command, as its arguments: show of a 512-token text (every figure), export of the
    first sentences of the samples (every figure, --jobs 2), report on them."""
    sentences = [line for line in SAMPLES.read_text().splitlines() if line.strip()]
    n = 8 if quick else 40
    corpus = work / "sentences.txt"
    corpus.write_text("\n".join(sentences[:n]) + "\n")
    long_text = " ".join(sentences)
    from transformers import AutoTokenizer

    from attnviz.core.models import bundled_model_path

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    n_tokens = 64 if quick else 512
    ids = tokenizer(long_text, add_special_tokens=False, truncation=True,
                    max_length=n_tokens - 2)["input_ids"]  # fmt: skip
    text = tokenizer.decode(ids)
    return {
        "show (512 tokens)" if not quick else "show (64 tokens)": ["show", text, "-o", "out-show"],
        f"export ({n} sentences)": [
            "export",
            "-f",
            str(corpus),
            "-o",
            "out-export",
            "-j",
            "2",
            "--overwrite",
        ],  # fmt: skip
        f"report ({n} sentences)": ["report", "-f", str(corpus), "-o", "out-report"],
    }


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("base", help="the revision compared against (a commit, a tag, HEAD~3)")
    options.add_argument("new", nargs="?", help="the revision measured (default: working tree)")
    args = options.parse_args()
    if args.quick:
        args.runs = 2
    header(f"attnviz {args.new or 'working tree'} against {args.base}", args)
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as tmp:
        work = Path(tmp)
        trees = {"base": _checkout(args.base, work), "new": _checkout(args.new, work)}
        try:
            commands = _commands(work, args.quick)
            seconds: dict[tuple[str, str], list[float]] = {}
            for order in rounds(args.runs, list(trees)):
                for name, arguments in commands.items():
                    for side in order:
                        env = {**os.environ, "PYTHONPATH": str(trees[side])}
                        run_in = work / side
                        run_in.mkdir(exist_ok=True)
                        took = wall([*ATTNVIZ, *arguments], cwd=run_in, env=env)
                        seconds.setdefault((name, side), []).append(took)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], capture_output=True)  # fmt: skip
    print("| command | new ÷ base (min / median / max) | base s (median) | new s (median) |")
    print("|---|---|---|---|")
    for name in commands:
        base, new = seconds[(name, "base")], seconds[(name, "new")]
        print(f"| {name} | {spread(ratios(new, base), bold=True)} | "
              f"{statistics.median(base):.1f} | {statistics.median(new):.1f} |")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
