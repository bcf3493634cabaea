"""The interactive page of an encoder-decoder model: three stacks (encoder, decoder and
cross-attention) behind one switch, each drawn with its own query and key tokens.

Tiny random models (tests/seq2seq_models.py); a source and a target of different lengths, so
cross-attention's (T, S) heads are not square. Browser tests as in test_html.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from seq2seq_models import SEQ2SEQ
from test_html import ARTIFACTS, Opened, _data, _expected_colours, _unpack

STACKS = ("encoder", "decoder", "cross")
SOURCE, TARGET = "The cat sat on the mat. A quick brown fox!", "Die Katze saß."


def _stacks(loaded) -> dict:
    return _stacks_and_inside(loaded)[0]


def _stacks_and_inside(loaded) -> tuple[dict, dict]:
    """The three stacks' Attentions and inside-one-head numbers, from one forward pass."""
    from attnviz.analysis.inside import StacksInside
    from attnviz.core.extract import attend_stacks
    from attnviz.core.seq2seq import encode_source_target

    item = encode_source_target(loaded, SOURCE, TARGET)
    inside = StacksInside(loaded)
    found = attend_stacks(loaded, [item], STACKS, also=inside([item]))[0]
    return found, inside.results()


@pytest.fixture(scope="module")
def found_inside(loaded_seq2seq) -> tuple[dict, dict]:
    """BART's three stacks: 2 encoder layers × 4 heads, 3 decoder layers × 2 heads; and
    their inside-one-head numbers."""
    found, inside = _stacks_and_inside(loaded_seq2seq["bart"])
    n_target, n_source = found["cross"].weights.shape[-2:]
    assert n_target != n_source  # the point of these tests
    return found, inside


@pytest.fixture(scope="module")
def found(found_inside) -> dict:
    return found_inside[0]


@pytest.fixture(scope="module")
def page_file(found_inside, tmp_path_factory):
    from attnviz.outputs.html import write_page

    found, inside = found_inside
    path = tmp_path_factory.mktemp("seq2seq-page") / "attention.html"
    return write_page(found["cross"], path, stacks=found, inside=inside)


@pytest.fixture
def opened(browser, page_file):
    page = Opened(browser, page_file)
    yield page
    page.close()
    assert page.errors == []
    assert page.requests == [page.url], "the page made a request besides its own file"


# ---------- the file itself ----------


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_each_stacks_weights_in_the_page_are_attend_stacks(loaded_seq2seq, arch):
    from attnviz.outputs.html import build_page

    found = _stacks(loaded_seq2seq[arch])
    data = _data(build_page(found["cross"], stacks=found))
    assert data["stack"] == "cross" and data["target"] == TARGET and data["text"] == SOURCE
    for stack, att in found.items():
        entry = data["stacks"][stack]
        n_layers, n_heads, n_queries, n_keys = att.weights.shape  # (L, H, T, S)
        assert entry["tokens"] == list(att.tokens)
        assert entry["key_tokens"] == list(att.key_tokens)
        assert (entry["layers"], entry["heads"]) == (n_layers, n_heads)
        assert entry["layer_ids"] == list(range(n_layers))
        assert entry["causal"] == (stack == "decoder") and entry["encoding"] == "float32"
        decoded = np.stack([
            np.stack([_unpack(blob, "<f4").reshape(n_queries, n_keys) for blob in layer])
            for layer in entry["weights"]
        ])  # fmt: skip
        assert np.array_equal(decoded, att.weights)
    cross = data["stacks"]["cross"]
    assert cross["tokens"] == data["stacks"]["decoder"]["tokens"]  # target queries
    assert cross["key_tokens"] == data["stacks"]["encoder"]["tokens"]  # source keys


def test_page_opens_on_the_given_stack_without_measures(found, page_file):
    from attnviz.outputs.html import build_page

    data = _data(page_file.read_text(encoding="utf-8"))
    assert data["measures"] == {} and data["inside"] is None
    assert data["measures_note"].startswith("The measure switch is not on encoder-decoder pages")
    assert all(data["stacks"][stack]["inside"] is not None for stack in STACKS)
    assert [s for s, _, _ in data["model"]["stacks"]] == list(STACKS)
    assert _data(build_page(found["encoder"], stacks=found))["stack"] == "encoder"


def test_page_without_every_stack_or_with_measures_is_refused(found):
    from attnviz.outputs.html import build_page

    with pytest.raises(ValueError, match="needs the stacks encoder, decoder, cross"):
        build_page(found["cross"], stacks={"cross": found["cross"]})
    with pytest.raises(ValueError, match="cross-attention page needs all three stacks"):
        build_page(found["cross"])
    with pytest.raises(ValueError, match="weights only"):
        build_page(found["cross"], stacks=found, measures={"norm": found["cross"]})


def _inside_probs(entry: dict, layer: int, head: int, causal: bool) -> np.ndarray:
    """One head's probabilities recomputed from the page's own inside numbers, as page.js
    does: Q_h K_hᵀ · scale (+ T5's B_h), later keys masked where causal, softmax. (T, S)."""
    n, n_keys, d_k = len(entry["tokens"]), len(entry["key_tokens"]), entry["d_k"]
    q, k = (
        _unpack(entry[name][layer][head], "<f4").reshape(-1, d_k).astype(np.float64)
        for name in ("q", "k")
    )
    assert q.shape[0] == n and k.shape[0] == n_keys  # queries × d_k, keys × d_k
    scores = q @ k.T * entry["scores"][layer]["scale"]  # (T, S)
    if entry["bias"] is not None:
        scores += _unpack(entry["bias"][head], "<f4").reshape(n, n_keys)
    if causal:
        scores[np.triu(np.ones((n, n_keys), bool), k=1)] = -np.inf
    exps = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exps / exps.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_each_stacks_inside_numbers_are_the_models_probabilities(loaded_seq2seq, arch):
    """Every stack's page carries its own inside view: queries and keys of the right side
    (cross-attention: target × source), T5's bias where the stack has one, and numbers whose
    softmax is the model's probabilities for every layer and head, within 1e-5."""
    from attnviz.outputs.html import build_page

    found, inside = _stacks_and_inside(loaded_seq2seq[arch])
    data = _data(build_page(found["cross"], inside=inside, stacks=found))
    for stack, att in found.items():
        entry = data["stacks"][stack]["inside"]
        assert data["stacks"][stack]["inside_note"] is None
        assert entry["tokens"] == list(att.tokens) and entry["key_tokens"] == list(att.key_tokens)
        assert (entry["bias"] is not None) == (arch == "t5" and stack != "cross"), stack
        n_layers, n_heads = att.weights.shape[:2]
        assert entry["heads"] == n_heads and len(entry["q"]) == n_layers
        for layer in range(n_layers):
            for head in range(n_heads):
                ours = _inside_probs(entry, layer, head, stack == "decoder")
                assert np.abs(ours - att.weights[layer, head]).max() < 1e-5, (stack, layer, head)
        errors = _unpack(entry["errors"], "<f8")
        assert errors.size == n_layers * n_heads * len(att.tokens) and errors.max() < 1e-5


def test_the_three_stacks_share_the_inside_budget(loaded_seq2seq, monkeypatch):
    """Each stack's Q, K and V fit the budget alone but not together: every stack goes
    without the view, says why, and the pass records nothing for it; a page given all
    three anyway leaves them out the same way."""
    from attnviz.analysis import inside as inside_module
    from attnviz.analysis.inside import StacksInside
    from attnviz.core.seq2seq import encode_source_target
    from attnviz.outputs.html import build_page

    loaded = loaded_seq2seq["bart"]
    found, inside = _stacks_and_inside(loaded)
    sizes = {s: i.q.nbytes + i.k.nbytes + i.v.nbytes for s, i in inside.items()}
    monkeypatch.setattr(inside_module, "INSIDE_BUDGET", max(sizes.values()) + 1)
    assert sum(sizes.values()) > inside_module.INSIDE_BUDGET
    recorders = StacksInside(loaded)([encode_source_target(loaded, SOURCE, TARGET)])
    assert all(recorder.wants == {} for recorder in recorders)
    reasons = {recorder.result() for recorder in recorders}
    assert len(reasons) == 1 and "every layer of 3 stacks" in reasons.pop()
    data = _data(build_page(found["cross"], inside=inside, stacks=found))
    for stack in STACKS:
        entry = data["stacks"][stack]
        assert entry["inside"] is None and "every layer of 3 stacks" in entry["inside_note"]


def test_seq2seq_page_keeps_the_strict_policy(page_file):
    import re

    page = page_file.read_text(encoding="utf-8")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp and "connect-src" not in csp
    assert not re.search(r"(src|href)=", page) and not re.search(r"https?://", page)
    assert re.search(r"<title>attnviz: The cat sat on the mat\. A quick brown fox! → Die", page)


# ---------- in a real browser ----------


def _cell_centres(n_rows: int, n_cols: int, cell: float) -> list[tuple[int, int]]:
    """The canvas pixel at the centre of each cell, row-major [query, key]: (x, y)."""
    return [
        (int((k + 0.5) * cell), int((q + 0.5) * cell)) for q in range(n_rows) for k in range(n_cols)
    ]


def _matrix(opened: Opened) -> tuple[int, int, list[str], list[str]]:
    """The matrix canvas's width and height, and its row and column labels' texts."""
    width, height = (int(opened.page.get_attribute("#matrix", a)) for a in ("width", "height"))
    rows = opened.page.locator(".row-labels div:not(.hover)").all_inner_texts()
    cols = opened.page.locator(".col-labels div:not(.hover)").all_inner_texts()
    return width, height, rows, cols


def _switch(opened: Opened, stack: str) -> None:
    n = opened.renders()
    opened.page.select_option("#stack", stack)
    opened.settle(n + 1)


def test_stack_switch_redraws_the_matrix_with_its_own_tokens(opened, found):
    """The page opens on cross-attention: target rows, source columns, whole square pixels
    per token, each cell its weight; each stack then brings its own size, labels and
    layer and head counts."""
    opened.view("matrix")
    assert opened.page.input_value("#stack") == "cross"
    assert opened.page.locator("#tab-inside").count() == 1
    assert opened.page.locator("#measure").count() == 0
    header = opened.page.inner_text("header")
    assert "measure switch is not on encoder-decoder pages" in header
    assert "inside" not in header
    for stack in ("cross", "encoder", "decoder", "cross"):
        if opened.page.input_value("#stack") != stack:
            _switch(opened, stack)
        att = found[stack]
        n_layers, n_heads, n_rows, n_cols = att.weights.shape
        width, height, rows, cols = _matrix(opened)
        cell = width // n_cols
        assert width == cell * n_cols and height == cell * n_rows and cell >= 9, stack
        assert rows == list(att.tokens) and cols == list(att.key_tokens), stack
        options = (
            opened.page.locator("#layer option").count(),
            opened.page.locator("#head option").count(),
        )
        assert options == (n_layers, n_heads), stack
        drawn = opened.canvas("#matrix", _cell_centres(n_rows, n_cols, cell))
        if stack == "decoder":  # later keys are drawn masked
            keep = ~np.triu(np.ones((n_rows, n_cols), bool), k=1).ravel()
        else:
            keep = np.ones(n_rows * n_cols, bool)
        assert (drawn[keep] == _expected_colours(att.weights[0, 0])[keep]).all(), stack
    ARTIFACTS.mkdir(exist_ok=True)
    opened.page.screenshot(path=str(ARTIFACTS / "seq2seq-cross-matrix.png"))


def test_cross_attention_tooltip_names_a_target_query_and_a_source_key(opened, found):
    cross = found["cross"]
    opened.view("matrix")
    n = opened.renders()
    opened.page.select_option("#layer", "2")
    opened.settle(n + 1)
    width, height, _, _ = _matrix(opened)
    n_rows, n_cols = cross.weights.shape[-2:]
    box = opened.page.locator("#matrix-over").bounding_box()
    query, key = n_rows - 1, n_cols - 2  # a key past the last target position
    cell = width / n_cols
    opened.page.mouse.move(box["x"] + (key + 0.5) * cell, box["y"] + (query + 0.5) * cell)
    weight = opened.page.locator("#tooltip .weight")
    assert (weight.get_attribute("data-query"), weight.get_attribute("data-key")) == (
        str(query),
        str(key),
    )
    assert float(weight.inner_text().split()[-1]) == pytest.approx(
        cross.weights[2, 0, query, key], abs=1e-6
    )
    tooltip = opened.page.inner_text("#tooltip")
    assert f"query {query}: {cross.tokens[query]}" in tooltip
    assert f"key {key}: {cross.key_tokens[key]}" in tooltip
    assert opened.page.inner_text(".col-labels .hover") == cross.key_tokens[key]


def test_head_view_draws_target_tokens_to_source_tokens(opened, found):
    cross = found["cross"]
    left = opened.page.locator(".tokens.q .token").all_inner_texts()
    right = opened.page.locator(".tokens.k .token").all_inner_texts()
    assert left == list(cross.tokens) and right == list(cross.key_tokens)
    assert opened.page.inner_text(".columns .side.q") == "target (queries)"
    assert opened.page.inner_text(".columns .side.k") == "source (keys)"
    query = 2
    opened.page.hover(f".tokens.q .token >> nth={query}")
    lines = int(opened.page.get_attribute("#lines", "data-lines"))
    assert lines == int((cross.weights[0, :, query] >= 1 / 64).sum())
    opened.page.hover(f".tokens.k .token >> nth={len(cross.key_tokens) - 1}")  # below the queries
    lines = int(opened.page.get_attribute("#lines", "data-lines"))
    assert lines == int((cross.weights[0, :, :, -1] >= 1 / 64).sum())
    ARTIFACTS.mkdir(exist_ok=True)
    opened.page.screenshot(path=str(ARTIFACTS / "seq2seq-cross-head.png"))
    _switch(opened, "encoder")
    left = opened.page.locator(".tokens.q .token").all_inner_texts()
    assert left == list(found["encoder"].tokens)
    assert opened.page.locator(".head-toggle").count() == found["encoder"].weights.shape[1]


def test_query_and_model_views_follow_the_stack(opened, found):
    cross = found["cross"]
    opened.view("query")
    options = opened.page.locator("#query option").all_inner_texts()
    assert options == [f"{i}: {t}" for i, t in enumerate(cross.tokens)]
    query = int(opened.page.input_value("#query"))
    first = (
        opened.page.locator(".query-table tr >> nth=1")
        .locator("td >> nth=0")
        .locator(".key >> nth=0")
    )
    best = int(cross.weights[0, 0, query].argmax())
    assert first.get_attribute("title").startswith(f"{best}: {cross.key_tokens[best]}:")
    _switch(opened, "decoder")  # the same queries: the query stays
    assert int(opened.page.input_value("#query")) == query
    opened.view("model")
    n_layers, n_heads, n_rows, n_cols = found["decoder"].weights.shape
    assert opened.page.locator(".thumb").count() == n_layers * n_heads
    _switch(opened, "cross")
    thumb = opened.page.locator(".thumb >> nth=0")
    size = (int(thumb.get_attribute("width")), int(thumb.get_attribute("height")))
    longer = max(n_rows, len(cross.key_tokens))
    assert size == (round(76 * len(cross.key_tokens) / longer), round(76 * n_rows / longer))
    opened.page.click(".thumb[data-layer='1'][data-head='1']")
    opened.page.wait_for_selector("section#view-matrix")
    assert opened.page.input_value("#stack") == "cross"
    assert (opened.page.input_value("#layer"), opened.page.input_value("#head")) == ("1", "1")


def _select(opened: Opened, **chosen: str) -> None:
    for control, value in chosen.items():
        n = opened.renders()
        opened.page.select_option(f"#{control}", value)
        opened.settle(n + 1)


def _inside_rows(opened: Opened) -> list[list[str]]:
    """The inside table's rows (after its heading row), each cell's text."""
    rows = opened.page.locator(".inside-table tr").all()[1:]
    return [row.locator("td").all_inner_texts() for row in rows]


def test_inside_view_on_cross_attention_reads_target_queries_and_source_keys(opened, found_inside):
    """The inside tab on cross-attention: its queries are the target's tokens, its keys and
    values the source's, and the softmax it computes from Q_h and K_h is the model's weight
    for every source token; on the decoder the keys are the target's, up to the query."""
    found, inside = found_inside
    cross = found["cross"]
    opened.view("inside")
    assert opened.page.input_value("#stack") == "cross"
    layer, head, query = 1, 1, 2
    _select(opened, layer=str(layer), head=str(head), query=str(query))
    options = opened.page.locator("#query option").all_inner_texts()
    assert options == [f"{i}: {t}" for i, t in enumerate(cross.tokens)]  # the target
    heading = opened.page.locator(".inside-table th").all_inner_texts()
    assert heading == ["key (source)", "k_h", "q·k", "q·k · scale", "softmax", "model", "v_h"]
    rows = _inside_rows(opened)
    assert [row[0] for row in rows] == [f"{j}: {t}" for j, t in enumerate(cross.key_tokens)]
    softmax = np.array([float(row[4]) for row in rows])
    model = np.array([float(row[5]) for row in rows])
    assert np.abs(softmax - cross.weights[layer, head, query]).max() < 1e-5
    assert np.abs(model - cross.weights[layer, head, query]).max() < 1e-6
    shown_q = [float(v) for v in opened.page.inner_text("#inside-q").split()]
    assert np.allclose(shown_q, inside["cross"].q[layer, head, query], atol=5e-4)
    hint = opened.page.inner_text("#view-inside .hint >> nth=0")
    assert hint.startswith(
        f"Cross-attention, layer {layer}, head {head}, query “{cross.tokens[query]}”"
    )
    assert "encoder's last hidden states (the source tokens)" in hint
    checks = opened.page.locator(".check").all_inner_texts()
    errors = [float(v) for text in checks for v in re.findall(r"\d\.\d+e[+-]\d+", text)]
    assert len(errors) == 3 and max(errors) < 1e-5
    assert opened.clipped("#view-inside") == []
    ARTIFACTS.mkdir(exist_ok=True)
    opened.page.screenshot(path=str(ARTIFACTS / "seq2seq-cross-inside.png"), full_page=True)
    _switch(opened, "decoder")  # the same queries; keys the target's, the later ones masked
    decoder = found["decoder"]
    assert int(opened.page.input_value("#query")) == query
    rows = _inside_rows(opened)
    assert [row[0] for row in rows] == [f"{j}: {decoder.key_tokens[j]}" for j in range(query + 1)]
    softmax = np.array([float(row[4]) for row in rows])
    assert np.abs(softmax - decoder.weights[layer, head, query, : query + 1]).max() < 1e-5


def test_inside_view_adds_t5s_relative_bias(browser, loaded_seq2seq, tmp_path):
    """T5's self-attention stacks add B_h to unscaled scores: the table shows it as its own
    column, and the softmax over q·k + B_h is the model's weight."""
    from attnviz.outputs.html import write_page

    found, inside = _stacks_and_inside(loaded_seq2seq["t5"])
    path = write_page(found["cross"], tmp_path / "attention.html", stacks=found, inside=inside)
    opened = Opened(browser, path)
    try:
        opened.view("inside")
        _switch(opened, "encoder")
        layer, head, query = 1, 1, 3
        _select(opened, layer=str(layer), head=str(head), query=str(query))
        heading = opened.page.locator(".inside-table th").all_inner_texts()
        assert heading[3:5] == ["B_h", "q·k · scale + B_h"]
        rows = _inside_rows(opened)
        encoder = found["encoder"]
        assert [row[0] for row in rows] == [f"{j}: {t}" for j, t in enumerate(encoder.tokens)]
        bias = np.array([float(row[3]) for row in rows])
        assert np.allclose(bias, inside["encoder"].bias[head, query], atol=5e-5)
        softmax = np.array([float(row[5]) for row in rows])
        assert np.abs(softmax - encoder.weights[layer, head, query]).max() < 1e-5
        _switch(opened, "cross")  # no bias in T5's cross-attention
        assert "B_h" not in opened.page.locator(".inside-table th").all_inner_texts()
    finally:
        opened.close()
    assert opened.errors == []


def test_show_and_the_api_give_every_stack_its_inside_view_from_one_pass(
    seq2seq_dirs, tmp_path, monkeypatch
):
    """`show --target --html` and `Attention.to_html()` run the model once for the page:
    that pass gives the weights and each stack's Q, K, V and B_h."""
    from typer.testing import CliRunner

    import attnviz
    from attnviz.cli import app
    from attnviz.core import capture

    passes = []
    run = capture.run
    monkeypatch.setattr(capture, "run", lambda *a, **k: passes.append(1) or run(*a, **k))
    folder = str(seq2seq_dirs["t5"])
    args = ["show", SOURCE, "-m", folder, "--target", TARGET, "--html", "--no-images"]
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    pages = [next(tmp_path.rglob("attention.html")).read_text(encoding="utf-8")]
    assert len(passes) == 1
    att = attnviz.attention(SOURCE, model=folder, device="cpu", target=TARGET)
    passes.clear()
    pages.append(att.to_html())
    assert len(passes) == 1
    for page in pages:
        stacks = _data(page)["stacks"]
        for stack in STACKS:
            entry = stacks[stack]["inside"]
            assert entry is not None and stacks[stack]["inside_note"] is None, stack
            assert entry["key_tokens"] == stacks[stack]["key_tokens"], stack
            assert (entry["bias"] is None) == (stack == "cross"), stack
