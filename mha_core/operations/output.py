"""The model's output: what it predicts next (``Prediction``) and what it writes (``Generation``), token by token
with every head's attention kept."""

from __future__ import annotations

from ..models.generation import generate
from ..models.prediction import predict
from ..models.tokens import EncodedText
from ..progress import Progress
from .base import LIGHT, Operation, operation, pass_peak_bytes


@operation
class Prediction(Operation):
    """The ``k`` most likely next tokens of one encoded text (``models.prediction.predict``): a DataFrame of rank,
    token, id, probability and logit; ``position``: a masked model's chosen position (None: its first mask
    token; a decoder's last token)."""

    work_class = LIGHT
    model: str
    encoded: EncodedText
    k: int = 10
    position: int | None = None
    engine: str = "transformers"

    @classmethod
    def of(cls, model, text: str, bos: bool | None = None, **settings) -> Prediction:
        """The operation for ``text``, tokenized here once."""
        return cls(model.name, model.encode(text, bos=bos), **settings)

    def peak_bytes(self, model) -> int:
        """A forward pass over the text (no attention is captured: the estimate is the run's, an upper bound)."""
        return pass_peak_bytes(model.num_layers, model.num_heads, len(self.encoded))

    def run(self, model, progress: Progress | None = None):
        return predict(model, self.encoded, self.k, self.position, self.engine)


@operation
class Generation(Operation):
    """A decoder continues one encoded prompt (``models.generation.generate``): the ``AttentionRun`` over prompt and
    written tokens, with each step's distribution in ``metadata["generation"]``; ``metadata["cache_key"]`` is this
    operation's key. ``stop``: token ids that end it (None: the end-of-text token)."""

    work_class = LIGHT
    model: str
    encoded: EncodedText
    max_new_tokens: int = 1
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop: tuple[int, ...] | None = None

    @classmethod
    def of(cls, model, prompt: str, bos: bool | None = None, **settings) -> Generation:
        """The operation for ``prompt``, tokenized here once."""
        return cls(model.name, model.encode(prompt, bos=bos), **settings)

    @property
    def progress_label(self) -> str | None:
        return f"Writing {self.max_new_tokens} token{'s' if self.max_new_tokens != 1 else ''}"

    def peak_bytes(self, model) -> int:
        """The run's attention at its longest (prompt + every new token) and the pass over the prompt."""
        longest = min(len(self.encoded) + int(self.max_new_tokens), model.max_tokens)
        return pass_peak_bytes(model.num_layers, model.num_heads, longest)

    def run(self, model, progress: Progress | None = None):
        run = generate(
            model,
            self.encoded,
            self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop,
            progress=progress,
        )
        run.metadata["cache_key"] = self.key
        return run
