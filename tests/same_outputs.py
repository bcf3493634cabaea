"""Prove that two checkouts of attnviz write the same outputs: every file, byte for byte.

For a refactor that must not change behaviour. Runs one fixed set of `attnviz` commands
(below, COMMANDS) with each checkout's code, each checkout in a fresh run folder of its own
(so relative output paths match), then compares the two folders file by file:

- the same set of relative paths;
- the same bytes in each file: heatmap PNGs, attention.html pages, attention.npz arrays,
  done.json and manifest files, report.md, CSV and JSON files, the stdout of every command
  (saved as `stdout/NN-name.txt`, `.json` for `--json` runs) and `exit-codes.txt` (the exit
  code of every command).

Only what differs between any two runs of the same code is normalised, nothing else: the
value of `"seconds"` (the run's wall-clock time) in export's `manifest.json` and in the stdout
of `export --json` becomes `<seconds>`; the rest of those files, their layout included, is
compared byte for byte too. (Found by running one checkout twice: nothing else differed; no
output holds an absolute path, npz archives carry zip's fixed 1980 time stamp, and `show`'s
default --jobs and export's --jobs 2 write the same bytes as --jobs 1.)

Run it with the project's virtual environment (the code of each checkout is imported from
that checkout through PYTHONPATH, which comes before the editable install):

    .venv/bin/python tests/same_outputs.py BASE_DIR NEW_DIR [--work DIR]

BASE_DIR and NEW_DIR are checkout roots (folders holding `attnviz/`), e.g. a worktree of the
revision before a refactor (`git worktree add /tmp/base <rev>`) and `.`; the Makefile's
`make same-outputs BASE=<rev>` does that. The run folders are made under `--work DIR` and
kept there for a look (`DIR/base/run`, `DIR/new/run`, each command's stderr in `DIR/*/logs`);
without `--work` they go to a temporary folder that is removed at the end.

It prints one line for each file that differs, then `same: N files` or
`DIFFERENT: K of N files`, and exits 0 only when every file is the same (1 otherwise;
2 on a usage error). Takes about 2 minutes per checkout on a 2-core machine.

The bundled all-MiniLM-L6-v2 model and the SmolLM2 GGUF file are read from the virtual
environment; SmolLM2's converted copy comes from attnviz's cache (~/.cache/attnviz/gguf, made
on first use), shared by both checkouts unless `--fresh-cache` gives each checkout an empty
cache of its own (then the conversion itself runs, about 45 s more per checkout).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The first 12 sample sentences (attnviz/data/sentences.txt), written into each run folder
# under this name.
SENTENCES = "sentences-12.txt"
QUICK = "The quick brown fox jumps over the lazy dog because it was bored."
DOOR = "Why would anyone leave the door open in the middle of winter?"
BOOK = "I told him that the book he wanted was already on the shelf."
MEETING = "After the meeting ended, everyone went home."
ALICE = "Dr. Alice Moreau published her findings in 2019, and they changed the field."
SHORT = "It rained on the old town."

# (name, arguments after `attnviz`). Every command's stdout is saved and compared. `show`'s
# --jobs is left at its default (drawing processes); it writes the same bytes as --jobs 1.
COMMANDS: list[tuple[str, list[str]]] = [
    ("show-html", ["show", QUICK, "--html"]),
    ("show-query", ["show", DOOR, "--html", "--query", "door"]),
    ("show-words", ["show", BOOK, "--html", "--words", "--hide-special"]),
    ("show-pair", ["show", MEETING, "--pair", "It rained.", "--html"]),
    ("show-json", ["show", ALICE, "--json", "--no-images"]),
    (
        "show-ablate",
        ["show", QUICK, "--ablate", "0.2", "--ablate", "3.1", "--query", "fox", "--html"],
    ),
    ("show-norm", ["show", DOOR, "--measure", "norm", "--html"]),
    ("show-alti-json", ["show", BOOK, "--measure", "alti", "--json", "--no-images"]),
    ("show-one-head", ["show", SHORT, "-l", "2", "-H", "3", "--scale", "head"]),
    (
        "compare",
        ["compare", "The keys to the cabinet are here.", "The keys to the cabinet is here."],
    ),
    ("export", ["export", "-f", SENTENCES, "--html", "--save-raw", "--json"]),
    (
        "export-norm",
        [
            "export",
            "-f",
            SENTENCES,
            "--measure",
            "norm",
            "--query",
            "the",
            "--figures",
            "overview",
            "--save-raw",
            "-o",
            "attnviz-out/export-norm",
            "--json",
        ],
    ),
    ("report", ["report", "-f", SENTENCES]),
    ("check-json", ["check", SHORT, "--json"]),
    ("show-smollm2", ["show", SHORT, "-m", "smollm2", "--layer", "0", "--layer", "29", "--html"]),
]

EXIT_CODES = "exit-codes.txt"


def stdout_file(n: int, name: str, args: list[str]) -> str:
    """Where the stdout of the `n`th command (from 1) is saved, relative to the run folder."""
    return f"stdout/{n:02d}-{name}{'.json' if '--json' in args else '.txt'}"


# The files that record how long the run took, as `"seconds": 12.345`.
TIMED = {"attnviz-out/export/manifest.json", "attnviz-out/export-norm/manifest.json"} | {
    stdout_file(n, name, args)
    for n, (name, args) in enumerate(COMMANDS, start=1)
    if args[0] == "export" and "--json" in args
}
SECONDS = re.compile(rb'"seconds": -?[0-9][0-9.eE+-]*')


def checked_root(path: str) -> Path:
    root = Path(path).resolve()
    if not (root / "attnviz" / "__init__.py").is_file():
        raise SystemExit(f"error: {path} is not a checkout of attnviz (no attnviz/__init__.py)")
    return root


def environment(root: Path, cache: Path | None) -> dict[str, str]:
    """The environment of one checkout's commands: its code first on the import path, and
    everything that could make two runs print differently fixed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    env["PYTHONHASHSEED"] = "0"
    env["COLUMNS"] = "100"  # rich's tables: the same width whatever the calling terminal
    env["LINES"] = "50"
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS"):
        env.pop(name, None)
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return env


def imported_from(python: str, env: dict[str, str], cwd: Path) -> Path:
    """Where `attnviz` is imported from under `env` (proves PYTHONPATH wins)."""
    code = "import attnviz; print(attnviz.__file__)"
    done = subprocess.run(
        [python, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip()).resolve()


def run_checkout(
    label: str, root: Path, work: Path, python: str, sentences: str, fresh_cache: bool
) -> float:
    """Run COMMANDS with `root`'s code in `work/label/run`; return the seconds it took."""
    top = work / label
    if top.exists():
        shutil.rmtree(top)
    run, logs = top / "run", top / "logs"
    (run / "stdout").mkdir(parents=True)
    logs.mkdir()
    (run / SENTENCES).write_text(sentences, encoding="utf-8")
    env = environment(root, top / "cache" if fresh_cache else None)
    where = imported_from(python, env, run)
    if not where.is_relative_to(root / "attnviz"):
        raise SystemExit(f"error: {label}: attnviz is imported from {where}, not from {root}")
    started = time.perf_counter()
    codes = []
    for n, (name, args) in enumerate(COMMANDS, start=1):
        stem = f"{n:02d}-{name}"
        with open(run / stdout_file(n, name, args), "wb") as out, open(logs / stem, "wb") as err:
            code = subprocess.run(
                [python, "-m", "attnviz", *args],
                cwd=run,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            ).returncode
        codes.append(f"{stem}: {code}\n")
        if code != 0:
            tail = (logs / stem).read_text(encoding="utf-8", errors="replace").strip()
            tail = "\n".join(tail.splitlines()[-5:])
            print(f"{label}: `attnviz {name}` exited with {code}:\n{tail}", file=sys.stderr)
    (run / EXIT_CODES).write_text("".join(codes), encoding="utf-8")
    return time.perf_counter() - started


def files_under(run: Path) -> set[str]:
    found = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
    return found - {SENTENCES}


def comparable(path: Path, relative: str) -> bytes:
    """The bytes of a file as compared: raw, but for the run's time where it is recorded."""
    data = path.read_bytes()
    if relative in TIMED:
        data = SECONDS.sub(b'"seconds": <seconds>', data)
    return data


def where_different(a: bytes, b: bytes) -> str:
    """A hint at the first difference: a line for text, a byte offset otherwise."""
    try:
        lines_a, lines_b = a.decode("utf-8").splitlines(), b.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        offset = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return f"{len(a)} vs {len(b)} bytes, first difference at byte {offset}"
    # The first differing line, not a diff: a page's data line is megabytes long.
    for number, (x, y) in enumerate(zip(lines_a, lines_b), start=1):
        if x != y:
            column = next((i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
            return f"first difference at line {number}, column {column + 1}"
    if len(lines_a) != len(lines_b):
        return f"{len(lines_a)} vs {len(lines_b)} lines"
    return "line endings differ"


def compare(base_run: Path, new_run: Path) -> tuple[int, list[str]]:
    """(files compared, one line per difference)."""
    base_files, new_files = files_under(base_run), files_under(new_run)
    lines = []
    for relative in sorted(base_files | new_files):
        if relative not in new_files:
            lines.append(f"only in base: {relative}")
            continue
        if relative not in base_files:
            lines.append(f"only in new: {relative}")
            continue
        a = comparable(base_run / relative, relative)
        b = comparable(new_run / relative, relative)
        if a != b:
            lines.append(f"differs: {relative} ({where_different(a, b)})")
    return len(base_files | new_files), lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the same attnviz commands with two checkouts; compare every output file."
    )
    parser.add_argument("base", help="checkout root of the reference code (e.g. a git worktree)")
    parser.add_argument("new", help="checkout root of the code under test")
    parser.add_argument("--work", help="folder for the run folders, kept (default: temporary)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with attnviz's deps")
    parser.add_argument(
        "--fresh-cache",
        action="store_true",
        help="an empty attnviz cache per checkout (SmolLM2 is converted by each checkout's code)",
    )
    args = parser.parse_args(argv)
    base, new = checked_root(args.base), checked_root(args.new)
    # The sample sentences moved into the package (attnviz/data/) after 9766dd9.
    places = (base / "attnviz" / "data" / "sentences.txt", base / "samples" / "sentences.txt")
    sample = next(path for path in places if path.is_file())
    sentences = "".join(sample.read_text(encoding="utf-8").splitlines(keepends=True)[:12])

    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="same-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for label, root in (("base", base), ("new", new)):
            took = run_checkout(label, root, work, args.python, sentences, args.fresh_cache)
            print(f"{label}: {len(COMMANDS)} commands in {took:.0f} s ({root})", file=sys.stderr)
        total, differences = compare(work / "base" / "run", work / "new" / "run")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    for line in differences:
        print(line)
    if differences:
        print(f"DIFFERENT: {len(differences)} of {total} files")
        return 1
    print(f"same: {total} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
