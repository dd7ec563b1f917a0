"""Pickers: the layer and head selectors, and every page setting kept in the page's address (``url_select``,
``url_number``, ``url_toggle``, ...), so a link reproduces the view. A value read from a link is checked by one
of ``ui.address``'s parsers."""

from __future__ import annotations

import numpy as np
import streamlit as st

from ui import address
from ui.i18n import t
from ui.settings import settings
from ui.widgets.messages import md_escape


def _cut_to_limit(key: str) -> None:
    """A text box's ``on_change``: a text longer than ``address.MAX_TEXT_CHARS`` is cut, and the length it had
    kept for ``limited_text_input`` to report."""
    text = st.session_state.get(key) or ""
    if len(text) > address.MAX_TEXT_CHARS:
        st.session_state[key] = text[: address.MAX_TEXT_CHARS]
        st.session_state[f"_{key}_cut_from"] = len(text)


def limited_text_input(label: str, *, key: str, what: str, container=None, **kwargs) -> str:
    """A text box that keeps the first ``address.MAX_TEXT_CHARS`` characters of a longer text and says so, as a
    link's text is cut (``max_chars`` would have the browser drop the rest silently). ``what`` names the box."""
    where = container or st
    value = where.text_input(label, key=key, on_change=_cut_to_limit, args=(key,), **kwargs)
    cut_from = st.session_state.pop(f"_{key}_cut_from", None)
    if cut_from:
        where.warning(
            t(
                "The {what} had {count} characters; the first {kept} are kept.",
                what=md_escape(what),
                count=f"{cut_from:,}",
                kept=f"{address.MAX_TEXT_CHARS:,}",
            )
        )
    return value


def _clamped(value, upper: int) -> int:
    try:
        return min(max(int(value), 0), max(upper - 1, 0))
    except (TypeError, ValueError):
        return 0


def select_layer(
    num_layers: int,
    *,
    label: str = "Layer",
    key: str = "layer",
    url_key: str | None = None,
    container=None,
    default: int = 0,
    draw: bool = True,
) -> int:
    """A layer slider kept in the URL (``?layer=``, or ``?url_key=`` for a slider of its own ``key``) and across
    pages; ``default`` until the user moves it. ``draw=False``: the same selection without the slider (a view
    that draws its own, e.g. the head view)."""
    return _select_index(
        num_layers, "layer", label=label, key=key, url_key=url_key, container=container, default=default, draw=draw
    )


def select_head(
    num_heads: int,
    *,
    label: str = "Head",
    key: str = "head",
    url_key: str | None = None,
    container=None,
    draw: bool = True,
) -> int:
    """A head selector kept in the URL (``?head=``, or ``?url_key=``) and across pages (``draw=False``: without
    the selector)."""
    return _select_index(num_heads, "head", label=label, key=key, url_key=url_key, container=container, draw=draw)


# The page-wide layer and head: read from the link when the session starts (``address.init_from_query``), so any
# page that opens first shows them; always in the URL.
SHARED_INDEX_KEYS = ("layer", "head")


def _index_from_link(key: str, url_key: str, noun: str, count: int) -> int | None:
    """The number the link gives an index selector, once: when this session has no value of its own for it. A
    value that is no number gets a notice naming this model's range."""
    if key in SHARED_INDEX_KEYS:
        raw = address.link_index(key)
    else:
        raw = address.query_value(url_key)
        if key in st.session_state or f"_{key}" in st.session_state:
            return None
    if raw is None:
        return None
    try:
        return address.index_number(raw, count, noun)
    except ValueError as error:
        st.warning(
            t(
                "The link's {key}={value} is not {reason}; using the default.",
                key=url_key,
                value=md_escape(raw[:40]),
                reason=md_escape(error),
            )
        )
        return None


def _select_index(
    count: int, noun: str, *, label: str, key: str, url_key: str | None, container=None, default: int = 0, draw: bool
) -> int:
    stored = f"_{key}"  # survives pages where the widget is not drawn
    url_key = url_key or key
    from_link = _index_from_link(key, url_key, noun, count)
    if from_link is not None and from_link >= count:
        st.warning(
            t(
                "The link asks for layer {number}, but this model has {count} (layers 0 to {last}); showing layer "
                "{last}."
                if noun == "layer"
                else "The link asks for head {number}, but this model has {count} (heads 0 to {last}); showing head "
                "{last}.",
                number=from_link,
                count=count,
                last=count - 1,
            )
        )
    if from_link is not None:
        start = from_link
    else:
        start = st.session_state[key] if key in st.session_state else st.session_state.get(stored, default)
    st.session_state[key] = _clamped(start, count)
    if count > 1 and draw:
        (container or st).select_slider(t(label), options=list(range(count)), key=key)
    value = int(st.session_state[key])
    st.session_state[stored] = value
    shared = key in SHARED_INDEX_KEYS
    address.write_query(**{url_key: value if shared or value != _clamped(default, count) else None})
    return value


def set_head(head: int) -> None:
    """Select a head from code (e.g. a click on a chart); takes effect on the next rerun."""
    st.session_state["_head"] = int(head)
    st.session_state["head"] = int(head)


def set_layer(layer: int) -> None:
    """Select a layer from code; takes effect on the next rerun."""
    st.session_state["_layer"] = int(layer)
    st.session_state["layer"] = int(layer)


# Every setting of every page is in the page's address, so a link reproduces the view. A setting's value
# starts as this session's choice (also made on another page), else the link's, checked by one of
# ``ui.address``'s parsers (a value it refuses is reported and the default used), else the default.
def url_setting(key: str, url_key: str, default, parse=str) -> None:
    """Give the widget ``key`` its starting value: what this session chose before (also on another page),
    else the link's ``?url_key=`` (checked: a value ``parse`` refuses is reported and replaced), else
    ``default``. Call before drawing the widget, and ``keep_in_url`` after (or draw it with ``url_widget``)."""
    if key in st.session_state:
        return
    if f"_{key}" in st.session_state:
        st.session_state[key] = st.session_state[f"_{key}"]
        return
    raw = address.query_value(url_key)
    value = default
    if raw is not None:
        try:
            value = parse(raw)
        except address.PartlyRefused as error:
            value = error.kept
            st.warning(
                t(
                    "The link's {key}={value}: {reason}; kept {kept}.",
                    key=url_key,
                    value=md_escape(raw[:60]),
                    reason=md_escape(error),
                    kept=md_escape(address.format_choices(value)),
                )
            )
        except ValueError as error:
            st.warning(
                t(
                    "The link's {key}={value} is not {reason}; using the default.",
                    key=url_key,
                    value=md_escape(raw[:40]),
                    reason=md_escape(error) or t("a setting of this view"),
                )
            )
    st.session_state[key] = value


def keep_in_url(key: str, url_key: str, default, format=str) -> None:
    """Remember the widget's value for the session and write it to the URL (left out when it is the default)."""
    value = st.session_state.get(key, default)
    st.session_state[f"_{key}"] = value
    address.write_query(**{url_key: None if value == default else format(value)})


def url_widget(draw, label: str, *args, key: str, url_key: str, default, parse, format=str, fit=None, **kwargs):
    """``draw(label, *args, key=key, **kwargs)``, a Streamlit widget (``st.selectbox``, ``column.slider``,
    ...), whose value is kept in the URL as ``?url_key=`` (``url_setting`` before, ``keep_in_url`` after).
    Its starting value comes from there: give ``draw`` no value, index or default of its own. ``fit(value)``:
    the session's value made one the widget offers now (its options or bounds follow the sentence or model)."""
    url_setting(key, url_key, default, parse)
    if fit is not None:
        st.session_state[key] = fit(st.session_state[key])
    value = draw(label, *args, key=key, **kwargs)
    keep_in_url(key, url_key, default, format)
    return value


def url_select(draw, label: str, options, *, key: str, url_key: str, default=None, **kwargs):
    """A selectbox, radio or select slider (``draw``) over ``options`` kept in the URL as ``str(option)``;
    ``default``: the first option unless given."""
    options = list(options)
    default = options[0] if default is None else default
    return url_widget(
        draw,
        label,
        options,
        key=key,
        url_key=url_key,
        default=default,
        parse=address.choice(options),
        fit=lambda value: value if value in options else default,
        **kwargs,
    )


def url_number(draw, label: str, minimum: int, maximum: int, *, key: str, url_key: str, default: int, **kwargs) -> int:
    """A whole-number slider or number input (``draw``) from ``minimum`` to ``maximum`` kept in the URL."""
    return url_widget(
        draw,
        label,
        minimum,
        maximum,
        key=key,
        url_key=url_key,
        default=default,
        parse=address.number(minimum, maximum),
        fit=lambda value: min(max(value, minimum), maximum),
        **kwargs,
    )


def url_multiselect(label: str, options, *, key: str, url_key: str, default: list, container=None, **kwargs) -> list:
    """A multiselect kept in the URL as its choices joined by commas (``address.choices``)."""
    options = list(options)
    return url_widget(
        (container or st).multiselect,
        label,
        options,
        key=key,
        url_key=url_key,
        default=list(default),
        parse=address.choices(options),
        format=address.format_choices,
        fit=lambda values: [value for value in values if value in options],
        **kwargs,
    )


def url_toggle(label: str, key: str, url_key: str, default: bool = False, container=None, **kwargs) -> bool:
    """A toggle whose state is in the URL as ``url_key=1`` / ``0``."""
    return url_widget(
        (container or st).toggle,
        label,
        key=key,
        url_key=url_key,
        default=default,
        parse=address.flag,
        format=address.format_flag,
        **kwargs,
    )


def url_choice(label: str, options: dict[str, str], key: str, url_key: str, container=None, **kwargs) -> str:
    """A segmented control over ``options`` (URL value -> label) kept in the URL; returns the URL value."""
    default = next(iter(options))
    url_setting(key, url_key, default, address.choice(options))
    value = (container or st).segmented_control(label, list(options), format_func=options.get, key=key, **kwargs)
    if value is None:  # a click on the selected option deselects it: keep the choice
        value = st.session_state[key] = st.session_state.get(f"_{key}", default)
    keep_in_url(key, url_key, default)
    return value


def url_text(label: str, *, key: str, url_key: str, default: str, what: str, container=None, **kwargs) -> str:
    """A text box kept in the URL, cut to ``address.MAX_TEXT_CHARS`` with a notice (``limited_text_input``);
    ``what`` names it in the notice ("the second sentence")."""

    def parse(raw: str) -> str:
        if len(raw) > address.MAX_TEXT_CHARS:
            st.warning(
                t(
                    "The link's {what} had {count} characters; the first {kept} are kept.",
                    what=md_escape(what),
                    count=f"{len(raw):,}",
                    kept=f"{address.MAX_TEXT_CHARS:,}",
                )
            )
        return raw[: address.MAX_TEXT_CHARS]

    url_setting(key, url_key, default, parse)
    value = limited_text_input(label, key=key, what=what, container=container, **kwargs)
    keep_in_url(key, url_key, default)
    return value


def view_settings(run, key_prefix: str = "") -> tuple[bool, bool]:
    """What the word-level and hide-special toggles hold (this session's choice, else the link's), before
    they are drawn: a view can be drawn first and its toggles after (``view_toggles`` returns the same)."""
    url_setting(f"{key_prefix}words", f"{key_prefix}words", False, address.flag)
    url_setting(f"{key_prefix}hide_special", f"{key_prefix}hide", False, address.flag)
    words = bool(st.session_state[f"{key_prefix}words"])
    return words, bool(st.session_state[f"{key_prefix}hide_special"]) and bool(np.any(run.special_mask))


def view_toggles(run, container=None, key_prefix: str = "") -> tuple[bool, bool]:
    """The word-level and hide-special toggles (kept in the URL as ``words`` and ``hide``)."""
    where = container or st
    cols = where.columns(2)
    words = url_toggle(
        t("Words instead of tokens"),
        f"{key_prefix}words",
        f"{key_prefix}words",
        container=cols[0],
        help=t("Clark et al. (2019): attention to a word sums over its pieces, attention from a word averages them."),
    )
    has_special = bool(np.any(run.special_mask))
    hide = url_toggle(
        t("Hide special tokens"),
        f"{key_prefix}hide_special",
        f"{key_prefix}hide",
        container=cols[1],
        disabled=not has_special,
        help=t("Drops [CLS], [SEP], BOS, ... and renormalises each row to sum to 1.")
        if has_special
        else t("This text has no special token to hide: this model adds none ([CLS], [SEP] or BOS)."),
    )
    return words, hide and has_special


def clicked_head(chart_key: str) -> tuple[int | None, int] | None:
    """``(layer or None, head)`` of the tile or cell last clicked in a chart drawn with click targets
    (its points carry ``[head]`` or ``[layer, head, ...]`` as customdata); None for no click or a deselect."""
    try:
        custom = st.session_state[chart_key]["selection"]["points"][0]["customdata"]
        if isinstance(custom, dict):  # a typed array comes back as {"0": ..., "1": ...}
            custom = [custom[index] for index in sorted(custom, key=int)]
        custom = custom if isinstance(custom, (list, tuple)) else [custom]
        return (None, int(custom[0])) if len(custom) == 1 else (int(custom[0]), int(custom[1]))
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def select_clicked_head(chart_key: str, then=None) -> None:
    """A chart's ``on_select`` callback: the clicked head becomes the selected layer and head (and the
    URL follows on this run); ``then()`` runs after, e.g. to switch to the view that shows it."""
    clicked = clicked_head(chart_key)
    if clicked is None:
        return
    layer, head = clicked
    if layer is not None:
        set_layer(layer)
    set_head(head)
    if then is not None:
        then()


# ---- heavy work starts on a click ---------------------------------------------------------------------------
STARTED = "_heavy_started"  # the keys of the heavy computations this session has started by hand


def link_may_start(ready: bool) -> bool:
    """Whether a link alone may start a heavy computation (``ui.budget.HEAVY``): on a classroom server only when
    its value is ``ready`` (computed before, by anyone: showing it costs nothing), else it starts on a click and
    the link only holds its settings. One person's own server lets a link start it."""
    return ready or not settings().classroom


def mark_started(key: str) -> None:
    """A control changed by hand (an ``on_change``) counts as the click that starts the heavy work ``key``."""
    st.session_state.setdefault(STARTED, set()).add(key)


def start_button(label: str, *, key: str, ready: bool, help: str | None = None) -> bool:
    """True when the heavy work ``key`` may run now: a link may start it (``link_may_start``), or this session
    started it (this button, or ``mark_started``). Otherwise the button ``label`` is drawn: a click starts it."""
    if link_may_start(ready) or key in st.session_state.get(STARTED, ()):
        return True
    if st.button(label, key=f"{key}_start", type="primary", help=help):
        mark_started(key)
        return True
    st.caption(t("Heavy work on this class's server starts on a click, not from a link; the link keeps its settings."))
    return False
