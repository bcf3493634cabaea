"""done.json, written last into a text's folder: the run's settings and the files it wrote
(the next run of the same text removes exactly those)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from attnviz.outputs.files import write_done
from attnviz.pipelines.consumers import Consumer, Run


class Done(Consumer):
    def write(self, run: Run, folder: Path) -> None:
        r, shown = self.request, run.shown
        settings = {
            "model": shown.info.name,
            "text": r.text,
            "pair": r.pair,
            **(
                {"target": r.target, "generate": r.generate, "stack": r.stack}
                if shown.stack
                else {}
            ),
            **(
                {
                    "target": r.target,
                    "generate": r.generate,
                    "sample": r.sample,
                    "temperature": r.temperature,
                    "seed": r.seed,
                }
                if shown.continuation is not None
                else {}
            ),  # fmt: skip
            "layers": run.layers,
            "heads": run.heads,
            "words": r.words,
            "hide_special": r.hide_special,
            "truncate": r.truncate,
            "query": r.query,
            "measure": r.measure,
            **({"fusion": r.fusion, "discard": r.discard} if r.measure == "rollout" else {}),
            "ablate": [f"{layer}.{head}" for layer, head in r.ablate],
            "images": r.images,
            "html": r.html,
            **asdict(run.style),
        }
        written = [*run.made.images, run.made.page]
        record = {
            "text": r.text,
            **(
                {"target": shown.target, "key_tokens": list(shown.key_tokens)}
                if shown.stack
                else {}
            ),
            "tokens": list(shown.tokens),
            "files": [str(path.relative_to(folder.parent)) for path in written if path],
            "notes": list(shown.notes),
        }
        if shown.continuation is not None:
            record["continuation"] = shown.continuation.as_dict()
        write_done(folder, settings, record)
