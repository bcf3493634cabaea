"""What a vision-language model's heads do with the picture over many pictures and questions
(`attnviz report QUESTIONS.jsonl`): per layer and head of the language model,

    share    the share of attention the answer gives the picture: Σ over the image tokens
             (cells and marks) of a row, the mean over the answer's rows (the rows that
             wrote each token of the answer; without one, the rows of the prompt's tokens
             after the picture), then over the questions
    entropy  how spread the picture's part of a row is over its patches: the row over the
             cells renormalised to sum to 1, its entropy −Σ q ln q over ln(cells), so 1 is
             uniform over the patches and 0 all on one; the same means
    top-k    the share of the picture's part that its k most attended patches hold (the
             same renormalised row; k = `TOP_K`); the same means

and the visual sink tokens (Kang et al., ICLR 2025, "See What You Are Told: Visual
Attention Sink in Large Multimodal Models"): image tokens that draw attention whatever the
question asks. Kang et al. find them by their massive activations in a few hidden
dimensions; attnviz reads attention alone, so it finds them by what they receive:

    draw     an image token's received attention, the mean over the answer's rows and over
             every chosen layer and head, divided by the mean over the picture's image
             tokens (1: a uniform share of the picture's attention), per question
    sink     a token whose draw is at least `SINK_DRAW` in every question about its picture,
             with at least two questions (one question cannot tell "whatever the question"
             from "what this question asks"); ranked by that least draw

and per head, the share of the picture's attention that goes to its picture's sink tokens
(the mean over the questions; 0 for a picture without one).

A question's numbers are summed a block of query rows at a time as the capture pass makes
them (`Question`: a capture recorder, no map held whole); a picture's questions are held
until its sinks are known (each an (L, H, image tokens) array), then added to the sums
(`QuestionSums`) and let go.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.core.layouts import Layout
    from attnviz.core.model_info import ModelInfo

TOP_K = 5  # patches in the top-k patch share
SINK_DRAW = 5.0  # times a uniform share of the picture's attention, in every question
RANKED = 20  # image tokens kept in the ranking of sinks


@dataclass(frozen=True, eq=False)
class Answered:
    """One question's numbers: (L, H) means over its `rows`; `received` (L, H, image tokens)
    each image token's mean received attention over them (in `Layout.image_tokens` order)."""

    rows: tuple[int, ...]
    share: Any
    entropy: Any
    top: Any
    received: Any


def text_rows(tokens: int, layout: Layout, special: tuple[bool, ...],
              continued_from: int | None) -> tuple[int, ...]:  # fmt: skip
    """The rows a question's numbers are taken over: those that wrote each token of the
    answer (row t − 1 wrote token t, from `continued_from`, the answer's first token), or
    without an answer, the rows of the prompt's tokens after the picture that are not
    special."""
    if continued_from is not None:
        return tuple(range(continued_from - 1, tokens - 1))
    after = max(layout.image_tokens()) + 1
    return tuple(row for row in range(after, tokens) if not special[row])


def asked_rows(block: Any, start: int, rows: Sequence[int]) -> Any:
    """The query rows `rows` that fall in a block of batch row 0's rows (1, H, b, W) starting
    at `start`, as float64 (H, R, W); None where none does."""
    mine = [row - start for row in rows if start <= row < start + block.shape[2]]
    return block[0, :, mine].double().numpy() if mine else None


class Question:
    """A capture recorder (`capture.ROWS`) of one question's pass: each chosen layer's rows,
    block by block, reduced to the numbers of `Answered` on the rows asked for."""

    def __init__(self, layers: list[int], n_heads: int, layout: Layout, rows: tuple[int, ...],
                 top_k: int = TOP_K) -> None:  # fmt: skip
        import numpy as np

        if not rows:
            raise ValueError("a question's numbers need at least one row")
        self.layers, self.rows, self.top_k = layers, rows, top_k
        self.wants = {layer: ("rows",) for layer in layers}
        self.slot = {layer: i for i, layer in enumerate(layers)}
        self.image = np.asarray(layout.image_tokens())
        cells = set(layout.cells())
        self.cells = np.asarray([i for i, token in enumerate(self.image) if token in cells])
        shape = (len(layers), n_heads)
        self.received = np.zeros((*shape, len(self.image)))  # summed over rows
        self.entropy, self.top = np.zeros(shape), np.zeros(shape)

    def receive(self, layer: int, tensors: dict[str, Any]) -> None:
        """Nothing but rows is asked for."""

    def receive_rows(self, layer: int, start: int, rows: Any) -> None:
        import numpy as np

        held = asked_rows(rows, start, self.rows)  # (H, R, W)
        if held is None:
            return
        image = held[..., self.image]  # (H, R, image tokens)
        slot = self.slot[layer]
        self.received[slot] += image.sum(axis=1)
        picture = image[..., self.cells]  # (H, R, cells)
        q = picture / picture.sum(axis=-1, keepdims=True)
        logs = np.log(q, out=np.zeros_like(q), where=q > 0)
        self.entropy[slot] += (-(q * logs).sum(axis=-1) / math.log(len(self.cells))).sum(-1)
        k = min(self.top_k, len(self.cells))
        self.top[slot] += np.sort(q, axis=-1)[..., -k:].sum(axis=-1).sum(axis=-1)

    def result(self) -> Answered:
        """The question's means over its rows."""
        n = len(self.rows)
        received = self.received / n
        return Answered(self.rows, received.sum(axis=-1), self.entropy / n, self.top / n,
                        received)  # fmt: skip


def draws(answered: Answered) -> Any:
    """Each image token's draw in one question: its received attention (the mean over the
    layers and heads) over the mean of the picture's image tokens; (image tokens,)."""
    mean = answered.received.mean(axis=(0, 1))
    return mean / mean.mean()


@dataclass(frozen=True)
class Sink:
    """An image token of one picture, ranked by its least draw over the picture's questions."""

    picture: str  # the picture's path as given in the file
    token: int  # its index among the picture's image tokens (`Layout.image_tokens` order)
    label: str  # its cell, "(3, 4)", or "mark 0" for one that stands for no patch
    least: float  # its least draw over the questions
    mean: float  # its mean draw over the questions
    questions: int  # questions about its picture
    sink: bool  # least ≥ SINK_DRAW over at least two questions

    def as_dict(self) -> dict[str, Any]:
        return {"picture": self.picture, "token": self.token, "cell": self.label,
                "least_draw": round(self.least, 6), "mean_draw": round(self.mean, 6),
                "questions": self.questions, "sink": self.sink}  # fmt: skip


def picture_sinks(name: str, labels: list[str], answered: list[Answered],
                  sink_draw: float = SINK_DRAW) -> list[Sink]:  # fmt: skip
    """Every image token of one picture with its least and mean draw over the questions
    about it (`answered`, one per question), most drawn first."""
    import numpy as np

    each = np.stack([draws(a) for a in answered])  # (questions, image tokens)
    least, mean = each.min(axis=0), each.mean(axis=0)
    order = np.argsort(-least, kind="stable")
    many = len(answered) >= 2
    return [Sink(name, int(i), labels[i], float(least[i]), float(mean[i]), len(answered),
                 bool(many and least[i] >= sink_draw)) for i in order]  # fmt: skip


@dataclass(frozen=True, eq=False)
class QuestionReport:
    """The heads' numbers over the questions: arrays (L, H) over the chosen `layers`, every
    head; rows and files cover the chosen `heads`."""

    info: ModelInfo
    questions: int
    pictures: int
    answered: int  # questions with an answer (written or given); the others read the prompt
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    share: Any
    entropy: Any
    top: Any
    sink_share: Any  # the share of the picture's attention on its sink tokens
    sinks: tuple[Sink, ...]  # the most drawn image tokens, ranked (`RANKED` at most)
    top_k: int = TOP_K
    sink_draw: float = SINK_DRAW
    generate: int | None = None

    def rows(self) -> list[dict[str, Any]]:
        """One row per chosen head (pandas-ready)."""
        found = []
        for slot, layer in enumerate(self.layers):
            for head in self.heads:
                at = (slot, head)
                found.append({"layer": layer, "head": head,
                              "picture_share": round(float(self.share[at]), 6),
                              "patch_entropy": round(float(self.entropy[at]), 6),
                              f"top{self.top_k}_patch_share": round(float(self.top[at]), 6),
                              "sink_share": round(float(self.sink_share[at]), 6)})  # fmt: skip
        return found

    def by_layer(self) -> Any:
        """Each chosen layer's mean picture share over the chosen heads, (L,)."""
        return self.share[:, list(self.heads)].mean(axis=1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.info.as_dict(),
            "questions": self.questions,
            "pictures": self.pictures,
            "answered": self.answered,
            "generate": self.generate,
            "top_k": self.top_k,
            "sink_draw": self.sink_draw,
            "heads": self.rows(),
            "sinks": [sink.as_dict() for sink in self.sinks],
        }


@dataclass
class QuestionSums:
    """Running sums over the questions, picture by picture (`add`), of each head's numbers
    in the chosen `layers`, and the most drawn image tokens met so far."""

    layers: list[int]
    n_heads: int
    top_k: int = TOP_K
    sink_draw: float = SINK_DRAW
    questions: int = 0
    pictures: int = 0
    answered: int = 0
    sums: Any = None  # (4, L, H): share, entropy, top-k, sink share
    ranked: list[tuple[float, int, Sink]] = field(default_factory=list)  # a heap, least first

    def add(self, name: str, labels: list[str], answered: list[Answered],
            with_answer: int) -> list[Sink]:  # fmt: skip
        """Add one picture's questions (`with_answer` of them answered): their numbers, its
        sinks' shares per head and its tokens to the ranking; its tokens, most drawn first."""
        import numpy as np

        if self.sums is None:
            self.sums = np.zeros((4, len(self.layers), self.n_heads))
        tokens = picture_sinks(name, labels, answered, self.sink_draw)
        sinks = [t.token for t in tokens if t.sink]
        for a in answered:
            on_sinks = a.received[..., sinks].sum(axis=-1) / a.received.sum(axis=-1)
            self.sums += np.stack([a.share, a.entropy, a.top, on_sinks])
        for token in tokens[:RANKED]:
            entry = (token.least, -(self.pictures * 10**6 + token.token), token)
            if len(self.ranked) < RANKED:
                heapq.heappush(self.ranked, entry)
            else:
                heapq.heappushpop(self.ranked, entry)
        self.questions += len(answered)
        self.answered += with_answer
        self.pictures += 1
        return tokens

    def report(self, info: ModelInfo, heads: list[int], generate: int | None) -> QuestionReport:
        """The means over the questions added."""
        if not self.questions:
            raise ValueError("no question to average")
        share, entropy, top, on_sinks = self.sums / self.questions
        ranked = tuple(entry[2] for entry in sorted(self.ranked, reverse=True))
        return QuestionReport(info, self.questions, self.pictures, self.answered,
                              tuple(self.layers), tuple(heads), share, entropy, top, on_sinks,
                              ranked, self.top_k, self.sink_draw, generate)  # fmt: skip


def token_labels(layout: Layout) -> list[str]:
    """Each image token's label, in `Layout.image_tokens` order: its cell, or "mark N"."""
    cells = layout.labels()
    marks = {token: n for n, token in enumerate(layout.marks)}
    return [cells.get(t, f"mark {marks.get(t, 0)}") for t in layout.image_tokens()]
