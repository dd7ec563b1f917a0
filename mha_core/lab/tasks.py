"""The lab's tasks: the data of each (seeded batches) and the scores of the heads it should grow, with the scorers
of ``analysis.roles``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.roles import (
    copy_target_pattern,
    detection_score,
    offset_pattern,
    prefix_matching_score,
    previous_token_pattern,
    query_mass_score,
)
from .config import LabConfig

IGNORE = -100  # target of a position that is not trained on


# ---- tasks ------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """``inputs [B, n]``, ``targets [B, n]`` (IGNORE where not trained), ``focus [B, n]`` bool: the
    positions only the task's circuit can predict (the repeated part, for induction)."""

    inputs: np.ndarray
    targets: np.ndarray
    focus: np.ndarray


def induction_batch(rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int) -> Batch:
    """Distinct random tokens; a segment of random length is copied to a random later place.

    Segment length, source and destination are drawn per sequence, so neither the period nor the
    position of the copy is fixed: only "find the earlier copy of this token and read what followed"
    (an induction circuit) predicts it. Tokens are distinct apart from the copy, so each token of the
    copy has exactly one earlier occurrence. ``focus`` marks the queries inside the copy whose next
    token is also in the copy.
    """
    inputs = np.stack([rng.permutation(vocab_size)[:seq_len] for _ in range(batch)])
    focus = np.zeros((batch, seq_len), dtype=bool)
    low, high = max(2, seq_len // 4), seq_len // 2
    for row in range(batch):
        length = int(rng.integers(low, high + 1))
        source = int(rng.integers(0, seq_len - 2 * length + 1))
        destination = int(rng.integers(source + length, seq_len - length + 1))
        inputs[row, destination : destination + length] = inputs[row, source : source + length]
        focus[row, destination : destination + length - 1] = True
    targets = np.full_like(inputs, IGNORE)
    targets[:, :-1] = inputs[:, 1:]
    return Batch(inputs, targets, focus)


def positional_batch(rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int, offset: int) -> Batch:
    """Random tokens; query i must output the token ``offset`` places back (none for i < offset)."""
    inputs = rng.integers(0, vocab_size, size=(batch, seq_len))
    targets = np.full_like(inputs, IGNORE)
    targets[:, offset:] = inputs[:, :-offset]
    return Batch(inputs, targets, targets != IGNORE)


def largest_batch(rng: np.random.Generator, batch: int, seq_len: int, vocab_size: int) -> Batch:
    """Random tokens; query i must output the largest token among 0..i (a comparison of contents)."""
    inputs = rng.integers(0, vocab_size, size=(batch, seq_len))
    targets = np.maximum.accumulate(inputs, axis=1)
    return Batch(inputs, targets, np.ones_like(inputs, dtype=bool))


def task_batch(config: LabConfig, rng: np.random.Generator, batch: int) -> Batch:
    if config.task == "induction":
        return induction_batch(rng, batch, config.seq_len, config.vocab_size)
    if config.task == "positional":
        return positional_batch(rng, batch, config.seq_len, config.vocab_size, config.offset)
    return largest_batch(rng, batch, config.seq_len, config.vocab_size)


def task_roles(config: LabConfig) -> tuple[str, ...]:
    """The roles a task's heads are scored on, in the order they should appear."""
    if config.task == "induction":
        return ("previous_token", "induction")
    if config.task == "positional":
        return (f"offset_{-config.offset}",)
    return ("copy_largest",)


def role_scores(config: LabConfig, attentions: np.ndarray, batch: Batch) -> dict[str, np.ndarray]:
    """Every role of the task for every head, ``{role: [L, H]}``, averaged over the batch's sequences.

    previous_token  TransformerLens's detection score with the previous-token pattern (``roles``)
    induction       the prefix-matching score: mass on the tokens right after earlier copies of the query
    offset_-k       the detection score with the pattern at offset -k
    copy_largest    per query, the mass on the keys holding the token it must output
    """
    n = attentions.shape[-1]
    out: dict[str, list[np.ndarray]] = {role: [] for role in task_roles(config)}
    for index, ids in enumerate(batch.inputs):
        heads = attentions[index]  # [L, H, n, n]
        for role in out:
            if role == "previous_token":
                value = detection_score(heads, previous_token_pattern(n))
            elif role == "induction":
                value = prefix_matching_score(heads, ids)
            elif role.startswith("offset_"):
                value = detection_score(heads, offset_pattern(n, -config.offset))
            else:
                value = query_mass_score(heads, copy_target_pattern(ids, batch.targets[index]))
            out[role].append(value)
    return {role: np.nanmean(np.stack(values), axis=0) for role, values in out.items()}
