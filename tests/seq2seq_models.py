"""Tiny random encoder-decoder models (T5, mT5, BART, mBART, Marian), each saved with a real
tokenizer: no pretrained encoder-decoder is on the package registries."""

from __future__ import annotations

from pathlib import Path

SEQ2SEQ = ("t5", "mt5", "bart", "mbart", "marian")
CORPUS = ["The cat sat on the mat.", "Die Katze saß auf der Matte.", "A quick brown fox!"] * 10


def _sentencepiece_t5():
    """A T5-style tokenizer trained in memory: '▁' marks word starts, </s> closes a text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"])
    tk.train_from_iterator(CORPUS, trainer)
    tk.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tk.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        model_max_length=64,
    )  # fmt: skip


def _byte_level_bart():
    """A BART-style byte-level BPE tokenizer: <s> text </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(CORPUS, trainer)
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", tk.token_to_id("<s>")), ("</s>", tk.token_to_id("</s>"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
        unk_token="<unk>", model_max_length=64,
    )  # fmt: skip


def _wordpiece():
    from transformers import AutoTokenizer

    from attnviz.core.models import bundled_model_path

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    tokenizer.model_max_length = 64
    return tokenizer


def tiny_seq2seq(arch: str, folder: Path) -> Path:
    """Save a tiny random `arch` model with its tokenizer in `folder`; 2 encoder layers of 4
    heads, 3 decoder layers of 2 heads (T5: 4), positions up to 64."""
    import torch
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
        MBartConfig,
        MBartForConditionalGeneration,
        MT5Config,
        MT5ForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    if arch in ("t5", "mt5"):
        tokenizer = _sentencepiece_t5()
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        config = (T5Config if arch == "t5" else MT5Config)(
            vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2,
            num_decoder_layers=3, num_heads=4, relative_attention_num_buckets=8,
            relative_attention_max_distance=20, dropout_rate=0.0, pad_token_id=pad,
            eos_token_id=eos, decoder_start_token_id=pad, feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
        )  # fmt: skip
        model = (T5ForConditionalGeneration if arch == "t5" else MT5ForConditionalGeneration)(
            config
        )
    elif arch in ("bart", "mbart"):
        tokenizer = _byte_level_bart()
        common = dict(
            vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=3,
            encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=37,
            decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=None,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        )  # fmt: skip
        if arch == "bart":
            model = BartForConditionalGeneration(BartConfig(**common))
        else:
            model = MBartForConditionalGeneration(MBartConfig(**common, scale_embedding=True))
    else:
        tokenizer = _wordpiece()
        config = MarianConfig(
            vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=32,
            encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
            decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37,
            max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=tokenizer.pad_token_id,
            forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, scale_embedding=True, share_encoder_decoder_embeddings=True,
        )  # fmt: skip
        model = MarianMTModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
