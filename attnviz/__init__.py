"""attnviz: see, measure and verify multi-head attention in Hugging Face transformers.

The Python API (no heavy import until a function needs it):

    attention(text, model=None, words=False, hide_special=False, truncate=False, device="auto")
    check(text, model=None, layers=None, tolerance=1e-5, ...)
    compare(a, b=None, model=None, against_model=None, words=False, measure="weights", ...)
    report(sentences, model=None, ...)
    importance(texts, model=None, method="ablation", ablation="zero", layers=None, heads=None)
    needle(model=None, lengths="1k,2k,4k,8k", depths=11, ablate_top=(), out=None, ...)
    unload(*models)   let go of the loaded models (every one when none is named)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnviz.api import (
        Attention,
        attention,
        check,
        compare,
        importance,
        needle,
        report,
        unload,
    )

__version__ = "0.1.0"
__all__ = [
    "Attention",
    "attention",
    "check",
    "compare",
    "importance",
    "needle",
    "report",
    "unload",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use: the command line starts without them."""
    if name in __all__ and name != "__version__":
        from attnviz import api

        return getattr(api, name)
    raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
