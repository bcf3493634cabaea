"""What `attnviz report` sums over a corpus, as one object: for the whole corpus, or for one
part of it (a rank of a distributed run, a `--shard`), with an exact `merge` and a form that
travels in a file or over the network (`pack`, `unpack`).

Every floating-point figure is a sum over texts of each text's float64 sums, taken in one
fixed order (`analysis.ordered`), and every count is a whole number: parts of a corpus summed
apart and merged give the same bits as one process, so the same printed digits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from attnviz.analysis.contributions import ContributionSums
from attnviz.analysis.importance import ImportanceSums
from attnviz.analysis.linguistics import LinguisticSums
from attnviz.analysis.metrics import MetricSums
from attnviz.analysis.ordered import OrderedSum
from attnviz.analysis.reach import ReachSums

if TYPE_CHECKING:
    import numpy as np

    from attnviz.analysis.importance import Importance
    from attnviz.analysis.probes import ProbeResult
    from attnviz.analysis.report import Report
    from attnviz.analysis.roles import Thresholds
    from attnviz.core.attention import Attention
    from attnviz.core.model_info import ModelInfo


@dataclass
class ReportSums:
    """A corpus's (or a part's) sums for `report`: head metrics, special shares and mixing
    ratios, sinks and reach, the treebank's counts (with --treebank), each importance
    method's sums (with --importance), and the corpus's first text as shown (the example, in
    the part that holds it)."""

    metrics: MetricSums
    contributions: ContributionSums
    reach: ReachSums
    linguistic: LinguisticSums | None = None
    importance: dict[str, ImportanceSums] = field(default_factory=dict)
    example: Attention | None = None

    def merge(self, other: ReportSums) -> ReportSums:
        """This part of the corpus and `other` (other texts of it) as one."""
        linguistic = None
        if self.linguistic is not None and other.linguistic is not None:
            linguistic = self.linguistic.merge(other.linguistic)
        return ReportSums(
            self.metrics.merge(other.metrics),
            self.contributions.merge(other.contributions),
            self.reach.merge(other.reach),
            linguistic,
            {name: sums.merge(other.importance[name]) for name, sums in self.importance.items()},
            self.example if self.example is not None else other.example,
        )

    @property
    def texts(self) -> int:
        """How many texts these sums cover."""
        return self.metrics.sentences


def build(
    sums: ReportSums,
    info: ModelInfo,
    *,
    layers: list[int] | None,
    heads: list[int] | None,
    thresholds: Thresholds | None,
    skipped: tuple[str, ...],
    texts_per_rank: tuple[int, ...],
    probes: ProbeResult | None = None,
    importance: dict[str, Importance] | None = None,
    treebank: Any = None,
    min_count: int = 100,
    margin: float = 0.1,
    notes: tuple[str, ...] = (),
) -> Report:
    """The report of a whole corpus from its sums. `treebank` (with its `has_syntax`,
    `has_coreference` and `notes`) when the corpus was one; `notes`: what encoding did to its
    sentences."""
    from attnviz.analysis.report import Report
    from attnviz.analysis.roles import Thresholds, assign_roles

    if sums.example is None:
        raise ValueError("the sums hold no example: the part with the corpus's first text")
    chosen_layers, chosen_heads = info.pick_layers(layers), info.pick_heads(heads)
    means = sums.metrics.means()
    chosen = thresholds or Thresholds()
    wanted = {(layer, head) for layer in chosen_layers for head in chosen_heads}
    found = assign_roles(means, chosen, probes.scores if probes is not None else None)
    measured = importance or {}
    repeats, repeat_queries = sums.metrics.repeat_means()
    linguistics = None
    if sums.linguistic is not None:
        linguistics = sums.linguistic.result(treebank, min_count, margin, notes)
    return Report(
        info=info,
        unit=sums.example.unit,
        sentences=sums.metrics.sentences,
        queries=sums.metrics.queries,
        skipped=skipped,
        means=means,
        roles=tuple(r for r in found if (r.layer, r.head) in wanted),
        thresholds=chosen,
        example=sums.example,
        layers=tuple(chosen_layers),
        heads=tuple(chosen_heads),
        probes=probes,
        repeats=repeats,
        repeat_queries=repeat_queries,
        special=sums.contributions.special(),
        mixing=sums.contributions.mixing(),
        reach=sums.reach.result(),
        importance=measured.get("ablation"),
        importance_gradient=measured.get("gradient"),
        linguistics=linguistics,
        texts_per_rank=texts_per_rank,
    )


# ---------- a part in a file, or over the network: named arrays and a JSON document ----------


class _Packer:
    """Collects named float arrays and a JSON-able document."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def ordered(self, name: str, found: OrderedSum) -> list[list[int]]:
        arrays, index = found.arrays(name)
        self.arrays.update(arrays)
        return index

    def array(self, name: str, value: Any) -> str | None:
        import numpy as np

        if value is None:
            return None
        self.arrays[name] = np.asarray(value)
        return name


def pack(sums: ReportSums) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """`sums` as named arrays and a JSON-able document (`unpack` reads them back)."""
    packer = _Packer()
    metrics, contributions, reach = sums.metrics, sums.contributions, sums.reach
    document: dict[str, Any] = {
        "metrics": {
            "sums": packer.ordered("metrics", metrics.sums),
            "counts": packer.array("metrics.counts", metrics.counts),
            "sentences": metrics.sentences,
            "queries": metrics.queries,
            "repeats": packer.ordered("metrics.repeats", metrics.repeats),
            "repeat_counts": packer.array("metrics.repeat_counts", metrics.repeat_counts),
        },
        "contributions": {
            "shape": list(contributions.shape),
            "by_norm": contributions.by_norm,
            "special": packer.ordered("special", contributions.special_sums),
            "texts": contributions.texts,
            "mixing": None
            if contributions.mixing_sums is None
            else packer.ordered("mixing", contributions.mixing_sums),
            "tokens": contributions.tokens,
        },
        "reach": {"sums": packer.ordered("reach", reach.sums), "texts": reach.texts},
        "importance": {
            name: {
                "weight": part.weight,
                "tokens": part.tokens,
                **{
                    kind: packer.ordered(f"importance.{name}.{kind}", getattr(part, kind))
                    for kind in ("clean", "scored", "means")
                },
            }
            for name, part in sums.importance.items()
        },
        "example": None
        if sums.example is None
        else _pack_attention(packer, "example", sums.example),
        "linguistic": None
        if sums.linguistic is None
        else _pack_linguistic(packer, sums.linguistic),
    }
    return packer.arrays, document


def unpack(arrays: dict[str, np.ndarray], document: dict[str, Any]) -> ReportSums:
    """The `ReportSums` that `pack` made these of."""
    metrics = document["metrics"]
    found = MetricSums(
        OrderedSum.from_arrays("metrics", arrays, metrics["sums"]),
        arrays[metrics["counts"]] if metrics["counts"] else None,
        metrics["sentences"],
        metrics["queries"],
        OrderedSum.from_arrays("metrics.repeats", arrays, metrics["repeats"]),
        arrays[metrics["repeat_counts"]] if metrics["repeat_counts"] else None,
    )
    part = document["contributions"]
    contributions = ContributionSums(*part["shape"], part["mixing"] is not None, part["by_norm"])
    contributions.special_sums = OrderedSum.from_arrays("special", arrays, part["special"])
    contributions.texts = part["texts"]
    if part["mixing"] is not None:
        contributions.mixing_sums = OrderedSum.from_arrays("mixing", arrays, part["mixing"])
        contributions.tokens = part["tokens"]
    reach = ReachSums(
        OrderedSum.from_arrays("reach", arrays, document["reach"]["sums"]),
        document["reach"]["texts"],
    )
    importance = {
        name: ImportanceSums(
            part["weight"],
            *(
                OrderedSum.from_arrays(f"importance.{name}.{kind}", arrays, part[kind])
                for kind in ("clean", "scored", "means")
            ),
            part["tokens"],
        )
        for name, part in document["importance"].items()
    }
    example = document["example"]
    return ReportSums(
        found,
        contributions,
        reach,
        None
        if document["linguistic"] is None
        else _unpack_linguistic(arrays, document["linguistic"]),
        importance,
        None if example is None else _unpack_attention(arrays, "example", example),
    )


# Attention's fields that a report's example needs, besides its weights and special mask
_ATTENTION_FIELDS = ("text", "tokens", "unit", "words", "word_labels", "notes", "hidden_special",
                     "layers", "pair", "segments", "truncated", "measure", "per_layer")  # fmt: skip


def _pack_attention(packer: _Packer, name: str, att: Attention) -> dict[str, Any]:
    packer.array(f"{name}.weights", att.weights)
    packer.array(f"{name}.special", att.special)
    return {"info": att.info.as_dict(), **{key: getattr(att, key) for key in _ATTENTION_FIELDS}}


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples the frozen dataclasses hold."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _unpack_attention(arrays: dict[str, np.ndarray], name: str, found: dict[str, Any]) -> Attention:
    from attnviz.core.attention import Attention

    info = model_info(found["info"])
    rest = {key: _tuples(found[key]) for key in _ATTENTION_FIELDS}
    return Attention(
        special=arrays[f"{name}.special"], weights=arrays[f"{name}.weights"], info=info, **rest
    )


def model_info(found: dict[str, Any]) -> ModelInfo:
    """A `ModelInfo` from its `as_dict`."""
    from attnviz.core.model_info import ModelInfo

    names = {f.name for f in fields(ModelInfo)}
    return ModelInfo(**{key: _tuples(value) for key, value in found.items() if key in names})


def _pack_linguistic(packer: _Packer, found: LinguisticSums) -> dict[str, Any]:
    examples = {}
    for name, (att, sentence) in found.examples.items():
        examples[name] = {
            "index": found.example_index[name],
            "attention": _pack_attention(packer, f"linguistic.example.{name}", att),
            "sentence": asdict(sentence),
        }
    return {
        "relations": list(found.relations),
        "correct": packer.array("linguistic.correct", found.correct),
        "arcs": packer.array("linguistic.arcs", found.arcs),
        "offsets": {
            name: [[k, n] for k, n in counts.items()] for name, counts in found.offsets.items()
        },
        "coref_correct": packer.array("linguistic.coref_correct", found.coref_correct),
        "mentions": found.mentions,
        "coref_baseline": found.coref_baseline,
        "sentences": found.sentences,
        "examples": examples,
    }


def _unpack_linguistic(arrays: dict[str, np.ndarray], found: dict[str, Any]) -> LinguisticSums:
    from collections import Counter

    from attnviz.core.treebank import Mention, TreebankSentence

    sums = LinguisticSums(
        relations={name: k for k, name in enumerate(found["relations"])},
        correct=arrays[found["correct"]] if found["correct"] else None,
        arcs=arrays[found["arcs"]] if found["arcs"] else None,
        offsets={
            name: Counter(dict(map(tuple, pairs))) for name, pairs in found["offsets"].items()
        },
        coref_correct=arrays[found["coref_correct"]] if found["coref_correct"] else None,
        mentions=found["mentions"],
        coref_baseline=found["coref_baseline"],
        sentences=found["sentences"],
    )
    for name, example in found["examples"].items():
        sentence = {key: _tuples(value) for key, value in example["sentence"].items()}
        sentence["mentions"] = tuple(Mention(**m) for m in example["sentence"]["mentions"])
        att = _unpack_attention(arrays, f"linguistic.example.{name}", example["attention"])
        sums.examples[name] = (att, TreebankSentence(**sentence))
        sums.example_index[name] = example["index"]
    return sums


def pack_means(sums: ImportanceSums) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Mean ablation's sums of the heads' outputs (all a share needs of the others')."""
    arrays, index = sums.means.arrays("means")
    return arrays, {"means": index, "tokens": sums.tokens}


def unpack_means(arrays: dict[str, np.ndarray], document: dict[str, Any]) -> ImportanceSums:
    return ImportanceSums(
        means=OrderedSum.from_arrays("means", arrays, document["means"]),
        tokens=document["tokens"],
    )
