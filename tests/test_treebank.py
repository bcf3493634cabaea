"""Reading CoNLL-U and CorefUD: words, arcs, mentions, and one-line errors naming the line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.core.treebank import Mention, parse_treebank
from attnviz.errors import InputError

runner = CliRunner()


def conllu(*sentences: list[str], header: tuple[str, ...] = ()) -> bytes:
    """CoNLL-U text from rows written with spaces between the 10 columns (tabs in the file)."""
    blocks = []
    for rows in sentences:
        blocks.append("\n".join(r if r.startswith("#") else "\t".join(r.split()) for r in rows))
    return ("\n".join(header) + "\n" + "\n\n".join(blocks) + "\n\n").encode()


# "The old man didn't leave." with a multiword token (4-5) and an empty node (5.1).
OLD_MAN = [
    "# text = The old man didn't leave.",
    "1 The the DET DT _ 3 det _ Entity=(e1-person-3",
    "2 old old ADJ JJ _ 3 amod _ _",
    "3 man man NOUN NN _ 6 nsubj:pass _ Entity=e1)",
    "4-5 didn't _ _ _ _ _ _ _ _",
    "4 did do AUX VBD _ 6 aux _ _",
    "5 n't not PART RB _ 6 advmod _ _",
    "5.1 _ _ _ _ _ _ _ _ Entity=(e9-person-1)",
    "6 leave leave VERB VB _ 0 root _ SpaceAfter=No",
    "7 . . PUNCT . _ 6 punct _ _",
]
# Nested mentions, a one-word mention closing its parent on the same word, pronouns.
FRIEND = [
    "# text = The friend of Mary said she liked him",
    "1 The _ _ _ _ 2 det _ Entity=(e2-person-2",
    "2 friend _ _ _ _ 5 nsubj _ _",
    "3 of _ _ _ _ 4 case _ _",
    "4 Mary _ _ _ _ 2 nmod _ Entity=(e3-person-1)e2)",
    "5 said _ _ _ _ 0 root _ _",
    "6 she _ _ _ _ 7 nsubj _ Entity=(e3-person-1)",
    "7 liked _ _ _ _ 5 ccomp _ _",
    "8 him _ _ _ _ 7 obj _ Entity=(e2-person-1)",
]
HEADER = ("# newdoc id = d1", "# global.Entity = eid-etype-head-other")


def test_words_arcs_ranges_and_empty_nodes():
    bank = parse_treebank(conllu(OLD_MAN, FRIEND, header=HEADER), "t.conllu")
    assert bank.has_syntax and bank.has_coreference and len(bank.items) == 2
    first = bank.items[0]
    assert first.words == ("The", "old", "man", "did", "n't", "leave", ".")  # no 4-5, no 5.1
    assert first.heads == (2, 2, 5, 5, 5, -1, 5)  # 0-based, -1 for the root
    assert first.relations == ("det", "amod", "nsubj", "aux", "advmod", "root", "punct")
    assert first.space_after == (True, True, True, True, True, False, True)
    assert first.text == "The old man didn't leave." and first.line == 4
    assert first.mentions == (Mention("e1", 0, 2, 2),)  # head field 3: "man"
    assert "1 mention(s) on empty nodes skipped" in bank.notes


def test_corefud_brackets_multiword_nested_and_single():
    bank = parse_treebank(conllu(FRIEND, header=HEADER))
    assert bank.items[0].mentions == (
        Mention("e2", 0, 3, 1),  # "The friend of Mary", head 2: "friend"
        Mention("e3", 3, 3, 3),  # "Mary", nested in it, closing it on the same word
        Mention("e3", 5, 5, 5),  # "she"
        Mention("e2", 7, 7, 7),  # "him"
    )


def test_mention_head_from_syntax_without_a_head_field():
    bank = parse_treebank(conllu(OLD_MAN, header=("# global.Entity = eid-etype",)))
    assert bank.items[0].mentions == (Mention("e1", 0, 2, 2),)  # "man": its head is outside


def test_no_syntax_and_no_coreference_are_said():
    no_heads = [r.replace(" 3 det ", " _ det ") for r in FRIEND]
    rows = [" ".join(r.split()[:6] + ["_", "_", "_", r.split()[-1]]) if r[0] != "#" else r
            for r in no_heads]  # fmt: skip
    bank = parse_treebank(conllu(rows, header=HEADER), "x")
    assert not bank.has_syntax and bank.items[0].heads is None
    assert any("no syntax" in note for note in bank.notes)
    plain = [r.rsplit(" ", 1)[0] + " _" if r[0] != "#" else r for r in OLD_MAN]
    bank = parse_treebank(conllu(plain), "y")
    assert bank.has_syntax and not bank.has_coreference
    assert any("no coreference" in note for note in bank.notes)


@pytest.mark.parametrize(
    ("row", "line", "message"),
    [
        ("1 The the DET DT _ 3 det _", 3, "expected 10 tab-separated columns"),
        ("x The the DET DT _ 3 det _ _", 3, "not a valid ID"),
        ("2 The the DET DT _ 3 det _ _", 3, "word ID 2 where 1 was expected"),
        ("1 The the DET DT _ 9 det _ _", 3, "HEAD 9 is not a word of this sentence"),
        ("1 The the DET DT _ 3 det _ Entity=e4)", 3, "closed here but was never opened"),
        ("1 The the DET DT _ 3 det _ Entity=(e4-person-1", 3, "never closed"),
        ("1 The the DET DT _ 3 det _ Entity=(e4-person-7)x", 3, "not a sequence of CorefUD"),
        ("1 The the DET DT _ _ det _ _", 3, "HEAD is _ while other words"),
    ],
)
def test_malformed_lines_name_their_line(row, line, message):
    rows = ["# text = The old man", row, "2 old old ADJ JJ _ 3 amod _ _",
            "3 man man NOUN NN _ 0 root _ _"]  # fmt: skip
    with pytest.raises(InputError) as caught:
        parse_treebank(conllu(rows, header=("# newdoc",)), "bad.conllu")
    assert f"bad.conllu, line {line}:" in str(caught.value) and message in str(caught.value)


def test_mention_head_outside_the_mention_names_the_opening_line():
    rows = ["1 a _ _ _ _ 2 det _ Entity=(e1-x-5", "2 b _ _ _ _ 0 root _ Entity=e1)"]
    with pytest.raises(InputError, match=r"line 2: Entity mention e1: head 5 is outside"):
        parse_treebank(conllu(rows), "m")


def test_not_utf8_and_not_conllu():
    with pytest.raises(InputError, match="line 2: not valid UTF-8"):
        parse_treebank(b"# text = x\n1\t\xff\n", "f")
    with pytest.raises(InputError, match="line 1: expected 10 tab-separated columns"):
        parse_treebank(b"Just a sentence of plain text.\n", "f")
    with pytest.raises(InputError, match="line 1: FORM is empty"):
        parse_treebank(b"1\t\t_\t_\t_\t_\t0\troot\t_\t_\n", "f")
    with pytest.raises(InputError, match="has no sentences"):
        parse_treebank(b"# only a comment\n\n", "f")


def test_cli_refuses_malformed_treebank_and_writes_nothing(tiny_model_dirs, tmp_path):
    bad = tmp_path / "bad.conllu"
    bad.write_bytes(conllu(["1 The the DET DT _ 3 det _ _", "2 cat cat NOUN NN _ 0 root _"]))
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["report", "--treebank", str(bad), "-m", str(tiny_model_dirs["bert"]), "-o", str(out)]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "line 3: expected 10 tab-separated columns" in " ".join(result.output.split())
    assert not out.exists()
    both = runner.invoke(app, ["report", "A sentence.", "--treebank", str(bad), "-o", str(out)])
    assert both.exit_code == 2 and "not both" in both.output


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_cli_reads_stdin_and_says_what_is_missing(tiny_model_dirs, tmp_path):
    plain = [
        [r.rsplit(" ", 1)[0] + " _" if r[0] != "#" else r for r in s] for s in (OLD_MAN, FRIEND)
    ]
    result = runner.invoke(
        app,
        ["report", "--treebank", "-", "-m", str(tiny_model_dirs["bert"]), "-o",
         str(tmp_path / "o"), "--min-count", "1"],
        input=conllu(*plain).decode(),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "stdin has no coreference (no Entity= in MISC)" in text
    assert "Syntax: the best head per relation" in text
    assert (tmp_path / "o" / "syntax.csv").is_file()
    assert not (tmp_path / "o" / "coreference.csv").exists()
    markdown = (tmp_path / "o" / "report.md").read_text()
    assert "## Syntax" in markdown and "Not measured: the treebank has no coreference" in markdown


@pytest.mark.slow  # seconds of end-to-end model and figure work
def test_cli_long_sentences_skipped_or_cut(tiny_model_dirs, tmp_path):
    long = ["# text = long"] + [f"{i} w{i} _ _ _ _ {i - 1} dep _ _" for i in range(1, 81)]
    source = tmp_path / "long.conllu"
    source.write_bytes(conllu(long, OLD_MAN))
    for arch in ("bert", "gpt2"):  # WordPiece with [CLS]/[SEP]; byte-level with no specials
        args = ["report", "--treebank", str(source), "-m", str(tiny_model_dirs[arch]),
                "--min-count", "1", "--json"]  # fmt: skip
        skipped = runner.invoke(app, [*args, "-o", str(tmp_path / f"s-{arch}")])
        assert skipped.exit_code == 0, skipped.output
        data = json.loads(skipped.stdout)
        assert (
            data["sentences"] == 1
            and "long.conllu, line 3: skipped, text is" in (data["skipped"][0])
        )  # the sentence's first word
        assert "dep" not in data["treebank"]["syntax"]["relations"]
        cut = runner.invoke(app, [*args, "--truncate", "-o", str(tmp_path / f"c-{arch}")])
        data = json.loads(cut.stdout)
        assert data["sentences"] == 2 and not data["skipped"]
        assert any("1 sentence(s) cut to the model's limit" in n for n in data["treebank"]["notes"])
        kept = data["treebank"]["syntax"]["relations"]["dep"]["n"]
        assert 5 < kept < 79  # the arcs inside the cut only
