"""The shared sidebar (model, engine, sentence, examples, presentation mode), the class link, and the run of
the sidebar's selection (``current_run``) that most pages show.

A page sees only the inputs it reads (app.py's ``PAGES`` declares them, one line per page): the Classroom's toy
numbers read none, Circuits' own prompts read the model only. An input a page does not show keeps its value
for the pages that do (and in the link). The second sentence shows only for a model that reads one (an encoder)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from urllib.parse import urlsplit

import streamlit as st

from mha_core.errors import EmptyTextError, EngineNotSupported, HeadscopeError
from mha_core.models import DEFAULT_MODEL, ENGINES
from mha_core.models.tokens import visible_text
from ui import address, computations, compute, i18n, session
from ui.i18n import t
from ui.jobs import BEAT_S
from ui.settings import ENGINE_LABELS, OTHER_MODEL, model_choices, settings
from ui.widgets.messages import error_display, md_escape, public_message
from ui.widgets.pickers import limited_text_input, url_select, url_toggle


def keep_alive() -> None:
    """While this session has work running in threads (a Lab training, a profile nobody waits for), the
    browser renews its heartbeat every second (``session.presence``): the work goes on while the page is
    open, waits when it is not, and ends once the session is gone. Draws nothing."""
    if session.presence().busy:
        st.fragment(run_every=BEAT_S)(_heartbeat)()


def _heartbeat() -> None:
    session.presence().beat()


_LEFT_ENGLISH = "_lang_switched"  # this session has shown another language: the page's lang follows it since


def language_switch() -> str:
    """The interface's language (``ui.i18n``): a radio "English / 中文" kept in the address (``lang=zh``), and the
    page's ``<html lang>`` set to match, so that a screen reader speaks Chinese as Chinese. Returns the language."""
    lang = url_select(
        st.radio,
        i18n.LANGUAGE_LABEL,
        list(i18n.LANGUAGES),
        key=i18n.LANG_KEY,
        url_key=i18n.LANG_KEY,
        format_func=i18n.LANGUAGES.get,
        horizontal=True,
    )
    # A fixed script (no user text): the server sets the first paint's lang from the link (``ui.server``); this
    # keeps it right after a switch, which does not reload the page. A session that never left English has the
    # page's own lang, and no script.
    if lang != "en" or st.session_state.get(_LEFT_ENGLISH):
        st.session_state[_LEFT_ENGLISH] = True
        st.html(
            f"<script>document.documentElement.lang='{i18n.HTML_LANG[lang]}'</script>", unsafe_allow_javascript=True
        )
    return lang


SENTENCE_LABEL = "Sentence"  # also tools.browser.SENTENCE_LABEL, which the browser tests type into


# What a page may read from the sidebar; app.py's PAGES says which of them each page reads.
MODEL, ENGINE, SENTENCE = "model", "engine", "sentence"
INPUTS = (MODEL, ENGINE, SENTENCE)
# The session keys of each input's widgets: kept when the page does not draw them (Streamlit drops the value of
# a widget a run does not draw).
_INPUT_KEYS = {MODEL: ("model_choice", "model_other"), ENGINE: ("engine",), SENTENCE: ("example", "bos")}


def _keep_undrawn(inputs) -> None:
    """Inputs this page does not draw keep their values for the pages that do: a value written back by the script
    is the session's own, not a widget's, and outlives a run that does not draw its widget."""
    for name, keys in _INPUT_KEYS.items():
        if name in inputs:
            continue
        for key in keys:
            if key in st.session_state:
                st.session_state[key] = st.session_state[key]


def reads_pair(model: str | None) -> bool:
    """True for a model that reads a second sentence (an encoder); a decoder and an encoder-decoder do not."""
    if not model:
        return False
    try:
        loaded = compute.get_model(model)
    except HeadscopeError:
        return False
    return not loaded.is_causal and not getattr(loaded, "is_encoder_decoder", False)


def sentence_boxes(place: str = "sidebar", pair: bool = True) -> None:
    """The sentence box and, where the model reads one (``pair``), the second sentence (session keys ``text`` and
    ``pair``), drawn by the sidebar or by a page's fragment (``place``: the page's path)."""
    # A widget's identity includes the script that draws it (app.py, or the page): when that changes, the
    # boxes are new widgets, and only what is written to their keys before they are drawn carries over.
    # A run that switched pages before drawing them may also have dropped their keys: the session's copy
    # (``_sentences``) gives them back.
    if st.session_state.get("_sentence_place") != place or "text" not in st.session_state:
        st.session_state["_sentence_place"] = place
        _sentences()
        st.session_state["text"], st.session_state["pair"] = st.session_state["_sentences"]
    limited_text_input(
        t(SENTENCE_LABEL),
        key="text",
        what="sentence",
        help=t("Press Enter to run. Long texts are truncated to the model's limit."),
    )
    if pair:
        limited_text_input(t("Second sentence (encoders only, optional)"), key="pair", what="second sentence")
    elif "pair" in st.session_state:
        st.session_state["pair"] = st.session_state["pair"]  # kept for a model that reads it


def _sentences() -> tuple[str, str | None]:
    """The sentence and the second sentence (None when blank) as the boxes hold them, or held them last if
    their keys were dropped (Streamlit drops a widget's key when a run does not draw it)."""
    if "text" in st.session_state:
        st.session_state["_sentences"] = (st.session_state["text"], st.session_state.get("pair") or "")
    text, text_pair = st.session_state.setdefault("_sentences", (address.DEFAULT_TEXT, ""))
    return text, text_pair.strip() or None


@contextlib.contextmanager
def sentences_in_page(slot, place: str):
    """For a page's fragment that shows what the sentence decides: takes what the sentence boxes hold into
    the selection and the link, draws the boxes into ``slot`` (their place in the sidebar,
    ``session.sentence_slot()``), then runs the body. Enter in them then reruns that fragment only, not the
    sidebar and the whole page (Explore: about 57 elements re-rendered by the browser on every Enter). The boxes
    come first: drawn after the body, they appeared only once its first run had finished, seconds after the
    page, and pushed the sidebar below them down. ``place`` names the page (``sentence_boxes``)."""
    text, text_pair = _sentences()
    pair = reads_pair(session.selection().model)
    text_pair = text_pair if pair else None
    session.set_selection(dataclasses.replace(session.selection(), text=text, text_pair=text_pair))
    address.write_query(text=text, pair=text_pair)
    with slot:
        sentence_boxes(place, pair=pair)
    yield


def sidebar(sentence_in_page: bool = False, inputs=INPUTS) -> session.Selection:
    """Draw the shared sidebar (app.py, once per run, before the page) and record the selection.

    ``inputs``: which of ``INPUTS`` this page reads (the others are not drawn, and keep their values).
    ``sentence_in_page``: the page draws the sentence boxes into their place in the sidebar from its own
    fragment (``sentences_in_page``), so that Enter reruns only that fragment."""
    address.init_from_query()
    _keep_undrawn(inputs)
    examples = session.load_examples() if SENTENCE in inputs else []
    config = settings()
    choices = model_choices()
    bos_slot = None
    with st.sidebar:
        # The language and the display's switches sit above the inputs: drawn before the sentence boxes' slot,
        # which the page's fragment fills later, so that nothing drawn under that slot moves when the boxes arrive.
        language_switch()
        url_toggle(
            t("Presentation mode"),
            "present",
            "present",
            help=t("Large text and labels for a projector; the link keeps it on for everyone who opens it."),
        )
        url_toggle(
            t("High contrast"),
            "contrast",
            "contrast",
            help=t("Black text and thicker lines for a washed-out projector; the link keeps it on too."),
        )
        if inputs:
            st.header(t("Input"))
        if MODEL in inputs:
            shown = {name: t(words) for name, words in choices.items()}
            st.selectbox(t("Model"), list(choices), key="model_choice", format_func=shown.get)
            if st.session_state["model_choice"] == OTHER_MODEL:
                where = (
                    t("Loaded from the local Hugging Face cache, a folder, or downloaded from the hub.")
                    if config.allow_downloads
                    else t("Loaded from the local Hugging Face cache or a folder; nothing is downloaded.")
                )
                st.text_input(
                    t("Hub id or local folder"),
                    key="model_other",
                    max_chars=address.MAX_MODEL_CHARS,
                    placeholder=t("bert-base-uncased or /path/to/model"),
                    help=where,
                )
        wanted = _wanted_model()
        model, error = (
            compute.use_model(wanted) if MODEL in inputs else (st.session_state.get("_last_good_model"), None)
        )
        if ENGINE in inputs:
            st.radio(
                t("Engine"),
                list(ENGINES),
                key="engine",
                format_func={engine: t(words) for engine, words in ENGINE_LABELS.items()}.get,
                horizontal=True,
                help=t(
                    "From-scratch core: every layer recomputed with Headscope's own MultiHeadAttention "
                    "from the checkpoint's weights, compared with transformers."
                ),
            )
        if SENTENCE in inputs:
            if examples:
                st.selectbox(
                    t("Example sentences"),
                    range(len(examples)),
                    key="example",
                    index=None,
                    placeholder=t("Pick an example..."),
                    on_change=session.apply_example,
                    format_func=lambda i: f"{examples[i]['label']}",
                )
                chosen = st.session_state.get("example")
                if chosen is not None and 0 <= chosen < len(examples):
                    st.caption(f":material/lightbulb: {md_escape(examples[chosen]['shows'])}")
            if sentence_in_page:
                # The page draws the sentence boxes here from its own fragment (``sentences_in_page``).
                session.set_sentence_slot(st.container())
            else:
                session.set_sentence_slot(None)
                sentence_boxes(pair=reads_pair(model))
            bos_slot = st.empty()  # filled once the model is known: only decoders with a BOS token have the choice
        else:
            session.set_sentence_slot(None)

    if error is not None:
        message = public_message(error, wanted)
        with st.sidebar:
            st.error(message)
            if model:
                st.info(t("Still showing the previous model, {model}.", model=md_escape(model)))
        # Also where the user looks: above the page, not below the fold of the sidebar.
        still = " " + t("Still showing {model}.", model=md_escape(model)) if model else ""
        st.error(message + still, icon=":material/error:")
    bos = None
    if model and bos_slot is not None:
        loaded = compute.get_model(model)
        if loaded.bos_token:
            bos = url_toggle(
                t("Begin with {token}", token=loaded.bos_token),
                "bos",
                "bos",
                default=True,
                container=bos_slot,
                help=t(
                    "Decoders put much of their attention on whatever comes first (an attention "
                    "sink). A BOS token gives that attention a place that is not a word of your text."
                ),
            )
    text, text_pair = _sentences()
    if SENTENCE in inputs and not sentence_in_page and not reads_pair(model):
        text_pair = None
    selection = session.Selection(
        model=model or "",
        engine=st.session_state.get("engine", "transformers"),
        text=text,
        text_pair=text_pair,
        bos=bos,
    )
    address.write_query(
        model=wanted if len(wanted) <= address.MAX_MODEL_CHARS else None,
        engine=selection.engine if selection.engine != "transformers" else None,
        text=selection.text,
        pair=selection.text_pair,
    )
    session.set_selection(selection)
    return selection


def _wanted_model() -> str:
    wanted = st.session_state.get("model_choice", DEFAULT_MODEL)
    if wanted == OTHER_MODEL:
        wanted = (st.session_state.get("model_other") or "").strip() or st.session_state.get(
            "_last_good_model", DEFAULT_MODEL
        )
    return wanted


def class_link() -> str:
    """The link students open: the one the server was started with (``scripts/app.sh --classroom``
    prints and sets it), else the address this browser used, without its query."""
    link = settings().class_link
    if link:
        return link
    url = urlsplit(st.context.url or "")
    return f"{url.scheme}://{url.netloc}/" if url.netloc else ""


def qr_png(text: str, scale: int = 8) -> bytes:
    """A QR code of ``text`` as PNG bytes (drawn on the server: nothing is fetched by the browser)."""
    import segno  # segno: the QR code, drawn only in classroom mode

    buffer = io.BytesIO()
    segno.make(text, error="m").save(buffer, kind="png", scale=scale, border=2)
    return buffer.getvalue()


def join_class_panel(expanded: bool = False, width: int = 220) -> None:
    """The class link and its QR code, for a projector (classroom mode)."""
    link = class_link()
    if not link:
        return
    with st.sidebar.expander(t("Join this class"), expanded=expanded, icon=":material/qr_code_2:"):
        st.image(qr_png(link), width=width, caption=t("Scan to open Headscope"))
        st.code(link, language=None)


def current_model():
    """The model in use, or None (after an ``st.error``) when none could be loaded."""
    selection = session.selection()
    if not selection.model:
        st.error(t("No model could be loaded. Pick one of the embedded models in the sidebar."))
        return None
    with error_display():
        return compute.get_model(selection.model)
    return None


EMPTY_TEXT_NOTICE = "Type a sentence in the sidebar (or pick an example) and press Enter."


def run_for(
    model: str, engine: str, text: str, text_pair: str | None = None, *, notices: bool = True, bos: bool | None = None
):
    """A run, or None after a clear message. Shows the truncation notice and engine fallbacks."""
    if not model:
        st.error(t("No model could be loaded. Pick one of the embedded models in the sidebar."))
        return None
    if not visible_text(text or ""):
        st.info(t(EMPTY_TEXT_NOTICE))
        return None
    loaded = compute.get_model(model)
    if text_pair and not visible_text(text_pair):
        text_pair = None
    if text_pair and loaded.is_causal:
        if notices:
            st.info(t("A second sentence applies to encoder models only; this decoder reads the first sentence alone."))
        text_pair = None
    try:
        run = _run_or_fallback(model, engine, text, text_pair, bos)
    except EmptyTextError as error:
        # Text the tokenizer drops whole (accents or marks alone, control characters) is empty text.
        if error.what != "pair text":
            st.info(t(EMPTY_TEXT_NOTICE))
            return None
        if notices:
            st.info(
                t(
                    "The second sentence holds nothing {model} reads; it reads the first sentence alone.",
                    model=md_escape(model),
                )
            )
        run = _run_or_fallback(model, engine, text, None, bos)
    if notices and run.truncated:
        st.warning(
            t(
                "The text has {tokens} tokens; {model} reads at most {most}, so only the first {most} are shown.",
                tokens=run.num_input_tokens,
                model=md_escape(model),
                most=run.num_tokens,
            )
        )
    if notices:
        for warning in loaded.warnings:
            st.caption(f":material/warning: {public_message(warning, model)}")
    return run


def _run_or_fallback(model: str, engine: str, text: str, text_pair: str | None, bos: bool | None):
    """``computations.get_run``; an engine that cannot replay this model falls back to transformers, with a warning."""
    try:
        return computations.get_run(model, engine, text, text_pair, bos)
    except EngineNotSupported as error:
        st.warning(public_message(error) + " " + t("Showing the transformers engine instead."))
        return computations.get_run(model, "transformers", text, text_pair, bos)


def current_run(notices: bool = True):
    """The run for the sidebar's selection, or None after a clear ``st.error`` / ``st.info``."""
    selection = session.selection()
    with error_display():
        return run_for(
            selection.model, selection.engine, selection.text, selection.text_pair, notices=notices, bos=selection.bos
        )
    return None
