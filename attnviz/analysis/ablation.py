"""`show --ablate L.H`: the text read with some heads zero-ablated and as it is, in one pass
of two rows, and what changed: a decoder's next-token loss and top guesses, an encoder's
sentence embedding (`ablated_pass`); the edit that removes the heads as the model runs (`removing`).
Which heads matter over a corpus is `importance`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analysis.importance import OBJECTIVES, ablating
from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.attention import Encoded
    from attnviz.core.model_info import LoadedModel


def parse_head(text: str) -> tuple[int, int]:
    """ "18.6" -> (18, 6): a head as LAYER.HEAD, or a one-line InputError."""
    layer, dot, head = text.strip().partition(".")
    if not (dot and layer.isdigit() and head.isdigit()):
        raise InputError(f"--ablate '{text}': give a head as LAYER.HEAD, e.g. 18.6")
    return int(layer), int(head)


@dataclass(frozen=True)
class Prediction:
    """At one position: the token that follows, and the top next-token guesses (token,
    probability) before and after the heads are removed."""

    position: int
    token: str  # the token at `position`
    actual: str | None  # the text's next token; None at the last position
    before: tuple[tuple[str, float], ...]
    after: tuple[tuple[str, float], ...]


@dataclass(frozen=True, eq=False)
class AblationView:
    """One text with some heads removed, against the text as it was."""

    heads: tuple[tuple[int, int], ...]
    ablation: str
    objective: str  # the objective's short name
    unit: str
    before: float  # the objective with nothing removed (0 for the embedding's cosine)
    after: float
    predictions: tuple[Prediction, ...] = ()  # decoders: per position (or the query's)

    def as_dict(self) -> dict[str, Any]:
        return {
            "heads": [f"{layer}.{head}" for layer, head in self.heads],
            "ablation": self.ablation,
            "objective": self.objective,
            "unit": self.unit,
            "before": self.before,
            "after": self.after,
            "predictions": [
                {
                    "position": p.position,
                    "token": p.token,
                    "next": p.actual,
                    "before": [[t, prob] for t, prob in p.before],
                    "after": [[t, prob] for t, prob in p.after],
                }
                for p in self.predictions
            ],
        }


def removing(
    loaded: LoadedModel, heads: Sequence[tuple[int, int]], rows: int = 1, only: int | None = None
) -> Any:
    """An edit for `capture.run` that zero-ablates `heads` ((layer, head) pairs) in each of
    `rows` batch rows, or in row `only`."""
    import torch

    drops: dict[int, Any] = {}
    for layer, head in heads:
        drops.setdefault(layer, torch.zeros((rows, loaded.info.n_heads), dtype=torch.bool))
        drops[layer][slice(None) if only is None else only, head] = True
    return ablating(drops, loaded.info.n_heads)


def ablated_pass(
    loaded: LoadedModel,
    encoded: Encoded,
    heads: Sequence[tuple[int, int]],
    positions: Sequence[int] | None = None,
    top_k: int = 5,
    also: Sequence[Any] = (),
) -> AblationView:
    """Read `encoded` with `heads` zero-ablated and as it is, in one pass of two rows: a
    decoder's next-token loss and top-`top_k` guesses at `positions` (default: every one),
    an encoder's sentence embedding (1 − cosine; its masked-LM loss is not shown here).
    Recorders in `also` are fed by the same pass (row 0 as it is, row 1 without the heads)."""
    import torch

    from attnviz.core import capture
    from attnviz.core.tokens import pad

    for layer, head in heads:
        loaded.info.pick_layers([layer])
        loaded.info.pick_heads([head])
    inputs = pad(loaded, [encoded, encoded])
    edit = removing(loaded, heads, rows=2, only=1)  # row 0 reads the text as it is
    causal = loaded.info.causal
    output = capture.run(loaded, inputs, list(also), causal, edit)
    chosen = tuple(sorted(set(heads)))
    if not causal:
        hidden = output.last_hidden_state.double()  # (2, T, d_model)
        pooled = hidden.mean(dim=1)  # (2, d_model): every token is the text's
        moved = 1.0 - float(torch.nn.functional.cosine_similarity(pooled[0], pooled[1], dim=0))
        objective = OBJECTIVES["embedding-cosine"]
        return AblationView(chosen, "zero", objective.short, objective.unit, 0.0, moved)
    log_probs = torch.log_softmax(output.logits.double(), dim=-1)  # (2, T, V)
    ids = torch.tensor(encoded.ids, device=log_probs.device)
    n = len(encoded)
    targets = ids[1:].expand(2, -1)[..., None]  # (2, T − 1, 1): token p + 1 at p
    nll = -log_probs[:, : n - 1].gather(-1, targets)[..., 0]  # (2, T − 1)
    before, after = (float(row.mean()) for row in nll)
    tokenizer = loaded.tokenizer

    def guesses(row: int, p: int) -> tuple[tuple[str, float], ...]:
        probs, found = log_probs[row, p].exp().topk(top_k)
        return tuple((tokenizer.decode([int(i)]), float(q)) for i, q in zip(found, probs))

    shown = range(n) if positions is None else positions
    predictions = tuple(
        Prediction(p, tokenizer.decode([encoded.ids[p]]),
                   tokenizer.decode([encoded.ids[p + 1]]) if p + 1 < n else None,
                   guesses(0, p), guesses(1, p))
        for p in shown
    )  # fmt: skip
    objective = OBJECTIVES["next-token"]
    return AblationView(chosen, "zero", objective.short, objective.unit, before, after,
                        predictions)  # fmt: skip
