"""A picture and a prompt in, for a vision-language model (LLaVA, Qwen2-VL, PaliGemma, …):
its processor (`processor`), the prompt through its chat template as the model card would
(or as it is, `raw`), and the tokens the model reads (`encode`): the prompt's, with each
image token labelled by where its family's layout puts it on the picture (`core.layouts`).

Which checkpoints these are is said from config.json alone (`core.models`: a text and a
vision config, of a type transformers loads as image-text-to-text); the processor is loaded
with the model where the checkpoint holds one (PROCESSOR_FILES); without one, its text alone
is read, through its language model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.core.attention import Encoded, require_text
from attnviz.errors import InputError

if TYPE_CHECKING:
    from attnviz.core.model_info import LoadedModel


# The files a processor is read from, beside the tokenizer's: the processor's own, the image
# processor's.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def processor(source: str, load: Any) -> Any:
    """The model's processor (`AutoProcessor`), or where transformers cannot build it here
    (a family's processor that holds a video processor, which needs torchvision) the same
    class without its video processor: the image processor, the tokenizer and the chat
    template it was saved with. `load(loader, source)` reads a checkpoint's files."""
    from transformers import AutoProcessor

    try:
        found = load(AutoProcessor, source)
    except (ImportError, OSError, ValueError, TypeError, AttributeError):
        found = None
    if found is not None and hasattr(found, "image_processor"):
        return found
    return load(_without_video(_processor_class(source)), source)


def _processor_class(source: str) -> Any:
    """The processor class the checkpoint names (processor_config.json), else its type's."""
    import json

    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    named = None
    for file in PROCESSOR_FILES:
        path = Path(source) / file
        if path.is_file():
            named = json.loads(path.read_text(encoding="utf-8")).get("processor_class") or named
    if named is None:
        config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
        named = PROCESSOR_MAPPING_NAMES.get(config.get("model_type"))
    if named is None or not hasattr(transformers, named):
        raise InputError(f"{source} has no processor transformers knows: it needs a "
                         "processor_config.json naming its processor class")  # fmt: skip
    return getattr(transformers, named)


def _without_video(cls: Any) -> Any:
    """`cls`, a processor class, without its video processor."""

    class WithoutVideo(cls):
        @classmethod
        def get_attributes(cls) -> list[str]:
            return [name for name in super().get_attributes() if name != "video_processor"]

    WithoutVideo.__name__ = WithoutVideo.__qualname__ = cls.__name__
    return WithoutVideo


def _unread(model: Any) -> str:
    """Why a family without a layout reader has no view of the picture."""
    from attnviz.core.layer_map import generic

    cross = len(generic.callers(model, "cross"))
    if cross:  # Mllama's
        return (f"it reads the picture through {cross} cross-attention layer(s), not as tokens "
                "of the prompt, and attnviz has no map of their keys over the picture")  # fmt: skip
    return "attnviz has no reader of its image tokens' layout"


def unplaced(name: str, encoded: Encoded, command: str) -> str:
    """Why `command` (over pictures and questions) cannot read `encoded`, whose image tokens
    have no layout: a family that reads its picture in cross-attention layers (Mllama's),
    which the command does not read, or one attnviz has no layout reader for."""
    if encoded.cross is not None:
        return (f"{name} reads the picture in cross-attention layers, not as tokens of the "
                f"prompt: {command} does not read those layers yet (show, its --html page, "
                "export and the API do: docs/vision-language.md)")  # fmt: skip
    return (f"{name}: attnviz has no reader of where its image tokens sit on the picture "
            f"(docs/vision-language.md): {command} cannot read it")  # fmt: skip


def prompt_text(processor: Any, prompt: str, raw: bool) -> str:
    """The prompt as the model reads it: one user turn of the picture then the prompt,
    through the processor's chat template, ready for the answer; as it is with `raw`, or
    where the processor has no chat template (PaliGemma's places the image itself)."""
    require_text(prompt, "the prompt")
    if raw or not getattr(processor, "chat_template", None):
        return prompt
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def refuse_images(processor: Any, text: str, pictures: int = 1) -> None:
    """Refuse a prompt that holds more image placeholders than the pictures given."""
    token = getattr(processor, "image_token", None)
    found = text.count(token) if token else 0
    if found > pictures:
        raise InputError(
            f"the prompt holds {found} image tokens ({token}) and {pictures} picture is given: "
            "attnviz reads one picture a prompt; give one image token, or none"
        )


def tower(loaded: LoadedModel, encoded: Encoded) -> Any:
    """Where each token of the model's vision tower sits on `encoded`'s picture
    (`layouts.Tower`, by its family's map); ValueError, its reason in one line, where the
    family's tower has no map (or its image tokens no layout)."""
    from attnviz.core import layouts
    from attnviz.core.images import prefix_labels

    config = loaded.model.config
    if encoded.layout is None:
        raise ValueError(
            "attnviz has no map of its vision tower's tokens (nor of its image tokens)"
        )
    before = len(prefix_labels(config.vision_config))
    return layouts.tower(config.model_type, encoded.inputs, config, encoded.layout, before)


# The processor's outputs that are not the picture's: the ids and mask (attnviz pads them),
# PaliGemma's training labels.
_NOT_INPUTS = ("input_ids", "attention_mask", "labels")


def encode(loaded: LoadedModel, given: Any, prompt: str, raw: bool = False) -> Encoded:
    """The picture and the prompt as the model reads them: the prompt's tokens, each image
    token labelled by its cell of the picture (`(row, col)`, by its family's layout), the
    processor's other outputs (pixel values, the grid of patches, …) in `inputs`, the
    `layout`, and a note where the family has no layout reader."""
    from attnviz.core import cross_picture, layouts
    from attnviz.core.images import read_picture
    from attnviz.core.seq2seq import from_ids

    if loaded.processor is None:
        raise InputError(f"{loaded.info.name} has no processor here ({' or '.join(PROCESSOR_FILES)}"
                         "): attnviz reads a picture and a prompt through it; text alone is read "
                         "through its language model")  # fmt: skip
    if isinstance(given, (list, tuple)):
        raise InputError(f"{len(given)} pictures given: attnviz reads one picture a prompt "
                         "(several in one prompt are not read yet); give one")  # fmt: skip
    image = read_picture(given)
    name = Path(given).name if isinstance(given, (str, Path)) else "image"
    text = prompt_text(loaded.processor, prompt, raw)
    refuse_images(loaded.processor, text)
    try:
        made = loaded.processor(images=image, text=text, return_tensors="pt")
    except (ValueError, TypeError, RuntimeError) as exc:
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{name}: the model's processor does not take this picture with this "
                         f"prompt ({said})") from None  # fmt: skip
    ids = [int(i) for i in made["input_ids"][0]]
    inputs = {key: value for key, value in made.items() if key not in _NOT_INPUTS}
    config = loaded.model.config
    cross = None
    try:
        layout = layouts.layout(config.model_type, ids, inputs, config, loaded.processor, image,
                                name)  # fmt: skip
        cross = cross_picture.of(loaded, inputs, image, name)
        unread = _unread(loaded.model)
    except ValueError as exc:  # a layout its family's reader does not know
        layout, unread = None, str(exc)
    found = from_ids(loaded, ids, text)
    tokens, special = list(found.tokens), list(found.special)
    word_labels = list(found.word_labels)
    notes = [f"{image.width} × {image.height} picture, {name}"]
    if cross is not None:
        notes.append(cross.describe())
    elif layout is None:
        notes.append(f"the picture's view is not drawn for {config.model_type}: {unread} (the "
                     "text views are)")  # fmt: skip
    else:
        for index, label in layout.labels().items():
            tokens[index], special[index] = label, False
            word_labels[found.words[index]] = label
        cells = layout.cells()
        notes.append(f"{len(cells)} image tokens over the picture "
                     + " + ".join(f"{p.grid[0]} × {p.grid[1]}" for p in layout.parts))  # fmt: skip
    return Encoded(
        text=text,
        ids=tuple(ids),
        tokens=tuple(tokens),
        special=tuple(special),
        words=found.words,
        word_labels=tuple(word_labels),
        notes=tuple(notes),
        inputs=inputs,
        layout=layout,
        cross=cross,
    )
