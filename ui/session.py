"""What one session holds between its script runs: the sidebar's selection, the sentence boxes' place, the
example sentences the sidebar offers, the Lab's model shown in Explore, and the session's heartbeat."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from mha_core.models import DEFAULT_MODEL
from ui.jobs import Presence
from ui.settings import model_choices

LOG = logging.getLogger("headscope.app")
ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_PATH = ROOT / "assets" / "examples.json"


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
    """The sidebar's place for the sentence boxes if this page is to draw them (``ui.widgets.sidebar.sentences_in_page``)."""
    return st.session_state.get(_SENTENCE_SLOT)


# ---- the Lab's trained model in Explore ----------------------------------------------------------
_LAB_RUN = "_lab_run"


def set_lab_run(run) -> None:
    """Explore shows this run of the session's lab model (``ui.computations.open_lab_in_explore``) instead of the
    sidebar's model, until ``close_lab_run``."""
    st.session_state[_LAB_RUN] = run


def lab_run():
    """The lab model's ``AttentionRun`` Explore shows instead of the sidebar's model, or None."""
    return st.session_state.get(_LAB_RUN)


def close_lab_run() -> None:
    st.session_state.pop(_LAB_RUN, None)


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


# ---- the session's heartbeat -----------------------------------------------------------------------
def presence() -> Presence:
    """This session's heartbeat (``ui.jobs.Presence``): renewed while its page is open (``ui.widgets.sidebar.keep_alive``,
    a run waiting in ``ui.compute.background``), it makes the session's long work wait while the page is away
    and end once the server has dropped the session (``server.disconnectedSessionTTL``)."""
    found = st.session_state.get("_presence")
    if found is None:
        found = st.session_state["_presence"] = Presence(
            abandon_s=float(st.get_option("server.disconnectedSessionTTL"))
        )
    return found
