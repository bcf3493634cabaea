"""A report in shards: one process's share of a corpus's work, kept as a *partial* (its sums
and what they are of), and the report of a complete set of partials.

`report --shard I/N --partial DIR` runs share I of N with no communication at all (a job
array's task); a distributed run's ranks run one share each and rank 0 gathers their partials
(`pipelines.distributed`); `attnviz merge` reads partials from folders (`pipelines.merge`).
Each partial names its model, its corpus (a digest of its texts) and the options its numbers
depend on, and a set of partials is refused in one line where these differ, or where a share
is missing, repeated or unfinished.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from attnviz.analysis.importance import ImportanceSums
    from attnviz.analysis.report import Report
    from attnviz.analysis.report_sums import ReportSums
    from attnviz.core.inputs import Sentences
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.models import Model
    from attnviz.core.treebank import Treebank
    from attnviz.pipelines.request import ReportRequest

FORMAT = 1  # of a partial's document
# report's options a share's numbers depend on, by their command-line names
OPTIONS = {"words": "--words", "layers": "--layer", "heads": "--head",
           "thresholds": "--threshold", "batch_size": "--batch-size", "truncate": "--truncate",
           "min_count": "--min-count", "margin": "--margin", "importance": "--importance",
           "ablation": "--ablation"}  # fmt: skip

Partial = tuple[dict[str, "np.ndarray"], dict[str, Any]]  # its arrays and its document


@dataclass(frozen=True)
class Share:
    """Share `index` of `count` of a corpus's work (0 ≤ index < count)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Share:
        """`--shard I/N`, or a one-line error."""
        index, slash, count = text.partition("/")
        if slash and index.strip().isdigit() and count.strip().isdigit():
            share = cls(int(index), int(count))
            if share.index < share.count:
                return share
        raise InputError(f"--shard '{text}': give I/N with 0 ≤ I < N, e.g. 0/4 (shard 0 of 4)")

    def __str__(self) -> str:
        return f"shard {self.index} of {self.count}"


def settings(model: Model, loaded: LoadedModel, sentences: Any, options: dict) -> dict[str, Any]:
    """What a partial's numbers are of: the model, the corpus (a digest of every text and
    annotation) and the options they depend on."""
    from attnviz.analysis.roles import Thresholds

    digest = hashlib.sha256(sentences.origin.encode("utf-8"))
    for item in sentences.items:
        digest.update(json.dumps(asdict(item), ensure_ascii=False, sort_keys=True).encode())
    chosen = {name: options.get(name) for name in OPTIONS}
    chosen["thresholds"] = (chosen["thresholds"] or Thresholds()).values
    return {
        "model": {**loaded.info.as_dict(), "attention": model.implementation},
        "corpus": {"source": sentences.origin, "digest": digest.hexdigest()},
        "options": chosen,
    }


def _difference(found: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """What sets two partials' settings apart, in words; None if nothing does."""
    if found["model"] != expected["model"]:
        return f"another model ({found['model']['name']}, not {expected['model']['name']})"
    if found["corpus"] != expected["corpus"]:
        return f"another corpus ({found['corpus']['source']}, not {expected['corpus']['source']})"
    for name, option in OPTIONS.items():
        if found["options"][name] != expected["options"][name]:
            return (f"another option set ({option} {found['options'][name]}, not "
                    f"{expected['options'][name]})")  # fmt: skip
    return None


class Keeper:
    """Writes one share's partial (to `path`; None: nowhere) and reads it back for --resume.

    A partial is written once its share's pass is done, and again once its importance is (a
    share without --importance is then done at once): --resume skips what it holds.
    """

    def __init__(
        self, path: Path | None, share: Share, found: dict[str, Any], loaded: LoadedModel,
        read: Any, sentences: Any,
    ) -> None:  # fmt: skip
        from attnviz.core.treebank import Treebank

        self.path, self.share, self.settings = path, share, found
        treebank = None
        if isinstance(sentences, Treebank):
            treebank = {"has_syntax": sentences.has_syntax, "source": sentences.origin,
                        "has_coreference": sentences.has_coreference,
                        "notes": list(sentences.notes)}  # fmt: skip
        self.facts = {
            "format": FORMAT,
            "shard": [share.index, share.count],
            "settings": found,
            "info": loaded.info.as_dict(),
            "treebank": treebank,
            # what the report says of the whole corpus: the same in every share, kept in one
            "corpus": None,
        }
        if share.index == 0:
            self.facts["corpus"] = {
                "kept": list(read.kept),
                "lengths": list(read.lengths),
                "skipped": list(read.skipped),
                "notes": list(read.notes),
                "batch_size": read.batch_size,
            }

    def partial(self, sums: ReportSums, done: bool, probes: Any, objectives: dict) -> Partial:
        """The share's arrays and document."""
        from attnviz.analysis.report_sums import pack

        arrays, packed = pack(sums)
        stored = None
        if probes is not None:
            arrays["probes.scores"] = probes.scores
            stored = {key: value for key, value in asdict(probes).items() if key != "scores"}
        document = {**self.facts, "done": done, "texts": sums.texts, "probes": stored,
                    "objectives": objectives, "sums": packed}  # fmt: skip
        return arrays, document

    def save(self, sums: ReportSums, done: bool, probes: Any, objectives: dict) -> Partial:
        """Write the partial (where there is a path) and return it."""
        from attnviz.outputs.partials import write_partial

        found = self.partial(sums, done, probes, objectives)
        if self.path is not None:
            write_partial(self.path, *found)
        return found

    def finished(self) -> Partial | None:
        """What an earlier run of this share left (for --resume), refusing one of another
        run; None where there is none."""
        from attnviz.outputs.partials import read_partial

        if self.path is None or not self.path.is_file():
            return None
        arrays, document = read_partial(self.path)
        differs = _difference(document["settings"], self.settings)
        if differs is not None:
            raise InputError(f"--resume: {self.path} is {self.share} of {differs}; remove it, "
                             "or give another --partial folder")  # fmt: skip
        return arrays, document


def run_share(
    model: Model,
    loaded: LoadedModel,
    sentences: Sentences | Treebank,
    share: Share,
    path: Path | None,
    resume: bool = False,
    exchange: Callable[[ImportanceSums], ImportanceSums] | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_importance: Callable[[int, int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    request: ReportRequest | None = None,
    **options: Any,
) -> Partial:
    """Run share `share` of the report's work (its batches, and its part of importance),
    writing its partial to `path` as it goes; with `resume`, what `path` holds is not run
    again. `exchange` gives mean ablation the clean sums of every share (from this one's);
    `on_start(texts)` says how many texts the share has, `on_progress(n)` as they are done;
    `request` is checked against the loaded model (`checks.against`)."""
    from attnviz.analysis.report_sums import unpack
    from attnviz.pipelines import checks, corpus

    if request is not None:  # a hub id's files said nothing before it loaded
        checks.against(request, loaded.info)
    layers, heads = options.get("layers"), options.get("heads")
    methods = checks.before_pass(loaded, layers, heads, options.get("importance"))
    batch_size, truncate = options.get("batch_size", 16), options.get("truncate", False)
    read = corpus.read_corpus(loaded, sentences, batch_size, truncate, on_warning)
    keeper = Keeper(path, share, settings(model, loaded, sentences, options), loaded, read,
                    sentences)  # fmt: skip
    found = keeper.finished() if resume else None
    objectives = corpus.objectives(loaded, methods)
    finished = found is not None and found[1]["done"]
    probes = corpus.probes_of(loaded) if share.index == 0 and not finished else None
    mine = corpus.split(read.costs(), share.count)[share.index]
    texts = sum(len(read.batches[b]) for b in mine)
    if on_start is not None:
        on_start(texts)
    if found is None:
        words = options.get("words", False)
        sums = corpus.run_part(loaded, sentences, read, mine, words, truncate, on_progress)
        done = not methods
        partial = keeper.save(sums, done, probes, objectives)
    else:
        sums, done, partial = unpack(found[0], found[1]["sums"]), found[1]["done"], found
        if on_progress is not None:
            on_progress(texts)  # done before
    if methods and not done:
        runs = corpus.importance_runs(loaded, sentences, read, methods, (share.index,
                                      share.count), truncate, ablation=options.get("ablation"),
                                      layers=layers, heads=heads)  # fmt: skip
        means = (lambda _, own: exchange(own)) if exchange is not None else None
        sums.importance = corpus.measure_importance(runs, means, on_importance)
        partial = keeper.save(sums, True, probes, objectives)
    elif exchange is not None and "ablation" in sums.importance:
        exchange(sums.importance["ablation"])  # the other shares wait for this one's means
    return partial


def report_of(partials: list[tuple[str, Partial]]) -> Report:
    """The report of a complete set of partials (each with where it came from, for the
    refusals): one of every share of one run, each finished."""
    from attnviz.analysis.probes import ProbeResult
    from attnviz.analysis.report_sums import model_info, unpack
    from attnviz.analysis.roles import Thresholds
    from attnviz.core.treebank import Treebank
    from attnviz.pipelines.corpus import Corpus, finish

    shares = _complete(partials)
    first_arrays, first = shares[0]
    sums = unpack(first_arrays, first["sums"])
    for arrays, document in shares[1:]:
        sums = sums.merge(unpack(arrays, document["sums"]))
    facts, options = first["corpus"], first["settings"]["options"]
    read = Corpus(tuple(facts["kept"]), tuple(facts["lengths"]), tuple(facts["skipped"]),
                  tuple(facts["notes"]), facts["batch_size"])  # fmt: skip
    treebank = None
    if first["treebank"] is not None:
        known = first["treebank"]
        treebank = Treebank((), known["source"], known["has_syntax"], known["has_coreference"],
                            tuple(known["notes"]))  # fmt: skip
    probes = None
    if first["probes"] is not None:
        probes = ProbeResult(scores=first_arrays["probes.scores"], **first["probes"])
    return finish(
        model_info(first["info"]), sums, read,
        texts_per_rank=tuple(document["texts"] for _, document in shares), treebank=treebank,
        probes=probes, objectives=first["objectives"],
        **{**options, "thresholds": Thresholds(options["thresholds"])},
    )  # fmt: skip


def _complete(partials: list[tuple[str, Partial]]) -> list[Partial]:
    """The partials in share order, refusing (in one line) a set that is not one of every share
    of one run, each finished."""
    if not partials:
        raise InputError("no partial to merge")
    where, (_, first) = partials[0]
    count = first["shard"][1]
    by_index: dict[int, tuple[str, Partial]] = {}
    for name, (arrays, document) in partials:
        if document.get("format") != FORMAT:
            raise InputError(f"{name}: a partial of another attnviz version; run that shard again")
        differs = _difference(document["settings"], first["settings"])
        if differs is None and document["shard"][1] != count:
            differs = f"another split (of {document['shard'][1]} shards, not {count})"
        if differs is not None:
            raise InputError(f"{name} is of {differs}, unlike {where}: give the partials of one "
                             "run")  # fmt: skip
        index = document["shard"][0]
        if index in by_index:
            raise InputError(f"shard {index} of {count} is given twice: {by_index[index][0]} "
                             f"and {name}")  # fmt: skip
        if not document["done"]:
            raise InputError(f"{name}: shard {index} of {count} is unfinished (its importance "
                             "was not measured); run it again with --resume")  # fmt: skip
        by_index[index] = (name, (arrays, document))
    missing = [str(k) for k in range(count) if k not in by_index]
    if missing:
        raise InputError(f"shard(s) {', '.join(missing)} of {count} missing: every shard's "
                         "partial is needed (run them with --shard I/N)")  # fmt: skip
    return [by_index[k][1] for k in range(count)]
