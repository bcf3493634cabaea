"""`attnviz check` in the terminal: the largest differences between the model and the
from-scratch attention, per head and for the block's output, and the steps compared."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.analysis.check import TOLERANCES
from attnviz.core.layer_map import STACK_TITLES

if TYPE_CHECKING:
    from attnviz.analysis.check import CheckResult


def _error_text(error: float, tolerance: float) -> Text:
    return Text(f"{error:.1e}", style="green" if error <= tolerance else "bold red")


def _kv_note(info) -> str:
    """' · 3 key/value heads (GQA)' for grouped-query models, else ''."""
    kv = info.n_kv_heads or info.n_heads
    return f" · {kv} key/value heads (GQA)" if kv != info.n_heads else ""


_ERRORS_TITLE = "Max |model − from-scratch|: attention probabilities per head, and block output"


_ERROR_COLUMN = 10  # "1.2e-07" with the table's padding and border


def _print_errors(console: Console, result: CheckResult) -> None:
    """The per-head and output errors: layers as columns when they fit the terminal, else
    layers as rows, the columns (heads, then output) split over as many tables as it takes,
    so that every number shows whole."""
    tol, layers = result.tolerance, result.layers
    n_heads = result.info.n_heads
    width = 11 + _ERROR_COLUMN * len(layers)
    if width <= console.width:
        # A title that would wrap onto more than two lines (a layer or two) goes above.
        above = len(_ERRORS_TITLE) > 2 * width
        if above:
            console.print(_ERRORS_TITLE, highlight=False)
        errors = Table(title=None if above else _ERRORS_TITLE, title_justify="left")
        errors.add_column("")
        for lc in layers:
            errors.add_column(f"L{lc.layer}", justify="right")
        for head in range(n_heads):
            errors.add_row(
                f"head {head}", *(_error_text(lc.head_errors[head], tol) for lc in layers)
            )
        errors.add_section()
        errors.add_row("output*", *(_error_text(lc.output_error, tol) for lc in layers))
        console.print(errors)
        return
    columns = [*(f"H{head}" for head in range(n_heads)), "output*"]
    per_table = max(1, (console.width - 8) // _ERROR_COLUMN)
    for start in range(0, len(columns), per_table):
        chunk = range(start, min(start + per_table, len(columns)))
        title = _ERRORS_TITLE if start == 0 else None
        errors = Table(title=title, title_justify="left")
        errors.add_column("", no_wrap=True)
        for c in chunk:
            errors.add_column(columns[c], justify="right", no_wrap=True)
        for lc in layers:
            values = [*lc.head_errors, lc.output_error]
            errors.add_row(f"L{lc.layer}", *(_error_text(values[c], tol) for c in chunk))
        console.print(errors)


def print_check(console: Console, result: CheckResult) -> None:
    """Per-head and output errors of the from-scratch MHA against the model, shapes, verdict;
    an encoder-decoder model's stacks one after another."""
    tol = result.tolerance
    info = result.info
    if result.stacks:
        console.print(
            f"[bold]{info.name}[/] · {info.classes()} · source {len(result.tokens)} tokens · "
            f"target {len(result.target_tokens)} tokens · d_model {info.d_model} · "
            f"the model in {info.dtype}, ours in float64",
            highlight=False,
        )
        for part in result.stacks:
            d_k = next(shape for name, _, shape in part.shapes if name == "W_Q^h")[1]
            console.print(
                f"[bold]{STACK_TITLES[part.stack]}[/] · {len(part.layers)} layer(s) · "
                f"{part.info.n_heads} heads × d_k {d_k}",
                highlight=False,
            )
            _print_steps(console, part)
            _print_errors(console, part)
    else:
        console.print(
            f"[bold]{info.name}[/] · {info.classes()} · {len(result.tokens)} tokens · "
            f"d_model {info.d_model} · {info.n_heads} heads × d_k {info.d_head}"
            f"{_kv_note(info)} · the model in {info.dtype}, ours in float64",
            highlight=False,
        )
        _print_steps(console, result)
        _print_errors(console, result)
    console.print(
        "* block output before residual; relative where its largest value exceeds 1",
        style="dim",
        highlight=False,
    )
    if result.in_blocks:
        console.print(
            "a long text: each layer's probabilities read a block of query rows at a time from "
            "attnviz's attention function (the model's own q and k) and compared with ours "
            "block by block; shorter texts are compared with the model's eager attention",
            style="dim",
            highlight=False,
        )
    default, why = TOLERANCES[info.dtype]
    if tol == default:  # the dtype's tolerance, not one given with --tolerance
        console.print(f"tolerance {tol:.0e} in {info.dtype}: {why}", style="dim", highlight=False)

    if result.passed:
        stacks = f" in {len(result.stacks)} stack(s)" if result.stacks else ""
        console.print(
            f"[bold green]PASS[/]: {len(result.layers)} layer(s){stacks}, every head and output "
            f"within {tol:.0e} (largest error {result.max_error:.1e})",
            highlight=False,
        )
        return
    for lc in result.layers:
        if not lc.passed(tol):
            heads = lc.failing_heads(tol)
            where = f"{lc.stack} layer" if lc.stack else "layer"
            console.print(
                f"[bold red]MISMATCH[/] in {where} {lc.layer}: heads {heads or 'none'}, "
                f"output error {lc.output_error:.1e} (tolerance {tol:.0e})",
                highlight=False,
            )


def _print_steps(console: Console, result: CheckResult) -> None:
    """The from-scratch attention's steps, each with its formula and shape."""
    shapes = Table(title="From-scratch multi-head attention, step by step", title_justify="left")
    shapes.add_column("step")
    shapes.add_column("formula")
    shapes.add_column("shape", justify="right")
    for name, formula, shape in result.shapes:
        shapes.add_row(name, Text(formula), " × ".join(str(d) for d in shape))  # [ ] as such
    console.print(shapes)
