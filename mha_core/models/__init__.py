"""Models: where weights come from (``sources``), text to tokens (``tokens``), loading (``loading``), the loaded
model (``loaded.LoadedModel``: both engines, runs), attentions captured from transformers (``capture``), head
ablation (``ablation``) and what a run reports besides attention (``outputs``).
"""

from .loaded import ENGINES, LoadedModel
from .loading import load_model
from .sources import DEFAULT_MODEL, EMBEDDED_MODELS

__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "ENGINES", "LoadedModel", "load_model"]
