"""Heads that track syntax and coreference, measured against annotated text (Clark et al. 2019).

Everything is on the word view (attention to a word sums its pieces, from a word averages
them), over the sentence's words only: special tokens are neither queries nor candidates.
A head's *prediction* for a query word is the word it attends to most.

    syntax, dependent-to-head   for every arc (dependent d, head h, relation r): correct when
                                argmax_j A[d, j] = h
    syntax, head-to-dependent   correct when argmax_j A[h, j] = d
    baseline (per relation)     the best fixed relative offset on the same arcs: the most
                                common h − d (d − h for head-to-dependent), as accuracy
    coreference                 for every mention with an antecedent (an earlier mention of
                                the same entity in the sentence): correct when the mention's
                                head word's most-attended *earlier* word is the head word of
                                one of its antecedents
    baseline (coreference)      the nearest earlier mention's head word

Sums are vectorised over layers and heads and added sentence by sentence, so memory does
not grow with the corpus (`LinguisticSums`); a few short sentences are kept as examples.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attnviz.core.attention import Attention
    from attnviz.core.treebank import Treebank, TreebankSentence

DIRECTIONS = ("dependent-to-head", "head-to-dependent")
SHORT_DIRECTIONS = {"dependent-to-head": "dep → head", "head-to-dependent": "head → dep"}
EXAMPLE_MAX_WORDS = 25


def word_positions(att: Attention, n_words: int) -> np.ndarray:
    """Where the sentence's words sit in a word view: the non-special words, in order.

    A truncated sentence has fewer; there are never more than `n_words`.
    """
    import numpy as np

    positions = np.flatnonzero(~att.special)
    if att.unit != "word" or len(positions) > n_words:
        raise ValueError("expected the word view of a sentence encoded with encode_words")
    return positions


@dataclass
class LinguisticSums:
    """Running counts of correct predictions per head, for syntax and coreference."""

    relations: dict[str, int] = field(default_factory=dict)  # relation -> column
    correct: Any = None  # (2, L, H, R): dependent-to-head, head-to-dependent
    arcs: Any = None  # (R,)
    offsets: dict[str, Counter] = field(default_factory=dict)  # relation -> Counter(h − d)
    coref_correct: Any = None  # (L, H)
    mentions: int = 0
    coref_baseline: int = 0
    sentences: int = 0
    examples: dict[str, tuple[Attention, TreebankSentence]] = field(default_factory=dict)
    # each example's index in the corpus: of parts merged, the earliest example wins
    example_index: dict[str, int] = field(default_factory=dict)

    def add(self, att: Attention, sentence: TreebankSentence, index: int | None = None) -> None:
        """Add one sentence, at `index` in the corpus (default: after those added so far):
        `att` is its word view (from `encode_words`)."""
        positions = word_positions(att, len(sentence.words))
        n = len(positions)  # words kept (fewer than the sentence's if truncated)
        rows = att.weights[:, :, positions][:, :, :, positions]  # (L, H, n, n)
        index = self.sentences if index is None else index
        self.sentences += 1
        if sentence.heads is not None:
            self._add_syntax(rows, sentence, n, att, index)
        if sentence.mentions:
            self._add_coreference(rows, sentence, n)

    def merge(self, other: LinguisticSums) -> LinguisticSums:
        """This part of the corpus and `other` (other sentences) as one: the counts are whole
        numbers, exact in any order; each relation's example is the earliest sentence's."""
        import numpy as np

        merged = LinguisticSums(sentences=self.sentences + other.sentences)
        merged.mentions = self.mentions + other.mentions
        merged.coref_baseline = self.coref_baseline + other.coref_baseline
        corefs = [c for c in (self.coref_correct, other.coref_correct) if c is not None]
        merged.coref_correct = np.sum(corefs, axis=0) if corefs else None
        for part in (self, other):
            for name, column in part.relations.items():
                if name not in merged.relations:
                    merged._grow(name, part.correct.shape[1:3])
                at = merged.relations[name]
                merged.correct[..., at] += part.correct[..., column]
                merged.arcs[at] += part.arcs[column]
                merged.offsets[name].update(part.offsets[name])
            for name, index in part.example_index.items():
                if index < merged.example_index.get(name, np.iinfo(np.int64).max):
                    merged.example_index[name] = index
                    merged.examples[name] = part.examples[name]
        return merged

    def _add_syntax(
        self, rows: np.ndarray, sentence: TreebankSentence, n: int, att: Attention, index: int
    ) -> None:
        import numpy as np

        heads = np.array(sentence.heads)  # (W,) head of each word, -1 for the root
        words = np.arange(len(heads))
        keep = (heads >= 0) & (heads < n) & (words < n)
        deps, hs = words[keep], heads[keep]  # (A,) each arc's dependent and head
        if not len(deps):
            return
        names = [sentence.relations[d] for d in deps]  # type: ignore[index]
        for name in names:
            if name not in self.relations:
                self._grow(name, rows.shape[:2])
        columns = np.array([self.relations[name] for name in names])  # (A,)
        predicted = rows.argmax(axis=-1)  # (L, H, n) most-attended word of each query word
        hits = np.stack([predicted[:, :, deps] == hs, predicted[:, :, hs] == deps])  # (2,L,H,A)
        onehot = np.zeros((len(deps), len(self.relations)))
        onehot[np.arange(len(deps)), columns] = 1.0  # (A, R)
        self.correct += hits.astype(np.float64) @ onehot  # (2, L, H, R)
        self.arcs += onehot.sum(axis=0)
        for name, offset in zip(names, (hs - deps).tolist()):
            self.offsets[name][offset] += 1
        if n <= EXAMPLE_MAX_WORDS:
            for name in set(names):
                if name not in self.examples:
                    self.examples[name] = (att, sentence)
                    self.example_index[name] = index

    def _grow(self, name: str, shape: tuple[int, int]) -> None:
        import numpy as np

        self.relations[name] = len(self.relations)
        self.offsets[name] = Counter()
        if self.correct is None:
            self.correct = np.zeros((2, *shape, 0))
            self.arcs = np.zeros(0)
        self.correct = np.concatenate([self.correct, np.zeros((2, *shape, 1))], axis=-1)
        self.arcs = np.append(self.arcs, 0.0)

    def _add_coreference(self, rows: np.ndarray, sentence: TreebankSentence, n: int) -> None:
        import numpy as np

        if self.coref_correct is None:
            self.coref_correct = np.zeros(rows.shape[:2])
        mentions = [m for m in sentence.mentions if m.head < n]
        for mention in mentions:
            q = mention.head
            antecedents = sorted(
                {m.head for m in mentions if m.entity == mention.entity and m.head < q}
            )
            if not antecedents:
                continue
            earlier = rows[:, :, q, :q].argmax(axis=-1)  # (L, H) most-attended earlier word
            self.coref_correct += np.isin(earlier, antecedents)
            nearest = max(m.head for m in mentions if m.head < q)
            self.coref_baseline += nearest in antecedents
            self.mentions += 1

    def result(
        self, treebank: Treebank, min_count: int, margin: float, notes: tuple[str, ...] = ()
    ) -> Linguistics:
        """The measurement: accuracies, baselines, the roles they give, and the examples."""
        syntax, coreference = self.syntax(min_count), self.coreference()
        return Linguistics(
            has_syntax=treebank.has_syntax,
            has_coreference=treebank.has_coreference,
            syntax=syntax,
            coreference=coreference,
            roles=linguistic_roles(syntax, coreference, margin, min_count),
            min_count=min_count,
            margin=margin,
            notes=treebank.notes + notes,
            examples=dict(self.examples),
        )

    def syntax(self, min_count: int) -> SyntaxResult | None:
        """Accuracy per relation, direction and head; None if no arc was seen."""
        import numpy as np

        if not self.relations:
            return None
        order = sorted(self.relations, key=lambda r: (-self.arcs[self.relations[r]], r))
        columns = [self.relations[r] for r in order]
        arcs = self.arcs[columns]
        accuracy = np.moveaxis(self.correct[..., columns] / arcs, -1, 1)  # (2, R, L, H)
        offsets, baseline = [], []
        for name, n in zip(order, arcs):
            # the commonest offset; of two as common, the nearer, then the one before
            counted = self.offsets[name].items()
            offset, count = min(counted, key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))
            offsets.append(offset)
            baseline.append(count / n)
        return SyntaxResult(
            relations=tuple(order),
            arcs=arcs.astype(int),
            accuracy=accuracy,
            baseline_offset=tuple(offsets),
            baseline_accuracy=np.array(baseline),
            min_count=min_count,
        )

    def coreference(self) -> CorefResult | None:
        """Accuracy per head over the mentions that have an antecedent; None if there are none."""
        if not self.mentions:
            return None
        return CorefResult(
            accuracy=self.coref_correct / self.mentions,
            mentions=self.mentions,
            baseline_accuracy=self.coref_baseline / self.mentions,
        )


@dataclass(frozen=True)
class SyntaxRow:
    """The best head for one relation and direction, with that relation's baseline."""

    relation: str
    direction: str
    layer: int
    head: int
    accuracy: float
    n: int
    baseline: int  # the fixed offset: predicted word = query word + baseline
    baseline_accuracy: float

    @property
    def gain(self) -> float:
        return self.accuracy - self.baseline_accuracy


@dataclass(frozen=True, eq=False)
class SyntaxResult:
    """Every head's accuracy on every relation, in both directions, and the baselines."""

    relations: tuple[str, ...]  # most arcs first
    arcs: np.ndarray  # (R,)
    accuracy: np.ndarray  # (2, R, L, H), directions in the order of DIRECTIONS
    baseline_offset: tuple[int, ...]  # (R,) h − d, the dependent-to-head offset
    baseline_accuracy: np.ndarray  # (R,)
    min_count: int

    def counted(self) -> list[int]:
        """Indices of the relations with at least `min_count` arcs (the table's)."""
        return [r for r, n in enumerate(self.arcs) if n >= self.min_count]

    def table(self, layers: list[int], heads: list[int]) -> list[SyntaxRow]:
        """Best head among the chosen ones per counted relation and direction."""
        import numpy as np

        rows = []
        for r in self.counted():
            for d, direction in enumerate(DIRECTIONS):
                chosen = self.accuracy[d, r][np.ix_(layers, heads)]  # (len(layers), len(heads))
                i, j = np.unravel_index(int(chosen.argmax()), chosen.shape)
                offset = self.baseline_offset[r] * (1 if d == 0 else -1)
                rows.append(
                    SyntaxRow(
                        relation=self.relations[r],
                        direction=direction,
                        layer=layers[i],
                        head=heads[j],
                        accuracy=float(chosen[i, j]),
                        n=int(self.arcs[r]),
                        baseline=offset,
                        baseline_accuracy=float(self.baseline_accuracy[r]),
                    )
                )
        return rows

    def as_dict(self) -> dict[str, Any]:
        """Every head's accuracy for every relation: `[layer][head]` lists per direction."""
        return {
            "min_count": self.min_count,
            "directions": list(DIRECTIONS),
            "relations": {
                name: {
                    "n": int(self.arcs[r]),
                    "in_table": bool(self.arcs[r] >= self.min_count),
                    "baseline_offset": self.baseline_offset[r],
                    "baseline_accuracy": float(self.baseline_accuracy[r]),
                    **{
                        direction: self.accuracy[d, r].round(6).tolist()
                        for d, direction in enumerate(DIRECTIONS)
                    },
                }
                for r, name in enumerate(self.relations)
            },
        }


@dataclass(frozen=True, eq=False)
class CorefResult:
    """Every head's coreference accuracy, over `mentions` mentions, and the baseline's."""

    accuracy: np.ndarray  # (L, H)
    mentions: int
    baseline_accuracy: float

    def best(self, layers: list[int], heads: list[int]) -> tuple[int, int, float]:
        """(layer, head, accuracy) of the best chosen head."""
        import numpy as np

        chosen = self.accuracy[np.ix_(layers, heads)]
        i, j = np.unravel_index(int(chosen.argmax()), chosen.shape)
        return layers[i], heads[j], float(chosen[i, j])


@dataclass(frozen=True, eq=False)
class Linguistics:
    """What annotated text says about the heads: syntax, coreference, the roles they give."""

    has_syntax: bool  # what the treebank has
    has_coreference: bool
    syntax: SyntaxResult | None
    coreference: CorefResult | None
    roles: dict[tuple[int, int], list[str]]  # (layer, head) -> e.g. ["syntax:det"]
    min_count: int
    margin: float
    notes: tuple[str, ...]
    examples: dict[str, tuple[Attention, TreebankSentence]]  # relation -> a short sentence

    def as_dict(self, layers: list[int], heads: list[int]) -> dict[str, Any]:
        """The tables for the chosen heads, every head's accuracies, the notes."""
        data: dict[str, Any] = {
            "min_count": self.min_count,
            "margin": self.margin,
            "notes": list(self.notes),
            "syntax": None,
            "coreference": None,
        }
        if self.syntax is not None:
            table = [asdict(row) for row in self.syntax.table(layers, heads)]
            data["syntax"] = {"table": table, **self.syntax.as_dict()}
        if self.coreference is not None:
            layer, head, accuracy = self.coreference.best(layers, heads)
            data["coreference"] = {
                "mentions": self.coreference.mentions,
                "baseline": "nearest earlier mention",
                "baseline_accuracy": self.coreference.baseline_accuracy,
                "best": {"layer": layer, "head": head, "accuracy": accuracy},
                "accuracy": self.coreference.accuracy.round(6).tolist(),
            }
        return data


def linguistic_roles(
    syntax: SyntaxResult | None,
    coreference: CorefResult | None,
    margin: float,
    min_count: int,
) -> dict[tuple[int, int], list[str]]:
    """Name each head for the relations it predicts better than their baseline by `margin`.

    `syntax:obj` for dependent-to-head (the dependent finds its head), `syntax:obj:h2d` for
    head-to-dependent, `coreference` for coreference; only relations (and coreference) with
    at least `min_count` arcs (mentions) are named.
    """
    import numpy as np

    roles: dict[tuple[int, int], list[str]] = {}
    if syntax is not None:
        for r in syntax.counted():
            for d, suffix in enumerate(("", ":h2d")):
                beats = syntax.accuracy[d, r] >= syntax.baseline_accuracy[r] + margin  # (L, H)
                for layer, head in zip(*np.nonzero(beats)):
                    name = f"syntax:{syntax.relations[r]}{suffix}"
                    roles.setdefault((int(layer), int(head)), []).append(name)
    if coreference is not None and coreference.mentions >= min_count:
        beats = coreference.accuracy >= coreference.baseline_accuracy + margin
        for layer, head in zip(*np.nonzero(beats)):
            roles.setdefault((int(layer), int(head)), []).append("coreference")
    return roles
