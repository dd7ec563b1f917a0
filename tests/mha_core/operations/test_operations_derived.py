"""What is computed from a run without a model, as operations (``mha_core.operations.derived``): named after the
run they read (a view keeps its run's key, so its measurements are its own), their values those of the library's
functions and of an independent rollout, their estimates covering what numpy allocates, and the app computing them
through ``compute`` (kept under their key; a run that came from no operation computed, never kept)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import mha_core as mc
from mha_core.operations import Attention
from mha_core.operations.derived import (
    Flow,
    HeadDistances,
    Metrics,
    Rollout,
    SemanticScores,
    View,
    source_key,
)
from tests.conftest import ATTENTION_ATOL

SHORT = "The cat sat on the mat because it was tired."
LONG = " ".join(["Unbelievably, the quick brown fox jumps over the lazy dog."] * 12)


@pytest.fixture(scope="module")
def run(minilm):
    return Attention.of(minilm, SHORT).run(minilm)


def test_an_operation_is_named_after_the_run_it_reads_and_its_own_fields(run, tmp_path):
    words = run.to_words()
    assert source_key(run) == ("token", False, *run.metadata["cache_key"])
    assert Metrics.of(run).key == Metrics.of(run).key and Metrics.of(run) == Metrics.of(run)
    assert Metrics.of(words).key != Metrics.of(run).key  # a view keeps its run's key, but not its measurements
    assert Metrics.of(words.without_special()).key not in (Metrics.of(words).key, Metrics.of(run).key)
    assert Rollout.of(run).key != Metrics.of(run).key
    assert Flow.of(run, layer=1).key != Flow.of(run, layer=2).key
    assert View.of(run, words=True).key != View.of(run, hide_special=True).key
    assert all(op.cacheable for op in (Metrics.of(run), View.of(run, words=True)))
    again = mc.AttentionRun.load(run.save(tmp_path / "run.npz"))  # a saved run keeps its key as JSON lists
    assert Metrics.of(again).key == Metrics.of(run).key
    plain = run.to_words()
    plain.metadata.pop("cache_key")
    assert source_key(plain) is None and not Metrics.of(plain).cacheable


def test_the_values_are_the_library_s_and_rollout_is_the_product_of_the_mixed_layers(run, minilm):
    np.testing.assert_array_equal(Metrics.of(run).run(run)["entropy"], mc.head_metrics(run)["entropy"])
    view = View.of(run, words=True, hide_special=True).run(run)
    expected = run.to_words().without_special()
    assert view.tokens == expected.tokens and view.level == "word"
    np.testing.assert_array_equal(view.attentions, expected.attentions)
    assert View.of(run).run(run) is run
    # Rollout, computed here: each layer's head mean mixed half and half with the identity, rows renormalised,
    # multiplied from the first layer up.
    mixed = 0.5 * run.attentions.astype(np.float64).mean(axis=1) + 0.5 * np.eye(run.num_tokens)
    mixed /= mixed.sum(axis=-1, keepdims=True)
    product = mixed[0]
    rollout = Rollout.of(run).run(run)
    for layer in range(run.num_layers):
        product = mixed[layer] if layer == 0 else mixed[layer] @ product
        np.testing.assert_allclose(rollout[layer], product, atol=ATTENTION_ATOL)
    np.testing.assert_allclose(Flow.of(run, layer=2).run(run).sum(axis=-1), 1.0, atol=1e-5)  # rows share out 1
    embeddings = minilm.input_embeddings(run.metadata["token_ids"])
    semantic = SemanticScores.of(run, embeddings=embeddings).run(run)
    np.testing.assert_array_equal(
        semantic["semantic_correlation"], mc.semantic_scores(run, embeddings)["semantic_correlation"]
    )
    distances = HeadDistances.of(run, max_queries=4).run(run)
    np.testing.assert_array_equal(distances.distances, mc.head_distances(run, max_queries=4).distances)


def traced_peak(operation, source) -> int:
    operation.run(source)  # first use: imports and compiled kernels outside the count
    tracemalloc.start()
    try:
        operation.run(source)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_each_estimate_covers_what_numpy_allocates_and_is_not_far_above_it(minilm, run):
    long = Attention.of(minilm, LONG).run(minilm)
    assert long.num_tokens > 150
    embeddings = minilm.input_embeddings(long.metadata["token_ids"])
    torch_products = 4 * long.num_layers * long.num_tokens**2  # rollout's float32 products: torch's, not traced
    cases = [
        (Metrics.of(long), long, 0),
        (HeadDistances.of(long, max_queries=128), long, 0),
        (SemanticScores.of(long, embeddings=embeddings), long, 0),
        (Rollout.of(long), long, torch_products),
        (Flow.of(run, layer=5), run, 0),
        (View.of(long, words=True, hide_special=True), long, 0),
    ]
    for operation, source, untraced in cases:
        measured = traced_peak(operation, source) + untraced
        estimate = operation.peak_bytes(source)
        assert measured <= estimate <= 4 * measured + (1 << 20), (type(operation).__name__, measured, estimate)


def test_the_app_computes_them_through_compute_kept_under_their_key(minilm, run, monkeypatch):
    from ui import computations, compute

    for name in ("HEADSCOPE_CLASSROOM", "HEADSCOPE_ALLOWED_MODELS", "HEADSCOPE_CACHE_BUDGET_MB"):
        monkeypatch.delenv(name, raising=False)
    compute.reset_server_state()
    admitted = []
    real = compute.run_admitted
    monkeypatch.setattr(compute, "run_admitted", lambda op, *a, **k: admitted.append(op) or real(op, *a, **k))
    try:
        metrics = computations.metrics_for(run)
        assert computations.metrics_for(run) is metrics and admitted == [Metrics.of(run)]  # once, then cached
        assert Metrics.of(run).key in compute.shared().cache
        rollout = computations.rollout(run)
        assert Rollout.of(run).key in compute.shared().cache and rollout.shape == (
            run.num_layers,
            run.num_tokens,
            run.num_tokens,
        )
        plain = run.to_words()
        plain.metadata.pop("cache_key")
        before = len(compute.shared().cache.keys())
        computations.metrics_for(plain)
        computations.metrics_for(plain)
        assert len(compute.shared().cache.keys()) == before  # computed each time, never kept
        assert admitted[-2:] == [Metrics.of(plain), Metrics.of(plain)]
    finally:
        compute.reset_server_state()
