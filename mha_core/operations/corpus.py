"""Many sentences at once: a corpus profile (``mha_core.profile``), the coreference scores, and a corpus search
index (``mha_core.interventions.search``)."""

from __future__ import annotations

from ..analysis.syntax import ud_ewt_dev
from ..corpus.coreference import coreference_scores, load_coreference
from ..corpus.profiling import profile
from ..corpus.reading import model_input, open_corpus
from ..corpus.shards import DEFAULT_SHARD_SIZE
from ..interventions.search import build_corpus_index
from ..progress import Progress
from .base import HEAVY, Operation, batch_peak_bytes, operation

UD_DEV = "ud-ewt-dev"  # the shipped UD English EWT dev split (``mha_core.corpus.reading.open_corpus``)


@operation
class Profile(Operation):
    """Every head measured over a corpus (``mha_core.profile``): a ``ProfileResult``. ``corpus``: ``"ud-ewt-dev"``,
    a .conllu, .csv / .parquet (``column``) or text file, read lazily; the rest as ``profile`` takes them
    (``threads``: torch threads and CPUs of each Ray actor, ``executor="ray"``)."""

    work_class = HEAVY
    model: str
    corpus: str = UD_DEV
    max_sentences: int | None = None
    column: str | None = None
    batch_size: int = 16
    shard_size: int = DEFAULT_SHARD_SIZE
    cache: bool = True
    executor: str = "local"
    workers: int | None = None
    threads: int = 1
    address: str | None = None

    def sentences(self):
        """The corpus, read lazily (``open_corpus``)."""
        return open_corpus(self.corpus, self.column, self.max_sentences)

    @property
    def progress_label(self) -> str:
        sentences = self.sentences()
        count = f"{len(sentences):,} sentences" if isinstance(sentences, list) else "the corpus"
        return f"Profiling {count}..."

    def peak_bytes(self, model) -> int:
        """One batch of the corpus's longest sentence."""
        return batch_peak_bytes(model, [model_input(sentence) for sentence in self.sentences()], self.batch_size)

    def run(self, model, progress: Progress | None = None):
        executor = {"executor": self.executor}
        if self.executor == "ray":
            options = {"threads": self.threads, "cpus_per_worker": self.threads}
            executor.update(workers=self.workers, address=self.address, executor_options=options)
        settings = dict(batch_size=self.batch_size, shard_size=self.shard_size, cache=self.cache)
        return profile(model, self.sentences(), progress=progress, **settings, **executor)


@operation
class Coreference(Operation):
    """Each head's coreference accuracy over the shipped items (``mha_core.coreference_scores``)."""

    work_class = HEAVY
    model: str
    batch_size: int = 16

    def peak_bytes(self, model) -> int:
        return batch_peak_bytes(model, [item["words"] for item in load_coreference()], self.batch_size)

    def run(self, model, progress: Progress | None = None):
        return coreference_scores(model, batch_size=self.batch_size)


@operation
class SearchIndex(Operation):
    """An exBERT-style search index of the first ``max_sentences`` UD EWT dev sentences (``build_corpus_index``):
    a ``CorpusIndex``. A representation belongs to the layer, not to a head: any ``kind`` but ``"attention"``
    is named with head 0."""

    work_class = HEAVY
    model: str
    layer: int
    head: int
    kind: str
    max_sentences: int
    batch_size: int = 16

    def __post_init__(self):
        object.__setattr__(self, "head", int(self.head) if self.kind == "attention" else 0)

    def sentences(self) -> list[list[str]]:
        return [sentence.words for sentence in ud_ewt_dev(self.max_sentences)]

    @property
    def progress_label(self) -> str:
        return "Indexing the UD dev sentences..."

    def peak_bytes(self, model) -> int:
        return batch_peak_bytes(model, self.sentences(), self.batch_size)

    def run(self, model, progress: Progress | None = None):
        return build_corpus_index(
            model, self.sentences(), self.layer, self.head, self.kind, batch_size=self.batch_size, progress=progress
        )
