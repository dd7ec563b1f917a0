"""The loaded model: tokenizing, running both engines, and every head's attention as an ``AttentionRun``."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..edits import chain
from ..engine import registry as families
from ..engine.core import core_attentions
from ..engine.family import ModelModules
from ..errors import EngineNotSupported, HeadscopeError, ModelLoadError, quoted
from ..hooks import SINGLE_STACK, HookFunction, Hooks, NameFilter, check_names, name_filter
from ..progress import Progress
from ..run import AttentionRun
from .ablation import MEAN_REFERENCE_SENTENCES, ablation_hooks, check_heads
from .capture import attention_recorders, captured_attentions
from .forward import AttentionBuffer, ForwardPass, PassResult
from .norms import norm_based_attention
from .outputs import losses_wanted, padded, run_outputs
from .points import module_points, point_names
from .prediction import prediction_position, prediction_record
from .tokens import EncodedText, TextEncoder, TokenDisplay

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ENGINES = ("transformers", "core")


# Attentions take layers x heads x n x n x 4 bytes per text (SmolLM2 at 512 tokens: 283 MB), so runs
# are capped at this many tokens even where the model's positions go further.
MAX_TOKENS_CAP = 512


class LoadedModel:
    """A model ready for extraction: ``run``, ``run_batch``, ``run_ids`` give ``AttentionRun``s."""

    def __init__(self, name: str, hf_model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase):
        self.name = name
        self.warnings: list[str] = []  # what the user should know about this checkpoint (see sources)
        # ``hf_model`` is always the base model (its layers are what every other step reads); a checkpoint
        # loaded with its language-model head keeps the whole model as ``lm_model`` beside it.
        base = getattr(hf_model, "base_model", hf_model)
        self._family_entry = families.FAMILY_OF_MODEL_TYPE.get(hf_model.config.model_type)
        head = self._family_entry.head_of(hf_model) if base is not hf_model and self._family_entry else None
        self.lm_model = hf_model if head is not None else None
        self._lm_head = head
        # "causal" (next-token head), "masked" (MLM head) or None (a sentence encoder without a head).
        self.lm_head_kind = self._family_entry.lm_head if head is not None else None
        self.hf_model = base
        self.tokenizer = tokenizer
        config = base.config
        self.model_type = config.model_type
        self.family = families.family_name(self.model_type)
        self._head_means: dict = {}  # mean-ablation values, per reference set (models.ablation.head_means)
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
        # The model's own limit, before the dense path's cap: where a long run (mha_core.models.long) stops.
        self.context_length = int(min(positions - reserved, tokenizer_limit))
        self.display = TokenDisplay(tokenizer)
        self._special_ids = set(tokenizer.all_special_ids)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Measured, not looked up: layers, heads and causality come from the attentions of a short probe.
        self.is_causal = False
        # One forward pass at a time uses the hooks on shared modules (the capture, the named points); re-entrant,
        # so that a hook function may itself run a pass of this model.
        self._forward_lock = threading.RLock()
        self._recorders: list = []
        # Where each part of the model is (the family's declaration): the named hook points, head ablation, capture.
        self._modules = self._family_entry.modules(base) if self._family_entry else None
        self._hook_names = point_names(self._family_entry, self._modules) if self._modules else []
        probe_ids = torch.tensor([self._probe_ids(4)], dtype=torch.long)
        probe = self._transformers_attentions(probe_ids)[0]
        # Hooked capture is used only where it reproduces output_attentions exactly.
        self._recorders = attention_recorders(self._modules)
        if len(self._recorders) != probe.shape[0] or not torch.equal(
            self._transformers_attentions(probe_ids)[0], probe
        ):
            self._recorders = []
        self.num_layers, self.num_heads = int(probe.shape[0]), int(probe.shape[1])
        self.is_causal = bool(torch.all(torch.triu(probe, diagonal=1) == 0))
        self.encoder = TextEncoder(
            tokenizer=tokenizer,
            display=self.display,
            max_tokens=self.max_tokens,
            uses_token_types=self._uses_token_types,
            is_causal=self.is_causal,
            model_name=name,
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

    def _long_encoder(self, max_tokens: int | None = None) -> TextEncoder:
        return TextEncoder(
            self.tokenizer,
            self.display,
            max_tokens=self.context_length if max_tokens is None else min(int(max_tokens), self.context_length),
            uses_token_types=self._uses_token_types,
            is_causal=self.is_causal,
            model_name=self.name,
        )

    def encode_long(self, text: str, bos: bool | None = None, max_tokens: int | None = None) -> EncodedText:
        """``encode`` up to the model's own ``context_length`` (or ``max_tokens``, if fewer) instead of
        ``max_tokens`` (the long path)."""
        return self._long_encoder(max_tokens).encode(text, None, self.default_bos if bos is None else bos)

    def encode_long_ids(self, token_ids: Sequence[int], max_tokens: int | None = None) -> EncodedText:
        """Already-tokenized input for the long path, taken as is, cut to ``context_length`` (or ``max_tokens``)."""
        vocab = self.hf_model.get_input_embeddings().num_embeddings
        return self._long_encoder(max_tokens).encode_ids(token_ids, vocab)

    def __repr__(self) -> str:
        return (
            f"LoadedModel({self.name!r}, family={self.family!r}, {self.num_layers} layers x {self.num_heads} heads, "
            f"causal={self.is_causal}, max_tokens={self.max_tokens}, lm_head={self.lm_head_kind})"
        )

    @property
    def has_lm_head(self) -> bool:
        """True when the checkpoint's language-model head is loaded: ``token_losses`` can be computed."""
        return self._lm_head is not None

    @property
    def head_description(self) -> str:
        """The head in words, for people."""
        return {
            "causal": "a causal language-model head: each token's loss is -log p(next token)",
            "masked": "a masked language-model head: each token's loss is measured with that token masked",
        }.get(self.lm_head_kind, "no language-model head (a sentence encoder): ablation is measured as output change")

    def output_projections(self) -> list[torch.nn.Module]:
        """Each layer's attention output projection (``o_proj`` / ``attention.output.dense`` / ``c_proj`` / ``attn.o``),
        whose input is Concat(heads): ``attn.hook_z``."""
        if self._modules is None:
            raise HeadscopeError(
                f"Head ablation needs each layer's attention output projection, which Headscope does not know for "
                f"{self.model_type!r} models. Supported: {families.supported_types()}."
            )
        return [layer.attention.output for layer in self._modules.stacks["blocks"].layers]

    @property
    def modules(self) -> ModelModules | None:
        """Where each part of the transformers model is (its family's declaration, ``engine.family``), or None for a
        model of no family Headscope knows."""
        return self._modules

    def hook_names(self) -> list[str]:
        """Every named hook point of this model, in the order a pass reaches them (docs/hooks.md): the names
        ``run(hooks=...)`` and ``run_with_cache`` take, TransformerLens' (``blocks.3.attn.hook_pattern``)."""
        return list(self._hook_names)

    @property
    def forward_lock(self) -> threading.RLock:
        """The lock every pass of this model holds (its hooks are on shared modules): code that calls the
        checkpoint's own layers directly (the needle test's greedy answer, with a key-value cache) holds it too."""
        return self._forward_lock

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head applied to final hidden states ``[..., d]`` -> float32 logits ``[..., vocab]``."""
        if self._lm_head is None:
            raise HeadscopeError(f"{self.name!r} has no language-model head: {self.head_description}.")
        return self._lm_head(hidden).float()

    # ---- what the library's other modules use: the model's inputs, the mean cache ----
    @property
    def uses_token_types(self) -> bool:
        """Whether the model takes ``token_type_ids`` (segment ids of sentence pairs)."""
        return self._uses_token_types

    @property
    def head_means_cache(self) -> dict:
        """Mean-ablation values per reference set of texts (filled by ``models.ablation.head_means``)."""
        return self._head_means

    def _model_inputs(self, forward: ForwardPass) -> dict:
        """The keyword arguments of the transformers model for ``forward``'s tokens."""
        inputs = {"input_ids": forward.input_ids, "attention_mask": forward.attention_mask, "return_dict": True}
        if forward.keep_layer_inputs:
            inputs["output_hidden_states"] = True
        if forward.token_type_ids is not None:
            inputs["token_type_ids"] = forward.token_type_ids
        if "use_cache" in self._forward_params:
            inputs["use_cache"] = False
        return inputs

    def hidden_states(self, forward: ForwardPass, engine: str = "transformers") -> torch.Tensor:
        """The hidden states the LM head reads, ``[B, n, d]`` (after any final norm), from one pass of ``forward``
        (its hook functions applied) without capturing attention."""
        return self.run_pass(forward.with_changes(keep_hidden=True, attentions=False), engine).hidden

    def _probe_ids(self, count: int) -> list[int]:
        ordinary = [
            i
            for i in range(min(len(self.tokenizer), 4 * count + len(self._special_ids) + 4))
            if i not in self._special_ids
        ]
        return ordinary[-count:]

    # ---- forward passes ----
    def run_pass(self, forward: ForwardPass, engine: str = "transformers") -> PassResult:
        """One forward pass of an engine: its attentions ``[B, L, H, n, n]`` and what ``forward`` asks to keep.

        ``forward.hooks`` (head ablation, any hook function) apply to both engines. The core engine runs transformers
        too (with the same hook functions) and returns its attentions as ``reference`` (the run reports the
        difference), when it captures attentions; its progress is then two parts.
        """
        if engine not in ENGINES:
            raise EngineNotSupported(f"Unknown engine {quoted(engine)}: use one of {', '.join(ENGINES)}.")
        if forward.hooks:
            check_names(forward.hooks, self._hook_names)
        if forward.logits_at is not None:
            return self._pass_with_logits(forward, engine)
        if engine == "transformers":
            return self._transformers_pass(forward)
        if not forward.attentions:
            return self._core_pass(forward)
        # The reference pass keeps nothing, and its attentions must not share memory with the core's.
        reference_pass = forward.part(0, 2).with_changes(
            keep_hidden=False, keep_layer_inputs=False, keep=None, out=None, grad=False
        )
        reference = self._transformers_pass(reference_pass).attentions
        result = self._core_pass(forward.part(1, 2))
        if tuple(result.attentions.shape) != tuple(reference.shape):
            raise EngineNotSupported(
                f"The from-scratch engine gave attentions of shape {tuple(result.attentions.shape)}, "
                f"transformers {tuple(reference.shape)}."
            )
        result.attentions, result.reference = result.attentions.to(torch.float32), reference
        return result

    def _pass_with_logits(self, forward: ForwardPass, engine: str) -> PassResult:
        """``forward``'s pass with the LM head's logits at each text's ``logits_at`` position (``PassResult.logits``),
        from the final hidden states of the same pass (kept in the result only when ``forward`` asks for them)."""
        positions = torch.as_tensor(forward.logits_at, dtype=torch.long).reshape(-1)
        if positions.numel() != forward.input_ids.shape[0]:
            raise HeadscopeError(
                f"logits_at gives {positions.numel()} positions for {forward.input_ids.shape[0]} texts."
            )
        result = self.run_pass(forward.with_changes(logits_at=None, keep_hidden=True), engine)
        rows = torch.arange(positions.numel())
        with torch.enable_grad() if forward.grad else torch.inference_mode():
            result.logits = self.logits(result.hidden[rows, positions])
        if not forward.keep_hidden:
            result.hidden = None
        return result

    def _transformers_attentions(self, input_ids) -> torch.Tensor:
        """``[batch, layers, heads, n, n]`` from the transformers model (the probe at loading)."""
        return self._transformers_pass(ForwardPass(input_ids)).attentions

    def _transformers_pass(self, forward: ForwardPass) -> PassResult:
        """The transformers model's pass, with module hooks taking the named points ``forward`` hooks or keeps
        (``points.module_points``).

        Each layer's weights are copied into one preallocated tensor as the layer computes them
        (``capture.captured_attentions``), so no second copy is ever held; models whose attention modules
        cannot be hooked that way return them through ``output_attentions`` and one ``torch.stack``.
        ``forward.progress`` is called as each layer finishes and ``forward.out`` reused (hooked path only).
        """
        inputs = self._model_inputs(forward)
        hooks = Hooks(forward.hooks, forward.keep)
        mode = torch.enable_grad() if forward.grad else torch.inference_mode()
        batch = forward.input_ids.shape[0]
        # One forward pass at a time: hooks live on shared modules, so no other thread's pass may run while they
        # are on, nor an unedited pass see another thread's edits.
        with self._forward_lock, module_points(self._family_entry, self.hf_model, hooks, batch):
            if not forward.attentions:
                with mode:
                    return self._kept(forward, None, self.hf_model(**inputs), hooks)
            if self._recorders:
                captured, output = captured_attentions(self.hf_model, self._recorders, inputs, forward)
                if captured is not None:
                    return self._kept(forward, captured, output, hooks)
            with mode:
                result = self.hf_model(**inputs, output_attentions=True)
            layers = list(result.attentions or ())
            if not layers or any(layer is None for layer in layers):
                raise ModelLoadError(
                    f"{self.name!r} returned no attention weights (attention implementation "
                    f"{getattr(self.hf_model.config, '_attn_implementation', '?')!r}). Headscope loads models "
                    "with attn_implementation='eager'; sdpa and flash attention do not return weights."
                )
            return self._kept(forward, torch.stack([layer.detach() for layer in layers], dim=1), result, hooks)

    def _kept(self, forward: ForwardPass, attentions: torch.Tensor | None, output, hooks: Hooks) -> PassResult:
        """The pass's result with what ``forward`` keeps of the model's output: the final hidden states, each
        layer's input (``hidden_states[l]`` for l < L; the last entry is the final output), the named points."""
        result = PassResult(attentions, cache=hooks.cache)
        if forward.keep_hidden:
            result.hidden = output.last_hidden_state.float()
        if forward.keep_layer_inputs:
            hidden = list(getattr(output, "hidden_states", None) or ())
            if len(hidden) != self.num_layers + 1:
                raise EngineNotSupported(
                    f"{self.name!r} returned {len(hidden)} hidden states for {self.num_layers} layers; "
                    "norm-based attention and the neuron view need each layer's input."
                )
            result.layer_inputs = hidden[: self.num_layers]
        return result

    def _core_pass(self, forward: ForwardPass) -> PassResult:
        """The from-scratch engine's pass; its hidden states are taken after the checkpoint's final norm (GPT-2
        ``ln_f``, Llama ``norm``), which the LM head reads. Each layer's input is its point ``hook_resid_pre``."""
        outputs: dict | None = {} if forward.keep_hidden else None
        inputs = {f"{SINGLE_STACK.blocks}.{layer}.hook_resid_pre" for layer in range(self.num_layers)}
        wanted = forward.keep
        keep = wanted
        if forward.keep_layer_inputs:
            keep = inputs.__contains__ if wanted is None else (lambda name: name in inputs or wanted(name))
        hooks = Hooks(forward.hooks, keep)
        attentions = core_attentions(
            self.hf_model,
            forward.input_ids,
            attention_mask=forward.attention_mask,
            token_type_ids=forward.token_type_ids,
            progress=forward.progress,
            hooks=hooks,
            outputs=outputs,
            grad=forward.grad,
        )
        result = PassResult(attentions, None, None if outputs is None else outputs["final"].float())
        if forward.keep_layer_inputs:
            result.layer_inputs = [
                hooks.cache[f"{SINGLE_STACK.blocks}.{layer}.hook_resid_pre"] for layer in range(self.num_layers)
            ]
        result.cache = {name: tensor for name, tensor in hooks.cache.items() if wanted is not None and wanted(name)}
        return result

    def _make_run(
        self,
        encoded: EncodedText,
        attentions: torch.Tensor,
        engine: str,
        max_abs_diff: float | None,
        token_losses: np.ndarray | None = None,
        output_change: float | None = None,
        token_output_change: np.ndarray | None = None,
        metadata_extra: dict | None = None,
        **metadata,
    ) -> AttentionRun:
        return AttentionRun(
            token_losses=token_losses,
            output_change=output_change,
            token_output_change=token_output_change,
            model_name=self.name,
            family=self.family,
            is_causal=self.is_causal,
            attentions=attentions.numpy(),
            engine=engine,
            max_abs_diff=max_abs_diff,
            **encoded.run_fields(
                self.display,
                model_type=self.model_type,
                max_tokens=self.max_tokens,
                bos=encoded.added_bos,
                **(metadata_extra or {}),
                **metadata,
            ),
        )

    def attention_run(self, encoded: EncodedText, attentions: torch.Tensor, **metadata) -> AttentionRun:
        """The run of ``encoded`` from attentions ``[L, H, n, n]`` computed elsewhere (token by token, as
        ``models.generation.generate`` does); ``metadata`` goes into the run's."""
        return self._make_run(encoded, attentions, "transformers", None, metadata_extra=metadata)

    # ---- public API ----
    def run(
        self,
        text_or_words: str | Sequence[str],
        text_pair: str | None = None,
        engine: str = "transformers",
        progress: Progress | None = None,
        bos: bool | None = None,
        ablate: Sequence[tuple[int, int]] | None = None,
        ablation: str = "zero",
        norms: bool = False,
        out: AttentionBuffer | None = None,
        losses: bool | None = None,
        hooks: Mapping[str, HookFunction] | None = None,
        predict: bool = False,
    ) -> AttentionRun:
        """Attention of every layer and head for one text (or a list of pre-split words).

        ``progress(done, total, message)`` is called as layers finish; it may raise to stop the run.
        ``bos``: begin with the BOS token (None: the model's default, ``default_bos``).
        ``ablate``: heads ``[(layer, head), ...]`` whose output is zeroed (``ablation="zero"``) or replaced by
        its mean over a reference set (``"mean"``) before the output projection (``models.ablation``).
        ``hooks``: ``{name: function}`` on the named points (``hook_names()``, docs/hooks.md): each function takes
        the tensor at its point and returns its replacement (None keeps it), in either engine; the run's
        attentions are the patterns the pass went on with. The metadata names the hooked points.
        ``losses``: the run carries ``token_losses`` where the model has a head, ``output_change`` (ablated or
        hooked runs) where it has none; None (the default): for ablated or hooked runs only, since a plain run's
        losses cost the LM head over every position (causal) or one forward pass per token (masked).
        ``norms``: also norm-based attention (Kobayashi et al. 2020), ``run.norms`` ``[L, H, n, n]``
        with ``run.value_norms`` and ``run.output_norms`` (``mha_core.models.norms.norm_based_attention``).
        ``out``: an ``AttentionBuffer`` the run's attentions may live in, for a caller that is done with
        one run before the next (the next run with the same buffer overwrites them); saves faulting in
        fresh memory for every long run.
        ``predict``: the run carries the model's prediction from the same pass (a decoder's next token, a masked
        model's word at its first mask token; nothing for a model without a language-model head) in
        ``metadata["prediction"]`` (``models.prediction``: ``run_prediction`` makes it a table).
        In the core engine the transformers pass it is checked against runs the same hook functions.
        """
        encoded = self.encode(text_or_words, text_pair, bos)
        settings = dict(ablate=ablate, ablation=ablation, norms=norms, out=out, losses=losses, hooks=hooks)
        settings["predict"] = predict
        return self._run_encoded(encoded, engine, progress, **settings)[0]

    def run_with_cache(
        self,
        text_or_words: str | Sequence[str],
        names: NameFilter = None,
        engine: str = "transformers",
        *,
        text_pair: str | None = None,
        progress: Progress | None = None,
        bos: bool | None = None,
        hooks: Mapping[str, HookFunction] | None = None,
        losses: bool | None = None,
    ) -> tuple[AttentionRun, dict[str, torch.Tensor]]:
        """``(run, cache)``: ``run(text)`` and the tensors at the named points (docs/hooks.md), ``{name: tensor}``,
        batch first with a batch of one, as the pass went on with them (after ``hooks``' functions).

        ``names``: which points (None: every one; a name, a list of names, or a predicate of the name, as
        TransformerLens' ``names_filter``). Both engines give the same cache (the tests check it to 1e-4)."""
        encoded = self.encode(text_or_words, text_pair, bos)
        keep = name_filter(names, self._hook_names)
        run, cache = self._run_encoded(encoded, engine, progress, hooks=hooks, keep=keep, losses=losses)
        return run, {name: cache[name] for name in self._hook_names if name in cache}  # in the order of a pass

    def layer_inputs(self, token_ids: Sequence[int], engine: str = "transformers") -> tuple[torch.Tensor, list]:
        """``(attentions [1, L, H, n, n], each layer's input hidden states [1, n, d])`` of one engine's pass."""
        encoded = self.encoder.encode_ids(token_ids, self.hf_model.get_input_embeddings().num_embeddings)
        result = self.run_pass(ForwardPass(torch.tensor([encoded.input_ids]), keep_layer_inputs=True), engine)
        return result.attentions, result.layer_inputs

    def _pass_hooks(self, ablate=None, ablation: str = "zero", hooks: Mapping | None = None) -> dict | None:
        """The hook functions of a pass: the ablation of ``ablate`` (``models.ablation``) and ``hooks``, checked
        against this model's names (both on one point: the ablation first); None when there are none."""
        functions = dict(ablation_hooks(self, ablate, ablation) or {})
        if hooks:
            check_names(hooks, self._hook_names)
            for name, function in hooks.items():
                functions[name] = chain(functions.get(name), function)
        return functions or None

    def _run_encoded(
        self,
        encoded: EncodedText,
        engine: str,
        progress: Progress | None = None,
        ablate=None,
        ablation: str = "zero",
        norms: bool = False,
        out: AttentionBuffer | None = None,
        losses: bool | None = None,
        hooks: Mapping | None = None,
        keep=None,
        predict: bool = False,
        **metadata,
    ) -> tuple[AttentionRun, dict]:
        functions = self._pass_hooks(ablate, ablation, hooks)
        # The prediction is read from this pass's own final hidden states: no second pass.
        position = prediction_position(self, encoded) if predict and self.lm_head_kind is not None else None
        forward = ForwardPass(
            torch.tensor([encoded.input_ids]),
            token_type_ids=torch.tensor([encoded.token_type_ids]) if encoded.token_type_ids is not None else None,
            hooks=functions,
            keep=keep,
            progress=progress,
            # The final hidden states are kept only for the losses: without them the pass may stop at the last
            # layer's attention (capture.captured_attentions).
            keep_hidden=losses_wanted(self, losses, functions),
            keep_layer_inputs=norms,
            out=out,
            logits_at=None if position is None else (position,),
        )
        result = self.run_pass(forward, engine)
        attentions, reference = result.attentions, result.reference
        max_abs_diff = None if reference is None else float((attentions - reference).abs().max())
        extra = run_outputs(self, engine, forward, result.hidden, [encoded])
        described = self._ablation_metadata(ablate, ablation)
        if hooks:
            described.setdefault("metadata_extra", {})["hooks"] = sorted(hooks)
        if result.logits is not None:
            described.setdefault("metadata_extra", {})["prediction"] = prediction_record(result.logits[0], position)
        run = self._make_run(encoded, attentions[0], engine, max_abs_diff, **extra[0], **described, **metadata)
        if norms:
            by_norm, value_norms, output_norms = norm_based_attention(self.hf_model, attentions, result.layer_inputs)
            run.norms, run.value_norms, run.output_norms = by_norm[0], value_norms[0], output_norms[0]
        return run, result.cache

    def _ablation_metadata(self, ablate, ablation: str) -> dict:
        heads = check_heads(self, ablate)
        if not heads:
            return {}
        described = {"ablated": [list(h) for h in heads], "ablation": ablation}
        if ablation == "mean":
            described["ablation_reference"] = f"mean over {MEAN_REFERENCE_SENTENCES} UD EWT dev sentences"
        return {"metadata_extra": described}

    def run_ids(
        self,
        token_ids: Sequence[int],
        engine: str = "transformers",
        progress: Progress | None = None,
        ablate: Sequence[tuple[int, int]] | None = None,
        ablation: str = "zero",
        losses: bool | None = None,
    ) -> AttentionRun:
        """Attention for already-tokenized input, taken as is (no special tokens added); ``losses`` as in ``run``."""
        encoded = self.encoder.encode_ids(token_ids, self.hf_model.get_input_embeddings().num_embeddings)
        settings = dict(ablate=ablate, ablation=ablation, losses=losses)
        return self._run_encoded(encoded, engine, progress, **settings, from_ids=True)[0]

    def run_batch(
        self,
        texts: Sequence[str | Sequence[str]],
        engine: str = "transformers",
        batch_size: int = 16,
        bos: bool | None = None,
        ablate: Sequence[tuple[int, int]] | None = None,
        ablation: str = "zero",
        losses: bool | None = None,
    ) -> list[AttentionRun]:
        """One run per text, computed in padded, masked batches of similar lengths.

        Each run is trimmed to its own tokens and equals ``run(text)`` to float rounding (1e-5);
        ``losses`` as in ``run``.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        functions = self._pass_hooks(ablate, ablation)
        described = self._ablation_metadata(ablate, ablation)
        encoded = [self.encode(text, bos=bos) for text in texts]
        runs: list[AttentionRun | None] = [None] * len(encoded)
        # Sorting by length keeps the padding, and so the wasted work, small.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            items = [encoded[i] for i in chunk]
            keep_hidden = losses_wanted(self, losses, functions)
            result = self.encoded_pass(items, engine, hooks=functions, keep_hidden=keep_hidden)
            attentions, reference = result.attentions, result.reference
            forward = padded(self, items).with_changes(hooks=functions)
            extra = run_outputs(self, engine, forward, result.hidden, items)
            for row, i in enumerate(chunk):
                n = len(encoded[i])
                own = attentions[row, :, :, :n, :n].contiguous()
                diff = None if reference is None else float((own - reference[row, :, :, :n, :n]).abs().max())
                runs[i] = self._make_run(encoded[i], own, engine, diff, **extra[row], **described)
        return runs

    def forward_encoded(
        self,
        encoded: Sequence[EncodedText],
        engine: str = "transformers",
        hooks: dict | None = None,
        outputs: dict | None = None,
        layer_inputs: list | None = None,
        out: AttentionBuffer | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One padded, masked forward pass over encoded texts: ``(attentions [B, L, H, n, n], reference or None)``.

        n is the longest text's length; each text's padding rows and columns are exactly 0 (the keys
        are masked; the query rows, which attend anyway, are cleared), so a padded text counts the same
        as its trimmed run in every metric. ``hooks``/``outputs``: hook functions (head ablation) and the final
        hidden states (see ``run_pass``); ``layer_inputs`` (a list) receives each layer's input hidden states;
        ``out``: an ``AttentionBuffer`` to reuse (the next pass with it overwrites these attentions).
        """
        result = self.encoded_pass(
            encoded,
            engine,
            hooks=hooks,
            keep_hidden=outputs is not None,
            keep_layer_inputs=layer_inputs is not None,
            out=out,
        )
        if outputs is not None:
            outputs["hidden"] = result.hidden
        if layer_inputs is not None:
            layer_inputs.extend(result.layer_inputs)
        return result.attentions, result.reference

    def encoded_pass(self, encoded: Sequence[EncodedText], engine: str = "transformers", **settings) -> PassResult:
        """``forward_encoded`` as a ``PassResult``: one padded, masked pass over ``encoded`` whose attentions have
        each text's padding rows and columns exactly 0. ``settings``: the ``ForwardPass`` fields beyond the
        tokens (``hooks``, ``keep``, ``progress``, ``keep_hidden``, ``keep_layer_inputs``, ``out``)."""
        forward = padded(self, encoded).with_changes(**settings)
        result = self.run_pass(forward, engine)
        width = forward.input_ids.shape[1]
        weights = result.attentions.numpy()  # the same memory, written through numpy: a slice costs far less
        for row, item in enumerate(encoded):  # only the padded parts are written
            if len(item) < width:
                weights[row, :, :, len(item) :] = 0.0  # padding query rows
                weights[row, :, :, :, len(item) :] = 0.0  # padding key columns
        return result

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
