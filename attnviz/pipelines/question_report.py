"""`attnviz report QUESTIONS.jsonl -m VLM`: what a vision-language model's heads do with the
picture over many pictures and questions (`analysis.picture_heads`), as heads.csv,
heads.json, sinks.csv, report.md and the picture's share against layer.

Every line of the file and every picture is checked before the model loads; the model reads
one question a pass (each answered first where it is asked to be: `--generate N`, or the
line's "target"), its rows summed a block at a time; a picture's questions are read one
after another, so that its sink tokens are known before the next picture is read. Nothing is
written before every question has been read: bad input leaves no file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analysis.picture_heads import SINK_DRAW, TOP_K
from attnviz.errors import InputError
from attnviz.outputs.files import check_writable
from attnviz.pipelines import checks

if TYPE_CHECKING:
    from attnviz.analysis.picture_heads import Answered, QuestionReport
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.questions import Question, Questions
    from attnviz.pipelines.request import ReportRequest


def question_report(request: ReportRequest, **callbacks: Any) -> tuple[QuestionReport, list[Path]]:
    """Check `request` (options a question report cannot take, a model that reads no picture
    and prompt, layers and heads out of range, each picture readable), load the model, build
    the report over `request.questions` and write it to `request.out`. `callbacks`:
    on_progress (one a question), as `build_question_report` takes it."""
    from attnviz.core.images import read_picture
    from attnviz.core.models import describe
    from attnviz.outputs.question_report_files import write_question_report

    model = request.model()
    checks.questions(request, describe(model.name))
    layers, heads = list(request.layers or ()) or None, list(request.heads or ()) or None
    checks.ranges(model, layers, heads)
    check_writable(request.out)  # made when its files are written
    questions = request.questions
    for group in questions.by_picture():  # a picture that is no picture: said before loading
        try:
            read_picture(group[0].picture)
        except InputError as error:
            raise InputError(f"{questions.origin}, line {group[0].line}: {error}") from None
    loaded = model.load()
    checks.questions(request, loaded.info)  # a hub id: its files said nothing before it loaded
    result = build_question_report(loaded, questions, layers, heads, request.generate,
                                   on_progress=callbacks.get("on_progress"))  # fmt: skip
    return result, write_question_report(result, request.out, request.style)


def build_question_report(
    loaded: LoadedModel,
    questions: Questions,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    generate: int | None = None,
    top_k: int = TOP_K,
    sink_draw: float = SINK_DRAW,
    on_progress: Callable[[int], None] | None = None,
) -> QuestionReport:
    """Read every question through the model (answered with `generate` tokens, or its
    target, where given), picture by picture, summing each head's numbers of the chosen
    layers as the pass makes its rows; their means over the questions, and the sinks."""
    from attnviz.analysis.picture_heads import QuestionSums, token_labels

    info = loaded.info
    chosen, heads = info.pick_layers(layers), info.pick_heads(heads)
    sums = QuestionSums(chosen, info.n_heads, top_k, sink_draw)
    for group in questions.by_picture():
        answered, layout = [], None
        for question in group:
            found, layout = _answered(loaded, questions.origin, question, chosen, generate,
                                      top_k)  # fmt: skip
            answered.append(found)
            if on_progress:
                on_progress(1)
        with_answer = sum(q.target is not None or generate is not None for q in group)
        sums.add(group[0].given, token_labels(layout), answered, with_answer)
    return sums.report(info, heads, generate)


def _answered(loaded: LoadedModel, origin: str, question: Question, layers: list[int],
              generate: int | None, top_k: int) -> tuple[Answered, Any]:  # fmt: skip
    """One question read (and answered) in one pass: its numbers, and its picture's layout."""
    from attnviz.analysis.picture_heads import Question as Recorder
    from attnviz.analysis.picture_heads import text_rows
    from attnviz.core import capture, generation, memory, vlm
    from attnviz.core.tokens import pad

    where = f"{origin}, line {question.line}"
    try:
        encoded = vlm.encode(loaded, question.picture, question.prompt)
    except InputError as error:
        raise InputError(f"{where}: {error}") from None
    if encoded.layout is None:
        raise InputError(vlm.unplaced(loaded.info.name, encoded,
                                      "the report over pictures and questions"))  # fmt: skip
    reading = None
    if question.target is not None or generate is not None:
        tokens = None if question.target is not None else generate
        settings = generation.Settings(tokens, question.target)
        encoded, reading = generation.write(loaded, encoded, settings, layers)
    answer = encoded.continuation
    start = answer.start if answer is not None and answer.start < len(encoded) else None
    rows = text_rows(len(encoded), encoded.layout, encoded.special, start)
    if not rows:
        raise InputError(f"{where}: the prompt has no token after the picture to read it "
                         "by; put the picture before the question, or answer it "
                         "(--generate)")  # fmt: skip
    recorder = Recorder(layers, loaded.info.n_heads, encoded.layout, rows, top_k)
    block = memory.stream_rows(loaded.info.n_heads, len(encoded))
    capture.run(loaded, pad(loaded, [encoded]), [recorder], block_rows=block, reading=reading)
    return recorder.result(), encoded.layout
