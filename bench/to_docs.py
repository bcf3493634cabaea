"""Splice the benchmarks' saved outputs (bench/results/NAME.md, written by `make bench`) into
docs/performance.md, so that every table there is a benchmark's own output.

The page marks each place: `<!-- bench: NAME -->` … `<!-- /bench -->` holds the first table of
bench/results/NAME.md; `<!-- bench: NAME 2 3 -->` its 2nd and 3rd (counted through the file,
which may hold several runs, each under its own header). Before each run's tables goes one line:
its command, as a link to the whole output, its date, and whether it ran on a busy machine.
What lies between the markers is replaced; the rest of the page is left as it is, so running it
twice changes nothing.

Run: .venv/bin/python bench/to_docs.py [--check]   (--check: exit 1 if the page is not current)
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "performance.md"
# A marked place, its lines taken up to the first closing marker.
MARKER = re.compile(
    r"^<!-- bench: (\w+)((?: \d+)*) -->\n(?:.*\n)*?<!-- /bench -->$", flags=re.MULTILINE
)


@dataclass(frozen=True)
class Run:
    """One benchmark run of a results file: its header's fields and its tables."""

    fields: dict[str, str]
    tables: tuple[str, ...]


def runs(text: str) -> list[Run]:
    """The runs of a results file, each starting at its `## title` line."""
    found = []
    for part in re.split(r"^(?=## )", text, flags=re.MULTILINE):
        if not part.startswith("## "):
            continue
        fields = dict(re.findall(r"^- (date|command): (.+)$", part, flags=re.MULTILINE))
        fields["busy"] = "**not idle**" if "- **not idle**" in part else ""
        tables = re.findall(r"^\|.*\n(?:\|.*(?:\n|$))*", part, flags=re.MULTILINE)
        found.append(Run(fields, tuple(table.rstrip("\n") for table in tables)))
    return found


def block(name: str, numbers: list[int], results: Path = RESULTS) -> str:
    """What goes between the markers for bench/results/NAME.md's tables `numbers` (1-based;
    the first table if none)."""
    path = results / f"{name}.md"
    if not path.exists():
        raise SystemExit(f"no {path.relative_to(ROOT)}: run the benchmark (make bench)")
    numbered = [(run, table) for run in runs(path.read_text()) for table in run.tables]
    lines, shown = [], None
    for number in numbers or [1]:
        if not 1 <= number <= len(numbered):
            raise SystemExit(f"{path.name} has tables 1 to {len(numbered)}, not {number}")
        run, table = numbered[number - 1]
        if run is not shown:
            command = run.fields.get("command", "(no command)")
            said = [f"[{command}](../bench/results/{name}.md)", run.fields.get("date", "(no date)")]
            said += [run.fields["busy"]] if run.fields["busy"] else []
            lines.append(", ".join(said) + ":\n")
            shown = run
        lines.append(table + "\n")
    return "\n".join(lines)


def splice(page: str, results: Path = RESULTS) -> str:
    """`page` with every marked place holding what its benchmark's results file says now."""

    def fill(match: re.Match) -> str:
        name, numbers = match[1], [int(n) for n in match[2].split()]
        return f"<!-- bench: {name}{match[2]} -->\n{block(name, numbers, results)}\n<!-- /bench -->"

    return MARKER.sub(fill, page)


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--check", action="store_true", help="exit 1 if the page is not current")
    args = options.parse_args()
    page = PAGE.read_text()
    spliced = splice(page)
    if args.check:
        sys.exit(0 if spliced == page else f"{PAGE.name} is not current: make perf-doc")
    if spliced != page:
        PAGE.write_text(spliced)


if __name__ == "__main__":
    main()
