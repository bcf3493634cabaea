"""`attnviz compare`: token alignment, per-head Jensen–Shannon divergence, the API, the command
line and its refusals."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from conftest import perturbed_copy, synthetic_attention
from typer.testing import CliRunner

import attnviz
from attnviz.analysis.compare import align, compare_pair, compare_pairs, js_divergence, project
from attnviz.cli import app

runner = CliRunner()
PAIR = ("The keys to the cabinet are on the table.", "The keys to the cabinet is on the table.")


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _attentions(loaded, *texts):
    from attnviz.core.extract import attend
    from attnviz.core.tokens import encode

    return attend(loaded, [encode(loaded, text) for text in texts])


def test_js_divergence_is_zero_for_equal_rows_symmetric_and_at_most_ln2():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), size=5), rng.dirichlet(np.ones(7), size=5)
    assert (js_divergence(p, p) == 0).all()
    assert (js_divergence(p, q) == js_divergence(q, p)).all()
    assert (js_divergence(p, q) > 0).all()
    disjoint = js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert disjoint == pytest.approx(math.log(2), abs=1e-12)


def test_the_same_text_twice_moves_no_head(bundled):
    a, b = _attentions(bundled, PAIR[0], PAIR[0])
    found = compare_pair(a, b)
    assert (found.divergence == 0).all()
    assert (found.special_change == 0).all()
    assert all(v is None or (v == 0).all() for v in found.role_change.values())
    assert found.alignment.unaligned_a == found.alignment.unaligned_b == ()
    assert all(u.kind == "token" for u in found.alignment.units)


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_one_head_s_w_q_changed_moves_that_head_and_nothing_below(arch, tiny_model_dirs, tmp_path):
    changed = perturbed_copy(tiny_model_dirs[arch], tmp_path / "changed", layer=1, head=2)
    text = "the cat sat on the mat and the dog sat on the log"
    found = attnviz.compare(
        text, model=str(tiny_model_dirs[arch]), against_model=str(changed), device="cpu"
    )
    assert found.divergence.shape == (2, 4)
    assert (found.divergence[0] == 0).all()  # layer 0 reads the same input with the same weights
    assert found.divergence[1, 2] > 1e-4
    assert found.divergence[1, 2] == found.divergence.max()
    assert found.moved(1) == [(1, 2, float(found.divergence[1, 2]))]


def test_alignment_of_tokenisations_of_different_lengths():
    # A: [CLS] the cat sat [SEP]; B: [CLS] the kit ##ten sat down [SEP] ("kitten" in two pieces)
    rng = np.random.default_rng(1)
    a = synthetic_attention(
        rng.dirichlet(np.ones(5), size=(1, 2, 5)), ["[CLS]", "the", "cat", "sat", "[SEP]"],
        special=[1, 0, 0, 0, 1],
    )  # fmt: skip
    b = synthetic_attention(
        rng.dirichlet(np.ones(7), size=(1, 2, 7)),
        ["[CLS]", "the", "kit", "##ten", "sat", "down", "[SEP]"],
        special=[1, 0, 0, 0, 0, 0, 1],
        words=[0, 1, 2, 2, 3, 4, 5],
        word_labels=["[CLS]", "the", "kitten", "sat", "down", "[SEP]"],
    )
    alignment = align(a, b)
    assert [(u.a, u.b, u.kind) for u in alignment.units] == [
        ((0,), (0,), "token"),
        ((1,), (1,), "token"),
        ((2,), (2, 3), "substituted"),
        ((3,), (4,), "token"),
        ((4,), (6,), "token"),
    ]
    assert alignment.unaligned_a == () and alignment.unaligned_b == (5,)
    assert alignment.labels() == ["[CLS]", "the", "cat→kitten", "sat", "[SEP]"]
    assert "only in B: down" in alignment.note(a.tokens, b.tokens)
    grids = project(b.weights, [u.b for u in alignment.units])  # (1, 2, 5, 5)
    assert np.allclose(grids.sum(-1), 1.0)
    # kitten's row: the mean of its pieces' rows; its column: the sum of their columns;
    # then the row renormalised over the aligned keys (every key but "down")
    raw = b.weights[0, 1].astype(np.float64)
    row = raw[[2, 3]].mean(axis=0)
    expected = np.array([row[0], row[1], row[2] + row[3], row[4], row[6]])
    assert np.allclose(grids[0, 1, 2], expected / expected.sum())
    found = compare_pair(a, b)
    assert found.rows.shape == (1, 2, 5) and np.isfinite(found.divergence).all()


def test_runs_of_unequal_length_pair_what_they_share():
    # A: "the doghouse was red", B: "the dog house looked red": difflib replaces the run
    # [doghouse, was] by [dog, house, looked] (2 words by 3); inside it the tokens "dog" and
    # "house" (A's "##house") are shared, and "was"/"looked" are one word each between them.
    rng = np.random.default_rng(3)
    a = synthetic_attention(
        rng.dirichlet(np.ones(7), size=(1, 2, 7)),
        ["[CLS]", "the", "dog", "##house", "was", "red", "[SEP]"],
        special=[1, 0, 0, 0, 0, 0, 1],
        words=[0, 1, 2, 2, 3, 4, 5],
        word_labels=["[CLS]", "the", "doghouse", "was", "red", "[SEP]"],
    )
    b = synthetic_attention(
        rng.dirichlet(np.ones(7), size=(1, 2, 7)),
        ["[CLS]", "the", "dog", "house", "looked", "red", "[SEP]"],
        special=[1, 0, 0, 0, 0, 0, 1],
    )
    alignment = align(a, b)
    assert [(u.a, u.b, u.kind, u.label) for u in alignment.units] == [
        ((0,), (0,), "token", "[CLS]"),
        ((1,), (1,), "token", "the"),
        ((2,), (2,), "shared", "dog"),
        ((3,), (3,), "shared", "##house→house"),
        ((4,), (4,), "substituted", "was→looked"),
        ((5,), (5,), "token", "red"),
        ((6,), (6,), "token", "[SEP]"),
    ]
    assert alignment.unaligned_a == alignment.unaligned_b == ()
    assert alignment.note(a.tokens, b.tokens) is None


def test_runs_of_unequal_length_on_the_bundled_model(bundled):
    """A word the tokenizer cuts in pieces against the same word written in two: "doghouse"
    is dog ##house, "dog house" two words. Before, both were left unaligned."""
    whole = compare_pair(*_attentions(bundled, "The dog slept in the doghouse.",
                                      "The dog slept in the dog house."))  # fmt: skip
    assert [u.kind for u in whole.alignment.units].count("shared") == 2
    assert whole.alignment.unaligned_a == whole.alignment.unaligned_b == ()
    # "sunflowers" is sun ##flower ##s, "sun flowers" two words: "sun" pairs; "##flower ##s"
    # against "flowers" (part of a word against a word) does not, and is said.
    part = compare_pair(*_attentions(bundled, "I like the sunflowers here.",
                                     "I like the sun flowers here."))  # fmt: skip
    shared = [u for u in part.alignment.units if u.kind == "shared"]
    assert [(part.a.tokens[u.a[0]], part.b.tokens[u.b[0]]) for u in shared] == [("sun", "sun")]
    note = part.alignment.note(part.a.tokens, part.b.tokens)
    assert note.endswith(": only in A: ##flower ##s; only in B: flowers")
    assert np.isfinite(part.divergence).all() and (part.divergence > 0).any()


def test_real_texts_of_different_lengths_align_and_divergence_is_symmetric(bundled):
    a, b = _attentions(bundled, "The cat sat on the mat.", "The cat sat quietly on the old mat.")
    forward, backward = compare_pair(a, b), compare_pair(b, a)
    assert len(a.tokens) != len(b.tokens)
    assert (forward.divergence == backward.divergence).all()
    assert [b.tokens[i] for i in forward.alignment.unaligned_b] == ["quietly", "old"]
    assert forward.alignment.unaligned_a == ()
    assert (forward.divergence > 0).any()


def test_pairs_average_their_divergences(bundled):
    texts = [PAIR, ("He said that he was tired.", "She said that she was tired.")]
    found = compare_pairs([tuple(_attentions(bundled, *pair)) for pair in texts])
    assert len(found.pairs) == 2
    mean = (found.pairs[0].divergence + found.pairs[1].divergence) / 2
    assert np.allclose(found.divergence, mean)
    alone = compare_pair(*_attentions(bundled, *texts[1]))
    assert (alone.divergence == found.pairs[1].divergence).all()


def test_cli_json_equals_the_api():
    result = invoke("compare", *PAIR, "--json", "--no-images")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    api = attnviz.compare(*PAIR)
    assert data["divergence"] == api.divergence.tolist()
    assert np.array(data["divergence"]).shape == (6, 12)
    assert data["special_share_change"] == api.special_change.round(8).tolist()
    assert data["pairs"][0]["alignment"] == api.alignment.as_dict(api.a.tokens, api.b.tokens)
    assert "nats" in data["averaged"] and data["unit"] == "nats"
    top = max((v, layer, head) for layer, row in enumerate(data["divergence"])
              for head, v in enumerate(row))  # fmt: skip
    assert (data["moved"][0]["layer"], data["moved"][0]["head"]) == (top[1], top[2])


def test_cli_writes_the_overview_and_the_moved_heads(tmp_path):
    result = invoke("compare", *PAIR, "--out", tmp_path, "--top", 2, "--query", "are")
    assert result.exit_code == 0, result.output
    (folder,) = tmp_path.iterdir()
    names = sorted(p.name for p in folder.glob("*.png"))
    assert len(names) == 3 and "divergence.png" in names
    assert all(n == "divergence.png" or n.endswith("-compare.png") for n in names)
    assert "How far each head moved" in result.output
    assert "Heads that moved most" in result.output
    assert "Where “are→is” looks" in result.output
    again = invoke("compare", *PAIR, "--out", tmp_path, "--top", 1)
    assert again.exit_code == 0
    assert len(list(folder.glob("*.png"))) == 2  # the folder holds only its last run


def test_pairs_file_gives_the_mean_over_its_lines(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\t".join(PAIR) + "\n\nHe is here.\tShe is here.\n", encoding="utf-8")
    result = invoke("compare", "-f", pairs, "--json", "--no-images")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["n_pairs"] == 2
    one = [attnviz.compare(a, b).divergence for a, b in (PAIR, ("He is here.", "She is here."))]
    assert np.allclose(data["divergence"], (one[0] + one[1]) / 2)


def test_query_over_a_pairs_file_is_the_mean_over_the_pairs_that_have_it(tmp_path):
    from attnviz.analysis.compare import query_moves
    from attnviz.analysis.query import find_query

    texts = [("The king said that he was tired.", "The queen said that she was tired."),
             ("The door is open.", "The door is not open."),
             ("The boy said that he was late.", "The girl said that she was late.")]  # fmt: skip
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in texts), encoding="utf-8")
    result = invoke("compare", "-f", pairs, "--query", "he", "--json", "--no-images")
    assert result.exit_code == 0, result.output
    asked = json.loads(result.stdout)["query"]
    assert asked["pairs_counted"] == [1, 3] and asked["pairs_left_out"] == [2]
    found = attnviz.compare(texts)  # the same passes: the same padded batch
    alone = [query_moves(found.pairs[n], find_query(found.pairs[n].a, "he")) for n in (0, 2)]
    mean = (alone[0].divergence + alone[1].divergence) / 2
    assert np.allclose(asked["divergence"], mean, atol=1e-12)
    assert not np.allclose(alone[0].divergence, alone[1].divergence)  # a mean of two things
    for entry in asked["heads"]:  # each head's keys from the pair where its row moved most
        first, second = (q.divergence[entry["layer"], entry["head"]] for q in alone)
        expected = alone[0] if first >= second else alone[1]
        assert entry["pair"] == (1 if first >= second else 3)
        key = (entry["layer"], entry["head"])
        assert entry["top_b"] == [t.__dict__ for t in expected.top_b[key]]
    shown = invoke("compare", "-f", pairs, "--query", "he", "--no-images", "--top", 3)
    words = " ".join(shown.output.split())
    assert "mean over the 2 pairs whose A has it" in words and "in pairs 2: left out" in words
    nowhere = invoke("compare", "-f", pairs, "--query", "zebra", "--no-images")
    assert nowhere.exit_code == 2 and "no pair's text A has 'zebra'" in nowhere.output
    assert "Traceback" not in nowhere.output


def test_terminal_map_renders_every_head():
    from rich.console import Console

    from attnviz.outputs.terminal import print_divergence_map

    console = Console(width=100, file=io.StringIO(), color_system=None)
    found = attnviz.compare(*PAIR)
    print_divergence_map(console, found.divergence, found.layers)
    shown = console.file.getvalue()
    assert all(f"L{layer}" in shown for layer in range(6)) and "H11" in shown
    assert f"{found.divergence.max():.3f}".replace("0.", ".", 1) in shown


def test_difference_figure_centres_its_diverging_map_on_zero():
    from attnviz.outputs.figures import DIFFERENCE_LABEL, Style, difference_figure

    rng = np.random.default_rng(2)
    a, b = rng.dirichlet(np.ones(4), size=4), rng.dirichlet(np.ones(4), size=4)
    fig = difference_figure(a, b, ["w", "x", "y", "z"], "t", Style())
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 3
    low, high = images[2].get_clim()
    assert low == -high and high == pytest.approx(float(abs(b - a).max()))
    assert images[2].cmap.name.startswith("RdBu")
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert DIFFERENCE_LABEL in labels


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["only one"], "give two texts"),
        (["", "B"], "text A is empty"),
        (["A text.", "  "], "text B is empty"),
        (
            ["a", "b", "--measure", "rollout"],
            "--measure rollout is not available in attnviz compare",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(args, message, tmp_path):
    out = tmp_path / "out"
    result = invoke("compare", *args, "--out", out)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("A line.\tB line.\njust one text\n", "pairs.tsv, line 2: no TAB between two texts"),
        ("A line.\t \n", "line 1: no TAB between two texts (or one side is empty)"),
        ("A line.\tB\tC\n", "line 1: 2 TABs"),
    ],
)
def test_bad_pairs_file_is_refused_with_its_line(content, message, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    result = invoke("compare", "-f", pairs, "--out", out)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


def test_models_with_different_tokenizers_need_words(tiny_model_dirs, tmp_path):
    out = tmp_path / "out"
    bert, llama = str(tiny_model_dirs["bert"]), str(tiny_model_dirs["llama"])
    text = "the cat sat on the mat"
    result = invoke("compare", text, "-m", bert, "--against-model", llama, "--out", out,
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "different tokenizers" in result.output and "--words" in result.output
    assert len(result.output.strip().splitlines()) <= 2
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))
    by_words = invoke("compare", text, "-m", bert, "--against-model", llama, "--words",
                      "--json", "--no-images", "--device", "cpu")  # fmt: skip
    assert by_words.exit_code == 0, by_words.output
    data = json.loads(by_words.stdout)
    alignment = data["pairs"][0]["alignment"]
    assert data["view"] == "word"
    labels = [unit["label"] for unit in alignment["units"]]
    assert labels[1:] == text.split()  # every word aligned; [CLS] put for the decoder's BOS
    assert alignment["unaligned_a"] == ["[SEP]"] and alignment["unaligned_b"] == []  # said


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_show_ablate_gives_the_divergence_of_the_kept_heads(arch, tiny_model_dirs):
    text = "the cat sat on the mat and the dog sat on the log"
    result = invoke("show", text, "-m", tiny_model_dirs[arch], "--ablate", "0.1", "--json",
                    "--no-images", "--device", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.output
    divergence = json.loads(result.stdout)["ablation"]["divergence"]
    assert divergence[0][1] is None  # the removed head
    assert all(v == 0 for h, v in enumerate(divergence[0]) if h != 1)  # its layer reads as before
    assert all(v > 0 for v in divergence[1])  # the layer above reads another input
    shown = invoke("show", text, "-m", tiny_model_dirs[arch], "--ablate", "0.1", "--no-images",
                   "--device", "cpu")  # fmt: skip
    words = " ".join(shown.output.split())
    assert "How far each kept head moved" in words and "×" in words
    assert "e-0" in words  # a tiny model's small divergences are not all shown as .000


def test_two_models_with_importance_tell_moved_from_matters(tiny_model_dirs, tmp_path):
    changed = perturbed_copy(tiny_model_dirs["llama"], tmp_path / "changed", layer=1, head=2)
    text = "the cat sat on the mat and the dog sat on the log"
    args = ["compare", text, "-m", tiny_model_dirs["llama"], "--against-model", changed,
            "--importance", "--device", "cpu"]  # fmt: skip
    result = invoke(*args, "--json", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    found = data["importance"]
    a, b = np.array(found["a"]["scores"]), np.array(found["b"]["scores"])
    assert a.shape == b.shape == (2, 4) and np.isfinite(a).all()
    assert np.allclose(found["change"], b - a)
    assert found["a"]["objective"] == "next-token" and found["clean_change"] != 0
    names = {p.split("/")[-1] for p in data["images"]}
    assert {"importance-a.png", "importance-b.png", "moved-or-matters.png"} <= names
    assert [(m["layer"], m["head"]) for m in data["moved"]] == [(1, 2)]  # only it moved
    shown = invoke(*args, "--no-images")
    assert "Moved or matters" in shown.output and "rank A" in shown.output


def test_norm_measure_is_compared_as_shares():
    same = attnviz.compare(PAIR[0], PAIR[0], measure="norm")
    assert same.a.measure == "norm" and (same.divergence == 0).all()
    by_norm, by_weight = attnviz.compare(*PAIR, measure="norm"), attnviz.compare(*PAIR)
    assert np.isfinite(by_norm.divergence).all() and (by_norm.divergence >= 0).all()
    assert (by_norm.divergence <= math.log(2)).all()
    assert not np.allclose(by_norm.divergence, by_weight.divergence)
