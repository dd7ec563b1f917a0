"""Profiles on a local Ray cluster: the same numbers as in process, whatever the workers, the order or a crash.

One local cluster (2 CPUs) for the module. Each shard is computed the same way in a Ray actor as in
this process (the same batches, torch at this process's thread count), so the profiles are compared
for exact equality, not within a tolerance.
"""

from __future__ import annotations

import importlib.util
import os
import random

import pandas as pd
import pytest
import torch

from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.corpus import shards
from mha_core.corpus.parts import merge_parts
from mha_core.corpus.profiling import finish_profile, profile
from mha_core.corpus.shards import plan_shards
from tests.conftest import ROOT, require

pytestmark = pytest.mark.slow  # loads MiniLM, in this process and in every Ray actor

# Eight shards of two batches each: enough for two actors to share them out of order, few enough sentences that
# the actors' start (a process, torch and MiniLM each) is most of the time.
NUM_SENTENCES, BATCH_SIZE, SHARD_SIZE = 64, 4, 8


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def ray_cluster():
    require(importlib.util.find_spec("ray") is not None, "ray (requirements.txt)")
    import ray

    for attempt in range(3):
        try:
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                logging_level="WARNING",
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
            )
            break
        except Exception as error:
            # Ray waits a fixed 30 s for its raylet to register: on a machine with other work on its two cores
            # that can pass before it has started. Another start is a fair bound; anything else is an error.
            if "timed out during startup" not in str(error) or attempt == 2:
                raise
            ray.shutdown()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def sentences():
    return ud_ewt_dev(NUM_SENTENCES)


@pytest.fixture(scope="module")
def in_process(minilm, sentences):
    return profile(minilm, sentences, batch_size=BATCH_SIZE, shard_size=SHARD_SIZE, cache=False)


def ray_options(**options) -> dict:
    # Torch in each actor at this process's thread count: the same kernels, the same bits.
    return {"threads": torch.get_num_threads(), **options}


def assert_same_profile(result, expected):
    pd.testing.assert_frame_equal(result.metrics, expected.metrics, check_exact=True)
    pd.testing.assert_frame_equal(result.dependency, expected.dependency, check_exact=True)
    assert result.num_sentences == expected.num_sentences == NUM_SENTENCES


def record_shards(path):
    """A ``before_shard`` hook: each shard's index appended to a file, from whichever actor computes it."""

    def record(shard):
        with open(path, "a") as handle:
            handle.write(f"{shard.index}\n")

    return record


def recorded(path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_ray_profile_equals_in_process_profile_with_one_and_two_workers(
    ray_cluster, minilm, sentences, in_process, tmp_path
):
    log = tmp_path / "computed.txt"
    one = profile(
        minilm,
        sentences,
        batch_size=BATCH_SIZE,
        shard_size=SHARD_SIZE,
        cache=False,
        executor="ray",
        workers=1,
        executor_options=ray_options(before_shard=record_shards(log)),
    )
    assert_same_profile(one, in_process)
    assert recorded(log) == list(range(8))  # one actor: the shards in corpus order, each once

    # Two actors, the shards handed out shuffled: they finish in another order and still merge the same.
    from mha_core.corpus.ray_executor import model_reference, ray_parts

    shuffled = plan_shards(sentences, SHARD_SIZE)
    random.Random(7).shuffle(shuffled)
    log.unlink()
    arrived = list(
        ray_parts(
            model_reference(minilm), shuffled, BATCH_SIZE, workers=2, **ray_options(before_shard=record_shards(log))
        )
    )
    assert sorted(recorded(log)) == list(range(8))
    assert [shard.index for shard, _ in arrived] != list(range(8))
    assert all(part.start == shard.start for shard, part in arrived)
    two = finish_profile(merge_parts(part for _, part in arrived), minilm.name)
    assert_same_profile(two, in_process)


def test_a_killed_worker_is_restarted_and_the_profile_is_the_same(ray_cluster, minilm, sentences, in_process, tmp_path):
    marker = tmp_path / "killed"

    def exit_on_first_shard(shard):
        # The first actor to start a shard dies at once (no cleanup, like a killed process or a lost node).
        if not os.path.exists(marker):
            with open(marker, "w") as handle:
                handle.write(str(shard.index))
            os._exit(1)

    result = profile(
        minilm,
        sentences,
        batch_size=BATCH_SIZE,
        shard_size=SHARD_SIZE,
        cache=False,
        executor="ray",
        workers=2,
        executor_options=ray_options(before_shard=exit_on_first_shard),
    )
    assert marker.read_text() in ("0", "1")  # a worker did die, on one of the first two shards handed out
    assert_same_profile(result, in_process)


def test_an_interrupted_ray_profile_resumes_without_recomputing_a_finished_shard(
    ray_cluster, minilm, sentences, in_process, cache_dir, tmp_path
):
    settings = dict(batch_size=BATCH_SIZE, shard_size=SHARD_SIZE, executor="ray", workers=2)

    def stop_after_three_shards(done, total, message):
        if done >= 3 * SHARD_SIZE:  # reported once the third shard is stored
            raise Stop

    with pytest.raises(Stop):
        profile(minilm, sentences, progress=stop_after_three_shards, executor_options=ray_options(), **settings)
    kept, total = shards.shards_in_cache(minilm, sentences, BATCH_SIZE, SHARD_SIZE)
    assert (kept, total) == (3, 8)
    store = shards.ShardCache(minilm, BATCH_SIZE, SHARD_SIZE)
    finished = {shard.index for shard in plan_shards(sentences, SHARD_SIZE) if store.load(shard) is not None}
    assert not (cache_dir / "results").exists()  # no result of a stopped profile

    log = tmp_path / "resumed.txt"
    calls = []
    resumed = profile(
        minilm,
        sentences,
        progress=lambda done, total, message: calls.append((done, total, message)),
        executor_options=ray_options(before_shard=record_shards(log)),
        **settings,
    )
    computed = recorded(log)
    assert sorted(computed) == sorted(set(range(8)) - finished)  # each missing shard once, no finished one
    assert calls[0] == (3 * SHARD_SIZE, NUM_SENTENCES, "3 of 8 shards from the cache")
    assert calls[-1][:2] == (NUM_SENTENCES, NUM_SENTENCES)
    assert_same_profile(resumed, in_process)
    assert shards.shards_in_cache(minilm, sentences, BATCH_SIZE, SHARD_SIZE) == (8, 8)
