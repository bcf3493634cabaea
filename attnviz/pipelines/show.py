"""`attnviz show`: one text through a model, summarised per head and drawn as heatmaps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.outputs.files import check_writable, clear_previous, prepare_dir, text_folder_name
from attnviz.pipelines import checks, features, readers
from attnviz.pipelines.consumers import Consumer, Run
from attnviz.pipelines.consumers.contributions import Contributions
from attnviz.pipelines.consumers.done import Done
from attnviz.pipelines.consumers.images import Images
from attnviz.pipelines.consumers.pictures import Pictures
from attnviz.pipelines.consumers.summary import Summary
from attnviz.pipelines.consumers.tower import Tower

if TYPE_CHECKING:
    from attnviz.analysis.ablation import AblationView
    from attnviz.analysis.continuation import Written
    from attnviz.analysis.query import QueryView
    from attnviz.analysis.summary import HeadSummary
    from attnviz.analysis.tower import TowerView
    from attnviz.analysis.vision import VisionHead
    from attnviz.core.attention import Attention
    from attnviz.core.models import Model
    from attnviz.pipelines.request import ShowRequest


@dataclass(frozen=True)
class ShowResult:
    """Everything `show` computed: the attention, per-head summaries and the images written."""

    attention: Attention  # after --words / --hide-special
    layers: list[int]
    heads: list[int]
    summaries: list[HeadSummary]  # this field and those below but folder, drawn, window: `Made`'s
    folder: Path | None
    images: list[Path] = field(default_factory=list)
    query: QueryView | None = None
    page: Path | None = None  # attention.html, with html=True
    # (L, H) each: the share special tokens take, by weight and by norm ‖α f(x)‖
    special_by_weight: Any = None
    special_by_norm: Any = None
    mixing: dict[int, dict[str, float]] | None = None  # alti: each layer's mixing ratios
    ablation: AblationView | None = None  # with ablate: the text with those heads removed
    # with ablate: (L, H) how far each kept head's pattern moved (JS divergence, nats)
    ablation_divergence: Any = None
    # what the figures show: `attention`, or it pooled; None where nothing draws it
    # (no images, and not one layer and head's heatmap)
    drawn: Attention | None = None
    window: Attention | None = None  # --window's exact cells
    # a decoder's --generate / --target: each continuation token and where it looked
    continuation: Written | None = None
    vision: list[VisionHead] | None = None  # a picture: what each head does on it
    tower: TowerView | None = None  # a picture and a prompt: the vision tower's heads
    # Mllama's picture and prompt: its cross-attention layers over the picture's keys
    cross: Attention | None = None

    @classmethod
    def of(cls, run: Run, folder: Path | None) -> ShowResult:
        """The result of `run` so far (its files once the writers have run)."""
        return cls(run.shown, run.layers, run.heads, folder=folder, drawn=run.drawn,
                   window=run.window, cross=run.cross, **run.made.as_fields())  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        from attnviz.analysis.contributions import MEASURES
        from attnviz.analysis.picture_share import cross_fields
        from attnviz.analysis.summary import AVERAGED

        att = self.attention
        heads = [s.as_dict(att.key_tokens) for s in self.summaries]
        if self.query is not None:
            for entry, row in zip(heads, self.query.heads):
                entry["query_top"] = row.as_dict()
        measure = MEASURES[att.measure]
        special = {}
        if self.special_by_weight is not None:
            import numpy as np

            def per_head(values: Any) -> list[list[float | None]]:  # null: a removed head
                rows = values.round(6).tolist()
                return [[None if np.isnan(v) else v for v in row] for row in rows]

            special = {
                "special_share": {
                    "weights": float(np.nanmean(self.special_by_weight)),
                    "norm": float(np.nanmean(self.special_by_norm)),
                    "per_head_weights": per_head(self.special_by_weight),
                    "per_head_norm": per_head(self.special_by_norm),
                }
            }
        return {
            "model": att.info.as_dict(),
            **att.info.ran(),
            "measure": {
                "name": measure.name,
                "unit": measure.unit,
                "per_layer": measure.per_layer,
                "help": measure.help,
                "cite": measure.cite,
            },
            "unit": att.unit,
            **_stack_fields(att),
            "tokens": list(att.tokens),
            "notes": list(att.notes),
            **({"continuation": self.continuation.as_dict()} if self.continuation else {}),
            **({"query": self.query.as_dict()} if self.query is not None else {}),
            **({"picture": _picture_fields(self)} if att.picture is not None else {}),
            **({"tower": self.tower.as_dict()} if self.tower is not None else {}),
            **({"cross": cross_fields(self.cross)} if self.cross is not None else {}),
            "averaged": AVERAGED + _MEASURED.get(measure.name, ""),
            **special,
            **({"mixing": self.mixing} if self.mixing is not None else {}),
            "heads": heads,
            "folder": str(self.folder) if self.folder is not None else None,
            "images": [str(p) for p in self.images],
            "page": str(self.page) if self.page is not None else None,
            **({"ablation": self._ablation_dict()} if self.ablation is not None else {}),
        }

    def _ablation_dict(self) -> dict[str, Any]:
        assert self.ablation is not None
        found = self.ablation.as_dict()
        if self.ablation_divergence is not None:  # NaN (a removed head) as null
            moved = self.ablation_divergence
            found["divergence"] = [[None if v != v else v for v in row] for row in moved.tolist()]
        return found


def _stack_fields(att: Attention) -> dict[str, Any]:
    """An encoder-decoder model's stack, target and key tokens (queries are `tokens`)."""
    if att.stack is None:
        return {}
    return {
        "stack": att.stack,
        "source": att.text,
        "target": att.target,
        "key_tokens": list(att.key_tokens),
    }


def _picture_fields(result: ShowResult) -> dict[str, Any]:
    """A picture's grid, where its patches start, and what each head does on it."""
    picture = result.attention.picture
    return {
        "name": picture.name,
        "size": [int(picture.pixels.shape[1]), int(picture.pixels.shape[0])],  # width, height
        "grid": list(picture.grid),
        "first_patch": picture.first,
        "patch": picture.patch,
        "heads": [head.as_dict() for head in result.vision or []],
    }


# What the summaries of a measure other than weights were computed on.
_MEASURED = {
    "norm": "; measure norm: each query's ‖α·f(x)‖ divided by the sum of its row (shares)",
    "alti": "; measure alti: one map per layer (head 0), composed from layer 0 up",
    "rollout": "; measure rollout: one map per layer (head 0), composed from layer 0 up",
}


def show(
    request: ShowRequest, on_summary: Callable[[ShowResult], None] | None = None
) -> ShowResult:
    """Read one text, summarise the chosen heads, write their heatmaps (and page) to its folder.

    Images go to `out/<slug>-<hash>/`, one folder per distinct text (and model, pair, measure,
    removed heads, target), holding only the files of its last run (listed in its
    `done.json`). The consumers of `request`'s features run around the one capture pass (see
    `pipelines.consumers`). `on_summary` gets the result without its files as soon as the
    summary is known, before any figure is drawn (the command line prints it meanwhile).
    """
    model = request.model()
    checks.before_loading(request, model, [request.text])
    folder = _folder(request, model)
    consumers = _consumers(request, folder)
    run = readers.run(request, consumers)
    if on_summary is not None:
        on_summary(ShowResult.of(run, folder))
    if folder is not None:
        prepare_dir(folder)
        clear_previous(folder, text_folder=True)
        for consumer in consumers:
            consumer.write(run, folder)
    return ShowResult.of(run, folder)


def _folder(request: ShowRequest, model: Model) -> Path | None:
    """The text's folder (proved writable now, made when its files are written), or None
    when nothing is written.
    One folder per text, model, pair, measure, removed heads, target and continuation (N
    tokens, sampled how): `show TEXT -m
    smollm2` keeps `show TEXT`'s images."""
    r = request
    if r.out is None:
        return None
    removed = ",".join(f"{layer}.{head}" for layer, head in r.ablate) or None
    keys = (
        model.folder_key,
        r.pair,
        None if r.measure == "weights" else r.measure,
        removed,
        f"target:{r.target}" if r.target is not None else None,
        f"generate:{r.generate}" if r.generate is not None else None,
        f"sample:{r.temperature}:{r.seed}" if r.sample else None,
        f"stack:{r.stack}" if r.stack is not None else None,
        f"rollout:{r.fusion}:{r.discard}" if (r.fusion, r.discard) != ("mean", 0.0) else None,
        _picture_key(r.picture),
    )
    return check_writable(r.out / text_folder_name(r.text, 40, *keys))


def _picture_key(picture: Any) -> str | None:
    """A picture file's full path (two pictures of one name are two folders); a PIL image's
    none (its name is "image")."""
    from pathlib import Path

    if isinstance(picture, (str, Path)):
        return f"picture:{Path(picture).resolve()}"
    return None


def _consumers(request: ShowRequest, folder: Path | None) -> list[Consumer]:
    """The summary and special shares always; then the features asked for; the writers last,
    a picture's views after the heatmaps (in the same drawing processes), a picture and a
    prompt's vision tower (read unless --no-tower), `Done` very last."""
    images = [Images(request)] if folder is not None and request.images else []
    pictures = [Pictures(request)] if request.picture is not None else []
    tower = [Tower(request)] if request.prompt is not None else []
    done = [Done(request)] if folder is not None else []
    return [Summary(request), Contributions(request), *features.consumers(request), *images,
            *pictures, *tower, *done]  # fmt: skip
