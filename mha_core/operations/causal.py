"""Causal evidence: what removing heads does (``mha_core.interventions``): the decoder scores on repeated random
tokens, the induction experiment, head importance with its pruning curves, a sentence's role groups ablated, a
corpus's role groups against random heads, and one text's losses before and after ablating heads."""

from __future__ import annotations

from dataclasses import field

import pandas as pd

from ..corpus.reading import corpus_texts, read_corpus
from ..interventions.experiments import decoder_head_scores, group_ablation, induction_experiment, role_group_ablation
from ..interventions.importance import head_importance, pruning_curve
from ..models.tokens import EncodedText
from ..progress import Progress, progress_part
from .base import (
    GRADIENT_PEAK_FACTOR,
    HEAVY,
    LIGHT,
    NOT_IN_KEY,
    Operation,
    batch_peak_bytes,
    operation,
    pass_peak_bytes,
)
from .corpus import UD_DEV
from .runs import Attention

# ``decoder_head_scores``' sequences: BOS + 20 random tokens + the same 20, 4 to a pass.
DECODER_SCORE_TOKENS, DECODER_SCORE_BATCH = 41, 4
# ``induction_experiment``'s sequences: BOS + 50 random tokens + the same 50.
INDUCTION_TOKENS = 101
LOSS_PROBE_BATCH = 16  # texts per pass of ``LossProbe`` (ablation experiments)


@operation
class DecoderScores(Operation):
    """Previous-token, duplicate, induction and prefix-matching scores of every head on repeated random tokens
    (``mha_core.decoder_head_scores``)."""

    work_class = LIGHT
    model: str

    def peak_bytes(self, model) -> int:
        layers, heads = model.num_layers, model.num_heads
        return pass_peak_bytes(layers, heads, DECODER_SCORE_TOKENS, batch=DECODER_SCORE_BATCH)

    def run(self, model, progress: Progress | None = None):
        return decoder_head_scores(model, batch=DECODER_SCORE_BATCH)


@operation
class InductionExperiment(Operation):
    """The top-``top_k`` heads of ``role`` ablated against ``draws`` sets of k random heads on repeated random tokens
    (``mha_core.induction_experiment``). ``scores``: the model's decoder scores when already computed
    (``DecoderScores``; not part of the key: they are the model's own)."""

    work_class = HEAVY
    model: str
    top_k: int = 5
    draws: int = 4
    role: str = "induction"
    ablation: str = "zero"
    batch: int = 8
    scores: pd.DataFrame | None = field(default=None, metadata=NOT_IN_KEY)

    @property
    def progress_label(self) -> str:
        return "Running the experiment..."

    def peak_bytes(self, model) -> int:
        return pass_peak_bytes(model.num_layers, model.num_heads, INDUCTION_TOKENS, batch=self.batch)

    def run(self, model, progress: Progress | None = None):
        return induction_experiment(
            model,
            top_k=self.top_k,
            random_draws=self.draws,
            role=self.role,
            scores=self.scores,
            ablation=self.ablation,
            batch=self.batch,
            progress=progress,
        )


@operation
class Importance(Operation):
    """Head importance over a corpus (Michel et al. 2019, ``mha_core.head_importance``) and, with ``pruning``, the
    pruning curves in importance order and ``seeds`` random orders (``pruning_curve``): ``(importance, curves or
    None)``."""

    work_class = HEAVY
    model: str
    max_sentences: int = 100
    method: str = "gradient"
    corpus: str = UD_DEV
    batch_size: int = 8
    pruning: bool = False
    steps: int = 10
    seeds: int = 3

    def texts(self) -> list[str]:
        return corpus_texts(read_corpus(self.corpus, self.max_sentences))

    @property
    def progress_label(self) -> str:
        return f"Head importance over {len(self.texts()):,} sentences..."

    def peak_bytes(self, model) -> int:
        return batch_peak_bytes(model, self.texts(), self.batch_size, factor=GRADIENT_PEAK_FACTOR)

    def run(self, model, progress: Progress | None = None):
        texts = self.texts()
        importance = head_importance(model, texts, method=self.method, progress=progress, batch_size=self.batch_size)
        if not self.pruning:
            return importance, None
        settings = dict(importance=importance, steps=self.steps, seeds=tuple(range(self.seeds)), progress=progress)
        curves = [pruning_curve(model, texts, order, **settings) for order in ("importance", "random")]
        return importance, pd.concat(curves, ignore_index=True)


@operation
class RoleAblation(Operation):
    """For each role group of a sentence's heads (``groups``: ``(layer, head, group)``, from
    ``mha_core.primary_roles``), the sentence's loss (or output change) with the whole group ablated
    (``role_group_ablation``)."""

    work_class = LIGHT
    model: str
    text: str
    groups: tuple[tuple[int, int, str], ...]
    ablation: str = "zero"

    @classmethod
    def of(cls, model, text: str, primary: pd.DataFrame, ablation: str = "zero") -> RoleAblation:
        rows = primary[["layer", "head", "group"]].itertuples(index=False)
        return cls(
            model.name, text, tuple((int(layer), int(head), str(group)) for layer, head, group in rows), ablation
        )

    def peak_bytes(self, model) -> int:
        """One ablated pass at a time, with its losses."""
        return pass_peak_bytes(model.num_layers, model.num_heads, len(model.encode(self.text).input_ids))

    def run(self, model, progress: Progress | None = None):
        primary = pd.DataFrame(list(self.groups), columns=["layer", "head", "group"])
        return role_group_ablation(model, self.text, primary, ablation=self.ablation)


@operation
class GroupAblation(Operation):
    """Each named group of heads ablated at once over a corpus's texts, against ``draws`` random groups of the same
    size (``mha_core.interventions.experiments.group_ablation``)."""

    work_class = HEAVY
    model: str
    texts: tuple[str, ...]
    groups: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]
    draws: int = 4
    ablation: str = "zero"

    @classmethod
    def of(cls, model, texts, groups: dict, **settings) -> GroupAblation:
        named = tuple(
            (str(name), tuple((int(layer), int(head)) for layer, head in heads)) for name, heads in groups.items()
        )
        return cls(model.name, tuple(texts), named, **settings)

    @property
    def progress_label(self) -> str:
        return f"{len(self.groups)} groups of heads ablated over {len(self.texts):,} texts..."

    def peak_bytes(self, model) -> int:
        return batch_peak_bytes(model, self.texts, min(LOSS_PROBE_BATCH, len(self.texts)))

    def run(self, model, progress: Progress | None = None):
        groups = {name: list(heads) for name, heads in self.groups}
        return group_ablation(
            model, list(self.texts), groups, draws=self.draws, ablation=self.ablation, progress=progress
        )


@operation
class AblationEffect(Operation):
    """One text's run before and after ablating ``heads``, both with their losses: ``(before, after)``, two
    ``Attention`` runs (``mha_core.models.outputs.loss_table`` compares them)."""

    work_class = LIGHT
    model: str
    encoded: EncodedText
    heads: tuple[tuple[int, int], ...]
    ablation: str = "zero"
    engine: str = "transformers"

    def runs(self) -> tuple[Attention, Attention]:
        before = Attention(self.model, self.encoded, self.engine, losses=True)
        return before, Attention(self.model, self.encoded, self.engine, self.heads, self.ablation, losses=True)

    def peak_bytes(self, model) -> int:
        return max(run.peak_bytes(model) for run in self.runs())

    def run(self, model, progress: Progress | None = None):
        before, after = self.runs()
        return before.run(model, progress_part(progress, 0, 2)), after.run(model, progress_part(progress, 1, 2))
