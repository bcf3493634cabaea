"""`attnviz report`: what each head does over a corpus, as numbers, roles, figures and Markdown."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, TextTooLongError
from attnviz.files import clear_previous, prepare_dir, write_done, write_text_atomic
from attnviz.metrics import (
    LOCAL_WINDOW,
    METRICS,
    PROBES,
    ROLE_METRICS,
    HeadRole,
    MetricSums,
    Thresholds,
    assign_roles,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.extract import Attention
    from attnviz.figures import Style
    from attnviz.inputs import Sentences
    from attnviz.models import LoadedModel, ModelInfo
    from attnviz.probes import ProbeResult

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
            }
            for m, name in enumerate(METRICS):
                value = float(self.means[m, role.layer, role.head])
                row[name] = value if math.isfinite(value) else None
            if self.probes is not None:
                for p, name in enumerate(PROBES):
                    row[name] = float(self.probes.scores[p, role.layer, role.head])
            rows.append(row)
        return rows

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
    from attnviz.models import refuse_early

    refuse_early(model, options.get("layers"), options.get("heads"))
    prepare_dir(out)

    from attnviz.models import cached_model

    result = build_report(cached_model(model, device), sentences, **options)
    return result, write_report(result, out, style)


def build_report(
    loaded: LoadedModel,
    sentences: Sentences,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    words: bool = False,
    thresholds: Thresholds | None = None,
    batch_size: int = 16,
    truncate: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Report:
    """Run every sentence through the model, summing head metrics as it goes (flat memory).

    Metrics are summed for every head (one vectorised pass); roles and files cover the
    chosen `layers` and `heads` (default: all).
    """
    from attnviz.extract import encode, extract_many, view

    chosen_layers = loaded.info.pick_layers(layers)
    chosen_heads = loaded.info.pick_heads(heads)
    skipped: list[str] = []

    def encoded():
        for sentence in sentences.items:
            try:
                yield encode(loaded, sentence.text, truncate)
            except TextTooLongError as error:
                note = f"{sentences.source}, line {sentence.line}: skipped, {error}"
                skipped.append(note)
                if on_warning:
                    on_warning(note)

    sums = MetricSums()
    example = None
    for att in extract_many(loaded, encoded(), batch_size):
        shown = view(att, words)
        sums.add(shown)
        example = example or shown
        if on_progress:
            on_progress(1)
    if example is None:
        raise InputError("no sentence fits the model: every one was too long (try --truncate)")
    means = sums.means()
    chosen = thresholds or Thresholds()
    probes = None
    if loaded.info.causal:
        from attnviz.probes import run_probes

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
    )


def write_report(report: Report, out: Path, style: Style) -> list[Path]:
    """Write report.md, heads.csv, heads.json and the figures into `out`, then `done.json`
    listing them; the files of an earlier report into `out` are removed first."""
    from attnviz.figures import HeadFigure, MetricGrid, head_title, role_map_figure, save_figure

    prepare_dir(out)
    clear_previous(out)
    written = []
    rows = report.rows()
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    written.append(write_text_atomic(out / "heads.csv", table.getvalue()))
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
    written.append(write_text_atomic(out / "report.md", _markdown(report, examples, style)))
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


def _markdown(report: Report, examples: dict[str, Path], style: Style) -> str:
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
    lines += ["## Metrics", ""]
    names = [*METRICS, *probed]
    lines += _table(("metric", "definition"), [(n, METRIC_HELP[n]) for n in names])
    lines += [""]
    for name in names:
        lines += [_figure(name, Path(f"metric-{name}.{ext}")), ""]
    lines += ["Every number: `heads.csv` and `heads.json` (one row per layer and head).", ""]
    return "\n".join(lines)
