"""Encoder-decoder models in the app (T5, BART, Marian / opus-mt, loaded as any other model: a hub id or a local
folder in the sidebar's "Other"): Explore's source and target boxes (or "let the model write it"), the switch
between the encoder's, the decoder's and the cross-attention, and Compare's two layers of one of them.

Every section of Explore and Compare that applies to an encoder-decoder model is here, on the attention shown:
the words and hide-special toggles, the attention-sink note, the head and model views (cross-attention at its own
aspect ratio), the lines, a class question (self-attention: its answers are the row's own tokens), the downloads,
the from-scratch layer code, and Compare's two layers side by side with their difference and per-layer curves.
The long document and Compare's sentence and model modes read single-stack models; they say so instead.

The runs come from the app's one gated, budget-reserving path (``computations.get_seq2seq_run``, work handed to
``compute.compute`` with its peak bytes reserved), like every other forward pass; the views are the head-view component (``ui.headview``),
which draws cross-attention with the target's tokens down the side and the source's along the top.
"""

from __future__ import annotations

import dataclasses
import io
import weakref

import numpy as np
import streamlit as st

from mha_core.errors import EngineNotSupported, HeadscopeError
from ui import class_questions, computations, compute, figures, headview
from ui.i18n import language, t
from ui.page_compare import CompareSettings
from ui.page_explore import KIND_LABELS, ExploreSettings
from ui.widgets import charts, downloads, messages, pickers, views

S = ExploreSettings.declarations()
EXPLORE_VIEW = S["view"]
KIND_NOTES = {
    "cross": "Each row is a target token (what the decoder is writing), each column a source token (what the "
    "encoder read): where the decoder looks in the source as it writes each token.",
    "encoder": "The encoder reads the source in both directions: every source token sees every other.",
    "decoder": "The decoder reads the target left to right: grey cells are hidden by the causal mask.",
}


def encoder_decoder_model(model_name: str | None):
    """The loaded model when it is an encoder-decoder (``Seq2SeqModel``), else None."""
    if not model_name:
        return None
    try:
        model = compute.get_model(model_name)
    except HeadscopeError:
        return None
    return model if getattr(model, "is_encoder_decoder", False) else None


def run_or_fallback(model_name: str, engine: str, source: str, target: str | None):
    """``computations.get_seq2seq_run``; an engine that cannot replay this model falls back to transformers, with a warning."""
    try:
        return computations.get_seq2seq_run(model_name, engine, source, target)
    except EngineNotSupported as error:
        st.warning(messages.public_message(error) + " " + t("Showing the transformers engine instead."))
        return computations.get_seq2seq_run(model_name, "transformers", source, target)


def texts(model) -> tuple[str, str | None] | None:
    """The source box and the target box (or "let the model write it"); None (after a note) when the source
    is empty."""
    source = S["source"].text()
    write = S["write"].widget(st.toggle, default=model.can_write, disabled=not model.can_write)
    target = S["target"].text(
        disabled=write and model.can_write, placeholder=t("The translation or summary the decoder reads")
    )
    if not source.strip():
        st.info(t("Type a source text and press Enter."))
        return None
    if not (write and model.can_write) and not target.strip():
        st.info(t("Type a target text, or let the model write it."))
        return None
    return source, None if write and model.can_write else target


def kind_switch() -> str:
    return S["kind"].segmented()


def shown(run, words: bool, hide_special: bool = False):
    """The run as the toggles ask: word level first, then without special tokens."""
    run = run.to_words() if words else run
    return run.without_special() if hide_special else run


def toggles(run) -> tuple[bool, bool]:
    """The words and hide-special toggles (``?words=`` and ``?hide=``, as for single-stack models: the address
    keys of the app's shared toggles, under this view's own session keys)."""
    left, right = st.columns(2)
    words = pickers.url_toggle(
        t("Words, not tokens"), "s2s_words", "words", help=t("Attention between whole words."), container=left
    )
    has_special = any(bool(np.any(run.kind(kind).special_mask)) for kind in KIND_LABELS)
    hide = pickers.url_toggle(
        t("Hide special tokens"),
        "s2s_hide",
        "hide",
        container=right,
        disabled=not has_special,
        help=t("Drops the special tokens (</s>, <s>, <pad>, ...) of both texts and renormalises each row to sum to 1."),
    )
    return words, hide and has_special


def explore(model_name: str, engine: str) -> None:
    """Explore for an encoder-decoder model: the texts, the three attentions and their head and model views."""
    model = encoder_decoder_model(model_name)
    st.caption(
        t(
            "{family} is an encoder-decoder model: it reads a source text and writes (or is given) a target. Type "
            "both here; the sidebar's sentence boxes are for single-stack models.",
            family=messages.md_escape(model.family.upper()),
        )
    )
    chosen = texts(model)
    if chosen is None:
        return
    run = run_or_fallback(model_name, engine, *chosen)
    kind = kind_switch()
    words, hide_special = toggles(run)
    st.caption(messages.run_summary(run))
    if run.generated:
        st.markdown(
            t("**The model wrote:**") + " " + (messages.md_escape(run.target) or t("(nothing but special tokens)"))
        )
    view = shown(run, words, hide_special).kind(kind)
    if view.max_abs_diff is not None:
        st.caption(
            t(
                "From-scratch engine: max |core − transformers| = {diff} on this attention.",
                diff=f"{view.max_abs_diff:.1e}",
            )
        )
    st.caption(t(KIND_NOTES[kind]))
    views.sink_note(view)
    mode = EXPLORE_VIEW.start()  # Explore's own setting: one view for both kinds of model
    layer = pickers.select_layer(view.num_layers, draw=False)
    head = pickers.select_head(view.num_heads, draw=False)
    # A class question (self-attention: its answers are the row's own tokens); the head stays hidden until revealed.
    if kind != "cross" and class_questions.explore_question(view, layer, head):
        return
    data = headview.pack(
        view.attentions,
        view.tokens,
        layer,
        head,
        causal=view.is_causal,
        view=mode,
        switchable=True,
        key_tokens=view.key_tokens if kind == "cross" else None,
    )

    def picked(pick: dict) -> None:
        pickers.set_layer(pick["layer"])
        pickers.set_head(pick["head"])
        EXPLORE_VIEW.set(pick["view"])

    headview.show(data, key=f"s2s_view_{kind}", on_pick=picked)
    EXPLORE_VIEW.keep()
    if mode == "head":
        lines(view, kind, layer, head)
        run_downloads(RunShown(model_name, run.encoder.engine, *chosen, words, hide_special), run, kind, (layer, head))
    views.layer_code(view)


@dataclasses.dataclass(frozen=True)
class RunShown:
    """What Explore shows of an encoder-decoder model, by value: enough to find its run again."""

    model_name: str
    engine: str
    source: str
    target: str | None
    words: bool
    hide_special: bool

    def held(self, run):
        """A function giving ``run`` while it is in memory, else the same run again from the shared cache (or
        computed again): Streamlit keeps a download's function as long as the session, and it must not keep the run
        out of the memory budget's reach."""
        kept = weakref.ref(run)

        def get():
            current = kept()
            if current is None:
                current = computations.get_seq2seq_run(
                    self.model_name, self.engine, self.source, self.target, stoppable=False
                )
            return current

        return get


def run_downloads(shown_run: RunShown, run, kind: str, selected: tuple[int, int]) -> None:
    """The three attentions as one .npz (``mha_core.Seq2SeqRun.load``) and the ``selected`` (layer, head) of the
    attention shown as CSV (rows: the queries; for cross-attention the target's tokens against the source's)."""
    layer, head = selected
    get = shown_run.held(run)
    left, right, page = st.columns(3)
    left.download_button(
        t("Encoder, decoder and cross-attention (.npz)"),
        data=lambda: get().to_npz_bytes(),
        file_name=downloads.download_name(run.encoder, ".npz"),
        mime="application/octet-stream",
        key="s2s_dl_npz",
        help=t("All three attentions with both texts' tokens; load with mha_core.Seq2SeqRun.load."),
    )

    def head_csv() -> bytes:
        buffer = io.StringIO()
        frame = shown(get(), shown_run.words, shown_run.hide_special).kind(kind).head_frame(layer, head)
        frame.to_csv(buffer, float_format="%.6g")
        return buffer.getvalue().encode("utf-8")

    right.download_button(
        t(
            "{attention}, layer {layer} head {head} (.csv)",
            attention=t(KIND_LABELS[kind]).split(" (")[0].split("（")[0],
            layer=layer,
            head=head,
        ),
        data=head_csv,
        file_name=downloads.download_name(run.encoder, f"-{kind}.csv", layer=layer, head=head),
        mime="text/csv",
        key="s2s_dl_csv",
    )
    lang = language()  # the file's words in the session's language, known in this script run
    page.download_button(  # the attention shown as one self-contained HTML file (mha_core.views.standalone)
        t("View as HTML (.html)"),
        data=lambda: downloads.view_page(
            shown(get(), shown_run.words, shown_run.hide_special).kind(kind), layer, head, lang
        ),
        file_name=downloads.download_name(run.encoder, f"-{kind}.html", layer=layer, head=head),
        mime="text/html",
        key="s2s_dl_html",
    )


def lines(view, kind: str, layer: int, head: int) -> None:
    """The selected head as BertViz's lines: queries (the target, for cross-attention) left, keys right."""
    with st.expander(t("The selected head as lines (BertViz style)")):
        charts.show_chart(
            figures.attention_lines(
                view.attentions[layer, head],
                view.tokens,
                key_tokens=view.key_tokens if kind == "cross" else None,
            ),
            key=f"s2s_lines_{kind}",
            filename=f"headscope-{kind}-layer{layer}-head{head}-lines",
        )


def compare(model_name: str, engine: str) -> None:
    """Compare for an encoder-decoder model: two layers of one of its three attentions side by side, their
    difference when asked, and per-layer curves of one measurement of that attention."""
    model = encoder_decoder_model(model_name)
    st.caption(
        t(
            "Two layers of one of the model's three attentions side by side (by default the cross-attention: where "
            "each decoder layer's heads look in the source). Sentence against sentence and model against model read "
            "single-stack models (an encoder or a decoder)."
        )
    )
    chosen = texts(model)
    if chosen is None:
        return
    run = run_or_fallback(model_name, engine, *chosen)
    kind = kind_switch()
    view = run.kind(kind)
    cross = kind == "cross"
    columns = st.columns(2)
    left = pickers.select_layer(view.num_layers, label=t("Left layer"), container=columns[0])
    right = pickers.select_layer(
        view.num_layers,
        label=t("Right layer"),
        key="compare_layer_b",
        url_key="right_layer",
        container=columns[1],
        default=view.num_layers - 1,
    )
    head = pickers.select_head(view.num_heads, draw=False)
    difference = (
        CompareSettings.declared("difference")
        .keyed(view="s2s_compare")
        .toggle(
            help=t(
                "Below the two layers, one map of left minus right: red where the left layer attends more, blue "
                "where the right one does (the same tokens on both sides)."
            )
        )
    )
    noun = {
        "cross": "Decoder layer {layer}: cross-attention",
        "encoder": "Encoder layer {layer}",
        "decoder": "Decoder layer {layer}",
    }
    for column, layer, side in ((columns[0], left, "left"), (columns[1], right, "right")):
        with column:
            st.markdown(f"**{t(noun[kind], layer=layer)}**")
            data = headview.pack(
                view.attentions,
                view.tokens,
                layer,
                head,
                causal=view.is_causal,
                key_tokens=view.key_tokens if cross else None,
                switchable=True,
            )
            headview.show(data, key=f"s2s_compare_{side}")
    if difference:
        layer_difference(view, kind, left, right)
    views.metric_curves({t(KIND_LABELS[kind]): view}, key="s2s_compare")


def layer_difference(view, kind: str, left: int, right: int) -> None:
    """Layer ``left`` minus layer ``right`` of one attention, every head, on the fixed scale -1..1."""
    values = view.attentions[left] - view.attentions[right]
    largest = float(np.abs(values).max())
    if largest < views.ROUNDING_SIZE:
        st.success(
            t(
                "Layers {left} and {right} are identical within {atol}: no map to draw.",
                left=left,
                right=right,
                atol=f"{views.ROUNDING_SIZE:.0e}",
            )
        )
        return
    charts.show_chart(
        figures.difference_map(
            values,
            view.tokens,
            title=t("Layer {left} − layer {right}, {heads}", left=left, right=right, heads=t("every head")),
            causal=view.is_causal,
            key_labels=view.key_tokens if kind == "cross" else None,
        ),
        key="s2s_compare_difference_grid",
        filename=f"headscope-{kind}-difference",
    )
    st.caption(
        t(
            "Largest difference: {largest}. Colours on a fixed scale, −1 to 1 (the most two weights can differ): red "
            "where the left layer attends more, blue where the right one does.",
            largest=f"{largest:.2e}",
        )
    )
