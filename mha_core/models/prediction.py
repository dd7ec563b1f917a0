"""What the model predicts: the next-token distribution at the last position (decoders) or at a masked token
(masked language models), as a table of rank, token, id, probability and logit.

The logits come from the same forward pass as the attentions: a ``ForwardPass`` with ``logits_at`` keeps the LM
head's output at one position per text (``PassResult.logits``), and a run made with ``predict=True`` carries the
prediction in ``metadata["prediction"]`` (``prediction_record``), so a page that draws the heads draws the table
without a second pass. ``model`` is a ``LoadedModel`` (``models.loaded`` imports this module).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..errors import HeadscopeError, InputTextError
from .forward import ForwardPass
from .tokens import EncodedText

# How many of the most likely tokens a run keeps (the app shows ten; the rest of the vocabulary is summed).
PREDICTION_KEPT = 50
PREDICTION_COLUMNS = ("rank", "token", "id", "probability", "logit")


def check_predicts(model) -> None:
    """Raise a clear ``HeadscopeError`` when ``model`` has no language-model head (a sentence encoder such as
    MiniLM or MPNet): nothing to predict with."""
    if model.lm_head_kind is None:
        raise HeadscopeError(
            f"{model.name!r} has no language-model head, so it predicts no token: {model.head_description}. "
            "Predictions need a decoder (SmolLM2, GPT-2) or a masked language model (BERT with its MLM head)."
        )


def prediction_position(model, encoded: EncodedText, position: int | None = None) -> int | None:
    """Where ``encoded`` is predicted: ``position`` when given (checked), else the last token for a causal head
    and the first mask token for a masked one; None when a masked model's text has no mask token."""
    n = len(encoded)
    if position is not None:
        position = int(position)
        if not -n <= position < n:
            raise InputTextError(f"Position {position} is outside the text's {n} tokens.")
        return position % n
    if model.lm_head_kind == "causal":
        return n - 1
    mask_id = model.tokenizer.mask_token_id
    if model.lm_head_kind == "masked" and mask_id is not None and mask_id in encoded.input_ids:
        return encoded.input_ids.index(mask_id)
    return None


def prediction_record(logits: torch.Tensor, position: int, kept: int = PREDICTION_KEPT) -> dict:
    """The ``kept`` most likely tokens of one position's logits ``[vocab]``, as plain lists a run's metadata can
    save: ``position``, ``ids``, ``logits``, ``probabilities`` (softmax over the whole vocabulary)."""
    logits = logits.detach().float().reshape(-1)
    probabilities = torch.softmax(logits, dim=-1)
    top = torch.topk(probabilities, min(int(kept), probabilities.numel()))
    return {
        "position": int(position),
        "ids": [int(i) for i in top.indices],
        "logits": [float(logits[i]) for i in top.indices],
        "probabilities": [float(p) for p in top.values],
    }


def prediction_frame(tokenizer, record: dict, k: int = 10) -> pd.DataFrame:
    """The table of a ``prediction_record`` (``tokenizer``: the model's, which spells the tokens): ``rank`` (1 first), ``token`` (as the tokenizer writes it, spaces
    shown), ``id``, ``probability``, ``logit``; its ``k`` first rows."""
    if k < 1:
        raise InputTextError(f"k must be at least 1, got {k}.")
    ids = record["ids"][: int(k)]
    return pd.DataFrame(
        {
            "rank": np.arange(1, len(ids) + 1),
            "token": [tokenizer.decode([i]) for i in ids],
            "id": np.asarray(ids, dtype=np.int64),
            "probability": np.asarray(record["probabilities"][: len(ids)], dtype=np.float64),
            "logit": np.asarray(record["logits"][: len(ids)], dtype=np.float64),
        },
        columns=list(PREDICTION_COLUMNS),
    )


def run_prediction(run, tokenizer, k: int = 10) -> pd.DataFrame | None:
    """The prediction a run carries (made with ``predict=True``), as ``prediction_frame``; None without one."""
    record = run.metadata.get("prediction")
    return None if record is None else prediction_frame(tokenizer, record, k)


def predict(
    model,
    text: str,
    k: int = 10,
    position: int | None = None,
    engine: str = "transformers",
    bos: bool | None = None,
) -> pd.DataFrame:
    """The next-token distribution of ``text``: a decoder's at its last token, a masked model's at its first mask
    token (``[MASK]``, ``<mask>``) or at ``position``; the ``k`` most likely tokens as ``rank, token, id,
    probability, logit`` (probability: softmax over the whole vocabulary of the model's logits).

    One forward pass that captures no attention (``ForwardPass(logits_at=...)``); a run that shows the heads
    too is ``model.run(text, predict=True)`` (``run_prediction``). Raises ``HeadscopeError`` for a model without
    a language-model head and ``InputTextError`` for a masked model's text without a mask token."""
    check_predicts(model)
    if k < 1:
        raise InputTextError(f"k must be at least 1, got {k}.")
    encoded = model.encode(text, bos=bos)
    where = prediction_position(model, encoded, position)
    if where is None:
        mask = model.tokenizer.mask_token or "the mask token"
        raise InputTextError(f"The text has no {mask} to predict: put {mask} where the model should fill in a word.")
    types = None if encoded.token_type_ids is None else torch.tensor([encoded.token_type_ids])
    forward = ForwardPass(torch.tensor([encoded.input_ids]), token_type_ids=types, attentions=False, logits_at=(where,))
    logits = model.run_pass(forward, engine).logits[0]
    return prediction_frame(model.tokenizer, prediction_record(logits, where, max(int(k), 1)), k)
