"""Ablate: switch heads off and watch what the model loses; rank heads by importance.

The settings and the logic are ``ui.ablate``; the interventions and measurements ``mha_core.interventions``; the
figures ``ui.figures.causal``.
"""

import streamlit as st

from mha_core.models.ablation import MEAN_REFERENCE_SENTENCES
from ui import address, session, shell
from ui import page_ablate as ablate
from ui.figures.causal import PRUNING_WORDS, condition_bars, head_score_map, pruning_figure, token_change_bars
from ui.i18n import t
from ui.page_ablate import AblateSettings
from ui.settings import settings
from ui.widgets import charts, downloads, messages, pickers, sidebar, views

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

MAP_KEY = "ablate_map"
HEADS = AblateSettings.declared("heads")


def toggle_clicked() -> None:
    """A click on the heads map adds that head to the ablated set, or removes it."""
    pickers.select_clicked_head(MAP_KEY)
    clicked = pickers.clicked_head(MAP_KEY)
    if clicked is not None and clicked[0] is not None:
        HEADS.set(ablate.toggled(AblateSettings.from_session().heads, ablate.head_name(*clicked)))


def pick_strongest(values, names: list[str], count: int) -> None:
    """ "Pick the strongest": the heads of the largest scores become the chosen ones."""
    HEADS.set(ablate.strongest(values, names, count))


# ---- the page -------------------------------------------------------------------------------------------
st.title(t("Ablate"))
st.caption(
    t(
        "Attention weights show where a head looks, not whether the model needs it. Ablating a head is an "
        "experiment: its slice of the attention output (the input of the output projection) is set to 0, or to "
        "its mean over reference sentences, and the model runs again. What the model loses is the head's causal "
        "effect."
    )
)
selection = session.selection()
run = sidebar.current_run()
if run is None:
    st.stop()
model = sidebar.current_model()
if model is None:
    st.stop()
st.caption(t("{model} has {head}.", model=messages.md_escape(selection.model), head=t(model.head_description)))
S = AblateSettings.declarations()

with messages.error_display():
    # 1. Pick heads: click the map, or take the strongest heads of a score.
    st.subheader(t("1. Pick heads"))
    scores = ablate.map_scores(run, selection.model)
    names = ablate.head_names(run.num_layers, run.num_heads)
    # The heads to ablate: the map below marks them before their box is drawn.
    heads = HEADS.start(address.head_names(run.num_layers, run.num_heads))
    HEADS.set([h for h in heads if h in names])
    cols = st.columns([3, 1, 1])
    labels = {name: t(label) for name, (label, _) in scores.items()}
    colour = S["colour"].select(cols[0].selectbox, labels, default=next(iter(labels)), format_func=labels.get)
    label, values = t(scores[colour][0]), scores[colour][1]
    top_k = S["top_k"].number(cols[1].number_input, maximum=len(names), default=min(ablate.PICK_TOP, len(names)))
    cols[2].button(
        t("Pick the strongest"), key="ablate_pick_top", on_click=pick_strongest, args=(values, names, int(top_k))
    )
    charts.show_chart(
        head_score_map(
            values,
            AblateSettings.from_session().chosen,
            label=label.split(" (")[0].split("（")[0],
            title=t("Click a head to add or remove it (x)"),
        ),
        key=MAP_KEY,
        filename="headscope-ablate-map",
        on_select=toggle_clicked,
        selection_mode="points",
    )
    HEADS.multiselect(names)
    ablation = S["ablation"].select(st.radio, horizontal=True)
    if ablation == "mean":
        st.caption(
            t(
                "Mean ablation replaces each head's output by its mean over every token of the first {count} UD "
                "English EWT dev sentences.",
                count=MEAN_REFERENCE_SENTENCES,
            )
        )

    # 2. The effect on this sentence.
    st.subheader(t("2. The effect on this sentence"))
    chosen = AblateSettings.from_session()
    if not chosen.heads:
        st.info(t("Pick at least one head above to see what ablating it does."))
    else:
        effect = ablate.effect(chosen, selection, run)
        table = effect.table
        if effect.mean_before is not None:
            cols = st.columns(3)
            cols[0].metric(t("Mean loss before"), f"{effect.mean_before:.3f}")
            cols[1].metric(
                t("After ablation"),
                f"{effect.mean_after:.3f}",
                delta=f"{effect.mean_after - effect.mean_before:+.3f}",
                delta_color="inverse",
            )
            cols[2].metric(t("Heads ablated"), len(chosen.heads))
            what = t(
                "loss of predicting each token from the ones before it (nats)"
                if model.lm_head_kind == "causal"
                else "loss of each token when it is masked (nats)"
            )
            charts.show_chart(
                token_change_bars(
                    table["token"].tolist(),
                    table["loss_after"].to_numpy(),
                    table["loss_before"].to_numpy(),
                    label=t("loss"),
                    positions=table["position"].tolist(),
                ),
                key="ablate_losses",
                filename="headscope-ablate-losses",
            )
            st.caption(t("Per token: the {what}, before (grey) and after (red).", what=what))
        else:
            st.metric(
                t("Output change (cosine distance of the sentence embedding)"), f"{effect.after.output_change:.4g}"
            )
            charts.show_chart(
                token_change_bars(
                    table["token"].tolist(),
                    table["output_change"].to_numpy(),
                    label=t("output change (1 - cos)"),
                    positions=table["position"].tolist(),
                ),
                key="ablate_losses",
                filename="headscope-ablate-output-change",
            )
            st.caption(
                t(
                    "This encoder has no language-model head, so there is no loss: the bars are how far each "
                    "token's final vector turned (1 - cosine similarity to the unablated run)."
                )
            )
        st.dataframe(ablate.columns_shown(table), hide_index=True, width="stretch")
        later = ablate.later_layers(chosen.chosen, run.num_layers)
        if later is not None:
            layer = S["later_layer"].number(st.slider, minimum=later[0], maximum=later[1], default=later[0])
            st.caption(
                t(
                    "Layer {layer}: attention after ablation minus before (red: more attention after, blue: less). "
                    "Layers up to {last} are unchanged.",
                    layer=layer,
                    last=later[0] - 1,
                )
            )
            views.difference_view(
                effect.after,
                run,
                layer,
                layer,
                key="ablate_difference",
                titles=(t("after ablation"), t("before")),
                title=t("Layer {layer}: after − before", layer=layer),
            )

    # 3. One-click experiments, with their controls.
    st.subheader(t("3. Experiments"))
    if model.lm_head_kind == "causal":
        with st.expander(t("Induction: ablate the top heads of a role vs random heads"), expanded=True):
            st.caption(
                t(
                    "Sequences of random tokens, each repeated once (BOS + 50 tokens + the same 50). A model that "
                    "copies predicts the repeated half well; induction heads are how. The top-k heads of the chosen "
                    "score are ablated, and, as the control, k random heads in several draws."
                )
            )
            cols = st.columns(4)
            S["role"].select(cols[0].selectbox)
            S["k"].number(cols[1].number_input, maximum=len(names), default=min(ablate.PICK_TOP, len(names)))
            S["draws"].number(cols[2].number_input)
            if cols[3].button(t("Run"), key="ablate_induction_run", type="primary"):
                ablate.run_induction(selection.model, AblateSettings.from_session())
            induction = ablate.induction(selection.model)
            if induction is not None:
                frame, summary = induction
                st.dataframe(ablate.conditions_shown(summary), hide_index=True, width="stretch")
                charts.show_chart(
                    condition_bars(
                        summary,
                        label=t("loss on the repeated half (nats)"),
                        title=t("Loss on the repeated half"),
                        words={c: ablate.condition_shown(c) for c in summary["condition"]},
                    ),
                    key="ablate_induction_chart",
                    filename="headscope-induction",
                )
                with st.expander(t("Every condition")):
                    st.dataframe(ablate.conditions_shown(frame), hide_index=True, width="stretch")
    else:
        st.caption(t("The induction experiment needs a decoder with its language-model head."))

    with st.expander(t("Importance ranking and the pruning curve (Michel et al. 2019)"), expanded=False):
        st.caption(
            t(
                "Importance: |dL/dxi| of a gate xi = 1 multiplied on each head's output, summed over sentences and "
                "normalised per layer. Then heads are removed, least important first, and the loss is measured as "
                "they go; the control removes them in random orders. Models without a head use the output change, "
                "and the loss change when each head alone is ablated as importance."
            )
        )
        config = settings()
        cols = st.columns(4)
        S["sentences"].number(
            cols[0].number_input,
            maximum=min(500, config.max_profile_sentences),
            default=min(20, config.max_profile_sentences),
        )
        S["method"].select(cols[1].selectbox)
        S["orders"].number(cols[2].number_input)
        if cols[3].button(t("Compute"), key="ablate_importance_run", type="primary"):
            ablate.compute_importance(selection.model, AblateSettings.from_session())
        ranked = ablate.importance(selection.model)
        if ranked is not None:
            importance, curves = ranked
            st.caption(
                t(
                    "{method} importance over {texts} sentences, measured on the {loss}. The heads map above can now "
                    "be coloured by it.",
                    method=t(importance.attrs["method"]),
                    texts=importance.attrs["texts"],
                    loss=t(importance.attrs["loss"]),
                )
            )
            charts.show_chart(
                pruning_figure(
                    curves,
                    label=t(curves.attrs.get("measure", "loss")),
                    title=t("Pruning: importance vs random order"),
                    words={word: t(word) for word in PRUNING_WORDS},
                ),
                key="ablate_pruning",
                filename="headscope-pruning",
            )
            st.dataframe(
                ablate.columns_shown(importance.sort_values("importance", ascending=False).head(10)),
                hide_index=True,
                width="stretch",
            )
            st.download_button(
                t("Importance (CSV)"),
                importance.to_csv(index=False).encode(),
                f"headscope-{downloads.model_slug(selection.model)}-importance.csv",
                "text/csv",
                key="ablate_importance_csv",
            )
