"""`attnviz compare` in the terminal: what was compared, how far each head moved, and one
token's view in both."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from attnviz.analysis.picture_compare import grid_of
from attnviz.outputs.terminal.common import print_divergence_map, print_written, target_pairs

if TYPE_CHECKING:
    from attnviz.analysis.compare import Comparison, Moved, QueryMoves
    from attnviz.analysis.importance import Importance


def print_comparison_header(console: Console, comparison: Comparison, models: str) -> None:
    """What was compared: the model(s), A and B (or how many pairs), and what has no partner."""
    pairs = comparison.pairs
    console.print(f"[bold]Compare[/] ({models}, {comparison.a.unit}s)", highlight=False)
    if len(pairs) == 1:
        for side, att in zip("AB", pairs[0].texts or (comparison.a, comparison.b)):
            tokens = list(att.tokens)
            c = att.continuation  # a decoder's --generate: ▸ where what it wrote starts
            said = f" ({c.describe(att.unit)})" if c is not None else ""
            if c is not None:
                tokens.insert(c.start, "▸")
            if len(tokens) > _SHOWN_TOKENS:  # a long text: its first and last tokens
                more = f"… {len(tokens) - _SHOWN_TOKENS:,} more (--json lists all) …"
                tokens = [*tokens[: _SHOWN_TOKENS - 20], more, *tokens[-20:]]
            console.print(f"  {side}: {' '.join(tokens)}{said}", highlight=False, soft_wrap=True)
    else:
        console.print(f"  {len(pairs)} pairs; the figures are means over them", highlight=False)
    for number, pair in enumerate(pairs, start=1):
        note = pair.alignment.note(*pair.tokens)
        if note:
            where = f"pair {number}: " if len(pairs) > 1 else ""
            console.print(f"  [yellow]{where}{note}[/]", highlight=False, soft_wrap=True)


_SHOWN_TOKENS = 80  # tokens of A and of B printed at most (as show): a long text's first and last


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
                      target_pairs(m.top_a), target_pairs(m.top_b))  # fmt: skip
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
                      target_pairs(query.top_a[key]), target_pairs(query.top_b[key]))  # fmt: skip
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


def print_picture_compare(console: Console, found: Any, top_k: int = 2) -> None:
    """What `attnviz compare` prints of two pictures and a question, or a picture and two
    (`pipelines.compare_questions.QuestionCompareResult`): what was read, the divergence map
    over the picture's cells, the picture's share by layer in A and in B, the heads that moved
    most with their top cells, and what was written."""
    import numpy as np

    c = found.comparison
    what = "two pictures, one question" if c.two_pictures else "one picture, two questions"
    console.print(f"[bold]Compare[/] ({found.model}, {what})", highlight=False)
    for side, s in zip("AB", (c.a, c.b)):
        answer = s.att.continuation
        said = f" → “{s.answer()}” ({answer.describe()})" if answer is not None else ""
        console.print(f"  {side}: {Path(s.picture).name} · “{s.prompt}”{said}", highlight=False,
                      soft_wrap=True)  # fmt: skip
    rows = "the answer's rows" if c.a.att.continuation is not None else "the prompt's last row"
    console.print(f"  {len(c.a.layout.cells())} image tokens ({grid_of(c.a.layout)}), cells "
                  f"paired by place; each side read over {rows}", highlight=False,
                  soft_wrap=True)  # fmt: skip
    console.print("How far each head's look over the picture moved: the Jensen–Shannon "
                  "divergence A→B (nats) between its mean rows over the cells, each "
                  "renormalised", highlight=False, soft_wrap=True)  # fmt: skip
    print_divergence_map(console, c.divergence, list(c.layers), "")
    console.print("The picture's share of the answer's attention, the mean of each layer's "
                  "heads", highlight=False, soft_wrap=True)  # fmt: skip
    shares = Table(box=None, padding=(0, 2, 0, 0))
    for name in ("layer", "A", "B", "B − A"):
        shares.add_column(name, justify="left" if name == "layer" else "right")
    for slot, layer in enumerate(c.layers):
        a, b = float(c.share_a[slot].mean()), float(c.share_b[slot].mean())
        shares.add_row(f"L{layer}", f"{a:.1%}", f"{b:.1%}", f"{b - a:+.1%}")
    console.print(shares)
    console.print("Heads that moved most (top cells: each cell's share of what the head gives "
                  "the picture's patches)", highlight=False, soft_wrap=True)  # fmt: skip
    moved = Table(box=None, padding=(0, 1, 0, 0))
    for name in ("head", "JS (nats)", "picture A → B", "top in A", "top in B"):
        moved.add_column(name, justify="right" if name == "JS (nats)" else "left", no_wrap=True)
    for layer, head, value in c.moved(found.top):
        slot = c.layers.index(layer)
        tops = []
        for s, cells in ((c.a, c.cells_a), (c.b, c.cells_b)):
            labels = s.layout.labels()
            names = [labels[index] for index in s.layout.cells()]
            row = cells[slot, head]
            order = np.argsort(-row, kind="stable")[:top_k]
            tops.append("  ".join(f"{names[i]} {row[i]:.2f}".replace("0.", ".", 1)
                                  for i in order))  # fmt: skip
        shares = f"{c.share_a[slot, head]:.0%} → {c.share_b[slot, head]:.0%}"
        moved.add_row(f"L{layer} H{head}", f"{value:.4f}", shares, *tops)
    console.print(moved)
    print_written(console, found.images, found.folder)
