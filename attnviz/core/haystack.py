"""A needle-in-a-haystack prompt (Kamradt 2023; Wu et al. 2024): a long text (the haystack)
cut to a number of tokens, one sentence (the needle) put in it at a depth, at a sentence
boundary, and a question whose answer is the needle, all in the model's chat template where
it has one; and where the needle's tokens are in the prompt.

The length asked is the whole prompt's, in tokens of the model: template, haystack, needle
and question. A haystack shorter than that is repeated (`Haystack.repeats` says how often).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.errors import InputError

# The needle and question of Kamradt's test, which Wu et al. use too.
NEEDLE = (
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a "
    "sunny day."
)
QUESTION = "What is the best thing to do in San Francisco?"
ASK = "{context}\n\nAnswer from the text above, in one sentence. {question}"
# Without a chat template (a base model), the prompt ends where the answer starts.
PLAIN = "{context}\n\n{question} Answer from the text above:"
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass(frozen=True)
class Haystack:
    """The haystack's text, where its sentences end, its name (the file or folder, or the
    bundled text's), and how many times over it was read to fill the longest length."""

    text: str
    name: str
    repeats: int = 1

    def sentence_ends(self) -> list[int]:
        """Character offsets at which a sentence ends (after its closing space), and 0."""
        return [0, *(m.end() for m in _SENTENCE_END.finditer(self.text)), len(self.text)]


def read_haystack(path: str | None) -> Haystack:
    """The haystack: a text file, a folder's .txt files in name order, or the bundled text
    (None); one line where none of them holds text."""
    from attnviz.data import HAYSTACK, HAYSTACK_NAME

    if path is None:
        return Haystack(HAYSTACK.read_text(encoding="utf-8"), HAYSTACK_NAME)
    given = Path(path).expanduser()
    if given.is_dir():
        files = sorted(p for p in given.iterdir() if p.suffix == ".txt" and p.is_file())
        if not files:
            raise InputError(f"--haystack {path}: the folder holds no .txt file")
    elif given.is_file():
        files = [given]
    else:
        raise InputError(f"--haystack {path}: no such file or folder")
    try:
        parts = [" ".join(f.read_text(encoding="utf-8").split()) for f in files]
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"--haystack {path}: cannot read it as UTF-8 text ({error})") from None
    text = " ".join(p for p in parts if p)
    if not text:
        raise InputError(f"--haystack {path}: it holds no text")
    return Haystack(text, str(path))


def parse_lengths(text: str) -> tuple[int, ...]:
    """ "1k,2k,4k" -> (1000, 2000, 4000): prompt lengths in tokens (k: thousands), sorted."""
    found = []
    for part in text.split(","):
        item = part.strip().lower()
        number = item[:-1] if item.endswith("k") else item
        try:
            value = float(number) * (1000 if item.endswith("k") else 1)
        except ValueError:
            raise InputError(f"--lengths '{part}': give token counts, e.g. 1k,2k,4k") from None
        if value < 1 or value != int(value):
            raise InputError(f"--lengths '{part}': a length is a whole number of tokens")
        found.append(int(value))
    return tuple(sorted(set(found)))


def depths(n: int) -> tuple[float, ...]:
    """`n` depths from 0 % (the needle first) to 100 % (last), evenly spaced; one: 50 %."""
    if n < 1:
        raise InputError(f"--depths {n}: give at least 1")
    if n == 1:
        return (50.0,)
    return tuple(round(100 * i / (n - 1), 3) for i in range(n))


@dataclass(frozen=True)
class NeedlePrompt:
    """One prompt: its token ids, the needle's tokens (positions start … stop − 1), the
    length and depth asked, and where the needle landed (its first token's share of the
    haystack's tokens before it)."""

    ids: tuple[int, ...]
    start: int
    stop: int
    length: int
    depth: float
    placed: float

    @property
    def needle_ids(self) -> tuple[int, ...]:
        return self.ids[self.start : self.stop]


class Builder:
    """Prompts of one model (its tokenizer) over one haystack, needle and question."""

    def __init__(self, tokenizer: Any, causal: bool, haystack: Haystack, needle: str,
                 question: str) -> None:  # fmt: skip
        from attnviz.core.tokens import bos_to_add

        for what, given in (("--needle-text", needle), ("--question", question)):
            if not given.strip():
                raise InputError(f"{what} is empty")
        self.tokenizer, self.haystack = tokenizer, haystack
        self.needle, self.question = " ".join(needle.split()), " ".join(question.split())
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self.bos = None if self.templated else bos_to_add(tokenizer, causal)
        self.frame = len(self._tokens(self._render(""))[0])  # the prompt without a context
        self.needle_tokens = len(tokenizer(self.needle, add_special_tokens=False)["input_ids"])

    def least(self) -> int:
        """The shortest prompt the needle fits in: template, question and needle alone."""
        return self.frame + self.needle_tokens

    def filled(self, longest: int) -> Haystack:
        """The haystack read as many times over as `longest` tokens need (`repeats`)."""
        text = self.haystack.text
        have = len(self._ends(text))
        repeats = max(1, -(-(longest - self.least()) // max(have, 1)))
        return Haystack(" ".join([text] * repeats), self.haystack.name, repeats)

    def build(self, haystack: Haystack, length: int, depth: float) -> NeedlePrompt:
        """The prompt of at most `length` tokens with the needle at `depth` % of the haystack
        kept, at the sentence boundary nearest that share of its tokens."""
        if length < self.least():
            raise InputError(
                f"a length of {length:,} tokens cannot hold the needle: the template, question "
                f"and needle alone take {self.least():,}; ask for longer --lengths"
            )
        ends = haystack.sentence_ends()
        token_ends = self._ends(haystack.text)
        budget = length - self.least() - 2  # the spaces around the needle may add a token
        while True:
            cut = self._cut(ends, token_ends, budget)
            prompt = self._place(haystack.text[:cut], ends, token_ends, length, depth)
            over = len(prompt.ids) - length
            if over <= 0 or budget <= 0:
                return prompt
            budget -= over  # a token boundary moved: keep less haystack

    def _cut(self, ends: list[int], token_ends: list[int], budget: int) -> int:
        """The last sentence end within the first `budget` tokens of the haystack."""
        if budget <= 0:
            return 0
        limit = token_ends[min(budget, len(token_ends)) - 1]
        return max(e for e in ends if e <= limit)

    def _place(self, kept: str, ends: list[int], token_ends: list[int], length: int,
               depth: float) -> NeedlePrompt:  # fmt: skip
        import bisect

        boundaries = [e for e in ends if e <= len(kept)]
        n_kept = bisect.bisect_left(token_ends, len(kept))  # the kept text's tokens, about
        goal = depth / 100 * n_kept
        at = min(boundaries, key=lambda e: abs(bisect.bisect_left(token_ends, e) - goal))
        before, after = kept[:at].rstrip(), kept[at:].lstrip()
        context = " ".join(part for part in (before, self.needle, after) if part)
        text = self._render(context)
        first = text.index(context) + (len(before) + 1 if before else 0)
        ids, offsets = self._tokens(text)
        inside = [i for i, (s, e) in enumerate(offsets)
                  if e > s and s < first + len(self.needle) and e > first]  # fmt: skip
        placed = bisect.bisect_left(token_ends, at) / n_kept if n_kept else 0.0
        return NeedlePrompt(tuple(ids), inside[0], inside[-1] + 1, length, depth, placed)

    def _ends(self, text: str) -> list[int]:
        """Where each of the haystack's tokens ends (a character offset), read by the fast
        tokenizer's own backend: the whole haystack is longer than the model's window,
        which the tokenizer would warn of."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            return [end for _, end in enc["offset_mapping"]]
        return [end for _, end in backend.encode(text, add_special_tokens=False).offsets]

    def _render(self, context: str) -> str:
        if not self.templated:
            return PLAIN.format(context=context, question=self.question)
        content = ASK.format(context=context, question=self.question)
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )

    def _tokens(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The prompt's ids and each one's characters (a template holds its own special
        tokens; a plain prompt gets the BOS a decoder reads first, as attnviz reads texts)."""
        enc = self.tokenizer(text, add_special_tokens=not self.templated,
                             return_offsets_mapping=True)  # fmt: skip
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        if self.bos is not None:
            ids, offsets = [self.bos, *ids], [(0, 0), *offsets]
        return ids, offsets
