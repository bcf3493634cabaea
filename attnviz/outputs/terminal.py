"""Terminal views (rich): compact map of all heads, detail table, and a heatmap in the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from attnviz.analysis.check import TOLERANCES
from attnviz.analysis.query import normal_form
from attnviz.analysis.roles import EVERY_ROLE, MIXED, ROLES, attention_kind, roles_for
from attnviz.analysis.summary import AGREE, REMOVED, REMOVED_MARK, TOKEN
from attnviz.core.adapters import STACK_TITLES
from attnviz.outputs import numbers

if TYPE_CHECKING:
    from collections.abc import Iterator

    from attnviz.analysis.check import CheckResult
    from attnviz.analysis.compare import Comparison, Moved, QueryMoves
    from attnviz.analysis.continuation import Written
    from attnviz.analysis.importance import AblationView, Importance
    from attnviz.analysis.query import QueryView
    from attnviz.analysis.report import CrossReport, Report
    from attnviz.analysis.summary import HeadSummary
    from attnviz.core.attention import Attention

# Viridis at five stops, 0 (dark) to 1 (yellow): the images' default colour map. The terminal
# keeps it whatever --cmap gives the images.
_RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def colour(weight: float) -> str:
    """Hex colour of an attention weight in [0, 1] on the viridis ramp."""
    x = min(max(weight, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(x), len(_RAMP) - 2)
    f = x - i
    rgb = [round(a + (b - a) * f) for a, b in zip(_RAMP[i], _RAMP[i + 1])]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def text_colour(weight: float) -> str:
    """Colour for text showing a weight: the ramp minus its dark end, readable on dark screens."""
    return colour(0.3 + 0.7 * min(max(weight, 0.0), 1.0))


def _fit(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def _repeated(tokens: Sequence[str]) -> set[str]:
    """Tokens that occur more than once, by --query's rule (case-insensitive, word pieces
    without their "##"): labels of these carry their position."""
    seen: set[str] = set()
    twice: set[str] = set()
    for token in tokens:
        form = normal_form(token)
        (twice if form in seen else seen).add(form)
    return twice


def _label(tokens: Sequence[str], index: int, width: int, repeated: set[str]) -> str:
    """A token as shown in a cell of `width`: `the@7` when "the" occurs more than once."""
    token = tokens[index]
    if normal_form(token) not in repeated:
        return _fit(token, width)
    where = f"@{index}"
    return _fit(token, max(width - len(where), 1)) + where


def _weight(value: float) -> str:
    return f"{value:.2f}".replace("0.", ".", 1)


# A header lists every token up to this many; a longer text shows its first and last ones.
_HEADER_TOKENS = 80


def print_header(console: Console, att: Attention) -> None:
    info = att.info
    stack = f" · {info.stack} stack" if info.stack else ""
    console.print(
        f"[bold]{info.name}[/] · {info.architecture} · {info.n_layers}×{info.n_heads} heads"
        f"{stack} · d_model {info.d_model} · d_head {info.d_head} · {info.ran_line()}",
        highlight=False,
    )
    if att.stack is not None:
        console.print(
            f"{STACK_TITLES[att.stack]}; --stack encoder|decoder|cross picks another",
            highlight=False,
        )
        sides = [("target", att.tokens), ("source", att.key_tokens)]
        if att.stack == "encoder":
            sides = [("source", att.tokens)]
        elif att.stack == "decoder":
            sides = [("target", att.tokens)]
    else:
        sides = [("", att.tokens)]
    repeated = set()
    for side, tokens in sides:
        repeated |= _print_tokens(console, tokens, f"{side} " if side else "", att.unit)
    if repeated:
        console.print(
            "[dim]token@N: the token at position N (it occurs more than once; "
            "--query token#2 names its second occurrence)[/]"
        )
    for note in att.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    _print_continued(console, att)


_WRITTEN_STYLE = "bold green"  # a continuation's tokens: the text, the heatmap's rows


def _print_continued(console: Console, att: Attention) -> None:
    """The prompt and its continuation as one text, the continuation marked (▸ … in green),
    and how it came."""
    c = att.continuation
    if c is None:
        return
    first = max(0, c.start - 30)  # a long prompt's last 30 tokens
    line = Text(("… " if first else "") + " ".join(att.tokens[first : c.start]) + " ▸ ")
    line.append(" ".join(att.tokens[c.start :]), style=_WRITTEN_STYLE)
    console.print(Text(f"{c.describe(att.unit)}:", style="bold"), line)


def print_continuation(console: Console, written: Written, shown: int = 20) -> None:
    """For each continuation token (the first `shown`): its probability, and the tokens the
    row that wrote it looked at most over every layer and head, the first token left out."""
    steps = written.steps
    sink = sum(step.sink for step in steps) / max(len(steps), 1)
    verb = "wrote" if written.written else "read"
    left_out = (f"; the first token is left out (a sink: it held {sink:.0%} of those rows on "
                "average)") if written.sink_left_out else ""  # fmt: skip
    table = Table(
        title=f"Where the model looked as it {verb} each {written.unit}: the row before it, "
        f"averaged over every head of the layers shown{left_out}",
        title_justify="left",
    )
    for column, justify in (("pos", "right"), (written.unit, "left"), ("p", "right"),
                            ("looked at most", "left")):  # fmt: skip
        table.add_column(column, justify=justify)
    for step in steps[:shown]:
        looked = " · ".join(f"{t.token}@{t.index} {_weight(t.weight)}" for t in step.looked)
        prob = f"{step.prob:.3f}" if step.prob >= 0.001 else f"{step.prob:.1e}"
        table.add_row(str(step.position), Text(step.token, style=_WRITTEN_STYLE), prob, looked)
    console.print(table)
    if len(steps) > shown:
        console.print(
            f"[dim]… {len(steps) - shown} more tokens (--json lists all; --query POSITION "
            "shows one token's own row)[/]",
            highlight=False,
        )


def _print_tokens(console: Console, tokens: Sequence[str], side: str, unit: str) -> set[str]:
    """One line of tokens (a long text's first and last ones); the repeated ones."""
    repeated = _repeated(tokens)
    n = len(tokens)
    shown = range(n)
    if n > _HEADER_TOKENS:
        shown = [*range(_HEADER_TOKENS - 20), -1, *range(n - 20, n)]
    labels = " ".join(
        f"… {n - _HEADER_TOKENS:,} more (--json lists all) …"
        if i < 0
        else _label(tokens, i, 10**6, repeated)
        for i in shown
    )
    console.print(f"{n:,} {side}{unit}s: {labels}", highlight=False)
    return repeated


def _pattern_cell(att: Attention, summary: HeadSummary, width: int, repeated: set[str]) -> Text:
    """A head's cell: what it does (a role, a sink's token, or the token its queries agree
    on) over its score; a removed head's mark."""
    pattern = summary.pattern
    if pattern.role == REMOVED:
        return Text(REMOVED_MARK, style=_REMOVED_STYLE)
    if pattern.role == MIXED.name:
        return Text(MIXED.shown, style=MIXED.style)
    if pattern.role == TOKEN:
        assert pattern.key is not None and pattern.score is not None
        label = _label(att.key_tokens, pattern.key, width, repeated)
        cell = Text(label, style=f"bold {text_colour(pattern.score)}")
    else:
        role = ROLES[pattern.role]
        label = role.short
        if pattern.key is not None and len(att.key_tokens[pattern.key]) <= width:
            label = att.key_tokens[pattern.key]  # a sink: [CLS], [SEP], <s>
        cell = Text(label, style=role.style)
    if pattern.score is not None:
        cell.append("\n" + _weight(pattern.score), style="dim")
    return cell


_REMOVED_STYLE = "bold red"


def _removed_legend(att: Attention) -> str:
    """The legend's entry for removed heads, when there are any."""
    return f"{REMOVED_MARK}=removed (--ablate: no output, no pattern)  " if att.removed else ""


def _map_legend(console: Console, att: Attention) -> None:
    kind = attention_kind(att.info.causal, cross=att.keys is not None)
    roles = [f"{role.short}={role.name}" for role in roles_for(kind)]
    roles.append(f"{MIXED.shown}=mixed (no role)  {_removed_legend(att)}")
    console.print(
        Text(
            "  ".join(roles) + f"a token: the queries give it ≥ {AGREE:.2f} on average. "
            "Scores are means over the queries, each role's metric on this text "
            "(attnviz report measures a corpus; docs/report-methods.md).",
            style="dim",
        )
    )


def _column(att: Attention, head: int) -> str:
    """A map's column heading: the head, or what a per-layer measure's one column holds."""
    return f"{att.measure}, composed" if att.per_layer else f"H{head}"


def _map_title(att: Attention, what: str = "each head does") -> str:
    from attnviz.analysis.contributions import MEASURES

    if att.measure == "weights":
        return f"What {what} on this text"
    measure = MEASURES[att.measure]
    if att.per_layer:
        return (
            f"What each layer's {measure.name} does on this text: the layers up to it, "
            f"composed ({measure.cite})"
        )
    return f"What {what} on this text, by {measure.unit} ({measure.cite}; each row as shares)"


def print_special_share(
    console: Console,
    att: Attention,
    summaries: Sequence[HeadSummary],
    by_weight: Any,
    by_norm: Any,
) -> None:
    """Once above a map: the share special tokens take, by weight and by norm side by side
    (Kobayashi et al. 2020: a key with a large weight may pass on a short vector), and by the
    per-layer measure shown."""

    def share(values: Any, what: str, spread: str) -> str:
        values = [float(v) for v in values if v == v]  # NaN: a removed head
        low, high = float(min(values)), float(max(values))
        return f"{float(sum(values)) / len(values):.0%} {what} ({low:.0%}–{high:.0%} {spread})"

    shown = [s.special_share for s in summaries if s.special_share is not None]  # not removed
    if not shown:
        return
    parts = []
    if by_weight is not None and by_norm is not None and not att.hidden_special:
        parts = [
            share(list(by_weight.ravel()), "of attention weight on average", "per head"),
            share(list(by_norm.ravel()), "by norm ‖α·f(x)‖", "per head"),
        ]
    elif att.measure in ("weights", "norm"):
        what = "of attention" if att.measure == "weights" else "by norm"
        parts = [share(shown, f"{what} on average", "per head")]
    if att.per_layer:
        parts.append(share(shown, f"by {att.measure}", "per layer"))
    if not parts or max(shown) <= 0 and not att.per_layer:
        return
    console.print(
        "Special tokens take " + ", ".join(parts) + "; --hide-special renormalises without them.",
        highlight=False,
    )


def print_head_map(
    console: Console,
    att: Attention,
    summaries: Sequence[HeadSummary],
    layers: list[int],
    heads: list[int],
    by_weight: Any = None,
    by_norm: Any = None,
) -> None:
    """Layers × heads grid: in each cell what the head does on this text, and its score
    (layers alone for a per-layer measure: alti, rollout).

    The share special tokens take is reported once above the grid, by weight and, with
    `by_norm` ((L, H) shares of ‖α f(x)‖), by norm; a sink fills a cell only when its head
    does nothing more specific. Cells widen to use wide terminals.
    """
    print_special_share(console, att, summaries, by_weight, by_norm)
    cell_width = max(5, min(14, (console.width - 4) // max(len(heads), 1) - 1))
    repeated = _repeated(att.key_tokens)  # the cells name keys
    table = Table(
        title=_map_title(att),
        title_justify="left",
        box=None,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    table.add_column("", style="bold", no_wrap=True)
    for head in heads:
        table.add_column(_column(att, head), width=cell_width, no_wrap=True, justify="left")
    by_position = {(s.layer, s.head): s for s in summaries}
    for layer in layers:
        cells = [
            _pattern_cell(att, by_position[(layer, head)], cell_width, repeated) for head in heads
        ]
        table.add_row(f"L{layer}", *cells)
    console.print(table)
    _map_legend(console, att)
    console.print(
        "[dim]Pick heads with --layer/--head for their top tokens and strongest links; "
        "--json has every score.[/]"
    )


def print_head_details(console: Console, att: Attention, summaries: Sequence[HeadSummary]) -> None:
    """One row per head (per layer, for a per-layer measure): what it does, its top-k keys and
    its strongest query→key link."""
    repeated, key_repeated = _repeated(att.tokens), _repeated(att.key_tokens)
    table = Table(title=_map_title(att), title_justify="left")
    table.add_column("L", justify="right")
    if not att.per_layer:
        table.add_column("H", justify="right")
    table.add_column("does")
    table.add_column("top keys (mean weight)" if att.measure == "weights" else "top keys (mean)")
    table.add_column("strongest link (query → key)")
    wide = 10**6
    for s in summaries:
        top = Text()
        for rank, target in enumerate(s.top):
            if rank:
                top.append(" · ", style="dim")
            label = _label(att.key_tokens, target.index, wide, key_repeated)
            top.append(label, style=f"bold {text_colour(target.weight)}")
            top.append(" " + _weight(target.weight))
        pattern = s.pattern
        does = _pattern_cell(att, s, wide, key_repeated)
        if pattern.role == REMOVED:
            does = Text(f"{REMOVED_MARK} removed (--ablate)", style=_REMOVED_STYLE)
        elif pattern.role not in (MIXED.name, TOKEN):
            does = Text(pattern.role, style=ROLES[pattern.role].style)
            if pattern.score is not None:
                does.append(" " + _weight(pattern.score), style="dim")
        elif pattern.role == TOKEN:
            does.plain = does.plain.replace("\n", " ")
        link = s.link
        table.add_row(
            str(s.layer),
            *([] if att.per_layer else [str(s.head)]),
            does,
            top if s.top else Text("—", style="dim"),
            Text("—", style="dim")
            if link is None
            else Text.assemble(
                _label(att.tokens, link.query, wide, repeated),
                " → ",
                _label(att.key_tokens, link.key, wide, key_repeated),
                " " + _weight(link.weight),
            ),
        )
    console.print(table)


def print_query(
    console: Console, att: Attention, query: QueryView, layers: list[int], heads: list[int]
) -> None:
    """Where one token looks: a layers × heads map of its top non-special key, then the heads
    that send it hardest to one key."""
    repeated, key_repeated = _repeated(att.tokens), _repeated(att.key_tokens)
    name = _label(att.tokens, query.index, 10**6, repeated)
    cell_width = max(5, min(14, (console.width - 4) // max(len(heads), 1) - 1))
    table = Table(
        title=f"Where “{name}” (position {query.index}) looks: its most-attended "
        "non-special key in each head",
        title_justify="left",
        box=None,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    table.add_column("", style="bold", no_wrap=True)
    for head in heads:
        table.add_column(_column(att, head), width=cell_width, no_wrap=True, justify="left")
    by_position = {(row.layer, row.head): row for row in query.heads}
    for layer in layers:
        cells = []
        for head in heads:
            row = by_position[(layer, head)]
            if row.removed:
                cells.append(Text(REMOVED_MARK, style=_REMOVED_STYLE))
                continue
            best = row.best
            if best is None:
                cells.append(Text("—", style="dim"))
                continue
            cell = Text(_label(att.key_tokens, best.index, cell_width, key_repeated))
            cell.stylize(f"bold {text_colour(best.weight)}")
            cell.append("\n" + _weight(best.weight), style="dim")
            cells.append(cell)
        table.add_row(f"L{layer}", *cells)
    console.print(table)
    if att.removed:
        console.print(Text(_removed_legend(att).strip(), style="dim"))

    where = "Layers" if att.per_layer else "Heads"
    ranked = Table(
        title=f"{where} where “{name}” looks hardest at one {att.unit}"
        + ("" if att.measure == "weights" else f" (by {att.measure})"),
        title_justify="left",
    )
    value = "weight" if att.measure == "weights" else att.measure
    columns = [("L", "right"), ("H", "right"), ("key", "left"), (value, "right")]
    for column, justify in columns[:1] + columns[2 if att.per_layer else 1 :]:
        ranked.add_column(column, justify=justify)
    ranked.add_column("its top keys (all, special included)")
    for row in query.ranked(10):
        best = row.best
        assert best is not None  # ranked() keeps heads that have a non-special key
        keys = att.key_tokens
        top = Text(" · ".join(f"{_label(keys, t.index, 10**6, key_repeated)} {_weight(t.weight)}"
                              for t in row.top))  # fmt: skip
        ranked.add_row(
            str(row.layer),
            *([] if att.per_layer else [str(row.head)]),
            Text(
                _label(att.key_tokens, best.index, 10**6, key_repeated),
                style=f"bold {text_colour(best.weight)}",
            ),
            f"{best.weight:.2f}",
            top,
        )
    console.print(ranked)


_SHADES = " ░▒▓█"


def _has_colour(console: Console) -> bool:
    """False when the output has no colour: piped, a dumb terminal, or NO_COLOR set."""
    return console.color_system is not None and not console.no_color


def _cell(console: Console, weight: float) -> Text:
    """Two character cells: a colour block, or shade characters where the output has no colour."""
    if not _has_colour(console):
        shade = _SHADES[min(int(weight * len(_SHADES)), len(_SHADES) - 1)]
        return Text(shade * 2)
    return Text("  ", style=f"on {colour(weight)}")


def print_heatmap(
    console: Console, att: Attention, layer: int, head: int, scale: str = "absolute"
) -> bool:
    """Draw one head's `[query, key]` weights as cells; False if the terminal is too narrow.

    `scale` "head" divides the weights by the head's maximum, as the images do. A removed
    head has no pattern to draw: one line says so.
    """
    if att.is_removed(layer, head):
        console.print(
            f"[bold]layer {layer} · head {head}[/] is removed (--ablate): its output was set to "
            "0, so no heatmap is drawn",
            highlight=False,
        )
        return True
    grid = att.pattern(layer, head)  # (T, S): S = T but in cross-attention
    peak = float(grid.max())
    if scale == "head" and peak > 0:
        grid = grid / peak
    n, n_keys = grid.shape
    label_width = min(20 if console.width >= 120 else 12, max(len(t) for t in att.tokens))
    row_prefix = 5 + label_width
    if row_prefix + 2 * n_keys > console.width:
        console.print(
            f"[yellow]note:[/] the terminal heatmap of {n_keys} "
            f"{'source ' if att.keys is not None else ''}{att.unit}s needs "
            f"{row_prefix + 2 * n_keys} columns and this terminal has {console.width}; "
            "see the per-head image instead"
        )
        return False
    console.print(
        f"[bold]layer {layer} · head {head}[/]: each row is a query {att.unit}, "
        "each column the key it attends to (index on top)",
        highlight=False,
    )
    start = att.continuation.start if att.continuation is not None else None
    if start is not None:
        console.print(f"[dim]rows from {start} on (▸, green) are the continuation[/]")
    if att.keys is not None:
        keys = " ".join(f"{i}:{token}" for i, token in enumerate(att.key_tokens))
        console.print(f"[dim]keys (source): {keys}[/]", highlight=False)
    if n_keys > 10:
        tens = Text(" " * row_prefix, style="dim")
        for key in range(n_keys):
            tens.append(f"{key // 10:>2}" if key >= 10 else "  ")
        console.print(tens)
    units = Text(" " * row_prefix, style="dim")
    for key in range(n_keys):
        units.append(f"{key % 10:>2}")
    console.print(units)
    for query in range(n):
        mark = "▸" if start is not None and query >= start else " "
        row = Text(f"{query:>3}{mark}")
        row.append(f"{_fit(att.tokens[query], label_width):<{label_width}} ",
                   style=_WRITTEN_STYLE if mark != " " else "")  # fmt: skip
        for key in range(n_keys):
            row.append_text(_cell(console, float(grid[query, key])))
        console.print(row, highlight=False)
    top = "1" if scale != "head" else f"{peak:.2f} (the head's max)"
    scale_line = Text(" " * row_prefix + "scale 0 ")
    for step in range(11):
        scale_line.append_text(_cell(console, step / 10))
    scale_line.append(f" {top}")
    console.print(scale_line)
    return True


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
            f"[bold]{info.name}[/] · {info.architecture} · source {len(result.tokens)} tokens · "
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
            f"[bold]{info.name}[/] · {info.architecture} · {len(result.tokens)} tokens · "
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


def print_report(console: Console, report: Report) -> None:
    """Layers × heads map of roles, then the strongest heads of each role with their scores."""
    info = report.info
    console.print(
        f"[bold]{info.name}[/] · {report.sentences} sentences · {report.queries} query "
        f"{report.unit}s (special tokens excluded)",
        highlight=False,
    )
    for note in report.skipped:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    table = Table(title="Head roles", title_justify="left", box=None, padding=(0, 1, 0, 0))
    table.add_column("", style="bold")
    for head in report.heads:
        table.add_column(f"H{head}", width=5, no_wrap=True)
    by_position = {(r.layer, r.head): r for r in report.roles}
    for layer in report.layers:
        cells = []
        for head in report.heads:
            role = EVERY_ROLE[by_position[(layer, head)].role]
            cells.append(Text(role.shown, style=role.style))
        table.add_row(f"L{layer}", *cells)
    console.print(table)
    # the roles this model's attention can get (induction: only where the probe ran)
    kind = attention_kind(info.causal)
    can = [role for role in roles_for(kind) if not role.probed or report.probes is not None]
    legend = Text("  ".join(f"{role.shown}={role.name}" for role in (*can, MIXED)))
    if report.probes is not None:
        legend.append("  (induction: from the probe on repeated random tokens; on the texts' "
                      "own repeats: induction_texts in heads.csv)")  # fmt: skip
    console.print(legend, style="dim")

    strongest = Table(title="Strongest heads of each role", title_justify="left")
    strongest.add_column("role")
    strongest.add_column("heads (score)")
    strongest.add_column("threshold", justify="right")
    for role, heads in report.strongest(3).items():
        listed = " · ".join(f"L{h.layer} H{h.head} {h.score:.2f}" for h in heads)
        count = sum(1 for r in report.roles if r.role == role)
        strongest.add_row(
            Text(role, style=EVERY_ROLE[role].style),
            f"{listed}  [dim]({count} head{'s' if count > 1 else ''})[/]",
            f"{report.thresholds.values[role]:.2f}",
        )
    console.print(strongest)
    if report.probes is not None:
        probes = report.probes
        console.print(
            f"Induction probe ({probes.sequences} × {probes.length} random tokens, repeated): "
            f"loss {probes.loss_first:.2f} nats on the first repeat, "
            f"{probes.loss_second:.2f} on the second",
            highlight=False,
        )
    if info.causal:
        print_repeats(console, report)


def print_repeats(console: Console, report: Report) -> None:
    """The heads that score highest for induction on the corpus's own repeated tokens, or
    why there is no such score."""
    induction, duplicate = report.repeat_queries
    if report.repeats is None:
        console.print(
            f"On the texts' own repeats: {induction} queries repeat an earlier token (fewer than "
            "3): no induction_texts or duplicate_texts scores",
            highlight=False,
        )
        return
    scores = report.repeats[0]
    chosen = [(layer, head) for layer in report.layers for head in report.heads]
    best = sorted(chosen, key=lambda lh: -scores[lh])[:3]
    listed = " · ".join(f"L{layer} H{head} {scores[layer, head]:.2f}" for layer, head in best)
    console.print(
        f"On the texts' own repeats ({induction} queries after an earlier occurrence of their "
        f"token, {duplicate} for duplicate): induction_texts {listed}",
        highlight=False,
    )


def print_alignment(console: Console, cross: CrossReport, shown: int = 5) -> None:
    """The most monotone cross-attention heads, with each alignment metric by weight and by
    norm (`analysis.alignment`)."""
    rows = sorted(cross.rows(), key=lambda r: -(r["monotone"] or 0.0))[:shown]
    names = [name for name in rows[0] if name not in ("layer", "head")] if rows else []
    table = Table(title="Most monotone heads (_norm: on ‖α f(x)‖)", title_justify="left")
    table.add_column("head")
    for name in names:
        table.add_column(name, justify="right")
    for row in rows:
        cells = [f"{row[n]:.2f}" if row[n] is not None else "–" for n in names]
        table.add_row(f"L{row['layer']} H{row['head']}", *cells)
    console.print(table)


def print_linguistics(console: Console, report: Report) -> None:
    """The Clark-style table (best head per relation and direction, against the baseline),
    coreference's best heads, and how many heads are named for them."""
    from attnviz.analysis.linguistics import SHORT_DIRECTIONS

    ling = report.linguistics
    if ling is None:
        return
    layers, heads = list(report.layers), list(report.heads)
    for note in ling.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    if ling.syntax is not None:
        rows = ling.syntax.table(layers, heads)
        table = Table(
            title=f"Syntax: the best head per relation (relations with ≥ {ling.min_count} arcs)",
            title_justify="left",
        )
        for name, justify in (("relation", "left"), ("direction", "left"), ("best head", "left"),
                              ("accuracy", "right"), ("baseline", "right"), ("offset", "right"),
                              ("arcs", "right")):  # fmt: skip
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for row in rows:
            better = row.accuracy >= row.baseline_accuracy + ling.margin
            table.add_row(
                row.relation,
                SHORT_DIRECTIONS[row.direction],
                f"L{row.layer} H{row.head}",
                Text(
                    f"{row.accuracy:.1%}" + (" *" if better else "  "),
                    style="bold green" if better else "",
                ),
                f"{row.baseline_accuracy:.1%}",
                f"{row.baseline:+d}",
                str(row.n),
            )
        if rows:
            console.print(table)
        else:
            console.print(f"Syntax: no relation has {ling.min_count} arcs (--min-count).")
    if ling.coreference is not None:
        layer, head, accuracy = ling.coreference.best(layers, heads)
        console.print(
            f"Coreference: {ling.coreference.mentions} mentions with an antecedent; best head "
            f"L{layer} H{head} {accuracy:.1%}, nearest-mention baseline "
            f"{ling.coreference.baseline_accuracy:.1%}",
            highlight=False,
        )
    named = sum(1 for r in report.roles if report.linguistic_roles(r.layer, r.head))
    console.print(
        f"[dim]{named} head(s) beat a baseline by ≥ {100 * ling.margin:.0f} points (--margin): "
        "see linguistic_roles in heads.csv; * marks such a head's accuracy.[/]",
        highlight=False,
    )


def print_importance(console: Console, report: Report, shown: int = 10) -> None:
    """The most important heads by each method measured, with their roles."""
    found = report.importances()
    if not found:
        return
    first = next(iter(found.values()))
    if first.objective_name == "embedding-cosine":
        what = "the sentence embedding: 1 − cos between it with and without each head"
    else:
        what = f"the {first.short}: {first.clean:.4g} {first.unit} with nothing removed"
    console.print(
        f"[bold]Which heads matter[/] to {what} (definition in report.md)", highlight=False
    )
    roles = {(r.layer, r.head): r.role for r in report.roles}
    table = Table(title_justify="left", box=None, padding=(0, 2, 0, 0))
    table.add_column("rank", justify="right")
    table.add_column("head")
    table.add_column("role")
    for result in found.values():
        table.add_column(f"{result.how} ({result.unit})", justify="right")
    top = first.top(shown)
    columns = [
        numbers.column([r.scores[layer, head] for layer, head, _ in top]) for r in found.values()
    ]
    for rank, ((layer, head, _), scores) in enumerate(zip(top, zip(*columns)), start=1):
        role = roles.get((layer, head), "")
        style = EVERY_ROLE[role].style if role in EVERY_ROLE else ""
        table.add_row(str(rank), f"L{layer} H{head}", Text(role, style=style), *scores)
    console.print(table)
    spearman = report.spearman()
    if spearman is not None:
        console.print(f"Spearman correlation of the two rankings: {spearman:.2f}", highlight=False)


class _Pairs:
    """ "token value" pairs separated by two spaces, that wrap between one pair and the next,
    never inside one (rich would break at any space): next-token guesses, top keys."""

    def __init__(self, pairs: Sequence[str], style: str = "") -> None:
        self.pairs = list(pairs)
        self.style = style

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [cell_len(pair) for pair in self.pairs] or [0]
        return Measurement(max(widths), sum(widths) + 2 * (len(widths) - 1))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        lines: list[str] = []
        for pair in self.pairs:
            if lines and cell_len(lines[-1]) + 2 + cell_len(pair) <= options.max_width:
                lines[-1] += "  " + pair
            else:
                lines.append(pair)
        yield Text("\n".join(lines), style=self.style)


def print_ablation(console: Console, view: AblationView) -> None:
    """What removing heads changed: a decoder's loss and next-token guesses per position
    before and after; an encoder's sentence embedding."""
    removed = ", ".join(f"L{layer} H{head}" for layer, head in view.heads)
    if not view.predictions:
        console.print(
            f"[bold]Removed {removed}[/] (zero ablation): the sentence embedding moved by "
            f"1 − cos = {view.after:.4g}; the maps above are the model's without "
            f"{'it' if len(view.heads) == 1 else 'them'}.",
            highlight=False,
        )
        return
    console.print(
        f"[bold]Removed {removed}[/] (zero ablation): {view.objective} {view.before:.3f} → "
        f"{view.after:.3f} {view.unit} ({view.after - view.before:+.3f})",
        highlight=False,
    )
    table = Table(box=None, padding=(0, 2, 0, 0), title_justify="left",
                  title="Top-5 next tokens before → after")  # fmt: skip
    for name in ("pos", "token", "next", "before", "after"):
        table.add_column(name, justify="right" if name == "pos" else "left")
    for p in view.predictions:
        changed = p.before[0][0] != p.after[0][0]
        table.add_row(
            str(p.position),
            repr(p.token),
            "—" if p.actual is None else repr(p.actual),
            _guesses(p.before),
            _guesses(p.after, style="bold yellow" if changed else ""),
        )
    console.print(table)


def _guesses(found: tuple[tuple[str, float], ...], style: str = "") -> _Pairs:
    return _Pairs([f"{token.strip() or repr(token)} {prob:.2f}" for token, prob in found], style)


def _targets(found: Sequence[Any]) -> _Pairs:
    return _Pairs([f"{t.token} {_weight(t.weight)}" for t in found])


def print_comparison_header(console: Console, comparison: Comparison, models: str) -> None:
    """What was compared: the model(s), A and B (or how many pairs), and what has no partner."""
    pairs = comparison.pairs
    console.print(f"[bold]Compare[/] ({models}, {comparison.a.unit}s)", highlight=False)
    if len(pairs) == 1:
        for side, att in (("A", comparison.a), ("B", comparison.b)):
            tokens = list(att.tokens)
            c = att.continuation  # a decoder's --generate: ▸ where what it wrote starts
            said = f" ({c.describe(att.unit)})" if c is not None else ""
            if c is not None:
                tokens.insert(c.start, "▸")
            console.print(f"  {side}: {' '.join(tokens)}{said}", highlight=False, soft_wrap=True)
    else:
        console.print(f"  {len(pairs)} pairs; the figures are means over them", highlight=False)
    for number, pair in enumerate(pairs, start=1):
        note = pair.alignment.note(pair.a.tokens, pair.b.tokens)
        if note:
            where = f"pair {number}: " if len(pairs) > 1 else ""
            console.print(f"  [yellow]{where}{note}[/]", highlight=False, soft_wrap=True)


ABLATION_TITLE = (
    "How far each kept head moved when those were removed: JS divergence (nats, 0 = the "
    "same pattern; mean over queries; × = removed)"
)
DIVERGENCE_TITLE = (
    "How far each head moved: JS divergence A→B (nats, 0 = the same pattern; mean over "
    "aligned queries)"
)


def print_divergence_map(
    console: Console, divergence: Any, layers: Sequence[int], title: str = DIVERGENCE_TITLE
) -> None:
    """Layers × heads: how far each head's pattern moved (Jensen–Shannon divergence, nats,
    (L, H) over `layers`), each cell shaded by its share of the largest; NaN (a head that
    was removed) is shown as ×."""
    import numpy as np

    top = float(np.nanmax(divergence)) if np.isfinite(divergence).any() else 0.0
    top = top or 1.0
    coloured = _has_colour(console)
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1, 0, 0),
                  show_edge=False)  # fmt: skip
    table.add_column("", style="bold", no_wrap=True)
    for head in range(divergence.shape[1]):
        table.add_column(f"H{head}", justify="right", no_wrap=True)
    for slot, layer in enumerate(layers):
        cells = []
        for value in divergence[slot]:
            if not np.isfinite(value):
                cells.append(Text("×", style="dim"))
                continue
            # small divergences (a tiny random model's) in powers of ten, not as .000
            shown = f"{value:.3f}".replace("0.", ".", 1) if top >= 0.01 else f"{value:.0e}"
            shown = "0" if value == 0 else shown  # exactly the same pattern
            if coloured:
                cells.append(Text(shown, style=text_colour(value / top)))
            else:
                shade = _SHADES[min(int(value / top * len(_SHADES)), len(_SHADES) - 1)]
                cells.append(Text(shade + shown))
        table.add_row(f"L{layer}", *cells)
    console.print(table)


def print_moved(console: Console, moved: Sequence[Moved], several: bool = False) -> None:
    """The heads that moved most, with the keys each attends to most in A and in B."""
    table = Table(
        title="Heads that moved most (top keys: mean weight over non-special queries)",
        title_justify="left",
        box=None,
        padding=(0, 2, 0, 0),
    )
    names = ("head", "JS (nats)", *(("pair",) if several else ()), "pattern A→B", "top in A",
             "top in B")  # fmt: skip
    for name in names:
        table.add_column(name, justify="right" if name == "JS (nats)" else "left")
    for m in moved:
        pair = (str(m.pair + 1),) if several else ()
        patterns = f"{m.pattern_a.short}→{m.pattern_b.short}"
        table.add_row(f"L{m.layer} H{m.head}", f"{m.divergence:.4f}", *pair, patterns,
                      _targets(m.top_a), _targets(m.top_b))  # fmt: skip
    console.print(table)


def print_compare_query(
    console: Console, query: QueryMoves, layers: Sequence[int], shown: int = 10
) -> None:
    """Where one aligned query looks in A and in B, in the heads where its row moved most
    (over several pairs: the mean, and each head's keys on the pair where it moved most)."""
    import numpy as np

    several = query.pair is not None
    over = ""
    if several:
        over = f", mean over the {len(query.counted)} pairs whose A has it"
    table = Table(
        title=f"Where “{query.label}” looks: the {shown} heads where its row moved most{over} "
        "(keys: aligned tokens, rows renormalised over them)",
        title_justify="left",
        box=None,
        padding=(0, 2, 0, 0),
    )
    for name in ("head", "JS (nats)", *(("pair",) if several else ()), "top in A", "top in B"):
        table.add_column(name, justify="right" if name == "JS (nats)" else "left")
    order = np.argsort(-query.divergence, axis=None, kind="stable")[:shown]
    for index in order:
        slot, head = np.unravel_index(int(index), query.divergence.shape)
        key = (layers[int(slot)], int(head))
        pair = (str(int(query.pair[slot, head]) + 1),) if several else ()
        table.add_row(f"L{key[0]} H{key[1]}", f"{query.divergence[slot, head]:.4f}", *pair,
                      _targets(query.top_a[key]), _targets(query.top_b[key]))  # fmt: skip
    console.print(table)
    if several and query.skipped:
        left = _ranges([n + 1 for n in query.skipped])
        console.print(f"  [yellow]“{query.label}” is not in A, or has no partner in B, in "
                      f"pairs {left}: left out[/]", highlight=False, soft_wrap=True)  # fmt: skip


def _ranges(numbers: Sequence[int]) -> str:
    """Increasing numbers as runs: 1–12, 15, 21–27."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def print_moved_importance(
    console: Console, moved: Sequence[Moved], a: Importance, b: Importance
) -> None:
    """The objective in A and in B, and whether the heads that moved most matter: their
    importance (and rank) in each."""
    console.print(
        f"[bold]Moved or matters[/]: {a.short} {a.clean:.4g} in A, {b.clean:.4g} in B "
        f"({b.clean - a.clean:+.4g} {a.unit}); importance = {a.measure}",
        highlight=False,
        soft_wrap=True,
    )
    ranks_a, ranks_b = a.ranks(), b.ranks()
    table = Table(box=None, padding=(0, 2, 0, 0))
    for name in ("head", "JS (nats)", "importance A", "rank A", "importance B", "rank B"):
        table.add_column(name, justify="left" if name == "head" else "right")
    for m in moved:
        at = (m.layer, m.head)
        table.add_row(f"L{m.layer} H{m.head}", f"{m.divergence:.4f}", f"{a.scores[at]:.4g}",
                      str(ranks_a[at]), f"{b.scores[at]:.4g}", str(ranks_b[at]))  # fmt: skip
    console.print(table)


def print_show(console: Console, result: Any, scale: str = "absolute") -> None:
    """What `attnviz show` prints of its result (`pipelines.show.ShowResult`): the header,
    then the query's heads, the per-layer measure's details, the layers × heads map or the
    chosen heads' details; one head's heatmap; what removing heads changed."""
    att, layers, heads = result.attention, result.layers, result.heads
    print_header(console, att)
    if result.continuation is not None:
        print_continuation(console, result.continuation)
    if result.query is not None:
        print_query(console, att, result.query, layers, heads)
    elif att.per_layer:
        print_special_share(
            console, att, result.summaries, result.special_by_weight, result.special_by_norm
        )
        print_head_details(console, att, result.summaries)
    elif len(layers) == att.info.n_layers and len(heads) == att.info.n_heads:
        by_weight, by_norm = result.special_by_weight, result.special_by_norm
        print_head_map(console, att, result.summaries, layers, heads, by_weight, by_norm)
    else:
        print_head_details(console, att, result.summaries)
    if len(layers) == 1 and len(heads) == 1:  # a long text's: its window, or pooled
        drawn = result.window or result.drawn or att
        print_heatmap(console, drawn, layers[0], heads[0], scale)
    if result.ablation is not None:
        print_ablation(console, result.ablation)
    if result.ablation_divergence is not None:
        print_divergence_map(console, result.ablation_divergence, layers, ABLATION_TITLE)


def print_export(console: Console, summary: Any) -> None:
    """What `attnviz export` prints of its summary (`pipelines.export.ExportSummary`): the
    counts (or that nothing was left to do), an earlier export removed, where the manifest is."""
    s = summary
    if s.nothing_to_do:
        too_long = f", {s.too_long} too long (skipped)" if s.too_long else ""
        console.print(
            f"nothing to do: {s.complete} sentences already complete with these "
            f"settings{too_long} · {s.seconds:.1f} s (--overwrite redoes them)",
            highlight=False,
        )
    else:
        parts = [
            f"{s.sentences} sentences",
            f"{s.written} written",
            f"{s.complete} already complete",
            f"{s.too_long} too long (skipped)",
            f"{s.truncated} truncated",
            f"{s.blank} blank lines skipped",
            f"{s.figures} figures",
            f"{s.seconds:.1f} s",
        ]
        console.print(" · ".join(parts), highlight=False)
    if s.removed:
        console.print(
            f"removed {s.removed} sentence folders of an earlier export (--overwrite)",
            highlight=False,
        )


def print_written(
    console: Console,
    images: Sequence[Any],
    folder: Any,
    page: Any = None,
    drawn: Attention | None = None,
    window: Attention | None = None,
) -> None:
    """Where a command wrote its images (and its interactive page); how they show a long text
    (`drawn` pooled, the head figures from `window`'s exact cells)."""
    if images:
        console.print(f"wrote {len(images)} images to [bold]{folder}/[/]", highlight=False)
    if images and drawn is not None and drawn.pooled is not None:
        pooled = drawn.pooling()
        if window is not None and window.span is not None:
            first, end = window.span
            exact = f"head figures: exact cells {first}:{end}"
            said = f"overview, layer grids pooled ({pooled}); {exact}"
        else:
            said = f"the maps pooled: {pooled} (--window START:END draws exact cells)"
        console.print(f"  {said}", highlight=False, soft_wrap=True)
    if page is not None:
        console.print(
            f"wrote the interactive page [bold]{page}[/]", highlight=False, soft_wrap=True
        )


def print_compare(console: Console, found: Any, top: int) -> None:
    """What `attnviz compare` prints of its result (`pipelines.compare.CompareResult`): who
    read what, the divergence map, the heads that moved most (and their importance), the
    query's heads, and what was written."""
    names, comparison = found.models, found.comparison
    who = names[0] if names[0] == names[1] else f"A: {names[0]}, B: {names[1]}"
    print_comparison_header(console, comparison, who)
    print_divergence_map(console, comparison.divergence, comparison.layers)
    print_moved(console, found.moved, len(comparison.pairs) > 1)
    if found.importance is not None:
        print_moved_importance(console, found.moved, *found.importance)
    if found.query is not None:
        print_compare_query(console, found.query, comparison.layers, top)
    pages = found.pages
    print_written(console, found.images, found.folder)
    if pages:
        named = pages[0] if len(pages) == 1 else f"{found.folder}/compare-N.html"
        console.print(f"wrote the interactive page{'s' if len(pages) > 1 else ''} [bold]{named}[/]",
                      highlight=False, soft_wrap=True)  # fmt: skip


def print_seq2seq_report(console: Console, result: Any, shown: int = 5) -> None:
    """An encoder-decoder model's report (`analysis.report.Seq2SeqReport`): each
    self-attention stack's role map, then the most monotone cross-attention heads."""
    from attnviz.core.adapters import STACK_TITLES

    for stack, report in result.stacks.items():
        console.rule(STACK_TITLES[stack], align="left")
        print_report(console, report)
    console.rule(STACK_TITLES["cross"], align="left")
    print_alignment(console, result.cross, shown)
