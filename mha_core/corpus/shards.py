"""Shards: consecutive sentences of a corpus, the unit of work that is computed, cached and resumed."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.syntax import Sentence
from ..errors import HeadscopeError
from .parts import ProfilePart
from .storage import PROFILE_CACHE_FORMAT, atomic_file, code_version, profile_cache_dir, weights_fingerprint

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

# Sentences per shard: the unit that is cached and resumed. Large enough that batching by length within
# a shard pads little and a shard's file and bookkeeping cost nothing next to its forward passes.
DEFAULT_SHARD_SIZE = 256


# ---- shards ---------------------------------------------------------------------------------
def check_profile_settings(batch_size: int = 16, shard_size: int = DEFAULT_SHARD_SIZE) -> None:
    """HeadscopeError unless both are whole numbers of at least 1 (checked before any slow work)."""
    for name, value in (("batch_size", batch_size), ("shard_size", shard_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise HeadscopeError(f"{name} must be a whole number of at least 1, got {value!r}")


@dataclass(frozen=True)
class Shard:
    """Consecutive sentences of a corpus: the unit of work that is computed, cached and resumed.

    index      position in the corpus's list of shards
    start      corpus index of the shard's first sentence
    sentences  the shard's sentences (``Sentence`` trees or plain strings)
    """

    index: int
    start: int
    sentences: tuple

    def __len__(self) -> int:
        return len(self.sentences)

    @functools.cached_property
    def digest(self) -> str:
        """A hash of the sentences (with their trees): the shard's name in the cache."""
        return sentences_digest(self.sentences)


def iter_shards(sentences: Iterable[Sentence | str], shard_size: int = DEFAULT_SHARD_SIZE) -> Iterator[Shard]:
    """``plan_shards`` one shard at a time, reading ``sentences`` only as far as the shard being yielded."""
    check_profile_settings(shard_size=shard_size)
    iterator = iter(sentences)
    for index in itertools.count():
        chunk = tuple(itertools.islice(iterator, shard_size))
        if not chunk:
            return
        yield Shard(index, index * shard_size, chunk)


def plan_shards(sentences: Iterable[Sentence | str], shard_size: int = DEFAULT_SHARD_SIZE) -> list[Shard]:
    """The corpus cut into consecutive shards of ``shard_size`` sentences (the last may be shorter).

    The cut depends on the sentences and ``shard_size`` only, never on who computes the shards.
    """
    return list(iter_shards(sentences, shard_size))


def sentences_digest(sentences: Sequence[Sentence | str]) -> str:
    digest = hashlib.sha256()
    for sentence in sentences:
        if isinstance(sentence, Sentence):
            item = [sentence.words, sentence.heads, sentence.relations, sentence.full_relations]
        else:
            item = str(sentence)
        digest.update(json.dumps(item, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:32]


class ShardCache:
    """Finished shards of one model and one set of settings, on disk.

    ``<profiles>/shards/<settings key>/<shard digest>.npz``: the settings key hashes the model name,
    its weights fingerprint, the code version, the batch size and the shard size (everything that
    changes the numbers); the digest hashes the shard's sentences. Each file holds the part's arrays
    and a JSON header of what it is (no pickle), and is written atomically.
    """

    def __init__(self, model: LoadedModel, batch_size: int = 16, shard_size: int = DEFAULT_SHARD_SIZE):
        parts = [PROFILE_CACHE_FORMAT, model.name, weights_fingerprint(model), code_version(), batch_size, shard_size]
        self.settings_key = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]
        self.folder = profile_cache_dir() / "shards" / self.settings_key

    def path(self, shard: Shard) -> Path:
        return self.folder / f"{shard.digest}.npz"

    def result_key(self, shards: Sequence[Shard | str]) -> str:
        """The key of the whole profile's merged result: these settings and every shard's sentences
        (shards, or their digests)."""
        digests = [shard if isinstance(shard, str) else shard.digest for shard in shards]
        key = "|".join([self.settings_key, *digests])
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def _header(self, digest: str, num_sentences: int) -> dict:
        return {
            "format": PROFILE_CACHE_FORMAT,
            "settings": self.settings_key,
            "shard": digest,
            "num_sentences": num_sentences,
        }

    def load(self, shard: Shard) -> ProfilePart | None:
        """The shard's part, or None when its file is missing, damaged or another's (then it is computed again)."""
        return self.load_digest(shard.digest, len(shard), shard.start)

    def load_digest(self, digest: str, num_sentences: int, start: int = 0) -> ProfilePart | None:
        """``load`` of the shard with this digest and size, placed at ``start``."""
        try:
            with np.load(self.folder / f"{digest}.npz", allow_pickle=False) as stored:
                arrays = {name: stored[name] for name in stored.files}  # reading checks each array's CRC
            if json.loads(arrays.pop("header").tobytes().decode("utf-8")) != self._header(digest, num_sentences):
                return None
            part = ProfilePart.from_arrays(arrays, start=start)
        except Exception:  # a damaged zip raises BadZipFile, EOFError, NotImplementedError, RuntimeError...
            return None  # ...and any of them only means: compute the shard again
        return part if part.num_sentences == num_sentences else None

    def store(self, shard: Shard, part: ProfilePart) -> None:
        header = np.frombuffer(json.dumps(self._header(shard.digest, len(shard))).encode("utf-8"), dtype=np.uint8)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_file(self.path(shard)) as temporary:
                # Compressed: the dependency sums are mostly zeros (rare relations), 16 times smaller this way.
                np.savez_compressed(temporary, header=header, **part.to_arrays())
        except OSError:
            pass  # a read-only cache directory costs speed, not correctness


def shards_in_cache(
    model: LoadedModel, sentences: Iterable[Sentence | str], batch_size: int = 16, shard_size: int = DEFAULT_SHARD_SIZE
) -> tuple[int, int]:
    """``(finished shards in the cache, shards in all)`` of this profile: a new call computes only the others."""
    store = ShardCache(model, batch_size, shard_size)
    found = [store.load(shard) is not None for shard in iter_shards(sentences, shard_size)]
    return sum(found), len(found)
