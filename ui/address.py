"""A page's address: its query parameters, what was wrong with the link a session opened, and the parsers
that check every value read from it.

The parsers are plain Python (tested directly). A link is text anyone can write, so every value a page takes from it goes through one of these parsers;
each returns the setting's value or raises ``ValueError`` whose message says what the setting takes
(shown as "the link's x=... is not <message>"). Numbers are ASCII digits only, with an optional minus
sign, at most ``MAX_DIGITS`` of them: ``str.isdigit`` accepts a superscript two that ``int`` refuses, and
``int`` itself accepts other scripts' digits, ``_`` separators, a plus sign and surrounding spaces.
"""

from __future__ import annotations

import re

import streamlit as st

from mha_core.errors import quoted
from mha_core.models import DEFAULT_MODEL, ENGINES
from mha_core.models.ablation import refused_heads_message, split_heads
from mha_core.models.tokens import visible_text
from ui.i18n import Text, t, text
from ui.settings import OTHER_MODEL, model_choices

DEFAULT_TEXT = "The cat sat on the mat because it was tired."
MAX_TEXT_CHARS = 4000  # the model truncates to its own token limit; this only bounds what a URL can carry
MAX_MODEL_CHARS = 200  # longer than any hub id or sensible folder

MAX_DIGITS = 9
LARGEST = 10**MAX_DIGITS - 1  # the largest number a link may hold, for settings without their own bound
_WHOLE_NUMBER = re.compile(rf"-?[0-9]{{1,{MAX_DIGITS}}}")
# A layer or head number refused, in words (the catalog's keys: ``ui.i18n``).
INDEX_RANGES = {"layer": "a layer number from 0 to {last}", "head": "a head number from 0 to {last}"}
NOT_AN_INDEX = {
    "layer": "the layer {value} is not a layer number; showing layer 0.",
    "head": "the head {value} is not a head number; showing head 0.",
}
NONE = "none"  # a list setting with nothing chosen (an empty value would drop the setting from the link)
_SHOWN_CHOICES = 8  # a message names at most this many of the values a setting takes


def whole_number(raw: str, minimum: int = 0, maximum: int = LARGEST) -> int:
    """``raw`` as an integer from ``minimum`` to ``maximum``: ASCII digits, an optional leading minus."""
    if not isinstance(raw, str) or not _WHOLE_NUMBER.fullmatch(raw):
        raise ValueError(text("a whole number from {minimum} to {maximum}", minimum=minimum, maximum=maximum))
    value = int(raw)
    if not minimum <= value <= maximum:
        raise ValueError(text("a whole number from {minimum} to {maximum}", minimum=minimum, maximum=maximum))
    return value


def index_number(raw: str, count: int, noun: str) -> int:
    """``raw`` as a layer or head number (``noun``) of a model with ``count`` of them: ASCII digits; a number past
    the model's last is the caller's to clamp (and say so). Refused: ``ValueError`` naming the model's range."""
    try:
        return whole_number(raw)
    except ValueError:
        last = max(int(count) - 1, 0)
        if noun in INDEX_RANGES:
            raise ValueError(text(INDEX_RANGES[noun], last=last)) from None
        raise ValueError(f"a {noun} number from 0 to {last}") from None


def number(minimum: int, maximum: int = LARGEST):
    """A parser of whole numbers from ``minimum`` to ``maximum``."""
    return lambda raw: whole_number(raw, minimum, maximum)


def sentence(maximum: int = 400):
    """A parser of a sentence of at most ``maximum`` characters with something visible in it."""

    def parse(raw: str) -> str:
        if not isinstance(raw, str) or len(raw) > maximum or not visible_text(raw):
            raise ValueError(text("a sentence of 1 to {maximum} characters", maximum=maximum))
        return raw

    return parse


def _described(options) -> Text:
    names = [str(option) for option in options]
    shown = ", ".join(names[:_SHOWN_CHOICES]) + (", ..." if len(names) > _SHOWN_CHOICES else "")
    return text("one of {values}", values=shown)


def choice(options):
    """A parser of one of ``options``, written in the link as ``str(option)`` (numbers and names alike)."""
    options = list(options)
    by_text = {str(option): option for option in options}

    def parse(raw: str):
        if raw not in by_text:
            raise ValueError(_described(options))
        return by_text[raw]

    return parse


def choices(options):
    """A parser of several of ``options``, written as ``str(option)`` joined by commas (``NONE``: none);
    each at most once, in the link's order."""
    options = list(options)
    one = choice(options)

    def parse(raw: str) -> list:
        if raw == NONE:
            return []
        parts = raw.split(",")
        if len(parts) > len(options) or len(set(parts)) != len(parts):
            raise ValueError(text("a list of different values, each {described}", described=_described(options)))
        return [one(part) for part in parts]

    return parse


class PartlyRefused(ValueError):
    """Some of a list's values were refused: the setting takes the others (``kept``); the message names the
    refused ones."""

    def __init__(self, message: str, kept: list):
        super().__init__(message)
        self.kept = kept


def head_names(num_layers: int, num_heads: int):
    """A parser of heads of a model of ``num_layers`` x ``num_heads``, named L3H2 (or 3.2) and joined by commas
    (``NONE``: none), as ``["L3H2", ...]``, each once: the heads it does not have and names of no head are
    refused by name (``PartlyRefused``) and the others kept."""

    def parse(raw: str) -> list[str]:
        if raw == NONE:
            return []
        heads, refused = split_heads(raw, num_layers, num_heads)
        names = [f"L{layer}H{head}" for layer, head in heads]
        if refused:
            raise PartlyRefused(refused_heads_message(refused, num_layers, num_heads), names)
        if len(names) < len([item for item in raw.split(",") if item]):
            raise PartlyRefused("a head is named more than once", names)
        return names

    return parse


def format_choices(values) -> str:
    """``choices``' link text of ``values``."""
    return ",".join(str(value) for value in values) if len(values) else NONE


def flag(raw: str) -> bool:
    """On or off, written as 1 or 0."""
    if raw not in ("0", "1"):
        raise ValueError("1 (on) or 0 (off)")
    return raw == "1"


def format_flag(value: bool) -> str:
    return "1" if value else "0"


# ---- the page's query parameters ------------------------------------------------------------------
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


def link_index(key: str) -> str | None:
    """The layer or head number the link asked for (as written there), once: checked against the model's own
    number of layers or heads where it is drawn (a number past them is clamped with a notice)."""
    return st.session_state.pop(f"_{key}_from_link", None)


def _text_from_query(key: str, label: str) -> str:
    value = query_value(key, DEFAULT_TEXT if key == "text" else "") or ""
    if len(value) > MAX_TEXT_CHARS:
        link_notice(
            t(
                "the {label} had {count} characters; the first {kept} are kept.",
                label=t(label),
                count=f"{len(value):,}",
                kept=f"{MAX_TEXT_CHARS:,}",
            )
        )
        value = value[:MAX_TEXT_CHARS]
    if value and not visible_text(value):
        link_notice(
            t("the {label} holds only invisible characters (zero-width spaces, marks), so it is empty.", label=t(label))
        )
        value = ""
    return value


def take_settings_from_link() -> None:
    """The next run starts from the page address again, as a session's first run does (``init_from_query``):
    for a page that switches to another page with a link's settings (``st.switch_page(..., query_params=)``),
    which Streamlit opens with its widgets at their defaults."""
    st.session_state["_state_initialised"] = False


def init_from_query() -> None:
    """On a session's first run, the URL decides the sidebar's starting values; every value is checked."""
    if st.session_state.get("_state_initialised"):
        return
    st.session_state["_state_initialised"] = True
    model = (query_value("model", DEFAULT_MODEL) or DEFAULT_MODEL).strip()
    if len(model) > MAX_MODEL_CHARS:
        link_notice(
            t(
                "the model name had {count} characters, more than any model name; showing {model}.",
                count=f"{len(model):,}",
                model=DEFAULT_MODEL,
            )
        )
        model = DEFAULT_MODEL
    choices = model_choices()
    if model.lower() in choices:
        st.session_state["model_choice"] = model.lower()
    elif OTHER_MODEL in choices:
        st.session_state["model_choice"] = OTHER_MODEL
        st.session_state["model_other"] = model
    else:  # a model this server does not offer: say so where the user looks, keep a working one
        link_notice(
            t("this server does not offer the model {name}; showing {model}.", name=quoted(model), model=DEFAULT_MODEL)
        )
        st.session_state["model_choice"] = next(iter(choices))
    engine = query_value("engine", "transformers")
    if engine not in ENGINES:
        link_notice(
            t(
                "there is no engine {name} (only {engines}); using transformers.",
                name=quoted(engine),
                engines=", ".join(ENGINES),
            )
        )
        engine = "transformers"
    st.session_state["engine"] = engine
    st.session_state["text"] = _text_from_query("text", "sentence")
    st.session_state["pair"] = _text_from_query("pair", "second sentence")
    for key in ("layer", "head"):
        value = query_value(key)
        if value is None:
            continue
        try:
            number = whole_number(value)
        except ValueError:
            link_notice(t(NOT_AN_INDEX[key], value=quoted(value)))
            continue
        st.session_state[f"_{key}"] = number
        st.session_state[f"_{key}_from_link"] = str(number)
