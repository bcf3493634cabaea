"""The interactive page on long and short texts: build time, file size, and how fast Debian's
chromium opens it and switches views. Both texts in one run; min / median / max of --runs.
The page's size is given against the float32 weights it carries (it also carries Q, K and V
for the inside view, and compresses the rest).

Run: .venv/bin/python bench/bench_html.py [--runs 5] [--quick]   (needs chromium, playwright)
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _common import footer, header, parser, spread

SENTENCE = "The animal didn't cross the street because it was too tired."
CORPUS = Path(__file__).parent.parent / "attnviz" / "data" / "sentences.txt"


def main() -> None:
    args = parser(__doc__, runs=5).parse_args()
    if args.quick:
        args.runs = 2
    runs = args.runs
    header("The interactive page: `--html`", args)

    from playwright.sync_api import sync_playwright

    from attnviz.analysis.inside import InsideSteps
    from attnviz.core import capture, models
    from attnviz.core.extract import extract
    from attnviz.core.tokens import encode, pad
    from attnviz.outputs.html import build_page

    def inside_of(loaded, encoded):
        """The inside view's numbers, by a pass of their own (show --html has them from its
        one pass; the build is what is timed here)."""
        steps = InsideSteps(loaded, [encoded])
        if steps.wants:
            capture.run(loaded, pad(loaded, [encoded]), [steps])
        return steps.result()

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
                    builds,
                    pages[0],
                    raw,
                    opens,
                    switches,
                )
            )
        browser.close()
    print(f"min / median / max of {runs} runs, chromium headless\n")
    print("| text | **page ÷ float32 weights** | page MB | weights MB | build s | open to ready s "
          "| all 5 views s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, build, size, raw, opened, switched in rows:
        print(
            f"| {label} | **{size / raw:.2f}** | {size / 1e6:.2f} | {raw / 1e6:.1f} | "
            f"{spread(build)} | {spread(opened)} | {spread(switched)} |"
        )
    footer()


if __name__ == "__main__":
    main()
