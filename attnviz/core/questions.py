"""Pictures and questions about them, for a vision-language model's `report`, `export` and
`compare`: a JSONL file, one JSON object a line, `{"picture": PATH, "prompt": TEXT}` with an
optional `"target"` (a continuation given, read by teacher forcing). A picture's path is
relative to the JSONL file's folder.

Every line is read and checked before any model loads: a line that is not a JSON object, a
key missing, unknown or not text, or a picture that is not there is refused in one line
naming its line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnviz.core.attention import require_text
from attnviz.errors import InputError

SUFFIX = ".jsonl"
KEYS = ("picture", "prompt", "target")  # "target" may be left out


@dataclass(frozen=True)
class Question:
    """One line of the file: a picture, a prompt about it and the continuation given, if any."""

    index: int  # 1, 2, … among the questions
    line: int  # its line in the file
    picture: Path  # resolved: relative paths from the file's folder
    given: str  # the picture's path as the file gives it
    prompt: str
    target: str | None = None


@dataclass(frozen=True)
class Questions:
    """Every question of the file, in its order, and where it was read."""

    items: tuple[Question, ...]
    origin: str  # the file's path as given

    def by_picture(self) -> list[list[Question]]:
        """The questions grouped by their picture (its resolved path), in the order each
        picture first appears; within a picture, in the file's order."""
        groups: dict[Path, list[Question]] = {}
        for question in self.items:
            groups.setdefault(question.picture, []).append(question)
        return list(groups.values())


def names_questions(argument: str | None) -> bool:
    """Whether `argument` names a JSONL file of pictures and questions."""
    return argument is not None and argument.lower().endswith(SUFFIX) and Path(argument).is_file()


def questions_in(texts: list[str] | None, file: str | None) -> Questions | None:
    """The questions a command's arguments give: a JSONL file named alone or by --file;
    None where they give something else (sentences, pictures)."""
    named = [text for text in texts or [] if names_questions(text)]
    if file is not None and names_questions(file):
        if texts:
            raise InputError("give a file of pictures and questions or sentences, not both")
        return read_questions(file)
    if not named:
        return None
    if len(texts or []) > 1:
        raise InputError(f"give one file of pictures and questions ({named[0]}) alone: one "
                         "JSON object a line holds every picture and prompt")  # fmt: skip
    return read_questions(named[0])


def read_questions(file: str) -> Questions:
    """The questions of the JSONL file `file` (see the module's docstring)."""
    path = Path(file)
    if not path.is_file():
        raise InputError(f"no such file: {file}")
    folder = path.resolve().parent
    items: list[Question] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        where = f"{file}, line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: not valid UTF-8 (byte {exc.start + 1})") from None
        if not text.strip():
            continue
        items.append(_question(text, where, len(items) + 1, number, folder))
    if not items:
        raise InputError(f"{file} holds no question: give one JSON object a line, "
                         '{"picture": "photo.png", "prompt": "What is on the table?"}')  # fmt: skip
    return Questions(tuple(items), file)


def _question(text: str, where: str, index: int, line: int, folder: Path) -> Question:
    """One line as a Question, or one line saying what is wrong with it."""
    try:
        found = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON ({exc.msg}, column {exc.colno}); give one object "
                         'a line, {"picture": "photo.png", "prompt": "…"}') from None  # fmt: skip
    if not isinstance(found, dict):
        raise InputError(f'{where}: a JSON object is expected, {{"picture": …, "prompt": …}}')
    unknown = sorted(set(found) - set(KEYS))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(KEYS)}")
    for key in KEYS:
        value = found.get(key)
        if key != "target" and value is None:
            raise InputError(f'{where}: no "{key}"; give {{"picture": PATH, "prompt": TEXT}}')
        if value is not None and not isinstance(value, str):
            raise InputError(f'{where}: "{key}" must be text, not {type(value).__name__}')
    try:
        require_text(found["prompt"], "the prompt")
        if found.get("target") is not None:
            require_text(found["target"], "the target")
    except InputError as error:
        raise InputError(f"{where}: {error}") from None
    picture = (folder / Path(found["picture"]).expanduser()).resolve()
    if not picture.is_file():
        raise InputError(f"{where}: no picture {found['picture']} (paths are read from the "
                         f"file's folder, {folder})")  # fmt: skip
    return Question(index, line, picture, found["picture"], found["prompt"], found.get("target"))


@dataclass(frozen=True)
class QuestionPair:
    """What `compare` reads through a vision-language model: two pictures with one question,
    or one picture with two questions; A's and B's picture and prompt."""

    pictures: tuple[Path, Path]  # the same path twice for one picture
    prompts: tuple[str, str]  # the same prompt twice for one question

    @property
    def two_pictures(self) -> bool:
        """Two pictures, one question (else one picture, two questions)."""
        return self.pictures[0] != self.pictures[1]

    def sides(self) -> tuple[tuple[Path, str], tuple[Path, str]]:
        """A's and B's (picture, prompt)."""
        return (self.pictures[0], self.prompts[0]), (self.pictures[1], self.prompts[1])
