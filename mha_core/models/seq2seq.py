"""An encoder-decoder model loaded for attention (T5, BART, Marian / opus-mt): ``Seq2SeqModel``.

``model.run(source, target=...)`` gives a ``Seq2SeqRun``: the encoder's self-attention over the source, the
decoder's causal self-attention over the target, and the decoder's cross-attention from target to source, each
with its own tokens. The target, as the decoder reads it, begins with the model's decoder start token (as
``generate`` returns it); ``target=None`` lets the model write it, greedily (``generate(do_sample=False)``).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from ..engine import registry as families
from ..engine.encoder_decoder import core_seq2seq_attentions
from ..engine.seq2seq_blocks import Seq2SeqAttentions
from ..errors import EngineNotSupported, HeadscopeError, ModelLoadError, quoted
from ..progress import Progress, progress_part, report
from ..run import AttentionRun
from ..seq2seq_run import CrossAttentionRun, Seq2SeqRun
from .loaded import ENGINES, MAX_TOKENS_CAP
from .tokens import EncodedText, TokenDisplay, check_text

# What the model may write when no target is given: at most this many tokens after the start token.
DEFAULT_MAX_NEW_TOKENS = 40
WORD_START_MARKS = ("▁", "Ġ")  # SentencePiece and byte-level BPE mark a piece that begins a word


def words_from_pieces(raw_tokens: list[str], special_mask: np.ndarray, display: TokenDisplay):
    """``(word_ids [n], words)`` from the pieces alone (no character offsets: a slow tokenizer such as Marian's
    has none, and a written target has no text of its own): a piece begins a word when it carries its
    tokenizer's word-start mark (``▁``, ``Ġ``; WordPiece: when it lacks ``##``) or follows a special token."""
    word_ids = np.full(len(raw_tokens), -1, dtype=np.int64)
    words: list[str] = []
    previous_special = True
    for i, (raw, special) in enumerate(zip(raw_tokens, special_mask)):
        if special:
            previous_special = True
            continue
        if display.subword_prefix:
            continues = raw.startswith(display.subword_prefix)
        else:
            continues = not raw.startswith(WORD_START_MARKS)
        if previous_special or not continues or not words:
            words.append(display(raw))
        else:
            words[-1] += display(raw)
        word_ids[i] = len(words) - 1
        previous_special = False
    return word_ids, words


class Seq2SeqModel:
    """An encoder-decoder checkpoint ready for extraction: ``run(source, target=None)`` gives a ``Seq2SeqRun``."""

    is_encoder_decoder = True
    is_causal = False
    bos_token = None  # the decoder begins with its own start token; the source takes no BOS of Headscope's

    def __init__(self, name: str, hf_model: torch.nn.Module, tokenizer):
        self.name = name
        self.warnings: list[str] = []
        # The whole model (with its LM head, which writes targets) and, for the forward passes, its base
        # (BartModel inside BartForConditionalGeneration; T5's conditional-generation model is its own base).
        self.lm_model = hf_model if hf_model.get_output_embeddings() is not None else None
        self.hf_model = getattr(hf_model, "base_model", hf_model)
        self.tokenizer = tokenizer
        config = hf_model.config
        self.model_type = config.model_type
        self.family = families.family_name(self.model_type)
        self.display = TokenDisplay(tokenizer)
        self._special_ids = set(tokenizer.all_special_ids)
        start = getattr(config, "decoder_start_token_id", None)
        generation = getattr(hf_model, "generation_config", None)
        if start is None and generation is not None:
            start = generation.decoder_start_token_id
        if start is None:
            raise ModelLoadError(f"{quoted(name)} names no decoder start token (decoder_start_token_id).")
        self.decoder_start_id = int(start)
        positions = getattr(config, "max_position_embeddings", None) or MAX_TOKENS_CAP
        tokenizer_limit = getattr(tokenizer, "model_max_length", None) or positions
        self.max_tokens = int(min(positions, tokenizer_limit, MAX_TOKENS_CAP))
        self._forward_lock = threading.RLock()
        # Measured, not looked up: each stack's layers and heads, from the attentions of a short probe.
        ordinary = [i for i in range(min(len(tokenizer), 64)) if i not in self._special_ids][-3:]
        probe = self._transformers_attentions(torch.tensor([ordinary]), torch.tensor([[self.decoder_start_id]]))
        self.encoder_layers, self.num_heads = (int(d) for d in probe.encoder.shape[1:3])
        self.decoder_layers, self.decoder_heads = (int(d) for d in probe.decoder.shape[1:3])
        self.num_layers = self.encoder_layers

    def __repr__(self) -> str:
        return (
            f"Seq2SeqModel({self.name!r}, family={self.family!r}, encoder {self.encoder_layers} x {self.num_heads}, "
            f"decoder {self.decoder_layers} x {self.decoder_heads} heads, max_tokens={self.max_tokens})"
        )

    @property
    def can_write(self) -> bool:
        """True when the checkpoint's LM head is loaded: ``run(source)`` can write the target itself."""
        return self.lm_model is not None

    # ---- tokens ----
    def _encoded(self, ids: list[int], text: str, truncated: bool, num_input_tokens: int) -> EncodedText:
        raw = self.tokenizer.convert_ids_to_tokens(ids)
        special = np.array([i in self._special_ids for i in ids], dtype=bool)
        word_ids, words = words_from_pieces(raw, special, self.display)
        return EncodedText(
            input_ids=list(ids),
            token_type_ids=None,
            raw_tokens=list(raw),
            special_mask=special,
            word_ids=word_ids,
            words=words,
            segment_ids=np.zeros(len(ids), dtype=np.int64),
            text=text,
            text_pair=None,
            truncated=truncated,
            num_input_tokens=num_input_tokens,
        )

    def _tokenize(self, text: str, target: bool, limit: int) -> EncodedText:
        call = (
            (lambda **kw: self.tokenizer(text_target=text, **kw))
            if target
            else (lambda **kw: self.tokenizer(text, **kw))
        )
        ids = list(call(verbose=False)["input_ids"])
        full = len(ids)
        if full > limit:
            ids = list(call(truncation=True, max_length=limit, verbose=False)["input_ids"])
        return self._encoded(ids, text, full > limit, full)

    def encode_source(self, source: str) -> EncodedText:
        """The source as the encoder reads it (with the tokenizer's special tokens), cut to ``max_tokens``; an
        ``EncodedText`` (encoded once before, ``mha_core.operations``) as it is."""
        if isinstance(source, EncodedText):
            return source
        encoded = self._tokenize(check_text(source, "source text"), False, self.max_tokens)
        if encoded.special_mask.all():
            raise HeadscopeError(f"The source text {quoted(source, 40)} is empty to this model's tokenizer.")
        return encoded

    def encode_target(self, target: str) -> EncodedText:
        """The target as the decoder reads it: the decoder start token, then the target's tokens (as a
        generated sequence would be), cut to ``max_tokens``; an ``EncodedText`` (encoded once before) as it is."""
        if isinstance(target, EncodedText):
            return target
        encoded = self._tokenize(check_text(target, "target text"), True, self.max_tokens - 1)
        return self.decoder_ids(
            [self.decoder_start_id, *encoded.input_ids], target, encoded.truncated, encoded.num_input_tokens + 1
        )

    def decoder_ids(self, ids, text: str | None = None, truncated: bool = False, num_input_tokens: int = 0):
        """``EncodedText`` of decoder input ids as given (e.g. what ``generate`` returned)."""
        ids = [int(i) for i in ids]
        if text is None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return self._encoded(ids, text, truncated, num_input_tokens or len(ids))

    # ---- writing the target ----
    def write(self, source_ids, max_new_tokens: int | None = None, progress: Progress | None = None) -> list[int]:
        """The target the model writes for ``source_ids`` by greedy decoding (``generate(do_sample=False,
        num_beams=1)``), beginning with the decoder start token; at most ``max_new_tokens`` after it."""
        if self.lm_model is None:
            raise HeadscopeError(
                f"{self.name!r} was loaded without its language-model head, so it cannot write a target: give one."
            )
        from transformers import StoppingCriteria, StoppingCriteriaList  # transformers: slow to import, only to write

        limit = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        limit = max(1, min(limit, self.max_tokens - 1))

        class Reported(StoppingCriteria):  # progress after each token; the callback may raise to stop
            def __call__(self, input_ids, scores, **kwargs):
                report(progress, min(input_ids.shape[1] - 1, limit), limit, "writing the target")
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        source = torch.tensor([list(source_ids)])
        with self._forward_lock, torch.inference_mode():
            written = self.lm_model.generate(
                input_ids=source,
                attention_mask=torch.ones_like(source),
                do_sample=False,
                num_beams=1,
                max_new_tokens=limit,
                stopping_criteria=StoppingCriteriaList([Reported()]),
            )
        return written[0].tolist()

    # ---- forward passes ----
    def _transformers_attentions(self, input_ids, decoder_input_ids, attention_mask=None):
        """The three attentions from transformers' own forward pass (``output_attentions``), float32."""
        with self._forward_lock, torch.inference_mode():
            output = self.hf_model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids,
                output_attentions=True,
                use_cache=False,
                return_dict=True,
            )
        parts = (output.encoder_attentions, output.decoder_attentions, output.cross_attentions)
        if any(not part or any(a is None for a in part) for part in parts):
            raise EngineNotSupported(
                f"{self.name!r} returned no attention weights: load it with attn_implementation='eager'."
            )
        return Seq2SeqAttentions(*(torch.stack(part, dim=1).float() for part in parts))

    def attentions(self, engine: str, input_ids, decoder_input_ids, progress: Progress | None = None):
        """``(attentions, transformers reference or None)`` of one pass, each a ``Seq2SeqAttentions``."""
        if engine not in ENGINES:
            raise EngineNotSupported(f"Unknown engine {quoted(engine)}: use one of {', '.join(ENGINES)}.")
        report(progress, 0, 1, "transformers forward pass")
        reference = self._transformers_attentions(input_ids, decoder_input_ids)
        if engine == "transformers":
            report(progress, 1, 1, "transformers forward pass")
            return reference, None
        core = core_seq2seq_attentions(
            self.hf_model, input_ids, decoder_input_ids, progress=progress_part(progress, 1, 2)
        )
        return core, reference

    # ---- public API ----
    def run(
        self,
        source: str,
        target: str | None = None,
        engine: str = "transformers",
        *,
        progress: Progress | None = None,
        max_new_tokens: int | None = None,
    ) -> Seq2SeqRun:
        """The encoder's, the decoder's and the cross-attention of every layer and head, for ``source`` and
        ``target`` (None: the model writes it greedily, at most ``max_new_tokens`` tokens, by default
        ``DEFAULT_MAX_NEW_TOKENS``). ``progress(done, total, message)`` may raise to stop."""
        encoded_source = self.encode_source(source)
        generated = target is None
        if generated:
            written = self.write(encoded_source.input_ids, max_new_tokens, progress_part(progress, 0, 2))
            encoded_target = self.decoder_ids(written)
            progress = progress_part(progress, 1, 2)
        else:
            encoded_target = self.encode_target(target)
        return self.run_encoded(encoded_source, encoded_target, engine, progress=progress, generated=generated)

    def run_ids(self, source_ids, decoder_ids, engine: str = "transformers") -> Seq2SeqRun:
        """The three attentions for token ids taken as they are (the decoder's beginning with its start token)."""
        source = self._encoded([int(i) for i in source_ids], "", False, len(source_ids))
        source.text = self.tokenizer.decode(source.input_ids, skip_special_tokens=True)
        return self.run_encoded(source, self.decoder_ids(decoder_ids), engine)

    def run_encoded(
        self,
        source: EncodedText,
        target: EncodedText,
        engine: str = "transformers",
        *,
        progress: Progress | None = None,
        generated: bool = False,
    ) -> Seq2SeqRun:
        attentions, reference = self.attentions(
            engine, torch.tensor([source.input_ids]), torch.tensor([target.input_ids]), progress
        )
        diffs = {}
        if reference is not None:
            for kind in ("encoder", "decoder", "cross"):
                diffs[kind] = float((getattr(attentions, kind) - getattr(reference, kind)).abs().max())
        common = dict(model_name=self.name, family=self.family, engine=engine)
        encoder = AttentionRun(
            is_causal=False,
            attentions=attentions.encoder[0].numpy(),
            max_abs_diff=diffs.get("encoder"),
            **self._side_fields(source, "encoder"),
            **common,
        )
        decoder = AttentionRun(
            is_causal=True,
            attentions=attentions.decoder[0].numpy(),
            max_abs_diff=diffs.get("decoder"),
            **self._side_fields(target, "decoder"),
            **common,
        )
        cross = CrossAttentionRun(
            is_causal=False,
            attentions=attentions.cross[0].numpy(),
            max_abs_diff=diffs.get("cross"),
            key_tokens=encoder.tokens,
            key_raw_tokens=encoder.raw_tokens,
            key_special_mask=encoder.special_mask,
            key_word_ids=encoder.word_ids,
            key_words=encoder.words,
            **self._side_fields(target, "cross", source.input_ids),
            **common,
        )
        return Seq2SeqRun(encoder=encoder, decoder=decoder, cross=cross, generated=generated)

    def _side_fields(self, encoded: EncodedText, kind: str, source_ids=None) -> dict:
        metadata = {"token_ids": encoded.input_ids, "model_type": self.model_type, "max_tokens": self.max_tokens}
        metadata["kind"] = kind
        if source_ids is not None:
            metadata["source_token_ids"] = list(source_ids)
        return dict(
            tokens=self.display.display(encoded.raw_tokens, encoded.word_ids),
            raw_tokens=encoded.raw_tokens,
            special_mask=encoded.special_mask,
            word_ids=encoded.word_ids,
            words=encoded.words,
            segment_ids=encoded.segment_ids,
            text=encoded.text,
            truncated=encoded.truncated,
            num_input_tokens=encoded.num_input_tokens,
            metadata=metadata,
        )
