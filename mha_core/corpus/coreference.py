"""Coreference: does a head's attention from a pronoun land on its antecedent? (the hand-made set in
``assets/coreference.jsonl``)"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..analysis.syntax import ASSET_DIR, word_argmax, word_units
from ..errors import HeadscopeError

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

COREFERENCE_ASSET = ASSET_DIR / "coreference.jsonl"


# ---- coreference ----------------------------------------------------------------------------
def load_coreference(path: str | Path | None = None) -> list[dict]:
    """The pronoun -> antecedent items: ``{"id", "words", "pronoun", "antecedent": [...], "distractor": [...]}``."""
    path = Path(path) if path is not None else COREFERENCE_ASSET
    items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for item in items:
        n = len(item["words"])
        indices = [item["pronoun"], *item["antecedent"], *item.get("distractor", [])]
        if not item["antecedent"] or not all(0 <= i < n for i in indices):
            raise HeadscopeError(f"coreference item {item.get('id')!r}: word index outside the sentence")
    return items


def coreference_scores(model: LoadedModel, items: Sequence[dict] | None = None, batch_size: int = 16) -> pd.DataFrame:
    """Each head's coreference accuracy: from the pronoun, does its word-level argmax land on the antecedent?

    Word level (Clark et al. 2019): attention to a word sums over all its tokens, so "any token of the
    antecedent" counts; special tokens and the pronoun itself are excluded from the argmax. Columns:
    ``layer, head, accuracy`` (argmax on an antecedent word), ``count`` (pronouns scored),
    ``candidate_accuracy`` (the pronoun gives the antecedent more attention than the distractor noun),
    ``baseline_accuracy`` (the better of always choosing the first or the nearest candidate).
    """
    items = list(items) if items is not None else load_coreference()
    if not items:
        raise HeadscopeError("no coreference items")
    runs = model.run_batch([item["words"] for item in items], batch_size=batch_size)
    correct = candidate_correct = None
    count = candidate_count = 0
    first_right = nearest_right = 0
    for item, run in zip(items, runs):
        prediction, has_word = word_argmax(run)
        pronoun, antecedent = item["pronoun"], list(item["antecedent"])
        distractor = list(item.get("distractor", []))
        if not has_word[pronoun] or not has_word[antecedent].any():
            continue  # truncated or dropped by the tokenizer
        if correct is None:
            correct = np.zeros(prediction.shape[:2], dtype=np.int64)
            candidate_correct = np.zeros(prediction.shape[:2], dtype=np.int64)
        correct += np.isin(prediction[:, :, pronoun], antecedent)
        count += 1
        if distractor:
            word_run, unit_word = word_units(run)
            unit_of_word = {int(w): u for u, w in enumerate(unit_word) if w >= 0}
            row = word_run.attentions[:, :, unit_of_word[pronoun]]
            to_antecedent = row[..., [unit_of_word[w] for w in antecedent if w in unit_of_word]].sum(-1)
            to_distractor = row[..., [unit_of_word[w] for w in distractor if w in unit_of_word]].sum(-1)
            candidate_correct += to_antecedent > to_distractor
            candidate_count += 1
            first_right += min(antecedent) < min(distractor)
            nearest_right += max(antecedent) > max(distractor)
    if correct is None:
        raise HeadscopeError("no coreference item could be scored")
    num_layers, num_heads = correct.shape
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(num_layers), num_heads),
            "head": np.tile(np.arange(num_heads), num_layers),
            "accuracy": correct.ravel() / count,
            "count": count,
            "candidate_accuracy": candidate_correct.ravel() / candidate_count if candidate_count else np.nan,
            "baseline_accuracy": max(first_right, nearest_right) / candidate_count if candidate_count else np.nan,
        }
    )
