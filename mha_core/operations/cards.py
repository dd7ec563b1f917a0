"""Head cards as operations: every head of a model described over the UD dev sentences or a corpus file
(``mha_core.corpus.cards.head_cards``), and the long part of a decoder's cards over the long documents
(``mha_core.corpus.long_cards.long_cards``)."""

from __future__ import annotations

from ..corpus.cards import TOP_CONTEXTS, head_cards
from ..corpus.long_cards import document_entries, long_cards, needle_length
from ..corpus.reading import model_input, open_corpus
from ..progress import Progress
from .base import FLOAT_BYTES, HEAVY, Operation, batch_peak_bytes, operation
from .corpus import UD_DEV
from .long import long_run_bytes


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


@operation
class LongHeadCards(Operation):
    """The long part of every head's card (``mc.long_cards``) over ``documents`` ((label, text) pairs; None: the
    shipped long examples) and the needle prompt of ``needle_tokens`` tokens: one long run at a time."""

    work_class = HEAVY
    model: str
    documents: tuple[tuple[str, str], ...] | None = None
    top: int = TOP_CONTEXTS
    needle_tokens: int | None = None
    cache: bool = True

    @property
    def progress_label(self) -> str:
        return "Reading every head over the long documents..."

    def peak_bytes(self, model) -> int:
        """The largest of its long runs (one is held at a time): the longest document or the needle prompt."""
        lengths = [len(model.encode_long(text).input_ids) for _, text in document_entries(self.documents)]
        return long_run_bytes(model, max([*lengths, needle_length(model, self.needle_tokens)]))

    def run(self, model, progress: Progress | None = None):
        return long_cards(
            model, self.documents, top=self.top, needle_tokens=self.needle_tokens, progress=progress, cache=self.cache
        )
