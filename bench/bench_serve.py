"""`attnviz serve` warm against a fresh `attnviz show TEXT --no-images --json` per question.

A question answered by a new process pays for its imports and the model's loading every
time; the server pays for them once. One server (`attnviz serve` on a free loopback port) is
started and asked once before timing. Each round then times, in an order rotated every round:
`--requests` POSTs of /api/attention for one 16-token sentence, one after another on one
kept-alive connection (latency, and requests per second of one client); as many of /api/page
(what the served page asks for a text: every measure and the inside view); and `--processes`
fresh `attnviz show` processes for the same sentence. The ratio, one per round, is the
process's median wall time over the server's median latency in that round; min / median / max
over the rounds.
Run: .venv/bin/python bench/bench_serve.py [--runs 5] [--requests 40] [--processes 2] [--quick]
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import footer, header, parser, ratios, rounds, spread, wall
from bench_show_vs_bare import text_of

ATTNVIZ = str(Path(sys.executable).with_name("attnviz"))
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def start_server(port: int, *options: str) -> subprocess.Popen:
    """`attnviz serve` on `port` (with `options`), once it answers /api/health."""
    server = subprocess.Popen(
        [ATTNVIZ, "serve", "--port", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit("attnviz serve exited before answering")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            conn.request("GET", "/api/health")
            if conn.getresponse().status == 200:
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("attnviz serve did not answer /api/health in 180 s")


def latencies(port: int, path: str, text: str, count: int) -> list[float]:
    """Seconds of each of `count` POSTs of `text` to `path`, on one kept-alive connection,
    each answer read whole and parsed."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    body = json.dumps({"text": text}).encode()
    found = []
    for _ in range(count):
        start = time.perf_counter()
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        found.append(time.perf_counter() - start)
        if response.status != 200:
            raise SystemExit(f"{path} answered {response.status}: {answer}")
    conn.close()
    return found


def main() -> None:
    options = parser(__doc__, runs=5)
    options.add_argument("--requests", type=int, default=40, help="POSTs per round and route")
    options.add_argument("--processes", type=int, default=2, help="fresh processes per round")
    args = options.parse_args()
    if args.quick:
        args.runs, args.requests, args.processes = 2, 20, 1
    header("`attnviz serve` against a fresh process per question", args)

    from transformers import AutoTokenizer
    from transformers.utils import logging

    from attnviz.core.models import bundled_model_path

    logging.set_verbosity_error()  # the corpus is longer than the model's limit, on purpose
    text = text_of(16, AutoTokenizer.from_pretrained(str(bundled_model_path())))
    print(f"Sentence ({16} tokens): “{text}”\n")
    port = free_port()
    started = time.perf_counter()
    server = start_server(port)
    ready = time.perf_counter() - started
    try:
        latencies(port, "/api/attention", text, 5)  # one connection's set-up, not timed
        sides = ("attention", "page", "process")
        found: dict[str, list[list[float]]] = {side: [] for side in sides}
        command = [ATTNVIZ, "show", text, "--no-images", "--json"]
        for order in rounds(args.runs, sides):
            for side in order:
                if side == "process":
                    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
                    found[side].append([wall(command, env=env) for _ in range(args.processes)])
                else:
                    found[side].append(latencies(port, f"/api/{side}", text, args.requests))
    finally:
        server.terminate()
        server.wait()

    def medians(side: str) -> list[float]:
        return [statistics.median(times) for times in found[side]]

    every = {side: [t for times in found[side] for t in times] for side in sides}
    print("Ratios, one per round (median of the round's times); min / median / max over rounds.\n")
    print("| a fresh `attnviz show --no-images --json` ÷ | ratio |")
    print("|---|---|")
    for side in ("attention", "page"):
        ratio = ratios(medians("process"), medians(side))
        print(f"| a warm /api/{side} request | {spread(ratio, 0, bold=True)} |")
    print(f"\nAbsolute figures, this machine and load only ({args.requests} requests a round "
          f"and route, {args.processes} processes a round):\n")  # fmt: skip
    print("| what | min / median / max | per second, one client (median round) |")
    print("|---|---|---|")
    for side in ("attention", "page"):
        ms = [t * 1000 for t in every[side]]
        rate = statistics.median(len(times) / sum(times) for times in found[side])
        print(f"| /api/{side} latency, ms | {spread(ms, 1)} | {rate:.0f} requests/s |")
    process = every["process"]
    print(f"| fresh process, s | {spread(process, 2)} | {1 / statistics.median(process):.2f} "
          "questions/s |")  # fmt: skip
    print(f"\nThe server took {ready:.1f} s from start to its first answer (imports, the model, "
          "one warm-up pass).")  # fmt: skip
    footer()


if __name__ == "__main__":
    main()
