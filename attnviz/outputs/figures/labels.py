"""What a text's heatmaps say beside its weights (`Labels`): the tokens along each axis, what
a cell is, the view, the model. Read from the text's Attention once (`Labels.of`), so that a
figure takes arrays and these labels and asks the Attention nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnviz.core.layer_map import STACK_TITLES

if TYPE_CHECKING:
    from attnviz.core.attention import Attention

# What the queries are to the keys, by the measure; and which text each axis is from in an
# encoder-decoder model's stacks.
KEY_ROLES = {"weights": "attended to"}  # any other measure: "contributing"
KEY_SIDES = {"encoder": "source", "decoder": "target", "cross": "source"}
QUERY_SIDES = {"encoder": ", source", "decoder": ", target", "cross": ", target"}


@dataclass(frozen=True)
class Labels:
    """Everything a text's heatmaps draw besides the weights: tick labels, axis labels, the
    context line, the colour bar's unit, masked cells, a continuation's start, removed heads.

    `first` and `every` give a cell's place in the text (a window's first token, a pooled
    cell's tokens); `counted` is the text's length as the figures say it ("16 tokens",
    "7 × 9 tokens" for cross-attention)."""

    tokens: tuple[str, ...]  # the queries', down the map
    key_tokens: tuple[str, ...]  # the keys', across (the source's in cross-attention)
    unit: str  # "token" or "word"
    first: int  # the text's position of the first row (a window's start; 0 otherwise)
    every: int  # the tokens a cell spans along each axis: 1 unless pooled
    counted: str
    causal: bool  # a query cannot see the keys after it: those cells are masked
    cross: bool  # the keys are another text's: the query is not among them
    written_from: int | None  # where a decoder's continuation starts, in positions
    measure: str  # "weights" or a contribution measure's name
    per_layer: bool  # one map a layer (alti, rollout), no heads
    removed: tuple[tuple[int, int], ...]  # (layer, head) removed from the pass (--ablate)
    key_axis: str  # "key (token attended to)"
    query_axis: str  # "query (token attending)"
    value_unit: str  # the colour bar's unit before its scale: the measure's, and its pooling
    model: str  # the model's name
    n_layers: int  # the model's
    n_heads: int
    texts: tuple[str, ...]  # the text, or the source and the target
    view: str  # how the values derive from the model's: measure, unit, what was hidden

    @classmethod
    def of(cls, att: Attention) -> Labels:
        """`att`'s labels (its weights left out)."""
        from attnviz.analysis.contributions import MEASURES

        view = _view(att)
        unit, measure, stack = att.unit, att.measure, att.stack
        n, n_keys = att.token_counts()
        role = KEY_ROLES.get(measure, "contributing")
        side = KEY_SIDES.get(stack)
        value_unit = MEASURES[measure].unit
        if att.pooled is not None:
            value_unit = f"{value_unit}, {att.pooled[1]} of {att.pool_size}×{att.pool_size}"
        c = att.continuation
        return cls(
            tokens=att.tokens,
            key_tokens=att.key_tokens,
            unit=unit,
            first=att.span[0] if att.span else 0,
            every=att.pool_size,
            counted=f"{n} {unit}s" if att.keys is None else f"{n} × {n_keys} {unit}s",
            causal=att.info.causal,
            cross=att.keys is not None,
            written_from=c.start if c is not None else None,
            measure=measure,
            per_layer=att.per_layer,
            removed=() if att.per_layer else att.removed,
            key_axis=f"key ({unit} {f'{role}, {side}' if side else role})",
            query_axis=(
                f"query ({unit} {'attending' if measure == 'weights' else 'built'}"
                f"{QUERY_SIDES.get(stack, '')})"
            ),
            value_unit=value_unit,
            model=att.info.name,
            n_layers=att.info.n_layers,
            n_heads=att.info.n_heads,
            texts=(att.text,) if att.target is None else (att.text, att.target),
            view=view,
        )


def _view(att: Attention) -> str:
    """How the values were derived from the model's: the measure, the unit and what was
    hidden."""
    from attnviz.analysis.contributions import MEASURES

    parts = ["word view" if att.unit == "word" else "token view"]
    if att.stack is not None:  # "cross-attention", "encoder self-attention"
        parts.insert(0, STACK_TITLES[att.stack].split(" (")[0].lower())
    if att.measure != "weights":
        measure = MEASURES[att.measure]
        parts.insert(0, f"{measure.name}: {measure.unit} ({measure.cite})")
    if att.hidden_special:
        parts.append("special tokens hidden, rows renormalised")
    if att.pooled is not None:
        parts.append(f"pooled: {att.pooling()}")
    if att.span is not None:
        first, end = att.span
        parts.append(f"window {first}:{end}, exact (keys outside it left out)")
    return ", ".join(parts)
