"""The Lab's tiny transformers (``mha_core.lab``): training steps, a head ablated, and the fixed example as a run.

Their ``model`` is the ``Lab`` itself (a session's own, not a loaded checkpoint named by a string): these
operations name no model and are never kept under their key (training changes the lab). ``training_step_bytes``
is also what ``LabConfig`` refuses a model by, before anything is allocated.
"""

from __future__ import annotations

from typing import Any

from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, LIGHT, Operation, operation, pass_peak_bytes

# A ``mha_core.lab.LabConfig``: not imported, since the lab imports this module (its config refuses a model by
# ``training_step_bytes`` before anything is allocated).
LabConfig = Any


def training_step_bytes(config: LabConfig) -> int:
    """About what a training step of ``config``'s model holds at its peak, in bytes: float32 weights, their
    gradients and AdamW's two moments, and the activations kept for the backward pass (every layer's attention
    weights and hidden states, the logits)."""
    hidden = config.batch_size * config.seq_len * config.d_model
    attention = config.batch_size * config.num_heads * config.seq_len**2
    per_layer = 2 * attention + (8 if config.mlp else 4) * hidden
    logits = 2 * config.batch_size * config.seq_len * config.vocab_size
    table = config.position_rows() * config.d_model if config.positions == "sinusoidal" else 0
    return FLOAT_BYTES * (4 * config.parameter_count() + table + config.num_layers * per_layer + logits)


@operation
class LabTraining(Operation):
    """``steps`` more training steps of a ``Lab`` (``Lab.train``), scored every ``score_every`` steps and, with
    ``score_last``, after the last one: the lab's history."""

    work_class = HEAVY
    config: LabConfig
    steps: int
    score_every: int = 25
    score_last: bool = True

    @property
    def progress_label(self) -> str:
        return f"Training {self.steps:,} steps..."

    def peak_bytes(self, model) -> int:
        return training_step_bytes(self.config)

    def run(self, model, progress: Progress | None = None):
        return model.train(self.steps, score_every=self.score_every, progress=progress, score_last=self.score_last)


@operation
class LabAblation(Operation):
    """The loss on the lab's evaluation batch with head (``layer``, ``head``) zero-ablated, beside the intact
    model's (``Lab.ablation``)."""

    work_class = LIGHT
    config: LabConfig
    layer: int
    head: int

    def peak_bytes(self, model) -> int:
        """Two passes over the evaluation batch, one after the other."""
        config = self.config
        return pass_peak_bytes(config.num_layers, config.num_heads, config.seq_len, batch=config.eval_sequences)

    def run(self, model, progress: Progress | None = None):
        return model.ablation(self.layer, self.head)


@operation
class LabExample(Operation):
    """The lab's evaluation sequence ``index`` as an ``AttentionRun`` (``Lab.run``), which Explore can show."""

    work_class = LIGHT
    config: LabConfig
    index: int = 0

    def peak_bytes(self, model) -> int:
        config = self.config
        return pass_peak_bytes(config.num_layers, config.num_heads, config.seq_len, batch=config.eval_sequences)

    def run(self, model, progress: Progress | None = None):
        return model.run(self.index)
