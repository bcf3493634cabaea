"""Writing a report: report.md, heads.csv/json, the treebank's tables and the figures."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import (
    METRICS,
    PROBES,
)
from attnviz.analysis.roles import (
    ROLES,
)
from attnviz.core.layer_map import STACK_TITLES
from attnviz.outputs.files import clear_previous, prepare_dir, write_done, write_text_atomic
from attnviz.outputs.numbers import column

if TYPE_CHECKING:
    import numpy as np

    from attnviz.analysis.linguistics import CorefResult, Linguistics, SyntaxResult, SyntaxRow
    from attnviz.outputs.figures import Style

from attnviz.analysis.metrics import METRIC_HELP
from attnviz.analysis.report import Report, Seq2SeqReport


def write_report(report: Report, out: Path, style: Style) -> list[Path]:
    """Write report.md, heads.csv, heads.json and the figures into `out`, then `done.json`
    listing them; the files of an earlier report into `out` are removed first."""
    prepare_dir(out)
    clear_previous(out)
    written = []
    rows = [{**row, "linguistic_roles": ";".join(row["linguistic_roles"])} for row in report.rows()]
    written.append(write_text_atomic(out / "heads.csv", csv_text(rows)))
    written.append(
        write_text_atomic(
            out / "heads.json", json.dumps(report.as_dict(), ensure_ascii=False, indent=1)
        )
    )
    written += _write_grids(report, out, style)
    importance_files = _write_importance(report, out, style)
    written += importance_files.values()
    examples = _write_examples(report, out, style)
    written += examples.values()
    sections: list[str] = []
    if report.linguistics is not None:
        sections = _write_linguistics(report, report.linguistics, out, style, written)
    sections = _importance_section(report, importance_files) + sections
    markdown = _markdown(report, examples, style, sections)
    written.append(write_text_atomic(out / "report.md", markdown))
    write_report_done(out, report.info.name, style, written)
    return written


def write_report_done(out: Path, model: str, style: Style, written: list[Path]) -> None:
    """done.json of a report in `out`: the model, the figures' style and the files written."""
    files = [str(path.relative_to(out.parent)) for path in written]
    write_done(out, {"model": model, **asdict(style)}, {"files": files})


def _write_grids(report: Report, out: Path, style: Style, stack: str = "") -> list[Path]:
    """A layers × heads figure per metric and probe, and the role map; an encoder-decoder
    model's `stack` goes into their names (`metric-encoder-previous.png`) and titles."""
    from attnviz.outputs.figures import MetricGrid, role_map_figure, save_figure

    ext, prefix = style.fmt, _prefix(stack)
    layers, heads = list(report.layers), list(report.heads)
    title = f"{report.info.name} · {stack}" if stack else report.info.name
    written = []
    grid = MetricGrid(layers, heads, title, style)
    means = {name: report.chosen_means(m) for m, name in enumerate(METRICS)}
    for name, scores in {**means, **_probe_scores(report)}.items():
        path = out / f"metric-{prefix}{name}.{ext}"
        written.append(grid.save(scores, name, METRIC_HELP[name], path))
    grid.close()
    role_map = role_map_figure(report.roles, layers, heads, title, style)
    written.append(save_figure(role_map, out / f"roles{_suffix(stack)}.{ext}", style))
    return written


def _prefix(stack: str) -> str:
    return f"{stack}-" if stack else ""


def _suffix(stack: str) -> str:
    return f"-{stack}" if stack else ""


def _write_examples(report: Report, out: Path, style: Style, stack: str = "") -> dict[str, Path]:
    """The strongest head of each role, drawn on the report's example text, by role."""
    from attnviz.outputs.figures import HeadFigure, Labels, head_title

    examples: dict[str, Path] = {}
    labels = Labels.of(report.example)
    head_fig = HeadFigure(labels, style)
    for role, heads in report.strongest(1).items():
        best = heads[0]
        grid = report.example.pattern(best.layer, best.head)  # (T, T)
        slug = role.replace(" ", "-")
        name = f"example-{_prefix(stack)}{slug}-layer-{best.layer:02d}-head-{best.head:02d}"
        title = head_title(labels, best.layer, best.head, grid)
        examples[role] = head_fig.save(grid, title, out / f"{name}.{style.fmt}")
    head_fig.close()
    return examples


def write_seq2seq_report(report: Seq2SeqReport, out: Path, style: Style) -> list[Path]:
    """An encoder-decoder model's report.md, heads.csv and heads.json (a `stack` column) and
    figures per stack (`roles-encoder.png`, `metric-cross-monotone.png`, …) into `out`, then
    `done.json`; the files of an earlier report into `out` are removed first."""
    from attnviz.analysis.alignment import ALIGNMENT
    from attnviz.outputs.figures import MetricGrid

    prepare_dir(out)
    clear_previous(out)
    rows = report.rows()
    columns = list(dict.fromkeys(key for row in rows for key in row))  # stack, layer, head, …
    written = [
        write_text_atomic(out / "heads.csv", csv_text(rows, columns)),
        write_text_atomic(
            out / "heads.json", json.dumps(report.as_dict(), ensure_ascii=False, indent=1)
        ),
    ]
    sections: list[str] = []
    for stack, stack_report in report.stacks.items():
        written += _write_grids(stack_report, out, style, stack)
        examples = _write_examples(stack_report, out, style, stack)
        written += examples.values()
        sections += [f"## {STACK_TITLES[stack]}", ""]
        sections += [
            f"Means over **{stack_report.queries} non-special query tokens** of the "
            f"{'sources' if stack == 'encoder' else 'targets'}.",
            "",
        ]
        sections += _special_lines(stack_report)
        sections += _roles_lines(stack_report, examples, style, stack)
        sections += ["### Every head's metrics", ""]
        sections += _metric_figures(list(METRICS), style.fmt, stack)
    cross = report.cross
    layers, heads = list(range(cross.info.n_layers)), list(range(cross.info.n_heads))
    grid = MetricGrid(layers, heads, f"{report.info.name} · cross", style)
    by = [("", cross.means, "")]
    if cross.norm_means is not None:
        by.append(("_norm", cross.norm_means, ", by norm ‖α f(x)‖"))
    for suffix, means, how in by:
        for a, name in enumerate(ALIGNMENT):
            path = out / f"metric-cross-{name}{suffix}.{style.fmt}"
            written.append(grid.save(means[a], name + suffix, ALIGNMENT[name] + how, path))
    grid.close()
    sections += _cross_lines(report, style)
    markdown = _seq2seq_markdown(report, sections)
    written.append(write_text_atomic(out / "report.md", markdown))
    write_report_done(out, report.info.name, style, written)
    return written


def _cross_lines(report: Seq2SeqReport, style: Style, shown: int = 5) -> list[str]:
    """report.md's cross-attention section: the metrics, the most monotone heads, figures."""
    from attnviz.analysis.alignment import ALIGNMENT

    lines = [
        f"## {STACK_TITLES['cross']}",
        "",
        "Each target token's *alignment* is the non-special source token it attends to most.",
        "*monotone*: the share of non-special target tokens (the first left out) whose",
        "alignment is at or after the previous one's (1: the head reads the source in order;",
        "0: backwards). *source_eos*: the mean weight non-special target tokens give the",
        "source's last special token (its EOS), where heads rest when they find nothing.",
        "The `_norm` columns measure the same on ‖α f(x)‖, each row as shares: what each",
        "source token passes on, not only where the head looks (Kobayashi et al. 2020 found",
        "norms align words better than weights).",
        "",
    ]
    rows = sorted(report.cross.rows(), key=lambda r: -(r["monotone"] or 0.0))[:shown]
    names = [name for name in rows[0] if name not in ("layer", "head")] if rows else []
    lines += _table(
        ("head", *names),
        [(_head(r["layer"], r["head"]),
          *(f"{r[n]:.3f}" if r[n] is not None else "–" for n in names)) for r in rows],
    )  # fmt: skip
    lines += ["", f"The {len(rows)} most monotone heads; every head: heads.csv (`cross`).", ""]
    figures = list(ALIGNMENT)
    if report.cross.norm_means is not None:
        figures += [f"{name}_norm" for name in ALIGNMENT]
    return lines + _metric_figures(figures, style.fmt, "cross")


def _metric_figures(names: list[str], ext: str, stack: str = "") -> list[str]:
    lines = []
    for name in names:
        lines += [_figure(name, Path(f"metric-{_prefix(stack)}{name}.{ext}")), ""]
    return lines


def _seq2seq_markdown(report: Seq2SeqReport, sections: list[str]) -> str:
    from attnviz.analysis.alignment import ALIGNMENT

    info = report.info
    counts = ", ".join(f"{stack} {n_layers} layers × {n_heads} heads"
                       for stack, n_layers, n_heads in info.stacks)  # fmt: skip
    lines = [
        f"# What each attention head does: {info.name}",
        "",
        f"{info.classes()}, an encoder-decoder model: {counts}. It read **{report.sentences} "
        "source-target pairs**, the decoder with teacher forcing (its start token, then the "
        "target's tokens). The encoder's and decoder's self-attention get positional roles, "
        "metrics of each query's attention row a (a[j] is the weight query i gives key j); the "
        "cross-attention, how it aligns target tokens to source tokens.",
        "",
    ]
    if report.skipped:
        lines += [f"Skipped: {len(report.skipped)} pair(s) longer than the model takes.", ""]
    lines += sections
    lines += ["## Metrics", ""]
    definitions = [(n, METRIC_HELP[n]) for n in METRICS] + list(ALIGNMENT.items())
    lines += _table(("metric", "definition"), definitions)
    lines += ["", "Every number: heads.csv and heads.json (a row per stack, layer and head).", ""]
    return "\n".join(lines)


def _importance_file(name: str, ext: str) -> str:
    """importance.png for ablation (or the only method), importance-gradient.png beside it."""
    return f"{name.replace('_', '-')}.{ext}"


def _write_importance(report: Report, out: Path, style: Style) -> dict[str, Path]:
    """The importance maps, by column name (see `Report.importances`)."""
    import numpy as np

    from attnviz.outputs.figures import importance_figure, save_figure

    written = {}
    layers, heads = list(report.layers), list(report.heads)
    pick = np.ix_(layers, heads)
    found = report.importances()
    for name, result in found.items():
        file = _importance_file("importance" if len(found) == 1 else name, style.fmt)
        title = f"Head importance by {result.how} — {report.info.name}"
        figure = importance_figure(result.scores[pick], result.ranks()[pick], layers, heads,
                                   title, result.measure, style)  # fmt: skip
        written[name] = save_figure(figure, out / file, style)
    return written


def head_label(report: Report, layer: int, head: int) -> str:
    """A head with its role and its importance ranks: "L18 H6 induction · rank 1 by ablation"."""
    role = next((r.role for r in report.roles if (r.layer, r.head) == (layer, head)), None)
    label = f"L{layer} H{head}" + (f" {role}" if role else "")
    for result in report.importances().values():
        rank = int(result.ranks()[layer, head])
        if rank:
            label += f" · rank {rank} by {result.method}"
    return label


def _importance_section(report: Report, files: dict[str, Path], shown: int = 15) -> list[str]:
    """report.md's "Which heads matter": the objective, the maps, the heads ranked."""
    found = report.importances()
    if not found:
        return []
    first = next(iter(found.values()))
    lines = [
        "## Which heads matter",
        "",
        f"Objective, over the report's {first.texts} texts: {first.objective}. With nothing "
        + (
            "removed it is 0, by definition."
            if first.objective_name == "embedding-cosine"
            else f"removed it is **{first.clean:.4g} {first.unit}**."
        ),
        "",
    ]
    for result in found.values():
        if result.method == "gradient":
            lines.append(
                "- *gradient*: a gate ξ = 1 multiplies each head's output; the score is "
                "|∂ objective / ∂ ξ| over all the texts (Michel et al. 2019), one backward pass "
                "per batch."
            )
        else:
            what = "its mean over the texts' tokens" if result.ablation == "mean" else "0"
            lines.append(
                f"- *{result.how}*: each head's output (its slice of W_O's input) is set to "
                f"{what} at every position, one head at a time; the score is how much the "
                "objective rises (below 0: the model does better without the head)."
            )
    lines.append("")
    spearman = report.spearman()
    if spearman is not None:
        lines += [f"Spearman correlation of the two rankings: **{spearman:.2f}**.", ""]
    for name, path in files.items():
        lines += [_figure(f"importance by {found[name].how}", path), ""]
    roles = {(r.layer, r.head): r.role for r in report.roles}
    header = ("rank", "head", "role") + tuple(f"{r.how} ({r.unit})" for r in found.values())
    rows = []
    top = first.top(shown)
    columns = [column([r.scores[layer, head] for layer, head, _ in top]) for r in found.values()]
    for (layer, head, _), scores in zip(top, zip(*columns)):
        rows.append((first.ranks()[layer, head], f"layer {layer} · head {head}",
                     roles.get((layer, head), ""), *scores))  # fmt: skip
    lines += [f"The {len(rows)} most important heads by {first.how}:", ""]
    lines += _table(header, rows)
    columns = ", ".join(f"`{name}`, `{name}_rank`" for name in found)
    lines += ["", f"Every head's score and rank: {columns} in heads.csv and heads.json.", ""]
    return lines


def _probe_scores(report: Report) -> dict[str, np.ndarray]:
    """Each probe's scores over the chosen layers × heads (none for encoders)."""
    import numpy as np

    if report.probes is None:
        return {}
    pick = np.ix_(report.layers, report.heads)
    return {name: report.probes.scores[p][pick] for p, name in enumerate(PROBES)}


def csv_text(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A CSV table of `rows` with `columns` (default: the first row's keys); a row without
    one of them leaves its cell empty."""
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=columns or list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def _offset(k: int) -> str:
    """A fixed relative offset in words: 'previous word (−1)', '3 words after (+3)'."""
    if k == 0:
        return "the word itself (0)"
    where = "after" if k > 0 else "before"
    if abs(k) == 1:
        return f"{'next' if k > 0 else 'previous'} word ({k:+d})"
    return f"{abs(k)} words {where} ({k:+d})"


EXAMPLE_RELATIONS = 4  # relations drawn on an example sentence
SYNTAX_FIELDS = ("relation", "direction", "layer", "head", "accuracy", "n", "baseline",
                 "baseline_accuracy")  # fmt: skip


def _write_linguistics(
    report: Report, ling: Linguistics, out: Path, style: Style, written: list[Path]
) -> list[str]:
    """Write syntax.csv, syntax.json, coreference.csv and their figures into `out`; return
    the report.md sections: Syntax, Coreference and the heads named for them."""
    lines = []
    if ling.notes:
        lines += ["## The treebank", ""] + [f"- {note}" for note in ling.notes] + [""]
    lines += ["## Syntax", ""]
    if ling.syntax is None:
        reason = (
            "no arc joins two words the model saw"
            if ling.has_syntax
            else "the treebank has no syntax (its HEAD column is `_`)"
        )
        lines += [f"Not measured: {reason}.", ""]
    else:
        lines += _syntax_section(report, ling, ling.syntax, out, style, written)
    lines += ["## Coreference", ""]
    if ling.coreference is None:
        reason = (
            "no mention has an earlier mention of its entity in its sentence"
            if ling.has_coreference
            else "the treebank has no coreference (no `Entity=` in MISC)"
        )
        lines += [f"Not measured: {reason}.", ""]
    else:
        lines += _coreference_section(report, ling, ling.coreference, out, style, written)
    named = [(r, report.linguistic_roles(r.layer, r.head)) for r in report.roles]
    lines += [
        "## Heads named for syntax and coreference",
        "",
        f"A head is named for a relation when its accuracy beats the relation's baseline by at "
        f"least {100 * ling.margin:.0f} percentage points (--margin), on relations with at "
        f"least {ling.min_count} arcs (mentions for coreference): `syntax:REL` for "
        "dependent → head, `syntax:REL:h2d` for head → dependent.",
        "",
    ]
    rows = [(_head(r.layer, r.head), r.role, ", ".join(n)) for r, n in named if n]
    lines += _table(("head", "positional role", "named for"), rows) if rows else ["No head."]
    return lines + [""]


def _head(layer: int, head: int) -> str:
    return f"layer {layer} · head {head}"


def _syntax_section(
    report: Report,
    ling: Linguistics,
    syntax: SyntaxResult,
    out: Path,
    style: Style,
    written: list[Path],
) -> list[str]:
    from attnviz.analysis.linguistics import SHORT_DIRECTIONS
    from attnviz.outputs.figures import relation_figure, save_figure

    layers, heads = list(report.layers), list(report.heads)
    rows = syntax.table(layers, heads)
    header = ",".join(SYNTAX_FIELDS) + "\n"
    table = csv_text([asdict(r) for r in rows]) if rows else header
    written.append(write_text_atomic(out / "syntax.csv", table))
    written.append(write_text_atomic(out / "syntax.json", json.dumps(syntax.as_dict(), indent=1)))
    lines = [
        "For every arc of the treebank (dependent d, head h), a head is right when its",
        "most-attended word from d is h (*dep → head*) or from h is d (*head → dep*); words",
        "only, special tokens excluded. The baseline is the best fixed offset for the relation",
        f"on the same arcs. Relations with at least {ling.min_count} arcs, the best head of each:",
        "",
    ]
    lines += _table(
        ("relation", "direction", "best head", "accuracy", "baseline", "baseline accuracy", "arcs"),
        [
            (r.relation, SHORT_DIRECTIONS[r.direction], _head(r.layer, r.head),
             f"{r.accuracy:.1%}", _offset(r.baseline), f"{r.baseline_accuracy:.1%}", r.n)
            for r in rows
        ],
    )  # fmt: skip
    left_out = [
        f"{rel} ({n})" for rel, n in zip(syntax.relations, syntax.arcs) if n < ling.min_count
    ]
    if left_out:
        lines += ["", f"Left out, fewer than {ling.min_count} arcs: {', '.join(left_out)}."]
    lines += [""]
    counted = syntax.counted()
    if counted:
        accuracy = syntax.accuracy[:, counted][:, :, layers][:, :, :, heads]  # (2, R, l, h)
        labels = [f"{syntax.relations[r]} ({int(syntax.arcs[r])})" for r in counted]
        title = f"Syntax: accuracy of every head per relation — {report.info.name}"
        panels = ("dependent → head", "head → dependent")
        figure = relation_figure(accuracy, labels, panels, layers, heads, title, style)
        path = save_figure(figure, out / f"syntax-heads.{style.fmt}", style)
        written.append(path)
        lines += [_figure("heads × relations", path), ""]
    return lines + _syntax_examples(rows, ling, out, style, written)


def _syntax_examples(
    rows: list[SyntaxRow], ling: Linguistics, out: Path, style: Style, written: list[Path]
) -> list[str]:
    """The best head of the relations it beats the baseline on most, on a short sentence."""
    from attnviz.analysis.linguistics import SHORT_DIRECTIONS, word_positions
    from attnviz.outputs.figures import HeadFigure, Labels
    from attnviz.outputs.files import slug

    best: dict[str, SyntaxRow] = {}
    for row in sorted(rows, key=lambda r: -r.gain):
        if row.relation in ling.examples:
            best.setdefault(row.relation, row)
    chosen = list(best.values())[:EXAMPLE_RELATIONS]
    if not chosen:
        return []
    lines = [
        "### The best heads on an example",
        "",
        "The relation's arcs are outlined in red: the cell (dependent, head) for dep → head,",
        "(head, dependent) for head → dep.",
        "",
    ]
    for row in chosen:
        att, sentence = ling.examples[row.relation]
        positions = word_positions(att, len(sentence.words))  # word -> its row in the view
        n = len(positions)
        arcs = [
            (int(positions[d]), int(positions[h]))
            for d, (h, rel) in enumerate(zip(sentence.heads or (), sentence.relations or ()))
            if rel == row.relation and 0 <= h < n and d < n
        ]
        marks = tuple(arcs if row.direction == "dependent-to-head" else [(h, d) for d, h in arcs])
        grid = att.weights[row.layer, row.head]  # (W, W)
        direction = SHORT_DIRECTIONS[row.direction]
        title = (
            f"{row.relation}, {direction}: {_head(row.layer, row.head)} · right on "
            f"{row.accuracy:.0%} of {row.n} arcs"
        )
        name = f"syntax-{slug(row.relation)}-layer-{row.layer:02d}-head-{row.head:02d}.{style.fmt}"
        figure = HeadFigure(Labels.of(att), style)
        written.append(figure.save(grid, title, out / name, marks))
        figure.close()
        lines += [f"**{row.relation}** ({direction})", "", _figure(row.relation, out / name), ""]
    return lines


def _coreference_section(
    report: Report,
    ling: Linguistics,
    coreference: CorefResult,
    out: Path,
    style: Style,
    written: list[Path],
) -> list[str]:
    import numpy as np

    from attnviz.outputs.figures import MetricGrid

    layers, heads = list(report.layers), list(report.heads)
    per_head = [
        {"layer": layer, "head": head, "accuracy": float(coreference.accuracy[layer, head]),
         "n": coreference.mentions}
        for layer in layers for head in heads
    ]  # fmt: skip
    written.append(write_text_atomic(out / "coreference.csv", csv_text(per_head)))
    grid = MetricGrid(layers, heads, report.info.name, style)
    path = out / f"coreference.{style.fmt}"
    help_text = (
        "most-attended earlier word is an antecedent; nearest-mention baseline "
        f"{coreference.baseline_accuracy:.2f}"
    )
    written.append(grid.save(coreference.accuracy[np.ix_(layers, heads)], "coreference",
                             help_text, path))  # fmt: skip
    grid.close()
    top = sorted(per_head, key=lambda r: -r["accuracy"])[:3]
    lines = [
        f"**{coreference.mentions} mentions** have an antecedent (an earlier mention of the",
        "same entity in the sentence). A head is right when the mention's head word's",
        "most-attended earlier word is the head word of one of them. Baseline, the nearest",
        f"earlier mention: **{coreference.baseline_accuracy:.1%}**.",
        "",
    ]
    lines += _table(
        ("head", "accuracy", "mentions"),
        [(_head(r["layer"], r["head"]), f"{r['accuracy']:.1%}", r["n"]) for r in top],
    )
    if coreference.mentions < ling.min_count:
        lines += ["", f"Fewer than {ling.min_count} mentions (--min-count): too few to name a "
                  "head for coreference."]  # fmt: skip
    return lines + ["", _figure("coreference accuracy", path), ""]


def _cell(value: object) -> str:
    """A Markdown table cell: pipes escaped, so `|i − j|` stays inside its cell."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    """A Markdown table, every cell escaped."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _figure(alt: str, path: Path) -> str:
    """An embedded image; a PDF, which Markdown viewers cannot embed, as a link."""
    if path.suffix == ".pdf":
        return f"[{alt} (PDF)]({path.name})"
    return f"![{alt}]({path.name})"


def _markdown(report: Report, examples: dict[str, Path], style: Style, sections: list[str]) -> str:
    info = report.info
    ext = style.fmt
    every = len(report.layers) == info.n_layers and len(report.heads) == info.n_heads
    chosen = (
        ""
        if every
        else (
            f" This report covers layers {', '.join(map(str, report.layers))} and heads "
            f"{', '.join(map(str, report.heads))}."
        )
    )
    lines = [
        f"# What each attention head does: {info.name}",
        "",
        f"{info.classes()}, {info.n_layers} layers × {info.n_heads} heads. Metrics are means "
        f"over **{report.queries} non-special query {report.unit}s** of **{report.sentences} "
        f"sentences**; each is a quantity of one query's attention row a (a[j] is the weight "
        f"query i gives key j).{chosen}",
        "",
    ]
    if report.skipped:
        lines += [f"Skipped: {len(report.skipped)} sentence(s) longer than the model takes.", ""]
    lines += ["## Roles", ""] + _roles_lines(report, examples, style)
    probed = list(_probe_scores(report))
    if report.probes is not None:
        probes = report.probes
        lines += [
            "## Decoder probes: induction and duplicate-token heads",
            "",
            f"{probes.sequences} sequences of {probes.length} random tokens, each repeated once "
            f"after BOS (seed {probes.as_dict()['seed']}): [BOS] t_1 … t_n t_1 … t_n. For each "
            "token of the second repeat, *induction* is its attention to the token right after "
            "its earlier occurrence, *duplicate* its attention to the earlier occurrence itself "
            "(means over the second repeat). The model's next-token loss falls from "
            f"**{probes.loss_first:.2f} nats** on the first repeat to "
            f"**{probes.loss_second:.2f} nats** on the second: the drop is in-context copying, "
            "the work of induction heads.",
            "",
        ]
    lines += _repeats_lines(report)
    lines += _contributions_lines(report)
    lines += _reach_lines(report)
    lines += sections
    lines += ["## Metrics", ""]
    names = [*METRICS, *probed]
    lines += _table(("metric", "definition"), [(n, METRIC_HELP[n]) for n in names])
    lines += [""] + _metric_figures(names, ext)
    lines += ["Every number: `heads.csv` and `heads.json` (one row per layer and head).", ""]
    return "\n".join(lines)


def _repeats_lines(report: Report) -> list[str]:
    """report.md's induction and duplicate-token scores on the corpus's own repeated tokens
    (a decoder's), beside the probe's."""
    if not report.info.causal:
        return []
    import numpy as np

    induction, duplicate = report.repeat_queries
    head = ["## Induction on these texts", ""]
    if report.repeats is None:
        said = f"{induction} queries repeat an earlier token of their text (fewer than 3): "
        return [*head, said + "heads.csv's `induction_texts` and `duplicate_texts` are empty.", ""]
    pick = np.ix_(report.layers, report.heads)
    scores = report.repeats[0][pick]
    best = np.dstack(np.unravel_index(np.argsort(-scores, axis=None)[:5], scores.shape))[0]
    listed = ", ".join(f"L{report.layers[r]} H{report.heads[c]} ({scores[r, c]:.2f})"
                       for r, c in best)  # fmt: skip
    return [
        *head,
        "The probe's recipe on the corpus's own repeated tokens: a query whose token occurred "
        "earlier in its text gives *induction_texts* its weight on the token right after each "
        "earlier occurrence and *duplicate_texts* its weight on the earlier occurrences "
        f"(tokens compared by label; {induction} queries counted for induction, {duplicate} "
        "for duplicate, pooled over the texts; queries with no earlier occurrence left out). "
        f"Highest induction_texts: {listed}. The role map's induction role is the probe's "
        "(its legend says so); both are in heads.csv and heads.json.",
        "",
    ]


def _reach_lines(report: Report) -> list[str]:
    """report.md's sinks and reach: per layer, the share of sink heads and how far the
    heads look (`analysis.reach`)."""
    from attnviz.analysis.reach import SINK_ALPHA

    reach = report.reach
    if reach is None:
        return []
    layers = list(report.layers)
    shares = reach.sink_head_share
    rows = [
        (
            layer,
            f"{shares[layer]:.0%}",
            f"{reach.first_token_alpha[layer].mean():.2f}",
            f"{reach.distance_mean[layer].mean():.1f}",
            f"{reach.distance_p90[layer].mean():.1f}",
        )
        for layer in layers
    ]
    return [
        "## Sinks and reach",
        "",
        f"**{reach.sink_share:.0%}** of the heads are attention sinks: they give the first "
        f"token (BOS, [CLS]) more than {SINK_ALPHA} of their attention, averaged over every "
        "query (Gu et al. 2025's α₁). Per layer: the share of sink heads, and the heads' "
        "means of α₁, of the mean distance Σ_k a_ik |i − k| and of the distance within "
        "which 90 % of the attention lies (tokens):",
        "",
        *_table(("layer", "sink heads", "α₁", "distance", "90 % within"), rows),
        "",
        "Each head's figures: `first_token_alpha`, `distance_mean` and `distance_p90` in "
        "heads.csv and heads.json; `sink_head_share` per layer in heads.json.",
        "",
    ]


def _special_lines(report: Report) -> list[str]:
    """The share special tokens take, by weight and by norm, over the chosen heads."""
    import numpy as np

    if report.special is None:
        return []
    by_weight, by_norm = (report.special[k][np.ix_(report.layers, report.heads)] for k in (0, 1))
    if np.isnan(by_weight).all():
        return []
    norm = (
        f"**{np.mean(by_norm):.1%}** by norm ‖α f(x)‖"
        if not np.isnan(by_norm).any()
        else "by norm not measured (the model's value weights cannot be read)"
    )
    return [
        f"Special tokens ([CLS], [SEP], BOS…) take **{np.mean(by_weight):.1%}** of the attention "
        f"weight of non-special queries and {norm} (Kobayashi et al. 2020: a key with a large "
        "weight may pass on a short vector): means over the heads and the texts; each head's in "
        "`special_weight_share` and `special_norm_share`.",
        "",
    ]


def _contributions_lines(report: Report) -> list[str]:
    """report.md's section on what tokens take from each other: the special shares and each
    layer's mixing ratios (Kobayashi et al. 2021), with what each ratio shows."""
    lines = _special_lines(report)
    if report.mixing is None:
        if report.mixing_left_out is not None:
            lines += [f"The mixing ratios are left out: {report.mixing_left_out}.", ""]
        return ["## How much each token takes from the others", "", *lines] if lines else []
    layers = list(report.layers)
    kinds = range(report.mixing.shape[0])  # contributions.MIXING
    rows = [(layer, *(f"{report.mixing[k, layer]:.1%}" for k in kinds)) for layer in layers]
    if len(layers) > 1:
        rows.append(("all", *(f"{report.mixing[k, layers].mean():.1%}" for k in kinds)))
    lines += [
        "A layer's *mixing ratio* says how much of a token's update comes from other tokens, "
        "as Kobayashi et al. (2021, §5) define it: r_i = ‖Σ_{j≠i} v_ij‖ / (‖Σ_{j≠i} v_ij‖ + "
        "‖v_ii‖), the length of what the others pass on against that and the token's own; a "
        "mean over every token of every text (special ones too):",
        "",
        *_table(
            (
                "layer",
                "Attn-W (weights)",
                "Attn-N (norms)",
                "AttnRes-N (+ residual)",
                "AttnResLn-N (+ residual, normalisation)",
            ),
            rows,
        ),  # fmt: skip
        "",
        "- *Attn-W* (1 − the heads' mean α_ii) shows where the heads look: how much of their "
        "attention goes to tokens other than the query itself.",
        "- *Attn-N* (v_ij = Σ_h α^h_ij f^h(x_j)) shows what the block's output is made of: each "
        "token weighed by the vector it passes on, not only by where the heads look.",
        "- *AttnRes-N* adds the residual stream to the token's own vector, *AttnResLn-N* puts "
        "every vector through the normalisation after the block (linearised): how much of the "
        "token's representation after the layer's attention comes from other tokens at all; "
        "the rest is carried by its own residual stream.",
        "",
        "heads.json has the four per layer: `mixing_ratio` (`weights`, `norm`, "
        "`norm_residual`, `norm_residual_layernorm`).",
        "",
    ]
    return ["## How much each token takes from the others", "", *lines]


def _roles_lines(
    report: Report, examples: dict[str, Path], style: Style, stack: str = ""
) -> list[str]:
    """report.md's roles: the role map, the rule and thresholds, the strongest heads of each
    role, and those heads on the example text (an encoder-decoder model's `stack`'s)."""
    lines = [_figure("role map", Path(f"roles{_suffix(stack)}.{style.fmt}")), ""]
    lines += [
        "A head takes the first of these roles whose score reaches its threshold; among the",
        "single-target roles (previous … punctuation) the one cleared by the widest margin wins;",
        "a head that reaches none is *mixed*.",
        "",
    ]
    lines += _table(
        ("role", "score (metric)", "threshold"),
        [(name, role.metric, f"{report.thresholds.values[name]:.2f}")
         for name, role in ROLES.items()],
    )  # fmt: skip
    lines += ["", "### Strongest heads of each role", ""]
    lines += _table(
        ("role", "head", "score"),
        [(role, head_label(report, h.layer, h.head) if report.importances()
          else f"layer {h.layer} · head {h.head}", f"{h.score:.3f}")
         for role, heads in report.strongest(3).items() for h in heads],
    )  # fmt: skip
    counts: dict[str, int] = {}
    for role in report.roles:
        counts[role.role] = counts.get(role.role, 0) + 1
    lines += ["", "Heads per role: " + ", ".join(f"{r} {n}" for r, n in sorted(counts.items())), ""]
    if examples:
        scale = "each head scaled to its max" if style.scale == "head" else "colour 0–1"
        example = report.example
        text = example.target if example.stack == "decoder" else example.text
        lines += [
            "### The strongest head of each role on an example",
            "",
            f"Example: “{text}”. Rows are queries, columns keys; {scale}.",
            "",
        ]
        for role, path in examples.items():
            lines += [f"**{role}**", "", _figure(role, path), ""]
    return lines
