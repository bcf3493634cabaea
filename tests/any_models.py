"""Tiny random models of many transformers model types, built from configs, for tests that
check attnviz's attention recording against each model's eager `output_attentions`.

- TYPES: model type → config overrides for a tiny model (2 layers, hidden size 32, 4 heads,
  or 4 query / 2 key-value heads where the type has grouped-query attention; vocab 128;
  4 experts top-2 for mixture-of-experts types). Each of them sends its attention through
  transformers' `AttentionInterface` (checked: a function registered there is called once
  a layer and stack, and returns the eager probabilities).
- BYPASS: model types whose attention does not go through `AttentionInterface` in the
  installed transformers, with why (Falcon's does from 5.25 on); `build` and `save` make them
  too, from BYPASS_CONFIGS.
- STACKS: the attention stacks of the encoder-decoder types.
- SDPA: the types of TYPES that accept `model.set_attn_implementation("sdpa")`.
- build(model_type): the base model (no head), eval mode, float32, eager attention, its
  weight matrices drawn with std SPREAD so that attention rows are far from uniform.
- inputs(model_type, model): its forward kwargs, 2 rows of LENGTH tokens, the second
  right-padded by PADDING.

Sliding-window types get a window of WINDOW tokens, shorter than a row, with some layers
sliding and some full where the config says which; Gemma 2 style types soft-cap their scores.
gpt-oss adds a learned sink logit to each head's softmax and drops it after, so its rows sum
to less than 1. Whisper's encoder takes no attention mask: only its decoder rows are padded.
"""

from __future__ import annotations

from typing import Any

import transformers
from packaging.version import Version

LENGTH = 10  # tokens a row (encoder-decoders: LENGTH - 2 decoder tokens)
PADDING = 3  # pad tokens at the end of the second row
WINDOW = 4  # sliding windows: shorter than LENGTH, longer than PADDING (no row sees no key)
SPREAD = 0.3  # std of every weight matrix (see build)
SLIDING_FULL = ["sliding_attention", "full_attention"]

# fmt: off
# Llama-style decoders: 4 query heads, 2 key-value heads of 8 dimensions
_LLAMA = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
_MHA = {**_LLAMA, "num_key_value_heads": 4}  # the same without grouped-query attention
_PARTIAL_ROPE = {"rope_parameters": {
    "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
}}
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)
_GEMMA2 = {
    **_LLAMA, "sliding_window": WINDOW, "layer_types": SLIDING_FULL, "query_pre_attn_scalar": 8,
    "attn_logit_softcapping": 20.0,  # moves the probabilities by about 0.04
}
_GPT2 = dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
             eos_token_id=2)
_BERT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)
_BART = dict(
    vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
    max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    decoder_start_token_id=2, forced_eos_token_id=2,
)
_PAD0 = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
             forced_eos_token_id=2)
_T5 = dict(
    vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
    num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
)

TYPES: dict[str, dict[str, Any]] = {
    # encoders
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "camembert": _BERT,
    "roberta-prelayernorm": _BERT,
    "xlm-roberta-xl": _BERT,
    "data2vec-text": _BERT,
    "ernie": _BERT,
    "bert-generation": _BERT,
    "esm": {**_BERT, "pad_token_id": 1, "mask_token_id": 3, "position_embedding_type": "rotary"},
    "electra": {**_BERT, "embedding_size": 16},
    "albert": {**_BERT, "embedding_size": 16},
    "distilbert": dict(vocab_size=128, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                       max_position_embeddings=64),
    "mobilebert": {**_BERT, "embedding_size": 16, "intra_bottleneck_size": 16,
                   "true_hidden_size": 16, "num_feedforward_networks": 1},
    "nomic_bert": {**_BERT, "head_dim": 8},
    "eurobert": {**_LLAMA, "mask_token_id": 3},
    # ModernBERT: layer 0 full, layer 1 local, ±3 tokens (local_attention // 2); at ±2 the
    # last pad query would see no key, a row eager spreads evenly over all 10 keys
    "modernbert": {
        **_BERT, "local_attention": 6, "global_attn_every_n_layers": 2,
        "layer_types": ["full_attention", "sliding_attention"], "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2,
    },
    # decoders
    "gpt2": _GPT2,
    "gptj": {**_GPT2, "rotary_dim": 4},
    "gpt_bigcode": {**_GPT2, "multi_query": True},
    "codegen": {**_GPT2, "n_ctx": 64, "rotary_dim": 4},
    "gpt_neox": {**_MHA, **_PARTIAL_ROPE},
    "opt": dict(vocab_size=128, hidden_size=32, ffn_dim=64, word_embed_proj_dim=32,
                num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64),
    "biogpt": {**_BERT, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
    "llama": _LLAMA,
    "mistral": {**_LLAMA, "sliding_window": WINDOW},  # every layer sliding
    "ministral": {**_LLAMA, "sliding_window": WINDOW, "layer_types": SLIDING_FULL},
    "mixtral": {**_LLAMA, **_MOE, "sliding_window": WINDOW},
    # Qwen: the layers from max_window_layers on slide
    "qwen2": {**_LLAMA, "use_sliding_window": True, "sliding_window": WINDOW,
              "max_window_layers": 1},
    "qwen3": {**_LLAMA, "use_sliding_window": True, "sliding_window": WINDOW,
              "max_window_layers": 1},
    "qwen2_moe": {**_LLAMA, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32},
    "qwen3_moe": {**_LLAMA, **_MOE, "moe_intermediate_size": 32},
    "gemma": _LLAMA,
    "gemma2": _GEMMA2,
    "vaultgemma": _GEMMA2,
    # Gemma 3's config has attn_logit_softcapping, but its attention passes no softcap on
    "gemma3_text": {**_LLAMA, "sliding_window": WINDOW, "layer_types": SLIDING_FULL,
                    "query_pre_attn_scalar": 8},
    "phi": {**_MHA, **_PARTIAL_ROPE},
    "phi3": {**_LLAMA, "sliding_window": WINDOW, "original_max_position_embeddings": 64},
    "phimoe": {**_LLAMA, **_MOE, "sliding_window": WINDOW},
    "olmo": _MHA,
    "olmo2": _MHA,
    "olmo3": {**_LLAMA, "sliding_window": WINDOW, "layer_types": SLIDING_FULL},
    "olmoe": {**_LLAMA, "num_experts": 4, "num_experts_per_tok": 2},
    "smollm3": {**_LLAMA, "no_rope_layers": [1, 0], "use_sliding_window": True,
                "sliding_window": WINDOW, "layer_types": SLIDING_FULL},
    "gpt_oss": {**_LLAMA, **_MOE, "sliding_window": WINDOW, "layer_types": SLIDING_FULL,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "starcoder2": {**_LLAMA, "sliding_window": WINDOW},
    "stablelm": {**_MHA, **_PARTIAL_ROPE},
    "persimmon": {**_MHA, **_PARTIAL_ROPE},
    "nemotron": {**_LLAMA, **_PARTIAL_ROPE},
    "cohere": _LLAMA,
    "cohere2": {**_LLAMA, "sliding_window": WINDOW, "layer_types": SLIDING_FULL},
    "granite": {**_LLAMA, "attention_multiplier": 0.25},
    "granitemoe": {**_LLAMA, **_MOE, "attention_multiplier": 0.25},
    "granitemoeshared": {**_LLAMA, **_MOE, "shared_intermediate_size": 32},
    # JetMoE: a mixture of attention heads, 2 key-value heads × top-2 experts = 4 query heads
    "jetmoe": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_key_value_heads=2, kv_channels=8, max_position_embeddings=64,
                   num_local_experts=4, num_experts_per_tok=2),
    "helium": _LLAMA,
    "glm": _LLAMA,
    "glm4": _LLAMA,
    "exaone4": {**_LLAMA, "sliding_window": WINDOW, "layer_types": SLIDING_FULL},
    # multi-head latent attention: q·k over 4 + 4 dimensions (head_dim: the rotary part's)
    "deepseek_v3": {
        **_MHA, "head_dim": 4, "n_routed_experts": 4, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
        "n_group": 1, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 16,
        "qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 8,
    },
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig does not define,
    # and clamps q, k, v by clip_qkv, which fails at its default None
    "dbrx": dict(vocab_size=128, d_model=32, n_layers=2, n_heads=4, max_seq_len=64,
                 attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                 ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
                 pad_token_id=0),
    "arcee": _LLAMA,
    "seed_oss": _LLAMA,
    "hunyuan_v1_dense": _LLAMA,
    "ernie4_5": _LLAMA,
    "bitnet": _LLAMA,
    # encoder-decoders
    "t5": _T5,
    "mt5": _T5,
    "umt5": _T5,
    "switch_transformers": {**_T5, "num_experts": 4, "expert_capacity": 16,
                            "num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1},
    "t5gemma": dict(encoder=_GEMMA2, decoder=_GEMMA2, vocab_size=128),  # Gemma 2 layers
    "bart": _BART,
    "mbart": _BART,
    "plbart": _BART,
    "marian": {**_BART, "decoder_vocab_size": 128, "eos_token_id": 0,
               "decoder_start_token_id": 1, "forced_eos_token_id": 0},
    "m2m_100": _BART,
    "pegasus": {**_BART, **_PAD0, "eos_token_id": 1, "decoder_start_token_id": 0,
                "forced_eos_token_id": 1},
    "blenderbot": {**_BART, **_PAD0},
    "blenderbot-small": {**_BART, **_PAD0},
    "nllb-moe": {**_BART, "num_experts": 4, "expert_capacity": 16, "encoder_sparse_step": 2,
                 "decoder_sparse_step": 2},
    # Whisper: 8 mel bins × 32 frames, which its convolutions halve to 16 positions
    "whisper": {**_BART, **_PAD0, "num_mel_bins": 8, "max_source_positions": 16,
                "max_target_positions": 64, "begin_suppress_tokens": None},
}

# Each computes its probabilities in its own code, not through AttentionInterface:
# `set_attn_implementation` leaves them eager (with a warning), and a function registered
# there is never called.
BYPASS: dict[str, str] = {
    "bloom": "BloomAttention: ALiBi scores by baddbmm, its own softmax",
    "falcon": "FalconAttention: its own softmax, or torch's SDPA called directly",
    "mpt": "MptAttention: ALiBi bias, its own softmax",
    "gpt_neo": "GPTNeoSelfAttention._attn: its own local/global masks and softmax",
    "xglm": "XGLMAttention: a fairseq-style module, bmm and its own softmax",
    "deberta-v2": "DisentangledSelfAttention: content-position terms, its own softmax",
    "mpnet": "MPNetSelfAttention: a relative position bias, its own softmax",
    "roformer": "RoFormerSelfAttention: rotary q and k, its own softmax",
    "fsmt": "fsmt.Attention: fairseq's multi-head attention, its own softmax",
    "longformer": "LongformerSelfAttention: a band of keys around each query, its own softmax",
}
if Version(transformers.__version__) >= Version("5.25"):  # Falcon's moved onto the interface
    del BYPASS["falcon"]
BYPASS_CONFIGS: dict[str, dict[str, Any]] = {
    "bloom": dict(vocab_size=128, hidden_size=32, n_layer=2, n_head=4),
    "falcon": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=64, ffn_hidden_size=64, bos_token_id=1,
                   eos_token_id=2),
    "mpt": dict(vocab_size=128, d_model=32, n_heads=4, n_layers=2, max_seq_len=64),
    "gpt_neo": dict(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                    attention_types=[[["global", "local"], 1]], window_size=WINDOW,
                    max_position_embeddings=64, bos_token_id=1, eos_token_id=2),
    "xglm": dict(vocab_size=128, d_model=32, ffn_dim=64, num_layers=2, attention_heads=4,
                 max_position_embeddings=64),
    "deberta-v2": {**_BERT, "relative_attention": True, "pos_att_type": ["c2p", "p2c"],
                   "position_buckets": 8, "max_relative_positions": 16},
    "mpnet": _BERT,  # compute_position_bias assumes the default 32 buckets
    "roformer": {**_BERT, "embedding_size": 32},
    # FSMT builds its decoder's causal and padding masks only when it keeps no cache
    "fsmt": dict(src_vocab_size=128, tgt_vocab_size=128, d_model=32, encoder_layers=2,
                 decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 langs=["en", "de"], pad_token_id=1, bos_token_id=0, eos_token_id=2,
                 decoder_start_token_id=2, forced_eos_token_id=2, use_cache=False),
    "longformer": {**_BERT, "attention_window": WINDOW, "pad_token_id": 0,
                   "max_position_embeddings": 70},  # positions start after the pad id
}

STACKS: dict[str, tuple[str, ...]] = {
    name: ("encoder", "decoder", "cross")
    for name in (
        "t5", "mt5", "umt5", "switch_transformers", "t5gemma", "bart", "mbart", "plbart",
        "marian", "m2m_100", "pegasus", "blenderbot", "blenderbot-small", "nllb-moe",
        "whisper", "fsmt",
    )
}
# fmt: on

# set_attn_implementation("sdpa") raises a ValueError for the rest: soft caps (Gemma 2,
# VaultGemma, T5Gemma) and sinks (gpt-oss) SDPA cannot do, and two MoE encoder-decoders
# that never declared SDPA support.
SDPA: set[str] = set(TYPES) - {
    "gemma2", "vaultgemma", "t5gemma", "gpt_oss", "switch_transformers", "nllb-moe",
}  # fmt: skip


def build(model_type: str):
    """A tiny random `model_type` base model (of TYPES or BYPASS): eval mode, float32,
    eager attention, the same weights every time."""
    import torch
    from transformers import AutoConfig, AutoModel

    overrides = TYPES[model_type] if model_type in TYPES else BYPASS_CONFIGS[model_type]
    config = AutoConfig.for_model(model_type, **overrides)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager", dtype=torch.float32)
    # Every matrix redrawn with std SPREAD: at the configs' 0.02 an encoder's rows are all
    # but uniform, and scaling, soft caps or position biases would hardly change them.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, SPREAD)
    return model.eval()


def inputs(model_type: str, model) -> dict[str, Any]:
    """The forward kwargs of `model` (from `build(model_type)`): 2 rows of LENGTH random
    tokens, the second right-padded by PADDING (pad ids, attention_mask 0); encoder-decoders
    also get LENGTH - 2 decoder tokens padded the same way; Whisper gets mel features (no
    mask: its encoder takes none) and the decoder tokens."""
    import torch

    config = model.config
    generator = torch.Generator().manual_seed(0)
    vocab = getattr(config, "src_vocab_size", None) or config.vocab_size  # FSMT: two vocabs
    pad = getattr(config, "pad_token_id", None) or 0  # CodeGenConfig has none

    def tokens(length: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(4, vocab, (2, length), generator=generator)  # no special ids
        mask = torch.ones(2, length, dtype=torch.long)
        ids[1, length - PADDING :] = pad
        mask[1, length - PADDING :] = 0
        return ids, mask

    kwargs: dict[str, Any] = {}
    if model_type == "whisper":
        frames = 2 * config.max_source_positions
        kwargs["input_features"] = torch.randn(2, config.num_mel_bins, frames, generator=generator)
    else:
        kwargs["input_ids"], kwargs["attention_mask"] = tokens(LENGTH)
    if model_type in STACKS:
        kwargs["decoder_input_ids"], kwargs["decoder_attention_mask"] = tokens(LENGTH - 2)
    return kwargs


def save(kind: str, loader: Any, tokenizer: Any, folder: Any, **overrides: Any) -> str:
    """A tiny random `kind` model made by `loader` (AutoModelForCausalLM, …) with TYPES' (or
    BYPASS_CONFIGS') config and `overrides`, its matrices drawn with std SPREAD as `build`
    draws them, saved with `tokenizer` into `folder` as a user's checkpoint is: the folder,
    as a string."""
    import torch
    from transformers import AutoConfig

    given = TYPES[kind] if kind in TYPES else BYPASS_CONFIGS[kind]
    config = AutoConfig.for_model(kind, **{**given, **overrides})
    torch.manual_seed(0)
    model = loader.from_config(config)
    with torch.no_grad():  # scores far from uniform
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, SPREAD)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
