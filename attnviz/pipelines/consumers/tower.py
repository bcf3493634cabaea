"""A vision-language model's vision tower, read in the run's one pass (`analysis.tower`):
per tower layer and head, its row over the picture, its role and mean attention distance,
into `run.made.tower` (for the terminal, `--json`, the figures, the page and the API); or,
where the tower's rows did not fit its map, a note that says why it is not drawn. A run of
a picture and a prompt asks for it unless `--no-tower` (`tower=False`) leaves the tower
unread: its layers then run the model's own attention, and nothing of them is kept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.pipelines.consumers import Consumer, Run

if TYPE_CHECKING:
    from attnviz.analysis.tower import TowerRecorder, TowerView
    from attnviz.core.attention import Attention


class Tower(Consumer):
    def wants_tower(self) -> bool:
        return self.request.tower

    def finish(self, run: Run) -> None:
        run.shown, run.made.tower = tower_view(run.tower, run.shown)


def tower_view(
    recorder: TowerRecorder | None, att: Attention
) -> tuple[Attention, TowerView | None]:
    """`att` and the tower's view from its `recorder` once the pass is over (None: not
    asked, or not mapped, and the reader's note says why); where the tower's rows did not
    fit its map, no view, and `att` with a note that says so."""
    from dataclasses import replace

    if recorder is None:
        return att, None
    if recorder.unread is not None:
        note = f"the vision tower's view is not drawn: {recorder.unread}"
        return replace(att, notes=(*att.notes, note)), None
    return att, recorder.view()
