"""What heads' weights do and how heads work together (``mha_core.interventions.qkov``, ``path_patching``): a
head's OV and QK circuits, every head's copying and previous-token scores, the composition of every pair of heads,
and path patching from a sender (or every sender) into a set of receivers."""

from __future__ import annotations

from ..interventions.path_patching import DEFAULT_PATH_BATCH, path_patch
from ..interventions.qkov import VOCAB_CHUNK, composition, copying_scores, ov_circuit, qk_circuit
from ..models.tokens import EncodedText
from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, LIGHT, Operation, operation
from .circuits import pass_bytes


def head_weights_bytes(model) -> int:
    """Every head's folded W_Q, W_K, W_V, W_O as float32 (grouped KV heads repeated): what the circuits read,
    kept once per loaded model."""
    config = model.hf_model.config
    d_model = getattr(config, "hidden_size", None) or config.n_embd
    return FLOAT_BYTES * 4 * model.num_layers * d_model * d_model


def _vocabulary(model) -> int:
    return int(model.hf_model.get_input_embeddings().weight.shape[0])


@operation
class OVCircuit(Operation):
    """One head's OV circuit at some tokens: the ``k`` output tokens it raises most for each (``mc.ov_circuit``)."""

    work_class = LIGHT
    model: str
    layer: int
    head: int
    tokens: tuple | str = ()  # token ids, or a text (its tokens); () the default sentence's
    k: int = 10

    def peak_bytes(self, model) -> int:
        """The weights, one head's ``[e, vocab]`` right factor and a chunk of scores per token (a text has at most
        as many tokens as characters)."""
        rows = max(len(self.tokens), 16)
        return head_weights_bytes(model) + FLOAT_BYTES * (128 * _vocabulary(model) + 2 * rows * VOCAB_CHUNK)

    def run(self, model, progress: Progress | None = None):
        return ov_circuit(model, self.layer, self.head, k=self.k, tokens=self.token_input())

    def token_input(self):
        return self.tokens if isinstance(self.tokens, str) else (list(self.tokens) or None)


@operation
class QKCircuit(OVCircuit):
    """One head's QK circuit at some query tokens: the ``k`` key tokens it scores highest (``mc.qk_circuit``)."""

    work_class = LIGHT

    def run(self, model, progress: Progress | None = None):
        return qk_circuit(model, self.layer, self.head, k=self.k, tokens=self.token_input())


@operation
class CopyingScores(Operation):
    """Every head's copying score and previous-token QK score (``mc.copying_scores``)."""

    work_class = LIGHT
    model: str

    def peak_bytes(self, model) -> int:
        """The weights, and the ``[d, d]`` product W_U W_E."""
        return head_weights_bytes(model) + 2 * FLOAT_BYTES * 1024 * 1024

    def run(self, model, progress: Progress | None = None):
        return copying_scores(model, progress=progress)


@operation
class Composition(Operation):
    """Q-, K- and V-composition of every pair of heads in different layers (``mc.composition``)."""

    work_class = HEAVY
    model: str

    @property
    def progress_label(self) -> str:
        return "Composition of every pair of heads"

    def peak_bytes(self, model) -> int:
        """The weights in float64, and one sender layer's ``[heads, later heads, e, e]`` products (three, float64)."""
        config = model.hf_model.config
        d_model = getattr(config, "hidden_size", None) or config.n_embd
        d_head = d_model // model.num_heads
        pairs = model.num_heads * model.num_layers * model.num_heads
        return 3 * head_weights_bytes(model) + 3 * 2 * FLOAT_BYTES * pairs * d_head * d_head

    def run(self, model, progress: Progress | None = None):
        return composition(model, progress=progress)


@operation
class PathPatching(Operation):
    """Path patching from ``sender`` (None: every head) into ``receivers`` through their ``via`` input
    (``mc.path_patch``)."""

    work_class = HEAVY
    model: str
    clean: EncodedText
    corrupted: EncodedText
    answer: str | int
    foil: str | int
    receivers: tuple
    via: str = "k"
    sender: tuple | None = None
    batch_size: int = DEFAULT_PATH_BATCH
    engine: str = "transformers"

    @property
    def progress_label(self) -> str:
        return "Path patching"

    def peak_bytes(self, model) -> int:
        """Both prompts' head and MLP outputs, and two passes of a batch of senders."""
        tokens = len(self.clean)
        recorded = pass_bytes(model, 1, tokens, kept_layers=3 * model.num_layers)
        return recorded + 2 * pass_bytes(model, self.batch_size, tokens, kept_layers=2 * model.num_layers)

    def run(self, model, progress: Progress | None = None):
        return path_patch(
            model,
            self.clean,
            self.corrupted,
            self.answer,
            self.foil,
            sender=self.sender,
            receivers=self.receivers,
            via=self.via,
            engine=self.engine,
            batch_size=self.batch_size,
            progress=progress,
        )
