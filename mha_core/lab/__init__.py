"""The lab: train a tiny transformer built from ``MultiHeadAttention`` and watch its heads specialise.

A ``Lab`` holds a small causal model (token embedding, positions, blocks of the from-scratch attention,
optional MLPs), an AdamW optimiser, a seeded data stream for one task, and the history of every scored
step. Each task says which head it should grow and scores it with the scorers of ``mha_core.analysis.roles``:

    induction   random tokens in which a segment repeats at a random offset: a previous-token head in
                layer 0, then an induction head in layer 1 that reads the token after the earlier copy
    positional  output the token ``k`` steps back: one head at offset -k
    largest     output the largest token so far: a content head that finds the largest key

Two training choices serve the induction circuit (``LabConfig``; measured in docs/benchmarks.md): each
training sequence reads the learned positions from a random start row (``position_offsets``), because a
copy comes after its source and with fixed positions the last positions never teach the previous-token
head; and the loss weighs the positions no circuit can predict less (``other_weight``). Evaluation, scores
and ablations use every position and rows from 0.

Training is reproducible for a seed and a torch thread count. ``Lab.train`` takes the library's
``progress(done, total, message)``, which may raise to stop (the page's Pause does that).

Modules: ``config`` (``LabConfig``), ``tasks`` (the data and the scores of each task), ``model`` (``LabModel``),
``training`` (``Lab``, its history and what it shows).
"""

from .config import MAX_SEED, MAX_TRAINING_BYTES, POSITIONS, TASKS, LabConfig
from .model import LabModel
from .tasks import task_roles
from .training import ROLE_THRESHOLD, Lab, history_frame, lab_summary, phase_change_step, role_appearance, train_lab

__all__ = [
    "MAX_SEED",
    "MAX_TRAINING_BYTES",
    "POSITIONS",
    "ROLE_THRESHOLD",
    "TASKS",
    "Lab",
    "LabConfig",
    "LabModel",
    "history_frame",
    "lab_summary",
    "phase_change_step",
    "role_appearance",
    "task_roles",
    "train_lab",
]
