"""`attnviz serve`'s tiles (pipelines/tiles.py), without a server: a tile is the same cells
as `attnviz.attention()`, a pooled tile the pooling of those cells, whatever the block of
rows; what the server holds and refuses. The HTTP side and the browser's zoom are in
test_serve.py; the tiles-only page of a long text is here, on a server in this process."""

from __future__ import annotations

import base64
import math
import re

import numpy as np
import pytest

import attnviz
from attnviz.errors import InputError, NotHeldError
from attnviz.pipelines import tiles
from attnviz.pipelines.serve import TEXT_KEYS, Question
from attnviz.pipelines.tiles import Holder, TileQuestion

TEXT = "The cat sat on the mat, and the quick brown fox jumps over the lazy dog."  # 20–23 tokens
# The bundled encoder, and tiny decoders: grouped-query heads (llama: 2 key/value heads for
# 4 query heads), a sliding window of 4 (mistral), soft caps and a window (gemma2), Q/K norms
# (qwen3), partial RoPE (phi3), a fused QKV (gpt2).
MODELS = ("bundled", "llama", "mistral", "gemma2", "qwen3", "phi3", "gpt2")

# A tile equals the API's cells within float32 rounding of the layers below it: a text read
# for tiles alone runs SDPA in the layers nobody asks probabilities of, where the API's pass
# multiplies its blocks of probabilities by V (about 1e-6 apart; both equal eager within 1e-5).
SAME = 1e-5


def _model(name: str, tiny_model_dirs) -> str | None:
    return None if name == "bundled" else str(tiny_model_dirs[name])


def _held(name: str | None, text: str = TEXT, budget: int = tiles.HOLD_BYTES):
    from attnviz.core.models import model

    served = model(name, "cpu")
    holder = Holder(budget)
    read = tiles.read(served, holder, Question(text))
    return served, holder, read


def _values(answer: dict) -> np.ndarray:
    """A tile's values as an array (None, a block no query sees: NaN)."""
    if answer["packed"]:
        found = np.frombuffer(base64.b64decode(answer["values"]), "<f4")
        return found.reshape(answer["shape"]).astype(np.float64)
    return np.array([[np.nan if v is None else v for v in row] for row in answer["values"]])


def _pooled(cells: np.ndarray, seen: np.ndarray, block: tuple[int, int], how: str):
    """The reference: each block's mean or max over the cells its queries see (NaN: none)."""
    rows, columns = block
    out = np.full((math.ceil(cells.shape[0] / rows), math.ceil(cells.shape[1] / columns)), np.nan)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            part = cells[i * rows : (i + 1) * rows, j * columns : (j + 1) * columns]
            sees = seen[i * rows : (i + 1) * rows, j * columns : (j + 1) * columns]
            if sees.any():
                out[i, j] = part[sees].mean() if how == "mean" else part[sees].max()
    return out


def _visible(info, weights_window: int | None, n: int) -> np.ndarray:
    """Which cells a query sees, (n, n): not a later key (causal), within its window."""
    query, key = np.arange(n)[:, None], np.arange(n)[None, :]
    seen = np.ones((n, n), bool)
    if info.causal:
        seen &= key <= query
    if weights_window is not None:
        seen &= key > query - weights_window
    return seen


def _edges(n: int) -> list[tuple[int, int, int, int]]:
    """Tiles at the matrix's edges and inside it: the whole matrix, the first cell, the last
    row, the last column, the last cell, a rectangle that is neither square nor at 0."""
    return [(0, n, 0, n), (0, 1, 0, 1), (n - 1, n, 0, n), (0, n, n - 1, n), (n - 1, n, n - 1, n),
            (3, n - 2, 5, n - 7)]  # fmt: skip


@pytest.mark.parametrize("name", MODELS)
def test_a_tile_is_the_same_cells_as_the_api(name, tiny_model_dirs):
    """Every head of every layer, weights and norm, at the edges of the matrix and inside
    it: the tile's cells are attention()'s within SAME (norm: of the head's largest)."""
    path = _model(name, tiny_model_dirs)
    served, holder, read = _held(path)
    info = served.load().info
    for measure in tiles.PER_HEAD:
        api = attnviz.attention(TEXT, model=path, device="cpu", measure=measure)
        n = len(api.tokens)
        assert read["tokens"] == list(api.tokens) and read["tiles"]["tokens"] == n
        for layer in range(info.n_layers):
            for head in range(info.n_heads):
                expected = api.pattern(layer, head)
                scale = max(1.0, float(expected.max()))
                for q0, q1, k0, k1 in _edges(n):
                    asked = TileQuestion(layer, head, q0=q0, q1=q1, k0=k0, k1=k1, measure=measure)
                    answer = tiles.tile(served, holder, asked)
                    assert answer["shape"] == [q1 - q0, k1 - k0] and answer["pool"] is None
                    assert answer["block"] == [1, 1]
                    found = _values(answer)
                    assert np.abs(found - expected[q0:q1, k0:k1]).max() <= SAME * scale


def test_the_check_can_fail(tiny_model_dirs):
    """The comparison above tells a tile from its neighbours: one row or column off, or the
    next head of the same key/value group (llama's grouped-query heads 0 and 1 share K), is
    far from the cells asked for."""
    path = _model("llama", tiny_model_dirs)
    served, holder, _ = _held(path)
    api = attnviz.attention(TEXT, model=path, device="cpu")
    expected = api.pattern(1, 0)[4:20, 2:18]
    for q0, k0, head in ((5, 2, 0), (4, 3, 0), (4, 2, 1)):
        asked = TileQuestion(1, head, q0=q0, q1=q0 + 16, k0=k0, k1=k0 + 16)
        assert np.abs(_values(tiles.tile(served, holder, asked)) - expected).max() > 1e-3


@pytest.mark.parametrize("name", ["bundled", "llama", "mistral"])
@pytest.mark.parametrize("how", tiles.POOLS)
def test_a_pooled_tile_is_the_pooling_of_the_apis_cells(name, how, tiny_model_dirs, monkeypatch):
    """A range longer than the tile's side (5 cells here) is answered in blocks, the last
    block of each side what is left; each block is the mean or max of the cells its queries
    see, NaN (null) where they see none (a decoder's later keys; mistral's window of 4)."""
    monkeypatch.setattr(tiles, "TILE_SIDE", 5)
    path = _model(name, tiny_model_dirs)
    served, holder, _ = _held(path)
    info = served.load().info
    for measure in tiles.PER_HEAD:
        api = attnviz.attention(TEXT, model=path, device="cpu", measure=measure)
        n = len(api.tokens)
        window = _window(served, 1)
        seen = _visible(info, window, n)
        for q0, q1, k0, k1 in [(0, n, 0, n), (3, n - 2, 5, n - 7), (n - 13, n, 0, 7)]:
            for packed in (False, True):
                asked = TileQuestion(1, 2, q0=q0, q1=q1, k0=k0, k1=k1, measure=measure, pool=how,
                                     packed=packed)  # fmt: skip
                answer = tiles.tile(served, holder, asked)
                block = tiles.blocks_of(q0, q1, k0, k1)
                assert answer["block"] == list(block) and answer["pool"] == how
                expected = _pooled(api.pattern(1, 2)[q0:q1, k0:k1], seen[q0:q1, k0:k1], block, how)
                found = _values(answer)
                assert found.shape == expected.shape == tuple(answer["shape"])
                assert (np.isnan(found) == np.isnan(expected)).all()
                if (q0, k0) == (0, 0):  # a decoder's first queries see no key of the next block
                    assert np.isnan(found).any() == info.causal
                top = max(1, np.nanmax(expected, initial=0))
                assert np.allclose(found, expected, rtol=0, atol=SAME * top, equal_nan=True)


def _window(served, layer: int) -> int | None:
    from attnviz.core import families

    return families.layer_weights(served.load().model, layer).window


def test_blocks_of_1_7_and_t_rows_give_the_same_tiles(tiny_model_dirs, monkeypatch):
    """The rows are recomputed a block at a time: 1, 7 and all T rows at once give the same
    exact tile and the same pooled one (blocks of 3 × 4 cells: 7 rows are not whole blocks,
    so a step holds 6)."""
    path = _model("mistral", tiny_model_dirs)
    served, holder, read = _held(path)
    n = len(read["tokens"])
    exact = TileQuestion(1, 3, q0=1, q1=n, k0=0, k1=n - 1)
    pooled = TileQuestion(1, 3, q0=1, q1=n, pool="mean")
    found = {}
    for rows in (1, 7, n):
        monkeypatch.setattr(tiles, "ROWS", rows)
        monkeypatch.setattr(tiles, "blocks_of", lambda *_: (1, 1))
        cells = _values(tiles.tile(served, holder, exact))
        monkeypatch.setattr(tiles, "blocks_of", lambda *_: (3, 4))
        found[rows] = cells, _values(tiles.tile(served, holder, pooled))
    for rows in (1, 7):
        assert np.allclose(found[rows][0], found[n][0], rtol=0, atol=1e-7)
        assert np.allclose(found[rows][1], found[n][1], rtol=0, atol=1e-7, equal_nan=True)
        assert np.isnan(found[rows][1]).sum() == np.isnan(found[n][1]).sum() > 0  # the window


@pytest.mark.parametrize(
    "body, said",
    [
        ([], 'must be a JSON object such as {"layer": 0, "head": 0}'),
        ({"head": 0}, '"layer" is missing'),
        ({"layer": 0}, '"head" is missing'),
        ({"layer": 0, "head": 0, "q00": 1}, "unknown key 'q00'"),
        ({"layer": 1.0, "head": 0}, '"layer" must be a layer number'),
        ({"layer": 0, "head": True}, '"head" must be a head number'),
        ({"layer": 0, "head": 0, "q0": 1.5}, '"q0" must be a whole number'),
        ({"layer": 0, "head": 0, "k1": "9"}, '"k1" must be a whole number'),
        ({"layer": 0, "head": 0, "q0": -1}, '"q0" must be 0 or more, not -1'),
        ({"layer": 0, "head": 0, "q0": 5, "q1": 5}, '"q0" must be less than "q1"'),
        ({"layer": 0, "head": 0, "k0": 9, "k1": 2}, '"k0" must be less than "k1"'),
        ({"layer": 6, "head": 0}, "layer 6 out of range: this model has layers 0–5"),
        ({"layer": 0, "head": 12}, "head 12 out of range: this model has heads 0–11"),
        ({"layer": 0, "head": 0, "measure": "nrom"}, "unknown measure 'nrom'"),
        ({"layer": 0, "head": 0, "measure": "alti"}, "alti has one map per layer, no heads"),
        ({"layer": 0, "head": 0, "pool": "sum"}, '"pool" must be "mean", "max" or null'),
        ({"layer": 0, "head": 0, "packed": 1}, '"packed" must be true or false'),
        ({"layer": 0, "head": 0, "text_id": 3}, '"text_id" must be a string'),
    ],
)
def test_a_bad_tile_question_is_one_line(body, said, bundled):
    with pytest.raises(InputError, match=re.escape(said)):
        TileQuestion.of(body, bundled)


def test_a_tile_outside_the_text_or_too_large_is_one_line(monkeypatch):
    served, holder, read = _held(None)
    n = len(read["tokens"])

    def said(**asked) -> str:
        with pytest.raises(InputError) as refused:
            tiles.tile(served, holder, TileQuestion(0, 0, **asked))
        assert "\n" not in str(refused.value)
        return str(refused.value)

    outside = f"this text has {n} tokens (queries and keys 0–{n - 1})"
    assert said(q1=n + 1) == f'the tile is outside the matrix: "q1" is {n + 1} and {outside}'
    assert said(k0=n) == f'the tile is outside the matrix: "k0" is {n} and {outside}'
    assert said(q0=n, q1=n + 3).startswith('the tile is outside the matrix: "q0" is')
    monkeypatch.setattr(tiles, "TILE_SIDE", 8)
    assert said(q1=9) == (
        f'a tile of 9 × {n} cells is over 8 × 8: pass "pool": "mean" or "max" (blocks of '
        "cells), or ask a smaller range"
    )
    assert tiles.tile(served, holder, TileQuestion(0, 0, q1=8, k1=8))["shape"] == [8, 8]


def test_a_tile_of_a_text_not_held_is_refused():
    from attnviz.core.models import model

    served = model(None, "cpu")
    holder = Holder()
    with pytest.raises(NotHeldError, match=r"^no text is held for tiles: read one first"):
        tiles.tile(served, holder, TileQuestion(0, 0))
    first = tiles.read(served, holder, Question("The cat sat."))["tiles"]["text_id"]
    second = tiles.read(served, holder, Question("The dog ran."))["tiles"]["text_id"]
    assert first != second and holder.held.text_id == second
    with pytest.raises(
        NotHeldError, match=f'holds another text now \\("{second}"\\), not "{first}"'
    ):
        tiles.tile(served, holder, TileQuestion(0, 0, text_id=first))
    assert tiles.tile(served, holder, TileQuestion(0, 0, text_id=second))["text_id"] == second
    # The same tokens are the same text, whichever request read them.
    assert tiles.read(served, holder, Question("The cat sat."))["tiles"]["text_id"] == first


def test_the_held_queries_and_keys_are_what_they_say_and_past_the_budget_is_refused():
    """The server holds layers × tokens × (12 query + 12 key heads) × 32 floats and the norm's
    lengths (one float a head and token), and says so; a text larger than the budget is
    refused in one line naming the numbers and the option, and what was held before is let
    go (one text's q and k at a time)."""
    served, holder, read = _held(None)
    n = len(read["tokens"])
    per_token = 24 * 32 * 4 + 12 * 4
    assert read["tiles"]["bytes"] == 6 * n * per_token == holder.held.bytes
    assert read["tiles"]["layers"] == 6
    small = Holder(budget=6 * 10 * per_token)  # ten tokens
    small.keep(holder.held)
    with pytest.raises(InputError) as refused:
        tiles.read(served, small, Question(TEXT))
    assert str(refused.value) == (
        f"this text's queries and keys are {6 * n * per_token / 2**20:.3g} MiB (6 layers × "
        f"{n} tokens × 24 heads × 32 × 4 B), over the {6 * 10 * per_token / 2**20:.3g} MiB "
        "the server holds for tiles (serve --hold-mib)"
    )
    assert small.held is None


@pytest.mark.parametrize(
    "body, said",
    [
        ({}, '"text" is missing: give the sentence to read'),
        ({"text": "a", "words": True}, "unknown key 'words': the keys are text, pair, truncate"),
        ({"text": " "}, "text is empty"),
        ({"text": "a", "truncate": "no"}, '"truncate" must be true or false'),
    ],
)
def test_a_bad_text_question_is_one_line(body, said):
    with pytest.raises(InputError, match=re.escape(said)):
        Question.of(body, TEXT_KEYS)


def test_the_page_and_the_api_keep_x_from_their_one_pass(bundled):
    """/api/page's and /api/attention's answers come from one forward pass, which also
    hands its X to the holder: a tile of it afterwards needs no pass at all."""
    from attnviz.core.models import model
    from attnviz.pipelines import serve
    from attnviz.pipelines.serve import Question

    served = model(None, "cpu")
    holder = Holder()
    passes = []
    embeddings = bundled.model.base_model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda *_: passes.append(1))
    try:
        page = serve.page(served, Question(TEXT, words=True), holder=holder)
        tile = tiles.tile(served, holder, TileQuestion(2, 3, text_id=page["tiles"]["text_id"]))
        answer = serve.attention(served, Question("The cat sat.", layers=[0]), holder)
    finally:
        handle.remove()
    assert len(passes) == 2  # the page's and the API's; none for the tile
    api = attnviz.attention(TEXT, device="cpu")
    assert np.abs(_values(tile) - api.pattern(2, 3)).max() <= SAME
    assert page["tiles_note"] is None and page["tiles"]["tokens"] == len(api.tokens)
    assert answer["tiles"]["text_id"] == holder.held.text_id != page["tiles"]["text_id"]


def test_a_text_past_the_page_is_answered_tiles_only(bundled, monkeypatch):
    """Past TILES_ONLY_CELLS the page's answer carries no heads: the text is read for tiles alone
    (no attention made: no probabilities recorded), and the answer says so."""
    from attnviz.core import recording
    from attnviz.core.models import model
    from attnviz.pipelines import serve
    from attnviz.pipelines.serve import Question

    served = model(None, "cpu")
    holder = Holder()
    n = len(attnviz.attention(TEXT, layers=[0], device="cpu").tokens)
    monkeypatch.setattr(serve, "TILES_ONLY_CELLS", 6 * 12 * n * n - 1)
    made, raw = [], recording.Scores._raw  # every block's products, torch's rows or compiled
    monkeypatch.setattr(recording.Scores, "_raw", lambda *a: made.append(1) or raw(*a))
    answer = serve.page(served, Question(TEXT, measure="norm", words=True), holder=holder)
    assert made == []
    assert answer["weights"] is None and answer["inside"] is None
    assert answer["tiles_only"].startswith(f"{n} tokens are past what the page carries whole")
    assert answer["tiles"] == holder.held.summary() and answer["layers"] == 6
    assert answer["measure"] == "norm" and list(answer["measures"]) == ["norm"]
    assert "words and hide special are not applied to tiles" in answer["notes"][-1]
    monkeypatch.setattr(serve, "TILES_ONLY_CELLS", 6 * 12 * n * n)
    assert serve.page(served, Question(TEXT), holder=holder).get("tiles_only") is None
    assert made  # the check can fail: a whole page records probabilities


# ---------- the tiles-only page of a long text, on a server in this process ----------


@pytest.fixture
def tiles_only_server(tiny_model_dirs, monkeypatch):
    """`attnviz serve`'s app for tiny Llama (grouped-query heads) on a free loopback port,
    where every text is past the page (TILES_ONLY_CELLS 1) and a tile's side is 8 cells, so that a
    20-token text is drawn from tiles, pooled; stopped after the test (at most 60 s)."""
    import threading
    import time

    import uvicorn

    from attnviz.core.models import model
    from attnviz.pipelines import serve
    from attnviz.server import listen
    from attnviz.server.app import build_app

    monkeypatch.setattr(serve, "TILES_ONLY_CELLS", 1)
    monkeypatch.setattr(tiles, "TILE_SIDE", 8)
    path = str(tiny_model_dirs["llama"])
    sock = listen("127.0.0.1", 0)
    app = build_app(model(path, "cpu"))
    running = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/", path
    running.should_exit = True
    thread.join(timeout=60)
    app.state.model_thread.shutdown(wait=True)
    sock.close()
    assert not thread.is_alive()


def test_a_served_tile_of_a_grouped_query_decoder_is_the_apis(tiles_only_server):
    """Over HTTP, on tiny Llama (4 query heads on 2 key/value heads): every head's tiles,
    weights and norm, at the matrix's corners, equal attention()'s cells."""
    import json
    import urllib.request

    url, path = tiles_only_server

    def post(route: str, body: dict) -> dict:
        asked = urllib.request.Request(url + route, json.dumps(body).encode(),
                                       {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(asked, timeout=60) as answer:
            return json.loads(answer.read())

    held = post("api/text", {"text": TEXT})["tiles"]
    n = held["tokens"]
    for measure in tiles.PER_HEAD:
        api = attnviz.attention(TEXT, model=path, device="cpu", measure=measure)
        for layer in range(2):
            for head in range(4):
                for q0, k0 in ((0, 0), (n - 8, 0), (n - 8, n - 8)):
                    asked = {
                        "text_id": held["text_id"],
                        "layer": layer,
                        "head": head,
                        "q0": q0,
                        "q1": q0 + 8,
                        "k0": k0,
                        "k1": k0 + 8,
                        "measure": measure,
                    }
                    found = _values(post("api/tile", asked))
                    expected = api.pattern(layer, head)[q0 : q0 + 8, k0 : k0 + 8]
                    assert np.abs(found - expected).max() <= SAME * max(1, expected.max())


def test_a_long_text_is_drawn_from_tiles_and_zooms_to_exact_cells(tiles_only_server, browser):
    """A text past the page opens on the matrix view alone, each cell the max of a block of
    3 × 3 cells (20 tokens over 8 cells a side), hatched where a decoder's queries see no key;
    mean is a switch away; a drag zooms into exact cells of that region, whose values are
    attention()'s, and the address brings the region back."""
    import urllib.parse

    url, path = tiles_only_server
    text = "The cat sat on the mat, and the quick brown fox jumps over the lazy dog."
    api = attnviz.attention(text, model=path, device="cpu").pattern(1, 3)  # (T, T)
    n = api.shape[0]
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "#" + urllib.parse.urlencode({"text": text, "layer": 1, "head": 3}))
    page.wait_for_selector("body[data-ready='1'] #tile", timeout=60_000)
    assert page.locator("nav [role=tab]").all_text_contents() == ["Matrix view"]
    assert "past what the page carries whole" in page.inner_text("#view-matrix")
    block = math.ceil(n / 8)
    assert f"each cell the max of a block of {block} × {block} cells" in page.inner_text(
        "#tile-hint"
    )
    seen = _visible(served_info(path), None, n)

    def cell(i: int, j: int) -> str:
        """The tooltip's text over tile cell (i, j)."""
        frame = page.locator("#matrix-over").bounding_box()
        rows, cols = (int(page.get_attribute("#tile", f"data-{k}")) for k in ("q1", "k1"))
        side = frame["width"] / math.ceil(cols / block)
        page.mouse.move(frame["x"] + (j + 0.5) * side, frame["y"] + (i + 0.5) * side)
        return page.locator("#tooltip .weight").text_content()

    expected = _pooled(api, seen, (block, block), "max")
    said, value = cell(2, 1).split(": ")
    assert said == f"max weight of {block * block} cells" and _near(value, expected[2, 1])
    assert cell(0, 2).startswith("masked")  # queries 0–2 see no key of 6–8
    page.select_option("#pool", "mean")
    page.wait_for_selector("#tile-hint >> text=the mean of a block")
    mean = _pooled(api, seen, (block, block), "mean")
    said, value = cell(2, 1).split(": ")
    assert said == f"mean weight of {block * block} cells" and _near(value, mean[2, 1])
    assert not _near(value, expected[2, 1])  # the mean is not the max: the check can fail
    assert "pool=mean" in page.url
    # Drag over blocks (1, 0) … (2, 1): queries and keys 3 … 8, then 6 × 6 exact cells.
    frame = page.locator("#matrix-over").bounding_box()
    side = frame["width"] / math.ceil(n / block)
    page.mouse.move(frame["x"] + 0.5 * side, frame["y"] + 1.5 * side)
    page.mouse.down()
    page.mouse.move(frame["x"] + 1.5 * side, frame["y"] + 2.5 * side)
    page.mouse.up()
    page.wait_for_selector("#tile[data-q0='3']")
    region = [int(page.get_attribute("#tile", f"data-{k}")) for k in ("q0", "q1", "k0", "k1")]
    assert region == [3, 9, 0, 6] and "every cell exact" in page.inner_text("#tile-hint")
    assert "Pool" not in page.inner_text("#controls")
    frame = page.locator("#matrix-over").bounding_box()
    page.mouse.move(frame["x"] + 2.5 * frame["width"] / 6, frame["y"] + 4.5 * frame["width"] / 6)
    said = page.locator("#tooltip .weight").text_content()
    assert said.startswith("weight ") and _near(said.removeprefix("weight "), api[7, 2])
    shared = page.url
    page.close()
    again = browser.new_page(viewport={"width": 1300, "height": 1000})
    again.goto(shared)
    again.wait_for_selector("body[data-ready='1'] #tile[data-q0='3'][data-k1='6']", timeout=60_000)
    again.close()
    assert errors == []


def served_info(path: str):
    from attnviz.core.models import model

    return model(path, "cpu").load().info


def _near(shown: str, expected: float) -> bool:
    """Whether a number the page prints (6 significant digits) is `expected`."""
    return abs(float(shown) - expected) <= 5e-6 * abs(expected)
