"""Reading annotated text: CoNLL-U sentences with their dependency arcs and CorefUD mentions.

Words come from the FORM column; multiword-token ranges (`3-4`) and empty nodes (`8.1`) are
not words of the text and are skipped. Syntax is HEAD and the universal part of DEPREL (before
`:`); a file whose HEAD column is `_` has none. Coreference is CorefUD's `Entity=` in MISC:
`(e1-person-1)` a one-word mention, `(e2-…` opens and `e2)` closes a longer one, brackets
nest; `# global.Entity = eid-etype-head-other` names the fields, and `head` is the mention's
head word, 1-based within the mention. The `conllu` package parses the values; this module
keeps line numbers so that every error names its line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.errors import InputError

COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")
DEFAULT_ENTITY_FIELDS = ("eid", "etype", "head", "other")
# One Entity chunk: `(e1-person-1)` one word, `(e2-place-2` opening, `e2)` closing.
_CHUNK = re.compile(r"\([^()]+\)?|[^()]+\)")
_DISCONTINUOUS = re.compile(r"\[\d+/\d+\]$")


@dataclass(frozen=True)
class Mention:
    """One mention of an entity: words start…end (0-based, inclusive) and its head word."""

    entity: str
    start: int
    end: int
    head: int


@dataclass(frozen=True)
class TreebankSentence:
    """One sentence: its words, each word's syntactic head and relation, and its mentions.

    `heads[i]` is the 0-based index of word i's head, -1 for the root; `heads` and
    `relations` are None where the sentence has no syntax.
    """

    line: int  # line of its first word in the file
    text: str
    words: tuple[str, ...]
    space_after: tuple[bool, ...]
    heads: tuple[int, ...] | None
    relations: tuple[str, ...] | None
    mentions: tuple[Mention, ...] = ()


@dataclass(frozen=True)
class Treebank:
    """The sentences of one CoNLL-U file, whether it has syntax and coreference, and notes."""

    items: tuple[TreebankSentence, ...]  # named as `inputs.Sentences.items`
    origin: str  # the file's path, or "stdin" (as `inputs.Sentences.origin`)
    has_syntax: bool
    has_coreference: bool
    notes: tuple[str, ...]


@dataclass
class _Open:
    """A mention opened and not yet closed."""

    entity: str
    line: int
    sentence: int
    start: int | None  # None: opened on an empty node
    head_field: int | None


@dataclass
class _Reader:
    """State while reading a file line by line (sentence by sentence)."""

    source: str
    entity_fields: tuple[str, ...] = DEFAULT_ENTITY_FIELDS
    saw_entity_header: bool = False
    saw_entities: bool = False
    sentences: list[TreebankSentence] = field(default_factory=list)
    open: dict[str, list[_Open]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    # the sentence being read
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    text: str | None = None
    pending: list[tuple[str, int, int, int | None]] = field(default_factory=list)

    def fail(self, line: int, message: str) -> InputError:
        return InputError(f"{self.source}, line {line}: {message}")

    def count(self, what: str) -> None:
        self.skipped[what] = self.skipped.get(what, 0) + 1


def read_treebank(path: str) -> Treebank:
    """Read a CoNLL-U file ('-' reads stdin); malformed lines raise InputError naming the line."""
    if path == "-":
        raw, source = sys.stdin.buffer.read(), "stdin"
    else:
        file = Path(path)
        if file.is_dir():
            raise InputError(f"{path} is a folder; give a CoNLL-U file (.conllu)")
        if not file.exists():
            raise InputError(f"no such file: {path}")
        raw, source = file.read_bytes(), path
    return parse_treebank(raw, source)


def parse_treebank(raw: bytes, source: str = "treebank") -> Treebank:
    """Parse CoNLL-U bytes into sentences; see the module docstring for what is read."""
    from conllu.parser import parse_comment_line

    reader = _Reader(source)
    for number, line_bytes in enumerate(raw.splitlines(), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise reader.fail(
                number, f"not valid UTF-8 (byte {exc.start + 1}); save the file as UTF-8"
            ) from None
        if not line.strip():
            _finish_sentence(reader)
        elif line.startswith("#"):
            key, value = (parse_comment_line(line) or [("", None)])[0]
            if key == "text" and value is not None:
                reader.text = value
            elif key == "global.Entity" and value:
                reader.entity_fields = tuple(value.split("-"))
                reader.saw_entity_header = True
            elif key == "newdoc":
                _close_document(reader)
        else:
            reader.rows.append((number, line.split("\t")))
    _finish_sentence(reader)
    _close_document(reader)
    if not reader.sentences:
        raise InputError(f"{source} has no sentences: is it a CoNLL-U file?")
    has_syntax = any(s.heads is not None for s in reader.sentences)
    notes = []
    if not has_syntax:
        notes.append(f"{source} has no syntax (its HEAD column is _): no syntax measurement")
    if not reader.saw_entities:
        notes.append(
            f"{source} has no coreference (no Entity= in MISC): no coreference measurement"
        )
    elif not reader.saw_entity_header:
        notes.append(
            "no '# global.Entity' header: Entity fields read as " + "-".join(DEFAULT_ENTITY_FIELDS)
        )
    notes += [f"{n} {what} skipped" for what, n in reader.skipped.items()]
    return Treebank(tuple(reader.sentences), source, has_syntax, reader.saw_entities, tuple(notes))


def _finish_sentence(reader: _Reader) -> None:
    """Turn the rows read since the last blank line into a sentence."""
    from conllu.exceptions import ParseException
    from conllu.parser import parse_dict_value, parse_id_value, parse_int_value

    rows, text = reader.rows, reader.text
    reader.rows, reader.text = [], None
    if not rows:
        return
    words: list[str] = []
    space_after: list[bool] = []
    heads: list[tuple[int, int | None]] = []  # (line, HEAD)
    relations: list[str] = []
    index = len(reader.sentences)
    for number, cols in rows:
        if len(cols) != len(COLUMNS):
            raise reader.fail(
                number,
                f"expected {len(COLUMNS)} tab-separated columns ({' '.join(COLUMNS)}), found "
                f"{len(cols)}; is this a CoNLL-U file?",
            )
        try:
            word_id = parse_id_value(cols[0])
            head = parse_int_value(cols[6])
            misc = parse_dict_value(cols[9]) or {}
        except (ParseException, IndexError) as exc:
            raise reader.fail(number, str(exc)) from None
        if isinstance(word_id, tuple) and word_id[1] == "-":
            continue  # a multiword token's surface form; its words follow
        empty_node = isinstance(word_id, tuple)
        if not empty_node:
            if not cols[1]:
                raise reader.fail(number, "FORM is empty")
            if word_id != len(words) + 1:
                raise reader.fail(
                    number, f"word ID {cols[0]} where {len(words) + 1} was expected (IDs count "
                    "1, 2, 3… within a sentence)"
                )  # fmt: skip
            words.append(cols[1])
            space_after.append(misc.get("SpaceAfter") != "No")
            heads.append((number, head))
            relations.append(cols[7].split(":")[0])
        if "Entity" in misc:
            reader.saw_entities = True
            _read_entities(reader, misc["Entity"] or "", number, index, len(words) - 1, empty_node)
    if not words:
        raise reader.fail(rows[0][0], "a sentence with no words (only ranges or empty nodes)")
    syntax = _check_heads(reader, heads, len(words))
    mentions = _closed_mentions(reader, index, syntax, [h for _, h in heads])
    reader.sentences.append(
        TreebankSentence(
            line=rows[0][0],
            text=text if text is not None else " ".join(words),
            words=tuple(words),
            space_after=tuple(space_after),
            heads=tuple(h - 1 for _, h in heads) if syntax else None,  # type: ignore[operator]
            relations=tuple(relations) if syntax else None,
            mentions=mentions,
        )
    )


def _check_heads(reader: _Reader, heads: list[tuple[int, int | None]], n_words: int) -> bool:
    """Refuse a sentence whose words have heads only in part, or a head that is not one of
    its words; whether it has syntax (every word a head)."""
    given = [h for _, h in heads if h is not None]
    if given and len(given) != len(heads):
        line = next(n for n, h in heads if h is None)
        raise reader.fail(line, "HEAD is _ while other words of this sentence have heads")
    for number, head in heads:
        if head is not None and not 0 <= head <= n_words:
            raise reader.fail(
                number, f"HEAD {head} is not a word of this sentence (it has {n_words} words)"
            )
    return bool(given)


def _read_entities(
    reader: _Reader, value: str, line: int, sentence: int, word: int, empty_node: bool
) -> None:
    """Apply one word's Entity= brackets: open, close or one-word mentions."""
    chunks = _CHUNK.findall(value)
    if "".join(chunks) != value:
        raise reader.fail(line, f"Entity={value} is not a sequence of CorefUD brackets")
    position = None if empty_node else word
    for chunk in chunks:
        if chunk.startswith("("):
            values = chunk.strip("()").split("-")
            attrs = dict(zip(reader.entity_fields, values))
            eid = attrs.get("eid")
            if not eid:
                raise reader.fail(line, f"Entity chunk {chunk} has no entity id")
            head_field = None
            if attrs.get("head"):
                try:
                    head_field = int(attrs["head"])
                except ValueError:
                    raise reader.fail(
                        line, f"Entity chunk {chunk}: head {attrs['head']!r} is not a number"
                    ) from None
            opened = _Open(eid, line, sentence, position, head_field)
            if chunk.endswith(")"):
                _close(reader, opened, line, sentence, position)
            else:
                reader.open.setdefault(eid, []).append(opened)
        else:
            eid = chunk[:-1]
            stack = reader.open.get(eid)
            if not stack:
                raise reader.fail(line, f"Entity mention {eid} is closed here but was never opened")
            _close(reader, stack.pop(), line, sentence, position)


def _close(reader: _Reader, opened: _Open, line: int, sentence: int, end: int | None) -> None:
    """A mention ends at word `end`: keep it for its sentence, or count why it is left out."""
    if _DISCONTINUOUS.search(opened.entity):
        reader.count("discontinuous mention part(s)")
        return
    if opened.start is None or end is None:
        reader.count("mention(s) on empty nodes")
        return
    if opened.sentence != sentence:
        reader.count("mention(s) crossing a sentence boundary")
        return
    length = end - opened.start + 1
    if opened.head_field is not None and not 1 <= opened.head_field <= length:
        raise reader.fail(
            opened.line,
            f"Entity mention {opened.entity}: head {opened.head_field} is outside the mention "
            f"({length} word{'s' if length > 1 else ''})",
        )
    reader.pending.append((opened.entity, opened.start, end, opened.head_field))


def _closed_mentions(
    reader: _Reader, sentence: int, syntax: bool, heads: list[int | None]
) -> tuple[Mention, ...]:
    """The mentions closed in this sentence, each with its head word.

    The head is the `head` field where the file gives one; otherwise the word whose syntactic
    head lies outside the mention (where the sentence has syntax), else the first word.
    """
    mentions = []
    for entity, start, end, head_field in reader.pending:
        if head_field is not None:
            head = start + head_field - 1
        elif syntax:
            inside = range(start, end + 1)
            head = next((w for w in inside if heads[w] - 1 not in inside), start)  # type: ignore[operator]
        else:
            head = start
        mentions.append(Mention(entity, start, end, head))
    reader.pending = []
    return tuple(sorted(mentions, key=lambda m: (m.start, -m.end, m.entity)))


def _close_document(reader: _Reader) -> None:
    """At a new document or the end of the file every mention must have been closed."""
    for stack in reader.open.values():
        if stack:
            opened = stack[0]
            raise reader.fail(
                opened.line, f"Entity mention {opened.entity} is opened here and never closed"
            )
    reader.open = {}
