"""Head roles: the one registry of roles a head can be given, and the rule that gives them.

Each `Role` is defined once, with everything every layer needs of it: the metric (or decoder
probe) that scores it, its default threshold and the `--threshold` name that sets it, its
short name, its colour in figures and its style in the terminal, and the kinds of attention
it can be given on (`KINDS`; the legends list only those). Adding a role is one entry in
ROLES (and a metric in `attnviz.analysis.metrics` if it needs a new one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnviz.analysis.metrics import METRICS, PROBES
from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np


# The kinds of attention a head can have: an encoder's self-attention (every key visible), a
# decoder's (causal: a query sees itself and earlier keys) and cross-attention (a decoder's
# queries over the source's keys, another text: no positions to compare).
KINDS = ("encoder", "decoder", "cross")
SELF_ATTENTION = ("encoder", "decoder")


def attention_kind(causal: bool, cross: bool = False) -> str:
    """The kind (`KINDS`) of a model's or stack's attention."""
    return "cross" if cross else "decoder" if causal else "encoder"


@dataclass(frozen=True)
class Role:
    """One role: its name, what scores it and how it is shown."""

    name: str
    short: str  # in figures' cells and the terminal's map
    metric: str  # a metric in METRICS or a probe in PROBES; "" for `mixed`
    threshold: float  # default minimum score
    option: str  # NAME in --threshold NAME=VALUE
    colour: str  # in figures
    style: str  # rich style in the terminal
    specific: bool = True  # one token does the job; `local` and `broad` are spread
    mark: str = ""  # what the terminal's map shows, when not `short`
    kinds: tuple[str, ...] = KINDS  # the kinds of attention it can be given on

    @property
    def shown(self) -> str:
        return self.mark or self.short

    @property
    def probed(self) -> bool:
        """Scored by a decoder probe (`metrics.PROBES`), which `report` runs on decoders."""
        return self.metric in PROBES


# In the order they are tried and listed.
ROLES = {
    role.name: role
    for role in (
        Role("previous-token", "prev", "previous", 0.5, "previous", "#1f77b4", "bold blue",
             kinds=SELF_ATTENTION),
        # a causal query never sees the token after it
        Role("next-token", "next", "next", 0.5, "next", "#17becf", "bold cyan", kinds=("encoder",)),
        Role("self", "self", "self", 0.5, "self", "#9467bd", "bold magenta", kinds=SELF_ATTENTION),
        Role("first-token sink", "first", "first", 0.5, "first", "#7f7f7f", "dim"),
        Role("separator sink", "sep", "separator", 0.5, "separator", "#bcbd22", "yellow"),
        Role("punctuation", "punct", "punctuation", 0.4, "punctuation", "#d62728", "bold red"),
        # scored on repeats a query can only look back to (the probe, or the text's own)
        Role("induction", "induc", "induction", 0.4, "induction", "#8c564b", "bold green",
             kinds=("decoder",)),
        Role("local", "local", "local", 0.7, "local", "#2ca02c", "green", specific=False,
             kinds=SELF_ATTENTION),
        Role("broad", "broad", "entropy_norm", 0.8, "broad", "#ff7f0e", "bold #ff8700", False),
    )
}  # fmt: skip
# A head that clears no threshold.
MIXED = Role("mixed", "mixed", "", 0.0, "", "#f0f0f0", "dim", specific=False, mark="·")
EVERY_ROLE = {**ROLES, MIXED.name: MIXED}
DEFAULT_THRESHOLDS = {role.name: role.threshold for role in ROLES.values()}
THRESHOLD_NAMES = {role.option: role.name for role in ROLES.values()}
SPECIFIC_ROLES = tuple(role.name for role in ROLES.values() if role.specific)


def roles_for(kind: str) -> list[Role]:
    """The roles attention of this kind (`KINDS`) can be given, in ROLES' order."""
    return [role for role in ROLES.values() if kind in role.kinds]


def threshold_help() -> str:
    """The --threshold option's list of names, from the registry."""
    only = {("decoder",): " (decoders)", ("encoder",): " (encoders)"}
    names = [role.option + only.get(role.kinds, "") for role in ROLES.values()]
    return f"NAME: {', '.join(names)}."


@dataclass(frozen=True)
class HeadRole:
    """One head's role and the score (its metric's mean) that earned it; None for `mixed`."""

    layer: int
    head: int
    role: str
    score: float | None


@dataclass(frozen=True)
class Thresholds:
    """Minimum score for each role, in [0, 1]; a head gets the strongest role it clears."""

    values: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))

    @classmethod
    def parse(cls, items: list[str] | None) -> Thresholds:
        """From `name=value` strings such as `previous=0.6` (names: see THRESHOLD_NAMES)."""
        values = dict(DEFAULT_THRESHOLDS)
        for item in items or []:
            name, sep, raw = item.partition("=")
            role = THRESHOLD_NAMES.get(name.strip())
            if not sep or role is None:
                raise InputError(
                    f"--threshold {item}: expected NAME=VALUE with NAME one of "
                    f"{', '.join(THRESHOLD_NAMES)}"
                )
            try:
                value = float(raw)
            except ValueError:
                raise InputError(f"--threshold {item}: {raw!r} is not a number") from None
            if not 0.0 <= value <= 1.0:
                raise InputError(f"--threshold {item}: {value} is outside the valid range [0, 1]")
            values[role] = value
        return cls(values)


def assign_roles(
    means: np.ndarray, thresholds: Thresholds, probes: np.ndarray | None = None
) -> list[HeadRole]:
    """Give each head the specific role it clears by the widest margin (induction first),
    else local, else broad.

    `means` (M, L, H) are the metrics in the order of METRICS; `probes` (P, L, H) the decoder
    probes' scores in the order of PROBES; without them (encoders) no head is an induction
    head. A head that clears none is `mixed`.
    """
    import numpy as np

    n_layers, n_heads = means.shape[1:]
    named = {m: means[i] for i, m in enumerate(METRICS)}
    if probes is not None:
        named.update({m: probes[i] for i, m in enumerate(PROBES)})
    scores = {
        name: np.nan_to_num(named[role.metric])
        if role.metric in named
        else np.zeros((n_layers, n_heads))
        for name, role in ROLES.items()
    }
    limit = thresholds.values
    roles = []
    for layer in range(n_layers):
        for head in range(n_heads):
            score = {role: float(values[layer, head]) for role, values in scores.items()}
            cleared = [r for r in SPECIFIC_ROLES if score[r] >= limit[r] and score[r] > 0]
            if "induction" in cleared:
                # A decoder head rests on its first token when its pattern finds nothing to
                # match, so on ordinary text an induction head looks like a sink; the probe
                # gives it the text it needs, and that is the role worth naming.
                best = "induction"
            elif cleared:
                best = max(cleared, key=lambda r: score[r] - limit[r])
            elif score["local"] >= limit["local"]:
                best = "local"
            elif score["broad"] >= limit["broad"]:
                best = "broad"
            else:
                roles.append(HeadRole(layer, head, MIXED.name, None))
                continue
            roles.append(HeadRole(layer, head, best, score[best]))
    return roles
