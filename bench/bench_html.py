"""The interactive page on long and short texts: build time, file size, and how fast Debian's
chromium opens it and switches views. Medians of --runs runs, side by side in one run.

Run: .venv/bin/python bench/bench_html.py [--runs 5]   (needs chromium and playwright)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

SENTENCE = "The animal didn't cross the street because it was too tired."
CORPUS = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs

    from playwright.sync_api import sync_playwright

    from attnviz.analysis.inside import inside_of
    from attnviz.core import models
    from attnviz.core.extract import extract
    from attnviz.core.tokens import encode
    from attnviz.outputs.html import build_page

    loaded = models.model().load()
    texts = {
        "16-token sentence": (SENTENCE, False),
        "512-token text": (" ".join(CORPUS.read_text(encoding="utf-8").split("\n")), True),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        for label, (text, truncate) in texts.items():
            att = extract(loaded, text, truncate=truncate)
            builds, pages = [], []
            for _ in range(runs):
                started = time.perf_counter()
                page = build_page(att, inside=inside_of(loaded, encode(loaded, text, truncate)))
                builds.append(time.perf_counter() - started)
            path = Path(tmp) / "page.html"
            path.write_text(page, encoding="utf-8")
            opens, switches = [], []
            for _ in range(runs):
                tab = browser.new_page(viewport={"width": 1300, "height": 900})
                started = time.perf_counter()
                tab.goto(path.as_uri())
                tab.wait_for_selector("body[data-ready='1']", timeout=60_000)
                opens.append(time.perf_counter() - started)
                started = time.perf_counter()
                for view in ("model", "matrix", "query", "inside", "head"):
                    tab.click(f"#tab-{view}")
                    tab.wait_for_selector(f"section#view-{view}")
                switches.append(time.perf_counter() - started)
                tab.close()
            raw = att.weights.nbytes
            pages.append(len(page.encode()))
            rows.append(
                (
                    label,
                    statistics.median(builds),
                    pages[0],
                    raw,
                    statistics.median(opens),
                    statistics.median(switches),
                )
            )
        browser.close()
    print(f"medians of {runs} runs")
    print("| text | build s | page MB | float32 weights MB | open to ready s | all 5 views s |")
    print("|---|---|---|---|---|---|")
    for label, build, size, raw, opened, switched in rows:
        print(
            f"| {label} | {build:.2f} | {size / 1e6:.2f} | {raw / 1e6:.1f} | {opened:.2f} | "
            f"{switched:.2f} |"
        )


if __name__ == "__main__":
    main()
