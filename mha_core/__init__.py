"""Headscope's library: multi-head attention from scratch, model extraction, head metrics and roles.

Never imports streamlit or plotly. The public API is what ``__all__`` lists; README.md shows it in use.
"""

from . import edits, errors, hooks, operations

# Beyond raw weights: rollout and flow, norm-based attention, the neuron view.
from .analysis.flow import attention_flow, attention_rollout

# Head metrics and roles.
from .analysis.metrics import HeadDistances, classical_mds, head_distances, head_metrics, semantic_scores
from .analysis.roles import best_heldout_heads, head_roles, primary_roles, syntactic_tests

# Dependency trees and the Clark et al. dependency accuracy.
from .analysis.syntax import Sentence, best_dependency_heads, dependency_scores, load_conllu, parse_text, ud_ewt_dev

# The from-scratch attention (course notes 000, 002, 004) and the data type every step passes on.
from .attention import (
    SCORE_FUNCTIONS,
    MultiHeadAttention,
    attention_scores,
    causal_keep_mask,
    masked_softmax,
    scaled_dot_product_attention,
)

# Many sentences at once: corpus profiling, coreference, head cards and their search.
from .corpus.card_effects import HeadEffect, head_effects
from .corpus.card_search import search_cards
from .corpus.cards import CardContext, HeadCard, HeadCards, head_cards
from .corpus.coreference import coreference_scores, load_coreference
from .corpus.long_cards import LongCard, LongCards, LongContext, long_cards
from .corpus.profiling import ProfileResult, profile
from .corpus.reading import open_corpus, read_corpus

# One way to edit a head: functions of every head's output before the output projection, in both engines.
from .edits import replace_heads, scale_heads, zero_heads

# The from-scratch engine: every layer of a checkpoint recomputed with the code above.
from .engine import registry as families
from .engine.core import core_attentions, core_family

# Circuits: direct logit attribution, activation and attribution patching, the logit lens.
from .interventions.attribution import logit_attribution
from .interventions.decomposition import ScoreDecomposition, score_decomposition

# Causal evidence: head ablation, importance (Michel et al. 2019), pruning curves.
from .interventions.experiments import decoder_head_scores, induction_experiment

# Which input tokens a prediction depends on: token attribution, its faithfulness and agreement (issue 33).
from .interventions.faithfulness import explain, faithfulness, head_agreement, method_agreement
from .interventions.importance import head_importance, pruning_curve

# One head's queries and keys over a corpus in one 2-D projection (AttentionViz).
from .interventions.joint_qk import JointQK, joint_qk
from .interventions.logit_lens import logit_lens
from .interventions.neuron_view import NeuronView, neuron_view
from .interventions.patching import patch
from .interventions.path_patching import path_patch

# What heads' weights do and how heads compose: OV/QK circuits, copying, composition (Elhage et al. 2021).
from .interventions.qkov import composition, copying_scores, ov_circuit, qk_circuit
from .interventions.token_attribution import TokenAttribution, token_attribution
from .interventions.value_zeroing import context_mixing, value_zeroing_rollout

# The lab: tiny transformers trained on tasks that grow known heads.
from .lab import Lab, LabConfig, train_lab

# Model loading and extraction; the model's output (the next-token table, text written token by token with every
# head's attention kept).
from .models import DEFAULT_MODEL, EMBEDDED_MODELS, ENGINES, LoadedModel, Seq2SeqModel, load_model
from .models.generation import generate
from .models.long import LongRun, run_document, run_long
from .models.prediction import predict

# Computations that describe themselves (a key, their peak bytes, a work class, run): what the app and the
# command line run (``mha_core.operations``).
from .operations.long import long_run_bytes

# Positional encoding (course notes 001).
from .positional import position_similarity, relative_shift_matrix, similarity_by_distance, sinusoidal_encoding
from .run import AttentionRun
from .seq2seq_run import CrossAttentionRun, Seq2SeqRun

# The views outside the app: one self-contained HTML file, the same view live in a notebook.
from .views.standalone import save_html, show

# The worked example of course notes 000, computed for real.
from .walkthrough import (
    WorkedExample,
    printed_discrepancies,
    random_example,
    readable_example,
    softmax_saturation,
    worked_example,
)

__all__ = [
    "LongRun",
    "long_run_bytes",
    "run_document",
    "run_long",
    # attention and runs
    "SCORE_FUNCTIONS",
    "AttentionRun",
    "CrossAttentionRun",
    "Seq2SeqModel",
    "Seq2SeqRun",
    "MultiHeadAttention",
    "attention_scores",
    "causal_keep_mask",
    "masked_softmax",
    "scaled_dot_product_attention",
    # metrics and roles
    "HeadDistances",
    "classical_mds",
    "decoder_head_scores",
    "head_distances",
    "head_metrics",
    "head_roles",
    "primary_roles",
    "semantic_scores",
    "syntactic_tests",
    # one head's queries and keys in one projection
    "JointQK",
    "joint_qk",
    # the lab
    "Lab",
    "LabConfig",
    "train_lab",
    # beyond raw weights
    "NeuronView",
    "attention_flow",
    "attention_rollout",
    "neuron_view",
    # positions and the worked example
    "WorkedExample",
    "position_similarity",
    "random_example",
    "readable_example",
    "relative_shift_matrix",
    "printed_discrepancies",
    "similarity_by_distance",
    "sinusoidal_encoding",
    "softmax_saturation",
    "worked_example",
    # named hook points (model.run_with_cache, model.run(hooks=...): docs/hooks.md) and causal evidence
    "hooks",
    "edits",
    "head_importance",
    "induction_experiment",
    "pruning_curve",
    "replace_heads",
    "scale_heads",
    "zero_heads",
    # circuits
    "ScoreDecomposition",
    "composition",
    "copying_scores",
    "logit_attribution",
    "logit_lens",
    "ov_circuit",
    "patch",
    "score_decomposition",
    "path_patch",
    "qk_circuit",
    # which tokens a prediction depends on
    "TokenAttribution",
    "context_mixing",
    "explain",
    "faithfulness",
    "head_agreement",
    "method_agreement",
    "token_attribution",
    "value_zeroing_rollout",
    # engine, families, models
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "ENGINES",
    "LoadedModel",
    "core_attentions",
    "core_family",
    "errors",
    "operations",
    "families",
    "load_model",
    # syntax and corpora
    "CardContext",
    "HeadCard",
    "HeadCards",
    "HeadEffect",
    "LongCard",
    "LongCards",
    "LongContext",
    "ProfileResult",
    "Sentence",
    "best_dependency_heads",
    "best_heldout_heads",
    "coreference_scores",
    "dependency_scores",
    "head_cards",
    "head_effects",
    "load_conllu",
    "load_coreference",
    "long_cards",
    "open_corpus",
    "parse_text",
    "profile",
    "read_corpus",
    "search_cards",
    "ud_ewt_dev",
    # the views outside the app (notebooks, files)
    "save_html",
    "show",
    # the model's output
    "generate",
    "predict",
]
