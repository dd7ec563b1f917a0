"""Computations that describe themselves: every computation the app or the command line runs, as a small frozen
object with its ``key``, ``peak_bytes(model)``, ``work_class`` and ``run(model, progress)`` (``base``).

By idea: ``runs`` (one text: its attention, an encoder-decoder's, the neuron view, a search vector), ``long`` (a
long document, a needle test the model answers), ``corpus`` (a profile, coreference, a search index), ``cards`` (every head's card over a corpus), ``causal``
(ablation, the induction experiment, head importance), ``circuits`` (attribution, patching, the logit lens),
``decomposition`` (one score split by source), ``output`` (the next-token prediction, a generation), ``joint_qk`` (one head's queries and keys projected together), ``qkov`` (OV/QK circuits, copying,
composition, path patching),
``lab`` (the Lab's training, ablation and example) and ``derived``
(what is computed from a run without a model: a view of it, its metrics, head distances, semantic scores, rollout
and flow; run on the run itself).

    op = Attention.of(model, "The cat sat on the mat.")      # tokenized once, here
    op.key, op.peak_bytes(model), op.work_class              # what names it, what it holds, its share
    run = op.run(model, progress=None)                       # the AttentionRun

The app runs each through ``ui.compute.compute(op)`` (gated, budgeted, cached under ``op.key``), the command line
through ``mha_core.__main__.load_compute_write``.
"""

from .base import HEAVY, LIGHT, Operation, WorkClass, key_of, operation
from .cards import Cards, LongHeadCards
from .causal import AblationEffect, DecoderScores, GroupAblation, Importance, InductionExperiment, RoleAblation
from .circuits import Attribution, LogitLens, Patching, prompt
from .corpus import Coreference, Profile, SearchIndex
from .decomposition import Decomposition
from .joint_qk import JointQueryKey
from .lab import LabAblation, LabExample, LabTraining, training_step_bytes
from .long import LongAttention, NeedleTest, long_run_bytes, most_tokens_within, needle_run_bytes
from .output import Generation, Prediction
from .qkov import Composition, CopyingScores, OVCircuit, PathPatching, QKCircuit
from .runs import Attention, Neurons, SearchVector, Seq2SeqAttention

__all__ = [
    "HEAVY",
    "LIGHT",
    "AblationEffect",
    "Attention",
    "Attribution",
    "Cards",
    "Composition",
    "CopyingScores",
    "Coreference",
    "DecoderScores",
    "Decomposition",
    "Generation",
    "GroupAblation",
    "Importance",
    "InductionExperiment",
    "JointQueryKey",
    "LabAblation",
    "LabExample",
    "LabTraining",
    "LogitLens",
    "LongAttention",
    "LongHeadCards",
    "NeedleTest",
    "Neurons",
    "OVCircuit",
    "Operation",
    "PathPatching",
    "Patching",
    "Prediction",
    "Profile",
    "QKCircuit",
    "RoleAblation",
    "SearchIndex",
    "SearchVector",
    "Seq2SeqAttention",
    "WorkClass",
    "key_of",
    "long_run_bytes",
    "most_tokens_within",
    "needle_run_bytes",
    "operation",
    "prompt",
    "training_step_bytes",
]
