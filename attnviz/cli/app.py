"""The `attnviz` application: the Typer app every command module registers on, the consoles,
one-line errors, and the process's exit.

Heavy libraries (torch, transformers, matplotlib) are imported inside the commands' core
functions, so `attnviz --help` starts fast.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from attnviz.errors import AttnvizError, Interrupted


class _HelpAsFlag:
    """Show -h/--help as a flag in help screens (Typer's own shows it with a `<bool>` value)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


out_console = Console()
err_console = Console(stderr=True)

# Typer raises its own copy of click's UsageError (typer._click), the base of BadParameter.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _OneLineUsage:
    """Usage errors (an unknown command, a bad choice, a value out of range, a missing
    argument) as one line on stderr with exit code 2, as attnviz's own errors are."""

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)  # type: ignore[misc]
        except _UsageError as error:
            raise _usage(error) from None


def _usage(error: Any) -> typer.Exit:
    command = error.ctx.command_path if error.ctx is not None else "attnviz"
    message = " ".join(error.format_message().split()).replace("Value error, ", "")
    err_console.print(
        f"[bold red]usage error:[/] {message} ({command} -h for help)",
        highlight=False,
        soft_wrap=True,
    )
    return typer.Exit(2)


class _Group(_OneLineUsage, _HelpAsFlag, TyperGroup):
    def resolve_command(self, ctx: Any, args: Any) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except _UsageError as error:  # no such command
            raise _usage(error) from None


class Panel:
    """The panels --help shows a command's options in (their rich_help_panel), after its
    everyday ones (Typer's "Options"), in this order for every command; docs/reference.md
    has a table for each."""

    READING = "Reading the text"
    MEASURES = "Measures"
    WRITING = "Decoders and encoder-decoders"
    LONG = "Long texts"
    OUTPUT = "Files and figures"
    TREEBANK = "Treebank"
    PARTS = "A report in parts"
    LOADING = "Loading the model"


PANELS = tuple(title for name, title in vars(Panel).items() if name.isupper())

# What --help says under every command's options: their help there is cut short.
IN_FULL = "Every option in full: docs/reference.md."


def shown_default(param: Any, ctx: Any) -> str:
    """An option's default as --help shows it, by Typer's rule (a show_default text, or the
    value unless show_default is off), or ""; Typer's own helpers are private, but the only
    source of the default as --help prints it (docs/generate.py reads it here too)."""
    value = param._extract_default_help_str(ctx=ctx)
    given = isinstance(param.show_default, str)
    if not given and (value is None or not (param.show_default or ctx.show_default)):
        return ""
    return param._get_default_string(ctx=ctx, show_default_is_str=given, default_value=value)


def _panel(param: Any) -> int:
    """Where a parameter's panel comes in --help: arguments, everyday options, then PANELS."""
    panel = getattr(param, "rich_help_panel", None)
    if panel is None:
        return -1 if param.param_type_name == "argument" else 0
    return 1 + PANELS.index(panel)


def _brief(param: Any, ctx: Any) -> Any:
    """A copy of `param` as --help shows it: its help up to the \f (the rest is the
    reference's), its default on the same line (Typer puts it on a line of its own)."""
    brief = copy.copy(param)
    brief.help = (param.help or "").partition("\f")[0].strip()
    default = shown_default(param, ctx) if param.param_type_name == "option" else ""
    if default:
        brief.help += f" [default: {default}]"
        brief.show_default = False
    return brief


class Command(_OneLineUsage, _HelpAsFlag, TyperCommand):
    """A command whose options are grouped in panels (PANELS' order) and whose --help fits
    a screen: each option's help up to its \f, a command's up to its own (Typer cuts
    that); docs/reference.md (docs/generate.py) has all of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.sort(key=_panel)  # stable: the arguments keep their order

    def format_help(self, ctx: Any, formatter: Any) -> None:
        shown = copy.copy(self)
        shown.params = [_brief(param, ctx) for param in self.params]
        shown.epilog = IN_FULL
        return super(Command, shown).format_help(ctx, formatter)


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from attnviz import __version__

        typer.echo(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def cli(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_version,
            is_eager=True,
            metavar="",
        ),
    ] = False,
) -> None:
    """See, measure and verify multi-head attention in Hugging Face transformers.

    Every command takes --model (default: the bundled all-MiniLM-L6-v2 encoder). Input and
    usage errors exit with code 2 and one line on stderr.
    """


# Whether a command has said what its Ctrl-C interrupted (else `_leave` says it briefly).
_told: list[Interrupted] = []


def fail(error: AttnvizError) -> typer.Exit:
    if isinstance(error, Interrupted):
        _told.append(error)
    err_console.print(f"[bold red]{error.label}:[/] {error}", highlight=False, soft_wrap=True)
    return typer.Exit(error.exit_code)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def progress(label: str, *columns):
    """A progress bar on stderr, so stdout stays clean for results; none where stderr is not
    a terminal (a pipe, a log file), which would get only the blank line rich ends it with."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        *columns,
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_interactive,
    )


def main() -> None:
    """The console entry point: run the command, then leave at once.

    The interpreter's own teardown frees torch's and transformers' objects one by one (about
    0.8 s) and frees nothing the operating system does not free at exit; by then every file
    attnviz writes is closed, so the clean-ups that matter run first and the process exits
    without the teardown. An unexpected error still leaves the normal way, with its traceback.
    """
    try:
        app()
        code: Any = 0
    except SystemExit as stop:
        code = stop.code
    _leave(code)


def _leave(code: Any) -> None:
    import atexit
    import os
    import sys

    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits with 1
        print(code, file=sys.stderr)
        code = 1
    if code == 130 and not _told:  # Ctrl-C where no command caught it (Typer exits 130)
        err_console.print(
            "[bold red]interrupted[/]: stopped before finishing (files are written whole or "
            "not at all)",
            highlight=False,
        )
    import signal

    from attnviz.outputs.render import stop_workers

    # The command is over (its result said, its files written or removed): a Ctrl-C now
    # would only interrupt the clean-up, with a traceback from deep in the pool's shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop_workers()  # drawing processes finish their task and exit
    atexit._run_exitfuncs()  # registered clean-ups: logging, multiprocessing's semaphores
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
            pass
    os._exit(code or 0)
