"""The compare page (`attnviz compare --html`): what it carries, that it stays within its size,
and in a real browser that B − A, A and B are drawn in place in every view.

Browser tests use the session's chromium (conftest.py's `browser` fixture) through
tests/test_html.py's `Opened`; screenshots go to tests/artifacts/ (gitignored).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from tests.test_html import ARTIFACTS, Opened, _cell_centres, _data, _unpack, _viridis

PAIR = ("The keys to the cabinet are on the table.", "The key to the cabinets is on the table.")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """`compare A B --no-images --html`: the page, its data and the API's comparison."""
    out = tmp_path_factory.mktemp("compare-page")
    result = invoke("compare", *PAIR, "--no-images", "--html", "-o", out)
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    path = folder / "compare.html"
    assert "wrote the interactive page" in result.output
    return path, _data(path.read_text(encoding="utf-8")), attnviz.compare(*PAIR).pairs[0]


def _rdbu() -> np.ndarray:
    """B − A's diverging colour map as matplotlib has it: (256, 3) int."""
    import matplotlib

    return matplotlib.colormaps["RdBu_r"](range(256), bytes=True)[:, :3].astype(int)


def _diverging_index(values: np.ndarray, top: float) -> np.ndarray:
    """The colour each value takes on the page's B − A scale (−top … +top), as an index."""
    return np.clip(np.floor((values / top + 1) * 127.5 + 0.5), 0, 255).astype(int)


# ---------- the file ----------


def test_the_page_carries_both_texts_and_compares_numbers(written):
    path, data, compared = written
    page = path.read_text(encoding="utf-8")
    assert "default-src 'none'" in page and not re.search(r"https?://|(src|href)=", page)
    assert (
        "<title>attnviz compare: A: The keys to the cabinet are on the table. | B: The key" in page
    )
    a, b = data["sides"]["a"], data["sides"]["b"]
    assert a["tokens"] == list(compared.a.tokens) and b["tokens"] == list(compared.b.tokens)
    n = len(a["tokens"])
    for layer, head in [(0, 0), (3, 1), (5, 11)]:  # the model's own float32 weights, each side
        assert np.array_equal(
            _unpack(a["weights"][layer][head], "<f4").reshape(n, n), compared.a.weights[layer, head]
        )
        assert np.array_equal(
            _unpack(b["weights"][layer][head], "<f4").reshape(n, n), compared.b.weights[layer, head]
        )
    c = data["compare"]
    assert c["text_b"] == PAIR[1] and c["labels"] == compared.labels
    assert c["units_a"] == [list(u.a) for u in compared.alignment.units]
    assert c["divergence"] == compared.divergence.tolist()  # the Python numbers, as they are
    rows = _unpack(c["rows"], "<f4").reshape(compared.rows.shape)
    assert np.array_equal(rows, compared.rows.astype("<f4"), equal_nan=True)
    assert c["diff_top"] == pytest.approx(float(np.abs(compared.grids_b - compared.grids_a).max()))
    assert a["inside"] is not None and b["inside"] is not None  # from the compare pass
    assert a["inside"]["tokens"] == a["tokens"] and b["inside"]["tokens"] == b["tokens"]
    assert data["stack"] == "diff"  # it opens on B − A
    assert path.stat().st_size < 8 * 2**20


def test_a_pairs_file_writes_one_page_a_pair(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\t".join(PAIR) + "\nHe is here.\tShe is here.\n", encoding="utf-8")
    result = invoke("compare", "-f", pairs, "--html", "--no-images", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["compare-1.html", "compare-2.html",
                                                        "done.json"]  # fmt: skip
    second = _data((folder / "compare-2.html").read_text(encoding="utf-8"))
    assert second["compare"]["pair"] == [2, 2] and second["text"] == "He is here."
    done = json.loads((folder / "done.json").read_text())
    assert done["settings"]["html"] is True and len(done["record"]["files"]) == 2
    again = invoke(
        "compare", "-f", pairs, "--html", "--no-images", "--json", "-o", tmp_path / "out"
    )
    listed = json.loads(again.stdout)
    assert listed["images"] == [] and [p.split("/")[-1] for p in listed["pages"]] == [
        "compare-1.html",
        "compare-2.html",
    ]


def test_the_inside_views_share_one_budget(bundled, monkeypatch):
    """Each text's Q, K and V fit alone but not together: both go, and say why."""
    from attnviz.analysis import inside as inside_module
    from attnviz.analysis.compare import compare_pair
    from attnviz.core.tokens import encode
    from attnviz.outputs.html.compare import compare_data
    from attnviz.pipelines.readers import read_texts
    from attnviz.pipelines.request import CompareRequest

    asked = CompareRequest(batch_size=2)
    found, insides = read_texts(bundled, asked, [encode(bundled, t) for t in PAIR], True)
    one = insides[0].q.size * 3 * 4  # bytes of one text's Q, K and V (K, V as long as Q here)
    monkeypatch.setattr(inside_module, "INSIDE_BUDGET", int(one * 1.5))
    data = compare_data(compare_pair(*found), inside=(insides[0], insides[1]))
    for side in ("a", "b"):
        assert data["sides"][side]["inside"] is None
        assert "of every layer of both texts" in data["sides"][side]["inside_note"]


def test_a_page_over_its_size_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    from attnviz.outputs.html import compare as compare_page

    monkeypatch.setattr(compare_page, "PAGE_BUDGET", 100_000)
    out = tmp_path / "out"
    result = invoke("compare", *PAIR, "--html", "-o", out)  # images too: none may be written
    assert result.exit_code == 2, result.output
    assert "over the page's 0 MiB" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not any(p.is_file() for p in out.rglob("*"))


# ---------- in the browser ----------


@pytest.fixture
def opened(browser, written):
    page = Opened(browser, written[0])
    yield page
    page.close()
    assert page.errors == []
    assert page.requests == [page.url], "the page made a request besides its own file"


def _choose(opened: Opened, selector: str, value: str) -> None:
    n = opened.renders()
    opened.page.select_option(selector, value)
    opened.settle(n + 1)


def test_the_difference_is_b_minus_a_in_place(opened, written):
    """The matrix view of B − A: each cell the diverging colour of the Python grids' B − A on
    the page's ± scale, A and B beside it on the colour map from 0 to 1, and the tooltip the
    numbers of that cell."""
    _, data, compared = written
    opened.view("matrix")
    _choose(opened, "#layer", "3")
    _choose(opened, "#head", "1")
    units = len(compared.labels)
    difference = compared.grids_b[3, 1] - compared.grids_a[3, 1]  # (U, U)
    size = int(opened.page.get_attribute("#matrix", "width"))
    drawn = opened.canvas("#matrix", _cell_centres(units, size))
    lut = _rdbu()
    index = np.abs(drawn[:, None, :] - lut[None]).sum(-1).argmin(-1)  # the colour drawn
    expected = _diverging_index(difference, data["compare"]["diff_top"]).ravel()
    assert (lut[index] == drawn).all()  # every cell is a colour of the map
    assert (np.abs(index - expected) <= 1).all() and (index == expected).mean() > 0.95
    assert (index < 128).any() and (index > 128).any()  # both ways, on a head that moved
    side = int(opened.page.get_attribute("#matrix-a", "width"))
    for name, grid in (("a", compared.grids_a[3, 1]), ("b", compared.grids_b[3, 1])):
        shown = opened.canvas(f"#matrix-{name}", _cell_centres(units, side))
        colours = _viridis()[np.minimum(255, np.floor(grid * 255 + 0.5)).astype(int).ravel()]
        assert (np.abs(shown - colours).max(axis=1) <= 8).all()  # within a colour step or two
    box = opened.page.locator("#matrix-over").bounding_box()
    query, key = compared.labels.index("are→is"), compared.labels.index("keys→key")
    opened.page.mouse.move(box["x"] + (key + 0.5) * box["width"] / units,
                           box["y"] + (query + 0.5) * box["height"] / units)  # fmt: skip
    said = opened.page.inner_text("#tooltip")
    found = [float(v) for v in re.findall(r"[-+]?\d\.\d+(?:e[-+]\d+)?", said)]
    assert found[0] == pytest.approx(difference[query, key], abs=1e-6)
    assert found[1:] == pytest.approx(
        [compared.grids_a[3, 1, query, key], compared.grids_b[3, 1, query, key]], abs=1e-6
    )
    assert difference[query, key] < -0.4  # "are" gave "keys" 0.79, "is" gives "key" 0.28
    legend = opened.page.inner_text("#view-matrix .legend")
    assert "white: no change" in legend and "red: more in B" in legend
    opened.page.screenshot(path=str(ARTIFACTS / "compare-matrix.png"))


def test_every_view_switches_between_a_b_and_the_difference(opened, written):
    _, data, compared = written
    top = data["compare"]["diff_top"]
    difference = compared.grids_b - compared.grids_a  # (L, H, U, U)
    # Head view: B − A's lines are the cells with |B − A| ≥ 1/64 of the scale, in all heads.
    lines = int(opened.page.get_attribute("#lines", "data-lines"))
    assert lines == int((np.abs(difference[0]) / top >= 1 / 64).sum())
    toggles = opened.page.locator(".head-toggle").all_inner_texts()
    assert toggles == [f"{h} · {compared.divergence[0, h]:.4f}" for h in range(12)]
    opened.page.screenshot(path=str(ARTIFACTS / "compare-head.png"))
    _choose(opened, "#side", "a")
    assert int(opened.page.get_attribute("#lines", "data-lines")) == int(
        (compared.a.weights[0] >= 1 / 64).sum()
    )
    # Model view: each head's divergence under its B − A thumbnail.
    opened.view("model")
    _choose(opened, "#side", "diff")
    under = opened.page.locator(".thumb-cell .moved").all_inner_texts()
    assert under == [f"{v:.4f}" for v in compared.divergence.ravel()]
    opened.page.screenshot(path=str(ARTIFACTS / "compare-model.png"))
    # Query view: A's "are" carries over to its unit, "are→is", and to B's "is".
    opened.view("query")
    _choose(opened, "#side", "a")
    _choose(opened, "#query", str(compared.a.tokens.index("are")))
    _choose(opened, "#side", "diff")
    unit = compared.labels.index("are→is")
    assert opened.page.input_value("#query") == str(unit)
    cells = opened.page.locator(".query-table td .js").all_inner_texts()
    assert cells == [f"JS {v:.4f}" for v in compared.rows[:, :, unit].ravel()]
    opened.page.screenshot(path=str(ARTIFACTS / "compare-query.png"))
    _choose(opened, "#side", "b")
    assert opened.page.input_value("#query") == str(compared.b.tokens.index("is"))
    # Inside one head, B − A: the row of A and of B over the aligned keys, and B − A.
    opened.view("inside")
    _choose(opened, "#side", "diff")
    _choose(opened, "#layer", "3")
    _choose(opened, "#head", "1")
    rows = opened.page.locator(".diff-table tr[data-key]").all()
    assert len(rows) == len(compared.labels)
    for k, row in enumerate(rows):
        _, a, b, d = row.locator("td").all_inner_texts()
        assert float(a) == pytest.approx(compared.grids_a[3, 1, unit, k], abs=1e-6)
        assert float(b) == pytest.approx(compared.grids_b[3, 1, unit, k], abs=1e-6)
        assert float(d) == pytest.approx(difference[3, 1, unit, k], abs=1e-6)
    opened.page.screenshot(path=str(ARTIFACTS / "compare-inside.png"))
    # With a text chosen, the inside view is that text's from-scratch steps.
    _choose(opened, "#side", "b")
    assert opened.page.locator(".check").count() >= 1


def test_a_decoders_difference_masks_the_later_keys(browser, loaded_tiny, tmp_path):
    """A causal model's B − A: the keys after each aligned query are masked (hatched grey, as
    on its A and B), every other cell is the colour of its difference; the page built without
    the compare pass's inside numbers says why it has no inside view."""
    from attnviz.analysis.compare import compare_pair
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode
    from attnviz.outputs.html.compare import build_compare_page
    from attnviz.outputs.html.page import NO_MODEL

    loaded = loaded_tiny["gpt2"]
    texts = ("The cat sat on the mat.", "The dog sat on the old mat.")
    compared = compare_pair(*attend(loaded, [encode(loaded, t) for t in texts]))
    path = tmp_path / "compare.html"
    path.write_text(build_compare_page(compared), encoding="utf-8")
    data = _data(path.read_text(encoding="utf-8"))
    assert data["sides"]["a"]["inside"] is None and data["sides"]["a"]["inside_note"] == NO_MODEL
    opened = Opened(browser, path)
    try:
        opened.view("matrix")
        units = len(compared.labels)
        size = int(opened.page.get_attribute("#matrix", "width"))
        drawn = opened.canvas("#matrix", _cell_centres(units, size)).reshape(units, units, 3)
        difference = compared.grids_b[0, 0] - compared.grids_a[0, 0]
        expected = _rdbu()[_diverging_index(difference, data["compare"]["diff_top"])]
        for q in range(units):
            for k in range(units):
                if k > q:
                    assert tuple(drawn[q, k]) in {(160, 160, 160), (255, 255, 255)}, (q, k)
                else:
                    assert np.abs(drawn[q, k] - expected[q, k]).max() <= 8, (q, k)
        assert "masked" in opened.page.inner_text("#view-matrix .legend")
        assert opened.errors == [] and opened.requests == [opened.url]
    finally:
        opened.close()
