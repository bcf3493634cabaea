"""`--query`: naming one token, where it looks in every head, its figure and JSON."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from attnviz.analysis.query import find_query, query_view
from attnviz.cli import app
from attnviz.errors import InputError
from tests.conftest import synthetic_attention

runner = CliRunner()
ANIMAL = "The animal didn't cross the street because it was too tired."


def _att(tokens, special=None):
    n = len(tokens)
    return synthetic_attention(np.full((1, 1, n, n), 1 / n), tokens, special)


def test_query_by_token_occurrence_and_position():
    att = _att(["[CLS]", "The", "cat", "saw", "the", "cat", "[SEP]"], [1, 0, 0, 0, 0, 0, 1])
    assert find_query(att, "cat") == 2
    assert find_query(att, "CAT#2") == 5
    assert find_query(att, "the") == 1 and find_query(att, "the#2") == 4  # case-insensitive
    assert find_query(att, "3") == 3
    assert find_query(att, "[sep]") == 6


@pytest.mark.parametrize(
    "query, message",
    [
        ("dog", "no token 'dog' in this text; tokens: 0:[CLS] 1:un 2:##believ 3:##able 4:[SEP]"),
        ("able", None),  # a word piece matches without its ##
        ("unbelievable", "split into pieces here: pass --words"),
        ("un#2", "'un' occurs 1 time(s), so 'un#2' names none; at positions 1"),
        ("9", "query position 9 out of range: this text has tokens 0–4"),
    ],
)
def test_unknown_queries_say_what_there_is(query, message):
    att = _att(["[CLS]", "un", "##believ", "##able", "[SEP]"], [1, 0, 0, 0, 1])
    object.__setattr__(att, "word_labels", ("[CLS]", "unbelievable", "[SEP]"))
    if message is None:
        assert find_query(att, query) == 3
        return
    with pytest.raises(InputError, match=re.escape(message)):
        find_query(att, query)


def test_query_view_reads_the_query_row():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5, 5))
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    att = synthetic_attention(weights, ["[CLS]", "a", "b", "c", "[SEP]"], [1, 0, 0, 0, 1])
    view = query_view(att, 2, [0, 1], [0, 1, 2], top_k=2)
    assert len(view.heads) == 6 and view.token == "b"
    for row in view.heads:
        expected = weights[row.layer, row.head, 2]
        assert [t.index for t in row.top] == list(np.argsort(-expected)[:2])
        assert row.best.index == 1 + int(np.argmax(expected[1:4]))  # specials left out
        assert row.best.weight == pytest.approx(expected[row.best.index])
    ranked = view.ranked(3)
    assert [h.best.weight for h in ranked] == sorted(h.best.weight for h in view.heads)[::-1][:3]


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_show_query_map_json_and_figure(bundled, tmp_path):
    from attnviz.core.extract import extract

    result = runner.invoke(app, ["show", ANIMAL, "-q", "it", "-o", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["query"] == {"index": 10, "token": "it"}
    weights = extract(bundled, ANIMAL).weights
    for entry in data["heads"]:
        row = weights[entry["layer"], entry["head"], 10]
        top = entry["query_top"]
        assert [t["index"] for t in top] == list(np.argsort(-row, kind="stable")[:3])
        assert top[0]["weight"] == pytest.approx(float(row.max()), abs=1e-6)
    (figure,) = [p for p in map(str, data["images"]) if "query-" in p]
    assert figure.endswith("query-it-10.png")
    with Image.open(figure) as image:
        assert image.format == "PNG" and image.size[1] > 1000  # 72 rows, one per head

    terminal = runner.invoke(app, ["show", ANIMAL, "-q", "it", "--no-images"])
    assert terminal.exit_code == 0
    assert "Where “it” (position 10) looks" in terminal.output
    assert "Heads where “it” looks hardest" in terminal.output


def test_show_query_with_words_and_hidden_specials():
    result = runner.invoke(
        app, ["show", ANIMAL, "-q", "Animal", "--words", "--hide-special", "--no-images", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["query"] == {"index": 1, "token": "animal"}  # no [CLS] before it
    assert all(t["token"] not in ("[CLS]", "[SEP]") for h in data["heads"] for t in h["query_top"])


def test_unknown_query_is_exit_2_listing_tokens(tmp_path):
    result = runner.invoke(app, ["show", "Birds sing.", "-q", "cats", "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert "no token 'cats' in this text; tokens: 0:[CLS] 1:birds 2:sing 3:. 4:[SEP]" in (
        " ".join(result.output.split())
    )


def test_query_figure_rows_follow_the_query_row(tmp_path):
    """Row (layer, head) of the figure is bright exactly at the key that row attends to."""
    from attnviz.outputs.figures import Style, save_figure
    from tests.conftest import query_of

    n, n_heads = 6, 4
    weights = np.zeros((2, n_heads, n, n))
    for layer in range(2):
        for head in range(n_heads):
            weights[layer, head, :, (layer * n_heads + head) % n] = 1.0
    att = synthetic_attention(weights, [f"t{i}" for i in range(n)])
    style = Style(cmap="Greys")
    fig = query_of(att, 3, [0, 1], list(range(n_heads)), style)
    ax = fig.axes[0]
    box = ax.get_window_extent()
    image = np.asarray(Image.open(save_figure(fig, tmp_path / "q.png", style)).convert("L"))
    rows = 2 * n_heads
    for r in range(rows):
        for k in range(n):
            x = int(box.x0 + (k + 0.5) * box.width / n)
            y = int(image.shape[0] - (box.y1 - (r + 0.5) * box.height / rows))
            assert (image[y, x] < 60) == (k == r % n), (r, k)


def test_unknown_tokens_are_labelled_and_queried_by_their_text(bundled):
    from attnviz.analysis.query import find_query
    from attnviz.core.extract import extract

    att = extract(bundled, "I love pizza 🍕 and 😀 so much")
    # WordPiece has neither emoji: the model reads [UNK] for each, labelled by its text
    ids = bundled.tokenizer("I love pizza 🍕 and 😀 so much")["input_ids"]
    assert [i for i, t in enumerate(ids) if t == bundled.tokenizer.unk_token_id] == [4, 6]
    assert att.tokens[4] == "🍕" and att.tokens[6] == "😀" and "[UNK]" not in att.tokens
    assert any("[UNK]" in note and "🍕 😀" in note for note in att.notes)
    assert find_query(att, "😀") == 6


# Texts a tokenizer loaded alone must cut as the loaded model's: word pieces, accents, scripts
# and emoji (unknown to WordPiece), and a text over every model's limit.
TEXTS = [ANIMAL, "Héllo 世界 🙂 — it's 2024, unbelievably!", " ".join(["word"] * 600)]


def _alone_and_loaded_agree(name, loaded):
    """Tokens from the model's tokenizer loaded alone, with the facts of its files, are the
    loaded model's: as many, labelled alike, cut alike, refused alike."""
    from attnviz.core.models import Model, describe
    from attnviz.core.tokens import encode_with
    from attnviz.errors import TextTooLongError

    alone, spec = Model(name).tokenizer(), describe(name)
    pairs = [None] if loaded.info.causal else [None, "A second sentence, for the pair."]
    for text, pair, truncate in itertools.product(TEXTS, pairs, (False, True)):
        found = []
        for tokenizer, facts in ((alone, spec), (loaded.tokenizer, loaded.info)):
            try:
                found.append(encode_with(tokenizer, facts, text, truncate, pair))
            except TextTooLongError as error:
                found.append(str(error))
        assert found[0] == found[1], (name, text, pair, truncate)


def test_a_tokenizer_loaded_alone_cuts_as_the_loaded_model(tiny_model_dirs, loaded_tiny, bundled):
    """What --query is checked against before the weights load is what it is found in after."""
    _alone_and_loaded_agree(None, bundled)
    for arch, folder in tiny_model_dirs.items():
        _alone_and_loaded_agree(str(folder), loaded_tiny[arch])


def test_smollm2_tokenizer_loaded_alone_cuts_as_the_loaded_model(smollm2_gguf):
    from attnviz.core.models import load_model

    _alone_and_loaded_agree("smollm2", load_model("smollm2", "cpu"))


def test_the_model_reuses_the_tokenizer_loaded_alone(tiny_model_dirs, monkeypatch):
    from attnviz.core import models
    from attnviz.core.models import Model

    monkeypatch.setattr(models, "_KEPT", models._Kept())  # not loaded by an earlier test
    model = Model(str(tiny_model_dirs["gpt2"]), "cpu")
    alone = model.tokenizer()
    assert model.load().tokenizer is alone and model.tokenizer() is alone


@pytest.mark.parametrize(
    "model, args, message",
    [
        (None, ["Birds sing.", "-q", "cats"],
         "no token 'cats' in this text; tokens: 0:[CLS] 1:birds 2:sing 3:. 4:[SEP]"),
        (None, ["Birds sing.", "-q", "cats", "--words", "--hide-special"],
         "no word 'cats' in this text; words: 0:Birds 1:sing 2:."),
        (None, ["Birds sing.", "-q", "5"],
         "query position 5 out of range: this text has tokens 0–4"),
        (None, ["Birds sing.", "-q", "sing#2"], "'sing' occurs 1 time(s), so 'sing#2' names none"),
        ("gpt2", ["Birds sing.", "-q", "cats"], "no token 'cats' in this text; tokens: 0:"),
    ],
)  # fmt: skip
def test_an_unknown_query_is_refused_before_the_weights_load(
    tiny_model_dirs, monkeypatch, tmp_path, model, args, message
):
    from attnviz.core import models

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded to refuse a query")

    monkeypatch.setattr(models, "load_model", no_load)
    monkeypatch.setattr(models, "_MODELS", {})  # none loaded by an earlier test
    monkeypatch.setattr(models, "_KEPT", models._Kept())
    chosen = ["-m", str(tiny_model_dirs[model])] if model else []
    result = runner.invoke(app, ["show", *args, *chosen, "-o", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and len(result.output.splitlines()) == 1


@pytest.mark.parametrize(
    "words, hide", [(False, False), (True, False), (False, True), (True, True)]
)
def test_the_early_query_check_answers_as_the_loaded_attention(bundled, words, hide):
    from attnviz.analysis.query import check_query
    from attnviz.analysis.transforms import transform
    from attnviz.core.extract import extract
    from attnviz.core.tokens import encode

    text = "The cat sat on the mat, unbelievably; the cat slept."
    shown = transform(extract(bundled, text), words, hide)
    encoded = encode(bundled, text)
    queries = ["cat", "CAT#2", "cat#3", "3", "14", "15", "unbelievably", "##bly", "[CLS]", "dog"]
    for query in queries:
        try:
            expected = find_query(shown, query)
        except InputError as error:
            with pytest.raises(InputError) as refused:
                check_query(encoded, query, words, hide)
            assert str(refused.value) == str(error)
        else:
            assert check_query(encoded, query, words, hide) == expected
