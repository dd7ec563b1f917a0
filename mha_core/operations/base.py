"""What every operation is: ``Operation``, its ``key`` derived from its fields, its ``WorkClass``, and the byte
estimates the operations share.

An operation is a small frozen object (``@operation``, a frozen dataclass) holding everything one computation
needs: the model's name, the input tokenized once (an ``EncodedText``), the settings. It says

* ``key``: what names its value, derived from its class and fields by ``key_of`` (no key is written by hand; two
  operations with equal fields have equal keys, and a cache keeps one value for both). Strings, numbers, booleans,
  None and tuples of them, so a key travels as JSON (a run's ``metadata["cache_key"]``);
* ``peak_bytes(model)``: what it holds at its peak beyond the loaded model, estimated beside the code that
  allocates (the operation's own module), so a server reserves it before the work starts;
* ``work_class``: ``LIGHT`` or ``HEAVY``, declared once in each operation's class body (a class without one is
  refused when it is defined);
* ``progress_label``: what a progress bar says while it runs (None: quick work, no bar of its own);
* ``run(model, progress=None)``: the value; ``progress(done, total, message)`` (``mha_core.progress``) may raise to
  stop it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
from typing import Any, ClassVar

import numpy as np

from ..models.tokens import EncodedText
from ..progress import Progress


class WorkClass(enum.Enum):
    """What a computation is to a shared server (``mha_core.cache``'s shares of the budget, ``ui.budget``'s gate).

    LIGHT  one sentence's heads and what is computed from them (a run, its norms, a neuron view, a search vector,
           an ablated run, the decoder scores, attribution, the logit lens): short, never queued behind heavy work.
    HEAVY  work that holds the server for long or holds much memory: long documents and needle tests, patching,
           corpus profiles, head importance, the induction experiment, a corpus search index, Lab training.
           In classroom mode it has its own small share of the memory budget and of the compute gate.
    """

    LIGHT = "light"
    HEAVY = "heavy"

    @property
    def share(self) -> str | None:
        """The name of its share of the budget and of the gate (None: the work outside every share)."""
        return None if self is WorkClass.LIGHT else self.value


LIGHT, HEAVY = WorkClass.LIGHT, WorkClass.HEAVY

# ``field(metadata=NOT_IN_KEY)``: a field the value does not depend on beyond the other fields (e.g. scores the
# operation would otherwise compute from the model itself), left out of the key.
NOT_IN_KEY = {"key": False}


def encoded_digest(encoded: EncodedText) -> str:
    """A short name for a tokenized text: everything of it a run reads (its ids, token types, words, text and pair,
    cut and BOS), as a SHA-1 digest (a document of 8,192 tokens names its run in 40 characters)."""
    content = [
        list(map(int, encoded.input_ids)),
        None if encoded.token_type_ids is None else list(map(int, encoded.token_type_ids)),
        encoded.text,
        encoded.text_pair,
        list(encoded.words),
        bool(encoded.truncated),
        int(encoded.num_input_tokens),
        bool(encoded.added_bos),
    ]
    return hashlib.sha1(json.dumps(content, ensure_ascii=False).encode("utf-8")).hexdigest()


def key_of(value: Any):
    """``value`` as part of a key: hashable, and plain JSON (strings, numbers, booleans, None, lists)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, EncodedText):
        return "tokens:" + encoded_digest(value)
    if isinstance(value, (list, tuple)):
        return tuple(key_of(item) for item in value)
    if isinstance(value, dict):
        return tuple((key_of(name), key_of(item)) for name, item in sorted(value.items()))
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, hashlib.sha1(np.ascontiguousarray(value).tobytes()).hexdigest())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *(key_of(getattr(value, f.name)) for f in dataclasses.fields(value)))
    raise TypeError(f"a {type(value).__name__} cannot be part of an operation's key")


def operation(cls: type) -> type:
    """Declare an operation: a frozen dataclass whose equality and hash are its ``key``'s. A field named ``key``
    would hide that key (every value sharing one cache entry per field value), so it is refused."""
    declared = dataclasses.dataclass(frozen=True, eq=False)(cls)
    if any(field.name == "key" for field in dataclasses.fields(declared)):
        raise TypeError(f"{cls.__name__} has a field named 'key', which would hide its cache key: rename it")
    return declared


class Operation:
    """One computation, described by its fields (see the module's docstring). Subclasses are declared with
    ``@operation`` and set ``work_class`` in their own body."""

    work_class: ClassVar[WorkClass]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("work_class"), WorkClass):
            raise TypeError(f"{cls.__name__} declares no work_class (LIGHT or HEAVY) in its own body")

    @functools.cached_property
    def key(self) -> tuple:
        """``(class name, every field's key_of)``: what names this computation's value."""
        named = (f for f in dataclasses.fields(self) if f.metadata.get("key", True))
        return (type(self).__name__, *(key_of(getattr(self, f.name)) for f in named))

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def progress_label(self) -> str | None:
        """What a progress bar says while this runs; None for quick work (the default)."""
        return None

    def peak_bytes(self, model) -> int:
        """The bytes this holds at its peak beyond the loaded model (reserved before it starts)."""
        raise NotImplementedError

    def run(self, model, progress: Progress | None = None):
        """The value, computed on ``model``."""
        raise NotImplementedError


# ---- estimates shared by the operations ----------------------------------------------------------------------
FLOAT_BYTES = 4
# Working memory of a forward pass, as a multiple of its attention array (layers x heads x n^2 float32).
# Measured on SmolLM2 at 512 tokens (30 x 9 heads, 270 MB of attention): the pass peaks 408 MB above
# where it started (each layer's attention in torch before the copy, the LM head's logits for
# token_losses) and keeps 274 MB.
RUN_PEAK_FACTOR = 1.5
# Backpropagation keeps every layer's attention and its softmax's input for the backward pass, on top of a
# forward pass's own peak: head importance by gradient holds about twice a forward pass (an estimate from
# what autograd saves per layer, not a measurement).
GRADIENT_PEAK_FACTOR = 2.0


def attention_bytes(num_layers: int, num_heads: int, num_tokens: int) -> int:
    """Bytes of a run's float32 attention array ``[layers, heads, n, n]``."""
    return FLOAT_BYTES * int(num_layers) * int(num_heads) * int(num_tokens) ** 2


def pass_peak_bytes(num_layers: int, num_heads: int, num_tokens: int, batch: int = 1, arrays: int = 1) -> int:
    """A forward pass's peak memory: ``RUN_PEAK_FACTOR`` x the attention arrays of ``batch`` sequences of
    ``num_tokens`` (``arrays`` = 2 with norm-based attention, which holds the norms' array beside it)."""
    return int(RUN_PEAK_FACTOR * arrays * batch * attention_bytes(num_layers, num_heads, num_tokens))


def layer_inputs_bytes(num_layers: int, num_tokens: int, width: int) -> int:
    """Every layer's float32 input ``[n, width]`` kept beside a pass (the neuron view reads them)."""
    return FLOAT_BYTES * (int(num_layers) + 1) * int(num_tokens) * int(width)


def batch_peak_bytes(model, items, batch_size: int, factor: float = 1.0) -> int:
    """A batched pass over ``items`` (texts or lists of words) at its peak: ``batch_size`` sequences padded to
    the longest item's tokens (at most the model's limit), times ``factor``."""
    longest = max((len(model.encode(item).input_ids) for item in items), default=0)
    return int(factor * pass_peak_bytes(model.num_layers, model.num_heads, longest, batch=batch_size))
