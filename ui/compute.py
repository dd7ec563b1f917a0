"""The one way the app runs a model: ``compute``. Every forward pass a page starts goes through it, and
every function here that runs one hands its work to it (tests/test_compute_path.py checks this on the
syntax tree).

One server holds a class: models load once per server (``get_model``); runs and what is computed from
them live in one cache bounded in bytes (``ByteBudgetCache``); at most a few forward passes run at once
(``ComputeGate``); a run whose session has gone away or asked for something else stops at its next layer
(``StopPoint``). ``compute`` always reserves the work's estimated peak bytes in the budget
(``ui.budget``'s estimates) and always takes a compute slot before the work starts, both in the share of the
work's class, which every computation declares (``work_class=LIGHT`` or ``HEAVY``: heavy work has its own share and
queues, so light work never waits behind it; ``admitted``); long work runs in a thread of the session's with a
progress bar (``background``). A page never hands a model to ``mha_core``
itself: it asks for what it shows (``get_run``, ``neuron_view``, ``corpus_profile``, ...).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

import mha_core
from mha_core.analysis import syntax
from mha_core.corpus.coreference import load_coreference
from mha_core.corpus.reading import corpus_texts
from mha_core.errors import HeadscopeError, ModelLoadError, quoted
from mha_core.interventions import experiments, search
from mha_core.interventions.attribution import logit_attribution
from mha_core.interventions.importance import head_importance, pruning_curve
from mha_core.interventions.logit_lens import logit_lens
from mha_core.interventions.patching import patch
from mha_core.models import DEFAULT_MODEL, load_model, sources
from mha_core.models.long import long_run_bytes, run_long
from mha_core.progress import fraction
from ui import circuits, session
from ui.address import MAX_MODEL_CHARS
from ui.budget import (
    GRADIENT_PEAK_FACTOR,
    HEAVY,
    LIGHT,
    MB,
    RUN_PEAK_FACTOR,
    ByteBudgetCache,
    ComputeGate,
    OverBudget,
    StopPoint,
    WorkClass,
    batch_peak_bytes,
    layer_inputs_bytes,
    pass_peak_bytes,
    queue_message,
    run_peak_bytes,
    runs_budget,
)
from ui.escape import md_escape
from ui.jobs import BEAT_S, Job
from ui.settings import lab_slots, settings


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
    lab_slots.cache_clear()
    _models.cache_clear()
    _failed_loads.cache_clear()


# ---- the one path ---------------------------------------------------------------------------------------
class LatePlaceholder:
    """An ``st.empty()`` made at its first use (``placeholder()``), where the script is then: work that finds
    its value cached, or gets a compute slot at once, sends the browser no element (each element the browser
    re-renders delays the view it waits for)."""

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
    """A check that ends this script run at its next call once the session has gone away or asked for
    another run: Streamlit raises its stop signal at any element update, here of an empty placeholder
    (made at the first check, ``POLL_S`` into a computation)."""
    placeholder = LatePlaceholder()
    return StopPoint(lambda: placeholder().empty())


Work = Callable[[Any, Any], Any]  # work(model, progress) -> value


@contextlib.contextmanager
def admitted(
    work_class: WorkClass,
    nbytes: int,
    check: Callable[[], None] | None = None,
    waiting: Callable[[str], None] | None = None,
):
    """Hold ``nbytes`` of the server's budget and a compute slot, both in ``work_class``'s share, for the ``with``
    block: first the memory, then the slot, each waiting in its class's queue (``waiting(message)`` says where,
    whenever that changes; ``check()`` may raise to leave). More than the class may hold is refused
    (``OverBudget``)."""
    cache, gate = shared().cache, shared().gate

    def told(waiting_for: str):
        return None if waiting is None else lambda ahead: waiting(queue_message(work_class, ahead, waiting_for))

    with (
        cache.reserve(nbytes, check=check, share=work_class.share, waiting=told("memory")),
        gate.slot(check=check, waiting=told("a compute slot"), share=work_class.share),
    ):
        yield


def compute(
    key: tuple | None,
    work: Work,
    *,
    model,
    reserve_bytes: int | Callable[[], int],
    work_class: WorkClass,
    progress_label: str | None = None,
    keep: bool = True,
    stoppable: bool = True,
):
    """``work(model, progress)``'s value, the only way the app runs a model: ``reserve_bytes`` (its estimated
    peak memory, or a callable giving it, asked only when the work is to run) are held in the server's budget
    and a compute slot is taken before the work starts, both in the share of its ``work_class`` (``LIGHT`` or
    ``HEAVY``, declared by every computation) and released when it ends (``admitted``).

    ``key`` names the work: its value is kept in the server's byte-budgeted cache under it (``keep=False``:
    not kept there, e.g. the caller's ``st.cache_data`` keeps it; ``key=None``: neither), and a second session
    asking for it waits for the first. Without ``progress_label`` the work runs in this script run, stopping
    at its next ``progress`` call once the session has gone away (``stoppable=False``: never, for a download
    made outside a script run; ``progress`` is then None); while it waits a notice says where it is in its
    queue. With ``progress_label`` it runs in a thread of the session's (``background``) under a progress bar
    with that label, which says the same while it waits.
    """
    cache = shared().cache
    check = stop_point() if stoppable or progress_label is not None else None

    def peak() -> int:
        return int(reserve_bytes()) if callable(reserve_bytes) else int(reserve_bytes)

    if progress_label is not None:
        if key is None:
            raise ValueError("work in the background needs a key: its job is found again by it")

        def in_job(job: Job):
            with admitted(work_class, peak(), check=job.check, waiting=job.queued):
                job.queued("")  # admitted: the bar shows the work's own progress, or its label
                return work(model, job.progress)

        def start():
            return background(key, in_job, progress_label)

        notice = None
    else:
        notice = LatePlaceholder() if check is not None else None

        def start():
            with admitted(work_class, peak(), check=check, waiting=show_waiting if notice else None):
                if notice is not None:
                    notice.clear()
                return work(model, check)

    def show_waiting(message: str) -> None:
        notice().caption(md_escape(message))

    if key is None or not keep:
        return start()
    return cache.get_or_compute(
        key, start, check=check, waiting=(lambda _: show_waiting(queue_message(work_class, None))) if notice else None
    )


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


def _cache_key(name: str) -> str:
    """One key per model however it is spelled (``MiniLM``, ``./m`` and ``m/`` for the same folder)."""
    key = sources.normalized_name(name)
    if key not in sources.EMBEDDED_MODELS and os.path.isdir(key):
        return os.path.realpath(key)
    return key


MAX_MODELS = 4  # models kept loaded in a server; the least recently used beyond that is dropped


@functools.cache
def _models() -> ByteBudgetCache:
    """The server's loaded models: the shared cache mechanism counting models instead of bytes (one load per
    model at a time, least recently used dropped beyond ``MAX_MODELS``)."""
    return ByteBudgetCache(MAX_MODELS, size_of=lambda model: 1)


@functools.cache
def _failed_loads() -> dict:
    """Checkpoint folders that failed to load on this server: ``(key, downloads) -> (folder_state, message)``.
    Every rerun of every session would otherwise read a damaged folder again; a repaired one (its files
    changed) loads again."""
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


def _load_model_cached(key: str, allow_downloads: bool):
    """The model for ``key``, loaded once per server with a progress bar.

    The server's own cache, not ``st.cache_resource``: that replays on every hit the elements its function
    drew on the miss (the bar and its removal), so every rerun sent the browser two elements more for each
    model lookup (five lookups in an Explore rerun), each re-rendered before the view."""

    def load():
        files = folder_state(key)
        bar = st.progress(0.0, text=f"Loading {md_escape(key[:80])}...")
        try:
            return load_model(key, progress=report_progress(bar), download=allow_downloads)
        except ModelLoadError as error:
            if files is not None:
                _failed_loads()[(key, allow_downloads)] = (files, str(error))
            raise
        finally:
            bar.empty()

    return _models().get_or_compute((key, allow_downloads), load)


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
    key = _cache_key(name)
    failed = _failed_loads().get((key, config.allow_downloads))
    if failed is not None and failed[0] == folder_state(key):
        raise ModelLoadError(failed[1])  # the folder is as it was when it failed: do not read it again
    try:
        return _load_model_cached(key, config.allow_downloads)
    except HeadscopeError:
        raise
    except (OSError, ValueError, KeyError) as error:  # a loader that did not wrap its own error
        raise ModelLoadError(f"Cannot load model {quoted(name)} ({type(error).__name__}).") from error


def use_model(wanted: str) -> tuple[str, HeadscopeError | None]:
    """``(the model to show, why the wanted one failed or None)``: on failure the last model that
    loaded stays in use. Failures are remembered, so that reruns do not try the load again: a folder's by
    the server with the state of its files (``get_model``: a repaired folder loads again), any other
    name's (a hub id without a network) for the session."""
    failed = st.session_state.get("_failed_model")
    try:
        if failed and failed[0] == wanted:
            raise ModelLoadError(failed[1])
        get_model(wanted)
    except HeadscopeError as error:
        allowed = sources.model_allowed(wanted, settings().allowed_models)
        if not (allowed and folder_state(_cache_key(wanted)) is not None):
            st.session_state["_failed_model"] = (wanted, str(error))
        previous = st.session_state.get("_last_good_model") or (DEFAULT_MODEL if wanted != DEFAULT_MODEL else "")
        return previous, error
    st.session_state["_last_good_model"] = wanted
    return wanted, None


# ---- runs and what is computed from them ---------------------------------------------------------
def _run_work(key: tuple, text: str, text_pair: str | None, engine: str, bos: bool) -> Work:
    def forward(model, progress):
        run = model.run(text, text_pair=text_pair, engine=engine, progress=progress, bos=bos)
        run.metadata["cache_key"] = key  # what is computed from this run is cached under it too
        return run

    return forward


def get_run(model_name: str, engine: str, text: str, text_pair: str | None = None, bos: bool | None = None):
    """The ``AttentionRun`` for these inputs: from the shared cache, or computed in a compute slot,
    layer by layer, stopping if this session goes away."""
    model = get_model(model_name)
    if getattr(model, "is_encoder_decoder", False):
        raise HeadscopeError(
            f"{quoted(model_name)} is an encoder-decoder model: Explore and Compare show its encoder, decoder and "
            "cross-attention; this page reads encoder-only and decoder-only models."
        )
    bos = model.default_bos if bos is None else bool(bos)
    text_pair = text_pair or None
    key = ("run", _cache_key(model_name), engine, text, text_pair, bos)
    return compute(
        key,
        _run_work(key, text, text_pair, engine, bos),
        model=model,
        work_class=LIGHT,
        reserve_bytes=lambda: run_peak_bytes(model, text, text_pair, bos),
    )


def get_seq2seq_run(model_name: str, engine: str, source: str, target: str | None, *, stoppable: bool = True):
    """An encoder-decoder model's ``Seq2SeqRun`` (``target`` None: the model writes it), from the shared cache
    or computed in a compute slot, stopping if this session goes away (``stoppable=False``: never, for a download
    made outside a script run), with its peak memory reserved first."""
    model = get_model(model_name)
    return compute(
        ("seq2seq-run", _cache_key(model_name), engine, source, target),
        lambda model, progress: model.run(source, target, engine=engine, progress=progress),
        model=model,
        work_class=LIGHT,
        reserve_bytes=lambda: int(RUN_PEAK_FACTOR * model.attention_bytes(source, target)),
        stoppable=stoppable,
    )


def _long_run_key(model_name: str, text: str, token_ids: Sequence[int] | None, bos: bool) -> tuple:
    what = f"bos:{int(bos)}:{text}" if token_ids is None else "ids:" + ",".join(str(int(i)) for i in token_ids)
    return ("long-run", _cache_key(model_name), hashlib.sha1(what.encode("utf-8")).hexdigest())


def long_run_ready(model_name: str, text: str, token_ids: Sequence[int] | None = None, bos: bool | None = None) -> bool:
    """True when ``long_run``'s value for these inputs is in the server's cache (showing it computes nothing)."""
    bos = get_model(model_name).default_bos if bos is None else bool(bos)
    return _long_run_key(model_name, text, token_ids, bos) in shared().cache


def longest_long_run(model) -> int:
    """The most tokens of ``model`` whose long run (``long_run_bytes``) fits in what this server gives heavy work
    (0: not even one)."""
    limit = shared().cache.limit(HEAVY.share)
    low, high = 0, int(model.context_length)
    while low < high:  # the bytes grow with the tokens
        middle = (low + high + 1) // 2
        low, high = (middle, high) if long_run_bytes(model, middle) <= limit else (low, middle - 1)
    return low


def check_long_run_fits(model, num_tokens: int) -> None:
    """A clear refusal (``OverBudget``) for a long run larger than heavy work's share of the budget: never run
    alone over it."""
    nbytes, limit = long_run_bytes(model, num_tokens), shared().cache.limit(HEAVY.share)
    if nbytes > limit:
        longest = longest_long_run(model)
        raise OverBudget(
            nbytes,
            limit,
            HEAVY.share,
            f"Every head of {num_tokens:,} tokens of {model.name} needs about {nbytes / MB:,.0f} MB at its peak, "
            f"more than the {limit / MB:,.0f} MB this server gives heavy work (long documents, tests, profiles, "
            "training), so it does not run here. "
            + (f"At most {longest:,} tokens fit: choose fewer tokens or a shorter document." if longest else ""),
        )


class LongRunStopped(Exception):
    """The visitor pressed Stop: a long run ends at its next block."""


def long_run(
    model_name: str,
    text: str,
    stop: threading.Event,
    token_ids: Sequence[int] | None = None,
    bos: bool | None = None,
):
    """The ``LongRun`` of ``text`` (``mha_core.models.long.run_long``), up to the model's context length, tokenized
    as the page's sentence is (``bos``: begin with the BOS token; None: the model's default), or of ``token_ids``
    taken as they are (a needle-in-a-haystack prompt): in a job of the session's with a progress bar that says how
    long is left, its real bytes (``long_run_bytes``) reserved first; ``stop`` set ends it at its next block
    (``LongRunStopped``)."""
    model = get_model(model_name)
    ids = None if token_ids is None else [int(i) for i in token_ids]
    bos = model.default_bos if bos is None else bool(bos)
    encoded = model.encode_long(text, bos) if ids is None else model.encode_long_ids(ids)
    num_tokens = len(encoded.input_ids)
    check_long_run_fits(model, num_tokens)

    def work(model, progress):
        started = time.monotonic()

        def timed(done: float, total: float, message: str = "") -> None:
            if stop.is_set():
                raise LongRunStopped
            part = fraction(done, total)
            left = (time.monotonic() - started) * (1 - part) / part if part > 0.01 else None
            when = f", about {left:.0f} s left" if left is not None else ""
            progress(done, total, f"Every head of {num_tokens:,} tokens: {message}{when}")

        if ids is None:
            return run_long(model, text, progress=timed, bos=bos)
        return run_long(model, token_ids=ids, progress=timed)

    return compute(
        _long_run_key(model_name, text, ids, bos),
        work,
        model=model,
        work_class=HEAVY,
        reserve_bytes=long_run_bytes(model, num_tokens),
        progress_label=f"Every head of {num_tokens:,} tokens...",
    )


def derived_key(run, what: str) -> tuple | None:
    """The cache key of ``what`` computed from ``run`` (dropped with it under memory pressure), or None for a
    run that did not come from ``get_run``. A word-level or special-free view keeps its run's key; its shape
    is part of the key."""
    key = run.metadata.get("cache_key")
    if key is None:
        return None
    return (what, run.level, bool(run.metadata.get("special_tokens_removed")), *key)


def computed_from(run, what: str, make, reserve_bytes: int = 0):
    """``make()`` (a measurement or view of ``run`` that runs no model) cached with ``run``; uncached for a
    run that did not come from ``get_run``. ``reserve_bytes``: its peak memory, held in the budget while it
    runs."""
    key = derived_key(run, what)
    if key is None:
        with shared().cache.reserve(reserve_bytes):
            return make()
    return shared().cache.get_or_compute(key, make, reserve_bytes=reserve_bytes)


def run_with_norms(run):
    """``run`` again with norm-based attention (``model.run(..., norms=True)``), cached with it."""

    def forward(model, progress):
        return model.run(
            run.text,
            text_pair=run.text_pair,
            engine=run.engine,
            bos=run.metadata.get("bos"),
            norms=True,
            progress=progress,
        )

    return compute(
        derived_key(run, "norms"),
        forward,
        model=get_model(run.model_name),
        work_class=LIGHT,
        reserve_bytes=2 * int(RUN_PEAK_FACTOR * run.attentions.nbytes),
    )


def _hidden_width(model) -> int:
    return int(model.hf_model.config.hidden_size)


def neuron_view(run, layer: int, head: int, query: int):
    """``mha_core.neuron_view`` of head (``layer``, ``head``) for token ``query`` of ``run``, cached with it."""
    token_ids = run.metadata["token_ids"]
    model = get_model(run.model_name)
    n = len(token_ids)
    return compute(
        derived_key(run, f"neuron-{layer}-{head}-{query}"),
        lambda model, progress: mha_core.neuron_view(model, token_ids, layer, head, query, engine=run.engine),
        model=model,
        work_class=LIGHT,
        reserve_bytes=lambda: (
            pass_peak_bytes(model.num_layers, model.num_heads, n)
            + layer_inputs_bytes(model.num_layers, n, _hidden_width(model))
        ),
    )


SEARCH_BATCH = 16  # sentences per forward pass when a corpus is indexed


def search_vector(run, query: int, layer: int, head: int, kind: str):
    """The search vector of token ``query`` of ``run`` (``mha_core.interventions.search.query_vector``)."""
    token_ids = run.metadata["token_ids"]
    model = get_model(run.model_name)
    return compute(
        derived_key(run, f"search-{kind}-{layer}-{head}-{query}"),
        lambda model, progress: search.query_vector(model, token_ids, query, layer, head, kind=kind),
        model=model,
        work_class=LIGHT,
        reserve_bytes=lambda: pass_peak_bytes(model.num_layers, model.num_heads, len(token_ids)),
    )


def _index_key(model_name: str, layer: int, head: int, kind: str, max_sentences: int) -> tuple:
    head = head if kind == "attention" else 0  # a representation belongs to the layer, not to a head
    return ("search-index", _cache_key(model_name), layer, head, kind, max_sentences)


def corpus_index_ready(model_name: str, layer: int, head: int, kind: str, max_sentences: int) -> bool:
    """True when ``corpus_index``'s value for these inputs is in the server's cache."""
    return _index_key(model_name, layer, head, kind, max_sentences) in shared().cache


def corpus_index(model_name: str, layer: int, head: int, kind: str, max_sentences: int):
    """``mha_core.interventions.search`` index of the first ``max_sentences`` UD English EWT dev sentences,
    built once per (model, layer, head, kind) with a progress bar, and kept in the shared cache."""
    model = get_model(model_name)
    head = head if kind == "attention" else 0  # a representation belongs to the layer, not to a head
    sentences = [sentence.words for sentence in syntax.ud_ewt_dev(max_sentences)]

    def index(model, progress):
        return search.build_corpus_index(
            model, sentences, layer, head, kind, batch_size=SEARCH_BATCH, progress=progress
        )

    return compute(
        _index_key(model_name, layer, head, kind, max_sentences),
        index,
        model=model,
        work_class=HEAVY,
        reserve_bytes=lambda: batch_peak_bytes(model, sentences, SEARCH_BATCH),
        progress_label="Indexing the UD dev sentences...",
    )


def deferred(view, make):
    """A zero-argument callable for ``st.download_button(data=...)`` that returns ``make(view)`` when clicked,
    without holding ``view``: Streamlit keeps a session's download callables as long as the session, and a
    callable holding a 283 MB run would keep it out of the budget's reach. The run is held weakly; once it
    has left memory, a click gets it back through the shared cache (the same key, so a cached copy is used,
    or the forward pass is made again) and reshapes it as ``view`` was (word level, without special tokens)."""
    held = weakref.ref(view)
    key = view.metadata.get("cache_key")
    words = view.level == "word"
    without_special = bool(view.metadata.get("special_tokens_removed"))
    if key is None or key[0] != "run":  # not from get_run: nothing to get it back from, so keep it
        return lambda: make(view)

    def data():
        current = held()
        if current is None:
            _, model_key, engine, text, text_pair, bos = key
            model = _load_model_cached(model_key, settings().allow_downloads)
            current = compute(
                key,
                _run_work(key, text, text_pair, engine, bos),
                model=model,
                work_class=LIGHT,
                reserve_bytes=lambda: run_peak_bytes(model, text, text_pair, bos),
                stoppable=False,  # a download is made outside the page's script run
            )
            current = current.to_words() if words else current
            current = current.without_special() if without_special else current
        return make(current)

    return data


def metrics_for(run):
    """``mha_core.head_metrics(run)``: one row per layer and head, cached with the run it came from."""
    return computed_from(run, "metrics", lambda: mha_core.head_metrics(run))


# Head distances cost (head pairs) x n^2; past this many tokens they average over this many query rows.
DISTANCE_MAX_QUERIES = 128


def sentence_analysis(model_name: str, run):
    """(metrics, semantic scores, head distances) of one run, for the Roles page."""

    def analyse():
        semantic = None
        token_ids = run.metadata.get("token_ids")
        if token_ids is not None:  # the input embeddings are a table look-up, not a forward pass
            semantic = mha_core.semantic_scores(run, get_model(model_name).input_embeddings(token_ids))
        return semantic, mha_core.head_distances(run, max_queries=DISTANCE_MAX_QUERIES)

    semantic, distances = computed_from(run, "roles-analysis", analyse)
    return metrics_for(run), semantic, distances


PROFILE_BATCH = 16  # sentences per forward pass of a corpus profile


@st.cache_data(show_spinner=False, max_entries=8)
def corpus_profile(model_name: str, max_sentences: int):
    """(metrics, dependency, coreference) over the first ``max_sentences`` UD EWT dev sentences."""
    model = get_model(model_name)
    sentences = syntax.ud_ewt_dev(max_sentences=max_sentences)

    def measure(model, progress):
        result = mha_core.profile(model, sentences, batch_size=PROFILE_BATCH, progress=progress)
        return result.metrics, result.dependency, mha_core.coreference_scores(model, batch_size=PROFILE_BATCH)

    def peak() -> int:
        items = [sentence.words for sentence in sentences] + [item["words"] for item in load_coreference()]
        return batch_peak_bytes(model, items, PROFILE_BATCH)

    return compute(
        ("corpus-profile", _cache_key(model_name), max_sentences),
        measure,
        model=model,
        work_class=HEAVY,
        reserve_bytes=peak,
        progress_label=f"Profiling {len(sentences)} sentences...",
        keep=False,  # st.cache_data keeps it
    )


# ``mha_core.decoder_head_scores``' repeated random tokens: BOS + 20 tokens + the same 20, one sequence a pass.
DECODER_SCORE_TOKENS = 41


@st.cache_data(show_spinner=False, max_entries=8)
def decoder_scores(model_name: str):
    """Previous-token, duplicate, induction and prefix-matching scores on repeated random tokens."""
    model = get_model(model_name)
    return compute(
        ("decoder-scores", _cache_key(model_name)),
        lambda model, progress: mha_core.decoder_head_scores(model),
        model=model,
        work_class=LIGHT,
        reserve_bytes=pass_peak_bytes(model.num_layers, model.num_heads, DECODER_SCORE_TOKENS),
        keep=False,  # st.cache_data keeps it
    )


@st.cache_data(show_spinner=False)
def saturation_table(n_keys: int = 16):
    """``mha_core.softmax_saturation``: the same curve for every visitor."""
    return mha_core.softmax_saturation(n_keys=n_keys)


# ---- causal evidence (the Ablate page, the Roles page's causal column) -----------------------------------
def get_ablated_run(
    model_name: str,
    engine: str,
    text: str,
    text_pair: str | None,
    bos: bool | None,
    heads: tuple[tuple[int, int], ...],
    ablation: str,
):
    """The run with ``heads`` ablated (``mha_core.interventions``), with its losses, cached like ``get_run``
    (``heads=()``: the unablated run with its losses)."""
    model = get_model(model_name)
    bos = model.default_bos if bos is None else bool(bos)
    text_pair = text_pair or None

    def forward(model, progress):
        return model.run(
            text,
            text_pair=text_pair,
            engine=engine,
            bos=bos,
            ablate=list(heads),
            ablation=ablation,
            losses=True,
            progress=progress,
        )

    return compute(
        ("ablated-run", _cache_key(model_name), engine, text, text_pair, bos, tuple(heads), ablation),
        forward,
        model=model,
        work_class=LIGHT,
        reserve_bytes=lambda: run_peak_bytes(model, text, text_pair, bos),
    )


# ``mha_core.induction_experiment``'s sequences: BOS + 50 random tokens + the same 50, 8 to a pass.
INDUCTION_TOKENS, INDUCTION_BATCH = 101, 8


@st.cache_data(show_spinner=False, max_entries=8)
def induction_table(model_name: str, top_k: int, draws: int, role: str, ablation: str):
    """``mha_core.induction_experiment``: top-k heads of a role vs k random heads on repeated random tokens."""
    scores = decoder_scores(model_name)
    model = get_model(model_name)

    def experiment(model, progress):
        return experiments.induction_experiment(
            model,
            top_k=top_k,
            random_draws=draws,
            role=role,
            scores=scores,
            ablation=ablation,
            batch=INDUCTION_BATCH,
            progress=progress,
        )

    return compute(
        ("induction", _cache_key(model_name), top_k, draws, role, ablation),
        experiment,
        model=model,
        work_class=HEAVY,
        reserve_bytes=pass_peak_bytes(model.num_layers, model.num_heads, INDUCTION_TOKENS, batch=INDUCTION_BATCH),
        progress_label="Running the experiment...",
        keep=False,  # st.cache_data keeps it
    )


IMPORTANCE_BATCH = 8  # texts per pass of head importance (``mha_core.head_importance``'s default)


@st.cache_data(show_spinner=False, max_entries=8)
def importance_and_pruning(model_name: str, sentences: int, method: str, seeds: int, steps: int):
    """(importance, pruning curves: importance order and ``seeds`` random orders) over UD EWT dev sentences."""
    model = get_model(model_name)
    texts = corpus_texts(syntax.ud_ewt_dev(sentences))

    def measure(model, progress):
        importance = head_importance(model, texts, method=method, progress=progress, batch_size=IMPORTANCE_BATCH)
        curves = pd.concat(
            [
                pruning_curve(
                    model,
                    texts,
                    order,
                    importance=importance,
                    steps=steps,
                    seeds=tuple(range(seeds)),
                    progress=progress,
                )
                for order in ("importance", "random")
            ],
            ignore_index=True,
        )
        return importance, curves

    return compute(
        ("importance", _cache_key(model_name), sentences, method, seeds, steps),
        measure,
        model=model,
        work_class=HEAVY,
        reserve_bytes=lambda: batch_peak_bytes(model, texts, IMPORTANCE_BATCH, factor=GRADIENT_PEAK_FACTOR),
        progress_label=f"Head importance over {len(texts)} sentences...",
        keep=False,  # st.cache_data keeps it
    )


def role_ablation(model_name: str, run, primary):
    """For each role group of ``primary`` (``mha_core.primary_roles``): what ablating all its heads does to
    this sentence (``mha_core.interventions.experiments.role_group_ablation``), cached with the run."""
    model = get_model(model_name)
    groups = hash(tuple(map(tuple, primary[["layer", "head", "group"]].astype(str).to_numpy())))
    return compute(
        derived_key(run, f"role-ablation-{groups}"),
        lambda model, progress: experiments.role_group_ablation(model, run.text, primary),
        model=model,
        work_class=LIGHT,
        # one ablated pass at a time, with its losses
        reserve_bytes=lambda: run_peak_bytes(model, run.text, None, model.default_bos),
    )


# ---- the Lab ---------------------------------------------------------------------------------------------
def lab_admission(config):
    """What one slice of a Lab training (``ui.lab_runner.LabRunner``'s ``admit``) holds: heavy work's share of
    the budget (``LabConfig.training_bytes``, a training step's peak) and of the compute slots."""
    return lambda check, waiting: admitted(HEAVY, config.training_bytes(), check=check, waiting=waiting)


# ---- the Lab's trained model in Explore ----------------------------------------------------------
def open_lab_in_explore(lab) -> None:
    """Explore shows this session's lab model (``mha_core.Lab``) on its fixed example, until
    ``session.close_lab_run``."""
    config = lab.config
    tokens = len(lab.example_tokens(0))
    session.set_lab_run(
        compute(
            None,
            lambda model, progress: model.run(0),
            model=lab,
            work_class=LIGHT,
            reserve_bytes=pass_peak_bytes(config.num_layers, config.num_heads, tokens),
        )
    )


# ---- the Circuits page: logit attribution, patching, the logit lens (mha_core.interventions) --------------------
def circuit_attribution(model_name: str, text: str, answer: str, foil: str):
    """``mha_core.logit_attribution`` at the last position, cached."""
    model = get_model(model_name)
    tokens = circuits.check_prompt(model, text, "clean prompt")
    return compute(
        ("circuits-attribution", _cache_key(model_name), text, answer, foil),
        lambda model, progress: logit_attribution(model, text, answer, foil, progress=progress),
        model=model,
        work_class=LIGHT,
        reserve_bytes=circuits.attribution_bytes(model, tokens),
    )


def _patching_key(model_name: str, clean: str, corrupted: str, answer: str, foil: str, *, method: str) -> tuple:
    return ("circuits-patching", _cache_key(model_name), clean, corrupted, answer, foil, method)


def circuit_patching_ready(model_name: str, clean: str, corrupted: str, answer: str, foil: str, *, method: str) -> bool:
    """True when ``circuit_patching``'s value for these inputs is in the server's cache."""
    return _patching_key(model_name, clean, corrupted, answer, foil, method=method) in shared().cache


def circuit_patching(model_name: str, clean: str, corrupted: str, answer: str, foil: str, method: str):
    """``mha_core.patch`` over heads (exact, or attribution with the exact scores of its top heads), cached."""
    model = get_model(model_name)
    tokens = circuits.check_prompt(model, clean, "clean prompt")
    circuits.check_prompt(model, corrupted, "corrupted prompt")

    def work(model, progress):
        return patch(
            model,
            clean,
            corrupted,
            answer,
            foil,
            over="heads",
            method=method,
            exact_top=circuits.EXACT_TOP,
            progress=progress,
        )

    return compute(
        _patching_key(model_name, clean, corrupted, answer, foil, method=method),
        work,
        model=model,
        work_class=HEAVY,
        reserve_bytes=circuits.patching_bytes(model, tokens, method),
    )


def circuit_lens(model_name: str, text: str, k: int = circuits.LENS_TOP_K):
    """``mha_core.logit_lens`` of the prompt, cached."""
    model = get_model(model_name)
    tokens = circuits.check_prompt(model, text, "clean prompt")
    return compute(
        ("circuits-lens", _cache_key(model_name), text, k),
        lambda model, progress: logit_lens(model, text, k=k, progress=progress),
        model=model,
        work_class=LIGHT,
        reserve_bytes=circuits.lens_bytes(model, tokens),
    )
