"""`attnviz report` in the terminal: the heads' roles, induction on the texts, syntax and
coreference, importance, an encoder-decoder's alignment, a report over pictures, and one
over pictures and questions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attnviz.analysis.roles import EVERY_ROLE, MIXED, attention_kind, roles_for
from attnviz.core.layer_map import STACK_TITLES
from attnviz.outputs import numbers

if TYPE_CHECKING:
    from attnviz.analysis.picture_heads import QuestionReport
    from attnviz.analysis.report import CrossReport, Report
    from attnviz.analysis.vision_report import PictureReport


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


def print_seq2seq_report(console: Console, result: Any, shown: int = 5) -> None:
    """An encoder-decoder model's report (`analysis.report.Seq2SeqReport`): each
    self-attention stack's role map, then the most monotone cross-attention heads."""

    for stack, report in result.stacks.items():
        console.rule(STACK_TITLES[stack], align="left")
        print_report(console, report)
    console.rule(STACK_TITLES["cross"], align="left")
    print_alignment(console, result.cross, shown)


def print_picture_report(console: Console, report: PictureReport) -> None:
    """A report over pictures (`analysis.vision_report.PictureReport`): per layer, each
    head's mean attention distance in pixels coloured by its role, the layer's mean and its
    heads' mean CLS entropy; then the roles' rules and counts."""
    from attnviz.analysis.vision import GLOBAL_REACH, ROLE_LOOKS, ROLE_SHARE, ROLES

    grids = " or ".join(f"{rows} × {cols}" for rows, cols in report.grids)
    pictures = f"{report.pictures} picture{'s' * (report.pictures != 1)}"
    console.print(f"[bold]{report.info.name}[/] · {pictures} · {grids} patches of "
                  f"{report.patch} × {report.patch} px", highlight=False)  # fmt: skip
    if report.skipped:  # each said as a warning when it was skipped
        console.print(f"[yellow]note:[/] {len(report.skipped)} skipped, each said as it was "
                      "(heads.json lists them)", highlight=False)  # fmt: skip
    console.print("Mean attention distance per head (pixels), coloured by its role:")
    table = Table(box=None, padding=(0, 1, 0, 0))
    table.add_column("", style="bold")
    for head in report.heads:
        table.add_column(f"H{head}", justify="right", no_wrap=True)
    table.add_column("mean", justify="right", style="bold")
    if report.cls_entropy is not None:
        table.add_column("CLS entropy", justify="right")
    counts = dict.fromkeys(ROLES, 0)
    for slot, layer in enumerate(report.layers):
        cells = []
        for head in report.heads:
            role = report.role(layer, head)
            counts[role] += 1
            cells.append(Text(f"{report.distance[slot, head]:.1f}", style=ROLE_LOOKS[role][1]))
        chosen = list(report.heads)
        cells.append(f"{report.distance[slot, chosen].mean():.1f}")
        if report.cls_entropy is not None:
            cells.append(f"{report.cls_entropy[slot, chosen].mean():.2f}")
        table.add_row(f"L{layer}", *cells)
    console.print(table)
    legend = Text("heads: ")
    for role in (role for role in ROLES if counts[role]):
        legend.append(f"{role} {counts[role]}  ", style=ROLE_LOOKS[role][1])
    console.print(legend)
    console.print(
        f"[dim]sink: the patches give ≥ {ROLE_SHARE:.0%} to CLS, dist and registers; local: ≥ "
        f"{ROLE_SHARE:.0%} to their own and the 8 neighbouring patches; global: mean attention "
        f"distance ≥ {GLOBAL_REACH:.0%} of uniform attention's {report.uniform:.1f} px "
        f"({GLOBAL_REACH * report.uniform:.1f} px); "
        "each head's numbers per picture, averaged over the pictures (docs/vision.md)[/]",
        highlight=False,
    )


def print_question_report(console: Console, report: QuestionReport) -> None:
    """A report over pictures and questions (`analysis.picture_heads.QuestionReport`): per
    layer, each head's share of attention on the picture and the layer's mean patch entropy
    and top-k patch share; then the image tokens that draw attention whatever the question."""
    questions = f"{report.questions} question{'s' * (report.questions != 1)}"
    pictures = f"{report.pictures} picture{'s' * (report.pictures != 1)}"
    console.print(f"[bold]{report.info.name}[/] · {questions} about {pictures} · "
                  f"{report.answered} answered", highlight=False)  # fmt: skip
    console.print("The picture's share of the answer's attention per head:")
    table = Table(box=None, padding=(0, 1, 0, 0))
    table.add_column("", style="bold")
    for head in report.heads:
        table.add_column(f"H{head}", justify="right", no_wrap=True)
    table.add_column("mean", justify="right", style="bold")
    table.add_column("entropy", justify="right")
    table.add_column(f"top-{report.top_k}", justify="right")
    chosen = list(report.heads)
    for slot, layer in enumerate(report.layers):
        cells = [f"{report.share[slot, head]:.1%}" for head in report.heads]
        cells += [f"{report.share[slot, chosen].mean():.1%}",
                  f"{report.entropy[slot, chosen].mean():.2f}",
                  f"{report.top[slot, chosen].mean():.1%}"]  # fmt: skip
        table.add_row(f"L{layer}", *cells)
    console.print(table)
    sinks = [s for s in report.sinks if s.sink]
    if sinks:
        found = ", ".join(f"{s.picture} {s.label} ({s.least:.1f}×)" for s in sinks[:5])
        console.print(f"Visual sink tokens (≥ {report.sink_draw:g}× a uniform share of the "
                      f"picture's attention in every question): {found}",
                      highlight=False)  # fmt: skip
    else:
        console.print(f"No visual sink token: none drew ≥ {report.sink_draw:g}× a uniform "
                      "share of its picture's attention in every question (two or more a "
                      "picture); sinks.csv ranks the most drawn", highlight=False)  # fmt: skip
    console.print("[dim]entropy: the picture's part of each row over its patches, over "
                  f"ln(patches) (1: uniform); top-{report.top_k}: its {report.top_k} most "
                  "attended patches' part (docs/vision-language.md)[/]",
                  highlight=False)  # fmt: skip
