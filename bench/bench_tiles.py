"""`attnviz serve`'s tiles on long texts: what the server holds, and how long a tile takes.

One server (`attnviz serve -m smollm2` on a free loopback port) reads texts of 1,024 to
8,192 tokens (the samples corpus repeated, cut to the length with SmolLM2's BOS) with
POST /api/text, which keeps each layer's X and makes no attention; then, in rounds, for
heads chosen across the model: the whole head pooled into 512 × 512 cells (each the max of a
block), the way the served page opens a long text, and one exact 512 × 512 tile from the
middle of the matrix, a zoom's answer. The server's memory is the RSS of its process,
sampled every 10 ms from /proc: before the text, its peak while reading it, after (what it
holds), and its peak above that while answering tiles.
Run: .venv/bin/python bench/bench_tiles.py [--runs 3] [--tokens 1024 2048 4096 8192] [--quick]
(--quick: the bundled model at 256 and 512 tokens)
"""

from __future__ import annotations

import http.client
import json
import threading
import time

from _common import footer, header, parser, spread
from _rss import _tree_rss_kib
from bench_serve import HOST, free_port, start_server


def post(port: int, route: str, body: dict) -> tuple[float, dict]:
    """(seconds, answer) of one POST on its own connection."""
    conn = http.client.HTTPConnection(HOST, port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", route, json.dumps(body).encode(), {"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    seconds = time.perf_counter() - start
    conn.close()
    if response.status != 200:
        raise SystemExit(f"{route} answered {response.status}: {answer}")
    return seconds, answer


class Peak:
    """The peak RSS (MiB) of a process while a `with` block runs, sampled every 10 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._done = pid, 0.0, threading.Event()

    def __enter__(self) -> Peak:
        def sample() -> None:
            while not self._done.is_set():
                self.peak = max(self.peak, _tree_rss_kib(self.pid) / 1024)
                time.sleep(0.01)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self._thread.join()


def main() -> None:
    options = parser(__doc__, runs=3)
    options.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    args = options.parse_args()
    model = "smollm2"
    if args.quick:
        args.runs, args.tokens, model = 2, [256, 512], None
    header("`attnviz serve`: tiles of long texts", args)
    texts = {n: _text(model, n) for n in args.tokens}
    port = free_port()
    server = start_server(port, *(["-m", model] if model else []))
    rows = []
    try:
        with Peak(server.pid) as idle:
            time.sleep(0.5)
        for n, text in texts.items():
            before = _tree_rss_kib(server.pid) / 1024
            with Peak(server.pid) as reading:
                seconds, read = post(port, "/api/text", {"text": text})
            held = read["tiles"]
            assert held["tokens"] == n, (held, n)
            after = _tree_rss_kib(server.pid) / 1024
            info = read["model"]
            whole, exact = [], []
            with Peak(server.pid) as tiling:
                for k in range(args.runs):
                    layer, head = (7 * k + 3) % info["n_layers"], (5 * k + 1) % info["n_heads"]
                    asked = {"text_id": held["text_id"], "layer": layer, "head": head,
                             "pool": "max", "packed": True}  # fmt: skip
                    whole.append(post(port, "/api/tile", asked)[0])
                    middle = max(0, n // 2 - 256)
                    asked.update(q0=middle, q1=min(n, middle + 512), k0=max(0, middle - 256),
                                 k1=max(0, middle - 256) + min(n, 512), pool=None)  # fmt: skip
                    exact.append(post(port, "/api/tile", asked)[0])
            rows.append((n, held["bytes"] / 2**20, seconds, before, reading.peak, after,
                         whole, exact, tiling.peak - after))  # fmt: skip
    finally:
        server.terminate()
        server.wait()
    served = f"attnviz serve{' -m ' + model if model else ''}"
    print(f"Server: `{served}`, {idle.peak:.0f} MiB once started. Times are min / median / "
          "max over the rounds (one head each).\n")  # fmt: skip
    print("| tokens | X held (server's count) | read (/api/text) | server RSS: before → peak "
          "while reading → after | whole head pooled to 512², s | exact 512² tile, s | "
          "peak above held while tiling |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n, held, seconds, before, peak, after, whole, exact, above in rows:
        memory = f"{before:,.0f} → {peak:,.0f} → {after:,.0f} MiB"
        print(f"| {n:,} | {held:,.0f} MiB | {seconds:.1f} s | {memory} | {spread(whole, 2)} | "
              f"{spread(exact, 2)} | {above:,.0f} MiB |")  # fmt: skip
    footer()


def _text(model: str | None, n: int) -> str:
    """A text the model reads as exactly `n` tokens (SmolLM2: its BOS included)."""
    if model is None:
        from bench_show_vs_bare import text_of
        from transformers import AutoTokenizer

        from attnviz.core.models import bundled_model_path

        return text_of(n, AutoTokenizer.from_pretrained(str(bundled_model_path())))
    from bench_smollm2 import long_text

    return long_text(n - 1)  # attnviz puts SmolLM2's BOS first


if __name__ == "__main__":
    main()
