"""docs/performance.md shows the benchmarks' own outputs: every marked table is what
bench/to_docs.py makes of bench/results/NAME.md today (`make perf-doc` rewrites them), every
results file says which command made it and when, and the page stays under 15 KB."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_to_docs", REPO / "bench" / "to_docs.py")
to_docs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = to_docs  # dataclasses look their module up
_spec.loader.exec_module(to_docs)

PAGE = REPO / "docs" / "performance.md"
RESULTS = sorted((REPO / "bench" / "results").glob("*.md"))
BLOCKS = list(to_docs.MARKER.finditer(PAGE.read_text()))


def test_the_page_is_under_15_kb():
    assert PAGE.stat().st_size < 15_000


def test_every_opened_block_is_closed():
    """A marker left open would take the page up to the next block's end."""
    page = PAGE.read_text()
    assert BLOCKS
    assert page.count("<!-- bench:") == page.count("<!-- /bench -->") == len(BLOCKS)


@pytest.mark.parametrize("found", BLOCKS, ids=[match[0].splitlines()[0] for match in BLOCKS])
def test_each_block_is_its_benchmarks_output(found):
    name, numbers = found[1], [int(n) for n in found[2].split()]
    expected = f"{found[0].splitlines()[0]}\n{to_docs.block(name, numbers)}\n<!-- /bench -->"
    assert found[0] == expected, f"{name}: docs/performance.md is not current: make perf-doc"


def test_the_page_is_as_spliced():
    page = PAGE.read_text()
    assert to_docs.splice(page) == page, "docs/performance.md is not current: make perf-doc"


def test_splicing_keeps_the_prose_and_can_fail(tmp_path):
    """Emptied blocks come back as they were and nothing else moves; a changed number in a
    results file changes the page (the check above can fail)."""
    page = PAGE.read_text()
    emptied = to_docs.MARKER.sub(lambda m: f"{m[0].splitlines()[0]}\n<!-- /bench -->", page)
    assert emptied != page and to_docs.splice(emptied) == page
    for path in RESULTS:
        (tmp_path / path.name).write_text(path.read_text())
    results = tmp_path / f"{BLOCKS[0][1]}.md"
    # a 9 before the first digit of every table row
    results.write_text(re.sub(r"^(\|.*?)(\d)", r"\g<1>9\2", results.read_text(), flags=re.M))
    assert to_docs.splice(page, tmp_path) != page


@pytest.mark.parametrize("path", RESULTS, ids=[path.stem for path in RESULTS])
def test_each_result_names_its_command_and_date(path):
    runs = to_docs.runs(path.read_text())
    assert runs, f"{path.name}: no run (a `## title` and its header)"
    for run in runs:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", run.fields.get("date", ""))
        assert run.fields.get("command", "").startswith(f"`.venv/bin/python bench/{path.stem}.py")
        assert run.tables, f"{path.name}: a run without a table"


def test_make_bench_saves_what_the_page_reads():
    """Every benchmark `make bench` runs has a results file, and every block reads one."""
    makefile = (REPO / "Makefile").read_text()
    run = set(re.findall(r"\$\(call run_bench,(\w+)", makefile))
    assert run == {path.stem for path in RESULTS}
    assert {found[1] for found in BLOCKS} <= run


def test_the_pages_links_lead_somewhere():
    page = PAGE.read_text()
    for target in re.findall(r"\]\((?!https?:)([^)#]+)", page):
        assert (PAGE.parent / target).exists(), target


def test_links_into_the_page_find_their_heading():
    """Other pages link to this one's sections: each anchor is a heading's (as GitHub makes
    them: lower case, punctuation dropped, spaces as hyphens)."""
    headings = re.findall(r"^#+ (.+)$", PAGE.read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    for path in pages:
        for anchor in re.findall(r"performance\.md#([\w-]+)", path.read_text()):
            assert anchor in anchors, f"{path.name}: performance.md#{anchor}"
