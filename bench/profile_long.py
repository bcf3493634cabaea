"""Where `show -m smollm2` spends its time on a long text: cProfile of one streamed `show`
(no images, no page) over the first LAYERS layers' statistics, the model loaded beforehand.
The forward pass runs all 30 layers; only the chosen layers are recomputed and summed.

Run: .venv/bin/python bench/profile_long.py TOKENS LAYERS [html]   (e.g. 4096 3 html: with the
page's pooled maps, as `show --html` has them)
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from bench_long import text_of


def main() -> None:
    from transformers import AutoTokenizer

    from attnviz.core import gguf_cache, memory
    from attnviz.core.settings import Load
    from attnviz.pipelines.request import ShowRequest
    from attnviz.pipelines.show import show

    n_tokens, n_layers = int(sys.argv[1]), int(sys.argv[2])
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_cache.converted("smollm2")))
    text = text_of(n_tokens, tokenizer)
    layers = tuple(range(n_layers))
    html = "html" in sys.argv[3:]
    request = ShowRequest(Load("smollm2", "cpu"), text=text, out=None, layers=layers, html=html)
    request.model().load()
    memory.STREAM_ABOVE = 0  # streamed, as a long text is
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(show, request)
    print(f"wall {time.perf_counter() - start:.1f} s, {n_tokens} tokens, layers 0–{n_layers - 1}")
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    pstats.Stats(profile).sort_stats("cumtime").print_stats("attnviz", 40)


if __name__ == "__main__":
    main()
