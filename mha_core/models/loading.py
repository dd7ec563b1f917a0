"""``load_model(name)``: a name resolved through ``models.sources`` (embedded packages, local folders, the hub;
the safety checks live there), loaded as a ``LoadedModel``. Every model loads in float32, eval mode, with eager
attention: the sdpa backend computes the same outputs but returns no attention weights.
"""

from __future__ import annotations

import threading

from ..errors import ModelLoadError, quoted
from ..progress import Progress, report
from . import sources
from .loaded import LoadedModel
from .seq2seq import Seq2SeqModel
from .sources import DEFAULT_MODEL, EMBEDDED_MODELS


def load_model(
    name: str = DEFAULT_MODEL, progress: Progress | None = None, download: bool = True
) -> LoadedModel | Seq2SeqModel:
    """Load a model for attention extraction. Raises ``ModelLoadError`` with a message a user can act on.

    An encoder-decoder checkpoint (T5, BART, Marian) loads as a ``Seq2SeqModel`` (``run(source, target=None)``).
    ``name``: an embedded model (``"minilm"``, ``"smollm2"``), a checkpoint folder, or a hub id.
    ``download``: whether a hub id missing from the local cache may be fetched from the hub.
    """
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError(f"Name a model: one of {', '.join(EMBEDDED_MODELS)}, a checkpoint directory or a hub id.")
    # One load at a time per process: transformers imports its model code lazily, and two threads doing
    # that for the first time at once can fail (two visitors of a fresh server loading two models).
    with _LOAD_LOCK:
        return _load_model(name.strip(), progress, download)


_LOAD_LOCK = threading.RLock()


def _load_model(name: str, progress: Progress | None, download: bool) -> LoadedModel | Seq2SeqModel:
    report(progress, 0.0, 1.0, f"Loading {name[:80]}")
    checkpoint = sources.resolve(name, progress)
    try:
        # The local files first: they answer in milliseconds, with or without a network.
        hf_model, tokenizer, warnings = sources.load_checkpoint(
            sources.Checkpoint(checkpoint.name, checkpoint.source, True, checkpoint.warnings)
        )
    except sources.NotCached as exc:
        if checkpoint.local_only:
            raise ModelLoadError(f"{quoted(name)} is an incomplete checkpoint: {exc}") from exc
        if not download:
            raise sources.not_downloaded_error(name) from None
        if not sources.hub_reachable():
            raise sources.offline_error(name) from None
        report(progress, 0.1, 1.0, f"Downloading {name} from the Hugging Face hub")
        try:
            hf_model, tokenizer, warnings = sources.load_checkpoint(checkpoint)
        except sources.NotCached as exc:
            raise sources.hub_error(name, exc.__cause__ or exc) from exc
    report(progress, 0.95, 1.0, f"Checking {name[:80]}'s attention")
    # Encoder-decoders (T5, BART, Marian) have three attentions and their own model class (models.seq2seq).
    kind = Seq2SeqModel if getattr(hf_model.config, "is_encoder_decoder", False) else LoadedModel
    model = kind(name, hf_model, tokenizer)
    model.warnings = warnings
    report(progress, 1.0, 1.0, f"Loaded {name[:80]}")
    return model
