"""`attnviz show`: one text through a model, summarised per head and drawn as heatmaps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.files import prepare_dir, slug

if TYPE_CHECKING:
    from attnviz.extract import Attention
    from attnviz.figures import Style
    from attnviz.summary import HeadSummary


@dataclass(frozen=True)
class ShowResult:
    """Everything `show` computed: the attention view, per-head summaries and the images written."""

    view: Attention
    layers: list[int]
    heads: list[int]
    summaries: list[HeadSummary]
    folder: Path | None
    images: list[Path]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.view.info.as_dict(),
            "unit": self.view.unit,
            "tokens": list(self.view.tokens),
            "notes": list(self.view.notes),
            "heads": [s.as_dict() for s in self.summaries],
            "images": [str(p) for p in self.images],
        }


def show(
    text: str,
    model: str | None = None,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    top_k: int = 3,
    words: bool = False,
    hide_special_tokens: bool = False,
    truncate: bool = False,
    out: Path | None = Path("attnviz-out"),
    style: Style | None = None,
    device: str = "auto",
) -> ShowResult:
    """Extract one text's attention, summarise the chosen heads, write their heatmaps to `out`."""
    from attnviz.extract import extract, view
    from attnviz.figures import Style, render_text
    from attnviz.models import load_model
    from attnviz.summary import summarise

    folder = prepare_dir(out / slug(text)) if out is not None else None
    loaded = load_model(model, device)
    chosen_layers = loaded.info.pick_layers(layers)
    chosen_heads = loaded.info.pick_heads(heads)
    shown = view(extract(loaded, text, truncate=truncate), words, hide_special_tokens)
    summaries = summarise(shown, chosen_layers, chosen_heads, top_k)
    images = (
        render_text(shown, folder, chosen_layers, chosen_heads, style or Style())
        if folder is not None
        else []
    )
    return ShowResult(shown, chosen_layers, chosen_heads, summaries, folder, images)
