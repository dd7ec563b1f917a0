"""What a run reports besides attention: token losses (models with a language-model head) or, for ablated runs
of encoders without one, the output change.

Losses: models with a causal LM head, -log p(token[i+1] | tokens[:i+1]); models with a masked-LM head, the
loss of each non-special token masked in turn; sentence encoders without a head, the output change: the
cosine distance between the mean-pooled final hidden states with and without the intervention (the hook functions) (0 when
nothing changes).

``model`` is a ``LoadedModel`` (``models.loaded``, which imports this module, so it is not imported here).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..errors import HeadscopeError
from .forward import ForwardPass
from .tokens import EncodedText


# ---- losses ---------------------------------------------------------------------------------------
def padded(model, encoded: Sequence[EncodedText]) -> ForwardPass:
    """A pass over the texts right-padded to the longest: ``input_ids``, ``attention_mask``, ``token_type_ids``
    (None when the model takes none)."""
    width = max(len(item) for item in encoded)
    ids = torch.full((len(encoded), width), model.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    types = torch.zeros((len(encoded), width), dtype=torch.long) if model.uses_token_types else None
    for row, item in enumerate(encoded):
        ids[row, : len(item)] = torch.tensor(item.input_ids)
        mask[row, : len(item)] = 1
        if types is not None:
            types[row, : len(item)] = torch.tensor(item.token_type_ids)
    return ForwardPass(ids, mask, types)


def next_token_losses(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``-log p(token[i+1] | tokens[:i+1])``: float32 ``[..., n - 1]`` from logits ``[..., n, vocab]``."""
    return F.cross_entropy(
        logits[..., :-1, :].reshape(-1, logits.shape[-1]).float(), input_ids[..., 1:].reshape(-1), reduction="none"
    ).reshape(input_ids[..., 1:].shape)


def chunked_next_token_losses(model, hidden: torch.Tensor, ids: torch.Tensor, chunk: int = 64) -> np.ndarray:
    """``next_token_losses`` of one text ``hidden [n, d]``, ``ids [n]``, with logits for ``chunk`` positions at a
    time (a whole text's logits, n x vocabulary, would be 100 MB for SmolLM2 at 512 tokens)."""
    losses = []
    with torch.inference_mode():
        for start in range(0, max(len(ids) - 1, 0), chunk):
            stop = min(start + chunk, len(ids) - 1)
            logits = model.logits(hidden[start:stop])
            losses.append(F.cross_entropy(logits, ids[start + 1 : stop + 1], reduction="none"))
    return torch.cat(losses).numpy().copy() if losses else np.zeros(0, dtype=np.float32)


def masked_token_losses(model, engine: str, text: ForwardPass, special_mask) -> np.ndarray:
    """Each non-special token's loss with that token replaced by the mask token: float32 ``[n]``, NaN at specials.

    ``text``: one text's pass (``input_ids``, ``token_type_ids``, ``hooks``; no padding). One batch of k copies
    of the text, copy j with its j-th non-special token masked (k forward passes' work).
    """
    ids = torch.as_tensor(text.input_ids).reshape(-1)
    token_type_ids = text.token_type_ids
    losses = np.full(len(ids), np.nan, dtype=np.float32)
    positions = [i for i, special in enumerate(special_mask) if not special]
    mask_id = model.tokenizer.mask_token_id
    if not positions or mask_id is None:
        return losses
    copies = ids.repeat(len(positions), 1)
    rows = torch.arange(len(positions))
    where = torch.tensor(positions)
    copies[rows, where] = mask_id
    types = None if token_type_ids is None else torch.as_tensor(token_type_ids).reshape(1, -1).repeat(len(positions), 1)
    with torch.inference_mode():
        copied = ForwardPass(copies, token_type_ids=types, hooks=text.hooks)
        hidden = model.hidden_states(copied, engine)[rows, where]
        per_token = F.cross_entropy(model.logits(hidden), ids[where], reduction="none")
    losses[positions] = per_token.numpy()
    return losses


def output_change(base_hidden: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None = None):
    """``(sentence [B], tokens [B, n])`` cosine distances (1 - cos) of mean-pooled and per-token hidden states."""
    if mask is None:
        mask = torch.ones(hidden.shape[:2])
    weights = mask[..., None].to(hidden.dtype)

    def pooled(states):
        return (states * weights).sum(1) / weights.sum(1).clamp_min(1.0)

    sentence = 1.0 - F.cosine_similarity(pooled(base_hidden), pooled(hidden), dim=-1)
    tokens = (1.0 - F.cosine_similarity(base_hidden, hidden, dim=-1)) * mask.to(hidden.dtype)
    return sentence, tokens


def losses_wanted(model, losses: bool | None, hooks: dict | None) -> bool:
    """Whether a run reports ``run_outputs`` (which needs the pass's final hidden states): ``losses`` True or
    False, or None: for ablated (or otherwise hooked) runs only. Masked-LM losses cost one forward pass per
    token, causal ones the LM head over every position (+20% on SmolLM2), so plain runs do not pay for them."""
    wanted = bool(hooks) if losses is None else bool(losses)
    return wanted and (model.lm_head_kind is not None or bool(hooks))


def run_outputs(
    model, engine: str, forward: ForwardPass, hidden: torch.Tensor | None, encoded: Sequence[EncodedText]
) -> list[dict]:
    """What each run of a batch reports besides attention, when it was asked for (``losses_wanted``):
    ``token_losses`` (models with a head) or, for ablated (hooked) runs of encoders without one, ``output_change`` and
    ``token_output_change``. ``forward``: the batch's pass; ``hidden``: its final hidden states (None when
    nothing is reported)."""
    rows: list[dict] = [{} for _ in encoded]
    input_ids, attention_mask, token_type_ids, hooks = (
        forward.input_ids,
        forward.attention_mask,
        forward.token_type_ids,
        forward.hooks,
    )
    if hidden is None:
        return rows
    if model.lm_head_kind == "causal":
        for row, item in enumerate(encoded):
            rows[row]["token_losses"] = chunked_next_token_losses(
                model, hidden[row, : len(item)], input_ids[row, : len(item)]
            )
    elif model.lm_head_kind == "masked":
        for row, item in enumerate(encoded):
            types = None if token_type_ids is None else token_type_ids[row, : len(item)]
            text = ForwardPass(torch.tensor(item.input_ids), token_type_ids=types, hooks=hooks)
            rows[row]["token_losses"] = masked_token_losses(model, engine, text, item.special_mask)
    elif hooks:
        base = model.hidden_states(ForwardPass(input_ids, attention_mask, token_type_ids), engine)
        sentence, tokens = output_change(base, hidden, attention_mask)
        for row, item in enumerate(encoded):
            rows[row]["output_change"] = float(sentence[row])
            rows[row]["token_output_change"] = tokens[row, : len(item)].numpy().copy()
    return rows


def loss_table(before, after) -> pd.DataFrame:
    """Per token, before and after an ablation: ``position, token, loss_before, loss_after, change`` (models with
    a head; a causal head's row i is the loss of predicting token i from the tokens before it), or
    ``position, token, output_change`` (encoders without a head)."""
    if after.token_losses is None:
        change = after.token_output_change if after.token_output_change is not None else np.zeros(after.num_tokens)
        return pd.DataFrame({"position": np.arange(after.num_tokens), "token": after.tokens, "output_change": change})
    if before.token_losses is None:
        raise HeadscopeError(
            "The run before the ablation carries no losses (plain runs skip them): make it with "
            "model.run(..., losses=True)."
        )
    offset = 1 if after.is_causal and len(after.token_losses) == after.num_tokens - 1 else 0
    positions = np.arange(offset, offset + len(after.token_losses))
    return pd.DataFrame(
        {
            "position": positions,
            "token": [after.tokens[i] for i in positions],
            "loss_before": before.token_losses,
            "loss_after": after.token_losses,
            "change": after.token_losses - before.token_losses,
        }
    )
