"""Compare: layer against layer, sentence against sentence, model or engine against model or engine,
side by side and, if asked, their difference map (left minus right), with a per-layer curve of one measurement.
Two models of different depths are paired by relative depth unless the visitor pairs the layers by hand."""

import streamlit as st

from ui import address, encoder_decoder, page_compare, session, shell
from ui.i18n import t
from ui.page_compare import CompareSettings
from ui.settings import ENGINE_LABELS
from ui.widgets import messages, pickers, sidebar, views

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

st.title(t("Compare"))
selection = session.selection()
if encoder_decoder.encoder_decoder_model(selection.model) is not None:  # two layers of one of its attentions
    with messages.error_display():
        encoder_decoder.compare(selection.model, selection.engine)
    st.stop()
S = CompareSettings.declarations()
mode = S["mode"].segmented(label_visibility="collapsed")
run = sidebar.current_run()
if run is None:
    st.stop()


def compared(left_run, right_run, left_layer: int, right_layer: int, titles: tuple[str, str], key: str) -> None:
    """The two layers side by side and, when asked, their difference (left minus right) below them."""
    difference = S["difference"].keyed(view=key).toggle()
    left, right = st.columns(2)
    for column, side_run, layer, title, side in (
        (left, left_run, left_layer, titles[0], "left"),
        (right, right_run, right_layer, titles[1], "right"),
    ):
        with column:
            st.markdown(f"**{messages.md_escape(title)}**")
            views.head_view(side_run, layer, key=f"{key}_{side}", columns=3, width_hint=480)
    if difference:
        views.difference_view(left_run, right_run, left_layer, right_layer, f"{key}_difference_grid", titles)


if mode == "sentences":
    st.caption(t("The same model reads two sentences; the same layer of each, side by side."))
    other_text = S["other_text"].text()
    other = sidebar.run_for(selection.model, selection.engine, other_text, bos=selection.bos)
    if other is None:
        st.stop()
    layer = pickers.select_layer(run.num_layers)
    compared(run, other, layer, layer, (f"A: {selection.text}", f"B: {other_text}"), key="cmp_sentences")
    views.metric_curves({"A": run, "B": other}, key="cmp_sentences")

elif mode == "models":
    st.caption(
        t(
            "The same text through a second model or engine. Transformers against the from-scratch core shows "
            "how exactly Headscope's own layer code reproduces the library: their difference is float32 rounding."
        )
    )
    cols = st.columns(2)
    offered = page_compare.second_models()
    other_model = S["other_model"].select(
        cols[0].selectbox,
        offered,
        default=page_compare.second_model_default(selection.model, offered),
        format_func=lambda name: t(offered[name]),
    )
    other_engine = S["other_engine"].select(cols[1].radio, horizontal=True)
    with messages.error_display():
        other = sidebar.run_for(other_model, other_engine, selection.text, selection.text_pair, notices=False)
    if other is None:
        st.stop()
    for candidate in (run, other):
        messages.engine_note(candidate)
    if other.model_name == run.model_name and other.engine == run.engine:
        st.info(t("Both sides are the same model and engine: pick another model or engine to compare."))
    pairing = "hand"
    if run.num_layers != other.num_layers:  # two depths: layer l of one is not layer l of the other
        pairing = S["pairing"].select(st.radio, horizontal=True)
    cols = st.columns(2)
    left_layer = pickers.select_layer(
        run.num_layers, label=t(S["other_layer"].label, model=messages.md_escape(run.model_name)), container=cols[0]
    )
    if pairing == "depth":
        right_layer = views.depth_matched_layer(left_layer, run.num_layers, other.num_layers)
        cols[1].markdown(
            t("Layer of {model}: **{layer}**", model=messages.md_escape(other.model_name), layer=right_layer)
        )
        address.write_query(**{S["other_layer"].url_key: None})  # the pairing decides it
    else:
        # Its own key: the right-hand layer of another model is not the right-hand layer of the layer mode.
        right_layer = S["other_layer"].layer(
            other.num_layers,
            label=t(S["other_layer"].label, model=messages.md_escape(other.model_name)),
            container=cols[1],
        )
    st.caption(
        views.pairing_note(
            pairing, (run.model_name, run.num_layers, left_layer), (other.model_name, other.num_layers, right_layer)
        )
    )
    names = [f"{r.model_name} ({t(ENGINE_LABELS[r.engine])})" for r in (run, other)]
    compared(run, other, left_layer, right_layer, (names[0], names[1]), key="cmp_models")
    views.metric_curves(dict(zip(names, (run, other))), key="cmp_models")

else:
    st.caption(t("Two layers of the same run, every head of each, side by side."))
    cols = st.columns(2)
    layer_a = S["left_layer"].layer(run.num_layers, container=cols[0])
    # Opens on the first layer against the last: the contrast a reader comes for.
    layer_b = S["right_layer"].layer(run.num_layers, container=cols[1], default=run.num_layers - 1)
    titles = (t("Layer {layer}", layer=layer_a), t("Layer {layer}", layer=layer_b))
    compared(run, run, layer_a, layer_b, titles, key="cmp_layers")
    views.metric_curves({t("this sentence"): run}, key="cmp_layers")
