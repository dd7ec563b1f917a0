"""Profiles on Ray: the shards of ``corpus.profiling.profile`` computed by Ray actors, on one machine or many.

``corpus.profiling.profile(model, sentences, executor="ray", workers=N, address=None)`` calls ``ray_parts``;
nothing else in the library imports this module, and nothing imports ray until a Ray profile starts
(the app never does). The design is Ray's own pattern for batch inference:

- each actor (``ShardWorker``) loads the model once, by its name (``load_model``: an embedded model, a
  checkpoint folder that every node can read, or a hub id), pins torch to ``threads`` threads, and
  checks that its weights are the driver's (the same fingerprint the shard cache is keyed by);
- the driver hands out shards in corpus order, a few per actor in flight (``ray.wait``), and yields each
  ``(shard, ProfilePart)`` as it comes back; ``corpus.profiling.profile`` stores it in the shard cache at once and
  merges parts in corpus order (``PartMerger``), so the numbers equal an in-process profile's, bit for
  bit, whatever the number of workers or the order the shards finish in;
- an actor that dies (a killed process, a lost node) is restarted by Ray (``max_restarts``) and its
  shard run again (``max_task_retries``); a driver that is stopped keeps every shard it stored, and
  the same call resumes from them.

A local cluster of ``workers`` CPUs is started when Ray is not running yet and ``address`` is None, and
shut down at the end; ``address`` ("auto", "ray://head:10001") joins an existing cluster; a cluster
started by the caller (``ray.init``) is used as it is and left running.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import HeadscopeError
from ..models.loading import load_model
from .measure import compute_shard
from .storage import weights_fingerprint

# Shards handed to each actor before the first comes back: the next one is queued while the driver
# stores and merges the last, so an actor never waits for the driver.
SHARDS_IN_FLIGHT_PER_WORKER = 2
# A dead actor is restarted, and its shard run again, this many times before the profile fails.
MAX_RESTARTS = 3
# The folder that holds the mha_core package: local workers import this code, not an installed copy.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class ModelReference:
    """What a worker needs to load the driver's model: its name and the fingerprint of its weights."""

    name: str
    fingerprint: str


def model_reference(model) -> ModelReference:
    """The reference of a loaded model; HeadscopeError for a model that cannot be loaded again by name."""
    if not hasattr(model, "hf_model") or not isinstance(getattr(model, "name", None), str):
        raise HeadscopeError("the ray executor needs a model loaded with load_model: workers load it by its name")
    return ModelReference(model.name, weights_fingerprint(model))


def require_ray():
    try:
        import ray  # ray: imported only when a Ray profile runs
    except ImportError as exc:
        raise HeadscopeError("the ray executor needs Ray: pip install 'ray==2.60.0' (see requirements.txt)") from exc
    return ray


class ShardWorker:
    """A Ray actor (``ray.remote(ShardWorker)``): one model, loaded once; computes shards with ``compute_shard``."""

    def __init__(self, reference: ModelReference, threads: int, before_shard: Callable | None = None):

        torch.set_num_threads(threads)
        self.model = load_model(reference.name, download=False)
        self.fingerprint = weights_fingerprint(self.model)
        self.before_shard = before_shard

    def fingerprint_of_model(self) -> str:
        return self.fingerprint

    def compute(self, shard, batch_size: int):
        if self.before_shard is not None:
            self.before_shard(shard)
        return compute_shard(self.model, shard, batch_size)


_remote_classes: dict = {}


def _worker_class(ray):
    """``ray.remote(ShardWorker)``, made once ray is imported (importing this module never imports ray)."""
    if "worker" not in _remote_classes:
        _remote_classes["worker"] = ray.remote(ShardWorker)
    return _remote_classes["worker"]


def ray_parts(
    reference: ModelReference,
    shards: Iterable,
    batch_size: int = 16,
    workers: int | None = None,
    address: str | None = None,
    threads: int = 1,
    cpus_per_worker: float = 1,
    max_restarts: int = MAX_RESTARTS,
    before_shard: Callable | None = None,
) -> Iterator[tuple]:
    """``(shard, ProfilePart)`` for each of ``shards``, computed by ``workers`` Ray actors, as they finish.

    ``shards`` is read as actors become free (a lazy corpus stays lazy). ``threads``: torch threads in
    each actor (the same count as an in-process profile gives the same bits; Ray reserves
    ``cpus_per_worker`` CPUs per actor). ``before_shard(shard)`` runs in the actor before each shard
    (tests use it to kill an actor). Closing the generator (a stopped profile) kills the actors and
    shuts down a cluster this call started.
    """
    if workers is None:
        workers = 2
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise HeadscopeError(f"workers must be a whole number of at least 1, got {workers!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise HeadscopeError(f"threads must be a whole number of at least 1, got {threads!r}")
    ray = require_ray()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(
                address=address,
                num_cpus=None if address else max(1, int(workers * cpus_per_worker)),
                include_dashboard=False,
                logging_level="WARNING",
                log_to_driver=False,
            )
        except ConnectionError as exc:
            raise HeadscopeError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc
        started = True
    actors = []
    try:
        options = dict(num_cpus=cpus_per_worker, max_restarts=max_restarts, max_task_retries=max_restarts)
        if not address:
            # Local workers import the mha_core of this process, wherever it was imported from.
            path = os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
        worker_class = _worker_class(ray)
        actors = [worker_class.options(**options).remote(reference, threads, before_shard) for _ in range(workers)]
        for fingerprint in _get(ray, [actor.fingerprint_of_model.remote() for actor in actors]):
            if fingerprint != reference.fingerprint:
                raise HeadscopeError(
                    f"a Ray worker loaded other weights under the name {reference.name!r} than this process: "
                    "every node must see the same checkpoint"
                )
        yield from _schedule(ray, actors, iter(shards), batch_size)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if started:
            ray.shutdown()


def _schedule(ray, actors: list, shards: Iterator, batch_size: int) -> Iterator[tuple]:
    """Keep every actor ``SHARDS_IN_FLIGHT_PER_WORKER`` shards busy; yield results as they finish."""
    in_flight: dict = {}  # object ref -> (shard, actor)
    idle = deque(actor for _ in range(SHARDS_IN_FLIGHT_PER_WORKER) for actor in actors)

    def submit() -> None:
        while idle:
            shard = next(shards, None)
            if shard is None:
                return
            actor = idle.popleft()
            in_flight[actor.compute.remote(shard, batch_size)] = (shard, actor)

    submit()
    while in_flight:
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        shard, actor = in_flight.pop(ready[0])
        part = _get(ray, ready[0])
        idle.append(actor)
        submit()  # before the driver stores and merges this part, so the actor is never idle
        yield shard, part


def _get(ray, refs):
    """``ray.get``, with an error the library raises (a HeadscopeError in a worker comes back as one)."""
    from ray.exceptions import RayActorError  # ray: imported only when a Ray profile runs

    try:
        return ray.get(refs)
    except RayActorError as exc:
        raise HeadscopeError(f"a Ray worker died and was not restarted; the finished shards are kept: {exc}") from exc
