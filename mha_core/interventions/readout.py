"""Reading a decoder's residual stream: the prompt's tokens, the answer's token, and one pass of the language
model with hook functions on its named points, for logit attribution, activation patching and the logit lens.

The residual stream of a pre-norm decoder (GPT-2, Llama) after its last layer is a sum: the embeddings, then
each layer's attention output (its heads through their slices of the output projection, plus its bias) and
MLP output. The LM head reads it through the final norm (LayerNorm or RMSNorm), whose scale depends on the
whole sum; with that scale frozen at its value in the run, the norm is linear and each term's share of a
logit is exact (TransformerLens' ``apply_ln_to_stack``). ``FrozenNorm`` is that linear map.

Every activation is read and replaced at its named point (``mha_core.hooks``: ``blocks.{l}.attn.hook_z``,
``blocks.{l}.hook_mlp_out``, ``blocks.{l}.hook_resid_post``, ``ln_final.hook_scale``), in either engine: ``lm_pass``
is this package's one call into the model, through ``LoadedModel.run_pass``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..engine import registry as families
from ..errors import HeadscopeError, quoted
from ..hooks import block_point
from ..models.forward import ForwardPass
from ..models.tokens import EncodedText, check_text

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel


class CircuitError(HeadscopeError, ValueError):
    """A request attribution, patching or the logit lens cannot answer: a model without a next-token head,
    an answer that is not one token, prompts of different lengths, a prompt longer than the model takes."""


@dataclass(frozen=True)
class DecoderParts:
    """What the residual-stream readings use beside the named points: each layer's attention output projection
    (its input is Concat(heads)), the final norm and the unembedding."""

    projections: list  # each layer's attention output projection
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
    stack = model.modules.stacks["blocks"] if model.modules is not None else None
    if stack is None or stack.final_norm is None:
        raise CircuitError(
            f"Headscope does not know the layers of {model.model_type!r} models well enough to read their residual "
            f"stream. Supported decoders: {', '.join(decoder_types())}."
        )
    head = model.lm_model.get_output_embeddings()
    bias = getattr(head, "bias", None)
    return DecoderParts(
        projections=model.output_projections(),
        final_norm=stack.final_norm,
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
def layer_points(num_layers: int, point: str) -> list[str]:
    """The named point ``point`` of each of ``num_layers`` layers: ``layer_points(30, "attn.hook_z")``."""
    return [block_point(layer, point) for layer in range(num_layers)]


def lm_pass(
    model: LoadedModel,
    input_ids: torch.Tensor,
    engine: str = "transformers",
    hooks: Mapping | None = None,
    keep: Collection[str] = (),
    grad: bool = False,
    position: int = -1,
) -> tuple[torch.Tensor, dict]:
    """One pass of the language model over ``input_ids`` ``[batch, n]`` (no padding) in ``engine``, with ``hooks``
    (``{name: function}``) on its named points: (the logits at ``position``, float32 ``[batch, vocab]``; the tensors
    at the names in ``keep``). ``grad``: with autograd on (attribution patching); otherwise in inference mode."""
    forward = ForwardPass(
        input_ids, hooks=hooks, keep=set(keep).__contains__ if keep else None, keep_hidden=True, attentions=False
    )
    result = model.run_pass(forward.with_changes(grad=grad), engine)
    with torch.enable_grad() if grad else torch.inference_mode():
        return model.logits(result.hidden[:, position]), result.cache


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


def frozen_norm(norm: torch.nn.Module, residual: torch.Tensor, scale: float) -> FrozenNorm:
    """The final norm's frozen form at a position whose residual stream is ``residual`` ``[d]`` and whose scale
    the run had (its point ``ln_final.hook_scale``), checked against the module's own output there: an unknown
    norm is an error, never a wrong answer."""
    residual = residual.double()
    centered = isinstance(norm, torch.nn.LayerNorm)  # else RMSNorm (Llama): x / sqrt(mean(x^2) + eps) * weight
    bias = getattr(norm, "bias", None) if centered else None
    frozen = FrozenNorm(
        norm.weight.detach().double(), None if bias is None else bias.detach().double(), scale, centered
    )
    with torch.inference_mode():
        normed = norm(residual.to(norm.weight.dtype)[None])[0]
    rebuilt = frozen(residual) + (frozen.bias if frozen.bias is not None else 0)
    if not torch.allclose(rebuilt.float(), normed.float(), rtol=1e-3, atol=1e-3 * float(normed.abs().max()) + 1e-5):
        raise CircuitError(
            f"The final norm {type(norm).__name__} of this model is not a LayerNorm or RMSNorm as Headscope knows "
            "them: its output could not be rebuilt."
        )
    return frozen
