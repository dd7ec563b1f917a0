"""The loaded model: tokenizing, running both engines, and every head's attention as an ``AttentionRun``.

``load_model(name)`` resolves a name through ``mha_core.sources`` (embedded packages, local folders,
the hub; the safety checks live there) and returns a ``LoadedModel``. Every model loads in float32,
eval mode, with eager attention: the sdpa backend computes the same outputs but returns no
attention weights.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import families, sources
from .capture import AttentionBuffer, attention_recorders, captured_attentions
from .errors import EngineNotSupported, ModelLoadError, quoted
from .progress import Progress, report
from .run import AttentionRun
from .sources import DEFAULT_MODEL, EMBEDDED_MODELS
from .tokens import EncodedText, TextEncoder, TokenDisplay

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "ENGINES", "LoadedModel", "load_model"]

ENGINES = ("transformers", "core")

# Attentions take layers x heads x n x n x 4 bytes per text (SmolLM2 at 512 tokens: 283 MB), so runs
# are capped at this many tokens even where the model's positions go further.
MAX_TOKENS_CAP = 512


def _part(progress: Progress | None, index: int, parts: int) -> Progress | None:
    """``progress`` for part ``index`` of ``parts`` equal parts of one job (e.g. two passes of a run)."""
    if progress is None:
        return None
    return lambda done, total, message="": progress(index + done / total, parts, message)


def load_model(name: str = DEFAULT_MODEL, progress: Progress | None = None, download: bool = True) -> LoadedModel:
    """Load a model for attention extraction. Raises ``ModelLoadError`` with a message a user can act on.

    ``name``: an embedded model (``"minilm"``, ``"smollm2"``), a checkpoint folder, or a hub id.
    ``download``: whether a hub id missing from the local cache may be fetched from the hub.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError(f"Name a model: one of {', '.join(EMBEDDED_MODELS)}, a checkpoint directory or a hub id.")
    # One load at a time per process: transformers imports its model code lazily, and two threads doing
    # that for the first time at once can fail (two visitors of a fresh server loading two models).
    with _LOAD_LOCK:
        return _load_model(name.strip(), progress, download)


_LOAD_LOCK = threading.RLock()


def _load_model(name: str, progress: Progress | None, download: bool) -> LoadedModel:
    report(progress, 0.0, 1.0, f"Loading {name[:80]}")
    checkpoint = sources.resolve(name, progress)
    try:
        # The local files first: they answer in milliseconds, with or without a network.
        hf_model, tokenizer, warnings = sources.load_checkpoint(
            sources.Checkpoint(checkpoint.name, checkpoint.source, True, checkpoint.warnings)
        )
    except sources.NotCached as exc:
        if checkpoint.local_only:
            raise ModelLoadError(f"{quoted(name)} is an incomplete checkpoint: {exc}") from exc
        if not download:
            raise sources.not_downloaded_error(name) from None
        if not sources.hub_reachable():
            raise sources.offline_error(name) from None
        report(progress, 0.1, 1.0, f"Downloading {name} from the Hugging Face hub")
        try:
            hf_model, tokenizer, warnings = sources.load_checkpoint(checkpoint)
        except sources.NotCached as exc:
            raise sources.hub_error(name, exc.__cause__ or exc) from exc
    report(progress, 0.95, 1.0, f"Checking {name[:80]}'s attention")
    model = LoadedModel(name, hf_model, tokenizer)
    model.warnings = warnings
    report(progress, 1.0, 1.0, f"Loaded {name[:80]}")
    return model


class LoadedModel:
    """A model ready for extraction: ``run``, ``run_batch``, ``run_ids`` give ``AttentionRun``s."""

    def __init__(self, name: str, hf_model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase):
        self.name = name
        self.warnings: list[str] = []  # what the user should know about this checkpoint (see sources)
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        config = hf_model.config
        self.model_type = config.model_type
        self.family = families.family_name(self.model_type)
        self._forward_params = set(inspect.signature(hf_model.forward).parameters)
        self._uses_token_types = (
            "token_type_ids" in getattr(tokenizer, "model_input_names", ()) and "token_type_ids" in self._forward_params
        )
        positions = getattr(config, "max_position_embeddings", None) or MAX_TOKENS_CAP
        tokenizer_limit = getattr(tokenizer, "model_max_length", None) or positions
        # RoBERTa-style position tables reserve padding_idx + 1 rows that no token can use.
        padding_idx = config.pad_token_id if getattr(config, "pad_token_id", None) is not None else 1
        family = families.FAMILY_OF_MODEL_TYPE.get(self.model_type)
        reserved = padding_idx + 1 if family and self.model_type in family.positions_after_padding else 0
        self.max_tokens = int(min(positions - reserved, tokenizer_limit, MAX_TOKENS_CAP))
        self.display = TokenDisplay(tokenizer)
        self._special_ids = set(tokenizer.all_special_ids)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Measured, not looked up: layers, heads and causality come from the attentions of a short probe.
        self.is_causal = False
        self._forward_lock = threading.Lock()
        self._recorders: list = []
        probe_ids = torch.tensor([self._probe_ids(4)], dtype=torch.long)
        probe = self._transformers_attentions(probe_ids)[0]
        # Hooked capture is used only where it reproduces output_attentions exactly.
        self._recorders = attention_recorders(hf_model)
        if len(self._recorders) != probe.shape[0] or not torch.equal(
            self._transformers_attentions(probe_ids)[0], probe
        ):
            self._recorders = []
        self.num_layers, self.num_heads = int(probe.shape[0]), int(probe.shape[1])
        self.is_causal = bool(torch.all(torch.triu(probe, diagonal=1) == 0))
        self.encoder = TextEncoder(
            tokenizer, self.display, self.max_tokens, self._uses_token_types, self.is_causal, name
        )
        # Decoders begin with their BOS token by default, where the tokenizer has one and does not add it
        # itself: without it the first word of the text takes the place of the attention sink.
        self.bos_token = tokenizer.bos_token if self.is_causal and not self.encoder.adds_bos else None
        if self.encoder.bos_token_id is None:
            self.bos_token = None
        self.default_bos = self.bos_token is not None

    def encode(
        self, text_or_words: str | Sequence[str], text_pair: str | None = None, bos: bool | None = None
    ) -> EncodedText:
        """Tokenize a text (or a list of pre-split words, joined by spaces), truncating to ``max_tokens``.
        ``bos``: begin with the BOS token (None: ``default_bos``, True for decoders whose tokenizer has one)."""
        return self.encoder.encode(text_or_words, text_pair, self.default_bos if bos is None else bos)

    def __repr__(self) -> str:
        return (
            f"LoadedModel({self.name!r}, family={self.family!r}, {self.num_layers} layers x {self.num_heads} heads, "
            f"causal={self.is_causal}, max_tokens={self.max_tokens})"
        )

    def _probe_ids(self, count: int) -> list[int]:
        ordinary = [
            i
            for i in range(min(len(self.tokenizer), 4 * count + len(self._special_ids) + 4))
            if i not in self._special_ids
        ]
        return ordinary[-count:]

    # ---- forward passes ----
    def _transformers_attentions(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        progress: Progress | None = None,
        layer_inputs: list | None = None,
        out: AttentionBuffer | None = None,
    ) -> torch.Tensor:
        """``[batch, layers, heads, n, n]`` from the transformers model.

        Each layer's weights are copied into one preallocated tensor as the layer computes them
        (``capture.captured_attentions``), so no second copy is ever held; models whose attention modules
        cannot be hooked that way return them through ``output_attentions`` and one ``torch.stack``.
        ``progress(done, total, message)`` is called as each layer finishes (hooked path only).
        ``layer_inputs``, when given a list, receives each layer's input hidden states (from the same pass).
        ``out``: memory to reuse for the result (hooked path only; see ``AttentionBuffer``).
        """
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "return_dict": True}
        if layer_inputs is not None:
            inputs["output_hidden_states"] = True
        outputs: list | None = [] if layer_inputs is not None else None  # the output is kept only when needed
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if "use_cache" in self._forward_params:
            inputs["use_cache"] = False
        if self._recorders:
            captured = captured_attentions(
                self.hf_model, self._recorders, inputs, self._forward_lock, progress, outputs, out
            )
            if captured is not None:
                if outputs:
                    self._hidden_states(outputs[0], captured.shape[1], layer_inputs)
                return captured
        with torch.inference_mode():
            output = self.hf_model(**inputs, output_attentions=True)
            layers = list(output.attentions or ())
            if not layers or any(layer is None for layer in layers):
                raise ModelLoadError(
                    f"{self.name!r} returned no attention weights (attention implementation "
                    f"{getattr(self.hf_model.config, '_attn_implementation', '?')!r}). Headscope loads models with "
                    "attn_implementation='eager'; sdpa and flash attention do not return weights."
                )
            self._hidden_states(output, len(layers), layer_inputs)
            return torch.stack(layers, dim=1)

    def _hidden_states(self, output, num_layers: int, layer_inputs: list | None) -> None:
        """Each layer's input: ``hidden_states[l]`` for l < L (the last entry is the final output)."""
        if layer_inputs is None:
            return
        hidden = list(getattr(output, "hidden_states", None) or ())
        if len(hidden) != num_layers + 1:
            raise EngineNotSupported(
                f"{self.name!r} returned {len(hidden)} hidden states for {num_layers} layers; "
                "norm-based attention and the neuron view need each layer's input."
            )
        layer_inputs.extend(hidden[:num_layers])

    def _attentions(
        self,
        engine: str,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        progress: Progress | None = None,
        layer_inputs: list | None = None,
        out: AttentionBuffer | None = None,
    ):
        """``(attentions [B, L, H, n, n], transformers reference or None)`` for an engine.
        ``layer_inputs`` (a list) receives the engine's own input hidden states of each layer; ``out``:
        memory the transformers attentions may reuse."""
        if engine not in ENGINES:
            raise EngineNotSupported(f"Unknown engine {quoted(engine)}: use one of {', '.join(ENGINES)}.")
        # The core engine runs both (it reports its difference from transformers): two passes of progress.
        passes = 1 if engine == "transformers" else 2
        reference = self._transformers_attentions(
            input_ids,
            attention_mask,
            token_type_ids,
            _part(progress, 0, passes),
            layer_inputs if engine == "transformers" else None,
            out if passes == 1 else None,
        )
        if engine == "transformers":
            return reference, None
        try:
            from .engine import core_attentions
        except ImportError as exc:
            raise EngineNotSupported(f"The from-scratch engine is not available: {exc}") from exc
        with torch.inference_mode():
            core = core_attentions(
                self.hf_model,
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                progress=_part(progress, 1, passes),
                layer_inputs=layer_inputs,
            )
        if tuple(core.shape) != tuple(reference.shape):
            raise EngineNotSupported(
                f"The from-scratch engine gave attentions of shape {tuple(core.shape)}, "
                f"transformers {tuple(reference.shape)}."
            )
        return core.to(torch.float32), reference

    def _make_run(
        self, encoded: EncodedText, attentions: torch.Tensor, engine: str, max_abs_diff: float | None, **metadata
    ) -> AttentionRun:
        return AttentionRun(
            model_name=self.name,
            family=self.family,
            is_causal=self.is_causal,
            tokens=self.display.display(encoded.raw_tokens, encoded.word_ids),
            raw_tokens=encoded.raw_tokens,
            attentions=attentions.numpy(),
            special_mask=encoded.special_mask,
            word_ids=encoded.word_ids,
            words=encoded.words,
            segment_ids=encoded.segment_ids,
            engine=engine,
            text=encoded.text,
            text_pair=encoded.text_pair,
            truncated=encoded.truncated,
            num_input_tokens=encoded.num_input_tokens,
            max_abs_diff=max_abs_diff,
            metadata={
                "token_ids": encoded.input_ids,
                "model_type": self.model_type,
                "max_tokens": self.max_tokens,
                "bos": encoded.added_bos,
                **metadata,
            },
        )

    # ---- public API ----
    def run(
        self,
        text_or_words: str | Sequence[str],
        text_pair: str | None = None,
        engine: str = "transformers",
        progress: Progress | None = None,
        bos: bool | None = None,
        norms: bool = False,
        out: AttentionBuffer | None = None,
    ) -> AttentionRun:
        """Attention of every layer and head for one text (or a list of pre-split words).

        ``progress(done, total, message)`` is called as layers finish; it may raise to stop the run.
        ``bos``: begin with the BOS token (None: the model's default, ``default_bos``).
        ``norms``: also norm-based attention (Kobayashi et al. 2020), ``run.norms`` ``[L, H, n, n]``
        with ``run.value_norms`` and ``run.output_norms`` (``mha_core.deeper.norm_based_attention``).
        ``out``: an ``AttentionBuffer`` the run's attentions may live in, for a caller that is done with
        one run before the next (the next run with the same buffer overwrites them); saves faulting in
        fresh memory for every long run.
        """
        encoded = self.encode(text_or_words, text_pair, bos)
        return self._run_encoded(encoded, engine, progress, norms=norms, out=out)

    def layer_inputs(self, token_ids: Sequence[int], engine: str = "transformers") -> tuple[torch.Tensor, list]:
        """``(attentions [1, L, H, n, n], each layer's input hidden states [1, n, d])`` of one engine's pass."""
        encoded = self.encoder.encode_ids(token_ids, self.hf_model.get_input_embeddings().num_embeddings)
        inputs: list = []
        attentions, _ = self._attentions(engine, torch.tensor([encoded.input_ids]), layer_inputs=inputs)
        return attentions, inputs

    def _run_encoded(
        self,
        encoded: EncodedText,
        engine: str,
        progress: Progress | None = None,
        norms: bool = False,
        out: AttentionBuffer | None = None,
        **metadata,
    ) -> AttentionRun:
        input_ids = torch.tensor([encoded.input_ids])
        token_type_ids = torch.tensor([encoded.token_type_ids]) if encoded.token_type_ids is not None else None
        layer_inputs: list | None = [] if norms else None
        attentions, reference = self._attentions(
            engine, input_ids, None, token_type_ids, progress, layer_inputs=layer_inputs, out=out
        )
        max_abs_diff = None if reference is None else float((attentions - reference).abs().max())
        run = self._make_run(encoded, attentions[0], engine, max_abs_diff, **metadata)
        if norms:
            from .deeper import norm_based_attention

            by_norm, value_norms, output_norms = norm_based_attention(self.hf_model, attentions, layer_inputs)
            run.norms, run.value_norms, run.output_norms = by_norm[0], value_norms[0], output_norms[0]
        return run

    def run_ids(
        self, token_ids: Sequence[int], engine: str = "transformers", progress: Progress | None = None
    ) -> AttentionRun:
        """Attention for already-tokenized input, taken as is (no special tokens added)."""
        encoded = self.encoder.encode_ids(token_ids, self.hf_model.get_input_embeddings().num_embeddings)
        return self._run_encoded(encoded, engine, progress, from_ids=True)

    def run_batch(
        self,
        texts: Sequence[str | Sequence[str]],
        engine: str = "transformers",
        batch_size: int = 16,
        bos: bool | None = None,
    ) -> list[AttentionRun]:
        """One run per text, computed in padded, masked batches of similar lengths.

        Each run is trimmed to its own tokens and equals ``run(text)`` to float rounding (1e-5).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        encoded = [self.encode(text, bos=bos) for text in texts]
        runs: list[AttentionRun | None] = [None] * len(encoded)
        # Sorting by length keeps the padding, and so the wasted work, small.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            attentions, reference = self.forward_encoded([encoded[i] for i in chunk], engine)
            for row, i in enumerate(chunk):
                n = len(encoded[i])
                own = attentions[row, :, :, :n, :n].contiguous()
                diff = None if reference is None else float((own - reference[row, :, :, :n, :n]).abs().max())
                runs[i] = self._make_run(encoded[i], own, engine, diff)
        return runs

    def forward_encoded(
        self,
        encoded: Sequence[EncodedText],
        engine: str = "transformers",
        layer_inputs: list | None = None,
        out: AttentionBuffer | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One padded, masked forward pass over encoded texts: ``(attentions [B, L, H, n, n], reference or None)``.

        n is the longest text's length; each text's padding rows and columns are exactly 0 (the keys
        are masked; the query rows, which attend anyway, are cleared), so a padded text counts the same
        as its trimmed run in every metric. ``layer_inputs`` (a list) receives each layer's input hidden states.
        ``out``: an ``AttentionBuffer`` to reuse (the next pass with it overwrites these attentions).
        """
        width = max(len(item) for item in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        token_type_ids = torch.zeros((len(encoded), width), dtype=torch.long) if self._uses_token_types else None
        for row, item in enumerate(encoded):
            n = len(item)
            input_ids[row, :n] = torch.tensor(item.input_ids)
            attention_mask[row, :n] = 1
            if token_type_ids is not None:
                token_type_ids[row, :n] = torch.tensor(item.token_type_ids)
        attentions, reference = self._attentions(
            engine, input_ids, attention_mask, token_type_ids, layer_inputs=layer_inputs, out=out
        )
        with torch.inference_mode():
            for row, item in enumerate(encoded):  # only the padded parts are written
                attentions[row, :, :, len(item) :] = 0.0  # padding query rows
                attentions[row, :, :, :, len(item) :] = 0.0  # padding key columns
        return attentions, reference

    def input_embeddings(self, token_ids: Sequence[int]) -> np.ndarray:
        """The model's own input token embeddings, float32 ``[n, d]`` (no positions, no LayerNorm)."""
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64).reshape(-1))
        with torch.inference_mode():
            return self.hf_model.get_input_embeddings()(ids).to(torch.float32).numpy().copy()

    def position_embeddings(self) -> np.ndarray | None:
        """The learned absolute position table ``[max_positions, d]`` (BERT, GPT-2), or None (rotary models)."""
        for name, module in self.hf_model.named_modules():
            if name.split(".")[-1] in ("position_embeddings", "wpe") and isinstance(module, torch.nn.Embedding):
                return module.weight.detach().to(torch.float32).numpy().copy()
        return None
