"""Direct logit attribution: what each head (and each MLP, the embeddings and the biases) writes towards a logit.

The residual stream at a position after the last layer is the sum of every component's output there
(``readout``); through the final norm with its scale frozen from the run, and the unembedding row of the
answer (minus the foil's), each term becomes a number, and the numbers add up to the model's own logit
(difference). A head's term is its output z_h through its slice of the output projection: the projection
applied to Concat(heads) with every other head's slice at 0, minus the projection's bias (a term of its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..hooks import SINGLE_STACK
from ..progress import Progress, report
from .readout import CircuitError, decoder_parts, frozen_norm, layer_points, lm_pass, prompt_ids, token_id, token_text

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

COMPONENTS = ("embed", "head", "attn_bias", "mlp", "norm_bias", "unembed_bias")


def check_position(position: int, length: int) -> int:
    """``position`` (negative counts from the end) as an index into ``length`` tokens."""
    if not -length <= int(position) < length:
        raise CircuitError(f"Position {position} is outside the prompt's {length} tokens.")
    return int(position) % length


def head_outputs(projection: torch.nn.Module, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's output through its slice of the output projection, ``[heads, d]``, and the projection's
    bias ``[d]``, from the heads' outputs at one position ``z`` ``[heads, d_head]``: so that
    ``heads.sum(0) + bias == projection(Concat(z))``."""
    num_heads, d_head = z.shape
    alone = torch.zeros(num_heads, num_heads, d_head, dtype=z.dtype)
    alone[torch.arange(num_heads), torch.arange(num_heads)] = z
    with torch.inference_mode():
        bias = projection(torch.zeros(1, num_heads * d_head, dtype=z.dtype)).float()[0]
        per_head = projection(alone.reshape(num_heads, num_heads * d_head)).float() - bias
    return per_head, bias


def logit_attribution(
    model: LoadedModel,
    text: str,
    answer: str | int,
    foil: str | int | None = None,
    position: int = -1,
    progress: Progress | None = None,
    engine: str = "transformers",
) -> pd.DataFrame:
    """Every component's contribution to the logit of ``answer`` (minus ``foil``'s) predicted at ``position``.

    A long-form table: ``component`` (``"embed"``, ``"head"``, ``"attn_bias"``, ``"mlp"``, ``"norm_bias"``,
    ``"unembed_bias"``; the biases only where the model has them), ``layer`` and ``head`` (empty where they do
    not apply) and ``contribution``. The rows sum to the model's own logit (difference), in
    ``table.attrs["logit_difference"]``, to float32 rounding. ``answer``/``foil``: one token each, as a string
    (" Mary") or an id; the text is tokenized as ``model.run`` does (BOS first). ``engine``: whose pass the
    named points are read from (``hook_embed``, ``hook_pos_embed``, each layer's ``attn.hook_z`` and
    ``hook_mlp_out``, the last ``hook_resid_post``, ``ln_final.hook_scale``)."""
    parts = decoder_parts(model)
    ids = prompt_ids(model, text)
    at = check_position(position, len(ids))
    answer_id = token_id(model, answer, "answer")
    foil_id = None if foil is None else token_id(model, foil, "foil")
    report(progress, 0, 2, "running the prompt")
    layers = model.num_layers
    z_names, mlp_names = layer_points(layers, "attn.hook_z"), layer_points(layers, "hook_mlp_out")
    residual_name = layer_points(layers, "hook_resid_post")[-1]
    embeddings = [name for name in (SINGLE_STACK.embed, SINGLE_STACK.pos_embed) if name in model.hook_names()]
    keep = [*z_names, *mlp_names, *embeddings, residual_name, f"{SINGLE_STACK.final_norm}.hook_scale"]
    logits, cache = lm_pass(model, torch.tensor([ids]), engine, keep=keep, position=at)
    logits = logits[0]
    actual = float(logits[answer_id] - (logits[foil_id] if foil_id is not None else 0.0))
    report(progress, 1, 2, "splitting the residual stream")

    rows: list[tuple[str, int | None, int | None]] = [("embed", None, None)]
    vectors = [sum(cache[name][0, at].float() for name in embeddings)]
    for layer in range(layers):
        per_head, bias = head_outputs(parts.projections[layer], cache[z_names[layer]][0, at].float())
        rows.extend(("head", layer, head) for head in range(model.num_heads))
        vectors.extend(per_head)
        if getattr(parts.projections[layer], "bias", None) is not None:
            rows.append(("attn_bias", layer, None))
            vectors.append(bias)
        rows.append(("mlp", layer, None))
        vectors.append(cache[mlp_names[layer]][0, at].float())
    stack = torch.stack(vectors).double()
    scale = float(cache[f"{SINGLE_STACK.final_norm}.hook_scale"][0, at, 0])
    norm = frozen_norm(parts.final_norm, cache[residual_name][0, at].float(), scale)
    direction = parts.unembedding[answer_id].double()
    if foil_id is not None:
        direction = direction - parts.unembedding[foil_id].double()
    contributions = (norm(stack) @ direction).tolist()
    if norm.bias is not None:
        rows.append(("norm_bias", None, None))
        contributions.append(float(norm.bias @ direction))
    if parts.unembedding_bias is not None:
        bias = parts.unembedding_bias
        rows.append(("unembed_bias", None, None))
        contributions.append(float(bias[answer_id] - (bias[foil_id] if foil_id is not None else 0.0)))
    table = pd.DataFrame(
        {
            "component": [row[0] for row in rows],
            "layer": pd.array([row[1] for row in rows], dtype="Int64"),
            "head": pd.array([row[2] for row in rows], dtype="Int64"),
            "contribution": contributions,
        }
    )
    table.attrs.update(
        logit_difference=actual,
        answer=token_text(model, answer_id),
        foil=None if foil_id is None else token_text(model, foil_id),
        position=at,
        model=model.name,
        engine=engine,
    )
    report(progress, 2, 2, "done")
    return table


def head_grid(table: pd.DataFrame, num_layers: int, num_heads: int, column: str = "contribution"):
    """The heads' rows of a per-head table as a ``[layers, heads]`` array (NaN where a head has no row)."""
    grid = np.full((num_layers, num_heads), np.nan)
    heads = table[table["head"].notna()] if "component" not in table else table[table["component"] == "head"]
    grid[heads["layer"].astype(int).to_numpy(), heads["head"].astype(int).to_numpy()] = heads[column].to_numpy()
    return grid
