"""App state: server settings, URL query parameters, the session's selection, cached models and runs.

The only UI code that loads a model or runs one. Everything a view depends on lives in the URL
(model, engine, text, pair, layer, head, page), so a link reproduces the view; every parameter of a
link is checked when a session starts, and what was wrong with it is kept for the page to say
(``link_notice``). Drawing is left to ``ui.widgets``.

One server holds a class: models load once per server (``_load_model_cached``); runs and what is
computed from them live in one cache bounded in bytes (``ui.budget.ByteBudgetCache``); at most a
few forward passes run at once (``ui.budget.ComputeGate``); a run whose session has gone away or
asked for something else stops at its next layer (``ui.budget.StopPoint``). The settings come from
environment variables, read once (``ServerSettings``, docs/classroom.md).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from mha_core.analysis import metrics, syntax
from mha_core.corpus.reading import corpus_texts
from mha_core.errors import HeadscopeError, ModelLoadError, quoted
from mha_core.interventions import experiments, search
from mha_core.interventions.importance import head_importance, pruning_curve
from mha_core.models import DEFAULT_MODEL, ENGINES, sources
from mha_core.models.tokens import visible_text
from ui import address
from ui.budget import (
    RUN_PEAK_FACTOR,
    ByteBudgetCache,
    ComputeGate,
    StopPoint,
    attention_bytes,
    runs_budget,
    tune_allocator,
)
from ui.jobs import BEAT_S, Job, Presence

LOG = logging.getLogger("headscope.app")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_PATH = ROOT / "assets" / "examples.json"

# The sidebar's names for the embedded models; other allowed models are listed by their own name.
MODEL_CHOICES = {
    "minilm": "all-MiniLM-L6-v2 (embedded encoder, 6 x 12 heads)",
    "smollm2": "SmolLM2-135M (embedded decoder, 30 x 9 heads)",
    "mpnet": "all-mpnet-base-v2 (embedded encoder, 12 x 12 heads)",
}
OTHER_MODEL = "other"
ENGINE_LABELS = {"transformers": "transformers", "core": "From-scratch core"}
DEFAULT_TEXT = "The cat sat on the mat because it was tired."
MAX_TEXT_CHARS = 4000  # the model truncates to its own token limit; this only bounds what a URL can carry
MAX_MODEL_CHARS = 200  # longer than any hub id or sensible folder
# A corpus profile's default size from the Roles page, and a class server's cap: the syntactic roles are tested
# on the held-out half of the sentences, and below about 200 sentences no head passes (MiniLM: 0 at 100, 4 heads
# at 400, 6 at the whole split of 2002); 400 take about 6 s for MiniLM and 25 s for SmolLM2 on 2 cores.
PROFILE_SENTENCES = 400


# ---- server settings --------------------------------------------------------------------------------
def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None or not value.strip() else value.strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    try:
        return max(minimum, int(os.environ.get(name, default)))
    except ValueError:
        LOG.warning("ignoring %s=%r: not a whole number", name, os.environ.get(name))
        return default


@dataclass(frozen=True)
class ServerSettings:
    """How this server behaves; from environment variables (docs/classroom.md), read once per process.

    classroom             HEADSCOPE_CLASSROOM=1: the safe defaults below for a shared server
    allowed_models        HEADSCOPE_ALLOWED_MODELS: comma-separated names, hub ids, folders; "*" = any
                          (default: any; in classroom mode ``sources.CLASSROOM_MODELS``: minilm, smollm2)
    allow_downloads       HEADSCOPE_ALLOW_DOWNLOADS: may a hub id be fetched from the hub (default: yes; not in class)
    cache_budget_bytes    HEADSCOPE_CACHE_BUDGET_MB: the server's memory above its loaded models (default 2048 MB):
                          7/8 for runs and their measurements (cached, being computed, being drawn), 1/8 for
                          the rest (``ui.budget.runs_budget``)
    max_concurrent_runs   HEADSCOPE_MAX_CONCURRENT_RUNS: forward passes at once (default: the number of CPUs)
    torch_threads         HEADSCOPE_TORCH_THREADS: torch threads per forward pass (default 1)
    max_profile_sentences HEADSCOPE_MAX_PROFILE_SENTENCES: corpus profile size from the Roles page
                          (default 2002, the whole UD dev split; PROFILE_SENTENCES in classroom mode)
    class_link            HEADSCOPE_PUBLIC_URL: the link students open (scripts/app.sh --classroom sets it)
    """

    classroom: bool = False
    allowed_models: tuple[str, ...] | None = None
    allow_downloads: bool = True
    cache_budget_bytes: int = 2048 << 20
    max_concurrent_runs: int = 2
    torch_threads: int = 1
    max_profile_sentences: int = 2002
    class_link: str | None = None

    @classmethod
    def from_env(cls) -> ServerSettings:
        classroom = _env_flag("HEADSCOPE_CLASSROOM", False)
        allowed = sources.parse_allowlist(
            os.environ.get("HEADSCOPE_ALLOWED_MODELS", ",".join(sources.CLASSROOM_MODELS) if classroom else "*")
        )
        return cls(
            classroom=classroom,
            allowed_models=allowed,
            allow_downloads=_env_flag("HEADSCOPE_ALLOW_DOWNLOADS", not classroom),
            cache_budget_bytes=_env_int("HEADSCOPE_CACHE_BUDGET_MB", 2048) << 20,
            max_concurrent_runs=_env_int("HEADSCOPE_MAX_CONCURRENT_RUNS", os.cpu_count() or 2),
            torch_threads=_env_int("HEADSCOPE_TORCH_THREADS", 1),
            max_profile_sentences=_env_int(
                "HEADSCOPE_MAX_PROFILE_SENTENCES", PROFILE_SENTENCES if classroom else 2002, 10
            ),
            class_link=os.environ.get("HEADSCOPE_PUBLIC_URL") or None,
        )


@functools.cache
def settings() -> ServerSettings:
    return ServerSettings.from_env()


@dataclass
class _Shared:
    """What every session of this server shares."""

    cache: ByteBudgetCache
    gate: ComputeGate
    profile_lock: threading.Lock


@functools.cache
def shared() -> _Shared:
    config = settings()
    return _Shared(
        ByteBudgetCache(runs_budget(config.cache_budget_bytes)),
        ComputeGate(config.max_concurrent_runs),
        threading.Lock(),
    )


@functools.cache
def lab_slots():
    """How many Lab trainings may run at once on this server: HEADSCOPE_MAX_LAB_TRAININGS (default 2)."""
    from ui.lab_runner import TrainingSlots

    return TrainingSlots(_env_int("HEADSCOPE_MAX_LAB_TRAININGS", 2))


# ---- the Lab's trained model in Explore ----------------------------------------------------------
_LAB_RUN = "_lab_run"


def open_lab_in_explore(lab) -> None:
    """Explore shows this session's lab model (``mha_core.Lab``) on its fixed example, until ``close_lab_run``."""
    st.session_state[_LAB_RUN] = lab.run(0)


def lab_run():
    """The lab model's ``AttentionRun`` Explore shows instead of the sidebar's model, or None."""
    return st.session_state.get(_LAB_RUN)


def close_lab_run() -> None:
    st.session_state.pop(_LAB_RUN, None)


def reset_server_state() -> None:
    """Forget the settings and the shared caches (tests change the environment between apps)."""
    settings.cache_clear()
    shared.cache_clear()
    lab_slots.cache_clear()
    _models.cache_clear()
    _failed_loads.cache_clear()


def configure_process() -> None:
    """The C allocator returns evicted runs to the system (``ui.budget.tune_allocator``), and one torch
    thread per forward pass by default: a sentence takes ~40 ms either way, but on a busy
    2-core machine two spinning OpenMP threads per run made it 10-30x slower (0.04 s vs 0.8-1.5 s), and
    the server runs each session in its own thread anyway."""
    import torch

    tune_allocator()
    if torch.get_num_threads() != settings().torch_threads:
        torch.set_num_threads(settings().torch_threads)
    _warm_up_kernels()


@functools.cache
def _warm_up_kernels() -> None:
    """Once per server: the head metrics' compiled kernel is readied in the background, so the first visitor's
    page does not wait for it (4 s on a machine's first start, 0.5 s on later ones)."""

    threading.Thread(target=metrics.warm_up, name="headscope-warm-up", daemon=True).start()


@dataclass(frozen=True)
class Selection:
    """What the sidebar selected. ``model`` is the model actually in use (the last one that loaded)."""

    model: str
    engine: str
    text: str
    text_pair: str | None
    bos: bool | None = None  # decoders: begin with the BOS token (None: the model's default)


_SELECTION = "_selection"


def set_selection(selection: Selection) -> None:
    st.session_state[_SELECTION] = selection


def has_selection() -> bool:
    return _SELECTION in st.session_state


def selection() -> Selection:
    """The sidebar's choices for this run: app.py draws the sidebar before it runs the page."""
    try:
        return st.session_state[_SELECTION]
    except KeyError:
        raise RuntimeError("No sidebar selection: pages run inside app.py (streamlit run app.py).") from None


_SENTENCE_SLOT = "_sentence_slot"


def set_sentence_slot(slot) -> None:
    """Where this run's sentence boxes go in the sidebar when the page draws them (None: the sidebar does)."""
    st.session_state[_SENTENCE_SLOT] = slot


def sentence_slot():
    """The sidebar's place for the sentence boxes if this page is to draw them (``widgets.sentences_in_page``)."""
    return st.session_state.get(_SENTENCE_SLOT)


# ---- URL query parameters ------------------------------------------------------------------
def query_value(key: str, default: str | None = None) -> str | None:
    value = st.query_params.get(key)
    return default if value is None else str(value)


def write_query(**values) -> None:
    """Set query parameters; None or "" removes one (so the URL stays short)."""
    for key, value in values.items():
        if value is None or value == "":
            if key in st.query_params:
                del st.query_params[key]
        elif st.query_params.get(key) != str(value):
            st.query_params[key] = str(value)


def link_notice(message: str) -> None:
    """Keep a note of what was wrong with the link this session opened (``take_link_notices``)."""
    st.session_state.setdefault("_link_notices", []).append(message)


def take_link_notices() -> list[str]:
    """The notes kept so far, once."""
    return st.session_state.pop("_link_notices", None) or []


def link_index(key: str) -> int | None:
    """A layer or head number the link asked for, once (checked against the model's size where drawn)."""
    return st.session_state.pop(f"_{key}_from_link", None)


def _text_from_query(key: str, label: str) -> str:
    value = query_value(key, DEFAULT_TEXT if key == "text" else "") or ""
    if len(value) > MAX_TEXT_CHARS:
        link_notice(f"the {label} had {len(value):,} characters; the first {MAX_TEXT_CHARS:,} are kept.")
        value = value[:MAX_TEXT_CHARS]
    if value and not visible_text(value):
        link_notice(f"the {label} holds only invisible characters (zero-width spaces, marks), so it is empty.")
        value = ""
    return value


def init_from_query() -> None:
    """On a session's first run, the URL decides the sidebar's starting values; every value is checked."""
    if st.session_state.get("_state_initialised"):
        return
    st.session_state["_state_initialised"] = True
    model = (query_value("model", DEFAULT_MODEL) or DEFAULT_MODEL).strip()
    if len(model) > MAX_MODEL_CHARS:
        link_notice(f"the model name had {len(model):,} characters, more than any model name; showing {DEFAULT_MODEL}.")
        model = DEFAULT_MODEL
    choices = model_choices()
    if model.lower() in choices:
        st.session_state["model_choice"] = model.lower()
    elif OTHER_MODEL in choices:
        st.session_state["model_choice"] = OTHER_MODEL
        st.session_state["model_other"] = model
    else:  # a model this server does not offer: say so where the user looks, keep a working one
        link_notice(f"this server does not offer the model {quoted(model)}; showing {DEFAULT_MODEL}.")
        st.session_state["model_choice"] = next(iter(choices))
    engine = query_value("engine", "transformers")
    if engine not in ENGINES:
        link_notice(f"there is no engine {quoted(engine)} (only {', '.join(ENGINES)}); using transformers.")
        engine = "transformers"
    st.session_state["engine"] = engine
    st.session_state["text"] = _text_from_query("text", "sentence")
    st.session_state["pair"] = _text_from_query("pair", "second sentence")
    for key in ("layer", "head"):
        value = query_value(key)
        if value is None:
            continue
        try:
            number = address.whole_number(value)
        except ValueError:
            link_notice(f"the {key} {quoted(value)} is not a {key} number; showing {key} 0.")
            continue
        st.session_state[f"_{key}"] = number
        st.session_state[f"_{key}_from_link"] = number


# ---- examples --------------------------------------------------------------------------------
@st.cache_data(show_spinner=False)
def load_examples() -> list[dict]:
    """Example sentences (``assets/examples.json``): text, optional pair, and what they show."""
    try:
        return json.loads(EXAMPLES_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        LOG.exception("cannot read %s", EXAMPLES_PATH)
        return []


def apply_example() -> None:
    """The example picked in the sidebar fills the sentence, the pair, the model it is for, and opens the
    layer and head that show what it is about."""
    examples = load_examples()
    index = st.session_state.get("example")
    if index is None or not (0 <= index < len(examples)):
        return
    example = examples[index]
    st.session_state["text"] = example["text"]
    st.session_state["pair"] = example.get("pair", "")
    model = example.get("model", DEFAULT_MODEL)
    if model in model_choices():
        st.session_state["model_choice"] = model
    for key in ("layer", "head"):
        if key in example:
            st.session_state[key] = st.session_state[f"_{key}"] = int(example[key])


# ---- models ----------------------------------------------------------------------------------
def report_progress(bar):
    """A library progress callback (``mha_core.progress``) drawn on a Streamlit progress bar."""
    from mha_core.progress import fraction

    def report(done: float, total: float, message: str = "") -> None:
        bar.progress(fraction(done, total), text=message or None)

    return report


def model_choices() -> dict[str, str]:
    """What the sidebar offers: the allowed embedded models, the other allowed names, and "other"
    (type any name) only where any model may load."""
    allowed = settings().allowed_models
    choices = {key: label for key, label in MODEL_CHOICES.items() if sources.model_allowed(key, allowed)}
    if allowed is None:
        choices[OTHER_MODEL] = "Other: a hub id or a local folder"
    else:
        choices.update({name: name for name in allowed if sources.normalized_name(name) not in MODEL_CHOICES})
    return choices


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
        from mha_core.models import load_model

        files = folder_state(key)
        bar = st.progress(0.0, text=f"Loading {key[:80]}...")
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


def in_slot(compute, check: StopPoint | None = None):
    """``compute()`` inside one of the server's compute slots, stopping if this session goes away; while it
    waits for a slot, a notice says how many requests are before it."""
    check = check or stop_point()
    notice = LatePlaceholder()

    def show_waiting(ahead: int) -> None:
        notice().caption(f"The server is busy: {ahead + 1} other request(s) before yours.")

    with shared().gate.slot(check=check, waiting=show_waiting):
        notice.clear()
        return compute()


def cached(key: tuple, compute, check: StopPoint | None = None, reserve_bytes: int = 0):
    """``compute()``'s value, kept in the server's byte-budgeted cache under ``key``; ``reserve_bytes`` of
    the budget are held for the computation before it starts (``ByteBudgetCache.get_or_compute``)."""
    return shared().cache.get_or_compute(key, compute, check=check, reserve_bytes=reserve_bytes)


def run_peak_bytes(model, text: str, text_pair: str | None, bos: bool, arrays: int = 1) -> int:
    """What a forward pass of ``model`` on this text holds at its peak (``RUN_PEAK_FACTOR`` x its attention
    array; ``arrays`` = 2 with norm-based attention): reserved in the budget before the pass starts."""
    try:
        num_tokens = len(model.encode(text, text_pair, bos).input_ids)
    except HeadscopeError:  # the run itself will say what is wrong with the text
        return 0
    return int(RUN_PEAK_FACTOR * arrays * attention_bytes(model.num_layers, model.num_heads, num_tokens))


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
    key = ("run", _cache_key(model_name), engine, text, text_pair or None, bos)
    check = stop_point()

    def compute():
        run = in_slot(
            lambda: model.run(text, text_pair=text_pair or None, engine=engine, progress=check, bos=bos), check
        )
        run.metadata["cache_key"] = key  # what is computed from this run is cached under it too
        return run

    return cached(key, compute, check, reserve_bytes=run_peak_bytes(model, text, text_pair or None, bos))


def get_seq2seq_run(model_name: str, engine: str, source: str, target: str | None):
    """An encoder-decoder model's ``Seq2SeqRun`` (``target`` None: the model writes it), from the shared cache
    or computed in a compute slot, stopping if this session goes away, with its peak memory reserved first."""
    model = get_model(model_name)
    key = ("seq2seq-run", _cache_key(model_name), engine, source, target)
    check = stop_point()

    def compute():
        return in_slot(lambda: model.run(source, target, engine=engine, progress=check), check)

    return cached(key, compute, check, reserve_bytes=int(RUN_PEAK_FACTOR * model.attention_bytes(source, target)))


def run_with_norms(run):
    """``run`` again with norm-based attention (``model.run(..., norms=True)``), cached with it and computed
    in a compute slot."""
    model = get_model(run.model_name)
    check = stop_point()

    def compute():
        with shared().gate.slot(check=check):
            return model.run(
                run.text, text_pair=run.text_pair, engine=run.engine, bos=run.metadata.get("bos"), norms=True
            )

    return computed_from(run, "norms", compute, reserve_bytes=2 * int(RUN_PEAK_FACTOR * run.attentions.nbytes))


def corpus_index(model_name: str, layer: int, head: int, kind: str, max_sentences: int):
    """``mha_core.interventions.search`` index of the first ``max_sentences`` UD English EWT dev sentences, built once per
    (model, layer, head, kind) in a compute slot with a progress bar, and kept in the shared cache."""

    model = get_model(model_name)
    head = head if kind == "attention" else 0  # a representation belongs to the layer, not to a head
    key = ("search-index", _cache_key(model_name), layer, head, kind, max_sentences)
    check = stop_point()

    def index(job: Job):
        with job_slot(job):
            sentences = [sentence.words for sentence in syntax.ud_ewt_dev(max_sentences)]
            return search.build_corpus_index(model, sentences, layer, head, kind, progress=job.progress)

    return cached(key, lambda: background(key, index, "Indexing the UD dev sentences..."), check)


def computed_from(run, what: str, compute, reserve_bytes: int = 0):
    """``compute()`` cached with ``run`` (dropped with it under memory pressure); uncached for a run that
    did not come from ``get_run``. ``reserve_bytes``: its peak memory, held in the budget while it runs."""
    key = run.metadata.get("cache_key")
    if key is None:
        with shared().cache.reserve(reserve_bytes):
            return compute()
    # A word-level or special-free view keeps its run's key; its shape is part of what is cached.
    shape = (run.level, bool(run.metadata.get("special_tokens_removed")))
    return cached((what, *shape, *key), compute, reserve_bytes=reserve_bytes)


def deferred(view, make):
    """A zero-argument callable for ``st.download_button(data=...)`` that returns ``make(view)`` when clicked,
    without holding ``view``: Streamlit keeps a session's download callables as long as the session, and a
    callable holding a 283 MB run would keep it out of the budget's reach. The run is held weakly; once it
    has left memory, a click gets it back through the shared cache (the same key, so a cached copy is used,
    or the forward pass is made again) and reshapes it as ``view`` was (word level, without special tokens)."""
    import weakref

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
            run = shared().cache.get_or_compute(
                key,
                lambda: model.run(text, text_pair=text_pair, engine=engine, bos=bos),
                reserve_bytes=run_peak_bytes(model, text, text_pair, bos),
            )
            run.metadata["cache_key"] = key
            current = run.to_words() if words else run
            current = current.without_special() if without_special else current
        return make(current)

    return data


def metrics_for(run):
    """``mha_core.head_metrics(run)``: one row per layer and head, cached with the run it came from."""
    from mha_core import head_metrics

    return computed_from(run, "metrics", lambda: head_metrics(run))


# Head distances cost (head pairs) x n^2; past this many tokens they average over this many query rows.
DISTANCE_MAX_QUERIES = 128


def sentence_analysis(model_name: str, run):
    """(metrics, semantic scores, head distances) of one run, for the Roles page."""
    import mha_core

    def analyse():
        semantic = None
        token_ids = run.metadata.get("token_ids")
        if token_ids is not None:
            semantic = mha_core.semantic_scores(run, get_model(model_name).input_embeddings(token_ids))
        return semantic, mha_core.head_distances(run, max_queries=DISTANCE_MAX_QUERIES)

    semantic, distances = computed_from(run, "roles-analysis", analyse)
    return metrics_for(run), semantic, distances


@st.cache_data(show_spinner=False, max_entries=8)
def corpus_profile(model_name: str, max_sentences: int):
    """(metrics, dependency, coreference) over the first ``max_sentences`` UD EWT dev sentences."""
    import mha_core
    from mha_core.analysis.syntax import ud_ewt_dev

    model = get_model(model_name)
    sentences = ud_ewt_dev(max_sentences=max_sentences)

    def compute(job: Job):
        result = mha_core.profile(model, sentences, batch_size=16, progress=job.progress)
        return result.metrics, result.dependency, mha_core.coreference_scores(model)

    key = ("corpus-profile", _cache_key(model_name), max_sentences)
    return background(key, compute, f"Profiling {len(sentences)} sentences...")


@st.cache_data(show_spinner=False, max_entries=8)
def decoder_scores(model_name: str):
    """Previous-token, duplicate, induction and prefix-matching scores on repeated random tokens."""
    import mha_core

    return mha_core.decoder_head_scores(get_model(model_name))


@st.cache_data(show_spinner=False)
def saturation_table(n_keys: int = 16):
    """``mha_core.softmax_saturation``: the same curve for every visitor."""
    import mha_core

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
    key = ("ablated-run", _cache_key(model_name), engine, text, text_pair or None, bos, tuple(heads), ablation)

    def compute():
        return in_slot(
            lambda: model.run(
                text,
                text_pair=text_pair or None,
                engine=engine,
                bos=bos,
                ablate=list(heads),
                ablation=ablation,
                losses=True,
            )
        )

    return cached(key, compute, stop_point())


@st.cache_data(show_spinner=False, max_entries=8)
def induction_table(model_name: str, top_k: int, draws: int, role: str, ablation: str):
    """``mha_core.induction_experiment``: top-k heads of a role vs k random heads on repeated random tokens."""

    scores = decoder_scores(model_name)
    model = get_model(model_name)

    def compute(job: Job):
        with job_slot(job):
            return experiments.induction_experiment(
                model,
                top_k=top_k,
                random_draws=draws,
                role=role,
                scores=scores,
                ablation=ablation,
                progress=job.progress,
            )

    key = ("induction", _cache_key(model_name), top_k, draws, role, ablation)
    return background(key, compute, "Running the experiment...")


@st.cache_data(show_spinner=False, max_entries=8)
def importance_and_pruning(model_name: str, sentences: int, method: str, seeds: int, steps: int):
    """(importance, pruning curves: importance order and ``seeds`` random orders) over UD EWT dev sentences."""
    import pandas as pd

    from mha_core.analysis.syntax import ud_ewt_dev

    model = get_model(model_name)
    texts = corpus_texts(ud_ewt_dev(sentences))

    def compute(job: Job):
        with job_slot(job):
            importance = head_importance(model, texts, method=method, progress=job.progress)
            curves = pd.concat(
                [
                    pruning_curve(
                        model,
                        texts,
                        order,
                        importance=importance,
                        steps=steps,
                        seeds=tuple(range(seeds)),
                        progress=job.progress,
                    )
                    for order in ("importance", "random")
                ],
                ignore_index=True,
            )
            return importance, curves

    key = ("importance", _cache_key(model_name), sentences, method, seeds, steps)
    return background(key, compute, f"Head importance over {len(texts)} sentences...")


def role_ablation(model_name: str, run, primary):
    """For each role group of ``primary`` (``mha_core.primary_roles``): what ablating all its heads does to
    this sentence (``mha_core.interventions.experiments.role_group_ablation``), cached with the run."""

    model = get_model(model_name)
    return computed_from(
        run,
        f"role-ablation-{hash(tuple(map(tuple, primary[['layer', 'head', 'group']].astype(str).to_numpy())))}",
        lambda: in_slot(lambda: experiments.role_group_ablation(model, run.text, primary)),
    )


# ---- long work in threads of the session's own ----------------------------------------------------
def presence() -> Presence:
    """This session's heartbeat (``ui.jobs.Presence``): renewed while its page is open (``widgets.keep_alive``,
    a run waiting in ``background``), it makes the session's long work wait while the page is away and end
    once the server has dropped the session (``server.disconnectedSessionTTL``)."""
    found = st.session_state.get("_presence")
    if found is None:
        found = st.session_state["_presence"] = Presence(
            abandon_s=float(st.get_option("server.disconnectedSessionTTL"))
        )
    return found


def job_slot(job: Job):
    """One of the server's compute slots for a job: it waits in the queue while its page is away, like its work."""
    return shared().gate.slot(check=job.check, waiting=job.queued)


def background(key: tuple, compute, label: str):
    """``compute(job)``'s value, computed in a thread of this session's (``ui.jobs.Job``) while this run waits
    and draws its progress. A run stopped meanwhile (its browser lost the connection, the visitor clicked
    something else) leaves the job going: the next run asking for ``key`` waits for the same job instead of
    starting over. While the page is away the job stops at its next progress report and waits; it computes
    again when the page comes back, and ends once the session is gone."""
    jobs = st.session_state.setdefault("_jobs", {})
    job = jobs.get(key)
    if job is None or job.status == "stopped":
        job = jobs[key] = Job(compute, presence(), name=f"headscope-{key[0]}")
    bar = st.progress(job.fraction, text=job.message or label)
    try:
        while not job.wait(BEAT_S):
            bar.progress(job.fraction, text=job.message or label)  # where Streamlit ends a run it stops
            presence().beat()
    finally:
        bar.empty()
    jobs.pop(key, None)
    return job.result()
