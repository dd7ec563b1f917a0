"""A server a class can share: settings, the allow-list, links that cannot harm it, memory bounded in
bytes, forward passes through a first-come gate (AppTest on app.py, and the pieces on their own)."""

from __future__ import annotations

import json
import pickle
import re
import sys
import threading
import types

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ATTENTION_ATOL, ROOT, WAIT_S, require, until
from tests.mha_core.models.test_sources import _WritesMarker
from tests.model_fixtures import build_tiny_bert
from tests.page_helpers import head_view_data, open_app
from ui.budget import ByteBudgetCache, ComputeGate, StopPoint, estimate_bytes

TEXT = "The cat sat on the mat because it was tired."


# ---- the shared-server pieces, on their own ---------------------------------------------------------
def test_cache_is_bounded_in_bytes_least_recently_used_first():
    cache = ByteBudgetCache(budget_bytes=10_000)
    block = lambda: np.zeros(1000, dtype=np.float32)  # noqa: E731  4,000 bytes
    for key in "abc":
        cache.get_or_compute(key, block)
    assert len(cache) == 2 and cache.total_bytes == 8000 and cache.evictions == 1  # "a" went
    cache.get_or_compute("b", block)  # "b" is now the newest
    cache.get_or_compute("d", block)
    assert cache.get_or_compute("b", lambda: pytest.fail("b must still be cached")).nbytes == 4000
    assert cache.stats()["bytes"] <= cache.budget_bytes
    huge = cache.get_or_compute("huge", lambda: np.zeros(5000, dtype=np.float32))  # larger than the budget
    assert huge.nbytes == 20_000 and "huge" not in [k for k in cache._entries] and cache.total_bytes <= 10_000


def test_evicted_runs_give_their_memory_back_to_the_system():
    """Ten budgets' worth of run-sized arrays pushed through the cache, from several threads as the
    server's sessions do: the process grows by about the budget, not by what passed through."""
    import psutil

    from ui.budget import release_memory, tune_allocator

    require(sys.platform == "linux", "glibc (Linux) to tune the allocator")
    assert tune_allocator() is True  # glibc accepted both settings
    process = psutil.Process()
    release_memory(force=True)
    start = process.memory_info().rss
    budget = 64 << 20
    cache = ByteBudgetCache(budget_bytes=budget)

    def fill(offset: int) -> None:
        for i in range(20):  # 20 x 6 MB per thread, 4 threads: 480 MB through a 64 MB cache
            cache.get_or_compute((offset, i), lambda: np.ones(6 << 18, dtype=np.float32))

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    release_memory(force=True)
    grown = process.memory_info().rss - start
    assert cache.total_bytes <= budget and cache.evictions >= 60
    assert grown < budget + (48 << 20), f"grew {grown >> 20} MB for a {budget >> 20} MB budget"


def test_one_computation_per_key_and_waiters_take_over_when_it_stops():
    cache = ByteBudgetCache(budget_bytes=1 << 20)
    calls, started, waiters = [], threading.Event(), set()

    def wait_here():  # a waiter's check, called on each of its polls while another computes its key
        waiters.add(threading.get_ident())

    def slow():
        calls.append(1)
        until(lambda: len(waiters) == 3)  # the three others wait for this computation, not compute their own
        return np.ones(10)

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_compute("k", slow, check=wait_here)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 4

    class Stopped(BaseException):
        pass

    waiting = threading.Event()

    def stopped():
        started.set()
        assert waiting.wait(WAIT_S)  # another caller waits for this computation...
        raise Stopped  # ...when the session that computed it goes away

    def compute_then_stop():
        with pytest.raises(Stopped):
            cache.get_or_compute("j", stopped)

    first = threading.Thread(target=compute_then_stop)
    first.start()
    assert started.wait(WAIT_S)
    value = cache.get_or_compute("j", lambda: np.full(3, 7.0), check=waiting.set)  # the waiter computes it itself
    first.join()
    np.testing.assert_array_equal(value, [7.0, 7.0, 7.0])
    assert waiting.is_set()


def test_waiting_for_another_computation_can_be_given_up():
    cache = ByteBudgetCache(budget_bytes=1 << 20)
    computing, release = threading.Event(), threading.Event()

    def compute():
        computing.set()
        release.wait(60)
        return np.ones(1)

    worker = threading.Thread(target=lambda: cache.get_or_compute("k", compute))
    worker.start()
    assert computing.wait(WAIT_S)  # "k" is being computed by the worker

    class Gone(BaseException):
        pass

    def check():
        raise Gone

    with pytest.raises(Gone):
        cache.get_or_compute("k", lambda: pytest.fail("must wait, not compute"), check=check)
    release.set()
    worker.join()


def test_gate_lets_at_most_its_slots_run_first_come_first_served():
    gate = ComputeGate(slots=2)
    running, peak, order, lock = [0], [0], [], threading.Lock()
    done = [threading.Event() for _ in range(6)]  # the test ends each job: one slot frees at a time

    def job(index):
        with gate.slot():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                order.append(index)
            done[index].wait(60)
            with lock:
                running[0] -= 1

    threads = []
    for index in range(6):  # each arrives once the one before holds a slot or waits in the queue
        threads.append(threading.Thread(target=job, args=(index,)))
        threads[-1].start()
        until(lambda index=index: len(order) + gate.queued > index)
    assert order == [0, 1] and gate.queued == 4  # two hold the slots, four wait
    for index in range(6):
        done[index].set()  # a slot frees: the first in the queue, and only it, takes it
        started = min(6, index + 3)
        until(lambda started=started: len(order) >= started)
        assert order == list(range(started)) and peak[0] == 2
    for thread in threads:
        thread.join()
    assert order == list(range(6)) and gate.queued == 0


def test_a_queued_request_leaves_the_gate_when_stopped_and_sees_its_place():
    gate = ComputeGate(slots=1)
    places, checks = [], []

    class Gone(BaseException):
        pass

    def check():
        checks.append(1)
        if len(checks) >= 3:
            raise Gone

    with gate.slot():
        with pytest.raises(Gone), gate.slot(check=check, waiting=places.append):
            pytest.fail("the slot is taken")
        # Told its place once (a page update only when the place changes), checked on every poll.
        assert places == [0] and len(checks) == 3 and gate.queued == 0
    with gate.slot():  # the slot is free again
        pass


def test_stop_point_touches_at_most_every_interval(monkeypatch):
    clock = [100.0]  # a clock the test moves by hand: how fast the calls come is no part of what is tested
    monkeypatch.setattr("ui.budget.time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    touches = []
    check = StopPoint(lambda: touches.append(1), every_s=0.05)
    for _ in range(200):
        check(1, 2, "layer")
    assert touches == []  # within the first interval
    clock[0] += 0.06
    for _ in range(200):
        check()
    assert len(touches) == 1  # one touch for the interval, however many calls
    clock[0] += 0.04
    check()
    assert len(touches) == 1
    clock[0] += 0.02
    check()
    assert len(touches) == 2


def test_estimate_bytes_counts_a_run_by_its_arrays():
    import mha_core as mc

    run = mc.AttentionRun(
        model_name="m",
        family="bert",
        is_causal=False,
        tokens=["a", "b"],
        attentions=np.zeros((2, 3, 2, 2), np.float32),
        special_mask=[False, False],
        word_ids=[0, 1],
        words=["a", "b"],
        segment_ids=[0, 0],
    )
    assert 96 <= estimate_bytes(run) < 96 + 400


# ---- the app, under AppTest --------------------------------------------------------------------------
@pytest.fixture
def server(monkeypatch):
    """A fresh server configuration for each test, from the environment the test sets."""
    from ui import compute

    def configure(**env):
        for name in (
            "HEADSCOPE_CLASSROOM",
            "HEADSCOPE_ALLOWED_MODELS",
            "HEADSCOPE_CACHE_BUDGET_MB",
            "HEADSCOPE_ALLOW_DOWNLOADS",
            "HEADSCOPE_PUBLIC_URL",
            "HEADSCOPE_MAX_PROFILE_SENTENCES",
        ):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        compute.reset_server_state()
        return compute

    yield configure
    monkeypatch.undo()
    compute.reset_server_state()


def start(**query) -> AppTest:
    return open_app(query=query)


def messages(app: AppTest) -> list[str]:
    """Every error, warning and info text on the page, markdown escapes removed."""
    return [re.sub(r"\\(.)", r"\1", str(e.value)) for kind in ("error", "warning", "info") for e in getattr(app, kind)]


def assert_no_server_path(app: AppTest, *allowed: str) -> None:
    home = str(ROOT.parent)
    for text in messages(app):
        for keep in allowed:
            text = text.replace(keep, "")
        assert home not in text and "/root" not in text and "site-packages" not in text, text
        assert "Traceback" not in text


@pytest.mark.slow
def test_classroom_mode_offers_the_classroom_models_and_the_class_link(minilm, server):
    compute = server(HEADSCOPE_CLASSROOM="1", HEADSCOPE_PUBLIC_URL="http://10.0.0.5:8501/")
    app = start(text=TEXT)
    assert app.selectbox(key="model_choice").options == [
        "all-MiniLM-L6-v2 (embedded encoder, 6 x 12 heads)",
        "SmolLM2-135M (embedded decoder, 30 x 9 heads)",
    ]
    # MPNet (342 MB more) is embedded but not offered to a class: a link to it is refused, nothing loads.
    refused = start(text=TEXT, model="mpnet")
    assert any("does not offer" in m for m in messages(refused)), messages(refused)
    with pytest.raises(Exception, match="does not offer"):
        compute.get_model("mpnet")
    expander = next(e for e in app.sidebar.expander if e.label == "Join this class")
    assert any("http://10.0.0.5:8501/" in c.value for c in expander.code)
    assert len(app.get("image")) == 1  # the QR code, drawn on the server as a PNG
    from ui.widgets.sidebar import qr_png

    assert qr_png("http://10.0.0.5:8501/")[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert-base-uncased", "/etc", "../../etc/passwd", "smollm2", "x" * 100_000])
def test_a_link_to_a_model_the_server_does_not_offer_is_refused_without_touching_it(minilm, server, model, tmp_path):
    compute = server(HEADSCOPE_ALLOWED_MODELS="minilm")
    app = start(model=model, text=TEXT)
    said = " ".join(messages(app))
    assert "does not offer" in said or "more than any model name" in said
    assert len(said) < 2000
    assert_no_server_path(app)
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], minilm.run(TEXT).attentions[0, 0], rtol=0, atol=0.5 / 255 + ATTENTION_ATOL
    )
    with pytest.raises(Exception, match=r"does not offer|No model has a name"):
        compute.get_model(model)


@pytest.mark.slow
def test_missing_and_non_checkpoint_folders_get_the_same_message(minilm, server, tmp_path):
    server()  # a single-user server: any model may load
    (tmp_path / "notes.txt").write_text("not a model")
    said = []
    for folder in (tmp_path, tmp_path / "missing"):
        app = start(model=str(folder), text=TEXT)
        said.append([m.replace(str(folder), "<folder>") for m in messages(app)])
        assert_no_server_path(app, str(folder))
    assert said[0] == said[1] and any("No checkpoint at" in m for m in said[0])


@pytest.mark.slow
def test_checkpoints_with_code_never_run_it_through_a_link(minilm, server, tmp_path):
    server()
    marker = tmp_path / "code-ran"
    pickled = build_tiny_bert(tmp_path / "pickled")
    (pickled / "model.safetensors").unlink()
    with open(pickled / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"embeddings.word_embeddings.weight": _WritesMarker(str(marker))}, handle)
    custom = build_tiny_bert(tmp_path / "custom")
    (custom / "custom_model.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((custom / "config.json").read_text())
    config.update(model_type="headscope-custom", auto_map={"AutoModel": "custom_model.CustomModel"})
    (custom / "config.json").write_text(json.dumps(config))
    for folder, expected in ((pickled, "could run code"), (custom, "never runs code")):
        app = start(model=str(folder), text=TEXT)
        assert any(expected in m for m in messages(app)), messages(app)
        assert_no_server_path(app, str(folder))
    assert not marker.exists()


BAD_LINKS = [
    ({"layer": "99", "head": "-3"}, "asks for layer 99"),
    ({"layer": "x" * 100_000}, "is not a layer number"),
    ({"engine": "gpu-turbo"}, "there is no engine"),
    ({"page": "admin"}, "there is no page"),
    ({"text": "word " * 20_000}, "the first 4,000 are kept"),
    ({"text": "\u200b\u200c\u200d\ufeff"}, "only invisible characters"),
    ({"model": "m" * 100_000}, "more than any model name"),
    ({"text": "<script>alert(1)</script><img src=x onerror=alert(2)>"}, None),
    ({"text": "שלום עולם 你好世界 🍕🔥 \u202eevil"}, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("query, expected", BAD_LINKS, ids=[",".join(q) + str(i) for i, (q, _) in enumerate(BAD_LINKS)])
def test_every_link_parameter_is_checked_with_a_message_not_an_exception(minilm, server, query, expected):
    server()
    app = start(**{"text": TEXT, **query})
    said = messages(app)
    if expected:
        assert any(expected in m for m in said), said
    assert all(len(m) < 2000 for m in said)
    assert_no_server_path(app)
    for element in [*app.markdown, *app.caption, *app.warning, *app.error, *app.info]:
        assert not getattr(element.proto, "allow_html", False)
        assert "<script" not in str(element.value).replace("\\<", "")


@pytest.mark.slow
def test_runs_stay_within_the_byte_budget(minilm, server):
    compute = server(HEADSCOPE_CACHE_BUDGET_MB="1")
    app = start(text=TEXT)
    for index in range(8):  # about 40 tokens each: 6 x 12 x 40 x 40 x 4 bytes = 0.46 MB a run
        app.text_input(key="text").set_value(f"Sentence number {index} is " + "about a cat on a mat " * 6).run()
        assert not app.exception
    stats = compute.shared().cache.stats()
    assert stats["used_bytes"] <= stats["budget_bytes"] == (1 << 20) - (1 << 17)  # 7/8 of it for runs
    assert stats["evictions"] > 0 and stats["entries"] >= 2


def test_the_classroom_model_list_is_one_fact_in_the_server_the_banner_and_the_docs(monkeypatch):
    """The models a class server offers by default: the server's setting, what ``scripts/app.sh --classroom``
    prints, and docs/classroom.md all come from (or are checked against) ``sources.CLASSROOM_MODELS``."""
    import subprocess

    from mha_core.models.sources import CLASSROOM_MODELS, EMBEDDED_MODELS
    from ui.settings import ServerSettings

    assert set(CLASSROOM_MODELS) < set(EMBEDDED_MODELS) and "mpnet" not in CLASSROOM_MODELS
    monkeypatch.delenv("HEADSCOPE_ALLOWED_MODELS", raising=False)
    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "1")
    assert ServerSettings.from_env().allowed_models == CLASSROOM_MODELS
    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "0")
    assert ServerSettings.from_env().allowed_models is None  # one user: any model
    # The banner prints the list the code holds (the script's own Python line, run here).
    script = (ROOT / "scripts" / "app.sh").read_text(encoding="utf-8")
    line = re.search(r"^\s*classroom_models='([^']+)'$", script, re.MULTILINE)
    assert line and 'offered=${HEADSCOPE_ALLOWED_MODELS:-$(.venv/bin/python -c "$classroom_models")}' in script
    assert 'echo "  Models offered: ${offered};' in script
    printed = subprocess.run([sys.executable, "-c", line.group(1)], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == ", ".join(CLASSROOM_MODELS)
    # The docs' table of classroom defaults says the same.
    docs = (ROOT / "docs" / "classroom.md").read_text(encoding="utf-8")
    row = next(r for r in docs.splitlines() if r.startswith("| models that may load |"))
    assert row.rstrip(" |").endswith(f"`{','.join(CLASSROOM_MODELS)}`"), row


def test_the_student_poll_setting_takes_seconds_and_refuses_what_is_not(monkeypatch):
    """``HEADSCOPE_STUDENT_POLL_S``: seconds (the docs' table says 2 by default), at least 0.25; a value that is not a
    finite number keeps the default, as the server's log says."""
    from ui.settings import ServerSettings

    cases = {None: 2.0, "": 2.0, "5": 5.0, "0.5": 0.5, "0.01": 0.25, "-3": 0.25, "nan": 2.0, "inf": 2.0, "soon": 2.0}
    for given, expected in cases.items():
        if given is None:
            monkeypatch.delenv("HEADSCOPE_STUDENT_POLL_S", raising=False)
        else:
            monkeypatch.setenv("HEADSCOPE_STUDENT_POLL_S", given)
        assert ServerSettings.from_env().student_poll_s == expected, given
    docs = (ROOT / "docs" / "classroom.md").read_text(encoding="utf-8")
    row = next(r for r in docs.splitlines() if "`HEADSCOPE_STUDENT_POLL_S`" in r and r.startswith("|"))
    assert row.rstrip(" |").endswith("| 2"), row
