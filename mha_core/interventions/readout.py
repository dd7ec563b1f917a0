"""Reading a decoder's residual stream: the prompt's tokens, the answer's token, and one pass of the language
model with head edits and module hooks, for logit attribution, activation patching and the logit lens.

The residual stream of a pre-norm decoder (GPT-2, Llama) after its last layer is a sum: the embeddings, then
each layer's attention output (its heads through their slices of the output projection, plus its bias) and
MLP output. The LM head reads it through the final norm (LayerNorm or RMSNorm), whose scale depends on the
whole sum; with that scale frozen at its value in the run, the norm is linear and each term's share of a
logit is exact (TransformerLens' ``apply_ln_to_stack``). ``FrozenNorm`` is that linear map.

Head outputs are read and replaced only through ``mha_core.edits`` and the model's edit path
(``LoadedModel.edits_applied``); MLP and block outputs through ``edits.forward_hooks``. ``lm_pass`` is this
package's one call into the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..edits import LayerEdits, forward_hooks, record_heads
from ..engine import registry as families
from ..errors import HeadscopeError, quoted
from ..models.tokens import EncodedText, check_text

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel


class CircuitError(HeadscopeError, ValueError):
    """A request attribution, patching or the logit lens cannot answer: a model without a next-token head,
    an answer that is not one token, prompts of different lengths, a prompt longer than the model takes."""


@dataclass(frozen=True)
class DecoderParts:
    """The modules the residual-stream readings hook, per layer, and the final norm and unembedding."""

    blocks: list
    mlps: list
    projections: list  # each layer's attention output projection (its input is Concat(heads))
    final_norm: torch.nn.Module
    unembedding: torch.Tensor  # [vocab, d]
    unembedding_bias: torch.Tensor | None  # [vocab] or None


def decoder_parts(model: LoadedModel) -> DecoderParts:
    """The parts of a decoder with its next-token head; a ``CircuitError`` for any other model."""
    if model.lm_head_kind != "causal":
        raise CircuitError(
            f"Logit attribution, patching and the logit lens read a next-token prediction: {model.name!r} has "
            f"{model.head_description}. Use a decoder loaded with its language-model head (smollm2, GPT-2)."
        )
    family = families.FAMILY_OF_MODEL_TYPE.get(model.model_type)
    blocks = family.blocks_of(model.hf_model) if family else []
    mlps = family.mlps_of(model.hf_model) if family else []
    final_norm = family.final_norm_of(model.hf_model) if family else None
    if len(blocks) != model.num_layers or len(mlps) != model.num_layers or final_norm is None:
        raise CircuitError(
            f"Headscope does not know the layers of {model.model_type!r} models well enough to read their residual "
            f"stream. Supported decoders: {', '.join(decoder_types())}."
        )
    head = model.lm_model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return DecoderParts(
        blocks=blocks,
        mlps=mlps,
        projections=model.output_projections(),
        final_norm=final_norm,
        unembedding=head.weight.detach().float(),
        unembedding_bias=None if bias is None else bias.detach().float(),
    )


def decoder_types() -> list[str]:
    """The model types whose residual stream can be read (families with a next-token head and their blocks)."""
    return sorted(
        model_type for model_type, family in families.FAMILY_OF_MODEL_TYPE.items() if family.lm_head == "causal"
    )


# ---- inputs -------------------------------------------------------------------------------------
def encoded_prompt(model: LoadedModel, text: str | EncodedText, what: str = "prompt") -> EncodedText:
    """The prompt tokenized as ``model.run`` does (BOS first for decoders), or an ``EncodedText`` as it is; a clear
    error for an empty prompt or one longer than the model takes (cutting it would change the question)."""
    if not isinstance(text, EncodedText):
        check_text(text, what)
    encoded = model.encode(text)
    if encoded.truncated:
        raise CircuitError(
            f"The {what} has {encoded.num_input_tokens:,} tokens; this model takes at most {model.max_tokens:,} "
            "here. Shorten it."
        )
    return encoded


def prompt_ids(model: LoadedModel, text: str | EncodedText, what: str = "prompt") -> list[int]:
    """The prompt's token ids (``encoded_prompt``): every reading of this package takes a text or an
    ``EncodedText`` (tokenized once before, ``mha_core.operations``)."""
    return list(encoded_prompt(model, text, what).input_ids)


def token_id(model: LoadedModel, token: str | int, what: str = "answer") -> int:
    """A single token's id: an id, or a string that is exactly one token (" Mary", with its leading space)."""
    vocabulary = model.lm_model.get_output_embeddings().weight.shape[0]
    if isinstance(token, (int,)) and not isinstance(token, bool):
        if not 0 <= token < vocabulary:
            raise CircuitError(f"The {what} token id {token} is outside the vocabulary (0-{vocabulary - 1}).")
        return int(token)
    if not isinstance(token, str) or not token:
        raise CircuitError(f"The {what} is empty: give one token, e.g. ' Mary' (with its leading space).")
    ids = model.tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        pieces = ", ".join(quoted(model.tokenizer.decode([i]), 20) for i in ids[:6])
        raise CircuitError(
            f"The {what} {quoted(token, 40)} is {len(ids)} tokens ({pieces}), not one: the logit of a single next "
            "token is compared. Try a shorter word, or mind the leading space."
        )
    return int(ids[0])


def token_text(model: LoadedModel, token: int) -> str:
    """A token id as the text it stands for."""
    return model.tokenizer.decode([int(token)])


def same_length_pair(model: LoadedModel, clean: str, corrupted: str) -> tuple[list[int], list[int]]:
    """The clean and corrupted prompts' ids, which patching needs to be of the same length (position by
    position, one prompt's activations replace the other's)."""
    clean_ids = prompt_ids(model, clean, "clean prompt")
    corrupted_ids = prompt_ids(model, corrupted, "corrupted prompt")
    if len(clean_ids) != len(corrupted_ids):
        raise CircuitError(
            f"The clean prompt has {len(clean_ids)} tokens and the corrupted one {len(corrupted_ids)}: patching "
            "replaces activations position by position, so the two must have the same number of tokens "
            "(change a name for another name of one token)."
        )
    if clean_ids == corrupted_ids:
        raise CircuitError("The clean and corrupted prompts are the same tokens: patching needs them to differ.")
    return clean_ids, corrupted_ids


# ---- one pass -----------------------------------------------------------------------------------
def block_output(output) -> torch.Tensor:
    """A block's or MLP's output tensor (transformers modules return a tensor or a tuple starting with it)."""
    return output[0] if isinstance(output, tuple) else output


def lm_pass(
    model: LoadedModel,
    input_ids: torch.Tensor,
    edits: LayerEdits | None = None,
    hooks: Iterable[tuple[torch.nn.Module, object]] = (),
    grad: bool = False,
    last_only: bool = True,
    hidden_states: bool = False,
):
    """One pass of the language model over ``input_ids`` ``[batch, n]`` (no padding), with ``edits`` on the
    heads' outputs and forward ``hooks`` on modules: the transformers output (``logits`` float32, of the last
    position only when ``last_only``; ``hidden_states`` when asked). ``grad``: with autograd on (attribution
    patching); otherwise in inference mode."""
    arguments = {"input_ids": input_ids, "use_cache": False, "return_dict": True}
    if last_only:
        arguments["logits_to_keep"] = 1
    if hidden_states:
        arguments["output_hidden_states"] = True
    mode = torch.enable_grad() if grad else torch.inference_mode()
    with model.edits_applied(edits), forward_hooks(hooks), mode:
        return model.lm_model(**arguments)


def core_last_logits(model: LoadedModel, input_ids: torch.Tensor, edits: LayerEdits | None = None) -> torch.Tensor:
    """The last position's logits ``[batch, vocab]`` from the from-scratch engine's pass (``edits`` on the heads'
    outputs, applied by the engine itself), through the checkpoint's LM head."""
    hidden = model.final_hidden("core", input_ids, edits=edits)
    with torch.inference_mode():
        return model.logits(hidden[:, -1])


def recorded_pass(
    model: LoadedModel, input_ids: torch.Tensor, parts: DecoderParts, what: Sequence[str] = ("z",)
) -> tuple[torch.Tensor, dict]:
    """One plain pass that records, for every layer, what ``what`` names: ``"z"`` the heads' outputs
    ``[batch, n, heads, d_head]`` (``edits.record_heads``), ``"mlp"`` the MLP outputs and ``"block"`` the
    blocks' outputs ``[batch, n, d]``. Returns (last-position logits ``[batch, vocab]``, ``{name: [per layer]}``)."""
    records: dict[str, list] = {name: [] for name in what}
    edits = {}
    if "z" in records:
        stores = [[] for _ in range(model.num_layers)]
        edits = {layer: record_heads(store) for layer, store in enumerate(stores)}
    hooks = []
    for name, modules in (("mlp", parts.mlps), ("block", parts.blocks)):
        if name in records:
            outputs: list = [None] * model.num_layers
            records[name] = outputs
            hooks.extend((module, keeper(outputs, layer)) for layer, module in enumerate(modules))
    output = lm_pass(model, input_ids, edits, hooks)
    if "z" in records:
        records["z"] = [store[-1] for store in stores]
    return output.logits[:, -1].float(), records


def keeper(outputs: list, layer: int):
    """A forward hook that keeps a module's output (detached, float32) as ``outputs[layer]``."""

    def hook(module, args, output):
        outputs[layer] = block_output(output).detach().float()

    return hook


def replacer(values: torch.Tensor, rows: torch.Tensor | None = None, positions: torch.Tensor | None = None):
    """A forward hook that replaces a module's output by ``values`` (``[n, d]``) in the batch rows ``rows``
    (booleans ``[batch]``; None: all) at ``positions`` (booleans ``[batch, n]``; None: every position)."""

    def hook(module, args, output):
        tensor = block_output(output)
        where = torch.ones(tensor.shape[:2], dtype=torch.bool, device=tensor.device)
        if rows is not None:
            where = where & rows[:, None]
        if positions is not None:
            where = where & positions
        replaced = torch.where(where[..., None], values.to(tensor.dtype).expand_as(tensor), tensor)
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    return hook


# ---- the final norm, with its scale frozen -------------------------------------------------------
@dataclass(frozen=True)
class FrozenNorm:
    """The final norm at one position as the linear map it is with its scale frozen from the run:
    ``y = weight * center(x) / scale + bias`` (LayerNorm centres x; RMSNorm does not and has no bias)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: float
    centered: bool

    def __call__(self, parts: torch.Tensor) -> torch.Tensor:
        """Each row of ``parts`` ``[..., d]`` through the frozen norm, without the bias (a term of its own)."""
        if self.centered:
            parts = parts - parts.mean(dim=-1, keepdim=True)
        return self.weight * parts / self.scale


def frozen_norm(norm: torch.nn.Module, residual: torch.Tensor, normed: torch.Tensor) -> FrozenNorm:
    """The final norm's frozen form at a position whose residual stream is ``residual`` ``[d]``, checked
    against the module's own output there (``normed``): an unknown norm is an error, never a wrong answer."""
    residual = residual.double()
    weight = norm.weight.detach().double()
    if isinstance(norm, torch.nn.LayerNorm):
        variance = residual.var(unbiased=False)
        frozen = FrozenNorm(
            weight,
            None if norm.bias is None else norm.bias.detach().double(),
            float((variance + norm.eps) ** 0.5),
            True,
        )
    else:  # RMSNorm (Llama): x / sqrt(mean(x^2) + eps) * weight
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if eps is None:
            raise CircuitError(f"Headscope does not know the final norm {type(norm).__name__} of this model.")
        frozen = FrozenNorm(weight, None, float((residual.pow(2).mean() + eps) ** 0.5), False)
    rebuilt = frozen(residual) + (frozen.bias if frozen.bias is not None else 0)
    if not torch.allclose(rebuilt.float(), normed.float(), rtol=1e-3, atol=1e-3 * float(normed.abs().max()) + 1e-5):
        raise CircuitError(
            f"The final norm {type(norm).__name__} of this model is not a LayerNorm or RMSNorm as Headscope knows "
            "them: its output could not be rebuilt."
        )
    return frozen
