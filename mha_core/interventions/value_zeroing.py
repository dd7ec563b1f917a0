"""Value zeroing (Mohebbi, Zuidema, Chrupala and Alishahi, "Quantifying Context Mixing in Transformers", EACL 2023):
how much each layer's output at token i depends on token j, with the whole layer taken into account.

For layer l and token j, token j's value vectors are set to zero in every head of layer l (the point
``blocks.{l}.attn.hook_v``, every key/value head at position j) and layer l is recomputed from its own input as the
model computed it (``blocks.{l}.hook_resid_pre`` held at the unedited pass's value), everything else in the layer as
normal: the output projection, the residual sums, the MLP and the norms, before their sublayer (pre-LN: GPT-2,
Llama) or after the residual sums (post-LN: BERT, MPNet). The layer's output is ``hook_resid_post`` (pre-LN) or
``hook_normalized_resid_post`` (post-LN). The context-mixing score of j for i is the cosine distance between token
i's original and altered outputs,

    C_l[i, j] = 1 - cos(x_l[i], x_l[i] with v_j = 0),

and each row is divided by its sum (the paper's normalisation), so row i is a distribution over the tokens. A
decoder's rows are causal: token i never reads a later token's value, so C_l[i, j] = 0 for j > i (to float32
rounding, ~1e-14). The residual connection is inside the layer output, so the scores are aggregated across the
layers by rollout without the identity that attention rollout adds: R_0 = C_0, R_l = C_l @ R_(l-1), as the
authors do.

Every layer is zeroed in the same pass: a batch of rows, row b zeroing token j_b's values at every layer, with every
layer's input replaced by the unedited pass's, so each layer sees its own input and only its own zeroing. The cost
is one unedited pass of the text and passes over n rows of it (``ZERO_BATCH`` rows a pass): n + 1 sequence-passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..analysis.flow import rollout_product
from ..hooks import block_point
from ..models.forward import ForwardPass
from ..progress import Progress, report

ZERO_BATCH = 16  # rows per pass: SmolLM2 at 128 tokens, without attentions, stays below ~200 MB of activations


def layer_output_point(model, layer: int) -> str:
    """The name of layer ``layer``'s output: ``hook_normalized_resid_post`` (post-LN) or ``hook_resid_post``."""
    normalized = block_point(layer, "hook_normalized_resid_post")
    return normalized if normalized in set(model.hook_names()) else block_point(layer, "hook_resid_post")


def _keep_input(original: torch.Tensor):
    def replace(hidden: torch.Tensor) -> torch.Tensor:
        return original.to(hidden.dtype).expand_as(hidden)

    return replace


def _zero_values(zeroed: torch.Tensor):
    """A ``hook_v`` function: row b's values at position ``zeroed[b]`` set to zero, in every key/value head."""

    def zero(values: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(values.shape[:2], dtype=values.dtype)
        keep[torch.arange(len(zeroed)), zeroed] = 0
        return values * keep[:, :, None, None]

    return zero


def _measure(original: torch.Tensor, scores: torch.Tensor, zeroed: torch.Tensor):
    """A function on a layer's output that writes 1 - cos(original[i], altered_b[i]) into ``scores[i, zeroed[b]]``
    and keeps the output as it is."""
    reference = original[0].double()

    def measure(altered: torch.Tensor) -> None:
        cosine = torch.nn.functional.cosine_similarity(altered.double(), reference[None], dim=-1)  # [B, n]
        scores[:, zeroed] = (1 - cosine).clamp_min(0).T

    return measure


def context_mixing(
    model,
    ids: Sequence[int],
    engine: str = "transformers",
    progress: Progress | None = None,
    batch: int = ZERO_BATCH,
) -> np.ndarray:
    """Value zeroing's context-mixing scores of the token sequence ``ids`` (module docstring): float64
    ``[layers, n, n]``, each row summing to 1 (a row whose outputs no zeroing moves stays 0)."""
    ids = torch.tensor([list(ids)], dtype=torch.long)
    n, layers = ids.shape[1], model.num_layers
    inputs = [block_point(layer, "hook_resid_pre") for layer in range(layers)]
    outputs = [layer_output_point(model, layer) for layer in range(layers)]
    kept = set(inputs) | set(outputs)
    cache = model.run_pass(ForwardPass(ids, keep=kept.__contains__, attentions=False), engine).cache
    scores = torch.zeros(layers, n, n, dtype=torch.float64)
    for start in range(0, n, batch):
        zeroed = torch.arange(start, min(start + batch, n))
        hooks = {}
        for layer in range(layers):
            hooks[inputs[layer]] = _keep_input(cache[inputs[layer]])
            hooks[block_point(layer, "attn.hook_v")] = _zero_values(zeroed)
            hooks[outputs[layer]] = _measure(cache[outputs[layer]], scores[layer], zeroed)
        model.run_pass(ForwardPass(ids.expand(len(zeroed), n), hooks=hooks, attentions=False), engine)
        report(progress, int(zeroed[-1]) + 1, n, "value zeroing")
    totals = scores.sum(dim=-1, keepdim=True)
    return torch.where(totals > 0, scores / totals.clamp_min(1e-300), scores).numpy()


def value_zeroing_rollout(mixing: np.ndarray) -> np.ndarray:
    """Value zeroing aggregated over the layers, ``[layers, n, n]``: R_0 = C_0, R_l = C_l @ R_(l-1) (no identity
    added: the residual connection is inside each layer's scores)."""
    return rollout_product(np.asarray(mixing, dtype=np.float64))
