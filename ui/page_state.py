"""The session state pages keep beyond their settings, its keys declared here once: what a session asked for
or computed per model (a profile, an experiment's settings, importance), so a page does not hold literal
``session_state`` keys. Settings kept in the address are declared in each page's settings dataclass
(``ui.page_settings``)."""

from __future__ import annotations

from typing import Any

import streamlit as st

# ---- once: what a callback asks the page's next run to do ----------------------------------------------------
CIRCUITS_OPEN_EXPLORE = "_circuits_open_explore"  # (layer, head) clicked on a Circuits heads map


def put(key: str, value: Any) -> None:
    st.session_state[key] = value


def take(key: str) -> Any:
    """What was ``put`` under ``key``, once (None if nothing)."""
    return st.session_state.pop(key, None)


# ---- per model: what this session asked for or computed, by model name -----------------------------------
ABLATE_INDUCTION = "ablate_induction"  # the induction experiment's (k, draws, role, ablation) once Run is clicked
ABLATE_IMPORTANCE_ASKED = "ablate_importance_settings"  # (sentences, method, orders) once Compute is clicked
ABLATE_IMPORTANCE = "ablate_importance"  # the importance table computed, which the heads map may show
ROLES_PROFILE_WANTED = "roles_profile_wanted"  # a corpus profile's sentences, asked for until it is done
ROLES_PROFILE = "roles_profile"  # the sentences of the corpus profile done
ROLES_DECODER = "roles_decoder"  # the decoder scores computed (decoders)

PER_MODEL = (
    ABLATE_INDUCTION,
    ABLATE_IMPORTANCE_ASKED,
    ABLATE_IMPORTANCE,
    ROLES_PROFILE_WANTED,
    ROLES_PROFILE,
    ROLES_DECODER,
)


def of_model(key: str, model: str, default: Any = None) -> Any:
    """What this session keeps under ``key`` (one of ``PER_MODEL``) for ``model``, else ``default``."""
    return st.session_state.get(key, {}).get(model, default)


def remember(key: str, model: str, value: Any) -> None:
    st.session_state.setdefault(key, {})[model] = value


def forget(key: str, model: str) -> Any:
    """Drop what is kept under ``key`` for ``model``; returns it (None if nothing was)."""
    return st.session_state.get(key, {}).pop(model, None)


def has(key: str, model: str) -> bool:
    return model in st.session_state.get(key, {})
