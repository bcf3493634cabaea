"""`attnviz export`: heatmap files for many sentences, batched, parallel, resumable.

Each sentence gets a folder `NNNN-slug-hash/` (its number, the start of its text and a hash
of the text) with its figures and, written last, `done.json`. A folder whose `done.json`
records the same settings is complete and is skipped on a re-run; anything else in it is
redone. Every file is written atomically, so an interrupted run leaves whole files or none.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError, TextTooLongError
from attnviz.outputs.files import (
    clear_previous,
    prepare_dir,
    read_done,
    text_folder_name,
    write_atomic,
    write_done,
    write_text_atomic,
)
from attnviz.outputs.render import KINDS

if TYPE_CHECKING:
    from attnviz.analysis.inside import Inside
    from attnviz.core.attention import Attention, Encoded
    from attnviz.core.inputs import Sentence, Sentences
    from attnviz.core.models import LoadedModel, Model
    from attnviz.outputs.figures import Style


@dataclass(frozen=True)
class ExportOptions:
    """Everything that decides what an export writes (and so whether a folder is complete)."""

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    figures: tuple[str, ...] = KINDS
    words: bool = False
    hide_special: bool = False
    truncate: bool = False
    save_raw: bool = False
    fmt: str = "png"
    dpi: int = 100
    cmap: str = "viridis"
    scale: str = "absolute"
    query: str | None = None  # "it", "it#2" or a position: also each sentence's query figure
    html: bool = False  # also attention.html, the interactive page, in each sentence's folder


@dataclass
class Record:
    """What happened to one sentence."""

    index: int
    line: int
    text: str
    folder: str
    status: str  # written | complete (skipped) | too long (skipped)
    tokens: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ExportSummary:
    """Counts and time of one export run."""

    out: Path
    sentences: int = 0
    written: int = 0
    complete: int = 0
    blank: int = 0
    too_long: int = 0
    truncated: int = 0
    figures: int = 0
    seconds: float = 0.0
    render_seconds: float = 0.0  # after the model was loaded: forward passes and figures
    interrupted: bool = False
    skipped: dict[int, Record] = field(default_factory=dict)  # too-long sentences, by index

    def as_dict(self) -> dict[str, Any]:
        """The run's counts, time and where its manifest is (for `--json`)."""
        return {
            "out": str(self.out),
            "manifest": str(self.out / "manifest.json"),
            **{key: getattr(self, key) for key in COUNTS},
            "seconds": round(self.seconds, 3),
            "interrupted": self.interrupted,
        }


COUNTS = ("sentences", "written", "complete", "blank", "too_long", "truncated", "figures")


Progress = Callable[[Record, int], None]  # (record, figures written for it)


def _folder_name(sentence: Sentence, width: int) -> str:
    return f"{sentence.index:0{width}d}-{text_folder_name(sentence.text, 32)}"


def _settings(model_name: str, sentence: Sentence, options: ExportOptions) -> dict[str, Any]:
    return {"model": model_name, "text": sentence.text, **asdict(options)}


def _completed(folder: Path, settings: dict[str, Any]) -> Record | None:
    """The record of a folder finished earlier with the same settings, else None."""
    done = read_done(folder)
    if done is None or done.get("settings") != json.loads(json.dumps(settings)):
        return None
    record = Record(**done["record"])
    record.status = "complete"
    return record


def render_sentence(
    att: Attention,
    folder: Path,
    layers: list[int],
    heads: list[int],
    style: Style,
    options: ExportOptions,
    record: Record,
    settings: dict[str, Any],
    query: int | None = None,
    page: str | None = None,
) -> Record:
    """Write one sentence's figures (and raw array, and `page` as attention.html), then
    `done.json`; runs in a worker too."""
    from attnviz.outputs.render import render_text

    folder.mkdir(parents=True, exist_ok=True)
    clear_previous(folder, text_folder=True)
    written = render_text(att, folder, layers, heads, style, kinds=options.figures, query=query)
    if page is not None:
        written.append(write_text_atomic(folder / "attention.html", page))
    if options.save_raw:
        written.append(_save_raw(att, folder / "attention.npz", layers, heads))
    record.files = [str(path.relative_to(folder.parent)) for path in written]
    write_done(folder, settings, asdict(record))
    # Figures live in reference cycles; left to the collector's schedule, megabytes of pixel
    # buffers pile up over a long run. Cheap once the long-lived objects are frozen.
    gc.collect()
    return record


def _freeze_long_lived() -> None:
    """Move everything alive now (torch, transformers, matplotlib) out of the collector's view."""
    import matplotlib.figure  # noqa: F401  (imported here so that it is frozen too)

    gc.collect()
    gc.freeze()


def _save_raw(att: Attention, path: Path, layers: list[int], heads: list[int]) -> Path:
    import numpy as np

    weights = att.weights[np.ix_([att.slot(layer) for layer in layers], heads)]  # (l, h, T, T)
    return write_atomic(
        path,
        lambda handle: np.savez(
            handle,
            attention=weights,
            tokens=np.array(att.tokens),
            special=att.special,
            layers=np.array(layers),
            heads=np.array(heads),
        ),
    )


def export(
    model: Model,
    sentences: Sentences,
    out: Path,
    options: ExportOptions | None = None,
    batch_size: int = 8,
    jobs: int = 1,
    overwrite: bool = False,
    on_progress: Progress | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> ExportSummary:
    """Export heatmaps for every sentence under `out`, skipping complete folders."""
    options = options or ExportOptions()
    warn = on_warning or (lambda message: None)
    started = time.perf_counter()
    layers_asked = list(options.layers) if options.layers else None
    heads_asked = list(options.heads) if options.heads else None
    model.refuse_early(layers_asked, heads_asked)
    prepare_dir(out)
    if jobs > 1:
        from attnviz.outputs.render import start_workers

        start_workers(jobs)  # they import matplotlib while this process loads the model

    from attnviz.analysis.query import find_query
    from attnviz.analysis.transforms import transform
    from attnviz.core.tokens import encode
    from attnviz.outputs.figures import Style, check_cmap
    from attnviz.outputs.html import build_page

    style = Style(options.fmt, options.dpi, check_cmap(options.cmap), options.scale)
    loaded = model.load()
    _freeze_long_lived()
    layers = loaded.info.pick_layers(layers_asked)
    heads = loaded.info.pick_heads(heads_asked)
    width = max(4, len(str(len(sentences.items))))
    loaded_at = time.perf_counter()
    summary = ExportSummary(out=out, sentences=len(sentences.items), blank=sentences.blank)

    def report(record: Record) -> None:
        if record.status.startswith("too long"):
            summary.skipped[record.index] = record
        if on_progress:
            on_progress(record, _figures(record) if record.status == "written" else 0)

    def pending() -> Iterator[tuple[Any, Record, dict[str, Any]]]:
        """Encoded sentences still to do; complete and too-long ones are reported here."""
        for sentence in sentences.items:
            folder = out / _folder_name(sentence, width)
            settings = _settings(loaded.info.name, sentence, options)
            if not overwrite and (record := _completed(folder, settings)) is not None:
                summary.complete += 1
                report(record)
                continue
            record = Record(sentence.index, sentence.line, sentence.text, folder.name, "written")
            try:
                encoded = encode(loaded, sentence.text, options.truncate)
            except TextTooLongError as error:
                warn(f"{sentences.source}, line {sentence.line}: skipped, {error}")
                record.status = "too long (skipped)"
                summary.too_long += 1
                report(record)
                continue
            if encoded.notes:
                summary.truncated += 1
                warn(f"{sentences.source}, line {sentence.line}: {encoded.notes[0]}")
            yield encoded, record, settings

    queue: deque = deque()

    def encoded_only() -> Iterator[Any]:
        for encoded, record, settings in pending():
            queue.append((record, settings))
            yield encoded

    def finished(records: list[Record]) -> None:
        for done in records:
            summary.written += 1
            summary.figures += _figures(done)
            report(done)

    renderer = _Renderer(jobs)
    try:
        for att, inside in _attention(loaded, encoded_only(), batch_size, layers, options.html):
            record, settings = queue.popleft()
            att = transform(att, options.words, options.hide_special)
            record.tokens = list(att.tokens)
            record.notes = list(att.notes)
            query = None
            if options.query is not None:
                try:
                    query = find_query(att, options.query)
                except InputError:
                    note = f"no query figure: '{options.query}' names no {att.unit} here"
                    record.notes.append(note)
                    warn(f"{sentences.source}, line {record.line}: {note}")
            folder = out / record.folder
            page = None
            if options.html:
                page = build_page(att, inside, options.scale, style.cmap, att.segments)
            job = (att, folder, layers, heads, style, options, record, settings, query, page)
            finished(renderer.submit(job))
        finished(renderer.finish())
    except KeyboardInterrupt:
        summary.interrupted = True
        renderer.cancel()
    finally:
        summary.seconds = time.perf_counter() - started
        summary.render_seconds = time.perf_counter() - loaded_at
        write_manifest(summary, sentences, width)
    return summary


def _attention(
    loaded: LoadedModel,
    encoded: Iterator[Encoded],
    batch_size: int,
    layers: list[int],
    inside: bool,
) -> Iterator[tuple[Attention, Inside | str | None]]:
    """Each text's attention, and with `inside` its inside-one-head numbers from the same
    batched forward pass (the page's inside view), in order."""
    from attnviz.analysis.inside import InsideSteps
    from attnviz.core.extract import attend, batched

    for batch in batched(encoded, batch_size):
        steps = InsideSteps(loaded, batch) if inside else None
        for row, att in enumerate(attend(loaded, batch, layers, also=[steps] if steps else [])):
            yield att, steps.result(row) if steps else None


def _figures(record: Record) -> int:
    return sum(1 for name in record.files if not name.endswith((".npz", ".html")))


class _Renderer:
    """Renders in this process (jobs=1) or in the drawing processes of `render`, keeping at
    most 2×jobs sentences in flight.

    The bound keeps memory flat however many sentences there are.
    """

    def __init__(self, jobs: int) -> None:
        from attnviz.outputs.render import start_workers

        self.jobs = jobs
        self.pool = start_workers(jobs) if jobs > 1 else None
        self.flight: deque = deque()

    def submit(self, job: tuple) -> list[Record]:
        if self.pool is None:
            return [render_sentence(*job)]
        self.flight.append(self.pool.submit(render_sentence, *job))
        finished = []
        while len(self.flight) >= 2 * self.jobs or (self.flight and self.flight[0].done()):
            finished.append(self.flight.popleft().result())
        return finished

    def finish(self) -> list[Record]:
        finished = [future.result() for future in self.flight]
        self.flight.clear()
        return finished

    def cancel(self) -> None:
        if self.pool is not None:
            from attnviz.outputs.render import stop_workers

            stop_workers()


def write_manifest(summary: ExportSummary, sentences: Sentences, width: int) -> None:
    """`manifest.json` (sentences, tokens, files, counts); `manifest.csv`, a row a sentence.

    Streamed from each folder's `done.json`, so nothing per sentence is held in memory.
    A sentence an interrupted run did not reach is listed as `pending`.
    """
    counts = {key: getattr(summary, key) for key in COUNTS}
    head = {
        "counts": counts,
        "interrupted": summary.interrupted,
        "seconds": round(summary.seconds, 3),
    }

    def records() -> Iterator[Record]:
        for sentence in sentences.items:
            folder = summary.out / _folder_name(sentence, width)
            if sentence.index in summary.skipped:
                yield summary.skipped[sentence.index]
                continue
            done = read_done(folder)
            if done is not None and "record" in done:
                yield Record(**done["record"])
            else:
                yield Record(sentence.index, sentence.line, sentence.text, folder.name, "pending")

    def write_json(handle) -> None:
        opening = json.dumps(head, ensure_ascii=False)[:-1] + ', "sentences": [\n'
        handle.write(opening.encode("utf-8"))
        for n, record in enumerate(records()):
            line = ("" if n == 0 else ",\n") + json.dumps(asdict(record), ensure_ascii=False)
            handle.write(line.encode("utf-8"))
        handle.write(b"\n]}\n")

    def write_csv(handle) -> None:
        text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
        writer = csv.writer(text)
        writer.writerow(
            ["index", "line", "status", "folder", "n_tokens", "tokens", "files", "text"]
        )
        for r in records():
            files = ";".join(Path(f).name for f in r.files)  # names inside `folder`
            writer.writerow(
                [
                    r.index,
                    r.line,
                    r.status,
                    r.folder,
                    len(r.tokens),
                    " ".join(r.tokens),
                    files,
                    r.text,
                ]
            )
        text.flush()
        text.detach()

    write_atomic(summary.out / "manifest.json", write_json)
    write_atomic(summary.out / "manifest.csv", write_csv)
