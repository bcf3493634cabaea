"""The result of `attnviz report`: per-head metric means over a corpus, roles, probes and
the treebank's findings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.metrics import (
    METRICS,
    PROBES,
)
from attnviz.analysis.reach import FIGURES
from attnviz.analysis.roles import (
    HeadRole,
    Thresholds,
)

if TYPE_CHECKING:
    import numpy as np

    from attnviz.analysis.importance import Importance
    from attnviz.analysis.linguistics import Linguistics
    from attnviz.analysis.probes import ProbeResult
    from attnviz.analysis.reach import Reach
    from attnviz.core.attention import Attention
    from attnviz.core.model_info import ModelInfo


# heads.csv's columns of `Report.special`, in its order: the share special tokens take
SPECIAL = ("special_weight_share", "special_norm_share")
# heads.csv's columns of `Report.repeats`: the probes' scores on the corpus's own repeats
REPEATS = ("induction_texts", "duplicate_texts")
# heads.csv's columns of `Report.reach` (`analysis.reach`): sinks and how far heads look
REACH = FIGURES


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


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
    # causal models: induction and duplicate-token scores on the corpus's own repeated tokens
    # (`metrics.MetricSums.repeat_means`), (2, L, H), None below MIN_REPEATS queries; and how
    # many queries each averages over
    repeats: np.ndarray | None = None
    repeat_queries: tuple[int, int] = (0, 0)
    linguistics: Linguistics | None = None  # with --treebank: syntax and coreference
    importance: Importance | None = None  # with --importance ablation|both
    importance_gradient: Importance | None = None  # with --importance gradient|both
    # (2, L, H): each head's special share (`summary.special_shares`) by weight and by norm
    # ‖α f(x)‖, means over the texts, on tokens (`contributions.CorpusContributions`)
    special: np.ndarray | None = None
    # (3, L): each layer's mixing ratios (`contributions.MIXING`), means over every token
    mixing: np.ndarray | None = None
    # why the mixing ratios are left out of a one-stack model's report, where they are
    # (`contributions.mixing_left_out`); None where they are measured or not defined (seq2seq)
    mixing_left_out: str | None = None
    # sinks and reach per head (`analysis.reach`), each text's averaged over the texts
    reach: Reach | None = None
    # how many texts each process read: a distributed run's ranks, a merge's shards (one
    # process: one number); not the report's numbers, which are the same however it ran
    texts_per_rank: tuple[int, ...] = ()

    def importances(self) -> dict[str, Importance]:
        """The importance measured, by column name: `importance` (ablation) and/or
        `importance_gradient`."""
        found = {"importance": self.importance, "importance_gradient": self.importance_gradient}
        return {name: result for name, result in found.items() if result is not None}

    def spearman(self) -> float | None:
        """With both methods, the Spearman correlation of their rankings of the chosen heads."""
        from attnviz.analysis.importance import spearman

        if self.importance is None or self.importance_gradient is None:
            return None
        return spearman(self.importance.scores, self.importance_gradient.scores)

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
                row[name] = _finite(float(self.means[m, role.layer, role.head]))
            if self.special is not None:
                for k, name in enumerate(SPECIAL):
                    row[name] = _finite(float(self.special[k, role.layer, role.head]))
            if self.reach is not None:
                for name in REACH:
                    row[name] = float(getattr(self.reach, name)[role.layer, role.head])
            if self.probes is not None:
                for p, name in enumerate(PROBES):
                    row[name] = float(self.probes.scores[p, role.layer, role.head])
            if self.info.causal:  # the same two on the corpus's own repeats
                for p, name in enumerate(REPEATS):
                    found = self.repeats
                    row[name] = None if found is None else float(found[p, role.layer, role.head])
            for name, result in self.importances().items():
                row[name] = float(result.scores[role.layer, role.head])
                row[f"{name}_rank"] = int(result.ranks()[role.layer, role.head])
            rows.append(row)
        return rows

    def mixing_ratio(self) -> dict[str, list[float | None]] | None:
        """Each mixing ratio by name (`contributions.MIXING`), one value per layer of the
        model (index: the layer); None where not measured."""
        from attnviz.analysis.contributions import MIXING

        if self.mixing is None:
            return None
        return {
            name: [_finite(float(value)) for value in self.mixing[k]]
            for k, name in enumerate(MIXING)
        }

    def sinks(self) -> dict[str, Any]:
        """Per layer, the share of its heads that are attention sinks (`sink_head_share`, one
        value per layer of the model), and the share of all heads (`sink_share`)."""
        if self.reach is None:
            return {}
        return {
            "sink_head_share": self.reach.sink_head_share.tolist(),
            "sink_share": self.reach.sink_share,
        }

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
            **self.info.ran(),
            "unit": self.unit,
            "sentences": self.sentences,
            "queries": self.queries,
            "skipped": list(self.skipped),
            "texts_per_rank": list(self.texts_per_rank),
            "thresholds": self.thresholds.values,
            "layers": list(self.layers),
            "head_indices": list(self.heads),
            "probes": self.probes.as_dict() if self.probes is not None else None,
            "repeat_queries": dict(zip(REPEATS, self.repeat_queries)) if self.info.causal else None,
            "importance": {name: result.as_dict() for name, result in self.importances().items()}
            | ({"spearman": self.spearman()} if self.spearman() is not None else {})
            or None,
            "mixing_ratio": self.mixing_ratio(),
            "mixing_ratio_left_out": self.mixing_left_out,
            **self.sinks(),
            "heads": self.rows(),
            "treebank": None
            if self.linguistics is None
            else self.linguistics.as_dict(list(self.layers), list(self.heads)),
        }


@dataclass(frozen=True, eq=False)
class CrossReport:
    """Cross-attention over a corpus: each head's alignment metrics (`analysis.alignment`)."""

    info: ModelInfo  # the cross stack's counts
    means: np.ndarray  # (A, L, H), in the order of ALIGNMENT
    example: Attention
    # the same metrics on ‖α f(x)‖ (each row as shares), Kobayashi et al. 2020: (A, L, H)
    norm_means: np.ndarray | None = None

    def rows(self) -> list[dict[str, Any]]:
        """One row per head: layer, head and each alignment metric, by weight (`monotone`)
        and by norm (`monotone_norm`); None where undefined."""
        from attnviz.analysis.alignment import ALIGNMENT

        measured = [("", self.means)]
        if self.norm_means is not None:
            measured.append(("_norm", self.norm_means))
        rows = []
        for layer in range(self.info.n_layers):
            for head in range(self.info.n_heads):
                row: dict[str, Any] = {"layer": layer, "head": head}
                for suffix, means in measured:
                    for a, name in enumerate(ALIGNMENT):
                        value = float(means[a, layer, head])
                        row[name + suffix] = value if math.isfinite(value) else None
                rows.append(row)
        return rows


@dataclass(frozen=True, eq=False)
class Seq2SeqReport:
    """An encoder-decoder model's report: positional roles of its encoder and decoder
    self-attention (one `Report` each) and the alignment of its cross-attention."""

    info: ModelInfo  # the model's
    sentences: int  # source-target pairs
    skipped: tuple[str, ...]
    stacks: dict[str, Report]  # "encoder", "decoder"
    cross: CrossReport

    def rows(self) -> list[dict[str, Any]]:
        """One row per head of every stack, `stack` first (pandas-ready)."""
        rows = []
        for stack, report in self.stacks.items():
            for row in report.rows():
                row.pop("linguistic_roles")
                rows.append({"stack": stack, **row})
        return rows + [{"stack": "cross", **row} for row in self.cross.rows()]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.info.as_dict(),
            **self.info.ran(),
            "sentences": self.sentences,
            "skipped": list(self.skipped),
            "stacks": {
                stack: {"queries": report.queries, "thresholds": report.thresholds.values}
                for stack, report in self.stacks.items()
            },
            "heads": self.rows(),
        }
