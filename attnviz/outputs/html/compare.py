"""The compare page: text A and text B (or one text through two models) in the page of
`show --html`, with a third side, B − A, in every view.

The page carries each side's heads as `show --html` carries them (`page._stack_entry`), the
alignment (which of A's tokens pair with which of B's), each head's divergence and each
aligned query's. The browser reads A's and B's heads over the aligned units as
`analysis.compare.project` does (a unit's row the mean of its tokens' rows, its column the sum
of its tokens' columns, each row renormalised over the aligned keys) and draws B − A on a
diverging colour map centred on 0; the divergences are the Python numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnviz.analysis.inside import left_out
from attnviz.outputs.figures import DIFFERENCE_LABEL
from attnviz.outputs.html.page import (
    EXACT_BUDGET,
    NO_MODEL,
    _colour_table,
    _document,
    _packed,
    _stack_entry,
    page_frame,
    shortened,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from attnviz.analysis.compare import Compared, Comparison
    from attnviz.analysis.inside import Inside

DIVERGING = "RdBu_r"  # B − A: blue where A gives more, white for no change, red where B does
PAGE_BUDGET = 8 * 2**20  # bytes: the page's size, as show --html keeps it


def compare_data(
    compared: Compared,
    inside: tuple[Inside | str, Inside | str] | None = None,
    models: tuple[str, str] | None = None,
    scale: str = "absolute",
    cmap: str = "viridis",
    pair: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Everything the compare page reads: `page_data`'s fields for text A, each side's heads
    (`sides`), and `compare`: text B, the aligned units, each head's divergence (L, H) and
    each aligned query's (L, H, U, packed; NaN where a side's row has no aligned weight).

    `inside` is A's and B's inside-one-head numbers (or why they are left out); the two share
    one page's budget. `models` names the models that read A and B; `pair` is (number, of
    how many) for a page of a file of pairs. A norm is carried as it is (its rows are
    lengths), as `compare` compares it: each row renormalised over the aligned keys.
    """
    import numpy as np

    from attnviz.analysis.contributions import MEASURES
    from attnviz.analysis.inside import Inside

    a, b = compared.a, compared.b
    insides = inside or (NO_MODEL, NO_MODEL)
    given = [found for found in insides if isinstance(found, Inside)]
    size = sum(found.q.size + found.k.size + found.v.size for found in given) * 4  # float32
    reason = left_out(size, "every layer of both texts")
    if reason is not None:
        insides = (reason, reason)
    exact = (a.weights.size + b.weights.size) * 4 <= EXACT_BUDGET
    measure = MEASURES[a.measure]
    difference = compared.grids_b - compared.grids_a  # (L, H, U, U)
    data = {
        **page_frame(a, scale, cmap),
        "notes": [*a.notes, *(f"B: {note}" for note in b.notes)],
        "pair": None,
        "segments": None,
        "stack": "diff",  # the side the page opens on: B − A
        "sides": {
            "a": _stack_entry(a, exact, insides[0]),
            "b": _stack_entry(b, exact, insides[1]),
        },
        "inside": None,
        "measure": "weights",  # the measure switch is not on this page: `compare` says which
        "measures": {},
    }
    units = compared.alignment.units
    names = models or (a.info.name, b.info.name)
    data["compare"] = {
        "text_b": b.text,
        "models": list(names),
        "measure": measure.name,
        "unit": "attention weight" if measure.name == "weights" else measure.unit,
        # 1 on the absolute scale: a weight's, or the largest value a side holds (a norm).
        "top": 1.0 if measure.summed else float(max(a.weights.max(), b.weights.max())),
        "units_a": [list(u.a) for u in units],
        "units_b": [list(u.b) for u in units],
        "labels": compared.labels,
        "kinds": [u.kind for u in units],
        "special": [bool(a.special[u.a[0]]) for u in units],
        "note": compared.alignment.note(a.tokens, b.tokens),
        "divergence": compared.divergence.tolist(),  # (L, H), nats
        "rows": _packed(compared.rows.astype("<f4")),  # (L, H, U), nats; NaN: undefined
        "diff_top": float(np.abs(difference).max()) or 1e-6,
        "diverging": _colour_table(DIVERGING),
        "legend": DIFFERENCE_LABEL.replace("\n", "; "),
        "pair": list(pair) if pair else None,
    }
    return data


def compare_title(compared: Compared) -> str:
    """The page's <title>: both texts, shortened (or the one text, for two models)."""
    a, b = compared.a.text, compared.b.text
    if a == b:
        return f"attnviz compare: {shortened(a, 70)}"
    return f"attnviz compare: A: {shortened(a, 45)} | B: {shortened(b, 45)}"


def build_compare_page(compared: Compared, **options: Any) -> str:
    """The whole compare page for one pair (see `compare_data` for `options`): data, script
    and style inline, nothing loaded from outside, as `show --html`'s page."""
    return _document(compare_data(compared, **options), compare_title(compared))


def compare_pages(
    comparison: Comparison,
    insides: Sequence[Inside | str],
    models: tuple[str, str],
    scale: str = "absolute",
    cmap: str = "viridis",
) -> list[tuple[str, str]]:
    """Each pair's page, as (file name, page): `compare.html` for one pair, `compare-N.html`
    for pair N of several; `insides` holds each text's inside numbers, every A's, then every
    B's. Built before anything is written: a page over the size budget is refused here."""
    from attnviz.errors import InputError

    pairs = comparison.pairs
    pages = []
    for number, compared in enumerate(pairs, start=1):
        inside = (insides[number - 1], insides[len(pairs) + number - 1])
        of = (number, len(pairs)) if len(pairs) > 1 else None
        page = build_compare_page(compared, inside=inside, models=models, scale=scale,
                                  cmap=cmap, pair=of)  # fmt: skip
        size = len(page.encode("utf-8"))
        if size > PAGE_BUDGET:
            raise InputError(
                f"the compare page of pair {number} would be {size / 2**20:.1f} MiB, over the "
                f"page's {PAGE_BUDGET / 2**20:.0f} MiB: compare shorter texts, or leave out --html"
            )
        pages.append(("compare.html" if of is None else f"compare-{number}.html", page))
    return pages
