"""Shared Streamlit controls, drawn the same way on every page: the sidebar, layer and head pickers,
view toggles, charts with offline PNG export, downloads, messages.

Messages quote user input (model names, text) made inert for markdown (``md_escape``) and never show a
server path (``public_message``); an unexpected error is one line, never a traceback (``error_display``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import io
import logging
import re
import unicodedata
from urllib.parse import urlsplit

import numpy as np
import streamlit as st

from mha_core.analysis.alignment import IDENTICAL_ATOL, NoAlignment, layer_difference
from mha_core.errors import EmptyTextError, EngineNotSupported, HeadscopeError, InputTextError, redact_paths
from mha_core.models.tokens import visible_text
from ui import address, figures, headview, state
from ui.jobs import BEAT_S

LOG = logging.getLogger("headscope.app")

INTRO = (
    "**Headscope** shows what every attention head of a transformer does with your sentence. "
    "Each head turns each token (a *query*) into a weighted look at the other tokens (the *keys*); "
    "a heatmap row is one token's attention and sums to 1. Pick a model and type a sentence in the sidebar."
)

FIRST_TEN_MINUTES = """
- **A token** is a piece of text the model reads: a word, or part of one (`##ably` continues the word before
  it), plus markers the model adds, such as `[CLS]` and `[SEP]` or a beginning-of-text token.
- **Each head asks a question of every token.** The token asking is the *query* (a row); the tokens it looks
  at are the *keys* (the columns). A row's weights are how much of its attention the query gives each key;
  they add up to 1. Dark = much attention.
- **Why many heads?** Each head has its own question: one looks at the previous word, one finds a verb's
  subject, many look at nothing in particular. A model combines all their answers; no single head is the
  model's "attention".
- **What is a sink?** Most heads park the attention they do not need on one token of no content (`[CLS]`,
  `[SEP]`, the first token). A head that does that for every query is doing nothing for this sentence.
- **Try it:** click a head in the grid to enlarge it; show it as **Lines** and pick a query token to see
  only its lines; switch to the model view to see every layer at once; the Head roles page names what each head does.
"""

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def md_escape(text: str) -> str:
    """User text made inert for st.markdown/st.caption: markdown and tag characters shown literally."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", str(text))


def public_message(error, typed: str | None = None, limit: int = 600) -> str:
    """A library message made fit for any visitor: no server path (but the folder the user typed),
    cut to ``limit`` characters, markdown made inert."""
    text = redact_paths(str(error), keep=(typed,) if typed else ())
    if len(text) > limit:
        text = text[:limit] + "…"
    return md_escape(text)


@contextlib.contextmanager
def error_display():
    """Show library errors as ``st.error`` and anything unexpected as one short line, never a traceback.

    Streamlit's own control flow (rerun, stop, page switch) derives from BaseException and passes through.
    """
    try:
        yield
    except InputTextError as error:
        st.error(f"This text cannot be read: {public_message(error)}")
    except HeadscopeError as error:
        st.error(public_message(error))
    except Exception as error:  # last resort: the page keeps working, the details go to the server log
        LOG.exception("unexpected error in a page")
        st.error(
            f"Something went wrong ({type(error).__name__}). Try another sentence or model; "
            "the details are in the server log."
        )


def keep_alive() -> None:
    """While this session has work running in threads (a Lab training, a profile nobody waits for), the
    browser renews its heartbeat every second (``state.presence``): the work goes on while the page is
    open, waits when it is not, and ends once the session is gone. Draws nothing."""
    if state.presence().busy:
        st.fragment(run_every=BEAT_S)(_heartbeat)()


def _heartbeat() -> None:
    state.presence().beat()


def show_link_notices() -> None:
    """What was wrong with the link this session was opened with, once, above the page."""
    notices = state.take_link_notices()
    if notices:
        st.warning("This link was changed to work:\n" + "\n".join(f"- {md_escape(n)}" for n in notices))


def explain(text: str) -> None:
    """A short plain-language note for the class, set apart from the numbers."""
    st.info(text, icon=":material/school:")


# ---- the sidebar ------------------------------------------------------------------------------------
SENTENCE_LABEL = "Sentence"  # also ui.browser.SENTENCE_LABEL, which the browser tests type into


def sentence_boxes(place: str = "sidebar") -> None:
    """The sentence box and the optional second sentence (session keys ``text`` and ``pair``), drawn by the
    sidebar or by a page's fragment (``place``: the page's path)."""
    # A widget's identity includes the script that draws it (app.py, or the page): when that changes, the
    # boxes are new widgets, and only what is written to their keys before they are drawn carries over.
    # A run that switched pages before drawing them may also have dropped their keys: the session's copy
    # (``_sentences``) gives them back.
    if st.session_state.get("_sentence_place") != place or "text" not in st.session_state:
        st.session_state["_sentence_place"] = place
        _sentences()
        st.session_state["text"], st.session_state["pair"] = st.session_state["_sentences"]
    limited_text_input(
        SENTENCE_LABEL,
        key="text",
        what="sentence",
        help="Press Enter to run. Long texts are truncated to the model's limit.",
    )
    limited_text_input("Second sentence (encoders only, optional)", key="pair", what="second sentence")


def _cut_to_limit(key: str) -> None:
    """A text box's ``on_change``: a text longer than ``state.MAX_TEXT_CHARS`` is cut, and the length it had
    kept for ``limited_text_input`` to report."""
    text = st.session_state.get(key) or ""
    if len(text) > state.MAX_TEXT_CHARS:
        st.session_state[key] = text[: state.MAX_TEXT_CHARS]
        st.session_state[f"_{key}_cut_from"] = len(text)


def limited_text_input(label: str, *, key: str, what: str, container=None, **kwargs) -> str:
    """A text box that keeps the first ``state.MAX_TEXT_CHARS`` characters of a longer text and says so, as a
    link's text is cut (``max_chars`` would have the browser drop the rest silently). ``what`` names the box."""
    where = container or st
    value = where.text_input(label, key=key, on_change=_cut_to_limit, args=(key,), **kwargs)
    cut_from = st.session_state.pop(f"_{key}_cut_from", None)
    if cut_from:
        where.warning(
            f"The {md_escape(what)} had {cut_from:,} characters; the first {state.MAX_TEXT_CHARS:,} are kept."
        )
    return value


def _sentences() -> tuple[str, str | None]:
    """The sentence and the second sentence (None when blank) as the boxes hold them, or held them last if
    their keys were dropped (Streamlit drops a widget's key when a run does not draw it)."""
    if "text" in st.session_state:
        st.session_state["_sentences"] = (st.session_state["text"], st.session_state.get("pair") or "")
    text, text_pair = st.session_state.setdefault("_sentences", (state.DEFAULT_TEXT, ""))
    return text, text_pair.strip() or None


@contextlib.contextmanager
def sentences_in_page(slot, place: str):
    """For a page's fragment that shows what the sentence decides: takes what the sentence boxes hold into
    the selection and the link, runs the body, then draws the boxes into ``slot`` (their place in the
    sidebar, ``state.sentence_slot()``). Enter in them then reruns that fragment only, not the sidebar and
    the whole page (Explore: about 57 elements re-rendered by the browser on every Enter), and the body's
    elements reach the browser before the boxes'. ``place`` names the page (``sentence_boxes``)."""
    text, text_pair = _sentences()
    state.set_selection(dataclasses.replace(state.selection(), text=text, text_pair=text_pair))
    state.write_query(text=text, pair=text_pair)
    try:
        yield
    finally:
        with slot:
            sentence_boxes(place)


def sidebar(sentence_in_page: bool = False) -> state.Selection:
    """Draw the shared sidebar (app.py, once per run, before the page) and record the selection.

    ``sentence_in_page``: the page draws the sentence boxes into their place in the sidebar from its own
    fragment (``sentences_in_page``), so that Enter reruns only that fragment."""
    state.init_from_query()
    examples = state.load_examples()
    config = state.settings()
    choices = state.model_choices()
    with st.sidebar:
        st.header("Input")
        st.selectbox("Model", list(choices), key="model_choice", format_func=choices.get)
        if st.session_state["model_choice"] == state.OTHER_MODEL:
            where = (
                "the local Hugging Face cache, a folder, or downloaded from the hub"
                if config.allow_downloads
                else "the local Hugging Face cache or a folder; nothing is downloaded"
            )
            st.text_input(
                "Hub id or local folder",
                key="model_other",
                max_chars=state.MAX_MODEL_CHARS,
                placeholder="bert-base-uncased or /path/to/model",
                help=f"Loaded from {where}.",
            )
        st.radio(
            "Engine",
            list(state.ENGINES),
            key="engine",
            format_func=state.ENGINE_LABELS.get,
            horizontal=True,
            help="From-scratch core: every layer recomputed with Headscope's own MultiHeadAttention "
            "from the checkpoint's weights, compared with transformers.",
        )
        if examples:
            st.selectbox(
                "Example sentences",
                range(len(examples)),
                key="example",
                index=None,
                placeholder="Pick an example...",
                on_change=state.apply_example,
                format_func=lambda i: f"{examples[i]['label']}",
            )
            chosen = st.session_state.get("example")
            if chosen is not None and 0 <= chosen < len(examples):
                st.caption(f":material/lightbulb: {md_escape(examples[chosen]['shows'])}")
        if sentence_in_page:
            # The page draws the sentence boxes here from its own fragment (``sentences_in_page``).
            state.set_sentence_slot(st.container())
        else:
            state.set_sentence_slot(None)
            sentence_boxes()
        bos_slot = st.empty()  # filled once the model is known: only decoders with a BOS token have the choice
        url_toggle(
            "Presentation mode",
            "present",
            "present",
            help="Large text and labels for a projector; the link keeps it on for everyone who opens it.",
        )

    wanted = st.session_state["model_choice"]
    if wanted == state.OTHER_MODEL:
        wanted = (st.session_state.get("model_other") or "").strip() or st.session_state.get(
            "_last_good_model", state.DEFAULT_MODEL
        )
    model, error = state.use_model(wanted)
    if error is not None:
        message = public_message(error, wanted)
        with st.sidebar:
            st.error(message)
            if model:
                st.info(f"Still showing the previous model, {md_escape(model)}.")
        # Also where the user looks: above the page, not below the fold of the sidebar.
        st.error(f"{message}" + (f" Still showing {md_escape(model)}." if model else ""), icon=":material/error:")
    bos = None
    if model:
        loaded = state.get_model(model)
        if loaded.bos_token:
            bos = url_toggle(
                f"Begin with {loaded.bos_token}",
                "bos",
                "bos",
                default=True,
                container=bos_slot,
                help="Decoders put much of their attention on whatever comes first (an attention "
                "sink). A BOS token gives that attention a place that is not a word of your text.",
            )
    text, text_pair = _sentences()
    selection = state.Selection(model=model, engine=st.session_state["engine"], text=text, text_pair=text_pair, bos=bos)
    state.write_query(
        model=wanted if len(wanted) <= state.MAX_MODEL_CHARS else None,
        engine=selection.engine if selection.engine != "transformers" else None,
        text=selection.text,
        pair=selection.text_pair,
    )
    state.set_selection(selection)
    return selection


def class_link() -> str:
    """The link students open: the one the server was started with (``scripts/app.sh --classroom``
    prints and sets it), else the address this browser used, without its query."""
    link = state.settings().class_link
    if link:
        return link
    url = urlsplit(st.context.url or "")
    return f"{url.scheme}://{url.netloc}/" if url.netloc else ""


def qr_png(text: str, scale: int = 8) -> bytes:
    """A QR code of ``text`` as PNG bytes (drawn on the server: nothing is fetched by the browser)."""
    import segno

    buffer = io.BytesIO()
    segno.make(text, error="m").save(buffer, kind="png", scale=scale, border=2)
    return buffer.getvalue()


def join_class_panel(expanded: bool = False, width: int = 220) -> None:
    """The class link and its QR code, for a projector (classroom mode)."""
    link = class_link()
    if not link:
        return
    with st.sidebar.expander("Join this class", expanded=expanded, icon=":material/qr_code_2:"):
        st.image(qr_png(link), width=width, caption="Scan to open Headscope")
        st.code(link, language=None)


# ---- the run of the selection -------------------------------------------------------------------------
def current_model():
    """The model in use, or None (after an ``st.error``) when none could be loaded."""
    selection = state.selection()
    if not selection.model:
        st.error("No model could be loaded. Pick one of the embedded models in the sidebar.")
        return None
    with error_display():
        return state.get_model(selection.model)
    return None


EMPTY_TEXT_NOTICE = "Type a sentence in the sidebar (or pick an example) and press Enter."


def run_for(
    model: str, engine: str, text: str, text_pair: str | None = None, *, notices: bool = True, bos: bool | None = None
):
    """A run, or None after a clear message. Shows the truncation notice and engine fallbacks."""
    if not model:
        st.error("No model could be loaded. Pick one of the embedded models in the sidebar.")
        return None
    if not visible_text(text or ""):
        st.info(EMPTY_TEXT_NOTICE)
        return None
    loaded = state.get_model(model)
    if text_pair and not visible_text(text_pair):
        text_pair = None
    if text_pair and loaded.is_causal:
        if notices:
            st.info("A second sentence applies to encoder models only; this decoder reads the first sentence alone.")
        text_pair = None
    try:
        run = _run_or_fallback(model, engine, text, text_pair, bos)
    except EmptyTextError as error:
        # Text the tokenizer drops whole (accents or marks alone, control characters) is empty text.
        if error.what != "pair text":
            st.info(EMPTY_TEXT_NOTICE)
            return None
        if notices:
            st.info(f"The second sentence holds nothing {md_escape(model)} reads; it reads the first sentence alone.")
        run = _run_or_fallback(model, engine, text, None, bos)
    if notices and run.truncated:
        st.warning(
            f"The text has {run.num_input_tokens} tokens; {md_escape(model)} reads at most {run.num_tokens}, "
            f"so only the first {run.num_tokens} are shown."
        )
    if notices:
        for warning in loaded.warnings:
            st.caption(f":material/warning: {public_message(warning, model)}")
    return run


def _run_or_fallback(model: str, engine: str, text: str, text_pair: str | None, bos: bool | None):
    """``state.get_run``; an engine that cannot replay this model falls back to transformers, with a warning."""
    try:
        return state.get_run(model, engine, text, text_pair, bos)
    except EngineNotSupported as error:
        st.warning(f"{public_message(error)} Showing the transformers engine instead.")
        return state.get_run(model, "transformers", text, text_pair, bos)


def current_run(notices: bool = True):
    """The run for the sidebar's selection, or None after a clear ``st.error`` / ``st.info``."""
    selection = state.selection()
    with error_display():
        return run_for(
            selection.model, selection.engine, selection.text, selection.text_pair, notices=notices, bos=selection.bos
        )
    return None


# ---- layer and head pickers -----------------------------------------------------------------------
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


# The page-wide layer and head: read from the link when the session starts (``state.init_from_query``), so any
# page that opens first shows them; always in the URL.
SHARED_INDEX_KEYS = ("layer", "head")


def _index_from_link(key: str, url_key: str, noun: str) -> int | None:
    """The number the link gives an index selector, once: when this session has no value of its own for it."""
    if key in SHARED_INDEX_KEYS:
        return state.link_index(key)
    raw = state.query_value(url_key)
    if raw is None or key in st.session_state or f"_{key}" in st.session_state:
        return None
    try:
        return address.whole_number(raw)
    except ValueError as error:
        st.warning(f"The link's {url_key}={md_escape(raw[:40])} is not a {noun} number ({error}); using the default.")
        return None


def _select_index(
    count: int, noun: str, *, label: str, key: str, url_key: str | None, container=None, default: int = 0, draw: bool
) -> int:
    stored = f"_{key}"  # survives pages where the widget is not drawn
    url_key = url_key or key
    from_link = _index_from_link(key, url_key, noun)
    if from_link is not None and from_link >= count:
        st.warning(
            f"The link asks for {noun} {from_link}, but this model has {count} ({noun}s 0 to {count - 1}); "
            f"showing {noun} {count - 1}."
        )
    if from_link is not None:
        start = from_link
    else:
        start = st.session_state[key] if key in st.session_state else st.session_state.get(stored, default)
    st.session_state[key] = _clamped(start, count)
    if count > 1 and draw:
        (container or st).select_slider(label, options=list(range(count)), key=key)
    value = int(st.session_state[key])
    st.session_state[stored] = value
    shared = key in SHARED_INDEX_KEYS
    state.write_query(**{url_key: value if shared or value != _clamped(default, count) else None})
    return value


def set_head(head: int) -> None:
    """Select a head from code (e.g. a click on a chart); takes effect on the next rerun."""
    st.session_state["_head"] = int(head)
    st.session_state["head"] = int(head)


def set_layer(layer: int) -> None:
    """Select a layer from code; takes effect on the next rerun."""
    st.session_state["_layer"] = int(layer)
    st.session_state["layer"] = int(layer)


# ---- views of a run ------------------------------------------------------------------------------
def chart_config(filename: str) -> dict:
    """Plotly config: PNG export from the modebar (drawn in the browser, no server, no CDN)."""
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": filename, "scale": 2},
        "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
    }


PRESENTATION_SCALE = 1.6  # text in presentation mode: 9 px tick labels become 14 px, readable from the back row


def presenting() -> bool:
    """Presentation mode (the sidebar toggle, ``?present=1``): large text for a projector."""
    return bool(st.session_state.get("present"))


PRESENTATION_CSS = """<style>
  [data-testid="stMain"] p, [data-testid="stMain"] li, [data-testid="stMain"] label,
  [data-testid="stCaptionContainer"], [data-testid="stMarkdownContainer"] p { font-size: 1.35rem !important; }
  [data-testid="stMain"] h1 { font-size: 3rem !important; }
  [data-testid="stMain"] h2 { font-size: 2.3rem !important; }
  [data-testid="stMain"] h3 { font-size: 1.9rem !important; }
</style>"""


def presentation_styles() -> None:
    """Larger page text in presentation mode (a fixed style sheet: no user text reaches it)."""
    if presenting():
        st.html(PRESENTATION_CSS)


def show_chart(fig, key: str, filename: str | None = None, **kwargs):
    """``st.plotly_chart`` with Headscope's colours kept (no Streamlit theme), PNG export configured, and
    every text enlarged in presentation mode."""
    if presenting():
        figures.enlarge_text(fig, PRESENTATION_SCALE)
    return st.plotly_chart(fig, key=key, theme=None, config=chart_config(filename or key), width="stretch", **kwargs)


# ---- settings kept in the URL ----------------------------------------------------------------------
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
    raw = state.query_value(url_key)
    value = default
    if raw is not None:
        try:
            value = parse(raw)
        except ValueError as error:
            st.warning(
                f"The link's {url_key}={md_escape(raw[:40])} is not {md_escape(error) or 'a setting of this view'}; "
                "using the default."
            )
    st.session_state[key] = value


def keep_in_url(key: str, url_key: str, default, format=str) -> None:
    """Remember the widget's value for the session and write it to the URL (left out when it is the default)."""
    value = st.session_state.get(key, default)
    st.session_state[f"_{key}"] = value
    state.write_query(**{url_key: None if value == default else format(value)})


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
    """A text box kept in the URL, cut to ``state.MAX_TEXT_CHARS`` with a notice (``limited_text_input``);
    ``what`` names it in the notice ("the second sentence")."""

    def parse(raw: str) -> str:
        if len(raw) > state.MAX_TEXT_CHARS:
            st.warning(
                f"The link's {md_escape(what)} had {len(raw):,} characters; the first {state.MAX_TEXT_CHARS:,} are kept."
            )
        return raw[: state.MAX_TEXT_CHARS]

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
        "Words instead of tokens",
        f"{key_prefix}words",
        f"{key_prefix}words",
        container=cols[0],
        help="Clark et al. (2019): attention to a word sums over its pieces, attention from a word averages them.",
    )
    has_special = bool(np.any(run.special_mask))
    hide = url_toggle(
        "Hide special tokens",
        f"{key_prefix}hide_special",
        f"{key_prefix}hide",
        container=cols[1],
        disabled=not has_special,
        help="Drops [CLS], [SEP], BOS, ... and renormalises each row to sum to 1."
        if has_special
        else "This text has no special token to hide: this model adds none ([CLS], [SEP] or BOS).",
    )
    return words, hide and has_special


def shaped_run(run, words: bool, hide_special: bool):
    """The run as the toggles ask (word level first, then without special tokens), cached with the run
    (and so counted in the server's memory budget)."""

    def shape():
        shaped = run.to_words() if words else run
        return shaped.without_special() if hide_special and np.any(shaped.special_mask) else shaped

    if not (words or hide_special):
        return run
    # Reshaping peaks at about twice the run's attention (measured: 540 MB for a 270 MB SmolLM2 run).
    return state.computed_from(run, f"shaped:{int(words)}{int(hide_special)}", shape, 2 * run.attentions.nbytes)


def figure_options(run) -> dict:
    """Causal mask and sentence-pair boundary for a run's figures."""
    segments = run.segment_ids if np.any(run.segment_ids != run.segment_ids[0]) else None
    return {"causal": bool(run.is_causal), "segment_ids": segments}


# Cells a figure may send to the browser (4 bytes each): the layer x head grid of MiniLM at 128 tokens
# is 1.18 M cells. Larger runs show their first tokens only, with a notice, so a view stays fast.
MODEL_VIEW_MAX_CELLS = headview.ALL_LAYERS_MAX_CELLS  # so the model view always has every layer

HEAD_VIEW_MAX_CELLS = 800_000


def token_limit(max_cells: int, num_tiles: int) -> int:
    """How many tokens ``num_tiles`` tiles of n x n may have within ``max_cells`` (at least 8)."""
    return max(8, int((max_cells / max(num_tiles, 1)) ** 0.5))


def first_tokens(
    run, max_cells: int, num_tiles: int, what: str, rest: str = "the one-head view and the downloads have them all"
):
    """The run cut to its first k tokens so that ``num_tiles`` tiles of k x k fit in ``max_cells``; the
    notice says where the rest is (``rest``)."""
    limit = token_limit(max_cells, num_tiles)
    if run.num_tokens <= limit:
        return run
    st.caption(f"The {what} shows the first {limit} of {run.num_tokens} tokens, to stay fast in the browser; {rest}.")
    keep = slice(0, limit)
    return dataclasses.replace(
        run,
        attentions=run.attentions[:, :, keep, keep],
        tokens=run.tokens[keep],
        raw_tokens=run.raw_tokens[keep],
        special_mask=run.special_mask[keep],
        word_ids=run.word_ids[keep],
        segment_ids=run.segment_ids[keep],
    )


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


def head_view(run, layer: int, key: str, columns: int = 4, width_hint: int = 1000, on_click=None, colorbar=True):
    """All heads of one layer as one figure; a click on a head calls ``on_click`` (a selection callback).
    ``colorbar=False`` where a chart beside it shows the same colour scale (Explore's enlarged head)."""
    run = first_tokens(run, HEAD_VIEW_MAX_CELLS, run.num_heads, "head view")
    fig = figures.head_grid(
        run.attentions[layer],
        run.tokens,
        columns=columns,
        width_hint=width_hint,
        title=f"Layer {layer}: all {run.num_heads} heads",
        colorbar=colorbar,
        **figure_options(run),
    )
    selectable = {"on_select": on_click, "selection_mode": "points"} if on_click else {}
    return show_chart(fig, key=key, filename=f"headscope-layer{layer}-heads", **selectable)


def attention_view(run, view: str, layer: int, head: int, key: str, shape: str = "heatmap", on_pick=None):
    """Explore's head view or model view (``view``), drawn in the browser (``ui.headview``): the layer slider,
    a click on a head and the switches between the views and the head's shapes redraw there at once; the
    layer and head selection follows here (and in the link) on the next rerun, and ``on_pick(pick)`` gets
    the rest of the visitor's pick (``view`` and ``shape``)."""
    per_layer = token_limit(HEAD_VIEW_MAX_CELLS, run.num_heads)
    whole = token_limit(MODEL_VIEW_MAX_CELLS, run.num_layers * run.num_heads)
    if view == "model":
        shown = first_tokens(run, MODEL_VIEW_MAX_CELLS, run.num_layers * run.num_heads, "model view")
    else:
        shown = first_tokens(
            run, HEAD_VIEW_MAX_CELLS, run.num_heads, "head view", rest="the Lines view and the downloads have them all"
        )
    options = figure_options(shown)
    data = headview.pack(
        shown.attentions,
        shown.tokens,
        layer,
        head,
        causal=options["causal"],
        segment_ids=options["segment_ids"],
        shape=shape,
        text_scale=PRESENTATION_SCALE if presenting() else 1.0,
        view=view,
        switchable=min(run.num_tokens, per_layer) == min(run.num_tokens, whole),
    )

    def picked(pick: dict) -> None:
        set_layer(pick["layer"])
        set_head(pick["head"])
        if on_pick is not None:
            on_pick(pick)

    return headview.show(data, key=key, on_pick=picked)


def _listed(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def alignment_note(difference) -> str:
    """What a difference map compares, in words: position by position or word by word, which positions hold
    different tokens, which words the two tokenizers cut differently, and whether heads were averaged."""
    alignment = difference.alignment
    notes = []
    if alignment.level == "token" and alignment.differing:
        positions = [f"{i} ({md_escape(alignment.labels[i])})" for i in alignment.differing]
        notes.append(
            f"Compared position by position (both have {alignment.num_units} tokens). "
            f"{'Positions' if len(positions) > 1 else 'Position'} {_listed(positions)} "
            f"{'hold' if len(positions) > 1 else 'holds'} different tokens on the two sides (left | right): "
            "there the rows and columns compare different words."
        )
    elif alignment.level == "word":
        notes.append(
            f"The two runs cut the text into different tokens, so they are compared word by word, over the "
            f"{alignment.num_units} words they share: attention to a word sums its tokens', a word's attention "
            "averages its tokens'. Special tokens are left out and every row is rescaled to sum to 1 over these "
            "words."
        )
        if alignment.merged:
            merged = [f"*{md_escape(alignment.labels[u])}*" for u in alignment.merged]
            notes.append(f"{_listed(merged)}: one unit each, because the tokenizers cut them differently.")
    if difference.head_averaged:
        left, right = difference.heads
        counts = f"{left} heads against {right}" if left != right else f"even with {left} heads each"
        notes.append(
            f"Heads of two different models do not correspond one to one ({counts}), so this is the difference "
            "of each layer's average over its heads."
        )
    return " ".join(notes)


# Differences below this are the size of float32 rounding between two exact computations of one model
# (the from-scratch engine against transformers: about 1e-6 after six layers).
ROUNDING_SIZE = 1e-4


def difference_view(
    left_run, right_run, left_layer: int, right_layer: int, key: str, titles: tuple[str, str], title: str | None = None
) -> bool:
    """One layer of each run as one difference map (left minus right) on a fixed colour scale, over the tokens
    or words both share (``mha_core.analysis.alignment``), with a note on what was compared; "identical within 1e-6"
    instead of a map of rounding. False (and a notice) where no token or word of one stands for one of the
    other: the caller shows the two side by side. ``title``: the map's own title (default: the two layers)."""
    try:
        difference = layer_difference(left_run, right_run, left_layer, right_layer)
    except NoAlignment as error:
        st.info(f"{public_message(error)} They are shown side by side.")
        return False
    st.markdown(f"**{md_escape(titles[0])} − {md_escape(titles[1])}**")
    note = alignment_note(difference)
    if note:
        st.caption(note)
    if difference.identical:
        st.success(
            f"Identical within {IDENTICAL_ATOL:.0e}".replace("e-0", "e-")
            + f": the largest difference of any weight is {difference.largest:.1e}, float32 rounding, so there is "
            "no map to draw."
        )
        return True
    alignment = difference.alignment
    values, labels = difference.values, alignment.labels
    limit = token_limit(HEAD_VIEW_MAX_CELLS, values.shape[0])
    if len(labels) > limit:
        st.caption(f"The difference map shows the first {limit} of {len(labels)} units, to stay fast in the browser.")
        values, labels = values[:, :limit, :limit], labels[:limit]
    same_positions = alignment.level == "token"
    causal = bool(left_run.is_causal and right_run.is_causal)
    pair = figure_options(left_run)["segment_ids"] if same_positions else None
    fig = figures.difference_map(
        values,
        labels,
        title=title
        or f"Layer {left_layer} − layer {right_layer}, "
        + ("the average of the heads" if difference.head_averaged else "every head"),
        head_averaged=difference.head_averaged,
        causal=causal,
        segment_ids=None if pair is None else pair[: len(labels)],
    )
    show_chart(fig, key=key, filename="headscope-difference")
    rounding = " (float32 rounding: white on this scale)" if difference.largest < ROUNDING_SIZE else ""
    st.caption(
        f"Largest difference: {difference.largest:.2e}{rounding}. Colours on a fixed scale, −1 to 1 (the most two "
        "weights can differ): red where the left attends more, blue where the right does."
    )
    return True


SLUG_CHARS = 40  # a file name's share of the text: about the first six words


def slug(text: str, limit: int = SLUG_CHARS) -> str:
    """``text`` as a short, safe piece of a file name: ASCII letters and digits joined by single dashes,
    cut at a word boundary within ``limit`` characters ("The cat sat." -> "the-cat-sat"); empty when the
    text has no such characters (a sentence in Chinese, say)."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    kept = ""
    for word in words:
        candidate = f"{kept}-{word}" if kept else word
        if len(candidate) > limit:
            break
        kept = candidate
    return kept or (words[0][:limit] if words else "")


def model_slug(name: str) -> str:
    """A model's name in a file name: its last path part (a folder is not shown whole), slugged."""
    return slug(str(name).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]) or "model"


def download_name(run, suffix: str, layer: int | None = None, head: int | None = None) -> str:
    """A download's file name from what it holds, ``headscope-<model>[-core][-words][-no-special]-<text>``
    ``[-layerL][-headH]`` and ``suffix`` (".npz"); a text with no Latin letters or digits is named by a short
    digest of it ("text-1a2b3c4d")."""
    text = " ".join(t for t in (run.text, run.text_pair) if t)
    parts = ["headscope", model_slug(run.model_name)]
    if run.engine not in ("transformers", "toy"):
        parts.append(run.engine)
    if run.level == "word":
        parts.append("words")
    if run.metadata.get("special_tokens_removed"):
        parts.append("no-special")
    parts.append(slug(text) or "text-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:8])
    if layer is not None:
        parts.append(f"layer{layer}")
    if head is not None:
        parts.append(f"head{head}")
    return "-".join(parts) + suffix


def downloads(run, layer: int, head: int, key_prefix: str = "") -> None:
    """The whole run as .npz and the selected head as CSV, named by model, text, layer and head; both built
    only when clicked, by callables that do not hold the run (``state.deferred``: Streamlit keeps them as long
    as the session)."""
    cols = st.columns(2)
    cols[0].download_button(
        "Attention tensor (.npz)",
        data=state.deferred(run, lambda view: view.to_npz_bytes()),
        file_name=download_name(run, ".npz"),
        mime="application/octet-stream",
        key=f"{key_prefix}dl_npz",
        help=f"All {run.num_layers} x {run.num_heads} heads, tokens and masks; load with mha_core.AttentionRun.load.",
    )

    def head_csv(view) -> bytes:
        buffer = io.StringIO()
        view.head_frame(layer, head).to_csv(buffer, float_format="%.6g")
        return buffer.getvalue().encode("utf-8")

    cols[1].download_button(
        f"Layer {layer} head {head} weights (.csv)",
        data=state.deferred(run, head_csv),
        file_name=download_name(run, ".csv", layer=layer, head=head),
        mime="text/csv",
        key=f"{key_prefix}dl_csv",
    )


def engine_note(run) -> None:
    """For the from-scratch engine: how closely it matches transformers."""
    if run.engine == "core" and run.max_abs_diff is not None:
        match = (
            "exactly (largest difference 0)"
            if run.max_abs_diff == 0
            else f"to {run.max_abs_diff:.1e} (largest absolute difference over every layer, head and weight)"
        )
        st.success(f"{run.model_name}: the from-scratch engine matches transformers {match}.")


def layer_source_code(family: str) -> str | None:
    """The from-scratch engine's own code for ``family``: its layer function and the helpers it calls,
    as the family registry names them; None for a family the engine does not replay."""
    from mha_core.engine.registry import FAMILIES

    entry = FAMILIES.get(family)
    if entry is None:
        return None
    return "\n\n".join(inspect.getsource(function) for function in (entry.layer, *entry.helpers))


# Per-layer curves show these measurements (numeric columns of mha_core.head_metrics).
CURVE_METRICS = {
    "normalized_entropy": "normalised entropy (0 = one key, 1 = uniform)",
    "mean_distance": "mean distance |i - j| in tokens",
    "confidence": "confidence (largest weight of a row)",
    "special_mass": "attention on special tokens",
    "prev_token_mass": "attention on the previous token",
    "local_mass": "attention within two tokens",
}
