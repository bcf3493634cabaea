"""The Python API: what a notebook needs, in a few calls. The CLI's commands call these too.

    import attnviz
    a = attnviz.attention("The animal didn't cross the street because it was too tired.")
    a.tokens, a.weights.shape        # tuple of str; numpy (layer, head, query, key)
    a.heatmap(5, 3); a.query("it")   # matplotlib figures

Models are loaded once per (model, device) in a process.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.extract import Attention
    from attnviz.pipelines.check import CheckResult
    from attnviz.pipelines.report import Report


def attention(
    text: str,
    model: str | None = None,
    words: bool = False,
    hide_special: bool = False,
    truncate: bool = False,
    device: str = "auto",
    layers: list[int] | None = None,
    pair: str | None = None,
) -> Attention:
    """Attention of one text: `weights[layer, head, query, key]` over `tokens` (rows sum to 1).

    `words` merges word pieces into words; `hide_special` drops [CLS]/[SEP]/BOS and renormalises
    each row; `truncate` cuts a text longer than the model takes (and says so in `notes`);
    `layers` keeps only those layers (`weights[i]` is layer `layers[i]`; `pattern(layer, head)`
    finds one), which is what makes long texts fit in memory.
    `pair` (encoders): read `[CLS] text [SEP] pair [SEP]` with token types; `segments` then
    says which sentence each token is in.
    """
    from attnviz.core.extract import extract, require_text, view
    from attnviz.core.models import cached_model

    require_text(text)
    loaded = cached_model(model, device)
    return view(
        extract(loaded, text, truncate=truncate, layers=layers, pair=pair), words, hide_special
    )


def check(
    text: str,
    model: str | None = None,
    layers: list[int] | None = None,
    tolerance: float = 1e-5,
    truncate: bool = False,
    device: str = "auto",
) -> CheckResult:
    """Recompute the chosen layers (default: all) from scratch and compare with the model."""
    from attnviz.pipelines.check import check as run_check

    return run_check(text, model, layers, tolerance, truncate, device)


def report(
    sentences: str | Path | Iterable[str] | None = None,
    model: str | None = None,
    device: str = "auto",
    treebank: str | Path | None = None,
    **options: Any,
) -> Report:
    """What every head does over `sentences` (a list of texts, or a Path to a file with one
    per line): metric means, roles and an example. With `treebank` (a CoNLL-U file) instead,
    its sentences, and which heads track its syntax and coreference (`Report.linguistics`).
    `options` are those of `attnviz.pipelines.report.build_report` (layers, heads, words,
    thresholds, batch_size, truncate, min_count, margin)."""
    from attnviz.core.inputs import read_sentences
    from attnviz.core.models import cached_model
    from attnviz.core.treebank import read_treebank
    from attnviz.pipelines.report import build_report

    if treebank is not None:
        if sentences is not None:
            raise InputError("give sentences or a treebank, not both")
        return build_report(cached_model(model, device), read_treebank(str(treebank)), **options)
    if sentences is None:
        raise InputError("give sentences (texts, or a Path to a file) or treebank=FILE.conllu")
    if isinstance(sentences, Path):
        chosen = read_sentences(str(sentences), None)
    else:
        chosen = read_sentences(
            None, [sentences] if isinstance(sentences, str) else list(sentences)
        )
    return build_report(cached_model(model, device), chosen, **options)
