"""An encoder-decoder model loaded for attention (T5, BART, Marian / opus-mt): ``Seq2SeqModel``.

``model.run(source, target=...)`` gives a ``Seq2SeqRun``: the encoder's self-attention over the source, the
decoder's causal self-attention over the target, and the decoder's cross-attention from target to source, each
with its own tokens. The target, as the decoder reads it, begins with the model's decoder start token (as
``generate`` returns it); ``target=None`` lets the model write it, greedily (``generate(do_sample=False)``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import torch

from ..engine import registry as families
from ..engine.encoder_decoder import core_seq2seq_attentions
from ..engine.seq2seq_blocks import Seq2SeqAttentions
from ..errors import EngineNotSupported, HeadscopeError, ModelLoadError, quoted
from ..hooks import HookFunction, Hooks, NameFilter, check_names, name_filter
from ..progress import Progress, progress_part, report
from ..run import AttentionRun
from ..seq2seq_run import CrossAttentionRun, Seq2SeqRun
from .loaded import ENGINES, MAX_TOKENS_CAP
from .points import module_points, point_names
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
        self._family_entry = families.FAMILY_OF_MODEL_TYPE.get(self.model_type)
        self._modules = self._family_entry.modules(self.hf_model) if self._family_entry else None
        self._hook_names = point_names(self._family_entry, self._modules) if self._modules else []
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

    def hook_names(self) -> list[str]:
        """Every named hook point of this model (docs/hooks.md): ``hook_embed``, ``encoder.{l}....``,
        ``hook_decoder_embed``, ``decoder.{l}....`` with ``cross_attn.`` points, the final norms (T5)."""
        return list(self._hook_names)

    # ---- forward passes ----
    def _transformers_attentions(self, input_ids, decoder_input_ids, attention_mask=None, hooks: Hooks | None = None):
        """The three attentions from transformers' own forward pass (``output_attentions``), float32; ``hooks``
        taken at the named points by module hooks (``points.module_points``)."""
        hooks = hooks if hooks is not None else Hooks()
        points = module_points(self._family_entry, self.hf_model, hooks, input_ids.shape[0])
        with self._forward_lock, points, torch.inference_mode():
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

    def attentions(
        self,
        engine: str,
        input_ids,
        decoder_input_ids,
        progress: Progress | None = None,
        hooks: Mapping | None = None,
        keep=None,
    ):
        """``(attentions, transformers reference or None, cache)`` of one pass, the attentions each a
        ``Seq2SeqAttentions``: ``hooks`` (``{name: function}``) applied in both engines' passes (the core engine's
        transformers reference too), ``keep`` (a predicate of the names) kept in ``cache`` from the engine's own."""
        if engine not in ENGINES:
            raise EngineNotSupported(f"Unknown engine {quoted(engine)}: use one of {', '.join(ENGINES)}.")
        if hooks:
            check_names(hooks, self._hook_names)
        report(progress, 0, 1, "transformers forward pass")
        own = Hooks(hooks, keep)
        reference = self._transformers_attentions(
            input_ids, decoder_input_ids, hooks=own if engine == "transformers" else Hooks(hooks)
        )
        if engine == "transformers":
            report(progress, 1, 1, "transformers forward pass")
            return reference, None, own.cache
        core = core_seq2seq_attentions(
            self.hf_model, input_ids, decoder_input_ids, progress=progress_part(progress, 1, 2), hooks=own
        )
        return core, reference, own.cache

    # ---- public API ----
    def run(
        self,
        source: str,
        target: str | None = None,
        engine: str = "transformers",
        *,
        progress: Progress | None = None,
        max_new_tokens: int | None = None,
        hooks: Mapping[str, HookFunction] | None = None,
    ) -> Seq2SeqRun:
        """The encoder's, the decoder's and the cross-attention of every layer and head, for ``source`` and
        ``target`` (None: the model writes it greedily, at most ``max_new_tokens`` tokens, by default
        ``DEFAULT_MAX_NEW_TOKENS``). ``progress(done, total, message)`` may raise to stop. ``hooks``:
        ``{name: function}`` on the named points (``hook_names()``) of the run's pass (not of the writing)."""
        return self._run(source, target, engine, progress=progress, max_new_tokens=max_new_tokens, hooks=hooks)[0]

    def run_with_cache(
        self,
        source: str,
        target: str | None = None,
        names: NameFilter = None,
        engine: str = "transformers",
        *,
        progress: Progress | None = None,
        max_new_tokens: int | None = None,
        hooks: Mapping[str, HookFunction] | None = None,
    ) -> tuple[Seq2SeqRun, dict[str, torch.Tensor]]:
        """``(run, cache)``: ``run(source, target)`` and the tensors at the named points ``names`` (None: every one;
        a name, a list, or a predicate), batch first, as the pass went on with them."""
        keep = name_filter(names, self._hook_names)
        settings = dict(progress=progress, max_new_tokens=max_new_tokens, hooks=hooks, keep=keep)
        run, cache = self._run(source, target, engine, **settings)
        return run, {name: cache[name] for name in self._hook_names if name in cache}  # in the order of a pass

    def _run(self, source, target, engine, *, progress, max_new_tokens, hooks, keep=None):
        encoded_source = self.encode_source(source)
        generated = target is None
        if generated:
            written = self.write(encoded_source.input_ids, max_new_tokens, progress_part(progress, 0, 2))
            encoded_target = self.decoder_ids(written)
            progress = progress_part(progress, 1, 2)
        else:
            encoded_target = self.encode_target(target)
        settings = dict(progress=progress, generated=generated, hooks=hooks, keep=keep)
        return self._run_encoded(encoded_source, encoded_target, engine, **settings)

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
        return self._run_encoded(source, target, engine, progress=progress, generated=generated)[0]

    def _run_encoded(self, source, target, engine, *, progress=None, generated=False, hooks=None, keep=None):
        ids = torch.tensor([source.input_ids]), torch.tensor([target.input_ids])
        attentions, reference, cache = self.attentions(engine, *ids, progress, hooks=hooks, keep=keep)
        diffs = {}
        if reference is not None:
            for kind in ("encoder", "decoder", "cross"):
                diffs[kind] = float((getattr(attentions, kind) - getattr(reference, kind)).abs().max())
        common = dict(model_name=self.name, family=self.family, engine=engine)
        hooked = {"hooks": sorted(hooks)} if hooks else {}
        encoder = AttentionRun(
            is_causal=False,
            attentions=attentions.encoder[0].numpy(),
            max_abs_diff=diffs.get("encoder"),
            **self._side_fields(source, "encoder", extra=hooked),
            **common,
        )
        decoder = AttentionRun(
            is_causal=True,
            attentions=attentions.decoder[0].numpy(),
            max_abs_diff=diffs.get("decoder"),
            **self._side_fields(target, "decoder", extra=hooked),
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
            **self._side_fields(target, "cross", source.input_ids, extra=hooked),
            **common,
        )
        return Seq2SeqRun(encoder=encoder, decoder=decoder, cross=cross, generated=generated), cache

    def _side_fields(self, encoded: EncodedText, kind: str, source_ids=None, extra: dict | None = None) -> dict:
        metadata = {"model_type": self.model_type, "max_tokens": self.max_tokens, "kind": kind, **(extra or {})}
        if source_ids is not None:
            metadata["source_token_ids"] = list(source_ids)
        return encoded.run_fields(self.display, **metadata)
