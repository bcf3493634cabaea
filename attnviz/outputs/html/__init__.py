"""The interactive attention page: one self-contained HTML file, no network.

    build_page(att) -> str       the whole page (data, script and style inline)
    write_page(att, path) -> Path

`attnviz show --html`, `export --html` and `Attention.to_html()` all call `build_page`.
"""

from attnviz.outputs.html.page import build_page, write_page

__all__ = ["build_page", "write_page"]
