"""Reading what the user gives: one text (an argument or stdin) or many sentences (arguments,
a file with one sentence per line, or stdin); for an encoder-decoder model, each line a
`source<TAB>target` pair (`split_pairs`).

A file name given where a sentence is expected is refused with a hint, never analysed as text.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.core.attention import require_text, require_unicode
from attnviz.errors import InputError

STDIN = "-"


@dataclass(frozen=True)
class Sentence:
    """One input sentence: its position among the sentences and its line in the input."""

    index: int
    line: int
    text: str  # an encoder-decoder model's source
    target: str | None = None  # an encoder-decoder model's target (a `source<TAB>target` line)
    # a question about a picture (`core.questions`): the picture, resolved and as given
    picture: Path | None = None
    given: str | None = None


@dataclass(frozen=True)
class Sentences:
    """The sentences read from the input, and how many blank lines were skipped."""

    items: tuple[Sentence, ...]
    blank: int
    origin: str  # where they were read: a file's path, "stdin" or "arguments"


def _names_a_file(argument: str) -> bool:
    """Whether `argument` names a file (one line: a picture's, which `show`, `check`,
    `export`, `compare` and `report` read, their `*_input` before this)."""
    if "\n" in argument or len(argument) > 4096:
        return False
    try:
        found = Path(argument).expanduser().is_file()
    except OSError:
        return False
    from attnviz.core.images import SUFFIXES

    if found and Path(argument).suffix.lower() in SUFFIXES:
        raise InputError(
            f"'{argument}' is a picture: `attnviz show {argument} -m MODEL` (or `check`) reads "
            "one with a vision model, `export`, `compare` and `report` many (docs/vision.md); "
            "this command reads text"
        )
    return found


def _decode(raw: bytes, source: str, line: int | None = None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"{source}, line {line}" if line is not None else source
        raise InputError(
            f"{where}: not valid UTF-8 (byte {exc.start + 1}); save the file as UTF-8"
        ) from None


def read_text(argument: str) -> str:
    """The one text of `show`/`check`: the argument itself, or all of stdin for '-'."""
    if argument == STDIN:
        return _decode(sys.stdin.buffer.read(), "stdin").strip()
    if _names_a_file(argument):
        raise InputError(
            f"'{argument}' is a file name, not a text; to read the file, use: - < {argument}"
        )
    return argument


def read_sentences(file: str | None, texts: list[str] | None) -> Sentences:
    """Sentences from a file (one per line; '-' is stdin) or from the command line."""
    if texts and file:
        raise InputError("give sentences as arguments or --file, not both")
    if texts:
        for number, text in enumerate(texts, start=1):
            require_unicode(text, f"sentence {number} of the arguments")
            if _names_a_file(text):
                raise InputError(
                    f"'{text}' is a file name, not a sentence; to read one sentence per line "
                    f"from it, use -f {text}"
                )
        raw_lines = [t.encode("utf-8") for t in texts]
        source = "arguments"
    elif file == STDIN:
        raw_lines = sys.stdin.buffer.read().splitlines()
        source = "stdin"
    elif file:
        path = Path(file)
        if path.is_dir():
            raise InputError(f"{file} is a folder; give a text file with one sentence per line")
        if not path.exists():
            raise InputError(f"no such file: {file}")
        raw_lines = path.read_bytes().splitlines()
        source = file
    else:
        raise InputError("give sentences as arguments, or --file FILE (one sentence per line)")

    items, blank = [], 0
    for number, raw in enumerate(raw_lines, start=1):
        text = _decode(raw, source, number)
        if not text.strip():
            blank += 1
            continue
        items.append(Sentence(len(items) + 1, number, text.strip()))
    if not items:
        raise InputError(f"{source} has no sentences ({blank} blank lines)")
    return Sentences(tuple(items), blank, source)


def split_pairs(sentences: Sentences) -> Sentences:
    """The same lines read as `source<TAB>target` pairs, for an encoder-decoder model.

    A line without exactly one TAB, or with nothing on one side of it, is refused with its
    line number: a pair cut in the wrong place would be analysed without a word of warning.
    """
    items = []
    for sentence in sentences.items:
        where = f"{sentences.origin}, line {sentence.line}"
        parts = sentence.text.split("\t")
        if len(parts) != 2:
            found = "no TAB between two texts" if len(parts) == 1 else f"{len(parts) - 1} TABs"
            raise InputError(
                f"{where}: {found}; an encoder-decoder model reads one source<TAB>target "
                "pair a line"
            )
        source, target = (part.strip() for part in parts)
        for side, text in (("source", source), ("target", target)):
            if not text:
                raise InputError(f"{where}: the {side} is empty; give source<TAB>target")
        items.append(Sentence(sentence.index, sentence.line, source, target))
    return Sentences(tuple(items), sentences.blank, sentences.origin)


def split_compare_pairs(sentences: Sentences, one_text: bool = False) -> list[tuple[str, str]]:
    """The lines of a `compare -f` file as `text A<TAB>text B` pairs. With `one_text` (two
    models), a line without a TAB is one text both models read. A line with no TAB (else),
    more than one, or an empty side is refused with its line number."""
    pairs = []
    for sentence in sentences.items:
        where = f"{sentences.origin}, line {sentence.line}"
        parts = sentence.text.split("\t")
        if len(parts) == 1 and one_text:
            parts = [parts[0], parts[0]]
        if len(parts) != 2:
            # lines are read stripped: a side left empty at either end leaves no TAB
            found = (
                "no TAB between two texts (or one side is empty)"
                if len(parts) == 1
                else f"{len(parts) - 1} TABs"
            )
            raise InputError(f"{where}: {found}; give one pair a line: text A<TAB>text B")
        a, b = (part.strip() for part in parts)
        for side, text in (("A", a), ("B", b)):
            if not text:
                raise InputError(f"{where}: text {side} is empty; give text A<TAB>text B")
        pairs.append((a, b))
    return pairs


def compare_pairs_of(
    text_a: str | None, text_b: str | None, file: str | None, against_model: bool
) -> list[tuple[str, str]]:
    """What `compare` reads, from its arguments: two texts, one text read by two models
    (`against_model`), or a file of pairs (`split_compare_pairs`); "-" reads stdin."""
    if file is not None:
        if text_a is not None:
            raise InputError("give two texts or --file, not both")
        return split_compare_pairs(read_sentences(file, None), against_model)
    if text_a is None or (text_b is None and not against_model):
        raise InputError('give two texts (compare "A" "B"), one text and --against-model MODEL, '
                         "or --file PAIRS.tsv")  # fmt: skip
    first = read_text(text_a)
    return [(first, read_text(text_b) if text_b is not None else first)]


def compare_input(
    text_a: str | None, text_b: str | None, file: str | None, against_model: bool
) -> tuple[list[tuple[str, str]], Any]:
    """What `compare` reads: (pairs of texts, None) as `compare_pairs_of` reads them, or
    (`picture_pair`) a pair of picture files and the `core.images.Pictures`."""
    found = picture_pair(text_a, text_b, against_model) if file is None else None
    if found is None:
        return compare_pairs_of(text_a, text_b, file, against_model), None
    return found


PAIR_USAGE = ('compare a.png b.png "What is on the table?" (two pictures, one question) or '
              'compare a.png "What is on it?" "What colour is it?" (one picture, two '
              "questions)")  # fmt: skip


def question_pair(first: str | None, second: str | None, third: str | None,
                  file: str | None = None) -> Any:  # fmt: skip
    """The pictures and questions (`core.questions.QuestionPair`) `compare`'s three arguments
    give: two picture files then a question, or one picture file then two questions (a
    question - : stdin); None where there is no third argument (two texts or two pictures,
    `compare_input`, or `file`, a file of pairs)."""
    from attnviz.core.images import picture_argument
    from attnviz.core.questions import QuestionPair

    if third is None:
        return None
    if file is not None:
        raise InputError(f"give a file of pairs (--file) or three arguments, not both: "
                         f"{PAIR_USAGE}")  # fmt: skip
    given = [first, second, third]
    if any(argument is None for argument in given):
        raise InputError(f"give three arguments: {PAIR_USAGE}")
    pictures = [picture_argument(argument) for argument in given]  # type: ignore[arg-type]
    if pictures[0] is None or pictures[2] is not None:
        raise InputError(f"a picture comes first and a question last: {PAIR_USAGE}")
    if pictures[1] is not None:  # two pictures, one question
        prompt = read_text(third)
        require_text(prompt, "the question")
        return QuestionPair((pictures[0], pictures[1]), (prompt, prompt))
    prompts = (read_text(second), read_text(third))  # type: ignore[arg-type]
    for side, prompt in zip("AB", prompts):
        require_text(prompt, f"question {side}")
    return QuestionPair((pictures[0], pictures[0]), prompts)


def questions_about(a: Any, b: str | None, picture: Any) -> Any:
    """The API's pictures and questions (`core.questions.QuestionPair`): `picture` one path
    and `a`, `b` two questions about it, or `picture` two paths and `a` the question about
    each."""
    from attnviz.core.questions import QuestionPair

    several = isinstance(picture, (list, tuple))
    paths = [Path(p) for p in (picture if several else [picture])]
    if len(paths) not in (1, 2) or not isinstance(a, str):
        raise InputError("give picture=PATH and two questions, or picture=(A, B) and one "
                         "question: compare(a, b, picture=...)")  # fmt: skip
    for path in paths:
        if not path.is_file():
            raise InputError(f"no picture at {path}: no such file")
    if len(paths) == 2:
        if b is not None:
            raise InputError("two pictures take one question: compare(question, "
                             "picture=(a, b)), not two")  # fmt: skip
        require_text(a, "the question")
        return QuestionPair((paths[0], paths[1]), (a, a))
    if b is None:
        raise InputError("one picture takes two questions: compare(question_a, question_b, "
                         "picture=path), or give picture=(a, b)")  # fmt: skip
    require_text(a, "question A")
    require_text(b, "question B")
    return QuestionPair((paths[0], paths[0]), (a, b))


def picture_pair(
    text_a: str | None, text_b: str | None, against_model: bool
) -> tuple[list[tuple[str, str]], Any] | None:
    """Where the two arguments of a comparison (one, with `against_model`) are picture files:
    that pair of paths and the `core.images.Pictures`; None where they are texts."""
    from attnviz.core.images import pictures_in

    given = [text for text in (text_a, text_b) if text is not None]
    pictures = pictures_in(given) if given else None
    if pictures is None:
        return None
    if any(path.is_dir() for path in map(Path, given)):
        raise InputError("compare reads two picture files, not folders")
    if len(given) == 1 and not against_model:
        raise InputError("give two pictures (compare A.png B.png), or one and --against-model")
    first = str(pictures.paths[0])
    return [(first, str(pictures.paths[-1]) if len(given) == 2 else first)], pictures


def export_input(file: str | None, texts: list[str] | None) -> tuple[Sentences, Any]:
    """What `export` reads: (sentences, None), or where the arguments name picture files and
    folders, the pictures as `Sentences` (each picture's path its text, so that its folder,
    manifest row and resumption are a sentence's) and the `core.images.Pictures`."""
    from attnviz.core.images import pictures_in

    pictures = pictures_in(texts or [])
    if pictures is None:
        return read_sentences(file, texts), None
    if file is not None:
        raise InputError("give pictures (files, folders) or --file, not both")
    items = tuple(Sentence(i, i, str(path)) for i, path in enumerate(pictures.paths, start=1))
    return Sentences(items, 0, "pictures"), pictures


def export_questions(file: str | None, texts: list[str] | None) -> tuple[Sentences, Any] | None:
    """Where `export`'s arguments name a JSONL file of pictures and questions
    (`core.questions`): the questions as sentences, each prompt its text, its picture and
    target beside it (so that its folder, manifest row and resumption are a sentence's), and
    the `Questions`; None where they give something else."""
    from attnviz.core.questions import questions_in

    questions = questions_in(texts, file)
    if questions is None:
        return None
    items = tuple(Sentence(q.index, q.line, q.prompt, q.target, q.picture, q.given)
                  for q in questions.items)  # fmt: skip
    return Sentences(items, 0, questions.origin), questions


def report_input(sentences: list[str] | None, file: str | None, treebank: str | None) -> Any:
    """What `report` reads, from its arguments: (corpus, None, None), the texts of
    `report_corpus`; (None, pictures, None) where the arguments name picture files and folders
    (`core.images.Pictures`; --treebank with them is refused by name with the other options a
    picture cannot take); or (None, None, questions) where they name a JSONL file of pictures
    and questions (`core.questions`)."""
    from attnviz.core.images import pictures_in
    from attnviz.core.questions import questions_in

    questions = questions_in(sentences, file)
    if questions is not None:
        return None, None, questions
    pictures = pictures_in(sentences or [])
    if pictures is None:
        return report_corpus(sentences, file, treebank), None, None
    if file is not None:
        raise InputError("give pictures (files, folders) or --file, not both")
    return None, pictures, None


def report_corpus(sentences: list[str] | None, file: str | None, treebank: str | None) -> Any:
    """What `report` reads, from its arguments: a CoNLL-U treebank, sentences or a file of
    them, or (none given) the corpus that comes with attnviz."""
    from attnviz.data import CORPUS, CORPUS_NAME

    if treebank is not None:
        if sentences or file:
            raise InputError("give --treebank or sentences/--file, not both")
        from attnviz.core.treebank import read_treebank

        return read_treebank(treebank)
    if not sentences and not file:
        if not CORPUS.is_file():
            raise InputError(f"the default corpus {CORPUS_NAME} is missing from this "
                             f"installation ({CORPUS}); give sentences or --file")  # fmt: skip
        file = str(CORPUS)
    return read_sentences(file, sentences)
