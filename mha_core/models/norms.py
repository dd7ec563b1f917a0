"""Norm-based attention (Kobayashi et al. 2020, "Attention is Not Only a Weight"): ||alpha_ij f_h(x_j)|| with
f_h(x) = (x W_V^h + b_V^h) W_O^h, the vector head h actually adds (output bias excluded).
``model.run(text, norms=True)`` fills ``run.norms`` with it.

Value vectors come from ``engine.core.head_vectors`` applied to each layer's input hidden states of the
chosen engine's own pass (transformers' ``hidden_states``, or the from-scratch engine's ``hook_resid_pre``), so
both engines give them, for every family the registry covers. What a run reports besides attention, as
``outputs.py``'s losses are: computed from the pass, not from a run.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ..engine.blocks import HeadVectors
from ..engine.core import head_vectors
from ..errors import HeadscopeError


def _per_head_output(vectors: HeadVectors) -> torch.Tensor:
    """W_O^h of every head, ``[heads, d_v, d_model]`` (row vectors v times it give f_h)."""
    heads, d_v = vectors.value.shape[1], vectors.value.shape[-1]
    return vectors.output_weight.view(-1, heads, d_v).permute(1, 2, 0)


_GRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _output_grams(hf_model, layer: int, vectors: HeadVectors) -> torch.Tensor:
    """G_h = W_O^h (W_O^h)^T, ``[heads, d_v, d_v]``, so that ||v W_O^h||^2 = v G_h v^T (cached per model)."""
    grams = _GRAMS.setdefault(hf_model, {})
    if layer not in grams:
        per_head = _per_head_output(vectors)
        grams[layer] = torch.matmul(per_head, per_head.transpose(1, 2))
    return grams[layer]


def _norms_through(vectors: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """||u W_O^h|| for row vectors u ``[B, H, n, d_v]``: sqrt(u G_h u^T), without forming u W_O^h."""
    squared = (torch.matmul(vectors, gram) * vectors).sum(dim=-1)
    return squared.clamp(min=0).sqrt()


def norm_based_attention(
    hf_model, attentions: torch.Tensor, layer_inputs: list[torch.Tensor]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(norms [B, L, H, n, n], value_norms [B, L, H, n], output_norms [B, L, H, n])``, float32.

    norms[l, h, i, j] = ||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)|| (alpha >= 0);
    value_norms = ||f_h(x_j)||; output_norms = ||sum_j alpha_ij f_h(x_j)|| (the head's output for token i).
    ``attentions`` are the weights of the same pass whose ``layer_inputs`` are given. Norms go through
    the Gram matrix of each head's output projection, so no d_model-wide vector is formed per token.
    """
    batch, num_layers, heads, n, _ = attentions.shape
    if len(layer_inputs) != num_layers:
        raise HeadscopeError(f"{len(layer_inputs)} layer inputs for {num_layers} layers.")
    norms = np.empty((batch, num_layers, heads, n, n), dtype=np.float32)
    value_norms = np.empty((batch, num_layers, heads, n), dtype=np.float32)
    output_norms = np.empty((batch, num_layers, heads, n), dtype=np.float32)
    with torch.inference_mode():
        for layer, x in enumerate(layer_inputs):
            vectors = head_vectors(hf_model, layer, x, values_only=True)
            gram = _output_grams(hf_model, layer, vectors)
            weights = attentions[:, layer].to(vectors.value.dtype)
            size = _norms_through(vectors.value, gram)  # [B, H, n]
            torch.mul(weights, size[:, :, None, :], out=torch.from_numpy(norms[:, layer]))
            value_norms[:, layer] = size.numpy()
            output_norms[:, layer] = _norms_through(torch.matmul(weights, vectors.value), gram).numpy()
    return norms, value_norms, output_norms
