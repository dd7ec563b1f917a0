"""The memory budget covers the process's runs, not only the cache: computations reserve their peak before
they start, evicted values still in use stay counted, and no session keeps a run once its page is drawn."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from mha_core.errors import EmptyTextError
from mha_core.operations import Attention
from mha_core.operations.base import RUN_PEAK_FACTOR, attention_bytes
from tests.conftest import METRIC_TOL, WAIT_S, until
from tests.page_helpers import open_app
from ui.budget import ByteBudgetCache, OverBudget, runs_budget

MB = 1 << 20
TEXT = "The cat sat on the mat because it was tired."


def block(megabytes: int) -> np.ndarray:
    return np.ones(megabytes * MB // 4, dtype=np.float32)


def test_a_computation_reserves_its_peak_before_it_starts():
    cache = ByteBudgetCache(budget_bytes=10 * MB)
    cache.get_or_compute("a", lambda: block(4))
    cache.get_or_compute("b", lambda: block(4))
    seen = {}

    def compute():
        seen.update(cache.stats())
        return block(3)

    cache.get_or_compute("c", compute, reserve_bytes=6 * MB)
    # Before compute() ran, "a" (least recently used) was evicted to make room for the 6 MB reserved.
    assert seen["reserved_bytes"] == 6 * MB and seen["bytes"] == 4 * MB and seen["entries"] == 1
    assert seen["used_bytes"] == 10 * MB and seen["in_flight"] == 1
    after = cache.stats()  # the reservation became the value's own 3 MB
    assert after["reserved_bytes"] == 0 and after["in_flight"] == 0 and after["bytes"] == 7 * MB
    assert cache.get_or_compute("b", lambda: pytest.fail("b must still be cached")).nbytes == 4 * MB


def test_a_reservation_waits_while_others_in_flight_fill_the_budget():
    cache = ByteBudgetCache(budget_bytes=10 * MB)
    first_running, let_first_finish = threading.Event(), threading.Event()
    order, peaks = [], []

    def first():
        with cache.reserve(7 * MB):
            first_running.set()
            peaks.append(cache.stats()["used_bytes"])
            let_first_finish.wait(10)
            order.append("first done")

    def second():
        first_running.wait(10)
        cache.get_or_compute(
            "second",
            lambda: (order.append("second computes"), block(1))[1],
            check=lambda: second_polls.append(1),  # called on every poll while it waits
            reserve_bytes=5 * MB,
        )
        peaks.append(cache.stats()["used_bytes"])

    second_polls = []
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_running.wait(WAIT_S)
    until(lambda: len(second_polls) >= 2)  # two polls: 7 + 5 MB do not fit in 10 MB, so the second still waits
    assert order == [] and cache.stats()["reserved_bytes"] == 7 * MB
    let_first_finish.set()
    for thread in threads:
        thread.join(10)
    assert order == ["first done", "second computes"]
    assert max(peaks) <= 10 * MB and cache.stats()["waits"] == 1 and cache.stats()["reserved_bytes"] == 0


def test_a_waiting_reservation_can_be_given_up():
    cache = ByteBudgetCache(budget_bytes=10 * MB)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with cache.reserve(8 * MB):
            holding.set()
            release.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    holding.wait(10)

    class Gone(BaseException):
        pass

    def check():
        raise Gone

    with pytest.raises(Gone):
        cache.get_or_compute("k", lambda: pytest.fail("must wait, not compute"), check=check, reserve_bytes=4 * MB)
    assert cache.stats()["reserved_bytes"] == 8 * MB  # the one that gave up holds nothing
    release.set()
    worker.join(10)
    assert cache.stats()["reserved_bytes"] == 0 and cache.stats()["in_flight"] == 0
    assert cache.get_or_compute("k", lambda: block(1), reserve_bytes=4 * MB).nbytes == MB  # computable again


def test_nested_a_computation_larger_than_the_room_goes_ahead_and_none_larger_than_the_budget_runs():
    cache = ByteBudgetCache(budget_bytes=10 * MB)

    def outer():
        # Nested in a reservation of the same thread: waiting for "the others" would wait for itself.
        inner = cache.get_or_compute("inner", lambda: block(1), reserve_bytes=8 * MB)
        return block(2) + inner[0]

    value = cache.get_or_compute("outer", outer, reserve_bytes=8 * MB)  # alone: 8 MB fits; nested: 16 MB
    assert value.nbytes == 2 * MB and cache.stats()["reserved_bytes"] == 0
    # More than the whole budget: refused before it starts, never run alone over the budget.
    with pytest.raises(OverBudget) as refused:
        cache.get_or_compute("huge", lambda: pytest.fail("must be refused, not run"), reserve_bytes=18 * MB)
    assert (refused.value.nbytes, refused.value.limit, refused.value.share) == (18 * MB, 10 * MB, None)
    assert "18 MB" in str(refused.value) and "10 MB" in str(refused.value)
    assert cache.stats()["reserved_bytes"] == 0 and cache.stats()["in_flight"] == 0 and "huge" not in cache
    # A value larger than the budget (its estimate was too small): not cached, but counted while the caller holds
    # it; so is "outer", evicted to make room and still held.
    huge = cache.get_or_compute("huge", lambda: block(12), reserve_bytes=9 * MB)
    stats = cache.stats()
    assert "huge" not in cache and stats["entries"] == 0  # everything went to make room
    assert stats["in_use_elsewhere_bytes"] == (12 + 2) * MB
    del huge, value
    gc.collect()
    assert cache.stats()["in_use_elsewhere_bytes"] == 0


def test_evicted_values_still_in_use_count_until_freed():
    cache = ByteBudgetCache(budget_bytes=10 * MB)
    held = cache.get_or_compute("a", lambda: block(4))  # a page still drawing "a"
    cache.get_or_compute("b", lambda: block(4))
    cache.get_or_compute("c", lambda: block(4))  # evicts "a" (held), then "b": 4 + 4 + 4 > 10
    stats = cache.stats()
    assert list(cache._entries) == ["c"] and stats["in_use_elsewhere_bytes"] == 4 * MB
    assert stats["used_bytes"] == 8 * MB <= stats["budget_bytes"]
    del held
    assert cache.stats()["in_use_elsewhere_bytes"] == 0 and cache.stats()["used_bytes"] == 4 * MB


def test_runs_held_only_by_a_reference_cycle_are_collected_to_make_room():
    """A stopped script leaves its run in a reference cycle (its frames); the server turns Streamlit's
    collection after every run off, so a reservation that needs the room collects."""
    cache = ByteBudgetCache(budget_bytes=10 * MB)
    gc.disable()
    try:
        cycle = {"run": cache.get_or_compute("a", lambda: block(6))}
        cycle["self"] = cycle
        cache.get_or_compute("b", lambda: block(5))  # evicts "a" (the cycle holds it), then "b": 6 + 5 > 10
        del cycle
        assert cache.stats()["in_use_elsewhere_bytes"] == 6 * MB and len(cache) == 0
        seen = {}
        cache.get_or_compute("d", lambda: seen.update(cache.stats()) or block(1), reserve_bytes=6 * MB)
    finally:
        gc.enable()
    # 6 held + 6 reserved > 10: before going ahead alone over the budget, the collection freed "a".
    assert seen["in_use_elsewhere_bytes"] == 0 and seen["used_bytes"] == seen["reserved_bytes"] == 6 * MB


def test_attention_bytes_is_a_runs_attention_array():
    assert attention_bytes(30, 9, 512) == 30 * 9 * 512 * 512 * 4 == 283_115_520  # SmolLM2 at 512 tokens


def test_runs_get_seven_eighths_of_the_server_budget():
    assert runs_budget(2048 * MB) == 1792 * MB and runs_budget(1024 * MB) == 896 * MB


# ---- with the app ------------------------------------------------------------------------------------
@pytest.fixture
def fresh_server(monkeypatch):
    from ui import compute

    for name in ("HEADSCOPE_CLASSROOM", "HEADSCOPE_ALLOWED_MODELS", "HEADSCOPE_CACHE_BUDGET_MB"):
        monkeypatch.delenv(name, raising=False)
    compute.reset_server_state()
    yield compute
    compute.reset_server_state()


def live_runs() -> list:
    from mha_core.run import AttentionRun

    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, AttentionRun)]


@pytest.mark.slow
def test_a_run_reserves_its_estimated_peak(minilm):
    bos = minilm.default_bos
    n = len(minilm.encode(TEXT, None, bos).input_ids)
    operation = Attention.of(minilm, TEXT)
    run = minilm.run(TEXT)
    assert run.attentions.nbytes == attention_bytes(minilm.num_layers, minilm.num_heads, n) == 6 * 12 * n * n * 4
    assert operation.peak_bytes(minilm) == int(RUN_PEAK_FACTOR * run.attentions.nbytes)
    assert Attention.of(minilm, TEXT, norms=True).peak_bytes(minilm) == 2 * operation.peak_bytes(minilm)
    with pytest.raises(EmptyTextError):  # refused where it is tokenized, before anything is reserved
        Attention.of(minilm, "\u200b")


@pytest.mark.slow
def test_no_session_keeps_its_run_once_the_page_is_drawn(minilm, fresh_server):
    """Explore drawn (head view fragment, download buttons): once the cache lets the run go, nothing of the
    session holds it. Before, the fragment kept the page's globals and the download buttons' callables
    kept the run, for as long as the session lived."""
    compute = fresh_server
    before = {id(run) for run in live_runs()}
    app = open_app(query={"text": TEXT, "model": "minilm"})
    assert not app.exception and compute.shared().cache.stats()["entries"] >= 1
    assert any(getattr(run, "text", None) == TEXT for run in live_runs() if id(run) not in before)
    compute.shared().cache.clear()
    left = [run for run in live_runs() if id(run) not in before and run.text == TEXT]
    assert left == [], f"{len(left)} run(s) of the drawn page still in memory"
    assert app.session_state["_state_initialised"]  # the session itself is still there


@pytest.mark.slow
def test_a_download_gets_its_run_back_once_it_has_left_memory(minilm, fresh_server):
    from ui import computations

    compute = fresh_server
    run = computations.remember(Attention.of(minilm, TEXT)).run(minilm)  # as get_run makes and remembers it
    view = run.to_words()
    expected_npz, expected_csv = view.to_npz_bytes(), view.head_frame(2, 3).to_csv().encode()
    npz = computations.deferred(view, lambda v: v.to_npz_bytes())
    csv = computations.deferred(view, lambda v: v.head_frame(2, 3).to_csv().encode())
    assert npz() == expected_npz  # still in memory: the same view
    del run, view
    assert [r for r in live_runs() if r.text == TEXT] == []  # the callables do not hold it
    assert csv() == expected_csv and len(npz()) == len(expected_npz)  # made again through the cache
    assert compute.shared().cache.stats()["entries"] == 1


# What one page sends for the longest text: the head view shows its first tokens only (``widgets.first_tokens``);
# the figures and the head view of one Explore page for a 512-token MiniLM run, as JSON, stay under this many bytes.
PAGE_PAYLOAD_MAX_BYTES = 10 << 20


@pytest.mark.slow
def test_a_page_of_the_longest_text_sends_a_bounded_payload(minilm, fresh_server):
    text = " ".join(["the students read a short story about a small village near the sea"] * 60)
    assert len(minilm.encode(text).input_ids) == minilm.max_tokens == 512
    app = open_app(query={"text": text, "model": "minilm"})
    assert not app.exception
    sizes = {element.key: len(element.proto.spec) for element in app.get("plotly_chart")}
    sizes.update({element.proto.id: len(element.proto.json) for element in app.get("bidi_component")})
    head_view = [key for key in sizes if str(key).endswith("-head_view")]
    assert len(head_view) == 1, sizes  # the canvas head view (ui/headview/)
    assert sum(sizes.values()) <= PAGE_PAYLOAD_MAX_BYTES, sizes
    assert sizes[head_view[0]] < 12 * 512 * 512 * 4  # fewer bytes than the layer's 12 heads in float32 alone


@pytest.mark.slow
def test_a_view_and_its_run_cache_their_measurements_apart(minilm, fresh_server):
    """A word-level view keeps its run's key; metrics of the view are not the run's metrics."""
    from ui import computations

    text = "Unbelievably, the tokenizer splits words."
    run = minilm.run(text)
    run.metadata["cache_key"] = ("run", "minilm", "transformers", text, None, minilm.default_bos)
    words = run.to_words()
    assert words.num_tokens < run.num_tokens
    token_metrics, word_metrics = computations.metrics_for(run), computations.metrics_for(words)
    assert len(token_metrics) == len(word_metrics) == minilm.num_layers * minilm.num_heads
    expected = __import__("mha_core").head_metrics(words)
    np.testing.assert_allclose(word_metrics["entropy"], expected["entropy"], **METRIC_TOL)
    assert not np.allclose(word_metrics["entropy"], token_metrics["entropy"])
    assert computations.metrics_for(words) is word_metrics  # cached


def test_get_and_put_keep_the_most_recently_used_within_the_budget():
    cache = ByteBudgetCache(100, size_of=len)
    cache.put("a", "x" * 40)
    cache.put("b", "y" * 40)
    assert cache.get("a") == "x" * 40  # "a" is now the most recent
    cache.put("c", "z" * 40)  # 120 bytes do not fit: the least recently used, "b", goes
    assert cache.keys() == ["a", "c"] and cache.get("b") is None and cache.get("b", 0) == 0
    cache.put("a", "w" * 10)  # replacing an entry counts its new size only
    assert cache.stats()["bytes"] == 50 and cache.keys() == ["c", "a"]
    cache.put("big", "v" * 101)  # larger than the whole budget: not kept
    assert cache.keys() == ["c", "a"]
