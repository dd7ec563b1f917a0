"""``profile(model, sentences)``: every head of a model measured over a corpus, in shards that are cached and
resumed, merged in corpus order (the steps are described in ``mha_core.corpus``)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ..analysis.metrics import METRIC_COLUMNS
from ..analysis.syntax import Sentence
from ..cache import ByteBudgetCache
from ..errors import HeadscopeError
from ..progress import Progress, report
from ..run import per_head_frame
from .measure import compute_shard
from .parts import CORPUS_SPREADS, PartMerger, ProfilePart
from .reading import model_input
from .shards import DEFAULT_SHARD_SIZE, Shard, ShardCache, check_profile_settings, iter_shards
from .storage import profile_cache_dir

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

# Finished profiles kept in memory (a server runs for days): the least recently used are dropped.
MEMORY_CACHE_ENTRIES = 4


@dataclass
class ProfileResult:
    """A corpus profile.

    metrics        mean of ``head_metrics`` over the sentences, one row per (layer, head)
                   (numeric columns averaged; ``LABEL_COLUMNS`` hold their most common value)
    dependency     ``syntax.dependency_scores`` over the corpus, or None when the sentences have no trees
    num_sentences  how many sentences were profiled
    model_name     the model's name
    from_cache     True when the model did not run: the result, or every one of its shards, came from a cache
    """

    metrics: pd.DataFrame
    dependency: pd.DataFrame | None
    num_sentences: int
    model_name: str
    from_cache: bool = False

    def copy(self, from_cache: bool) -> ProfileResult:
        return ProfileResult(
            self.metrics.copy(),
            None if self.dependency is None else self.dependency.copy(),
            self.num_sentences,
            self.model_name,
            from_cache,
        )


# Finished results kept in memory: a few small tables, so each counts as one unit of the budget.
memory_cache = ByteBudgetCache(MEMORY_CACHE_ENTRIES, size_of=lambda result: 1)


def finish_profile(part: ProfilePart, model_name: str, from_cache: bool = False) -> ProfileResult:
    """The ``ProfileResult`` of a whole corpus's merged part: means, majorities, spreads over sentences and
    dependency accuracy."""
    spreads = part.metrics.spreads()
    columns = {
        **part.metrics.means(),
        **{column: spreads[source] for column, source in CORPUS_SPREADS.items()},
        "num_sentences": part.num_sentences,
    }
    metrics = per_head_frame(part.num_layers, part.num_heads, **columns)
    return ProfileResult(
        metrics=metrics[[*METRIC_COLUMNS, "argmax_offset_share_sd", "num_sentences"]],
        dependency=part.dependency.result() if part.dependency is not None else None,
        num_sentences=part.num_sentences,
        model_name=str(model_name),
        from_cache=from_cache,
    )


# ---- finished results: memory (a few, least recently used dropped) and disk -------------------
def clear_memory_cache() -> None:
    memory_cache.clear()


def _remember(key: str, result: ProfileResult) -> None:
    memory_cache.put(key, result.copy(from_cache=False))


def _load_result(key: str) -> ProfileResult | None:
    remembered = memory_cache.get(key)
    if remembered is not None:
        return remembered.copy(from_cache=True)
    folder = profile_cache_dir() / "results" / key
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        metrics = pd.read_parquet(folder / "metrics.parquet")
        dependency = pd.read_parquet(folder / "dependency.parquet") if meta["has_dependency"] else None
    except (OSError, ValueError, KeyError):
        return None  # missing or damaged entry: compute again
    result = ProfileResult(metrics, dependency, int(meta["num_sentences"]), str(meta["model_name"]))
    _remember(key, result)
    return result.copy(from_cache=True)


def _store_result(key: str, result: ProfileResult) -> None:
    _remember(key, result)
    root = profile_cache_dir() / "results"
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError:
        return  # a read-only cache directory costs speed, not correctness
    try:
        result.metrics.to_parquet(staging / "metrics.parquet", index=False)
        if result.dependency is not None:
            result.dependency.to_parquet(staging / "dependency.parquet", index=False)
        (staging / "meta.json").write_text(
            json.dumps(
                {
                    "model_name": result.model_name,
                    "num_sentences": result.num_sentences,
                    "has_dependency": result.dependency is not None,
                }
            ),
            encoding="utf-8",
        )
        if not (root / key).exists():
            staging.rename(root / key)  # atomic: a reader never sees half an entry
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # whatever was not renamed (another process was first, an error)


def _within_shard(progress: Progress | None, shard: Shard, done_before: int, total: int, num_shards: int):
    """``compute_shard``'s progress as corpus progress; the shard's last batch is reported once it is stored."""
    if progress is None:
        return None

    def report_batch(done: float, shard_total: float, message: str = "") -> None:
        if done < shard_total:
            progress(done_before + done, total, f"shard {shard.index + 1} of {num_shards}: {message}")

    return report_batch


EXECUTORS = ("local", "ray")


def profile(
    model: LoadedModel,
    sentences: Iterable[Sentence | str],
    batch_size: int = 16,
    shard_size: int = DEFAULT_SHARD_SIZE,
    progress: Progress | None = None,
    cache: bool = True,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    executor_options: dict | None = None,
) -> ProfileResult:
    """Profile every head of ``model`` over ``sentences`` (``Sentence`` trees or plain strings).

    The sentences are cut into shards of ``shard_size`` (``iter_shards``); each shard is computed
    (``compute_shard``) or, with ``cache``, loaded from the cache, where each finished shard is stored
    as soon as it arrives: a profile stopped half-way (a progress callback that raises, Ctrl-C, a
    killed process) resumes from its finished shards. The parts are merged in corpus order as they
    arrive (``PartMerger``), so the result does not depend on which shards came from the cache, nor on
    who computed them in which order. The result equals the mean of ``head_metrics`` and
    ``dependency_scores`` of the single runs (to float rounding: padding and shard size change the
    order of float sums).

    ``sentences``: a list, or a re-iterable corpus read lazily (``open_corpus``): it is read twice, once
    to plan and check the shards (nothing but their digests is kept), once to compute them, so a corpus
    of millions of sentences never sits in memory. A one-pass iterator is read into a list first.
    ``progress(done, total, message)`` counts sentences, those of cached shards included.

    ``executor``: ``"local"`` computes the shards in this process; ``"ray"`` on ``workers`` Ray actors
    (``mha_core.corpus.ray_executor``: each loads the model by its name once; a local Ray cluster unless
    ``address`` names one). Each shard is computed the same way by either, so both give the same
    numbers. ``executor_options``: further keyword arguments of ``distributed.ray_parts``.
    """
    if executor not in EXECUTORS:
        raise HeadscopeError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor == "local" and (workers is not None or address is not None or executor_options):
        raise HeadscopeError("workers, address and executor_options are options of the ray executor")
    check_profile_settings(batch_size, shard_size)
    if iter(sentences) is sentences:
        sentences = list(sentences)  # a one-pass iterator: the two passes need it twice
    # Pass 1: check every sentence before any slow work, and name each shard; no sentence is kept.
    digests, sizes = [], []
    for shard in iter_shards(sentences, shard_size):
        for sentence in shard.sentences:
            model_input(sentence)
        digests.append(shard.digest)
        sizes.append(len(shard))
    if not digests:
        raise HeadscopeError("the corpus is empty")
    total, num_shards = sum(sizes), len(digests)
    # A model without weights to fingerprint (a stand-in in a test) is never cached.
    store = ShardCache(model, batch_size, shard_size) if cache and hasattr(model, "hf_model") else None
    result_key = store.result_key(digests) if store is not None else None
    if result_key is not None:
        cached = _load_result(result_key)
        if cached is not None:
            report(progress, total, total, "profile from the cache")
            return cached
    in_cache = set()
    if store is not None:
        in_cache = {
            index for index, digest in enumerate(digests) if store.load_digest(digest, sizes[index]) is not None
        }
    done = sum(sizes[index] for index in in_cache)
    if in_cache:
        report(progress, done, total, f"{len(in_cache)} of {num_shards} shards from the cache")
    merger = PartMerger()
    finished = 0

    def to_compute() -> Iterator[Shard]:
        # Pass 2: cached shards are merged as they are read; the others go to the executor, in corpus order.
        nonlocal finished
        for shard in iter_shards(sentences, shard_size):
            part = store.load(shard) if shard.index in in_cache else None
            if part is not None:
                merger.add(part)
                finished += 1
            else:
                yield shard

    if executor == "local" or len(in_cache) == num_shards:  # nothing to compute: no cluster to start
        computed = _local_parts(
            model=model,
            shards=to_compute(),
            batch_size=batch_size,
            progress=progress,
            done_before=lambda: done,
            total=total,
            num_shards=num_shards,
        )
    else:
        from .ray_executor import model_reference, ray_parts  # the Ray executor: imports ray

        computed = ray_parts(
            model_reference(model),
            to_compute(),
            batch_size=batch_size,
            workers=workers,
            address=address,
            **(executor_options or {}),
        )
    with contextlib.closing(computed):
        for shard, part in computed:
            if part.num_sentences != len(shard) or part.start != shard.start:
                raise HeadscopeError(f"shard {shard.index} came back with the wrong sentences")
            if store is not None:
                store.store(shard, part)
            merger.add(part)
            finished += 1
            done += len(shard)
            report(progress, done, total, f"{finished} of {num_shards} shards done")
    result = finish_profile(merger.result(), model.name, from_cache=len(in_cache) == num_shards)
    if result_key is not None:
        _store_result(result_key, result)
    return result


def _local_parts(model, shards: Iterable[Shard], batch_size: int, progress, done_before, total: int, num_shards: int):
    """``(shard, part)`` of each shard, computed here, in order (``done_before()``: sentences finished so far)."""
    for shard in shards:
        yield (
            shard,
            compute_shard(model, shard, batch_size, _within_shard(progress, shard, done_before(), total, num_shards)),
        )
