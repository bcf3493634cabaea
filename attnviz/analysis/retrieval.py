"""Retrieval heads: which heads fetch a fact from far back in a long context (Wu et al. 2024,
"Retrieval Head Mechanistically Explains Long-Context Factuality", ICLR 2025).

A needle-in-a-haystack run (`core.haystack`): the model answers a question whose answer is
one sentence hidden in a long text. Token t of the answer was written from row t − 1 (the
position before it). In each head, the step that wrote token w counts when the key the row
attends to most (its argmax over every key it sees) is one of the needle's tokens and that
token is w itself: the head points at the needle's token that the model is copying (the
copy rule). A head's score on the run is the number of steps that count over the needle's
length in tokens; its retrieval score is the mean over the runs whose answer holds the
needle (`recall` ≥ HELD): where the model did not write the needle, no head copied it.

All that is kept of a run is, per written token, per layer and head, the position of the
row's largest weight (`TopKeys`): N × L × H integers, never a map.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

HELD = 0.5  # an answer holds the needle when it recalls at least half of its words
SCORED = 0.1  # Wu et al.'s line: a head scoring above it is a retrieval head


class TopKeys:
    """Per written token, per layer and head, the key each row attends to most: what
    `core.generation.greedy` hands a row at a time (`take`)."""

    def __init__(self, n_layers: int, n_heads: int, first: int) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.first = first  # the row that wrote the first token: the prompt's last
        self.found: dict[int, dict[int, Any]] = {}  # row -> layer -> (H,) positions

    def take(self, layer: int, position: int, row: Any) -> None:
        """Row `position` of `layer`, every head over keys 0 … position, (H, position + 1)."""
        self.found.setdefault(position, {})[layer] = row.argmax(dim=-1).numpy()

    def positions(self, n_written: int) -> np.ndarray:
        """(N, L, H): the key each head attended to most in the row that wrote each token."""
        import numpy as np

        rows = range(self.first, self.first + n_written)
        missing = [r for r in rows if len(self.found.get(r, {})) != self.n_layers]
        if missing:  # a row the model never handed over: nothing to score it with
            raise ValueError(f"rows {missing[:3]} were not heard for every layer")
        return np.stack([np.stack([self.found[r][layer] for layer in range(self.n_layers)])
                         for r in rows]).astype(np.int64)  # fmt: skip


def copies(top: np.ndarray, written: Sequence[int], prompt: Sequence[int], start: int,
           stop: int) -> np.ndarray:  # fmt: skip
    """(L, H): for each head, the steps of the answer that copy the needle (positions start
    … stop − 1 of `prompt`): the head's top key `top` (N, L, H) is a needle token, and that
    token is the one written at that step."""
    import numpy as np

    ids = np.asarray(prompt)
    found = np.zeros(top.shape[1:], dtype=np.int64)
    for step, token in enumerate(written):
        at = top[step]  # (L, H)
        inside = (at >= start) & (at < stop)
        same = ids[np.clip(at, 0, len(ids) - 1)] == token
        found += inside & same
    return found


def run_scores(top: np.ndarray, written: Sequence[int], prompt: Sequence[int], start: int,
               stop: int) -> np.ndarray:  # fmt: skip
    """(L, H): each head's retrieval score on one run: copying steps over the needle's tokens."""
    return copies(top, written, prompt, start, stop) / (stop - start)


_WORD = re.compile(r"[a-z0-9]+")


def recall(needle: str, answer: str) -> float:
    """The share of the needle's words that the answer holds, each as often as the needle
    has it (ROUGE-1 recall, on lower-case words)."""
    from collections import Counter

    wanted = Counter(_WORD.findall(needle.lower()))
    got = Counter(_WORD.findall(answer.lower()))
    total = sum(wanted.values())
    return sum(min(n, got[w]) for w, n in wanted.items()) / total if total else 0.0


@dataclass(frozen=True, eq=False)
class RetrievalScores:
    """Each head's retrieval score over the runs whose answer held the needle."""

    scores: np.ndarray  # (L, H)
    runs: int  # the runs it is the mean of
    of: int  # all runs

    def ranked(self) -> list[tuple[int, int, float]]:
        """Every head, (layer, head, score), highest first; ties in layer, head order."""
        import numpy as np

        flat = self.scores.ravel()
        order = np.argsort(-flat, kind="stable")
        n_heads = self.scores.shape[1]
        return [(int(i // n_heads), int(i % n_heads), float(flat[i])) for i in order]

    def top(self, k: int) -> list[tuple[int, int]]:
        """The `k` best heads, (layer, head)."""
        return [(layer, head) for layer, head, _ in self.ranked()[:k]]

    def share_above(self, line: float = SCORED) -> float:
        """The share of heads scoring above `line`."""
        return float((self.scores > line).mean())


def retrieval_scores(per_run: Sequence[np.ndarray], held: Sequence[bool]) -> RetrievalScores | None:
    """The mean of the runs' scores (L, H) over the runs that held the needle; None where
    none did (no head can be said to have copied it)."""
    import numpy as np

    kept = [scores for scores, ok in zip(per_run, held) if ok]
    if not kept:
        return None
    return RetrievalScores(np.mean(np.stack(kept), axis=0), len(kept), len(per_run))


def random_heads(n_layers: int, n_heads: int, k: int, seed: int,
                 leave_out: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:  # fmt: skip
    """`k` heads drawn at random (seeded), none of `leave_out` (the top heads they are the
    control of), in layer, head order."""
    import numpy as np

    barred = {layer * n_heads + head for layer, head in leave_out}
    pool = [i for i in range(n_layers * n_heads) if i not in barred]
    drawn = np.random.default_rng(seed).choice(pool, size=min(k, len(pool)), replace=False)
    return sorted((int(i // n_heads), int(i % n_heads)) for i in drawn)


@dataclass(frozen=True, eq=False)
class NeedleRun:
    """One (length, depth) of the test: the prompt's tokens and where the needle lay in it,
    the answer, how much of the needle it recalls, and each head's copying steps (L, H)."""

    length: int  # asked: the prompt's tokens at most
    depth: float  # asked: % of the haystack before the needle
    tokens: int  # the prompt's tokens
    start: int  # the needle's tokens: positions start … stop − 1
    stop: int
    placed: float  # where the needle landed: the share of the haystack's tokens before it
    answer: str
    written: tuple[int, ...]  # the answer's token ids
    recall: float
    copies: np.ndarray  # (L, H): steps whose top key was the needle's token written

    @property
    def held(self) -> bool:
        return self.recall >= HELD

    @property
    def scores(self) -> np.ndarray:
        """(L, H): each head's retrieval score on this run."""
        return self.copies / (self.stop - self.start)

    def as_dict(self) -> dict[str, Any]:
        return {
            "length": self.length, "depth": self.depth, "tokens": self.tokens,
            "needle_tokens": [self.start, self.stop], "placed": round(self.placed, 4),
            "answer": self.answer, "answer_ids": list(self.written),
            "recall": round(self.recall, 4), "held": self.held,
            "copies": self.copies.tolist(),
            "scores": [[round(float(s), 6) for s in row] for row in self.scores],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, found: dict[str, Any]) -> NeedleRun:
        import numpy as np

        start, stop = found["needle_tokens"]
        return cls(found["length"], found["depth"], found["tokens"], start, stop,
                   found["placed"], found["answer"], tuple(found["answer_ids"]), found["recall"],
                   np.asarray(found["copies"], dtype=np.int64))  # fmt: skip


@dataclass(frozen=True)
class Ablated:
    """The answers' needle recall at every (length, depth) with `heads` zero-ablated: the
    `k` best retrieval heads ("top"), or `k` heads drawn with `seed` ("random")."""

    k: int
    kind: str  # "top" or "random"
    seed: int | None
    heads: tuple[tuple[int, int], ...]
    recalls: tuple[float, ...]  # per run, in the runs' order

    @property
    def recall(self) -> float:
        return sum(self.recalls) / len(self.recalls)

    def as_dict(self) -> dict[str, Any]:
        return {"k": self.k, "heads": self.kind, "seed": self.seed,
                "removed": [f"{layer}.{head}" for layer, head in self.heads],
                "recall": round(self.recall, 4),
                "recalls": [round(r, 4) for r in self.recalls]}  # fmt: skip


@dataclass(frozen=True, eq=False)
class NeedleResult:
    """A whole needle-in-a-haystack test of one model: its runs, each head's retrieval
    score (None where no answer held the needle) and the ablations."""

    model: str
    ran: dict[str, Any]
    haystack: str
    repeats: int  # the haystack read this many times over to fill the longest length
    needle: str
    question: str
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    answer_tokens: int
    runs: tuple[NeedleRun, ...]
    retrieval: RetrievalScores | None
    ablations: tuple[Ablated, ...] = ()

    def recall(self) -> float:
        """The mean recall of the needle over every run, nothing removed."""
        return sum(r.recall for r in self.runs) / len(self.runs)

    def as_dict(self) -> dict[str, Any]:
        found = self.retrieval
        heads = [] if found is None else [
            {"layer": layer, "head": head, "score": round(score, 6)}
            for layer, head, score in found.ranked()
        ]  # fmt: skip
        return {
            "model": self.model, **self.ran, "haystack": self.haystack,
            "haystack_repeats": self.repeats, "needle": self.needle,
            "question": self.question, "lengths": list(self.lengths),
            "depths": list(self.depths), "answer_tokens": self.answer_tokens,
            "definition": DEFINITION, "held_at": HELD, "recall": round(self.recall(), 4),
            "runs_held": None if found is None else found.runs,
            "share_above_0.1": None if found is None else round(found.share_above(), 4),
            "heads": heads, "runs": [r.as_dict() for r in self.runs],
            "ablation": [a.as_dict() for a in self.ablations],
        }  # fmt: skip


DEFINITION = (
    "a head's retrieval score (Wu et al. 2024): over the steps that write the answer, the "
    "number whose most attended key is a needle token equal to the token written, over the "
    "needle's length in tokens; averaged over the runs whose answer recalls at least half of "
    "the needle's words"
)
