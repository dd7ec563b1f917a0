"""One text through one model: its attention (plain, ablated, with its losses or its norm-based attention), an
encoder-decoder's three attentions, and what Explore's Deeper page reads from one text (the neuron view, a search
vector)."""

from __future__ import annotations

from ..interventions.neuron_view import neuron_view
from ..interventions.search import query_vector
from ..models.seq2seq import DEFAULT_MAX_NEW_TOKENS
from ..models.tokens import EncodedText
from ..progress import Progress
from .base import FLOAT_BYTES, LIGHT, RUN_PEAK_FACTOR, Operation, layer_inputs_bytes, operation, pass_peak_bytes


@operation
class Attention(Operation):
    """Every layer's and head's attention of one encoded text (``LoadedModel.run``): an ``AttentionRun`` whose
    ``metadata["cache_key"]`` is this operation's key (what is computed from the run is named after it).

    ``ablate``: heads ``((layer, head), ...)`` zeroed (``ablation="zero"``) or replaced by their mean (``"mean"``);
    ``losses``: the run carries its per-token losses (None: for ablated runs only); ``norms``: norm-based
    attention beside the weights; ``predict``: the model's prediction from the same pass in
    ``metadata["prediction"]`` (``models.prediction``)."""

    work_class = LIGHT
    model: str
    encoded: EncodedText
    engine: str = "transformers"
    ablate: tuple[tuple[int, int], ...] = ()
    ablation: str = "zero"
    losses: bool | None = None
    predict: bool = False
    norms: bool = False

    def __post_init__(self):
        object.__setattr__(self, "ablate", tuple((int(layer), int(head)) for layer, head in self.ablate))

    @classmethod
    def of(cls, model, text, text_pair: str | None = None, bos: bool | None = None, **settings) -> Attention:
        """The operation for ``text`` (or a list of words; ``text_pair``, ``bos`` as in ``LoadedModel.encode``),
        tokenized here once: its estimate and its run read these tokens."""
        return cls(model.name, model.encode(text, text_pair, bos), **settings)

    def peak_bytes(self, model) -> int:
        """The pass's peak: ``RUN_PEAK_FACTOR`` x its attention array (two arrays with norm-based attention)."""
        arrays = 2 if self.norms else 1
        return pass_peak_bytes(model.num_layers, model.num_heads, len(self.encoded), arrays=arrays)

    def run(self, model, progress: Progress | None = None):
        run = model.run(
            self.encoded,
            engine=self.engine,
            progress=progress,
            ablate=list(self.ablate),
            ablation=self.ablation,
            norms=self.norms,
            losses=self.losses,
            predict=self.predict,
        )
        run.metadata["cache_key"] = self.key
        return run


@operation
class Seq2SeqAttention(Operation):
    """An encoder-decoder's encoder, decoder and cross-attention (``Seq2SeqModel.run``): a ``Seq2SeqRun``.
    ``target`` None: the model writes it greedily first."""

    work_class = LIGHT
    model: str
    source: EncodedText
    target: EncodedText | None = None
    engine: str = "transformers"

    @classmethod
    def of(cls, model, source: str, target: str | None = None, engine: str = "transformers") -> Seq2SeqAttention:
        """The operation for these texts, tokenized here once (``encode_source``, ``encode_target``)."""
        encoded_target = None if target is None else model.encode_target(target)
        return cls(model.name, model.encode_source(source), encoded_target, engine)

    def attention_bytes(self, model) -> int:
        """Bytes of the run's three float32 attention arrays (a target the model writes counted at its longest,
        ``DEFAULT_MAX_NEW_TOKENS``)."""
        n_src = len(self.source)
        n_tgt = DEFAULT_MAX_NEW_TOKENS + 1 if self.target is None else len(self.target)
        cells = model.encoder_layers * model.num_heads * n_src**2
        cells += model.decoder_layers * model.decoder_heads * (n_tgt**2 + n_tgt * n_src)
        return FLOAT_BYTES * cells

    def peak_bytes(self, model) -> int:
        """``RUN_PEAK_FACTOR`` x the three attention arrays."""
        return int(RUN_PEAK_FACTOR * self.attention_bytes(model))

    def run(self, model, progress: Progress | None = None):
        return model.run(self.source, self.target, engine=self.engine, progress=progress)


@operation
class Neurons(Operation):
    """BertViz's neuron view of head (``layer``, ``head``) for token ``query`` of a tokenized text
    (``mha_core.neuron_view``)."""

    work_class = LIGHT
    model: str
    token_ids: tuple[int, ...]
    layer: int
    head: int
    query: int
    engine: str = "transformers"

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(i) for i in self.token_ids))

    def peak_bytes(self, model) -> int:
        """A pass and every layer's input hidden states."""
        n = len(self.token_ids)
        width = int(model.hf_model.config.hidden_size)
        return pass_peak_bytes(model.num_layers, model.num_heads, n) + layer_inputs_bytes(model.num_layers, n, width)

    def run(self, model, progress: Progress | None = None):
        return neuron_view(model, list(self.token_ids), self.layer, self.head, self.query, engine=self.engine)


@operation
class SearchVector(Operation):
    """The search vector of token ``query`` of a tokenized text, as a corpus index computes its own
    (``mha_core.interventions.search.query_vector``)."""

    work_class = LIGHT
    model: str
    token_ids: tuple[int, ...]
    query: int
    layer: int
    head: int
    kind: str

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(i) for i in self.token_ids))

    def peak_bytes(self, model) -> int:
        return pass_peak_bytes(model.num_layers, model.num_heads, len(self.token_ids))

    def run(self, model, progress: Progress | None = None):
        return query_vector(model, list(self.token_ids), self.query, self.layer, self.head, kind=self.kind)
