"""Tiny random vision-language models (two layers) saved with a processor built here, for
tests: no pretrained weights or processors are reachable, and torchvision is not installable
(so the families whose processor holds a video processor, Qwen2-VL's, are saved with their
image processor (its PIL backend) and tokenizer alone, as attnviz reads them).

- FAMILIES: the model types built (`save(model_type, folder)`).
- save(model_type, folder, local=False): the model and its processor in `folder`; `local`
  makes each image token's features depend on its own patches alone (the vision tower's
  attention outputs set to 0: `MIXING`), so that a bright patch moves only the tokens cut
  from it.
- eager(folder, picture, prompt_ids, inputs): the language model's own probabilities over
  the whole sequence (eager `output_attentions`), (L, H, T, T) float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXT = dict(vocab_size=None, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=37, max_position_embeddings=2048,
            head_dim=8)  # fmt: skip
CORPUS = ["What is on the table? A cat sat on the mat.", "The quick brown fox jumps."] * 10
TEMPLATE = (
    "{% for m in messages %}<|user|>{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "IMAGE{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tokenizer(image: str, *more: str, **named: str) -> Any:
    """A byte-level BPE tokenizer trained in memory, with `image` (the image token), `more`
    and `named` (Gemma 3's `boi_token`, …: the tokenizer's attributes) as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|user|>", "<|assistant|>", image, *more, *named.values()]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tk.train_from_iterator(CORPUS, trainer)
    end, named = "<|endoftext|>", {"image_token": image, **named}
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=end, eos_token=end,
                                   pad_token=end, extra_special_tokens=named)  # fmt: skip


def _text(tok: Any, **more: Any) -> dict:
    return {**TEXT, "vocab_size": len(tok), **more}


def _llava(local: bool):
    import transformers as tf

    tok = tokenizer("<image>")
    vision = dict(model_type="clip_vision_model", hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=37, image_size=84,
                  patch_size=14)  # fmt: skip
    config = tf.LlavaConfig(text_config=dict(model_type="llama", **_text(tok)),
                            vision_config=vision,
                            image_token_id=tok.convert_tokens_to_ids("<image>"))  # fmt: skip
    images = tf.CLIPImageProcessorPil(size={"shortest_edge": 84},
                                      crop_size={"height": 84, "width": 84})  # fmt: skip
    processor = tf.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=14,
                                  vision_feature_select_strategy="default",
                                  num_additional_image_tokens=1,
                                  chat_template=TEMPLATE.replace("IMAGE", "<image>"))  # fmt: skip
    return tf.LlavaForConditionalGeneration(config), processor


def _llava_next(local: bool):
    """LLaVA-NeXT: 3 × 3 cells a tile; the pinpoints make the tests' wide pictures padded
    (1 × 3 tiles over 128 × 64: a column of cells dropped each side)."""
    import transformers as tf

    tok = tokenizer("<image>")
    vision = dict(model_type="clip_vision_model", hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=37, image_size=42,
                  patch_size=14)  # fmt: skip
    pins = [[42, 126], [84, 84], [126, 42]]
    template = TEMPLATE.replace("IMAGE", "<image>")
    config = tf.LlavaNextConfig(text_config=dict(model_type="llama", **_text(tok)),
                                vision_config=vision, image_grid_pinpoints=pins,
                                image_token_index=tok.convert_tokens_to_ids("<image>"))  # fmt: skip
    images = tf.LlavaNextImageProcessorPil(size={"shortest_edge": 42}, image_grid_pinpoints=pins,
                                           crop_size={"height": 42, "width": 42})  # fmt: skip
    processor = tf.LlavaNextProcessor(images, tok, patch_size=14, chat_template=template,
                                      vision_feature_select_strategy="default",
                                      num_additional_image_tokens=1)  # fmt: skip
    return tf.LlavaNextForConditionalGeneration(config), processor


def _idefics3(kind: str):
    """Idefics3 and SmolVLM: sub-images of 84 pixels, 6 × 6 patches shuffled 2 × 2 into
    3 × 3 tokens; the tests' 128 × 64 picture is cut into 1 × 2 of them and a global image.
    SmolVLM's own processor needs num2words (not installable here) and a video processor
    (torchvision): its model is saved with Idefics3's processor, which writes its image
    tokens the same way."""

    def build(local: bool):
        import transformers as tf

        tags = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        tok = tokenizer("<image>", "<fake_token_around_image>", "<global-img>",
                        "<end_of_utterance>", *tags)  # fmt: skip
        vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, image_size=84, patch_size=14)  # fmt: skip
        text, image = dict(model_type="llama", **_text(tok)), tok.convert_tokens_to_ids("<image>")
        config = tf.AutoConfig.for_model(kind, text_config=text, vision_config=vision,
                                         scale_factor=2, image_token_id=image)  # fmt: skip
        images = tf.Idefics3ImageProcessorPil(size={"longest_edge": 168},
                                              max_image_size={"longest_edge": 84})  # fmt: skip
        template = TEMPLATE.replace("IMAGE", "<image>")
        processor = tf.Idefics3Processor(images, tok, image_seq_len=9, chat_template=template)
        return tf.AutoModelForImageTextToText.from_config(config), processor

    return build


def _qwen(kind: str):
    def build(local: bool):
        import transformers as tf

        from attnviz.core.vlm import _without_video

        tok = tokenizer("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
        ids = {name: tok.convert_tokens_to_ids(f"<|{name}|>")
               for name in ("image_pad", "vision_start", "vision_end")}  # fmt: skip
        text = _text(tok, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
        vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                      in_chans=3, mlp_ratio=2)  # fmt: skip
        if kind == "qwen2_5_vl":
            vision = dict(depth=2, hidden_size=32, out_hidden_size=32,
                          num_heads=4, intermediate_size=37, patch_size=14, window_size=56,
                          fullatt_block_indexes=[1], spatial_merge_size=2,
                          temporal_patch_size=2)  # fmt: skip
        patch = 14
        if kind == "qwen3_vl":  # 16-pixel patches, a learnt position grid, deepstack
            patch, text = 16, _text(tok, rope_parameters={"rope_type": "default",
                                                          "mrope_section": [1, 1, 2],
                                                          "mrope_interleaved": True})  # fmt: skip
            vision = dict(depth=2, hidden_size=32, out_hidden_size=32, num_heads=4,
                          intermediate_size=37, patch_size=16, spatial_merge_size=2,
                          temporal_patch_size=2, num_position_embeddings=16,
                          deepstack_visual_indexes=[0])  # fmt: skip
        config = tf.AutoConfig.for_model(kind, text_config=dict(model_type=f"{kind}_text", **text),
                                         vision_config=vision, image_token_id=ids["image_pad"],
                                         vision_start_token_id=ids["vision_start"],
                                         vision_end_token_id=ids["vision_end"])  # fmt: skip
        merged = 2 * patch  # a token's side in pixels
        images = tf.Qwen2VLImageProcessorPil(patch_size=patch, min_pixels=4 * merged * merged,
                                             max_pixels=merged * merged * 16)  # fmt: skip
        names = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                 "qwen3_vl": "Qwen3VLProcessor"}  # fmt: skip
        cls = _without_video(getattr(tf, names[kind]))
        template = TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
        processor = cls(image_processor=images, tokenizer=tok, chat_template=template)
        return tf.AutoModelForImageTextToText.from_config(config), processor

    return build


def _paligemma(local: bool):
    """PaliGemma: no chat template (its processor puts the image tokens and BOS first)."""
    import transformers as tf

    tok = tokenizer("<image>")
    vision = dict(model_type="siglip_vision_model", hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=37, image_size=56,
                  patch_size=14)  # fmt: skip
    text = dict(model_type="gemma", **{k: v for k, v in _text(tok).items()})
    config = tf.PaliGemmaConfig(text_config=text, vision_config=vision, projection_dim=32,
                                image_token_index=tok.convert_tokens_to_ids("<image>"))  # fmt: skip
    images = tf.SiglipImageProcessorPil(size={"height": 56, "width": 56})
    images.image_seq_length = 16
    processor = tf.PaliGemmaProcessor(image_processor=images, tokenizer=tok)
    return tf.PaliGemmaForConditionalGeneration(config), processor


def _gemma3(local: bool):
    """Gemma 3: 8 × 8 patches of 7 pixels pooled 2 × 2 into 4 × 4 image tokens, between its
    start and end of image."""
    import transformers as tf

    tok = tokenizer("<image_soft_token>", boi_token="<start_of_image>",
                    eoi_token="<end_of_image>")  # fmt: skip
    vision = dict(model_type="siglip_vision_model", hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=37, image_size=56,
                  patch_size=7)  # fmt: skip
    ids = {name: tok.convert_tokens_to_ids(getattr(tok, name)) for name in
           ("image_token", "boi_token", "eoi_token")}  # fmt: skip
    config = tf.Gemma3Config(text_config=dict(model_type="gemma3_text", **_text(tok)),
                             vision_config=vision, mm_tokens_per_image=16,
                             image_token_index=ids["image_token"],
                             boi_token_index=ids["boi_token"],
                             eoi_token_index=ids["eoi_token"])  # fmt: skip
    images = tf.Gemma3ImageProcessorPil(size={"height": 56, "width": 56})
    template = TEMPLATE.replace("IMAGE", "<start_of_image>")
    processor = tf.Gemma3Processor(images, tok, chat_template=template, image_seq_length=16)
    return tf.Gemma3ForConditionalGeneration(config), processor


def _mllama(local: bool):
    """Mllama: the picture cut into up to 2 tiles of 4 × 4 patches, read by the language
    model's cross-attention layer 1 (of 3), not as tokens of the prompt."""
    import transformers as tf

    tok = tokenizer("<|image|>", "<|python_tag|>")
    vision = dict(hidden_size=32, num_hidden_layers=2, num_global_layers=1,
                  num_attention_heads=4, intermediate_size=37, image_size=28, patch_size=7,
                  max_num_tiles=2, supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
                  intermediate_layers_indices=[0], vision_output_dim=64)  # fmt: skip
    text = _text(tok, cross_attention_layers=[1], num_hidden_layers=3, pad_token_id=0)
    config = tf.MllamaConfig(vision_config=vision, text_config=text,
                             image_token_index=tok.convert_tokens_to_ids("<|image|>"))  # fmt: skip
    images = tf.MllamaImageProcessorPil(size={"height": 28, "width": 28}, max_image_tiles=2)
    template = TEMPLATE.replace("IMAGE", "<|image|>")
    processor = tf.MllamaProcessor(images, tok, chat_template=template)
    return tf.MllamaForConditionalGeneration(config), processor


BUILDERS = {
    "paligemma": _paligemma,
    "gemma3": _gemma3,
    "mllama": _mllama,
    "llava": _llava,
    "llava_next": _llava_next,
    "qwen2_vl": _qwen("qwen2_vl"),
    "qwen2_5_vl": _qwen("qwen2_5_vl"),
    "qwen3_vl": _qwen("qwen3_vl"),
    "idefics3": _idefics3("idefics3"),
    "smolvlm": _idefics3("smolvlm"),
}
FAMILIES = tuple(BUILDERS)
CROSS = ("mllama",)  # the families whose picture is read by cross-attention, not as tokens
LAID = tuple(kind for kind in FAMILIES if kind not in CROSS)  # the others: a layout each


# A vision tower's attention output projections (CLIP's, SigLIP's, Qwen2-VL's): what mixes
# one patch's features with the others'.
MIXING = (".self_attn.out_proj.", ".attn.proj.")


def save(model_type: str, folder: Path, local: bool = False) -> Path:
    """A tiny random `model_type` and its processor, saved in `folder`."""
    import torch

    torch.manual_seed(0)
    model, processor = BUILDERS[model_type](local)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.3)
        for name, parameter in model.named_parameters():
            if local and any(part in name for part in MIXING):
                parameter.zero_()
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def picture(path: Path, size: tuple[int, int] = (64, 48), seed: int = 0) -> Path:
    """A random RGB picture of `size` (width, height), saved as PNG at `path`."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def eager(folder: Path, ids: list[int], inputs: dict, cross: bool = False) -> Any:
    """The language model's own probabilities (eager `output_attentions`) over `ids` with
    the processor's other `inputs`, (L, H, T, T) float32: what attnviz's numbers are held to;
    Mllama's self-attention layers alone (its cross-attention layers' keys are the picture's
    states), or with `cross` its cross-attention layers alone, (L, H, T, S) over the
    picture's keys. Per-token inputs shorter than `ids` (a prompt's, before its
    continuation) are extended."""
    import numpy as np
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager").eval()
    extended = {}
    suffix = int(model.config.model_type == "paligemma")
    for name, value in inputs.items():
        more = len(ids) - value.shape[1] if value.dim() >= 2 else 0
        if more > 0 and name.endswith("token_type_ids"):
            # what `generate` writes is read causally: PaliGemma's suffix (type 1), the others'
            # text (type 0, where 1 marks an image, read both ways: Gemma 3's)
            types = torch.full((1, more), suffix * (name == "token_type_ids"))
            value = torch.cat([value, types.to(value.dtype)], dim=1)
        elif more > 0 and name == "cross_attention_mask":  # Mllama's: the last token's
            value = torch.cat([value] + [value[:, -1:]] * more, dim=1)
        extended[name] = value
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, **extended)
    crossing = getattr(model.config.get_text_config(), "cross_attention_layers", None) or ()
    return np.stack([layer[0].float().numpy() for i, layer in enumerate(out.attentions)
                     if (i in crossing) == cross])  # fmt: skip


def tower_eager(folder: Path, ids: list[int], inputs: dict) -> list[Any]:
    """The vision tower's own probabilities, each layer's (B, H, N, N) float32 over each of
    the tower's sequences (batch rows), from the eager attention function of its attention
    modules' own modelling file (transformers' `eager_attention_forward`, as the module
    calls it), in a pass of the whole model over `ids` and the processor's `inputs`. A
    layer run in several calls (Qwen2.5-VL's windows) is its calls put together along the
    diagonal, 0 between them (where the model computes nothing)."""
    import sys

    import numpy as np
    import torch
    from transformers import AttentionInterface, AutoModelForImageTextToText
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    calls: list[tuple[Any, Any]] = []  # (module, its probabilities), in the pass's order

    def kept(module, query, key, value, attention_mask, **kwargs):
        own = sys.modules[type(module).__module__].eager_attention_forward
        output, probs = own(module, query, key, value, attention_mask, **kwargs)
        calls.append((module, probs.detach().float()))
        return output, probs

    AttentionInterface.register("eager_kept", kept)
    AttentionMaskInterface.register("eager_kept", eager_mask)
    model = AutoModelForImageTextToText.from_pretrained(
        folder, attn_implementation={"vision_config": "eager_kept", "text_config": "eager",
                                     "": "eager"})  # fmt: skip
    with torch.no_grad():
        model.eval()(input_ids=torch.tensor([ids]), **inputs)
    layers: dict[int, list[Any]] = {}  # id(module): its calls, in order
    for module, probs in calls:
        layers.setdefault(id(module), []).append(probs)
    found = []
    for pieces in layers.values():
        batch, heads = pieces[0].shape[:2]
        n = sum(piece.shape[-1] for piece in pieces)
        whole = np.zeros((batch, heads, n, n), np.float32)
        at = 0
        for piece in pieces:
            w = piece.shape[-1]
            whole[:, :, at : at + w, at : at + w] = piece.numpy()
            at += w
        found.append(whole)
    return found


def input_of(loaded: Any, module: Any, image: Any, prompt: str, take: Any) -> Any:
    """What `module` of `loaded`'s model reads when the model reads `prompt` about `image` in
    one plain pass: `take(args, kwargs)` of its forward's arguments, at its last call."""
    import torch

    from attnviz.core import vlm
    from attnviz.core.tokens import pad

    caught = {}

    def catch(_module: Any, args: Any, kwargs: Any) -> None:
        caught["input"] = take(args, kwargs)

    hook = module.register_forward_pre_hook(catch, with_kwargs=True)
    try:
        with torch.no_grad():
            loaded.model.base_model(**pad(loaded, [vlm.encode(loaded, image, prompt)]))
    finally:
        hook.remove()
    return caught["input"]
