"""What is wrong in a model's files, said in one line that names the file.

A config.json that is not JSON, or whose fields transformers refuses (a field of the wrong
type, numbers that do not agree); a tokenizer that is missing or unreadable; weights cut off
or of other shapes than the config's. Each is a `ModelLoadError` (exit 2 at the command
line), raised before anything is written; `core.models` calls these where it reads the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnviz.errors import ModelLoadError

# The files a Hugging Face tokenizer is read from: tokenizers' own file, or the files of a
# tokenizer transformers converts (SentencePiece, WordPiece, byte-level BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "vocab.txt", "vocab.json")  # fmt: skip


def read_json(path: Path) -> dict[str, Any]:
    """A model's JSON file (config.json, tokenizer_config.json, a weights index) as a dict;
    one line naming it where it is not a JSON object."""
    try:
        found = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ModelLoadError(f"{path} cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path} is not text (byte {exc.start} is not UTF-8)") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON: {exc.msg.lower()} at line {exc.lineno}, column {exc.colno}"
        ) from exc
    if not isinstance(found, dict):
        held = type(found).__name__
        raise ModelLoadError(f"{path} is not a JSON object of fields: it holds a {held}")
    return found


def refused_config(path: Path | str, error: Exception) -> ModelLoadError:
    """transformers' refusal of config.json (huggingface_hub's strict dataclass errors: a
    field of the wrong type, numbers that do not agree; a ValueError, or rope's KeyError) as
    one line naming the file: the cause alone, without the validator's name."""
    said = _first_line(error.__cause__ or error)
    if said[1:2].islower():  # "Field 'hidden_size' expected int" reads on after the colon
        said = said[0].lower() + said[1:]
    return ModelLoadError(f"{path}: {said}")


def from_tokenizers(error: BaseException) -> bool:
    """Whether `error` is the tokenizers library's refusal of a file: it raises a bare
    Exception (no subclass), which is why it cannot be caught by type."""
    return type(error) is Exception


def tokenizer_file(path: Path) -> Any:
    """tokenizer.json read by the tokenizers library; one line naming it where it cannot."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        if not from_tokenizers(exc):
            raise
        read_json(path)  # not JSON: said so, and where
        raise ModelLoadError(
            f"{path} is not a tokenizer file tokenizers can read: {_first_line(exc)}"
        ) from exc


def no_tokenizer(folder: Path, label: str, error: Exception) -> ModelLoadError:
    """Why a model folder's tokenizer did not load (transformers' `error`), naming its file:
    none of the tokenizer files there, a tokenizer_config.json or tokenizer.json that is not
    JSON or not readable, or what transformers said."""
    if (folder / "tokenizer_config.json").is_file():
        read_json(folder / "tokenizer_config.json")
    if (folder / "tokenizer.json").is_file():
        tokenizer_file(folder / "tokenizer.json")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return ModelLoadError(
            f"{label} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is in {folder}"
        )
    return ModelLoadError(f"could not load the tokenizer in {folder}: {_first_line(error)}")


def damaged_weights(files: list[Path], error: Exception) -> ModelLoadError:
    """The first of a model's .safetensors `files` safetensors cannot open (cut off, or not
    a safetensors file), named with what safetensors says; else safetensors' `error`."""
    from safetensors import SafetensorError, safe_open

    for path in files:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            return ModelLoadError(f"{path} is cut off or damaged: {_first_line(exc)}")
    return ModelLoadError(f"the weights could not be read: {_first_line(error)}")


def misfit(config_file: Path | str, weights: Path | str, loading: dict[str, Any],
           in_layer: Any) -> ModelLoadError | None:  # fmt: skip
    """One line where the weights loaded do not fit the config (from_pretrained's loading
    info): a weight of another shape, or a layer's weight missing (`in_layer(key)`: whether
    the missing parameter `key` is in one of the model's layers); None where they fit. A
    missing output head is no misfit: attnviz reads attention, and a base model's checkpoint
    is loaded with its head new."""
    mismatched = sorted(loading.get("mismatched_keys") or ())
    if mismatched:
        key, saved, wanted = mismatched[0]
        more = f" ({len(mismatched) - 1} more weights differ)" if len(mismatched) > 1 else ""
        return ModelLoadError(
            f"{weights} does not fit {config_file}: {key} is {_shape(saved)} in the weights, "
            f"{_shape(wanted)} by the config{more}"
        )
    missing = sorted(key for key in loading.get("missing_keys") or () if in_layer(key))
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return ModelLoadError(
            f"{weights} does not fit {config_file}: it has no {missing[0]}{more} (does the "
            "config name more layers, or other ones, than the weights hold?)"
        )
    return None


def _shape(shape: Any) -> str:
    return " × ".join(str(n) for n in shape)


def _first_line(error: BaseException) -> str:
    message = error.args[0] if isinstance(error, KeyError) and error.args else error  # no quotes
    said = str(message).strip().splitlines()
    return said[0] if said else type(error).__name__
