"""Encoder-decoder models in the app (T5, BART, Marian / opus-mt, loaded as any other model: a hub id or a local
folder in the sidebar's "Other"): Explore's source and target boxes (or "let the model write it"), the switch
between the encoder's, the decoder's and the cross-attention, and Compare's two layers of cross-attention.

The runs come from the app's one gated, budget-reserving path (``computations.get_seq2seq_run``, work handed to
``compute.compute`` with its peak bytes reserved), like every other forward pass; the views are the head-view component (``ui.headview``),
which draws cross-attention with the target's tokens down the side and the source's along the top.
"""

from __future__ import annotations

import streamlit as st

from mha_core.errors import EngineNotSupported, HeadscopeError
from mha_core.models.seq2seq import DEFAULT_MAX_NEW_TOKENS
from ui import address, computations, compute, figures, headview
from ui.widgets import charts, messages, pickers

KIND_LABELS = {
    "cross": "Cross-attention (target → source)",
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention",
}
DEFAULT_SOURCE = "The cat sat on the mat because it was tired."
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
        st.warning(f"{messages.public_message(error)} Showing the transformers engine instead.")
        return computations.get_seq2seq_run(model_name, "transformers", source, target)


def texts(model) -> tuple[str, str | None] | None:
    """The source box and the target box (or "let the model write it"); None (after a note) when the source
    is empty."""
    source = pickers.url_text(
        "Source text", key="s2s_source", url_key="source", default=DEFAULT_SOURCE, what="source text"
    )
    write = pickers.url_toggle(
        "Let the model write the target",
        "s2s_write",
        "write",
        default=model.can_write,
        help=f"Greedy decoding: the model's most likely next token each time, up to {DEFAULT_MAX_NEW_TOKENS} tokens.",
        disabled=not model.can_write,
    )
    target = pickers.url_text(
        "Target text",
        key="s2s_target",
        url_key="target",
        default="",
        what="target text",
        disabled=write and model.can_write,
        placeholder="The translation or summary the decoder reads",
    )
    if not source.strip():
        st.info("Type a source text and press Enter.")
        return None
    if not (write and model.can_write) and not target.strip():
        st.info("Type a target text, or let the model write it.")
        return None
    return source, None if write and model.can_write else target


def kind_switch() -> str:
    return pickers.url_choice("Attention", KIND_LABELS, key="s2s_kind", url_key="kind")


def shown(run, words: bool):
    return run.to_words() if words else run


def explore(model_name: str, engine: str) -> None:
    """Explore for an encoder-decoder model: the texts, the three attentions and their head and model views."""
    model = encoder_decoder_model(model_name)
    st.caption(
        f"{messages.md_escape(model.family.upper())} is an encoder-decoder model: it reads a source text and writes "
        "(or is given) a target. Type both here; the sidebar's sentence boxes are for single-stack models."
    )
    chosen = texts(model)
    if chosen is None:
        return
    run = run_or_fallback(model_name, engine, *chosen)
    kind = kind_switch()
    words = pickers.url_toggle("Words, not tokens", "s2s_words", "words", help="Attention between whole words.")
    st.caption(messages.md_escape(run.summary()))
    if run.generated:
        st.markdown(f"**The model wrote:** {messages.md_escape(run.target) or '(nothing but special tokens)'}")
    view = shown(run, words).kind(kind)
    if view.max_abs_diff is not None:
        st.caption(f"From-scratch engine: max |core − transformers| = {view.max_abs_diff:.1e} on this attention.")
    st.caption(KIND_NOTES[kind])
    pickers.url_setting("explore_view", "view", "head", address.choice(headview.VIEWS))
    mode = st.session_state["explore_view"]
    layer = pickers.select_layer(view.num_layers, draw=False)
    head = pickers.select_head(view.num_heads, draw=False)
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
        st.session_state["explore_view"] = pick["view"]

    headview.show(data, key=f"s2s_view_{kind}", on_pick=picked)
    pickers.keep_in_url("explore_view", "view", "head")
    if mode == "head":
        lines(view, kind, layer, head)


def lines(view, kind: str, layer: int, head: int) -> None:
    """The selected head as BertViz's lines: queries (the target, for cross-attention) left, keys right."""
    with st.expander("The selected head as lines (BertViz style)"):
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
    """Compare for an encoder-decoder model: the cross-attention of two decoder layers side by side."""
    model = encoder_decoder_model(model_name)
    st.caption("Cross-attention of two decoder layers side by side: where each layer's heads look in the source.")
    chosen = texts(model)
    if chosen is None:
        return
    run = run_or_fallback(model_name, engine, *chosen)
    cross = run.cross
    columns = st.columns(2)
    left = pickers.select_layer(cross.num_layers, label="Left layer", container=columns[0])
    right = pickers.select_layer(
        cross.num_layers,
        label="Right layer",
        key="compare_layer_b",
        url_key="right_layer",
        container=columns[1],
        default=cross.num_layers - 1,
    )
    head = pickers.select_head(cross.num_heads, draw=False)
    for column, layer, side in ((columns[0], left, "left"), (columns[1], right, "right")):
        with column:
            st.markdown(f"**Decoder layer {layer}: cross-attention**")
            data = headview.pack(
                cross.attentions, cross.tokens, layer, head, key_tokens=cross.key_tokens, switchable=True
            )
            headview.show(data, key=f"s2s_compare_{side}")
