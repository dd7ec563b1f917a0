"""Why a head attends where it does: one (query, key) score split by source (``mha_core.score_decomposition``)."""

from __future__ import annotations

from ..interventions.decomposition import score_decomposition
from ..models.tokens import EncodedText
from ..progress import Progress
from .base import FLOAT_BYTES, LIGHT, Operation, operation, pass_peak_bytes

# The points one decomposition keeps per earlier layer, each [n, d]: the heads' outputs (z), the MLP's output,
# the layer's input, its attention's output, the sum after it, and the norms' scales (small).
KEPT_PER_LAYER = 5


@operation
class Decomposition(Operation):
    """The score head ``(layer, head)`` gives the key at ``key_position`` from ``query`` in ``text``, split into
    (query source, key source) parts (a ``ScoreDecomposition``). (Not ``key``: that name is every operation's cache
    key.)"""

    work_class = LIGHT
    model: str
    text: EncodedText
    layer: int
    head: int
    query: int
    key_position: int
    engine: str = "transformers"

    def peak_bytes(self, model) -> int:
        """One pass, the points it keeps up to the layer, and the two positions' sources (a few hundred vectors)."""
        tokens = len(self.text)
        d_model = model.hf_model.config.hidden_size
        kept = FLOAT_BYTES * KEPT_PER_LAYER * (self.layer + 1) * tokens * d_model
        sources = 2 * 8 * (model.num_heads + 2) * (self.layer + 1) * d_model  # float64, both positions
        return pass_peak_bytes(model.num_layers, model.num_heads, tokens) + kept + sources

    def run(self, model, progress: Progress | None = None):
        cell = dict(layer=self.layer, head=self.head, query=self.query, key=self.key_position)
        return score_decomposition(model, self.text, **cell, progress=progress, engine=self.engine)
