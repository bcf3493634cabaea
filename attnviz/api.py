"""The Python API: what a notebook needs, in a few calls. The command line runs the same
pipelines underneath.

    import attnviz
    a = attnviz.attention("The animal didn't cross the street because it was too tired.")
    a.tokens, a.weights.shape        # tuple of str; numpy (layer, head, query, key)
    a.heatmap(5, 3); a.query("it")   # matplotlib figures
    attnviz.importance(["It rained.", "The dog slept."]).scores  # numpy (layer, head)
    attnviz.needle(model="smollm2", lengths="1k,2k", depths=5).retrieval.top(5)

Models are loaded once per model and load settings in a process. Every function takes the
settings of `attnviz.core.settings.Load` as keywords besides `model` and `device`:

    implementation="sdpa"   the model's attention implementation (--attention): sdpa,
                            flash_attention_2 or eager
    dtype="auto"            the weights': auto (the checkpoint's on a GPU, float32 on a CPU),
                            float32, bfloat16, float16 (probabilities are float32 whatever it is)
    device_map=None         auto, balanced or sequential: accelerate spreads the layers over the
                            GPUs, the CPU and the disk
    max_memory=None         with device_map: {0: "20GiB", "cpu": "60GiB"}, or ["0=20GiB", …]
    offload_folder=None     with device_map: where what fits in no memory is kept
    quantize=None           "4bit" or "8bit" with bitsandbytes (CUDA only)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core import attention as core
from attnviz.core import models
from attnviz.core.settings import Load
from attnviz.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from attnviz.analysis.check import CheckResult
    from attnviz.analysis.compare import Comparison
    from attnviz.analysis.importance import Importance
    from attnviz.analysis.picture_compare import PictureComparison
    from attnviz.analysis.report import Report
    from attnviz.analysis.retrieval import NeedleResult
    from attnviz.analysis.tower import TowerView
    from attnviz.outputs.figures import Style


@dataclass(frozen=True, eq=False)
class Attention(core.Attention):
    """A text's attention (`attnviz.core.attention.Attention`: `weights[layer, head, query,
    key]` over `tokens`) with its figures and interactive page as methods, for notebooks.
    The figures are returned as matplotlib Figures; nothing is written."""

    reader: models.Model | None = None  # the model that read the text
    # a picture and a prompt: the vision tower's heads over the picture, from the same pass
    # (`analysis.tower.TowerView`: per tower layer and head its row over the picture, role
    # and mean attention distance; `as_dict()` is show --json's `tower`); None with
    # tower=False, or where the family's tower is not mapped (`notes` says why)
    tower: TowerView | None = None
    # a picture and a prompt to a model that reads the picture in cross-attention layers
    # (Mllama's): those layers from the same pass, an `attnviz.core.attention.Attention` of
    # the text's tokens (as read: not merged by words=, nor renormalised by hide_special=)
    # over the picture's keys, `weights` (cross layer, head, token, key); `key_tokens` each
    # key's label, `layout` the key-to-cell map (each tile's grid, its key indices and box on
    # the picture; each tile's CLS a mark). None for any other model
    cross: core.Attention | None = None

    def heatmap(self, layer: int, head: int, style: Style | None = None) -> Figure:
        """One head's query × key heatmap."""
        from attnviz.outputs.figures import HeadFigure, Labels, Style, head_title

        labels = Labels.of(self)
        figure = HeadFigure(labels, style or Style())
        grid = self.pattern(layer, head)  # (T, T)
        return figure.draw(grid, head_title(labels, layer, head, grid))

    def layer(self, layer: int, heads: list[int] | None = None, style: Style | None = None):
        """All heads (or `heads`) of one layer in a grid."""
        from attnviz.outputs.figures import Labels, LayerFigure, Style

        figure = LayerFigure(Labels.of(self), self.info.pick_heads(heads), style or Style())
        return figure.draw(self.weights[self.slot(layer)], layer)

    def overview(self, style: Style | None = None) -> Figure:
        """Every layer × head as small multiples, each scaled to its own max."""
        from attnviz.outputs.figures import Style, overview_figure, overview_mosaic

        style = style or Style()
        labels, each, every_layer, every_head = self._every_head()
        mosaic = overview_mosaic(labels, each, every_layer, every_head, style.dpi)
        return overview_figure(labels, mosaic, every_layer, every_head, style)

    def query(self, token: str | int, style: Style | None = None) -> Figure:
        """Where one token (`"it"`, `"it#2"` or a position) looks, in every head."""
        from attnviz.analysis.query import find_query
        from attnviz.outputs.figures import Style, query_figure, query_rows

        index, style = find_query(self, str(token)), style or Style()
        labels, each, every_layer, every_head = self._every_head()
        rows = query_rows(labels, each, index, every_layer, every_head, style)
        return query_figure(labels, index, rows, every_layer, every_head, style)

    def _every_head(self) -> tuple[Any, list[Any], list[int], list[int]]:
        """What the overview and the query figure draw: the labels, each held layer's weights
        (H, T, S), the layers and the heads."""
        from attnviz.outputs.figures import Labels

        layers = self.held_layers()
        each = [self.weights[self.slot(layer)] for layer in layers]
        return Labels.of(self), each, layers, self.heads_held()

    def to_html(self, scale: str = "absolute", cmap: str = "viridis") -> str:
        """The interactive page (head, model, matrix, query and inside-one-head views, the
        measure switch; a picture's also its view over the picture) as one self-contained
        HTML string: nothing in it loads from the network. It reads the text again for the
        inside view; a notebook cell showing the Attention shows a page made from its
        weights alone. A picture and a prompt's page (the answer and the vision tower over
        the picture) is made from its weights alone too, without the inside view: the
        prompt is not read again (its processor's picture and the answer written)."""
        from attnviz.outputs.figures import Style
        from attnviz.outputs.html import build_page
        from attnviz.pipelines import readers
        from attnviz.pipelines.consumers.page import Page
        from attnviz.pipelines.request import ShowRequest
        from attnviz.pipelines.views import PROMPTED_INSIDE, notebook_page

        if self.layout is not None or self.cross is not None:  # read again as text, it
            # would be another run's page
            return notebook_page(self, PROMPTED_INSIDE, self.tower, scale, cmap, self.cross)

        # The inside view needs each layer's input and the measure switch every measure,
        # which `attention()` does not keep: this runs the text once more (`attnviz show
        # --html` gets all of it from one pass). A generated target is read again from the
        # text it decoded to, which can differ from the ids it wrote.
        if self.reader is None:
            raise InputError(
                "this Attention has no model to read it again: make it with attention()"
            )
        request = ShowRequest(
            self.reader.settings,
            text=self.text,
            picture=self.picture.read_from if self.picture is not None else None,
            pair=self.pair,
            target=self.target,
            stack=self.stack,
            layers=None if self.stack else tuple(self.held_layers()),
            truncate=self.truncated,
            words=self.unit == "word",
            hide_special=self.hidden_special,
            measure=self.measure,
            html=True,
            style=Style(scale=scale, cmap=cmap),
        )
        page = Page(request)
        att, options = page.contents(readers.run(request, [page]))
        return build_page(att, **options)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """What a notebook cell showing an Attention shows: one line of text and one rich
        view, made once from these weights (the model does not run, and nothing else is
        drawn however often the cell shows it). The view is the page in a sandboxed frame
        (its script and Content-Security-Policy stay its own), pooled as `show --html` pools
        a long text's; the inside view is left out, as it needs each layer's input, which
        `attention()` does not keep (`to_html()` reads the text again for the whole page).
        An encoder-decoder model's page needs its three stacks: its view is the overview."""
        return {"text/html": self._notebook_view, "text/plain": self._line}

    @functools.cached_property
    def _notebook_view(self) -> str:
        import html

        if self.keys is not None:  # cross-attention: the page shows all three stacks
            import base64

            from attnviz.outputs.figures import figure_png

            png = base64.b64encode(figure_png(self.overview())).decode("ascii")
            return f'<img alt="{html.escape(self._line)}" src="data:image/png;base64,{png}">'
        from attnviz.pipelines.views import notebook_page

        page = html.escape(notebook_page(self, tower=self.tower, cross=self.cross), quote=True)
        return (
            f'<iframe srcdoc="{page}" sandbox="allow-scripts" '
            'style="width:100%;height:720px;border:1px solid #ddd"></iframe>'
        )

    @property
    def _line(self) -> str:
        """`Attention: 6 layers × 12 heads over 16 tokens (all-MiniLM-L6-v2 (bundled))`."""
        n_layers, n_heads, n, _ = self.weights.shape
        return (f"Attention: {n_layers} layer{'s' * (n_layers != 1)} × {n_heads} "
                f"head{'s' * (n_heads != 1)} over {n} {self.unit}s ({self.info.name})")  # fmt: skip


def attention(
    text: str | Any,
    model: str | None = None,
    words: bool = False,
    hide_special: bool = False,
    truncate: bool = False,
    device: str = "auto",
    layers: list[int] | None = None,
    pair: str | None = None,
    measure: str = "weights",
    target: str | None = None,
    generate: int | None = None,
    stack: str | None = None,
    implementation: str = "sdpa",
    sample: bool = False,
    temperature: float | None = None,
    seed: int | None = None,
    fusion: str = "mean",
    discard: float = 0.0,
    to: str | Path | None = None,
    picture: str | Path | Any = None,
    raw: bool = False,
    tower: bool = True,
    **load: Any,
) -> Attention:
    """Attention of one text: `weights[layer, head, query, key]` over `tokens` (rows sum to 1).

    Every map asked for is held whole, at any length: in memory where it fits (the memory
    available less a margin, or `ATTNVIZ_MEMORY_LIMIT`); where it does not, the call is
    refused in one line, before the model runs, with the size and what would fit (fewer
    `layers`, `to`, a shorter text). `to` ("attention.npy") writes the weights to that file
    as the pass makes them (the free disk checked first) and `weights` is then its read-only
    memory map: 4,096 tokens of SmolLM2 (17 GB of maps) with a few GiB of memory.

    `words` merges word pieces into words; `hide_special` drops [CLS]/[SEP]/BOS and renormalises
    each row; `truncate` cuts a text longer than the model takes (and says so in `notes`);
    `layers` keeps only those layers (`weights[i]` is layer `layers[i]`; `pattern(layer, head)`
    finds one), which is what makes long texts fit in memory.
    `pair` (encoders): read `[CLS] text [SEP] pair [SEP]` with token types; `segments` then
    says which sentence each token is in.
    `measure` "norm" gives ‖α·f(x)‖ per head instead of the weights; "alti" and "rollout"
    one map per layer, composed from layer 0 up, as `weights[layer, 0]` (`per_layer` is True;
    docs/contributions.md says how each is computed); rollout's heads fused by their
    `fusion` ("mean", "max" or "min") with the `discard` share of each fused map's lowest
    entries set to 0 (vit-explain's options).
    A decoder continues `text` as its prompt: `generate` tokens written by the model (greedy;
    with `sample`, drawn at `temperature` from a generator seeded with `seed`), or `target`
    read by teacher forcing; the attention is over prompt + continuation, and
    `continuation` says where it starts and each of its tokens' probabilities.
    An encoder-decoder model (T5, BART, Marian) reads `text` as its source and `target` as the
    decoder's input (teacher forcing), or writes its own target greedily (`generate` tokens at
    most); the result is one `stack`'s attention: "cross" (the default with a target:
    `tokens` are the target's, `key_tokens` the source's, weights (L, H, T, S)), "encoder" or
    "decoder". Without `target` or `generate` it is the encoder's self-attention (nothing is
    written; `notes` says how to see the others), and "decoder" or "cross" is refused.
    A vision model (ViT, DeiT, DINOv2, CLIP's vision tower) reads a picture: `text` is then
    an image file's path or a PIL image, prepared by the model's own image processor; its
    tokens are `CLS`, `dist`, `reg0`… and the patches `(row, col)`, and `picture` holds the
    picture as the model saw it and its patch grid (`core.images.Picture`).
    A vision-language model (LLaVA, Qwen2-VL, PaliGemma, …) reads `text` as a prompt about
    `picture` (a path or a PIL image), through its processor's chat template (as it is with
    `raw`); each image token is labelled by its cell of the picture and `layout` says where
    each sits (`core.layouts.Layout`); with `generate` or `target`, as a decoder's. Its
    vision tower's heads are read in the same pass into `tower` (`analysis.tower.TowerView`:
    each tower layer's and head's row over the picture, role and mean attention distance);
    `tower=False` leaves the tower unread (its layers run the model's own attention).
    Mllama reads the picture in cross-attention layers instead: `weights` are its
    self-attention layers, and `cross` those layers over the picture's keys, each key's cell
    in `cross.layout` (`core.cross_picture`).
    `implementation` is the model's attention: "sdpa" (the probabilities recorded inside the
    model's attention call, from its own q and k, in blocks of rows; the other layers run
    SDPA), "flash_attention_2" (the same) or "eager" (the model's own); `load` the other load
    settings (dtype, device_map, …: see the module's docstring).
    """
    from attnviz.core.images import looks_like_picture
    from attnviz.pipelines import checks, readers
    from attnviz.pipelines.request import ShowRequest

    prompt = text if picture is not None else None
    picture = picture if picture is not None else text if looks_like_picture(text) else None
    request = ShowRequest(
        _load(model, device, implementation, **load),
        text=text
        if picture is None or prompt is not None
        else getattr(picture, "name", None) or "image",
        picture=picture,
        prompt=prompt,
        raw=raw,
        pair=pair,
        target=target,
        generate=generate,
        sample=sample,
        temperature=temperature,
        seed=seed,
        layers=tuple(layers) if layers else None,
        stack=stack,
        truncate=truncate,
        words=words,
        hide_special=hide_special,
        measure=measure,
        fusion=fusion,
        discard=discard,
        tower=tower,
    )
    reader = request.model()
    checks.before_loading(request, reader)
    run = readers.hold(request, _weights_file(to, request))
    shown = run.shown
    return Attention(**{f.name: getattr(shown, f.name) for f in fields(shown)}, reader=reader,
                     tower=run.made.tower, cross=run.cross)  # fmt: skip


def _weights_file(to: str | Path | None, request: Any) -> Path | None:
    """`to`, checked before anything loads: a `.npy` name in a folder that can be written
    (its free disk is checked once the size is known), for the weights as the model made
    them."""
    from attnviz.core.held import npy_target

    if to is None:
        return None
    given = [name for name, asked in (("words", request.words),
             ("hide_special", request.hide_special),
             (f"measure={request.measure!r}", request.measure != "weights")) if asked]  # fmt: skip
    if given:
        raise InputError(
            f"to= writes the weights as the model made them; leave out {', '.join(given)} "
            "(attnviz.analysis.transforms makes those views of the file's weights)"
        )
    return npy_target(to, 0)


def check(
    text: str | Any,
    model: str | None = None,
    layers: list[int] | None = None,
    tolerance: float | None = None,
    truncate: bool = False,
    device: str = "auto",
    target: str | None = None,
    generate: int | None = None,
    stacks: list[str] | None = None,
    **load: Any,
) -> CheckResult:
    """Recompute the chosen layers (default: all) from scratch and compare with the model.
    An encoder-decoder model reads `text` as its source and `target` (or its own greedy
    output, `generate` tokens at most) as the decoder's input; each of `stacks` (default all:
    "encoder", "decoder", "cross") is checked, one `CheckResult` per stack in `stacks`.
    A vision model (ViT, DeiT, DINOv2) reads a picture: `text` is then an image file's path
    or a PIL image, as `attention` reads it.
    `tolerance` None is the model's dtype's (`analysis.check.TOLERANCES`)."""
    from attnviz.core.images import looks_like_picture
    from attnviz.pipelines.check import check as run_check
    from attnviz.pipelines.request import CheckRequest

    picture = text if looks_like_picture(text) else None
    if picture is not None:
        text = getattr(picture, "name", None) or "image"
    found = run_check(
        CheckRequest(_load(model, device, **load), text=text, picture=picture, target=target,
                generate=generate, layers=tuple(layers) if layers else None,
                stacks=tuple(stacks or ()),
                truncate=truncate, tolerance=tolerance)
    )  # fmt: skip
    return _printable(found, "print_check")


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
    thresholds, batch_size, truncate, min_count, margin) and the load settings (dtype,
    device_map, …: see the module's docstring).
    With a vision model, `sentences` names pictures (a folder, a picture file, or a list of
    them): each head's mean attention distance, CLS's entropy and shares, sink and local
    shares, averaged over the pictures (`analysis.vision_report.PictureReport`; options:
    layers, heads, batch_size)."""
    from attnviz.core.images import pictures_in
    from attnviz.core.inputs import read_sentences
    from attnviz.core.treebank import read_treebank
    from attnviz.pipelines.report import build_report

    named = [sentences] if isinstance(sentences, (str, Path)) else None
    if named is None and sentences is not None and treebank is None:
        sentences = list(sentences)
        named = sentences if all(isinstance(s, (str, Path)) for s in sentences) else None
    pictures = pictures_in([str(s) for s in named]) if named else None
    if pictures is not None:
        return _picture_report(pictures, model, device, options)
    if treebank is not None:
        if sentences is not None:
            raise InputError("give sentences or a treebank, not both")
        chosen: Any = read_treebank(str(treebank))
    elif sentences is None:
        raise InputError("give sentences (texts, or a Path to a file) or treebank=FILE.conllu")
    elif isinstance(sentences, Path):
        chosen = read_sentences(str(sentences), None)
    else:
        chosen = read_sentences(
            None, [sentences] if isinstance(sentences, str) else list(sentences)
        )
    settings = {f.name: options.pop(f.name) for f in fields(Load) if f.name in options}
    found = build_report(models.get(_load(model, device, **settings)).load(), chosen, **options)
    return _printable(found, "print_seq2seq_report" if hasattr(found, "cross") else "print_report")


def _picture_report(pictures: Any, model: str | None, device: str, options: dict) -> Any:
    from attnviz.pipelines import checks
    from attnviz.pipelines.picture_report import build_picture_report
    from attnviz.pipelines.request import ReportRequest

    settings = {f.name: options.pop(f.name) for f in fields(Load) if f.name in options}
    loaded = models.get(_load(model, device, **settings)).load()
    checks.against(ReportRequest(pictures=pictures), loaded.info)
    found = build_picture_report(loaded, pictures, **options)
    return _printable(found, "print_picture_report")


def importance(
    texts: str | Path | Iterable[str],
    model: str | None = None,
    method: str = "ablation",
    ablation: str = "zero",
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    truncate: bool = False,
    device: str = "auto",
    **load: Any,
) -> Importance:
    """How much each head matters to the model's objective over `texts` (a text, a list, or
    a Path to a file with one per line), by `method` "ablation" (`ablation` "zero" or "mean")
    or "gradient": `scores[layer, head]` (larger = more important, NaN where not measured),
    `clean` (the objective with nothing removed), `objective` (its definition in words).
    `load`: the other load settings (dtype, device_map, …: see the module's docstring).
    """
    from attnviz.analysis.importance import importance as measure
    from attnviz.core.inputs import read_sentences
    from attnviz.core.tokens import encode

    if isinstance(texts, Path):
        chosen = read_sentences(str(texts), None)
    else:
        chosen = read_sentences(None, [texts] if isinstance(texts, str) else list(texts))
    loaded = models.get(_load(model, device, **load)).load()
    encoded = [encode(loaded, item.text, truncate) for item in chosen.items]
    return _printable(measure(loaded, encoded, method, ablation, layers, heads), _importance_lines)


def compare(
    a: str | Path | Iterable[tuple[str, str]],
    b: str | None = None,
    model: str | None = None,
    against_model: str | None = None,
    words: bool = False,
    measure: str = "weights",
    truncate: bool = False,
    device: str = "auto",
    picture: str | Path | Sequence[str | Path] | None = None,
    generate: int | None = None,
    target: str | None = None,
    **load: Any,
) -> Comparison | PictureComparison:
    """How far each head's pattern moves from text `a` to text `b` (one model), or from
    `model` to `against_model` on the same text (`b` left out) or on `b`.

    With a vision-language model, `picture`: one picture and `a`, `b` two questions about
    it, or two pictures (`picture=(A, B)`) and `a` the question about each; `generate` N
    tokens or a `target` answers each. It returns a `PictureComparison`
    (`analysis.picture_compare`): per layer and head, the picture's share of the answer's
    attention in A and in B (`share_a`, `share_b`, `change`) and the Jensen–Shannon
    divergence (nats) between A's and B's mean answer rows over the picture's cells,
    renormalised (`divergence`; `moved(n)`), as `attnviz compare a.png b.png "Q" --json`.

    `a` may also be pairs: a list of (text A, text B), or a Path to a file of
    `text A<TAB>text B` lines; the per-head figures are then means over the pairs. With a
    vision model, `a` and `b` are picture files, their patches aligned by grid position.
    The result's `divergence[layer, head]` is the Jensen–Shannon divergence (natural log,
    nats) between A's and B's row of each aligned query, each row renormalised over the
    aligned keys, averaged over every aligned query (special tokens included);
    `role_change` and `special_change` are B's scores minus A's; `a`, `b` and `alignment`
    are the (first) pair's attentions and which tokens correspond (`words`: whole words, as
    two models with different tokenizers need). `measure` is a per-head measure (weights or
    norm). `as_dict()` is what `attnviz compare --json` prints of it. `load`: the other load
    settings of both models (dtype, device_map, …: see the module's docstring).
    """
    from attnviz.core.inputs import (
        picture_pair,
        questions_about,
        read_sentences,
        split_compare_pairs,
    )
    from attnviz.pipelines.compare import compare as run_compare
    from attnviz.pipelines.request import CompareRequest

    if picture is not None:
        questions = questions_about(a, b, picture)
        asked = CompareRequest(_load(model, device, **load), questions=questions,
                               generate=generate, target=target, images=False, top=1)  # fmt: skip
        return _printable(run_compare(asked).comparison, _picture_comparison_lines)
    pictures = None
    if isinstance(a, (str, Path)):  # one or two picture files, read by a vision model
        found = picture_pair(str(a), b, against_model is not None)
        if found is not None:
            (a, b), pictures = found[0][0], found[1]
    if isinstance(a, Path):
        if b is not None:
            raise InputError("give a file of pairs, or two texts, not both")
        pairs = split_compare_pairs(read_sentences(str(a), None), against_model is not None)
    elif isinstance(a, str):
        if b is None and against_model is None:
            raise InputError("give text b, or against_model to read text a with a second model")
        pairs = [(a, b if b is not None else a)]
    else:
        pairs = [(first, second) for first, second in a]
    how = _load(model, device, **load)
    against = replace(how, model=against_model) if against_model is not None else None
    asked = CompareRequest(how, pairs=tuple(pairs), against=against, words=words,
                    measure=measure, truncate=truncate, top=1, pictures=pictures,
                    generate=generate, target=target)  # fmt: skip
    return _printable(run_compare(asked).comparison, _comparison_lines)


def needle(
    model: str | None = None,
    haystack: str | Path | None = None,
    needle_text: str | None = None,
    question: str | None = None,
    lengths: str | Iterable[int] = "1k,2k,4k,8k",
    depths: int = 11,
    answer_tokens: int = 48,
    ablate_top: Iterable[int] = (),
    seeds: int = 3,
    out: str | Path | None = None,
    device: str = "auto",
    **load: Any,
) -> NeedleResult:
    """A decoder's retrieval heads (Wu et al. 2024), as `attnviz needle` finds them: the
    needle hidden in `haystack` (a text file or folder; None: the bundled text) at each of
    `lengths` (tokens: "1k,2k" or [1000, 2000]) and `depths` (that many, 0 % to 100 %), the
    model's greedy answers, and each head's retrieval score: `retrieval.scores[layer, head]`
    (None where no answer held the needle), `runs` (each answer, its recall, its per-head
    scores), `ablations` (with `ablate_top`: recall with the k best heads removed, and with
    k random heads, `seeds` draws). With `out`, the runs are kept there as they finish (a
    call again resumes) with the command's files."""
    from attnviz.core.haystack import depths as every_depth
    from attnviz.core.haystack import parse_lengths
    from attnviz.pipelines.needle import needle as run
    from attnviz.pipelines.request import NeedleRequest

    asked = parse_lengths(lengths) if isinstance(lengths, str) else tuple(sorted(set(lengths)))
    request = NeedleRequest(
        _load(model, device, **load), haystack=None if haystack is None else str(haystack),
        needle=needle_text, question=question, lengths=asked, depths=every_depth(depths),
        answer_tokens=answer_tokens, ablate_top=tuple(sorted(set(ablate_top))), seeds=seeds,
        out=None if out is None else Path(out),
    )  # fmt: skip
    return _printable(run(request)[0], "print_needle")


def unload(*models_named: str | None) -> int:
    """Let go of the models this process keeps loaded: those of the names given, as given to
    `attention(model=…)` (None: the bundled one), or every one when none is named. A model is
    freed once nothing else holds it (a result keeps its `reader`, which holds no weights);
    what the C allocator and torch's GPU cache held of it goes back too. Returns how many
    loaded models were let go. The process keeps the models last used anyway, the newest
    whatever its size and the others while they take at most `core.models.KEEP_BYTES`."""
    from attnviz.core.memory import return_freed_memory

    count = models.unload(*models_named)
    return_freed_memory()
    return count


# ---------- what print() shows of a result ----------

_PRINTABLE: dict[type, type] = {}


def _printable(result: Any, render: str | Any) -> Any:
    """`result`, as an instance of a subclass of its type whose `str()` (what `print` shows)
    is what the command line prints of it: `render` names an `outputs.terminal` function, or
    is a function (console, result) of its own. The fields and every method stay."""
    kind = type(result)
    if kind not in _PRINTABLE:

        def text(self: Any) -> str:
            import io

            from rich.console import Console

            from attnviz.outputs import terminal

            draw = getattr(terminal, render) if isinstance(render, str) else render
            buffer = io.StringIO()
            draw(Console(width=100, file=buffer, color_system=None, soft_wrap=False), self)
            return buffer.getvalue().rstrip("\n")

        _PRINTABLE[kind] = type(kind.__name__, (kind,), {"__str__": text, "__module__": __name__})
    printable = object.__new__(_PRINTABLE[kind])
    printable.__dict__.update(result.__dict__)  # a frozen dataclass: its fields as they are
    return printable


def _importance_lines(console: Any, found: Any) -> None:
    said = f"Importance by {found.method}: {found.objective} over {found.texts} texts"
    console.print(f"{said} (nothing removed: {found.clean:.4f} {found.unit})", highlight=False)
    for layer, head, score in found.top(5):
        console.print(f"  L{layer} H{head}  {score:.4f}", highlight=False)


def _comparison_lines(console: Any, found: Any) -> None:
    import numpy as np

    moved = found.divergence
    layer, head = np.unravel_index(np.nanargmax(moved), moved.shape)
    console.print(
        f"Comparison of {len(found.pairs)} pair(s): JS divergence {np.nanmean(moved):.4f} nats "
        f"on average over the heads; moved most: L{layer} H{head} ({moved[layer, head]:.4f})",
        highlight=False,
    )


def _picture_comparison_lines(console: Any, found: Any) -> None:
    import numpy as np

    moved = found.divergence
    slot, head = np.unravel_index(np.argmax(moved), moved.shape)
    console.print(
        f"Comparison of {'two pictures' if found.two_pictures else 'two questions'}: the "
        f"picture's share {found.share_a.mean():.1%} in A, {found.share_b.mean():.1%} in B "
        f"(the mean of the heads); JS divergence over the cells {moved.mean():.4f} nats on "
        f"average; moved most: L{found.layers[slot]} H{head} ({moved[slot, head]:.4f})",
        highlight=False,
    )


def _load(
    model: str | None,
    device: str = "auto",
    implementation: str = "sdpa",
    max_memory: Mapping[Any, str] | Iterable[str] | None = None,
    offload_folder: str | Path | None = None,
    **settings: Any,
) -> Load:
    """The load settings from the API's keywords: `max_memory` as transformers takes it
    ({0: "20GiB", "cpu": "60GiB"}) or as the command line does (["0=20GiB", "cpu=60GiB"])."""
    if isinstance(max_memory, Mapping):
        max_memory = [f"{device}={size}" for device, size in max_memory.items()]
    folder = str(offload_folder) if offload_folder is not None else None
    return Load(model, device, implementation, max_memory=tuple(max_memory or ()),
                       offload_folder=folder, **settings)  # fmt: skip
