"""The contribution measures by name (`Measure`, MEASURES: weights, norm, ALTI, rollout), what
each combines with, and a norm's rows as shares. The maths is in `maths`, the recorders
that feed it from a pass in `recorders`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Measure:
    """One way to say how much key j feeds query i: its name (`--measure NAME`), help, unit
    (colour bars, JSON), whether it has a head axis, and the capture kinds it needs."""

    name: str
    help: str
    unit: str
    per_layer: bool  # one map per layer (cumulative from layer 0), no head axis
    kinds: tuple[str, ...]
    cite: str
    fusion: str = "mean"  # rollout: how heads are fused (FUSIONS)
    discard: float = 0.0  # rollout: the share of each map's lowest entries set to 0

    @property
    def summed(self) -> bool:
        """Whether each row sums to 1 (a norm's rows do not)."""
        return self.name != "norm"


MEASURES = {
    m.name: m
    for m in (
        Measure(
            "weights",
            "attention weights α, per head (rows sum to 1)",
            "attention weight",
            False,
            ("probs",),
            "",
        ),
        Measure(
            "norm",
            "‖α·f(x)‖ per head: the weight times the length of what the key passes on",
            "‖α·f(x)‖",
            False,
            ("input", "probs"),
            "Kobayashi et al. 2020",
        ),
        Measure(
            "alti",
            "per layer, with the residual and normalisation, composed from layer 0 up",
            "ALTI contribution",
            True,
            ("input", "probs", "output", "residual"),
            "Ferrando et al. 2022",
        ),
        Measure(
            "rollout",
            "per layer, heads averaged with the residual as I, composed from layer 0 up",
            "attention rollout",
            True,
            ("probs",),
            "Abnar & Zuidema 2020",
        ),
    )
}


DEFAULT = "weights"
FUSIONS = ("mean", "max", "min")  # rollout's head fusion (jacobgil/vit-explain)


def with_rollout(name: str, fusion: str = "mean", discard: float = 0.0) -> Measure:
    """The measure called `name`, with rollout's head fusion and discard ratio; one line for
    a fusion or ratio out of range, or given to another measure."""
    from dataclasses import replace

    chosen = get(name)
    if fusion not in FUSIONS:
        raise InputError(f"unknown --fusion '{fusion}'; choose one of: {', '.join(FUSIONS)}")
    if not 0.0 <= discard < 1.0:
        raise InputError(f"--discard is a share of each map, 0 or more and below 1, not "
                         f"{discard:g}")  # fmt: skip
    if (fusion, discard) == ("mean", 0.0):
        return chosen
    if chosen.name != "rollout":
        option = "--fusion" if fusion != "mean" else "--discard"
        raise InputError(f"{option} needs --measure rollout: it is how rollout fuses heads "
                         "and what it discards")  # fmt: skip
    return replace(chosen, fusion=fusion, discard=discard)


def get(name: str) -> Measure:
    """The measure called `name`, or a one-line error naming the choices."""
    if name not in MEASURES:
        raise InputError(f"unknown measure '{name}'; choose one of: {', '.join(MEASURES)}")
    return MEASURES[name]


def refuse_on_stacks(measure: str) -> Measure:
    """The measure called `measure`, refusing one not defined on an encoder-decoder model's
    stacks (before the model loads)."""
    chosen = get(measure)
    if chosen.name not in (DEFAULT, "norm"):
        raise InputError(
            f"--measure {chosen.name} composes one stack's layers and is not defined across an "
            "encoder-decoder model's stacks; use weights or norm"
        )
    return chosen


def shares(att: Any) -> Any:
    """A norm's rows as shares (each row divided by its sum), what the summaries and the
    query's tables rank: the measures whose rows already sum to 1 are returned as they are."""
    from dataclasses import replace

    import numpy as np

    if MEASURES[att.measure].summed:
        return att
    totals = att.weights.sum(axis=-1, keepdims=True)
    return replace(att, weights=(att.weights / np.where(totals > 0, totals, 1.0)).astype("f4"))
