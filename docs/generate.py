r"""Rewrite every sample output shown in README.md and docs/*.md from a real run (`make docs`).

A sample output is a fenced block right after a marker that names the command producing it:

    <!-- output: attnviz show "The cat sat on the mat." --no-images -->
    ```
    $ attnviz show "The cat sat on the mat." --no-images
    (what the command printed on stdout)
    ```

The block's first line is the command, so what a reader sees is what ran. Options go between
`output` and the colon, e.g. `<!-- output lines=..12 slow: attnviz … -->`:

- `lines=A..B`: only lines A to B of the output, inclusive. Each end is a line number (from 1;
  a negative one counts from the end, -1 being the last line) or `/REGEX/`, the first line that
  matches (for B, the first at or after A; `\s` for a space); either end may be left out. A
  `…` line stands for the lines left out before or after.
- `columns=N`: the terminal's width (default 100).
- `stderr`: what the command printed on stderr follows its stdout (for error examples).
- `exit=N`: the exit code the command must end with (default 0); any other is an error here.
- `slow`: tests/test_docs.py runs it with the slow tests only (`make test`, not `make test-fast`).
- `rounding`: the output holds errors of float32 rounding (numbers written `d.de-06` and
  smaller, as `check` prints them), whose digits change with the CPU that ran the model:
  tests/test_docs.py compares such numbers as "below 1e-5", not digit by digit.
- `needs=FILE`: a data file the repository does not ship, looked for in $ATTNVIZ_DATA (default:
  `../shared/data` beside the checkout) and linked into the folder the command runs in. Without
  it the block is left as it is. The drift test runs such a block only when $ATTNVIZ_DATA is
  set: the whole UD EWT development set takes minutes, too long for every test run.

`<!-- output: python -->` right after a ```python block shows what that code prints.

Each command runs as a user would run it, on the command line: `attnviz` from this
interpreter's environment, in a new temporary folder that holds a link to the repository's
`samples/`, so `samples/x.conllu` resolves and files land in `attnviz-out/` there (no folder
named `attnviz/`: Python code run there would import it instead of the package). The
environment is fixed so that outputs are the same everywhere: COLUMNS as given, NO_COLOR=1
and stdout a pipe (no colour), no GPU (CUDA_VISIBLE_DEVICES empty), the Hugging Face hub
offline. Outputs are normalised in one way only: trailing spaces are removed from each line
(rich pads lines to the terminal's width), trailing blank lines are dropped, and the
temporary folder's path, should it appear, becomes `.`.

    python docs/generate.py                       rewrite every block whose output changed
    python docs/generate.py --check               print the differences, exit 1 if there are any
    python docs/generate.py --only "attnviz show"  only the blocks whose command contains this

tests/test_docs.py runs every marked command again (in one process, with the same settings)
and fails with a diff when a block no longer shows what its command prints.

It also writes docs/reference.md, the command reference: every command of the Typer app, in
the app's order, with its help, its usage line and a table of its arguments and options per
help panel, read from the app as `attnviz --help` reads it (no model, no torch), each help
whole (--help stops at a \f: an option's first line, a command's opening paragraphs). Every run
rewrites it (`--only` too); `--check` reports it when it differs, and so does
tests/test_docs.py.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/*.md")
REFERENCE = REPO / "docs" / "reference.md"
MARKER = re.compile(r"^<!-- output(?P<options>(?: .*?)?): (?P<command>.+?) -->$")
LINES = re.compile(r"^(?P<start>-?\d+|/[^/]+/)?\.\.(?P<end>-?\d+|/[^/]+/)?$")
FENCE = "```"
COLUMNS = 100
ELIDED = "…"
# Environment variables that would change what a command prints, removed for every run.
UNSET = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "LINES")


class DocsError(Exception):
    """A marker that cannot be used, or a command that did not end as its marker says."""


@dataclass(frozen=True)
class Block:
    """One marked sample output: where it is, what produces it and what it shows now."""

    path: Path
    line: int  # 1-based line of the marker
    command: str  # an attnviz command line, or "python"
    shown: tuple[str, ...]  # the block's lines as the file has them
    code: str = ""  # for "python": the code block above
    lines: tuple[str | None, str | None] = (None, None)  # as written: "3", "-1", "/REGEX/"
    columns: int = COLUMNS
    stderr: bool = False
    exit: int = 0
    slow: bool = False
    rounding: bool = False
    needs: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def key(self) -> tuple:
        """Blocks with the same key print the same output: a run serves all of them."""
        return (self.command, self.code, self.columns, self.needs)


@dataclass(frozen=True)
class Run:
    """What one command printed, and how it ended."""

    stdout: str
    stderr: str
    code: int


ROUNDING = re.compile(r"\b\d\.\de-(?:0[6-9]|[1-9]\d)\b")


def comparable(block: Block, lines: tuple[str, ...]) -> tuple[str, ...]:
    """The lines as the drift test compares them: with `rounding`, every number below 1e-5 in
    scientific notation is the same number."""
    if not block.rounding:
        return lines
    return tuple(ROUNDING.sub("<1e-5", line) for line in lines)


def doc_files(repo: Path = REPO) -> list[Path]:
    return sorted(path for pattern in DOCS for path in repo.glob(pattern))


def _options(text: str, where: str) -> dict:
    options: dict = {}
    for word in text.split():
        name, _, value = word.partition("=")
        if name == "lines" and LINES.match(value):
            options["lines"] = LINES.match(value).group("start", "end")
        elif name == "columns" and value.isdigit():
            options["columns"] = int(value)
        elif name == "exit" and value.isdigit():
            options["exit"] = int(value)
        elif name == "needs" and value:
            options["needs"] = value
        elif name in ("stderr", "slow", "rounding") and not value:
            options[name] = True
        else:
            raise DocsError(f"{where}: unknown marker option {word!r}")
    return options


def _code_above(lines: list[str], index: int, where: str) -> str:
    """The ```python block that ends right above line `index` (blank lines between allowed)."""
    end = index - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or lines[end] != FENCE:
        raise DocsError(f"{where}: `output: python` must follow a ```python block")
    start = end - 1
    while start >= 0 and not lines[start].startswith(FENCE):
        start -= 1
    if start < 0 or lines[start] != FENCE + "python":
        raise DocsError(f"{where}: `output: python` must follow a ```python block")
    return "\n".join(lines[start + 1 : end]) + "\n"


def blocks(path: Path) -> Iterator[tuple[Block, int, int]]:
    """Every marked block of a Markdown file, with the line indices of its opening and closing
    fences."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for index, text in enumerate(lines):
        match = MARKER.match(text)
        if match is None:
            continue
        where = f"{path.relative_to(REPO)}:{index + 1}"
        opening = index + 1
        if opening >= len(lines) or lines[opening] != FENCE:
            raise DocsError(f"{where}: the marker must be followed by a ``` block (no language)")
        closing = opening + 1
        while closing < len(lines) and lines[closing] != FENCE:
            closing += 1
        if closing == len(lines):
            raise DocsError(f"{where}: the block after the marker is never closed")
        command = match["command"].strip()
        code = _code_above(lines, index, where) if command == "python" else ""
        if command != "python" and shlex.split(command)[0] != "attnviz":
            raise DocsError(f"{where}: a marker runs `attnviz …` or `python`, not {command!r}")
        block = Block(
            path=path,
            line=index + 1,
            command=command,
            shown=tuple(lines[opening + 1 : closing]),
            code=code,
            **_options(match["options"], where),
        )
        yield block, opening, closing


def all_blocks(repo: Path = REPO) -> list[Block]:
    return [block for path in doc_files(repo) for block, _, _ in blocks(path)]


def unmarked_blocks(path: Path) -> Iterator[int]:
    """Lines (1-based) of fenced blocks with no language that no marker precedes: output shown
    by hand. A block that is not an output says what it is (```sh, ```text, ```python)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    inside = False
    for index, text in enumerate(lines):
        if not text.startswith(FENCE):
            continue
        if not inside and text == FENCE and (index == 0 or not MARKER.match(lines[index - 1])):
            yield index + 1
        inside = not inside


def data_file(name: str) -> Path | None:
    """A data file the repository does not ship ($ATTNVIZ_DATA, or ../shared/data), if here."""
    folder = Path(os.environ.get("ATTNVIZ_DATA") or REPO.parent / "shared" / "data")
    path = folder / name
    return path if path.is_file() else None


def workdir(parent: Path, block: Block) -> Path:
    """A fresh folder to run a block's command in, holding what the docs' commands read."""
    folder = Path(tempfile.mkdtemp(prefix="attnviz-docs-", dir=parent))
    (folder / "samples").symlink_to(REPO / "samples")
    if block.needs:
        found = data_file(block.needs)
        if found is None:
            raise DocsError(f"{block.where}: needs {block.needs}, not in $ATTNVIZ_DATA")
        (folder / block.needs).symlink_to(found)
    return folder


def environment(columns: int) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in UNSET}
    env.update(
        COLUMNS=str(columns),
        NO_COLOR="1",
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    return env


def run_process(block: Block, cwd: Path) -> Run:
    """Run a block's command as a separate process, as a user runs it."""
    if block.command == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        script = Path(sys.executable).with_name("attnviz")
        entry = [str(script)] if script.exists() else [sys.executable, "-m", "attnviz"]
        argv = entry + shlex.split(block.command)[1:]
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=environment(block.columns),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    return Run(done.stdout, done.stderr, done.returncode)


def _line(block: Block, lines: list[str], end: str | None, after: int, default: int) -> int:
    """The index in the output of one end of `lines=A..B`."""
    if end is None:
        return default
    if end.startswith("/"):
        pattern = re.compile(end[1:-1])
        for index in range(after, len(lines)):
            if pattern.search(lines[index]):
                return index
        raise DocsError(f"{block.where}: no line of the output matches {end}")
    number = int(end)
    return number - 1 if number > 0 else len(lines) + number


def render(block: Block, run: Run, cwd: Path) -> tuple[str, ...]:
    """The block's lines for this run: the command, then its normalised, selected output."""
    if run.code != block.exit:
        raise DocsError(
            f"{block.where}: `{block.command}` exited with {run.code}, not {block.exit}:\n"
            + (run.stderr.strip() or run.stdout.strip())[-2000:]
        )
    text = run.stdout + (run.stderr if block.stderr else "")
    lines = [line.rstrip() for line in text.replace(str(cwd), ".").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    first = _line(block, lines, block.lines[0], 0, 0)
    last = _line(block, lines, block.lines[1], first, len(lines) - 1) + 1
    if not 0 <= first < last <= len(lines):
        span = "..".join(end or "" for end in block.lines)
        raise DocsError(f"{block.where}: lines={span} selects no line of {len(lines)}")
    shown = lines[first:last]
    shown = ([ELIDED] if first > 0 else []) + shown + ([ELIDED] if last < len(lines) else [])
    return tuple(shown if block.command == "python" else [f"$ {block.command}", *shown])


def diff(block: Block, fresh: tuple[str, ...]) -> str:
    return "\n".join(
        difflib.unified_diff(
            block.shown, fresh, f"{block.where} (shown)", "the command's output now", lineterm=""
        )
    )


def regenerate(
    path: Path, run: Callable[[Block, Path], Run], scratch: Path, cache: dict, only: str = ""
) -> tuple[str, list[str]]:
    """The file's text with every marked block rendered anew, and the diffs of those that
    changed. Blocks whose data file is missing are kept as they are (and said so)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    changes: list[str] = []
    for block, opening, closing in reversed(list(blocks(path))):
        if only not in block.command:
            continue
        if block.needs and data_file(block.needs) is None:
            print(f"{block.where}: kept as it is ({block.needs} not found)", file=sys.stderr)
            continue
        if block.key not in cache:
            print(f"{block.where}: {block.command}", file=sys.stderr)
            cwd = workdir(scratch, block)
            cache[block.key] = (run(block, cwd), cwd)
        done, ran_in = cache[block.key]
        fresh = render(block, done, ran_in)
        if comparable(block, fresh) != comparable(block, block.shown):
            changes.append(diff(block, fresh))
            lines[opening + 1 : closing] = fresh
    return "\n".join(lines) + "\n", changes


def reference_diff(shown: str, fresh: str) -> str:
    name = str(REFERENCE.relative_to(REPO))
    lines = difflib.unified_diff(
        shown.splitlines(), fresh.splitlines(), f"{name} (shown)", "the CLI's help now", lineterm=""
    )
    return "\n".join(lines)


def write_atomic(path: Path, text: str) -> None:
    """Replace the file in one step, with its mode kept: a reader never sees half of it."""
    path.touch()  # a new file: the mode the umask gives
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        os.fchmod(fd, path.stat().st_mode & 0o777)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: a link's text kept, lower case, punctuation dropped
    (backticks, quotes, colons), each space a hyphen. (A second heading with the same anchor
    gets `-1`, a third `-2`.)"""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


# The command reference, docs/reference.md. It says what --help says, so it asks Typer what
# --help asks (display_type_rich; the default as attnviz.cli.app.shown_default gives it to
# --help) and groups as Typer's rich_format_help does; it gives each help whole, past the \f
# where --help stops.


def _commands(command, ctx) -> Iterator[tuple]:
    """The command and every command under it, depth first, each group's in its order, with
    their contexts; hidden ones left out, as --help leaves them."""
    import typer

    yield command, ctx
    for name in command.list_commands(ctx) if hasattr(command, "list_commands") else ():
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield from _commands(sub, typer.Context(sub, info_name=name, parent=ctx))


def _help(text: str | None) -> str:
    """A help text, dedented and whole: --help stops at a \f (an option's line, a command's
    opening paragraphs: attnviz.cli.app.Command), the reference goes on with what follows, as
    a paragraph of its own. The app's help is Markdown (rich_markup_mode), so it stays
    Markdown, save a `<` outside code spans: GitHub would read `<slug>` as an HTML tag and
    drop it."""
    said = inspect.cleandoc(text or "").split("\f")
    parts = "\n\n".join(part.strip() for part in said if part.strip()).split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table: each cell on one line, `|` escaped (in code spans too, as GFM wants)."""

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(" ".join(c.split()).replace("|", r"\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *map(line, rows), ""]


def _panels(command, ctx) -> dict[str, list]:
    """The command's arguments and options by the panel --help draws them in: Arguments, the
    arguments' other panels (rich_help_panel), Options, the options' other panels. -h/--help
    is left out: the page says once that every command has it."""
    from typer.core import TyperArgument
    from typer.rich_utils import ARGUMENTS_PANEL_TITLE, OPTIONS_PANEL_TITLE

    arguments: dict[str, list] = {ARGUMENTS_PANEL_TITLE: []}
    options: dict[str, list] = {OPTIONS_PANEL_TITLE: []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or set(param.opts) & set(ctx.help_option_names):
            continue
        panels = arguments if isinstance(param, TyperArgument) else options
        first = next(iter(panels))
        panels.setdefault(getattr(param, "rich_help_panel", None) or first, []).append(param)
    return {name: params for name, params in (arguments | options).items() if params}


def _row(param, ctx) -> tuple[str, ...]:
    """An argument or option: its names, short flags, type or choices, default and help."""
    from typer.core import TyperArgument

    from attnviz.cli.app import shown_default

    if isinstance(param, TyperArgument):
        names, shorts = [param._rich_display_name()], []
    else:
        every = [*param.opts, *param.secondary_opts]
        names = [name for name in every if name.startswith("--")]
        shorts = [name for name in every if not name.startswith("--")]
    kind = _code(param.display_type_rich(ctx=ctx) or "")
    if span := param._get_number_range_help_str():
        kind += f" ({_code(span)})"
    return (
        ", ".join(map(_code, names)),
        ", ".join(map(_code, shorts)),
        kind or ("flag" if getattr(param, "is_flag", False) else ""),
        "required" if param.required else _code(shown_default(param, ctx)),
        _help(param.help),
    )


def _section(command, ctx) -> list[str]:
    """One command: its heading, usage line and help, then a table for each panel of its
    --help (its commands', for a group)."""
    from typer.rich_utils import COMMANDS_PANEL_TITLE

    lines = [f"## `{ctx.command_path}`", ""]
    lines += ["```text", command.get_usage(ctx).removeprefix("Usage: "), "```", ""]
    lines += ["*Deprecated.*", ""] if command.deprecated else []
    lines += [_help(command.help), ""] if command.help else []
    for panel, params in _panels(command, ctx).items():
        header = ("name", "short", "type", "default", "what it does")
        lines += [f"**{panel}**", "", *_table(header, [_row(param, ctx) for param in params])]
    commands: dict[str, list] = {COMMANDS_PANEL_TITLE: []}
    for sub, sub_ctx in _commands(command, ctx):
        if sub_ctx.parent is ctx:
            panel = getattr(sub, "rich_help_panel", None)  # unset: Typer's placeholder
            link = f"[`{sub_ctx.info_name}`](#{slug(sub_ctx.command_path)})"
            what = _help(sub.short_help or sub.help).split("\n\n")[0]
            panel = panel if isinstance(panel, str) else COMMANDS_PANEL_TITLE
            commands.setdefault(panel, []).append((link, what))
    for panel, rows in commands.items():
        lines += [f"**{panel}**", "", *_table(("command", "what it does"), rows)] if rows else []
    lines += [_help(command.epilog), ""] if command.epilog else []
    return lines


def reference(app=None) -> str:
    """docs/reference.md: every command of the `attnviz` app (or another Typer app), in the
    app's order, as its --help gives it. It reads the Typer app alone, as `attnviz --help`
    does: no model, and no torch, transformers or matplotlib imported."""
    import typer

    if app is None:
        from attnviz.cli import app

    root = typer.main.get_command(app)
    lines = [
        "# Command reference",
        "",
        "<!-- Written by docs/generate.py from the CLI's own help (`make docs`): edit the help "
        "in attnviz/cli/, not this page. -->",
        "",
        "Every command, argument and option of attnviz, as `attnviz COMMAND --help` gives them "
        "(`-h`/`--help` on every command). What to run for what, with examples: "
        "[commands.md](commands.md).",
        "",
    ]
    for command, ctx in _commands(root, typer.Context(root, info_name="attnviz")):
        lines += _section(command, ctx)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print differences, write nothing")
    parser.add_argument("--only", default="", help="only blocks whose command contains this")
    args = parser.parse_args(argv)
    changed = 0
    try:
        with tempfile.TemporaryDirectory(prefix="attnviz-docs-") as scratch:
            cache: dict = {}
            for path in doc_files():
                text, changes = regenerate(path, run_process, Path(scratch), cache, args.only)
                for change in changes:
                    print(change)
                changed += len(changes)
                if changes and not args.check:
                    write_atomic(path, text)
    except DocsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    verb = "differ" if args.check else "rewritten"
    print(f"{changed} sample output(s) {verb}", file=sys.stderr)
    fresh = reference()
    shown = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    if fresh != shown:
        print(reference_diff(shown, fresh))
        print("docs/reference.md " + ("differs" if args.check else "rewritten"), file=sys.stderr)
        if not args.check:
            write_atomic(REFERENCE, fresh)
    return 1 if args.check and (changed or fresh != shown) else 0


if __name__ == "__main__":
    sys.exit(main())
