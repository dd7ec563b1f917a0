"""Files a profile keeps: written atomically, under one cache folder, keyed by what decides the numbers (the
model's weights, the code that computes them)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import weakref
from pathlib import Path

import torch

from ..cache import cache_dir

PROFILE_CACHE_FORMAT = 3


# Source files (under mha_core/) whose code decides a profile's numbers; editing any of them invalidates the cache.
CODE_FILES = (
    "corpus/reading.py",
    "corpus/shards.py",
    "corpus/parts.py",
    "corpus/measure.py",
    "corpus/profiling.py",
    "analysis/syntax.py",
    "analysis/metrics.py",
    "analysis/metrics_kernel.py",
    "run.py",
    "models/loaded.py",
    "models/tokens.py",
    "models/capture.py",
    "engine/registry.py",
    "engine/family.py",
    "engine/bert.py",
    "engine/mpnet.py",
    "engine/gpt2.py",
    "engine/llama.py",
)


_fingerprints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ---- cache keys -----------------------------------------------------------------------------
def weights_fingerprint(model) -> str:
    """A hash of the model's config and every byte of its weights.

    Bytes, not sums: a floating-point sum depends on the thread count that reduces it, and a key that
    changed with ``torch.set_num_threads`` would miss the cache of the same model in another process."""
    hf_model = model.hf_model
    try:
        return _fingerprints[hf_model]
    except (KeyError, TypeError):
        pass
    digest = hashlib.sha256(hf_model.config.to_json_string(use_diff=False).encode())
    with torch.inference_mode():
        for name, tensor in hf_model.state_dict().items():
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
            digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    fingerprint = digest.hexdigest()
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced is fingerprinted every time
        _fingerprints[hf_model] = fingerprint
    return fingerprint


def code_version() -> str:
    digest = hashlib.sha256(str(PROFILE_CACHE_FORMAT).encode())
    here = Path(__file__).resolve().parents[1]  # the mha_core package
    for name in CODE_FILES:
        if (here / name).is_file():
            digest.update((here / name).read_bytes())
    return digest.hexdigest()


def profile_cache_dir() -> Path:
    return cache_dir() / "profiles"


@contextlib.contextmanager
def atomic_file(path: Path):
    """Yield a temporary path beside ``path``, renamed onto ``path`` when the block succeeds and deleted otherwise:
    a reader, or the next run after a kill, never finds half a file.

    The temporary file is created with mode 0666 less the process's umask, as ``open`` creates the user's
    other files (``tempfile.mkstemp`` would make it 0600, and the rename would keep that)."""
    for _ in range(100):
        temporary = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}"
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path.name}")
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
