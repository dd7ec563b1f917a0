"""Tiny randomly initialised checkpoints, with real tokenizers, built without any network.

Each ``build_*`` writes a complete transformers checkpoint (config, safetensors weights,
tokenizer files) into a directory and returns its path, ready for ``mha_core.load_model(path)``.
They take a second or less, so tests can build them in ``tmp_path`` (or once per session with
``tmp_path_factory``).

    build_tiny_bert        BertConfig + WordPiece tokenizer (vocab.txt written here)
    build_tiny_mpnet       MPNetConfig (relative position bias) + the same WordPiece tokenizer
    build_tiny_distilbert  DistilBertConfig + the same WordPiece tokenizer
    build_tiny_roberta     RobertaConfig + byte-level BPE with <s> ... </s></s> ... </s> pairs
    build_tiny_gpt2        GPT2Config + byte-level BPE trained here with the tokenizers library
    build_tiny_llama       LlamaConfig with grouped-query attention (4 query heads, 2 KV heads) + byte-level BPE
    build_tiny_mamba       MambaConfig: a model with no attention at all, for the error path
    build_tiny_t5          T5ForConditionalGeneration (relative position buckets; gated=True: T5 v1.1's FFN)
    build_tiny_bart        BartForConditionalGeneration (learned positions from row 2)
    build_tiny_marian      MarianMTModel (sinusoidal positions, scaled embeddings); all three with byte-level BPE
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

CORPUS = [
    "The cat sat on the mat.",
    "A dog chased the cat across the garden.",
    "The keys to the cabinet are on the table.",
    "She said that he would come tomorrow.",
    "Attention heads look at other tokens in the sentence.",
    "Unbelievable results surprised everyone!",
    "It was the best of times, it was the worst of times.",
    "Transformers compute attention weights.",
    "The quick brown fox jumps over the lazy dog.",
    "Where did you put the book?",
]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDPIECE_WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "a",
    "dog",
    "keys",
    "to",
    "cabinet",
    "are",
    "table",
    "she",
    "said",
    "that",
    "he",
    "would",
    "come",
    "attention",
    "heads",
    "look",
    "at",
    "other",
    "in",
    "sentence",
    "un",
    "##believ",
    "##able",
    "result",
    "##s",
    "it",
    "was",
    "best",
    "of",
    "times",
    "where",
    "did",
    "you",
    "put",
    "book",
    "play",
    "##ing",
    "##ed",
    ".",
    ",",
    "!",
    "?",
    "'",
]


def wordpiece_vocab() -> list[str]:
    """Specials, a few whole words and ``##`` continuations, then single letters and digits so nothing is [UNK]."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = WORDPIECE_SPECIALS + WORDPIECE_WORDS + letters + ["##" + ch for ch in letters]
    return list(dict.fromkeys(vocab))


def save_wordpiece_tokenizer(path: Path, model_max_length: int = 64):
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(wordpiece_vocab()) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(path / "vocab.txt"), model_max_length=model_max_length)
    tokenizer.save_pretrained(path)
    return tokenizer


@cache
def byte_level_bpe(specials: tuple[str, ...], vocab_size: int = 400) -> tuple[dict, list]:
    """``(vocab, merges)`` of a byte-level BPE trained on ``CORPUS``; ``specials`` take the first ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 3, trainer=trainer)
    import json

    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return dict(model["vocab"]), merges


def save_gpt2_tokenizer(path: Path, model_max_length: int = 64):
    from transformers import GPT2TokenizerFast

    vocab, merges = byte_level_bpe(("<|endoftext|>",))
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=merges, model_max_length=model_max_length)
    tokenizer.save_pretrained(path)
    return tokenizer


def save_roberta_tokenizer(path: Path, model_max_length: int = 64):
    from transformers import RobertaTokenizerFast

    vocab, merges = byte_level_bpe(("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
    tokenizer = RobertaTokenizerFast(vocab=vocab, merges=merges, model_max_length=model_max_length)
    tokenizer.save_pretrained(path)
    return tokenizer


def _save(path: Path, model) -> Path:
    model.eval().save_pretrained(path)  # safetensors by default
    return path


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    """Weights large enough for sharp, varied attention (the default 0.02 init gives near-uniform rows)."""
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() >= 2:
                param.copy_(noise * (1.0 if "emb" in name or "wte" in name or "wpe" in name else 0.3))
            elif "norm" in name.lower() or "ln_" in name:
                param.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
            else:
                param.copy_(0.1 * noise)
    return model.eval()


def _seeded(model_class, config):
    torch.manual_seed(0)
    return model_class(config)


def _save_new(path: Path, model_class, config, randomised: bool = False) -> Path:
    """A new seeded model saved to ``path``; ``randomised``: with ``randomise``'s sharper weights."""
    model = _seeded(model_class, config)
    return _save(path, randomise(model) if randomised else model)


def build_tiny_bert(path, max_positions: int = 64, head: bool = False, randomised: bool = False, **overrides) -> Path:
    """``head``: with its masked-LM head (BertForMaskedLM)."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    path = Path(path)
    tokenizer = save_wordpiece_tokenizer(path, model_max_length=max_positions)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        **overrides,
    )
    return _save_new(path, BertForMaskedLM if head else BertModel, config, randomised)


def build_tiny_mpnet(path, max_positions: int = 64, **overrides) -> Path:
    """MPNetConfig (relative position bias) with the WordPiece tokenizer (MPNet's own is WordPiece too)."""
    from transformers import MPNetConfig, MPNetModel

    path = Path(path)
    tokenizer = save_wordpiece_tokenizer(path, model_max_length=max_positions)
    config = MPNetConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_positions + 2,
        **overrides,
    )
    return _save(path, _seeded(MPNetModel, config))


def build_tiny_distilbert(path, max_positions: int = 64, **overrides) -> Path:
    from transformers import DistilBertConfig, DistilBertModel

    path = Path(path)
    tokenizer = save_wordpiece_tokenizer(path, model_max_length=max_positions)
    config = DistilBertConfig(
        vocab_size=len(tokenizer),
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=max_positions,
        **overrides,
    )
    return _save(path, _seeded(DistilBertModel, config))


def build_tiny_roberta(path, max_positions: int = 64, **overrides) -> Path:
    from transformers import RobertaConfig, RobertaModel

    path = Path(path)
    tokenizer = save_roberta_tokenizer(path, model_max_length=max_positions)
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=max_positions + 2,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
        **overrides,
    )
    return _save(path, _seeded(RobertaModel, config))


def build_tiny_gpt2(path, max_positions: int = 64, head: bool = False, randomised: bool = False, **overrides) -> Path:
    """``head``: with its (tied) LM head (GPT2LMHeadModel)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    path = Path(path)
    tokenizer = save_gpt2_tokenizer(path, model_max_length=max_positions)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **overrides,
    )
    return _save_new(path, GPT2LMHeadModel if head else GPT2Model, config, randomised)


def build_tiny_llama(path, max_positions: int = 64, head: bool = False, randomised: bool = False, **overrides) -> Path:
    """``head``: with its LM head (LlamaForCausalLM)."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    path = Path(path)
    tokenizer = save_gpt2_tokenizer(path, model_max_length=max_positions)
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config = LlamaConfig(**{**settings, **overrides})
    return _save_new(path, LlamaForCausalLM if head else LlamaModel, config, randomised)


def build_tiny_mamba(path, **overrides) -> Path:
    from transformers import MambaConfig, MambaModel

    path = Path(path)
    tokenizer = save_gpt2_tokenizer(path)
    config = MambaConfig(vocab_size=len(tokenizer), hidden_size=32, state_size=4, num_hidden_layers=2, **overrides)
    return _save(path, _seeded(MambaModel, config))


BUILDERS = {
    "bert": build_tiny_bert,
    "distilbert": build_tiny_distilbert,
    "roberta": build_tiny_roberta,
    "gpt2": build_tiny_gpt2,
    "llama": build_tiny_llama,
    "mamba": build_tiny_mamba,
}


def _seq2seq_tokens(path: Path, model_max_length: int):
    """The byte-level BPE tokenizer (RoBERTa's layout: <s>=0, <pad>=1, </s>=2) for the tiny encoder-decoders:
    fast, with offsets, like the checkpoints' own where they have one (Marian's own needs sentencepiece)."""
    return save_roberta_tokenizer(path, model_max_length=model_max_length)


def build_tiny_t5(path, max_positions: int = 64, gated: bool = False, **overrides) -> Path:
    """T5ForConditionalGeneration (relative position buckets, RMS norm); ``gated``: T5 v1.1's gated-GELU."""
    from transformers import T5Config, T5ForConditionalGeneration

    path = Path(path)
    tokenizer = _seq2seq_tokens(path, max_positions)
    settings = dict(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        feed_forward_proj="gated-gelu" if gated else "relu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    config = T5Config(**{**settings, **overrides})
    return _save_new(path, T5ForConditionalGeneration, config, randomised=True)


def _bart_like(tokenizer, max_positions: int) -> dict:
    """The settings BART and Marian share here: 2 + 2 layers of 4 heads, d_model 32."""
    return dict(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=None,
    )


def build_tiny_bart(path, max_positions: int = 64, **overrides) -> Path:
    """BartForConditionalGeneration (learned positions from row 2, post-LN, LayerNorm on the embeddings)."""
    from transformers import BartConfig, BartForConditionalGeneration

    path = Path(path)
    tokenizer = _seq2seq_tokens(path, max_positions)
    settings = dict(
        _bart_like(tokenizer, max_positions),
        bos_token_id=tokenizer.bos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
    )
    return _save_new(path, BartForConditionalGeneration, BartConfig(**{**settings, **overrides}), randomised=True)


def build_tiny_marian(path, max_positions: int = 64, **overrides) -> Path:
    """MarianMTModel (sinusoidal positions, scaled embeddings, post-LN, no LayerNorm on the embeddings)."""
    from transformers import MarianConfig, MarianMTModel

    path = Path(path)
    tokenizer = _seq2seq_tokens(path, max_positions)
    settings = dict(
        _bart_like(tokenizer, max_positions),
        decoder_vocab_size=len(tokenizer),
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return _save_new(path, MarianMTModel, MarianConfig(**{**settings, **overrides}), randomised=True)


SEQ2SEQ_BUILDERS = {"t5": build_tiny_t5, "bart": build_tiny_bart, "marian": build_tiny_marian}
