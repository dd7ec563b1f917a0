"""Explore's long document: every head of a document up to the model's own context length, in a deep-zoom view.

The visitor pastes a document or picks one of the long examples (``assets/long/documents.json``); a long run
(``mha_core.models.long.run_long``) is computed in a thread of the session (``ui.jobs``) inside one of the
server's compute slots, with its real bytes reserved in the budget first (its operation's ``peak_bytes``), through
the one gated path (``computations.long_run``), tokenized as the page's sentence is (with or without the BOS token).
A progress bar says how long is left, and a Stop button ends the pass at its next block. The view (``ui.longview``)
opens at the page's layer and head with max pooling, zooms into any region of any head, exact at every level, in the
app's one colour scale; the address keeps the document, the zoom, the pooling and the colours
(``?long=&lzoom=&lreduce=&lview=&lcolour=``), and a zoom the document cannot show is changed with a notice.
An encoder-decoder model gets a note instead: the long pass reads single-stack models.
With a decoder, a needle-in-a-haystack test (``?long=needle&needle=&nq=&nlen=&ndepth=``): the model answers the
question itself, and the retrieval heads (Wu et al. 2024) are scored on the answer's tokens that copy the needle,
with their scores; a head's evidence (the answer's rows against the needle's tokens) opens in the view.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

import streamlit as st

from mha_core.models.long import CUT_NOTICE, CUT_REASONS, NeedlePrompt, haystack, long_documents, needle_question
from ui import address, computations, compute, longview, session
from ui.i18n import t
from ui.page_explore import ExploreSettings
from ui.widgets import downloads, messages, pickers

MAX_LONG_CHARS = 120_000  # more than any model's context: 8,192 tokens are about 36,000 characters
PASTE = "paste"
NEEDLE_TEST = "needle"  # a needle-in-a-haystack prompt (decoders): the retrieval heads
S = ExploreSettings.declarations()
EVIDENCE_MARGIN = 3  # tokens shown around the needle and its copy when a retrieval head's evidence is opened


@dataclasses.dataclass(frozen=True)
class Document:
    """What the long run reads: a text, or a needle test's prompt (``NeedlePrompt``), which the model answers."""

    choice: str
    text: str
    needle: NeedlePrompt | None = None


def cut_words(run) -> str:
    """The library's cut notice (``metadata["cut"]``) in the session's language, from the run's numbers."""
    why = t(CUT_REASONS[bool(run.is_causal)])
    return t(CUT_NOTICE, total=f"{run.num_input_tokens:,}", model=run.model_name, kept=f"{run.num_tokens:,}", why=why)


def examples() -> tuple[dict, ...]:
    return long_documents()


def _stops() -> dict:
    return st.session_state.setdefault("_long_stops", {})


def get_long_run(model_name: str, document: Document, bos: bool | None = None):
    """The ``LongRun`` of ``document`` (``computations.long_run``: a job with a progress bar and time left), tokenized
    with or without the BOS token as the page's sentence (``bos``), with a Stop button; None once stopped."""
    key = computations.long_operation(model_name, document.text, bos=bos, needle=document.needle).key
    stop = _stops().setdefault(key, threading.Event())
    stop_slot = st.empty()
    stop_slot.button(t("Stop"), key="long_stop", on_click=stop.set, help=t("End the pass at its next block of rows"))
    try:
        return computations.long_run(model_name, document.text, stop, bos=bos, needle=document.needle)
    except computations.LongRunStopped:
        _stops().pop(key, None)
        st.session_state["long_requested"] = False
        st.info(t("Stopped. Press the button again to read the document."), icon=":material/stop_circle:")
        return None
    finally:
        stop_slot.empty()


def plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, made plural unless it is one ("1 head", "2 heads")."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


@st.cache_data(show_spinner=False, max_entries=16)
def example_token_counts(model_name: str, bos: bool | None, _model) -> tuple[tuple[int, int], ...]:
    """Each long example's length in the model's tokens and how many of them the long run reads (its context
    length at most), as the run tokenizes it (the tokenizer only; no pass)."""
    encoded = [_model.encode_long(example["text"], bos) for example in examples()]
    return tuple((e.num_input_tokens, len(e.input_ids)) for e in encoded)


def example_label(example: dict, tokens: int, read: int) -> str:
    """An example's name with its length in the selected model's tokens (the file's label names SmolLM2's), and how
    many of them are read when that is fewer."""
    cut = t("; the first {count} read", count=f"{read:,}") if read < tokens else ""
    return t(
        "{name} ({count} tokens for this model{cut})",
        name=t(example["label"].split(" (")[0]),
        count=f"{tokens:,}",
        cut=cut,
    )


def _document(model, model_name: str, bos: bool | None) -> Document:
    """What to read, from the picker (and the link): an example, a pasted document or (decoders) a needle test."""
    counts = example_token_counts(model_name, bos, model)
    labels = [example_label(example, *count) for example, count in zip(examples(), counts)]
    options = [*[str(index) for index in range(len(labels))], PASTE]
    names = dict(zip(options, [*labels, t("Paste a document")]))
    if model.is_causal:
        options.append(NEEDLE_TEST)
        names[NEEDLE_TEST] = t("Needle in a haystack (retrieval heads)")
    # A needle test chosen with a decoder, now an encoder: the first example.
    choice = S["long_doc"].select(st.selectbox, options, format_func=names.get)
    if choice == PASTE:
        text = st.text_area(t("Your document"), key="long_text", max_chars=MAX_LONG_CHARS, height=160)
        return Document(choice, text)
    if choice == NEEDLE_TEST:
        return _needle_test(model)
    example = examples()[int(choice)]
    st.caption(
        t(
            "{count} consecutive documents of the UD English Web Treebank dev split (CC BY-SA 4.0), their "
            "sentences joined.",
            count=len(example["documents"]),
        )
    )
    return Document(choice, example["text"])


def _needle_test(model) -> Document:
    """A needle-in-a-haystack prompt (Wu et al. 2024): the long examples cut to length, the needle sentence at a
    depth, then the question, which the model answers; the retrieval heads are scored on its answer."""
    limit = model.context_length
    needle = S["needle"].widget(st.text_input)
    question = S["needle_question"].widget(st.text_input)
    left, right = st.columns(2)
    tokens = S["needle_tokens"].number(left.number_input, maximum=limit, default=min(4096, limit), step=256)
    depth = S["needle_depth"].number(right.slider, step=5)
    prompt = needle_question(model, haystack(), needle, question, depth=depth / 100, num_tokens=int(tokens))
    st.caption(
        t(
            "The long examples (UD English Web Treebank dev, CC BY-SA 4.0) cut to {count} tokens with the needle at "
            "{depth}%, then the question; the model answers it (greedily, up to {answer} tokens).",
            count=f"{len(prompt.token_ids):,}",
            depth=depth,
            answer=prompt.answer_tokens,
        )
    )
    text = f"{needle} | {question} | {len(prompt.token_ids)} tokens | depth {depth}%"
    return Document(NEEDLE_TEST, text, needle=prompt)


def section() -> None:
    """The long-document part of Explore."""
    st.subheader(t("Long document"))
    with messages.error_display():
        selection = session.selection()
        model_name = selection.model
        model = compute.get_model(model_name)
        if getattr(model, "is_encoder_decoder", False):
            st.info(
                t(
                    "The long pass reads single-stack models: an encoder (such as MiniLM) or a decoder (such as "
                    "SmolLM2). An encoder-decoder model's three attentions are shown above; pick another model in "
                    "the sidebar to read a long document."
                ),
                icon=":material/info:",
            )
            return
        st.caption(
            t(
                "Every head of a long document, exact at every zoom: the pass keeps each layer's queries, keys and "
                "each row's normaliser, never the full weight matrices, so any region is recomputed exactly when "
                "you zoom."
            )
        )
        document = _document(model, model_name, selection.bos)
        limit = model.context_length
        st.caption(
            t(
                "{model} reads up to {limit} tokens here ({why}); the views above stop at {most}. A longer document "
                "is cut at {limit} tokens.",
                model=messages.md_escape(model_name),
                limit=f"{limit:,}",
                why=t(CUT_REASONS[bool(model.is_causal)]),
                most=model.max_tokens,
            )
        )
        if not document.text.strip():
            st.info(t("Paste a document to read it."))
            return
        if address.query_value("lzoom") and pickers.link_may_start(
            computations.long_run_ready(model_name, document.text, bos=selection.bos, needle=document.needle)
        ):
            st.session_state.setdefault("long_requested", True)  # a link to a zoom reads its document at once
        if st.button(t("Read every head of this document"), key="long_go", type="primary"):
            st.session_state["long_requested"] = True
        if not st.session_state.get("long_requested"):
            return
        run = get_long_run(model_name, document, selection.bos)
        if run is None:
            return
        st.caption(messages.run_summary(run))
        if run.truncated:  # the library cut the document to what the model reads, before the run
            st.info(messages.md_escape(cut_words(run)), icon=":material/content_cut:")
        # The view's fragment finds the run here without holding it (a session keeps its fragments' arguments).
        st.session_state["long_run_ref"] = weakref.ref(run)
        long_view()
        answer = run.metadata.get("needle")  # a needle test: what the model answered, and its copied tokens
        roles = run.roles(list(answer.copies) if answer is not None and answer.copies else None)  # once
        if answer is not None:
            retrieval_table(run, roles, answer)
        roles_table(run, roles[roles["role"] != "retrieval"])


def _zoom(run) -> longview.Zoom:
    """The zoom this session shows: kept in the session; first taken from the link, else the page's layer and head
    whole. What a link asks for that this document cannot show is changed, with a notice saying what."""
    zoom = st.session_state.get("long_zoom")
    if zoom is not None:
        return longview.checked(zoom, run.num_layers, run.num_heads, run.num_tokens)[0]
    page = (int(st.session_state.get("layer", 0)), int(st.session_state.get("head", 0)))
    zoom = longview.whole(*page, run.num_tokens)
    raw = address.query_value("lzoom")
    notes = []
    if raw:
        try:
            zoom = longview.parse_link(raw)
        except ValueError as error:
            notes.append(
                t(
                    "lzoom={value} is not {reason}: showing layer {layer}, head {head} whole",
                    value=raw[:40],
                    reason=error,
                    layer=page[0],
                    head=page[1],
                )
            )
    zoom = dataclasses.replace(
        zoom,
        reduce=address.query_value("lreduce", longview.DEFAULT_REDUCE),
        view=address.query_value("lview", "head"),
        colour=address.query_value("lcolour", "absolute"),
    )
    zoom, changed = longview.checked(zoom, run.num_layers, run.num_heads, run.num_tokens)
    notes += changed
    if notes:
        st.warning(
            t("This link's long-document view was changed to work:")
            + "\n"
            + "\n".join(f"- {messages.md_escape(n)}" for n in notes)
        )
    return zoom


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
        st.caption(pooling_note(zoom, run.num_tokens))
        data = longview.pack_model(run, zoom) if zoom.view == "model" else longview.pack_layer(run, zoom)
        longview.show(data, key=f"long_view_{run.num_tokens}", on_zoom=_take_zoom)
        downloads.long_view_download(run, data, key=f"long_html_{run.num_tokens}")  # the view as one HTML file
        address.write_query(
            lzoom=zoom.link(),
            lreduce=None if zoom.reduce == longview.DEFAULT_REDUCE else zoom.reduce,
            lview=None if zoom.view == "head" else zoom.view,
            lcolour=None if zoom.colour == "absolute" else zoom.colour,
        )


def pooling_note(zoom: longview.Zoom, n: int) -> str:
    """What a pooled cell shows, and why the view opens with max pooling."""
    if zoom.reduce == "max":
        return t(
            "Max pooling (the view opens with it): a cell larger than one token shows the largest exact weight among "
            "its tokens, so one strong link stays visible at any zoom. Mean pooling averages them instead: over a "
            "whole document of {n} tokens a cell's mean is about 1/{n}, nearly white on the weights' colour scale "
            "unless the colours are stretched.",
            n=f"{n:,}",
        )
    return t(
        "Mean pooling: a cell larger than one token shows the mean of its tokens' exact weights, about 1/{n} over a "
        'whole document of {n} tokens (nearly white on the weights\' colour scale): "Stretch colours" paints each '
        "image against its own largest value, and says by how much.",
        n=f"{n:,}",
    )


def evidence_zoom(layer: int, head: int, copies, n: int) -> longview.Zoom:
    """A head's evidence in a needle test: the rows that write the answer against the needle's tokens, with a few
    tokens around both (single tokens: each cell one exact weight)."""
    rows = [row for row, _ in copies]
    cols = [col for _, col in copies]
    r0, c0 = max(0, min(rows) - EVIDENCE_MARGIN), max(0, min(cols) - EVIDENCE_MARGIN)
    r1 = min(n, max(rows) + 1 + EVIDENCE_MARGIN, r0 + longview.TOKEN_LEVEL)
    c1 = min(n, max(cols) + 1 + EVIDENCE_MARGIN, c0 + longview.TOKEN_LEVEL)
    return longview.Zoom(layer, head, r0=r0, r1=r1, c0=c0, c1=c1)


def retrieval_table(run, roles, answer) -> None:
    """The needle test's retrieval heads (from ``roles``, the run's roles with the answer's copies) with their
    scores, and what the model answered; a head's evidence opens in the view above."""
    copies = answer.copies
    retrieval = roles[roles["role"] == "retrieval"].sort_values("score", ascending=False)
    copied = len({query for query, _ in copies})
    st.markdown(
        t("**Retrieval heads** ({count} of {heads})", count=len(retrieval), heads=run.num_layers * run.num_heads)
    )
    st.caption(
        t(
            "The model answered “{answer}” ({count} tokens, its own greedy choice); {copied} of them are in the "
            "needle. Wu et al. 2024: for each answer token in the needle, whether the head's largest weight, at the "
            "position that writes the token, falls on that token in the needle. A head passes at a score of 0.1; the "
            "interval is Wilson's over the copied tokens, the baseline a key chosen at random. After an answer's "
            "first token the next ones follow a copy already begun (an induction head's task): docs/findings.md, "
            "section 8, compares these heads with the induction heads.",
            answer=messages.md_escape(answer.answer.strip()),
            count=len(answer.answer_ids),
            copied=copied,
        )
    )
    if not copies:
        st.info(t("The answer copies nothing from the needle: no head can be scored. Try another depth or question."))
        return
    if retrieval.empty:
        st.info(t("No head copies the needle here: try another depth or a longer needle."))
        return
    st.dataframe(retrieval[["layer", "head", "score", "baseline", "ci_low", "ci_high", "n"]], hide_index=True)
    heads = [(int(row.layer), int(row.head), float(row.score)) for row in retrieval.itertuples()]

    def show_evidence() -> None:
        chosen = st.session_state.get("long_evidence")
        if chosen is not None:
            st.session_state["long_zoom"] = evidence_zoom(chosen[0], chosen[1], copies, run.num_tokens)

    st.selectbox(
        t("Show a head's evidence in the view above"),
        [None, *heads],
        key="long_evidence",
        format_func=lambda h: (
            t("Choose a head...")
            if h is None
            else t("layer {layer}, head {head}: score {score}", layer=h[0], head=h[1], score=f"{h[2]:.2f}")
        ),
        on_change=show_evidence,
    )


def roles_table(run, roles) -> None:
    """Sink-at-length and local heads (``roles``) with their evidence, and each layer's 90%-mass window."""
    heads = len(roles[["layer", "head"]].drop_duplicates())
    with st.expander(
        t("Long-context roles (1 head)") if heads == 1 else t("Long-context roles ({count} heads)", count=heads)
    ):
        st.caption(
            t(
                "Sink at length: most of a query's mass on the first 4 tokens, for queries at least 64 tokens away "
                "(StreamingLLM). Local: 90% of a query's mass within a window of at most 16 tokens. Retrieval heads "
                '(Wu et al. 2024) need a needle-in-a-haystack prompt: choose "Needle in a haystack" above.'
            )
        )
        st.dataframe(roles[["layer", "head", "role", "score", "threshold", "n", "evidence"]], hide_index=True)
        windows = run.local_windows().groupby("layer")["median_window"].median()
        st.caption(
            t("Median 90%-mass window (tokens), by layer: ") + ", ".join(f"L{k} {int(v)}" for k, v in windows.items())
        )
