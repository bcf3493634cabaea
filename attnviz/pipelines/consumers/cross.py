"""Mllama's cross-attention layers over the picture (`core.cross_picture`), read in the run's
one pass into `run.cross`, for a caller that draws nothing of them itself: the API's result
hands them out (`attnviz.attention(…, picture=…).cross`). `show` asks for them through its
Pictures consumer, which draws them."""

from __future__ import annotations

from attnviz.pipelines.consumers import Consumer


class Cross(Consumer):
    def wants_cross(self) -> bool:
        return self.request.prompt is not None
