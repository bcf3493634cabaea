"""A decoder's continuation of its prompt, and the attention it used: written by the model
(`--generate`: transformers' `generate`, with its KV cache) or given (`--target`: one
teacher-forced pass over prompt + target).

As the model runs, attnviz's attention function (`core.recording`) hands this module each
chosen layer's q and k of the pass over the prompt (its `Scores`, kept: they grow with the
prompt's length, not its square) and, at each generation step, the step's one new row of
every head over every key so far (kept: N rows of at most T+N keys a head). Once the text
is whole, `Reading.replay` hands them to capture's recorders as a pass over prompt +
continuation would: the prompt's rows made from its q and k a block of rows at a time, then
the steps' rows as the model used them while it wrote. The model does not run again.

Row i of the result is position i reading positions 0 … i; the token at position i + 1 was
written from it, so "where the model looked when it wrote token t" is row t − 1.

A model that runs eager attention (`--attention eager`, or a type whose attention bypasses
transformers' interface) hands attnviz's function nothing as it writes: it writes (or reads
the target) all the same, and the caller reads prompt + continuation in one more pass, whose
row i is what the model used when it wrote token i + 1 (it reads the same keys and values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from attnviz.core.attention import Continuation, Encoded, require_text
from attnviz.errors import InputError, TextTooLongError

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel
    from attnviz.core.recording import Scores


@dataclass(frozen=True)
class Settings:
    """How a continuation comes: `tokens` written by the model (greedy, or with `sample`
    drawn at `temperature` from a generator seeded with `seed`), or `target` given."""

    tokens: int | None = None
    target: str | None = None
    sample: bool = False
    temperature: float = 1.0
    seed: int | None = None

    def how(self) -> str:
        """How the tokens came, as `Continuation.how` says it."""
        if self.target is not None:
            return "teacher-forced"
        if not self.sample:
            return "greedy"
        seed = f", seed {self.seed}" if self.seed is not None else ", no seed"
        return f"sampled at temperature {self.temperature:g}{seed}"


@dataclass(eq=False)
class Reading:
    """What a continuation's pass kept of each chosen layer: the q and k of the pass over the
    prompt (or over prompt + target), and each generation step's rows (H, position + 1)."""

    layers: list[int]
    n_heads: int
    length: int  # tokens in all: prompt + continuation
    prompt: dict[int, Scores] = field(default_factory=dict)
    steps: dict[int, list[Any]] = field(default_factory=dict)

    def replay(self, listener: Any, block_rows: int) -> None:
        """Hand every chosen layer's rows to `listener` (capture's pass, `recording.Listener`)
        as attnviz's function would in one pass over the whole text: blocks of `block_rows`
        query rows, each as wide as its last row's keys (later keys hold 0)."""
        import torch

        n = self.length
        for layer in self.layers:
            site = (None, layer)
            if not listener.wants(site, (1, self.n_heads, n, n)):
                listener.done(site, None)
                continue
            scores, steps = self.prompt[layer], self.steps.get(layer, [])
            read = scores.query.shape[2]  # rows of the one pass (prompt, or prompt + target)
            for start in range(0, read, block_rows):
                stop, asked = min(start + block_rows, read), listener.reductions(site)
                rows, entropy, found = scores.read_rows(start, stop, listener.entropy, asked)
                listener.block(site, start, rows, entropy, found)
            for first in range(0, len(steps), block_rows):
                part = steps[first : first + block_rows]
                width = part[-1].shape[-1]
                rows = torch.zeros(1, self.n_heads, len(part), width)  # (1, H, b, W)
                for i, row in enumerate(part):
                    rows[0, :, i, : row.shape[-1]] = row
                entropy = torch.special.entr(rows).sum(dim=-1) if listener.entropy else None
                listener.block(site, read + first, rows, entropy)
            listener.done(site, None)


class _Holding:
    """The listener of a continuation's pass (`recording.Listener`): keeps each chosen
    layer's q and k from its first call (the prompt, SDPA computing its output) and the rows
    of every later call (a generation step: one query over the cache's keys). A
    vision-language model's other stacks go to `others` (`capture.listener`, its recorders
    fed as they run), where one is given: its vision tower's (VISION, run in the prompt's
    pass alone) and Mllama's cross-attention layers (`cross`, run in every pass, a step's
    call after the prompt's)."""

    def __init__(self, loaded: LoadedModel, layers: Sequence[int], reading: Reading,
                 others: Any = None) -> None:  # fmt: skip
        from attnviz.core import layer_map
        from attnviz.core.capture import Callers, fast_attention
        from attnviz.core.recording import BLOCK_ROWS

        self.fast = fast_attention(loaded)
        self.block_rows, self.entropy = BLOCK_ROWS, False
        self.reading, self.wanted, self.others = reading, set(layers), others
        self._sites = Callers(layer_map.of(loaded.model))
        self._read: dict[Any, int] = {}  # positions each site has read so far
        self._call: dict[Any, tuple[int, int]] = {}  # the call running: (queries, keys)

    def site(self, module: Any) -> Any:
        found = self._sites.site(module)  # (None, layer), or another stack's (VISION, layer)
        if found is None:
            return None
        if found[0] is not None:
            return found if self.others is not None else None
        return found if found[1] in self.wanted else None

    def wants(self, site: Any, shape: tuple[int, int, int, int]) -> bool:
        if site[0] is not None:
            return self.others.wants(site, shape)
        batch, _, queries, keys = shape
        if batch != 1:
            raise ValueError("a continuation is read one text at a time")
        self._call[site] = (queries, keys)
        return site in self._read  # the prompt's call runs fast; its q and k are kept

    def scores(self, site: Any, scores: Scores, value: Any) -> None:
        if site[0] is not None:
            self.others.scores(site, scores, value)
        elif site not in self._read:
            self.reading.prompt[site[1]] = scores.cpu()

    def block(self, site: Any, start: int, rows: Any, entropy: Any) -> None:
        """A step's rows (1, H, b, S), each kept over positions 0 … its own (`by_position`)."""
        if site[0] is not None:
            self.others.block(site, start, rows, entropy)
            return
        queries, keys = self._call[site]
        for i in range(rows.shape[2]):
            position = self._read[site] + start + i
            row = by_position(rows[0, :, i], self._read[site] + queries, keys, position)
            self.reading.steps.setdefault(site[1], []).append(row)

    def done(self, site: Any, heads: Any) -> Any:
        if site[0] is not None:
            return self.others.done(site, heads)
        self._read[site] = self._read.get(site, 0) + self._call[site][0]
        return heads

    def check_served(self) -> None:
        """After the pass: the other stacks' recorders had every layer they asked for."""
        if self.others is not None:
            self.others.check_served()


def by_position(row: Any, end: int, keys: int, position: int) -> Any:
    """A step's row over its call's `keys` keys, (H, S), as a row over positions 0 …
    `position`, (H, position + 1): key j of a call whose last query is position end − 1 is
    position end − S + j where the cache holds the last S positions (a sliding window's),
    position j where it holds more (a static cache's unfilled slots, hidden, left out)."""
    import torch

    first = max(end - keys, 0)
    kept = min(keys, end)
    found = torch.zeros(row.shape[0], position + 1)  # (H, position + 1)
    found[:, first : first + kept] = row[:, :kept][:, : position + 1 - first]
    return found


class _Steps:
    """The listener of `greedy` (`recording.Listener`): hands `take(layer, position, row)`
    each chosen layer's row of the prompt's last position (made from the prompt's q and k,
    whose pass runs SDPA) and of every step's one query, (H, position + 1); `edit` replaces
    every layer's heads' outputs (head ablation). A layer nobody takes runs SDPA."""

    def __init__(self, loaded: LoadedModel, layers: Sequence[int], take: Any, edit: Any) -> None:
        from attnviz.core import layer_map
        from attnviz.core.capture import Callers, fast_attention
        from attnviz.core.recording import BLOCK_ROWS

        self.fast = fast_attention(loaded)
        self.block_rows, self.entropy = BLOCK_ROWS, False
        self.take, self.edit, self.wanted = take, edit, set(layers) if take else set()
        self._sites = Callers(layer_map.of(loaded.model))
        self._read: dict[Any, int] = {}  # positions each site has read so far
        self._call: dict[Any, tuple[int, int]] = {}  # the call running: (queries, keys)

    def site(self, module: Any) -> Any:
        found = self._sites.site(module)
        return found if found is not None and found[0] is None else None

    def wants(self, site: Any, shape: tuple[int, int, int, int]) -> bool:
        self._call[site] = (shape[2], shape[3])
        return site in self._read and site[1] in self.wanted  # a step, of a chosen layer

    def scores(self, site: Any, scores: Scores, value: Any) -> None:
        if site not in self._read and site[1] in self.wanted:  # the prompt: its last row
            n = scores.shape[2]
            rows, _ = scores.rows(n - 1, n)  # (1, H, 1, W)
            self.take(site[1], n - 1, by_position(rows[0, :, 0].cpu(), n, rows.shape[-1], n - 1))

    def block(self, site: Any, start: int, rows: Any, entropy: Any) -> None:
        queries, keys = self._call[site]
        position = self._read[site] + start  # a step: one query
        self.take(site[1], position, by_position(rows[0, :, 0].cpu(), position + 1, keys, position))

    def done(self, site: Any, heads: Any) -> Any:
        self._read[site] = self._read.get(site, 0) + self._call[site][0]
        return self.edit(site[1], heads) if self.edit is not None else heads


def greedy(loaded: LoadedModel, ids: Sequence[int], n: int, layers: Sequence[int] = (),
           take: Any = None, edit: Any = None) -> list[int]:  # fmt: skip
    """At most `n` tokens the model writes after `ids`, greedy (transformers' `generate`,
    stopping at its end-of-text token), as attnviz's function runs it: `take(layer,
    position, row)` gets, for each of `layers`, the row (H, position + 1) that wrote each
    token, as the model computed it in the pass (the first token's: the prompt's last row;
    each later one's: its step's); `edit` (head ablation) acts on every layer's heads. The
    written ids; a model that does not run attnviz's function is refused in one line."""
    import torch

    from attnviz.core import recording
    from attnviz.core.capture import records
    from attnviz.errors import UnsupportedModelError

    if not records(loaded.model):
        raise UnsupportedModelError(
            f"{loaded.info.name} runs eager attention (--attention eager, or a type whose "
            "attention bypasses transformers' interface): its rows are not heard as it writes"
        )
    check_room(len(ids), n, loaded.info.max_tokens)
    inputs = torch.tensor([list(ids)], device=loaded.device)
    config = generation_config(loaded, Settings(tokens=n))
    with recording.listening(_Steps(loaded, layers, take, edit)), torch.inference_mode():
        out = loaded.model.generate(inputs, attention_mask=torch.ones_like(inputs),
                                    generation_config=config)  # fmt: skip
    return [int(i) for i in out.sequences[0, len(ids) :]]


def check_room(n_prompt: int, n_new: int, limit: int) -> None:
    """Refuse a prompt of `n_prompt` tokens that `n_new` more would take past `limit`."""
    if n_prompt + n_new > limit:
        raise TextTooLongError(
            f"the prompt is {n_prompt} tokens long and --generate {n_new} would make it "
            f"{n_prompt + n_new}; this model takes at most {limit}"
        )


def kept_bytes(info: Any, n_layers: int, n_prompt: int, n_new: int) -> int:
    """What a Reading of `n_layers` keeps, at most: the prompt's q and k (float32, at the
    model's widths) and N step rows of up to T + N keys a head (float32)."""
    q_and_k = n_prompt * (info.n_heads + (info.n_kv_heads or info.n_heads)) * info.d_head
    steps = info.n_heads * n_new * (n_prompt + n_new)
    return 4 * n_layers * (q_and_k + steps)


def write(loaded: LoadedModel, prompt: Encoded, settings: Settings, layers: Sequence[int],
          others: Sequence[Any] = ()):  # fmt: skip
    """The prompt's continuation (`settings`) and the attention of `layers` it used: prompt +
    continuation as one Encoded (with its `continuation`), and the `Reading` the pass kept
    (refused, one line, where it would not fit in memory); None for a model running eager
    attention, whose rows the caller reads in a pass over the whole (see above). `others`:
    capture recorders of a vision-language model's other stacks (rows alone), fed as they
    run (attnviz's function only): its vision tower's (VISION) in the prompt's pass, Mllama's
    cross-attention layers' (`cross`) in every pass, the steps' rows after the prompt's."""
    from attnviz.core.capture import records

    listens = records(loaded.model)
    if others and not listens:
        raise ValueError("the other stacks' rows are heard through attnviz's function alone")
    if settings.target is not None:
        return _teacher_forced(loaded, prompt, settings, layers, listens, others)
    return _generated(loaded, prompt, settings, layers, listens, others)


def _listener(loaded: LoadedModel, layers: Sequence[int], reading: Reading, listens: bool,
              others: Sequence[Any]) -> tuple[Any, _Holding | None]:  # fmt: skip
    """The pass's listener where attnviz's function hears it (with the other stacks'
    recorders):
    (its context, the `_Holding`); else (a context that does nothing, None)."""
    from contextlib import nullcontext

    from attnviz.core import capture, recording

    if not listens:
        return nullcontext(), None
    held = _Holding(loaded, layers, reading, capture.listener(loaded, others) if others else None)
    return recording.listening(held), held


def _generated(loaded: LoadedModel, prompt: Encoded, settings: Settings, layers: Sequence[int],
               listens: bool = True, others: Sequence[Any] = ()):  # fmt: skip
    """transformers' `generate` (greedy, or sampled), each step's rows held as it runs
    (`listens`: attnviz's function hears them); then one more step reading the last token
    written, so that every token has its row."""
    import torch

    from attnviz.core.tokens import picture_inputs

    model, n = loaded.model, settings.tokens
    check_room(len(prompt), n, loaded.info.max_tokens)
    if listens:  # the Reading it keeps
        _require(loaded, layers, len(prompt), n)
    ids = torch.tensor([prompt.ids], device=loaded.device)
    reading = Reading(list(layers), loaded.info.n_heads, len(prompt) + n)
    listener, held = _listener(loaded, layers, reading, listens, others)
    with torch.random.fork_rng(devices=_devices(loaded)), listener:
        if settings.seed is not None:
            torch.manual_seed(settings.seed)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=generation_config(loaded, settings),
                **picture_inputs(loaded, prompt),
            )
            written = out.sequences[0, len(prompt) :]
            if listens:
                model.base_model(input_ids=written[-1:][None], cache=out.cache, use_cache=True,
                                 **_step_inputs(loaded, prompt))  # fmt: skip
    if held is not None:
        held.check_served()
    new = [int(i) for i in written]
    probs = tuple(
        float(torch.softmax(logits[0].float(), dim=-1)[token])
        for logits, token in zip(out.logits, new)
    )
    eos = _eos_ids(loaded)
    reading.length = len(prompt) + len(new)
    stopped = bool(new) and new[-1] in eos
    continuation = Continuation(len(prompt), probs, True, settings.how(), stopped)
    return _joined(loaded, prompt, new, continuation), reading if listens else None


def _step_inputs(loaded: LoadedModel, prompt: Encoded) -> dict[str, Any]:
    """What the one more step after `generate` reads beside its token, as `generate`'s own
    steps do: Mllama's cross-attention mask, the prompt's last token's (the tiles of the
    picture it sees; without it the step's row would read the empty tiles too)."""
    mask = (prompt.inputs or {}).get("cross_attention_mask")
    return {} if mask is None else {"cross_attention_mask": mask[:, -1:].to(loaded.device)}


def _teacher_forced(
    loaded: LoadedModel, prompt: Encoded, settings: Settings, layers: Sequence[int],
    listens: bool = True, others: Sequence[Any] = (),
):  # fmt: skip
    """One pass over prompt + target (the whole model, for each target token's
    probability), each layer's q and k held where attnviz's function hears them
    (`listens`)."""
    import torch

    from attnviz.core.tokens import picture_inputs

    target = target_ids(loaded, prompt.text, settings.target)
    ids = [*prompt.ids, *target]
    limit = loaded.info.max_tokens
    if len(ids) > limit:
        raise TextTooLongError(
            f"prompt and target are {len(ids)} tokens long; this model takes at most {limit}"
        )
    if listens:
        _require(loaded, layers, len(ids), 0)
    reading = Reading(list(layers), loaded.info.n_heads, len(ids))
    inputs = torch.tensor([ids], device=loaded.device)
    listener, held = _listener(loaded, layers, reading, listens, others)
    with listener, torch.inference_mode():
        # the logits of the rows that read the target alone: (N + 1, V), not (T + N, V)
        logits = loaded.model(input_ids=inputs, logits_to_keep=len(target) + 1,
                              **picture_inputs(loaded, prompt, len(ids))).logits[0]  # fmt: skip
    if held is not None:
        held.check_served()
    start = len(prompt)
    chances = torch.softmax(logits[:-1].float(), dim=-1)  # (N, V): rows start − 1 … T + N − 2
    probs = tuple(float(chances[i, token]) for i, token in enumerate(target))
    continuation = Continuation(start, probs, False, settings.how())
    return _joined(loaded, prompt, target, continuation), reading if listens else None


def _require(loaded: LoadedModel, layers: Sequence[int], n_read: int, n_new: int) -> None:
    """Refuse, one line, a Reading this process could not hold (`memory.require`)."""
    from attnviz.core.memory import require

    what = f"the queries and keys of {len(layers)} layers over {n_read:,} tokens"
    steps = f" and {n_new} steps' rows" if n_new else ""
    require(kept_bytes(loaded.info, len(layers), n_read, n_new), what + steps)


def target_ids(loaded: LoadedModel, prompt: str, target: str) -> list[int]:
    """The target's token ids as they follow the prompt: tokenised alone, without special
    tokens, after a space where neither the prompt ends nor the target starts with one (a
    word that follows a word)."""
    require_text(target, "the --target text")
    if not prompt[-1:].isspace() and not target[:1].isspace():
        target = " " + target
    ids = loaded.tokenizer(target, add_special_tokens=False)["input_ids"]
    if not ids:
        raise InputError("the --target text gives no tokens with this model's tokenizer")
    return list(ids)


def generation_config(loaded: LoadedModel, settings: Settings) -> Any:
    """The settings as transformers' GenerationConfig, and nothing else: greedy, or drawn
    from the whole distribution at `temperature` (no top-k, top-p or repetition penalty that
    a model's own generation_config.json may name), stopping at the end-of-text token; a
    vision-language model's image placeholders never written (`_placeholders`); the output
    with each step's logits."""
    from transformers import GenerationConfig

    from attnviz.core.model_info import language_config

    eos = sorted(_eos_ids(loaded))
    pad = getattr(language_config(loaded.model.config), "pad_token_id", None)
    sampled = dict(do_sample=True, temperature=settings.temperature, top_k=0, top_p=1.0)
    placeholders = _placeholders(loaded.model.config)
    return GenerationConfig(
        suppress_tokens=placeholders or None,
        max_new_tokens=settings.tokens,
        min_new_tokens=0,
        num_beams=1,
        eos_token_id=eos or None,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
        return_dict_in_generate=True,
        output_logits=True,
        **(sampled if settings.sample else dict(do_sample=False)),
    )


def _placeholders(config: Any) -> list[int]:
    """A vision-language model's image and video placeholder tokens: never written (each
    stands for features of a picture the prompt does not have)."""
    if getattr(config, "vision_config", None) is None:
        return []
    names = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")
    return sorted(
        {found for name in names if isinstance(found := getattr(config, name, None), int)}
    )


def _eos_ids(loaded: LoadedModel) -> set[int]:
    """The model's end-of-text tokens: its generation config's, its (text) config's, its
    tokenizer's."""
    from attnviz.core.model_info import language_config

    found: set[int] = set()
    config = language_config(loaded.model.config)
    for holder in (getattr(loaded.model, "generation_config", None), config):
        eos = getattr(holder, "eos_token_id", None)
        if eos is not None:
            found.update(eos if isinstance(eos, list) else [eos])
    if not found and loaded.tokenizer.eos_token_id is not None:
        found.add(loaded.tokenizer.eos_token_id)
    return found


def _devices(loaded: LoadedModel) -> list[Any]:
    """The accelerators whose random state a seeded sample draws from (restored after)."""
    device = str(loaded.device)
    return [device] if device.startswith("cuda") else []


def _joined(loaded: LoadedModel, prompt: Encoded, new: list[int], continuation: Continuation):
    """The prompt and its continuation as one Encoded: the continuation's tokens labelled
    by what they decode to, in words of their own (`seq2seq.from_ids`)."""
    from attnviz.core.seq2seq import from_ids

    text = loaded.tokenizer.decode(new, skip_special_tokens=True)
    tail = from_ids(loaded, new, text)
    words = len(prompt.word_labels)
    continuation = replace(continuation, text_at=len(prompt.text))
    return replace(
        prompt,
        text=prompt.text + text,
        ids=(*prompt.ids, *tail.ids),
        tokens=(*prompt.tokens, *tail.tokens),
        special=(*prompt.special, *tail.special),
        words=(*prompt.words, *(words + w for w in tail.words)),
        word_labels=(*prompt.word_labels, *tail.word_labels),
        continuation=continuation,
    )
