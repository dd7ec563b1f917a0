"""One head's queries and keys over a corpus in one 2-D projection (``mha_core.joint_qk``, AttentionViz)."""

from __future__ import annotations

from ..interventions.joint_qk import DEFAULT_MAX_POINTS, CorpusText, Projection, encode_corpus, project_texts
from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, Operation, operation, pass_peak_bytes

# The projection's working copies of the points: the float32 vectors, their float64 centred copy and the SVD's
# factors of the same size (t-SNE's affinities are sparse, a few times the points).
PROJECTION_COPIES = 6


@operation
class JointQueryKey(Operation):
    """Head ``(layer, head)``'s queries and keys over ``texts`` (each a ``CorpusText``: encoded once, with its POS
    tags) projected together (a ``JointQK``)."""

    # A pass per sentence (up to 200): held apart from the light requests of one sentence's heads.
    work_class = HEAVY
    model: str
    texts: tuple
    layer: int
    head: int
    method: str = "pca"
    normalize: bool = True
    max_points: int = DEFAULT_MAX_POINTS
    engine: str = "transformers"

    @classmethod
    def of(cls, model, sentences, layer: int, head: int, **settings) -> JointQueryKey:
        """The operation for ``sentences`` (strings, lists of words, ``Sentence`` trees), tokenized here once."""
        return cls(model.name, tuple(encode_corpus(model, sentences)), int(layer), int(head), **settings)

    @property
    def progress_label(self) -> str:
        return f"Queries and keys of head {self.layer}-{self.head} over {len(self.texts)} sentences"

    def peak_bytes(self, model) -> int:
        """One sentence's pass at a time (the longest), and the kept points: at most ``max_points`` queries and as
        many keys of ``d_head`` floats, in their working copies."""
        longest = max((len(text.encoded) for text in self.texts), default=1)
        d_head = model.hf_model.config.hidden_size // model.num_heads
        points = 2 * min(int(self.max_points), sum(len(text.encoded) for text in self.texts))
        return pass_peak_bytes(model.num_layers, model.num_heads, longest) + (
            PROJECTION_COPIES * 2 * FLOAT_BYTES * points * max(d_head, 2)
        )

    def run(self, model, progress: Progress | None = None):
        texts: list[CorpusText] = list(self.texts)
        projection = Projection(self.method, self.normalize, self.max_points, self.engine)
        return project_texts(model, texts, (self.layer, self.head), projection, progress)
