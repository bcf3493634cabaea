"""`attnviz compare` through a vision-language model: two pictures with one question
(`compare a.png b.png "What is on the table?" -m VLM`) or one picture with two questions
(`compare a.png "What is on it?" "What colour is it?" -m VLM`), head by head
(`analysis.picture_compare`): the picture's share of the answer's attention in A and in B, and
how far each head's look over the picture's cells moved.

Both pictures and the model's kind are checked before the model loads, both prompts are read
by the processor and their layouts compared before the model runs (two pictures whose cells
do not pair by place are refused), and nothing is written before both sides are read: bad
input leaves no file. Each side is one pass (answered first with `--generate N` or
`--target`), its answer's rows summed a block at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError
from attnviz.outputs.files import check_writable
from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.analysis.picture_compare import PictureComparison, Side
    from attnviz.core.attention import Encoded
    from attnviz.core.model_info import LoadedModel
    from attnviz.pipelines.request import CompareRequest

OVERVIEW = "divergence"  # the overview figure's file name, without its extension


@dataclass(frozen=True)
class QuestionCompareResult:
    """What `compare` of pictures and questions computed, and the images it wrote."""

    comparison: PictureComparison
    model: str
    top: int  # heads listed and drawn
    folder: Path | None
    images: list[Path]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            **self.comparison.as_dict(self.top),
            "folder": str(self.folder) if self.folder is not None else None,
            "images": [str(path) for path in self.images],
        }


def compare_questions(request: CompareRequest) -> QuestionCompareResult:
    """Check `request` (options it cannot take, a model that reads no picture and prompt, each
    picture readable, --out writable), load the model, read each side's picture and prompt
    (answered with `generate` tokens or `target`), compare them head by head and draw the
    divergence per head and the `top` heads that moved most into `out`."""
    from attnviz.analysis.picture_compare import compare_pictures, refuse_layouts
    from attnviz.core.images import read_picture
    from attnviz.core.models import describe

    r, pair = request, request.questions
    model = r.model()
    checks.questions(r, describe(model.name))
    for picture in dict.fromkeys(pair.pictures):  # not a picture: said before loading
        read_picture(picture)
    if r.out is not None and r.images:
        check_writable(r.out)  # made when its files are written
    loaded = model.load()
    checks.questions(r, loaded.info)  # a hub id: its files said nothing before it loaded
    prompts = [_encode(loaded, r, picture, prompt) for picture, prompt in pair.sides()]
    refuse_layouts(prompts[0].layout, prompts[1].layout)  # before either side is answered
    layers = loaded.info.pick_layers(None)
    sides = [_read(loaded, r, encoded, layers, str(picture), prompt)
             for encoded, (picture, prompt) in zip(prompts, pair.sides())]  # fmt: skip
    comparison = compare_pictures(*sides)
    folder, written = None, []
    if r.out is not None and r.images:
        folder, written = _draw(r, model, comparison, loaded.info.name)
    return QuestionCompareResult(comparison, loaded.info.name, r.top, folder, written)


def _encode(loaded: LoadedModel, request: CompareRequest, picture: Path, prompt: str) -> Encoded:
    """A side's picture and prompt as the model reads them, refusing a family whose image
    tokens attnviz cannot place on the picture."""
    from attnviz.core import vlm

    encoded = vlm.encode(loaded, picture, prompt, request.raw)
    if encoded.layout is None:
        raise InputError(vlm.unplaced(loaded.info.name, encoded, "compare"))
    return encoded


def _read(loaded: LoadedModel, request: CompareRequest, encoded: Encoded, layers: list[int],
          picture: str, prompt: str) -> Side:  # fmt: skip
    """One side answered (where asked) and read in one pass: the mean of its answer's rows."""
    import numpy as np

    from attnviz.analysis.picture_compare import AnswerRows, Side, answer_rows
    from attnviz.core import capture, memory
    from attnviz.core.extract import text_attention
    from attnviz.core.tokens import pad
    from attnviz.pipelines.readers import continued

    reading = None
    if request.continues:
        encoded, reading = continued(loaded, request, encoded, layers)
    n, heads = len(encoded), loaded.info.n_heads
    rows = answer_rows(n, encoded.continuation)
    recorder = AnswerRows(layers, heads, n, rows)
    capture.run(loaded, pad(loaded, [encoded]), [recorder],
                block_rows=memory.stream_rows(heads, n), reading=reading)  # fmt: skip
    no_map = np.zeros((len(layers), heads, 0, 0), np.float32)  # tokens and facts alone
    return Side(text_attention(encoded, loaded.info, layers, no_map), picture, prompt, rows,
                recorder.mean())  # fmt: skip


def _draw(request: CompareRequest, model: Any, comparison: PictureComparison,
          name: str) -> tuple[Path, list[Path]]:  # fmt: skip
    """The divergence per head and, for each of the `top` heads that moved most, A, B and
    B − A over the picture, written into one folder per comparison (holding only its last
    run's files): the folder and the figures' paths."""
    from textwrap import shorten

    from attnviz.outputs.figures import Style, divergence_figure, save_figure
    from attnviz.outputs.figures.pictures import compare_figure
    from attnviz.outputs.files import clear_previous, prepare_dir, text_folder_name, write_done

    r, c = request, comparison
    style = r.style or Style()
    (picture_a, prompt_a), (picture_b, prompt_b) = r.questions.sides()
    answer = f"generate:{r.generate}" if r.generate is not None else r.target
    folder_name = text_folder_name(prompt_a, 40, "compare", str(picture_a), str(picture_b),
                                   prompt_b, model.folder_key, answer, str(r.raw))  # fmt: skip
    folder = prepare_dir(r.out / folder_name)
    clear_previous(folder, text_folder=True)
    what = (f"{Path(c.a.picture).name} and {Path(c.b.picture).name}" if c.two_pictures
            else "two questions")  # fmt: skip
    heads = list(range(c.divergence.shape[1]))
    title = (f"How far each head's look over the picture moved ({what}; JS divergence over "
             f"the cells, nats)\n{name}")  # fmt: skip
    figure = divergence_figure(c.divergence, list(c.layers), heads, title, style)
    written = [save_figure(figure, folder / f"{OVERVIEW}.{style.fmt}", style)]
    if c.two_pictures:
        names = (Path(c.a.picture).name, Path(c.b.picture).name)
    else:
        names = tuple(f"“{shorten(s.prompt, 28, placeholder='…')}”" for s in (c.a, c.b))
    whose = ("where the answer looked" if c.a.att.continuation is not None
             else "where the prompt's last token looked")  # fmt: skip
    for layer, head, value in c.moved(r.top):
        slot = c.layers.index(layer)
        shares = (float(c.share_a[slot, head]), float(c.share_b[slot, head]))
        title = f"layer {layer} · head {head} · JS {value:.4f} nats · {whose} over the picture"
        figure = compare_figure(c.a.att, c.b.att, (c.cells_a[slot, head], c.cells_b[slot, head]),
                                shares, names, title, style)  # fmt: skip
        path = folder / f"layer-{layer}-head-{head}-pictures.{style.fmt}"
        written.append(save_figure(figure, path, style))
    settings = {"model": name, "pictures": [str(picture_a), str(picture_b)],
                "prompts": [prompt_a, prompt_b], "generate": r.generate, "target": r.target,
                "raw": r.raw, "top": r.top, **asdict(style)}  # fmt: skip
    record = {"files": [str(path.relative_to(folder.parent)) for path in written]}
    write_done(folder, settings, record)
    return folder, written
