"""Profiles at scale: Ray against in-process at equal cores, and the numbers a scale-out projection rests on.

    python -m bench.scale [--sentences 400] [--shard-size 50] [--repeats 2]

Table 1, at equal cores (1, and this machine's 2): ``profile(executor="local")`` with torch at C threads
against C Ray actors with one torch thread each (as ``profile(executor="ray", workers=C)``), on the same UD EWT dev sentences
(MiniLM, batch 16, no cache). Ray's time is split into actor start-up (a Ray run with no shards: start
the actors, load the model in each, check its weights) and the rest; the goal is overhead <= 15% on
the rest. Before timing, the two profiles are checked to be equal.

Table 2, the pieces of a simulated scale-out: sentences per second of one worker (one torch thread),
the time a shard takes, Ray's scheduling cost per shard (a round trip to an actor carrying a real
``ProfilePart``, one at a time and pipelined), and the driver's work per shard (storing the part in
the cache and merging it). Table 3: the projection for 1 M sentences from those numbers.

Best of ``--repeats`` (the machine is shared; the minimum is the least disturbed).
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time

import torch

import mha_core
from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.corpus import measure, parts, profiling
from mha_core.corpus import shards as corpus_shards
from mha_core.corpus.ray_executor import model_reference, ray_parts, require_ray

BATCH_SIZE = 16
PROJECTED_SENTENCES = 1_000_000
PROJECTED_WORKERS = (16, 64)
PROJECTED_SHARD_SIZE = corpus_shards.DEFAULT_SHARD_SIZE


def best(function, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result


class Echo:
    """An actor that returns what it is given: Ray's cost per shard without any work."""

    def echo(self, part):
        return part


def scheduling_cost(ray, part, calls: int = 40) -> tuple[float, float]:
    """(seconds per round trip one at a time, seconds per shard with 4 in flight) for a part-sized payload."""
    actor = ray.remote(Echo).options(num_cpus=1).remote()
    ray.get(actor.echo.remote(part))  # started
    start = time.perf_counter()
    for _ in range(calls):
        ray.get(actor.echo.remote(part))
    sequential = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    in_flight = []
    for _ in range(calls):
        in_flight.append(actor.echo.remote(part))
        if len(in_flight) >= 4:
            ready, in_flight = ray.wait(in_flight, num_returns=1)
            ray.get(ready)
    ray.get(in_flight)
    pipelined = (time.perf_counter() - start) / calls
    ray.kill(actor)
    return sequential, pipelined


def ray_run(reference, shards, workers: int):
    """(seconds in all, seconds of actor start-up, profile) of one Ray run of the shards, as a profile does it.

    Start-up ends when the first shard is handed out: the actors have started, loaded the model and
    checked its weights."""
    handed_out = []

    def shards_as_asked():
        handed_out.append(time.perf_counter())
        yield from shards

    start = time.perf_counter()
    merger = parts.PartMerger()
    for _, part in ray_parts(reference, shards_as_asked(), BATCH_SIZE, workers=workers, threads=1):
        merger.add(part)
    result = profiling.finish_profile(merger.result(), reference.name)
    total = time.perf_counter() - start
    return total, handed_out[0] - start, result


def driver_cost(model, shard, part, repeats: int = 20) -> float:
    """Seconds the driver spends per arriving shard: store it in the shard cache and merge it."""
    with tempfile.TemporaryDirectory(prefix="headscope-scale-") as folder:
        os.environ["HEADSCOPE_CACHE_DIR"] = folder
        store = corpus_shards.ShardCache(model, BATCH_SIZE, len(shard))
        merger = parts.PartMerger(part.start)
        times = []
        for index in range(repeats):
            shifted = parts.ProfilePart(
                part.start + index * part.num_sentences, part.num_layers, part.num_heads, part.metrics, part.dependency
            )
            start = time.perf_counter()
            store.store(shard, shifted)
            merger.add(shifted)
            times.append(time.perf_counter() - start)
        del os.environ["HEADSCOPE_CACHE_DIR"]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--shard-size", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    cores = os.cpu_count() or 1
    model = mha_core.load_model("minilm")
    sentences = ud_ewt_dev(args.sentences)
    shards = corpus_shards.plan_shards(sentences, args.shard_size)
    settings = dict(batch_size=BATCH_SIZE, shard_size=args.shard_size, cache=False)
    ray = require_ray()
    ray.init(num_cpus=cores, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    reference = model_reference(model)
    try:
        # ---- table 1: equal cores, 1 and all of them (interleaved, so load hits both sides alike)
        rows = []
        for used in sorted({1, cores}):
            local_times, ray_runs = [], []
            for _ in range(args.repeats):
                torch.set_num_threads(used)
                local_s, local = best(lambda: profiling.profile(model, sentences, **settings), 1)
                local_times.append(local_s)
                ray_runs.append(ray_run(reference, shards, used))
            ray_s, startup_s, distributed = min(ray_runs, key=lambda run: run[0] - run[1])
            # Equal numbers to float rounding (the two sides may run torch at different thread counts).
            numbers = distributed.metrics.select_dtypes("number") - local.metrics.select_dtypes("number")
            assert numbers.abs().max().max() < 1e-5
            rows.append((used, min(local_times), ray_s, startup_s))
        # ---- table 2: the pieces
        torch.set_num_threads(1)
        one_thread_s, _ = best(lambda: profiling.profile(model, sentences, **settings), args.repeats)
        part = measure.compute_shard(model, shards[0], BATCH_SIZE)
        part_kb = len(pickle.dumps(part)) / 1024
        sequential_s, pipelined_s = scheduling_cost(ray, part)
        driver_s = driver_cost(model, shards[0], part)
    finally:
        ray.shutdown()

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    count = len(sentences)
    print(
        f"torch {torch.__version__}, ray {ray.__version__}, {cores} CPUs, load average {load}; MiniLM, "
        f"{count} UD EWT dev sentences, {len(shards)} shards of {args.shard_size}, batch {BATCH_SIZE}, "
        f"best of {args.repeats}\n"
    )
    print("Equal cores: in-process at C torch threads vs Ray, C actors x 1 thread")
    print(
        "| cores C | in-process (s) | sent/s | Ray in all (s) | actor start-up (s) | Ray after start-up (s) "
        "| sent/s | Ray / in-process, after start-up (goal <= 1.15) | with start-up |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for used, local_s, ray_s, startup_s in rows:
        steady_s = ray_s - startup_s
        print(
            f"| {used} | {local_s:.2f} | {count / local_s:.1f} | {ray_s:.2f} | {startup_s:.2f} | {steady_s:.2f} | "
            f"{count / steady_s:.1f} | {steady_s / local_s:.2f} | {ray_s / local_s:.2f} |"
        )

    per_worker = count / one_thread_s  # sentences per second of one worker at one thread
    shard_s = args.shard_size / per_worker
    print("\nThe pieces of a scale-out (one worker = one actor at one torch thread)")
    print(
        "| sent/s per worker | s per shard of "
        f"{args.shard_size} | shards/s per worker | Ray round trip per shard, one at a time (ms) "
        "| pipelined, 4 in flight (ms) | driver: store + merge per shard (ms) | shards/s one driver can take "
        "| one part, pickled (KB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {per_worker:.1f} | {shard_s:.2f} | {1 / shard_s:.2f} | {sequential_s * 1e3:.2f} | "
        f"{pipelined_s * 1e3:.2f} | {driver_s * 1e3:.2f} | {1 / driver_s:.0f} | {part_kb:.0f} |"
    )

    # ---- table 3: projection
    shard_full_s = PROJECTED_SHARD_SIZE / per_worker
    overhead = pipelined_s / shard_full_s  # Ray's share per shard, hidden by the in-flight shard but counted
    print(
        f"\nProjection for {PROJECTED_SENTENCES:,} sentences of UD-like length, MiniLM, shards of "
        f"{PROJECTED_SHARD_SIZE} ({PROJECTED_SENTENCES // PROJECTED_SHARD_SIZE + 1} shards), 1 thread per worker"
    )
    print("| workers | worker-bound (h) | driver-bound limit (h) | projected (h) | scheduling overhead |")
    print("|---:|---:|---:|---:|---:|")
    for workers in PROJECTED_WORKERS:
        worker_bound = PROJECTED_SENTENCES / (workers * per_worker) * (1 + overhead)
        driver_bound = PROJECTED_SENTENCES / PROJECTED_SHARD_SIZE * driver_s
        print(
            f"| {workers} | {worker_bound / 3600:.2f} | {driver_bound / 3600:.3f} | "
            f"{max(worker_bound, driver_bound) / 3600:.2f} | {overhead:.2%} |"
        )


if __name__ == "__main__":
    main()
