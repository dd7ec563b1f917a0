"""Head cards as an operation: every head of a model described over the UD dev sentences or a corpus file
(``mha_core.corpus.cards.head_cards``)."""

from __future__ import annotations

from ..corpus.cards import TOP_CONTEXTS, head_cards
from ..corpus.reading import model_input, open_corpus
from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, Operation, batch_peak_bytes, operation
from .corpus import UD_DEV


@operation
class Cards(Operation):
    """Every head's card (``mc.head_cards``) over the first ``max_sentences`` of ``corpus`` (``open_corpus``)."""

    work_class = HEAVY
    model: str
    corpus: str = UD_DEV
    max_sentences: int | None = None
    top: int = TOP_CONTEXTS
    batch_size: int = 16
    cache: bool = True

    def sentences(self):
        return open_corpus(self.corpus, None, self.max_sentences)

    @property
    def progress_label(self) -> str:
        return "Building the head cards..."

    def peak_bytes(self, model) -> int:
        """One batch of the longest sentence, plus its masked copy and every head's outputs (d_model wide)."""
        inputs = [model_input(sentence) for sentence in self.sentences()]
        config = model.hf_model.config
        d_model = getattr(config, "hidden_size", None) or config.n_embd
        longest = max((len(model.encode(item).input_ids) for item in inputs), default=0)
        outputs = FLOAT_BYTES * self.batch_size * model.num_heads * longest * d_model
        return 2 * batch_peak_bytes(model, inputs, self.batch_size) + outputs

    def run(self, model, progress: Progress | None = None):
        return head_cards(
            model, self.sentences(), top=self.top, batch_size=self.batch_size, progress=progress, cache=self.cache
        )
