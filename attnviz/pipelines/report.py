"""`attnviz report`: what each head does over a corpus, as numbers, roles, figures and Markdown."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import (
    LOCAL_WINDOW,
    METRICS,
    PROBES,
    ROLE_METRICS,
    HeadRole,
    MetricSums,
    Thresholds,
    assign_roles,
)
from attnviz.errors import InputError, TextTooLongError
from attnviz.outputs.files import clear_previous, prepare_dir, write_done, write_text_atomic

if TYPE_CHECKING:
    import numpy as np

    from attnviz.analysis.linguistics import CorefResult, Linguistics, SyntaxResult, SyntaxRow
    from attnviz.analysis.probes import ProbeResult
    from attnviz.core.extract import Attention
    from attnviz.core.inputs import Sentences
    from attnviz.core.models import LoadedModel, ModelInfo
    from attnviz.core.treebank import Treebank
    from attnviz.outputs.figures import Style

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "samples" / "sentences.txt"

METRIC_HELP = {
    "previous": "a[i−1]: attention to the previous token",
    "next": "a[i+1]: attention to the next token",
    "self": "a[i]: attention to itself",
    "first": "a[0]: attention to the first token ([CLS], BOS, or a decoder's first token)",
    "separator": "Σ a[j] over special tokens after the first ([SEP], EOS)",
    "punctuation": "Σ a[j] over punctuation tokens",
    "local": f"Σ a[j] over non-special tokens with |i − j| ≤ {LOCAL_WINDOW}",
    "entropy": "−Σ a[j] ln a[j], in nats",
    "entropy_norm": "entropy / ln(keys the query can see); 1 means uniform",
    "distance": "Σ a[j] |i − j|: mean attention distance, in tokens",
    "confidence": "max_j a[j]: the largest weight",
    "induction": "repeated random tokens: a[token after the earlier occurrence]",
    "duplicate": "repeated random tokens: a[the earlier occurrence]",
}


@dataclass(frozen=True, eq=False)
class Report:
    """Per-head metric means over a corpus, the roles they give, and one example text."""

    info: ModelInfo
    unit: str
    sentences: int
    queries: int
    skipped: tuple[str, ...]
    means: np.ndarray  # (M, L, H), in the order of METRICS, every head of the model
    roles: tuple[HeadRole, ...]  # the chosen heads only
    thresholds: Thresholds
    example: Attention
    layers: tuple[int, ...]  # the layers and heads the report is about
    heads: tuple[int, ...]
    probes: ProbeResult | None = None  # causal models: induction and duplicate-token probes
    linguistics: Linguistics | None = None  # with --treebank: syntax and coreference

    def chosen_means(self, metric: int) -> np.ndarray:
        """One metric's means over the chosen layers × heads: (len(layers), len(heads))."""
        import numpy as np

        return self.means[metric][np.ix_(self.layers, self.heads)]

    def rows(self) -> list[dict[str, Any]]:
        """One row per head: layer, head, role, role score and every metric (pandas-ready)."""
        rows = []
        for role in self.roles:
            row: dict[str, Any] = {
                "layer": role.layer,
                "head": role.head,
                "role": role.role,
                "role_score": role.score,
                "linguistic_roles": self.linguistic_roles(role.layer, role.head),
            }
            for m, name in enumerate(METRICS):
                value = float(self.means[m, role.layer, role.head])
                row[name] = value if math.isfinite(value) else None
            if self.probes is not None:
                for p, name in enumerate(PROBES):
                    row[name] = float(self.probes.scores[p, role.layer, role.head])
            rows.append(row)
        return rows

    def linguistic_roles(self, layer: int, head: int) -> list[str]:
        """What annotated text names this head for (e.g. `syntax:det`); empty without it."""
        if self.linguistics is None:
            return []
        return self.linguistics.roles.get((layer, head), [])

    def strongest(self, per_role: int = 3) -> dict[str, list[HeadRole]]:
        """The heads with the highest scores for each role that some head has."""
        found: dict[str, list[HeadRole]] = {}
        for role in sorted(self.roles, key=lambda r: -(r.score or 0.0)):
            if role.role != "mixed":
                found.setdefault(role.role, []).append(role)
        return {name: heads[:per_role] for name, heads in found.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.info.as_dict(),
            "unit": self.unit,
            "sentences": self.sentences,
            "queries": self.queries,
            "skipped": list(self.skipped),
            "thresholds": self.thresholds.values,
            "layers": list(self.layers),
            "head_indices": list(self.heads),
            "probes": self.probes.as_dict() if self.probes is not None else None,
            "heads": self.rows(),
            "treebank": None
            if self.linguistics is None
            else self.linguistics.as_dict(list(self.layers), list(self.heads)),
        }


def report(
    sentences: Sentences,
    out: Path,
    style: Style,
    model: str | None = None,
    device: str = "auto",
    **options: Any,
) -> tuple[Report, list[Path]]:
    """Load the model, build the report over `sentences` and write it to `out`."""
    from attnviz.core.models import refuse_early

    refuse_early(model, options.get("layers"), options.get("heads"))
    prepare_dir(out)

    from attnviz.core.models import cached_model

    result = build_report(cached_model(model, device), sentences, **options)
    return result, write_report(result, out, style)


def build_report(
    loaded: LoadedModel,
    sentences: Sentences | Treebank,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    words: bool = False,
    thresholds: Thresholds | None = None,
    batch_size: int = 16,
    truncate: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    min_count: int = 100,
    margin: float = 0.1,
) -> Report:
    """Run every sentence through the model, summing head metrics as it goes (flat memory).

    Metrics are summed for every head (one vectorised pass); roles and files cover the
    chosen `layers` and `heads` (default: all). A treebank's sentences are read as its
    words, and its syntax and coreference are measured too (`attnviz.analysis.linguistics`).
    """
    from attnviz.analysis.linguistics import LinguisticSums
    from attnviz.core.extract import encode, encode_words, extract_many, view, word_view
    from attnviz.core.treebank import Treebank

    chosen_layers = loaded.info.pick_layers(layers)
    chosen_heads = loaded.info.pick_heads(heads)
    skipped: list[str] = []
    treebank = sentences if isinstance(sentences, Treebank) else None
    waiting: deque = deque()  # the treebank sentences whose attention is on its way

    def encoded():
        for sentence in sentences.items:
            try:
                if treebank:
                    encoded_words = encode_words(
                        loaded, sentence.words, sentence.space_after, sentence.text, truncate
                    )
                    waiting.append(sentence)  # before the yield: a batch may run right after
                    yield encoded_words
                else:
                    yield encode(loaded, sentence.text, truncate)
            except TextTooLongError as error:
                note = f"{sentences.source}, line {sentence.line}: skipped, {error}"
                skipped.append(note)
                if on_warning:
                    on_warning(note)

    sums = MetricSums()
    linguistic = LinguisticSums()
    changed: dict[str, int] = {}  # what encode_words had to do, sentences each
    example = None
    for att in extract_many(loaded, encoded(), batch_size):
        shown = view(att, words)
        sums.add(shown)
        if treebank:
            linguistic.add(shown if words else word_view(att), waiting.popleft())
            for note in att.notes:
                kind = (
                    "cut to the model's limit (--truncate); arcs and mentions past the cut left out"
                    if note.startswith("truncated")
                    else "had a word the tokenizer drops, given as its unknown token"
                )
                changed[kind] = changed.get(kind, 0) + 1
        example = example or shown
        if on_progress:
            on_progress(1)
    if example is None:
        raise InputError("no sentence fits the model: every one was too long (try --truncate)")
    means = sums.means()
    chosen = thresholds or Thresholds()
    probes = None
    if loaded.info.causal:
        from attnviz.analysis.probes import run_probes

        probes = run_probes(loaded)
    wanted = {(layer, head) for layer in chosen_layers for head in chosen_heads}
    found = assign_roles(means, chosen, probes.scores if probes is not None else None)
    roles = [r for r in found if (r.layer, r.head) in wanted]
    return Report(
        info=loaded.info,
        unit=example.unit,
        sentences=sums.sentences,
        queries=sums.queries,
        skipped=tuple(skipped),
        means=means,
        roles=tuple(roles),
        thresholds=chosen,
        example=example,
        layers=tuple(chosen_layers),
        heads=tuple(chosen_heads),
        probes=probes,
        linguistics=linguistic.result(
            treebank, min_count, margin, tuple(f"{n} sentence(s) {k}" for k, n in changed.items())
        )
        if treebank
        else None,
    )


def write_report(report: Report, out: Path, style: Style) -> list[Path]:
    """Write report.md, heads.csv, heads.json and the figures into `out`, then `done.json`
    listing them; the files of an earlier report into `out` are removed first."""
    from attnviz.outputs.figures import (
        HeadFigure,
        MetricGrid,
        head_title,
        role_map_figure,
        save_figure,
    )

    prepare_dir(out)
    clear_previous(out)
    written = []
    rows = [{**row, "linguistic_roles": ";".join(row["linguistic_roles"])} for row in report.rows()]
    written.append(write_text_atomic(out / "heads.csv", _csv(rows)))
    written.append(
        write_text_atomic(
            out / "heads.json", json.dumps(report.as_dict(), ensure_ascii=False, indent=1)
        )
    )
    ext = style.fmt
    layers, heads = list(report.layers), list(report.heads)
    grid = MetricGrid(layers, heads, report.info.name, style)
    for m, name in enumerate(METRICS):
        path = out / f"metric-{name}.{ext}"
        written.append(grid.save(report.chosen_means(m), name, METRIC_HELP[name], path))
    for name, scores in _probe_scores(report).items():
        path = out / f"metric-{name}.{ext}"
        written.append(grid.save(scores, name, METRIC_HELP[name], path))
    grid.close()
    role_map = role_map_figure(report.roles, layers, heads, report.info.name, style)
    written.append(save_figure(role_map, out / f"roles.{ext}", style))
    examples: dict[str, Path] = {}
    head_fig = HeadFigure(report.example, style)
    for role, heads in report.strongest(1).items():
        best = heads[0]
        grid = report.example.pattern(best.layer, best.head)  # (T, T)
        slug = role.replace(" ", "-")
        path = out / f"example-{slug}-layer-{best.layer:02d}-head-{best.head:02d}.{ext}"
        examples[role] = head_fig.save(grid, head_title(best.layer, best.head, grid), path)
        written.append(examples[role])
    head_fig.close()
    sections: list[str] = []
    if report.linguistics is not None:
        sections = _write_linguistics(report, report.linguistics, out, style, written)
    markdown = _markdown(report, examples, style, sections)
    written.append(write_text_atomic(out / "report.md", markdown))
    files = [str(path.relative_to(out.parent)) for path in written]
    write_done(out, {"model": report.info.name, **asdict(style)}, {"files": files})
    return written


def _probe_scores(report: Report) -> dict[str, np.ndarray]:
    """Each probe's scores over the chosen layers × heads (none for encoders)."""
    import numpy as np

    if report.probes is None:
        return {}
    pick = np.ix_(report.layers, report.heads)
    return {name: report.probes.scores[p][pick] for p, name in enumerate(PROBES)}


def _csv(rows: list[dict[str, Any]]) -> str:
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
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
    table = _csv([asdict(r) for r in rows]) if rows else header
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
    from attnviz.outputs.figures import HeadFigure
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
        figure = HeadFigure(att, style)
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
    written.append(write_text_atomic(out / "coreference.csv", _csv(per_head)))
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
        f"{info.architecture}, {info.n_layers} layers × {info.n_heads} heads. Metrics are means "
        f"over **{report.queries} non-special query {report.unit}s** of **{report.sentences} "
        f"sentences**; each is a quantity of one query's attention row a (a[j] is the weight "
        f"query i gives key j).{chosen}",
        "",
    ]
    if report.skipped:
        lines += [f"Skipped: {len(report.skipped)} sentence(s) longer than the model takes.", ""]
    lines += ["## Roles", "", _figure("role map", Path(f"roles.{ext}")), ""]
    lines += [
        "A head takes the first of these roles whose score reaches its threshold; among the",
        "single-target roles (previous … punctuation) the one cleared by the widest margin wins;",
        "a head that reaches none is *mixed*.",
        "",
    ]
    lines += _table(
        ("role", "score (metric)", "threshold"),
        [(role, metric, f"{report.thresholds.values[role]:.2f}")
         for role, metric in ROLE_METRICS.items()],
    )  # fmt: skip
    lines += ["", "### Strongest heads of each role", ""]
    lines += _table(
        ("role", "head", "score"),
        [(role, f"layer {h.layer} · head {h.head}", f"{h.score:.3f}")
         for role, heads in report.strongest(3).items() for h in heads],
    )  # fmt: skip
    counts: dict[str, int] = {}
    for role in report.roles:
        counts[role.role] = counts.get(role.role, 0) + 1
    lines += ["", "Heads per role: " + ", ".join(f"{r} {n}" for r, n in sorted(counts.items())), ""]
    if examples:
        scale = "each head scaled to its max" if style.scale == "head" else "colour 0–1"
        lines += [
            "### The strongest head of each role on an example",
            "",
            f"Example: “{report.example.text}”. Rows are queries, columns keys; {scale}.",
            "",
        ]
        for role, path in examples.items():
            lines += [f"**{role}**", "", _figure(role, path), ""]
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
    lines += sections
    lines += ["## Metrics", ""]
    names = [*METRICS, *probed]
    lines += _table(("metric", "definition"), [(n, METRIC_HELP[n]) for n in names])
    lines += [""]
    for name in names:
        lines += [_figure(name, Path(f"metric-{name}.{ext}")), ""]
    lines += ["Every number: `heads.csv` and `heads.json` (one row per layer and head).", ""]
    return "\n".join(lines)
