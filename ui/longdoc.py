"""Explore's long document: every head of a document up to the model's own context length, in a deep-zoom view.

The visitor pastes a document or picks one of the long examples (``assets/long/documents.json``); a long run
(``mha_core.models.long.run_long``) is computed in a thread of the session (``ui.jobs``) inside one of the
server's compute slots, with its real bytes reserved in the budget first (``long_run_bytes``), through the one
gated path (``compute.long_run``). A progress bar says how long is left, and a Stop
button ends the pass at its next block. The view (``ui.longview``) zooms into any region of any head, exact at
every level; the address keeps the document, the zoom and the pooling (``?long=&lzoom=&lreduce=&lview=``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import weakref
from functools import cache
from pathlib import Path

import streamlit as st

from ui import address, compute, longview, session
from ui.widgets import messages, pickers

EXAMPLES = Path(__file__).resolve().parents[1] / "assets" / "long" / "documents.json"
MAX_LONG_CHARS = 120_000  # more than any model's context: 8,192 tokens are about 36,000 characters
PASTE = "paste"


@cache
def examples() -> tuple[dict, ...]:
    return tuple(json.loads(EXAMPLES.read_text(encoding="utf-8")))


def _key(model_name: str, text: str) -> tuple:
    return ("long-run", model_name, hashlib.sha1(text.encode("utf-8")).hexdigest())


def _stops() -> dict:
    return st.session_state.setdefault("_long_stops", {})


def get_long_run(model_name: str, text: str):
    """The ``LongRun`` of ``text`` (``compute.long_run``: a job with a progress bar and time left) with a Stop
    button; None once stopped."""
    stop = _stops().setdefault(_key(model_name, text), threading.Event())
    stop_slot = st.empty()
    stop_slot.button("Stop", key="long_stop", on_click=stop.set, help="End the pass at its next block of rows")
    try:
        return compute.long_run(model_name, text, stop)
    except compute.LongRunStopped:
        _stops().pop(_key(model_name, text), None)
        st.session_state["long_requested"] = False
        st.info("Stopped. Press the button again to read the document.", icon=":material/stop_circle:")
        return None
    finally:
        stop_slot.empty()


def _document() -> tuple[str, str]:
    """(which document: an example's index or PASTE, its text) from the picker (and the link)."""
    labels = [example["label"] for example in examples()]
    options = [*[str(index) for index in range(len(labels))], PASTE]
    names = dict(zip(options, [*labels, "Paste a document"]))
    pickers.url_setting("long_doc", "long", "0", address.choice(options))
    choice = st.selectbox("Long document", options, key="long_doc", format_func=names.get)
    pickers.keep_in_url("long_doc", "long", "0")
    if choice == PASTE:
        text = st.text_area("Your document", key="long_text", max_chars=MAX_LONG_CHARS, height=160)
        return choice, text
    example = examples()[int(choice)]
    st.caption(
        f"{len(example['documents'])} consecutive documents of the UD English Web Treebank dev split "
        "(CC BY-SA 4.0), their sentences joined."
    )
    return choice, example["text"]


def section() -> None:
    """The long-document part of Explore."""
    st.subheader("Long document")
    st.caption(
        "Every head of a long document, exact at every zoom: the pass keeps each layer's queries, keys and each "
        "row's normaliser, never the full weight matrices, so any region is recomputed exactly when you zoom."
    )
    with messages.error_display():
        model_name = session.selection().model
        model = compute.get_model(model_name)
        _, text = _document()
        limit = model.context_length
        st.caption(
            f"{model_name} reads up to {limit:,} tokens here ({'its context length' if model.is_causal else 'its learned positions'}); "
            f"the views above stop at {model.max_tokens}. A longer document is cut at {limit:,} tokens."
        )
        if not text.strip():
            st.info("Paste a document to read it.")
            return
        if address.query_value("lzoom"):
            st.session_state.setdefault("long_requested", True)  # a link to a zoom reads its document at once
        if st.button("Read every head of this document", key="long_go", type="primary"):
            st.session_state["long_requested"] = True
        if not st.session_state.get("long_requested"):
            return
        run = get_long_run(model_name, text)
        if run is None:
            return
        st.caption(messages.md_escape(run.summary()))
        # The view's fragment finds the run here without holding it (a session keeps its fragments' arguments).
        st.session_state["long_run_ref"] = weakref.ref(run)
        long_view()
        roles_table(run)


def _zoom(run) -> longview.Zoom:
    """The zoom this session shows: kept in the session, first taken from the link."""
    zoom = st.session_state.get("long_zoom")
    if zoom is None:
        zoom = longview.whole(0, 0, run.num_tokens)
        raw = address.query_value("lzoom")
        if raw:
            try:
                zoom = longview.parse_link(raw)
            except ValueError as error:
                st.warning(f"The link's lzoom={raw[:40]!r} is not {error}; showing the whole first head.")
        reduce, view = address.query_value("lreduce", "mean"), address.query_value("lview", "head")
        zoom = dataclasses.replace(zoom, reduce=reduce, view=view)
    return longview.checked(zoom, run.num_layers, run.num_heads, run.num_tokens)


def _take_zoom(zoom: longview.Zoom) -> None:
    st.session_state["long_zoom"] = zoom


@st.fragment
def long_view() -> None:
    """The deep-zoom view; a zoom reruns this fragment only."""
    with messages.error_display():
        held = st.session_state.get("long_run_ref")
        run = held() if held is not None else None
        if run is None:  # the run left memory: the whole page gets it again (from the cache, or a new pass)
            st.rerun()
        zoom = _zoom(run)
        st.session_state["long_zoom"] = zoom
        data = longview.pack_model(run, zoom) if zoom.view == "model" else longview.pack_layer(run, zoom)
        longview.show(data, key=f"long_view_{run.num_tokens}", on_zoom=_take_zoom)
        address.write_query(lzoom=zoom.link(), lreduce=zoom.reduce, lview=zoom.view)


def roles_table(run) -> None:
    """Sink-at-length and local heads with their evidence, and each layer's 90%-mass window."""
    roles = run.roles()
    with st.expander(f"Long-context roles ({len(roles)} heads)"):
        st.caption(
            "Sink at length: most of a query's mass on the first 4 tokens, for queries at least 64 tokens away "
            "(StreamingLLM). Local: 90% of a query's mass within a window of at most 16 tokens. Retrieval heads "
            "(Wu et al. 2024) need a needle-in-a-haystack prompt: `python -m bench.long` finds them."
        )
        st.dataframe(roles[["layer", "head", "role", "score", "threshold", "n", "evidence"]], hide_index=True)
        windows = run.local_windows().groupby("layer")["median_window"].median()
        st.caption(
            "Median 90%-mass window (tokens), by layer: " + ", ".join(f"L{k} {int(v)}" for k, v in windows.items())
        )
