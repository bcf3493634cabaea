"""`attnviz show` in the terminal: the header, what each head does (the map and the details),
one token's view (`--query`), a heatmap drawn in characters, and the ablation's effect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.analysis.roles import MIXED, ROLES, attention_kind, roles_for
from attnviz.analysis.summary import AGREE, REMOVED, REMOVED_MARK, TOKEN
from attnviz.core.layer_map import STACK_TITLES
from attnviz.core.tokens import LINE_BREAK, SPACE
from attnviz.outputs.terminal.common import (
    ABLATION_TITLE,
    fit_label,
    guess_pairs,
    print_divergence_map,
    repeated_labels,
    shade_cell,
    text_colour,
    token_label,
    weight_text,
)

if TYPE_CHECKING:
    from attnviz.analysis.ablation import AblationView
    from attnviz.analysis.continuation import Step, Written
    from attnviz.analysis.query import QueryView
    from attnviz.analysis.summary import HeadSummary
    from attnviz.core.attention import Attention


# A header lists every token up to this many; a longer text shows its first and last ones.
_HEADER_TOKENS = 80


def print_header(console: Console, att: Attention) -> None:
    info = att.info
    stack = f" · {info.stack} stack" if info.stack else ""
    console.print(
        f"[bold]{info.name}[/] · {info.classes()} · {info.n_layers}×{info.n_heads} heads"
        f"{stack} · d_model {info.d_model} · d_head {info.d_head} · {info.ran_line()}",
        highlight=False,
    )
    if att.stack is not None:
        # without a target the other stacks need one: its note says how
        others = "; --stack encoder|decoder|cross picks another" if att.target is not None else ""
        console.print(f"{STACK_TITLES[att.stack]}{others}", highlight=False)
        sides = [("target", att.tokens), ("source", att.key_tokens)]
        if att.stack == "encoder":
            sides = [("source", att.tokens)]
        elif att.stack == "decoder":
            sides = [("target", att.tokens)]
    else:
        sides = [("", att.tokens)]
    repeated = set()
    if att.picture is not None:  # its patches said as a grid, not one by one
        picture, n = att.picture, len(att.tokens)
        before = " ".join(att.tokens[: picture.first])
        grid = f"{picture.grid[0]} × {picture.grid[1]} patches (row, col)"
        console.print(f"{n:,} tokens: {before + ' + ' if before else ''}{grid}", highlight=False)
        sides = []
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
        looked = " · ".join(f"{t.token}@{t.index} {weight_text(t.weight)}" for t in step.looked)
        prob = f"{step.prob:.3f}" if step.prob >= 0.001 else f"{step.prob:.1e}"
        table.add_row(str(step.position), Text(step.token, style=_WRITTEN_STYLE), prob, looked)
    console.print(table)
    console.print(Text(_continuation_legend(written.unit, steps[:shown]), style="dim"))
    if len(steps) > shown:
        console.print(
            f"[dim]… {len(steps) - shown} more tokens (--json lists all; --query POSITION "
            "shows one token's own row)[/]",
            highlight=False,
        )


# The marks a token of whitespace alone is labelled by (`core.tokens.label_of`).
_MARKS = {LINE_BREAK: "a line break", SPACE: "a space"}


def _continuation_legend(unit: str, steps: Sequence[Step]) -> str:
    """What the continuation table's columns hold, and the marks of whitespace it shows."""
    labels = {label for step in steps for label in (step.token, *(t.token for t in step.looked))}
    marks = [f"{mark} is {what}" for mark, what in _MARKS.items()
             if any(not label.strip(mark) for label in labels)]  # fmt: skip
    said = (
        f"pos: the {unit}'s position; p: the probability the model gave it; looked at "
        f"most: the {unit}s the row before it weighs most, as {unit}@position weight"
    )
    return "; ".join([said, *marks])


def _print_tokens(console: Console, tokens: Sequence[str], side: str, unit: str) -> set[str]:
    """One line of tokens (a long text's first and last ones); the repeated ones."""
    repeated = repeated_labels(tokens)
    n = len(tokens)
    shown = range(n)
    if n > _HEADER_TOKENS:
        shown = [*range(_HEADER_TOKENS - 20), -1, *range(n - 20, n)]
    labels = " ".join(
        f"… {n - _HEADER_TOKENS:,} more (--json lists all) …"
        if i < 0
        else token_label(tokens, i, 10**6, repeated)
        for i in shown
    )
    console.print(f"{n:,} {side}{unit}s: {labels}", highlight=False)
    return repeated


def _pattern_cell(
    keys: Sequence[str], summary: HeadSummary, width: int, repeated: set[str]
) -> Text:
    """A head's cell: what it does (a role, a sink's token, or the token its queries agree
    on, among the `keys`) over its score; a removed head's mark."""
    pattern = summary.pattern
    if pattern.role == REMOVED:
        return Text(REMOVED_MARK, style=_REMOVED_STYLE)
    if pattern.role == MIXED.name:
        return Text(MIXED.shown, style=MIXED.style)
    if pattern.role == TOKEN:
        assert pattern.key is not None and pattern.score is not None
        label = token_label(keys, pattern.key, width, repeated)
        cell = Text(label, style=f"bold {text_colour(pattern.score)}")
    else:
        role = ROLES[pattern.role]
        label = role.short
        if pattern.key is not None and len(keys[pattern.key]) <= width:
            label = keys[pattern.key]  # a sink: [CLS], [SEP], <s>
        cell = Text(label, style=role.style)
    if pattern.score is not None:
        cell.append("\n" + weight_text(pattern.score), style="dim")
    return cell


_REMOVED_STYLE = "bold red"


def _removed_legend(att: Attention) -> str:
    """The legend's entry for removed heads, when there are any."""
    return f"{REMOVED_MARK}=removed (--ablate: no output, no pattern)  " if att.removed else ""


def _map_legend(console: Console, att: Attention) -> None:
    removed = _removed_legend(att)
    kind = attention_kind(att.info.causal, cross=att.keys is not None)
    roles = [f"{role.short}={role.name}" for role in roles_for(kind)]
    roles.append(f"{MIXED.shown}=mixed (no role)  {removed}")
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

    this = "this text" if att.picture is None else "this picture"
    if att.measure == "weights":
        return f"What {what} on {this}"
    measure = MEASURES[att.measure]
    if att.per_layer:
        return (
            f"What each layer's {measure.name} does on {this}: the layers up to it, "
            f"composed ({measure.cite})"
        )
    return f"What {what} on {this}, by {measure.unit} ({measure.cite}; each row as shares)"


def _cell_width(console: Console, heads: list[int]) -> int:
    """A layers × heads table's cell width: wide terminals get wider cells (5 to 14)."""
    return max(5, min(14, (console.width - 4) // max(len(heads), 1) - 1))


def _layers_by_heads(att: Attention, heads: list[int], title: str, cell_width: int) -> Table:
    """An empty layers × heads table: a bold row label, then a column a head."""
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1, 0, 0),
                  show_edge=False)  # fmt: skip
    table.add_column("", style="bold", no_wrap=True)
    for head in heads:
        table.add_column(_column(att, head), width=cell_width, no_wrap=True, justify="left")
    return table


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
    if att.picture is not None:  # its views name what each of them takes
        said = "The tokens outside the patch grid take " + ", ".join(parts) + "."
    else:
        said = (
            "Special tokens take " + ", ".join(parts) + "; --hide-special renormalises "
            "without them."
        )
    console.print(said, highlight=False)


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
    cell_width = _cell_width(console, heads)
    table = _layers_by_heads(att, heads, _map_title(att), cell_width)
    keys = att.key_tokens  # the cells name keys
    repeated = repeated_labels(keys)
    by_position = {(s.layer, s.head): s for s in summaries}
    for layer in layers:
        cells = [
            _pattern_cell(keys, by_position[(layer, head)], cell_width, repeated) for head in heads
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
    repeated, key_repeated = repeated_labels(att.tokens), repeated_labels(att.key_tokens)
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
            label = token_label(att.key_tokens, target.index, wide, key_repeated)
            top.append(label, style=f"bold {text_colour(target.weight)}")
            top.append(" " + weight_text(target.weight))
        pattern = s.pattern
        does = _pattern_cell(att.key_tokens, s, wide, key_repeated)
        if pattern.role == REMOVED:
            does = Text(f"{REMOVED_MARK} removed (--ablate)", style=_REMOVED_STYLE)
        elif pattern.role not in (MIXED.name, TOKEN):
            does = Text(pattern.role, style=ROLES[pattern.role].style)
            if pattern.score is not None:
                does.append(" " + weight_text(pattern.score), style="dim")
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
                token_label(att.tokens, link.query, wide, repeated),
                " → ",
                token_label(att.key_tokens, link.key, wide, key_repeated),
                " " + weight_text(link.weight),
            ),
        )
    console.print(table)


def _query_table(console: Console, att: Attention, heads: list[int], name: str, index: int):
    """print_query's empty layers × heads map (a per-layer measure's: one wide column), and
    its cells' width."""
    cell_width, each = _cell_width(console, heads), "head"
    if att.per_layer:  # one map a layer: one wide column, the title on its line
        cell_width, each = max(cell_width, min(44, console.width - 8)), "layer's map"
    title = (f"Where “{name}” (position {index}) looks: its most-attended non-special "
             f"key in each {each}")  # fmt: skip
    return _layers_by_heads(att, heads, title, cell_width), cell_width


def print_query(
    console: Console, att: Attention, query: QueryView, layers: list[int], heads: list[int]
) -> None:
    """Where one token looks: a layers × heads map of its top non-special key, then the heads
    that send it hardest to one key."""
    repeated, key_repeated = repeated_labels(att.tokens), repeated_labels(att.key_tokens)
    name = token_label(att.tokens, query.index, 10**6, repeated)
    table, cell_width = _query_table(console, att, heads, name, query.index)
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
            cell = Text(token_label(att.key_tokens, best.index, cell_width, key_repeated))
            cell.stylize(f"bold {text_colour(best.weight)}")
            cell.append("\n" + weight_text(best.weight), style="dim")
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
        top = Text(" · ".join(
            f"{token_label(keys, t.index, 10**6, key_repeated)} {weight_text(t.weight)}"
            for t in row.top))  # fmt: skip
        ranked.add_row(
            str(row.layer),
            *([] if att.per_layer else [str(row.head)]),
            Text(
                token_label(att.key_tokens, best.index, 10**6, key_repeated),
                style=f"bold {text_colour(best.weight)}",
            ),
            f"{best.weight:.2f}",
            top,
        )
    console.print(ranked)


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
        row.append(f"{fit_label(att.tokens[query], label_width):<{label_width}} ",
                   style=_WRITTEN_STYLE if mark != " " else "")  # fmt: skip
        for key in range(n_keys):
            row.append_text(shade_cell(console, float(grid[query, key])))
        console.print(row, highlight=False)
    top = "1" if scale != "head" else f"{peak:.2f} (the head's max)"
    scale_line = Text(" " * row_prefix + "scale 0 ")
    for step in range(11):
        scale_line.append_text(shade_cell(console, step / 10))
    scale_line.append(f" {top}")
    console.print(scale_line)
    return True


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
            guess_pairs(p.before),
            guess_pairs(p.after, style="bold yellow" if changed else ""),
        )
    console.print(table)


def print_pictures(console: Console, heads: Sequence[Any], measure: str = "weights") -> None:
    """What each head does on a picture (`analysis.vision.VisionHead`), the last layer
    first: its role, where CLS looks (the columns of CLS left out where the model has no
    CLS: SigLIP), how far the patches look; 80 columns wide."""
    from attnviz.analysis.vision import GLOBAL_REACH, ROLE_SHARE

    cls = any(head.cls_entropy is not None for head in heads)
    columns = ["L", "H", "role", *(["CLS entropy", "CLS on others", "CLS's top patches",
               "sink"] if cls else []), "local", "dist px"]  # fmt: skip
    numbers = ("L", "H", "CLS entropy", "sink", "local", "dist px")
    by = "" if measure == "weights" else f"; by {measure}, each row as shares"
    console.print(f"What each head does on this picture (last layer first{by})", style="italic")
    table = Table(box=None, padding=(0, 1, 0, 0))
    for column in columns:
        table.add_column(column, justify="right" if column in numbers else "left")
    for head in sorted(heads, key=lambda h: (-h.layer, h.head)):
        cells = [str(head.layer), str(head.head), head.role]
        if cls:
            top = " ".join(f"{label.replace(' ', '')} {share:.2f}"
                           for label, share in head.cls_top[:2])  # fmt: skip
            cells += [f"{head.cls_entropy:.2f}", _outside_cell(head.cls_outside), top,
                      f"{head.sink:.2f}"]  # fmt: skip
        table.add_row(*cells, f"{head.local:.2f}", f"{head.distance:.1f}")
    console.print(table)
    said = "No token outside the grid (no CLS). "
    if cls:
        said = (f"CLS on others: what CLS gives the tokens outside the grid (CLS itself, dist, "
                f"registers), with the largest; --json has each and CLS's top "
                f"{len(heads[0].cls_top)} patches. sink: the patches give ≥ {ROLE_SHARE:.0%} "
                "to the tokens outside the grid; ")  # fmt: skip
    console.print(
        f"{said}local: ≥ {ROLE_SHARE:.0%} to their own and the 8 neighbouring patches; global: "
        f"mean attention distance ≥ {GLOBAL_REACH:.0%} of uniform attention's (docs/vision.md).",
        highlight=False,
    )


def _outside_cell(shares: Sequence[tuple[str, float]]) -> str:
    """CLS's share on the tokens outside the grid: the total, and the largest by name."""
    total = sum(share for _, share in shares)
    label, largest = max(shares, key=lambda pair: pair[1])
    return f"{total:.0%}" if len(shares) == 1 else f"{total:.0%}, {label} {largest:.0%}"


def print_picture_shares(console: Console, att: Any) -> None:
    """A vision-language model's answer: per layer, the share of its attention on the
    picture (the mean over heads) and the heads that give the picture most."""
    from rich.table import Table

    from attnviz.analysis.picture_share import picture_shares

    found = picture_shares(att)
    what = "the answer's tokens" if att.continuation is not None else "the prompt's last token"
    cross = att.stack == "cross"  # Mllama's: every key is the picture's; its patches' share
    title = (f"Cross-attention on the picture's patches, for {what}" if cross
             else f"The picture's share of attention, for {what}")  # fmt: skip
    layer_said, share, most = ("cross layer", "patches", "heads that look at them most") if (
        cross) else ("layer", "picture", "heads that look at it most")  # fmt: skip
    table = Table(title=title, title_justify="left")
    for column in (layer_said, share, most):
        table.add_column(column, justify="right" if column != most else "left")
    for slot, layer in enumerate(found.layers):
        top = " · ".join(f"H{head} {share:.2f}" for head, share in found.top_heads(slot))
        table.add_row(f"L{layer}", f"{found.share[slot].mean():.2f}", top)
    console.print(table)
    if cross:
        console.print("patches: the mean over heads and over the rows that wrote each token of "
                      "what they give the picture's tiles' patches (every key of a cross-attention "
                      "layer is the picture's; the rest goes to each tile's CLS)",
                      highlight=False)  # fmt: skip
        return
    console.print("picture: the mean over heads and over the rows that wrote each token of what "
                  "they give the image tokens", highlight=False)  # fmt: skip


def print_tower(console: Console, view: Any) -> None:
    """A vision-language model's vision tower (`analysis.tower.TowerView`), a line a layer:
    its heads' mean attention distance (their mean, least and most) and how many heads have
    each role."""
    from collections import Counter

    from rich.table import Table

    from attnviz.analysis.vision import ROLES

    tower = view.tower
    grids = " + ".join(f"{part.grid[0]} × {part.grid[1]}" for part in tower.layout.parts)
    console.print(f"The vision tower's heads over the picture ({grids} patches of {tower.patch} "
                  f"px; uniform attention would reach {view.uniform:.1f} px)", style="italic",
                  highlight=False)  # fmt: skip
    table = Table(box=None, padding=(0, 1, 0, 0))
    for column in ("layer", "dist px", "least–most", "heads by role"):
        table.add_column(column, justify="left" if column == "heads by role" else "right")
    for layer in range(view.n_layers):
        heads = view.layer(layer)
        reach = [head.distance for head in heads]
        count = Counter(head.role for head in heads)
        roles = " · ".join(f"{role} {count[role]}" for role in ROLES if count[role])
        table.add_row(f"L{layer}", f"{sum(reach) / len(reach):.1f}",
                      f"{min(reach):.1f}–{max(reach):.1f}", roles)  # fmt: skip
    console.print(table)
    drawn = "where CLS looks" if view.cls else "the attention each patch receives"
    console.print(f"dist px: the heads' mean attention distance over the patches; roles as a "
                  f"vision transformer's (docs/vision.md); --json has every head; "
                  f"tower-layer-L.png draws {drawn}.", highlight=False)  # fmt: skip


def print_show(console: Console, result: Any, scale: str = "absolute") -> None:
    """What `attnviz show` prints of its result (`pipelines.show.ShowResult`): the header,
    then the query's heads, the per-layer measure's details, the layers × heads map or the
    chosen heads' details; one head's heatmap; what removing heads changed."""
    att, layers, heads = result.attention, result.layers, result.heads
    print_header(console, att)
    if result.continuation is not None:
        print_continuation(console, result.continuation)
    if att.layout is not None and any(att.weights.strides):  # held (not a long text's stand-in)
        print_picture_shares(console, att)
    if result.cross is not None:
        print_picture_shares(console, result.cross)
    if result.tower is not None:
        print_tower(console, result.tower)
    if result.query is not None:
        print_query(console, att, result.query, layers, heads)
    elif result.vision:
        print_pictures(console, result.vision, att.measure)
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
