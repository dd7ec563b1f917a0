"""Models: where weights come from (``sources``), text to tokens (``tokens``), loading (``loading``), the loaded
model (``loaded.LoadedModel``: both engines, runs), attentions captured from transformers (``capture``), head
ablation (``ablation``), what a run reports besides attention (``outputs``), and encoder-decoder models
(``seq2seq.Seq2SeqModel``: encoder, decoder and cross-attention).
"""

from .loaded import ENGINES, LoadedModel
from .loading import load_model
from .seq2seq import Seq2SeqModel
from .sources import DEFAULT_MODEL, EMBEDDED_MODELS

__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "ENGINES", "LoadedModel", "Seq2SeqModel", "load_model"]
