"""What every command's terminal view shares: the colour ramp and shades, token labels
fitted to a width, weights as text, pairs of (label, value) in a row, the map of how far
each head moved (compare, and show --ablate), and where a command wrote its images."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from attnviz.analysis.query import normal_form

if TYPE_CHECKING:
    from collections.abc import Iterator

    from attnviz.core.attention import Attention


# Viridis at five stops, 0 (dark) to 1 (yellow): the images' default colour map. The terminal
# keeps it whatever --cmap gives the images.
_RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def colour(weight: float) -> str:
    """Hex colour of an attention weight in [0, 1] on the viridis ramp."""
    x = min(max(weight, 0.0), 1.0) * (len(_RAMP) - 1)
    i = min(int(x), len(_RAMP) - 2)
    f = x - i
    rgb = [round(a + (b - a) * f) for a, b in zip(_RAMP[i], _RAMP[i + 1])]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def text_colour(weight: float) -> str:
    """Colour for text showing a weight: the ramp minus its dark end, readable on dark screens."""
    return colour(0.3 + 0.7 * min(max(weight, 0.0), 1.0))


def fit_label(label: str, width: int) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def repeated_labels(tokens: Sequence[str]) -> set[str]:
    """The tokens (as written) that occur more than once by --query's rule (case-insensitive,
    word pieces without their "##"): labels of these carry their position."""
    forms = [normal_form(token) for token in tokens]
    counts = Counter(forms)
    return {token for token, form in zip(tokens, forms) if counts[form] > 1}


def token_label(tokens: Sequence[str], index: int, width: int, repeated: set[str]) -> str:
    """A token as shown in a cell of `width`: `the@7` when "the" occurs more than once
    (`repeated`, `repeated_labels` of `tokens`)."""
    token = tokens[index]
    if token not in repeated:
        return fit_label(token, width)
    where = f"@{index}"
    return fit_label(token, max(width - len(where), 1)) + where


def weight_text(value: float) -> str:
    return f"{value:.2f}".replace("0.", ".", 1)


_SHADES = " ░▒▓█"


def _has_colour(console: Console) -> bool:
    """False when the output has no colour: piped, a dumb terminal, or NO_COLOR set."""
    return console.color_system is not None and not console.no_color


def shade_cell(console: Console, weight: float) -> Text:
    """Two character cells: a colour block, or shade characters where the output has no colour."""
    if not _has_colour(console):
        shade = _SHADES[min(int(weight * len(_SHADES)), len(_SHADES) - 1)]
        return Text(shade * 2)
    return Text("  ", style=f"on {colour(weight)}")


class _Pairs:
    """ "token value" pairs separated by two spaces, that wrap between one pair and the next,
    never inside one (rich would break at any space): next-token guesses, top keys."""

    def __init__(self, pairs: Sequence[str], style: str = "") -> None:
        self.pairs = list(pairs)
        self.style = style

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [cell_len(pair) for pair in self.pairs] or [0]
        return Measurement(max(widths), sum(widths) + 2 * (len(widths) - 1))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        lines: list[str] = []
        for pair in self.pairs:
            if lines and cell_len(lines[-1]) + 2 + cell_len(pair) <= options.max_width:
                lines[-1] += "  " + pair
            else:
                lines.append(pair)
        yield Text("\n".join(lines), style=self.style)


def guess_pairs(found: tuple[tuple[str, float], ...], style: str = "") -> _Pairs:
    return _Pairs([f"{token.strip() or repr(token)} {prob:.2f}" for token, prob in found], style)


def target_pairs(found: Sequence[Any]) -> _Pairs:
    return _Pairs([f"{t.token} {weight_text(t.weight)}" for t in found])


ABLATION_TITLE = (
    "How far each kept head moved when those were removed: JS divergence (nats, 0 = the "
    "same pattern; mean over queries; × = removed)"
)


DIVERGENCE_TITLE = (
    "How far each head moved: JS divergence A→B (nats, 0 = the same pattern; mean over "
    "aligned queries)"
)


def print_divergence_map(
    console: Console, divergence: Any, layers: Sequence[int], title: str = DIVERGENCE_TITLE
) -> None:
    """Layers × heads: how far each head's pattern moved (Jensen–Shannon divergence, nats,
    (L, H) over `layers`), each cell shaded by its share of the largest; NaN (a head that
    was removed) is shown as ×."""
    import numpy as np

    top = float(np.nanmax(divergence)) if np.isfinite(divergence).any() else 0.0
    top = top or 1.0
    coloured = _has_colour(console)
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1, 0, 0),
                  show_edge=False)  # fmt: skip
    table.add_column("", style="bold", no_wrap=True)
    for head in range(divergence.shape[1]):
        table.add_column(f"H{head}", justify="right", no_wrap=True)
    for slot, layer in enumerate(layers):
        cells = []
        for value in divergence[slot]:
            if not np.isfinite(value):
                cells.append(Text("×", style="dim"))
                continue
            # small divergences (a tiny random model's) in powers of ten, not as .000
            shown = f"{value:.3f}".replace("0.", ".", 1) if top >= 0.01 else f"{value:.0e}"
            shown = "0" if value == 0 else shown  # exactly the same pattern
            if coloured:
                cells.append(Text(shown, style=text_colour(value / top)))
            else:
                shade = _SHADES[min(int(value / top * len(_SHADES)), len(_SHADES) - 1)]
                cells.append(Text(shade + shown))
        table.add_row(f"L{layer}", *cells)
    console.print(table)


def print_written(
    console: Console,
    images: Sequence[Any],
    folder: Any,
    page: Any = None,
    drawn: Attention | None = None,
    window: Attention | None = None,
) -> None:
    """Where a command wrote its images (and its interactive page); how they show a long text
    (`drawn` pooled, the head figures from `window`'s exact cells)."""
    if images:
        console.print(f"wrote {len(images)} images to [bold]{folder}/[/]", highlight=False)
    if images and drawn is not None and drawn.pooled is not None:
        pooled = drawn.pooling()
        if window is not None and window.span is not None:
            first, end = window.span
            exact = f"head figures: exact cells {first}:{end}"
            said = f"overview, layer grids pooled ({pooled}); {exact}"
        else:
            said = f"the maps pooled: {pooled} (--window START:END draws exact cells)"
        console.print(f"  {said}", highlight=False, soft_wrap=True)
    if page is not None:
        console.print(
            f"wrote the interactive page [bold]{page}[/]", highlight=False, soft_wrap=True
        )
