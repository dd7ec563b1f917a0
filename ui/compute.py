"""The one way the app runs a model: ``compute(operation)``, and the models it runs them on (``get_model``).

Every computation is an operation of the library (``mha_core.operations``: its ``key``, ``peak_bytes(model)``,
``work_class``, ``progress_label`` and ``run(model, progress)``). One server holds a class: models load once per
server; values live in one cache bounded in bytes (``ByteBudgetCache``) under their operation's key; at most a
few operations run at once (``ComputeGate``). An operation runs only in ``run_admitted``: its peak bytes held in
the budget and a compute slot taken first, both in its work class's share (heavy work has its own share and
queues, so light work never waits behind it), saying where it waits in its queue. Quick work runs in the script
run and stops at its next progress report once the session has gone away (``StopPoint``); work with a progress
label runs in a thread of the session's under a progress bar (``background``); the Lab's training slices go
through ``run_admitted`` from their own thread. What a page asks for is built in ``ui.computations``;
tests/test_compute_path.py checks on the syntax tree that no other code of the app starts a forward pass.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from mha_core.errors import HeadscopeError, ModelLoadError, quoted
from mha_core.models import DEFAULT_MODEL, load_model, sources
from mha_core.operations import Operation, WorkClass
from mha_core.progress import Progress, fraction
from ui import session
from ui.address import MAX_MODEL_CHARS
from ui.budget import HEAVY, ByteBudgetCache, ComputeGate, StopPoint, queue_message, runs_budget
from ui.escape import md_escape
from ui.i18n import language
from ui.jobs import BEAT_S, Job
from ui.settings import settings


# ---- what every session of this server shares ------------------------------------------------------
@dataclass
class _Shared:
    cache: ByteBudgetCache
    gate: ComputeGate
    profile_lock: threading.Lock


@functools.cache
def shared() -> _Shared:
    config = settings()
    return _Shared(
        ByteBudgetCache(runs_budget(config.cache_budget_bytes), shares={HEAVY.share: config.heavy_budget_bytes}),
        ComputeGate(config.max_concurrent_runs, shares={HEAVY.share: config.heavy_runs}),
        threading.Lock(),
    )


def reset_server_state() -> None:
    """Forget the settings and the shared caches (tests change the environment between apps)."""
    settings.cache_clear()
    shared.cache_clear()
    _models.cache_clear()
    _failed_loads.cache_clear()


# ---- the one path ---------------------------------------------------------------------------------------
class LatePlaceholder:
    """An ``st.empty()`` made at its first use, where the script is then: work that finds its value cached, or
    gets a compute slot at once, sends the browser no element (each one re-rendered delays the view)."""

    def __init__(self):
        self._slot = None

    def __call__(self):
        if self._slot is None:
            self._slot = st.empty()
        return self._slot

    def clear(self) -> None:
        if self._slot is not None:
            self._slot.empty()


def stop_point() -> StopPoint:
    """A check that ends this script run at its next call once the session has gone away or asked for another
    run: Streamlit raises its stop signal at any element update, here of an empty placeholder."""
    placeholder = LatePlaceholder()
    return StopPoint(lambda: placeholder().empty())


@contextlib.contextmanager
def admitted(
    work_class: WorkClass, nbytes: int, check=None, waiting: Callable[[str], None] | None = None, *, lang: str = "en"
):
    """Hold ``nbytes`` of the server's budget and a compute slot, both in ``work_class``'s share, for the ``with``
    block: first the memory, then the slot, each waiting in its class's queue (``waiting(message)`` says where, in
    ``lang``, whenever that changes; ``check()`` may raise to leave). More than the class may hold is refused
    (``OverBudget``). ``lang`` is the session's language captured in its script run: ``waiting`` may run in a
    job's thread, where the session is not known."""
    cache, gate = shared().cache, shared().gate

    def told(waiting_for: str):
        return None if waiting is None else lambda ahead: waiting(queue_message(work_class, ahead, waiting_for, lang))

    with (
        cache.reserve(nbytes, check=check, share=work_class.share, waiting=told("memory")),
        gate.slot(check=check, waiting=told("a compute slot"), share=work_class.share),
    ):
        yield


def run_admitted(
    operation: Operation, model, progress: Progress | None = None, check=None, waiting=None, *, lang: str = "en"
):
    """``operation.run(model, progress)`` inside ``admitted``, its ``peak_bytes(model)`` held in its ``work_class``'s
    share: the only place the app runs an operation. ``waiting("")`` once admitted (the notice goes); ``lang``: the
    notice's language (``admitted``)."""
    with admitted(operation.work_class, operation.peak_bytes(model), check=check, waiting=waiting, lang=lang):
        if waiting is not None:
            waiting("")
        return operation.run(model, progress)


class Stopped(Exception):
    """The visitor pressed Stop (``compute(..., stop=event)``): the work ends at its next progress report."""


def compute(operation: Operation, model=None, *, keep: bool = True, stoppable: bool = True, stop=None):
    """``operation``'s value, the only way the app computes one: from the server's cache under ``operation.key``
    (a second session asking for it waits for the first), else run once through ``run_admitted``.

    ``model``: what it runs on (None: the server's loaded model ``operation.model``). ``keep=False``: not kept in
    the cache (the caller's ``st.cache_data`` keeps it; a Lab's work, which changes the lab). Without a
    ``progress_label`` the work runs in this script run, stopping at its next progress report once the session
    has gone away (``stoppable=False``: never, for a download made outside a script run), a notice saying where
    it waits; with one, in a thread of the session's under a progress bar saying the same. ``stop``: a
    ``threading.Event`` whose setting ends the work at its next progress report (``Stopped``)."""
    model = model if model is not None else loaded(operation.model)
    label = operation.progress_label
    lang = language()  # known here, in the script run; the notices below may be made in a job's thread
    check = stop_point() if stoppable or label is not None else None
    notice = LatePlaceholder() if check is not None and label is None else None

    def show_waiting(message: str) -> None:
        notice().caption(md_escape(message)) if message else notice.clear()

    def stopping(progress):
        def report(done: float, total: float, message: str = "") -> None:
            if stop is not None and stop.is_set():
                raise Stopped
            if progress is not None:
                progress(done, total, message)

        return report

    def in_job(job: Job):
        return run_admitted(operation, model, stopping(job.progress), check=job.check, waiting=job.queued, lang=lang)

    def start():
        if label is not None:
            return background(operation.key, in_job, label)
        waiting = show_waiting if notice else None
        return run_admitted(operation, model, stopping(check), check=check, waiting=waiting, lang=lang)

    if not keep:
        return start()
    waiting = (lambda _: show_waiting(queue_message(operation.work_class, None, lang=lang))) if notice else None
    return shared().cache.get_or_compute(operation.key, start, check=check, waiting=waiting)


def ready(operation: Operation) -> bool:
    """True when ``operation``'s value is in the server's cache (showing it computes nothing)."""
    return operation.key in shared().cache


# ---- long work in threads of the session's own ----------------------------------------------------
def background(key: tuple, work, label: str):
    """``work(job)``'s value, computed in a thread of this session's (``ui.jobs.Job``) while this run waits
    and draws its progress. A run stopped meanwhile (its browser lost the connection, the visitor clicked
    something else) leaves the job going: the next run asking for ``key`` waits for the same job instead of
    starting over. While the page is away the job stops at its next progress report and waits; it computes
    again when the page comes back, and ends once the session is gone."""
    jobs = st.session_state.setdefault("_jobs", {})
    job = jobs.get(key)
    if job is None or job.status == "stopped":
        job = jobs[key] = Job(work, session.presence(), name=f"headscope-{key[0]}")
    bar = st.progress(job.fraction, text=md_escape(job.message) if job.message else label)
    try:
        while not job.wait(BEAT_S):
            text = md_escape(job.message) if job.message else label  # a library's message: names, tokens
            bar.progress(job.fraction, text=text)  # where Streamlit ends a run it stops
            session.presence().beat()
    finally:
        bar.empty()
    jobs.pop(key, None)
    return job.result()


# ---- models ----------------------------------------------------------------------------------
def report_progress(bar):
    """A library progress callback (``mha_core.progress``) drawn on a Streamlit progress bar."""

    def report(done: float, total: float, message: str = "") -> None:
        bar.progress(fraction(done, total), text=md_escape(message) if message else None)

    return report


def model_key(name: str) -> str:
    """One name per model however it is spelled (``MiniLM``, ``./m`` and ``m/`` for the same folder): the name the
    server loads it by, which is the loaded model's ``name`` and so its operations' ``model``."""
    key = sources.normalized_name(name)
    if key not in sources.EMBEDDED_MODELS and os.path.isdir(key):
        return os.path.realpath(key)
    return key


MAX_MODELS = 4  # models kept loaded in a server; the least recently used beyond that is dropped


@functools.cache
def _models() -> ByteBudgetCache:
    """The server's loaded models: the shared cache mechanism counting models instead of bytes."""
    return ByteBudgetCache(MAX_MODELS, size_of=lambda model: 1)


@functools.cache
def _failed_loads() -> dict:
    """Checkpoint folders that failed to load on this server: ``(key, downloads) -> (folder_state, message)``;
    a repaired one (its files changed) loads again."""
    return {}


def folder_state(key: str) -> tuple | None:
    """Name, size and modification time of each file of the model folder ``key``, or None for a name that
    is not a folder (an embedded model, a hub id)."""
    if key in sources.EMBEDDED_MODELS:
        return None
    try:
        with os.scandir(key) as entries:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file()))
    except OSError:  # no such folder (a hub id), or unreadable
        return None


def loaded(key: str):
    """The model named ``key`` (``model_key``), loaded once per server with a progress bar (the server's own
    cache: ``st.cache_resource`` would replay the bar's two elements on every rerun)."""
    downloads = settings().allow_downloads

    def load():
        files = folder_state(key)
        bar = st.progress(0.0, text=f"Loading {md_escape(key[:80])}...")
        try:
            return load_model(key, progress=report_progress(bar), download=downloads)
        except ModelLoadError as error:
            if files is not None:
                _failed_loads()[(key, downloads)] = (files, str(error))
            raise
        finally:
            bar.empty()

    return _models().get_or_compute((key, downloads), load)


def get_model(name: str):
    """The loaded model (cached for the whole server). Raises ``ModelLoadError`` for a model this server
    does not offer or cannot load; the check comes before the name touches the file system."""
    name = (name or "").strip()
    if not name:
        raise ModelLoadError("No model given: pick one in the sidebar.")
    if len(name) > MAX_MODEL_CHARS:
        raise ModelLoadError(f"No model has a name of {len(name):,} characters: pick one in the sidebar.")
    config = settings()
    if not sources.model_allowed(name, config.allowed_models):
        offered = ", ".join(config.allowed_models or ())
        raise ModelLoadError(f"This server does not offer the model {quoted(name)}. It offers: {offered}.")
    key = model_key(name)
    failed = _failed_loads().get((key, config.allow_downloads))
    if failed is not None and failed[0] == folder_state(key):
        raise ModelLoadError(failed[1])  # the folder is as it was when it failed: do not read it again
    try:
        return loaded(key)
    except HeadscopeError:
        raise
    except (OSError, ValueError, KeyError) as error:  # a loader that did not wrap its own error
        raise ModelLoadError(f"Cannot load model {quoted(name)} ({type(error).__name__}).") from error


def use_model(wanted: str) -> tuple[str, HeadscopeError | None]:
    """``(the model to show, why the wanted one failed or None)``: on failure the last model that loaded stays in
    use. Failures are remembered, so that reruns do not try the load again: a folder's by the server with the
    state of its files (a repaired folder loads again), any other name's (a hub id without a network) for the
    session."""
    failed = st.session_state.get("_failed_model")
    try:
        if failed and failed[0] == wanted:
            raise ModelLoadError(failed[1])
        get_model(wanted)
    except HeadscopeError as error:
        allowed = sources.model_allowed(wanted, settings().allowed_models)
        if not (allowed and folder_state(model_key(wanted)) is not None):
            st.session_state["_failed_model"] = (wanted, str(error))
        previous = st.session_state.get("_last_good_model") or (DEFAULT_MODEL if wanted != DEFAULT_MODEL else "")
        return previous, error
    st.session_state["_last_good_model"] = wanted
    return wanted, None
