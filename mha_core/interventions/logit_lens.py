"""The logit lens (nostalgebraist 2020): what the residual stream "says" after each layer, read through the model's
own final norm and unembedding as if the layers after it were not there. After the last layer it is the model's
own prediction."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import torch

from ..progress import Progress, report
from .readout import CircuitError, decoder_parts, layer_points, lm_pass, prompt_ids

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

MAX_K = 50


def logit_lens(
    model: LoadedModel, text: str, k: int = 5, progress: Progress | None = None, engine: str = "transformers"
) -> pd.DataFrame:
    """The top ``k`` next tokens after every layer at every position: a long-form table with ``layer``,
    ``position``, ``rank`` (from 0), ``token`` (the decoded text, e.g. " Paris"), ``shown`` (the token as the
    head view shows it: ``model.display``, white space as symbols, "␣" for a space), ``token_id``, ``logit`` and
    ``probability``. The text is tokenized as ``model.run`` does; ``table.attrs["tokens"]`` are its tokens. The
    residual stream after each layer is its point ``blocks.{l}.hook_resid_post`` in ``engine``'s pass."""
    if not 1 <= int(k) <= MAX_K:
        raise CircuitError(f"k must be from 1 to {MAX_K}, got {k}.")
    parts = decoder_parts(model)
    ids = prompt_ids(model, text)
    report(progress, 0, model.num_layers + 1, "running the prompt")
    names = layer_points(model.num_layers, "hook_resid_post")
    _, cache = lm_pass(model, torch.tensor([ids]), engine, keep=names)
    frames = []
    for layer, residual in enumerate(cache[name] for name in names):
        with torch.inference_mode():
            logits = model.logits(parts.final_norm(residual[0]))  # [n, vocab]
        top = torch.topk(logits, int(k), dim=-1)
        probability = torch.softmax(logits, dim=-1).gather(-1, top.indices)
        token_ids = top.indices.reshape(-1).tolist()
        frames.append(
            pd.DataFrame(
                {
                    "layer": layer,
                    "position": torch.arange(len(ids)).repeat_interleave(int(k)).tolist(),
                    "rank": list(range(int(k))) * len(ids),
                    "token": [model.tokenizer.decode([i]) for i in token_ids],
                    "shown": [model.display(raw) for raw in model.tokenizer.convert_ids_to_tokens(token_ids)],
                    "token_id": token_ids,
                    "logit": top.values.reshape(-1).tolist(),
                    "probability": probability.reshape(-1).tolist(),
                }
            )
        )
        report(progress, layer + 1, model.num_layers + 1, f"layer {layer}")
    table = pd.concat(frames, ignore_index=True)
    tokens = model.display.display(model.tokenizer.convert_ids_to_tokens(ids))
    table.attrs.update(tokens=tokens, model=model.name, engine=engine)
    return table
