"""Ablate: switch heads off and watch what the model loses; rank heads by importance.

The interventions and measurements are ``mha_core.interventions``; the figures ``ui.figures.causal``.
"""

import numpy as np
import streamlit as st

from mha_core.analysis.roles import DECODER_SCORES
from mha_core.interventions.experiments import summarize_experiment
from mha_core.interventions.importance import IMPORTANCE_METHODS
from mha_core.models.ablation import MEAN_REFERENCE_SENTENCES, parse_heads
from mha_core.models.outputs import loss_table
from ui import address, computations, session, shell
from ui.figures.causal import condition_bars, head_score_map, pruning_figure, token_change_bars
from ui.settings import settings
from ui.widgets import charts, downloads, messages, pickers, sidebar, views

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

MAP_KEY, HEADS_KEY = "ablate_map", "ablate_heads"
ABLATION_LABELS = {"zero": "zero (the head's output set to 0)", "mean": "mean (its average over reference sentences)"}


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def parse_name(name: str) -> tuple[int, int]:
    return parse_heads(name)[0]


def toggle_clicked() -> None:
    """A click on the heads map adds that head to the ablated set, or removes it."""
    pickers.select_clicked_head(MAP_KEY)
    clicked = pickers.clicked_head(MAP_KEY)
    if clicked is None or clicked[0] is None:
        return
    name = head_name(*clicked)
    chosen = list(st.session_state.get(HEADS_KEY, []))
    st.session_state[HEADS_KEY] = [h for h in chosen if h != name] if name in chosen else [*chosen, name]


def map_scores(run, model_name: str) -> dict[str, tuple[str, np.ndarray]]:
    """The scores the heads map can be coloured by, by name (as in the link): their label and values. This
    sentence's measurements, decoder scores on repeated random tokens (decoders), and importance once computed."""
    metrics = computations.metrics_for(run)
    options = {
        "sink_mass": ("sink mass (this sentence)", metrics["sink_mass"].to_numpy()),
        "normalized_entropy": ("normalised entropy (this sentence)", metrics["normalized_entropy"].to_numpy()),
    }
    if run.is_causal:
        decoder = computations.decoder_scores(model_name)
        for name in DECODER_SCORES:
            options[name] = (f"{name.replace('_', ' ')} score (repeated random tokens)", decoder[name].to_numpy())
    importance = st.session_state.get("ablate_importance", {}).get(model_name)
    if importance is not None:
        options["importance"] = ("importance (Michel et al.)", importance["importance"].to_numpy())
    return {name: (label, values.reshape(run.num_layers, run.num_heads)) for name, (label, values) in options.items()}


# ---- the page -------------------------------------------------------------------------------------------
st.title("Ablate")
st.caption(
    "Attention weights show where a head looks, not whether the model needs it. Ablating a head is an "
    "experiment: its slice of the attention output (the input of the output projection) is set to 0, or to "
    "its mean over reference sentences, and the model runs again. What the model loses is the head's causal effect."
)
selection = session.selection()
run = sidebar.current_run()
if run is None:
    st.stop()
model = sidebar.current_model()
if model is None:
    st.stop()
st.caption(f"{messages.md_escape(selection.model)} has {model.head_description}.")

with messages.error_display():
    # 1. Pick heads: click the map, or take the strongest heads of a score.
    st.subheader("1. Pick heads")
    scores = map_scores(run, selection.model)
    names = [head_name(layer, head) for layer in range(run.num_layers) for head in range(run.num_heads)]
    # The heads to ablate: the map below marks them before their box is drawn.
    pickers.url_setting(HEADS_KEY, "heads", [], address.head_names(run.num_layers, run.num_heads))
    st.session_state[HEADS_KEY] = [h for h in st.session_state[HEADS_KEY] if h in names]
    cols = st.columns([3, 1, 1])
    labels = {name: label for name, (label, _) in scores.items()}
    colour = pickers.url_select(
        cols[0].selectbox,
        "Colour the map by (and pick by)",
        labels,
        key="ablate_colour",
        url_key="colour",
        format_func=labels.get,
    )
    label, values = scores[colour]
    top_k = pickers.url_number(
        cols[1].number_input, "How many", 1, len(names), key="ablate_top_k", url_key="top", default=min(5, len(names))
    )
    if cols[2].button("Pick the strongest", key="ablate_pick_top"):
        order = np.argsort(-values.reshape(-1), kind="stable")[: int(top_k)]
        st.session_state[HEADS_KEY] = [names[i] for i in order]
    chosen = [parse_name(name) for name in st.session_state[HEADS_KEY]]
    charts.show_chart(
        head_score_map(values, chosen, label=label.split(" (")[0], title="Click a head to add or remove it (x)"),
        key=MAP_KEY,
        filename="headscope-ablate-map",
        on_select=toggle_clicked,
        selection_mode="points",
    )
    pickers.url_multiselect("Heads to ablate", names, key=HEADS_KEY, url_key="heads", default=[])
    ablation = pickers.url_select(
        st.radio,
        "Ablation",
        ABLATION_LABELS,
        key="ablate_kind",
        url_key="ablation",
        format_func=ABLATION_LABELS.get,
        horizontal=True,
    )
    if ablation == "mean":
        st.caption(
            f"Mean ablation replaces each head's output by its mean over every token of the first "
            f"{MEAN_REFERENCE_SENTENCES} UD English EWT dev sentences."
        )

    # 2. The effect on this sentence.
    st.subheader("2. The effect on this sentence")
    chosen = [parse_name(name) for name in st.session_state[HEADS_KEY]]
    if not chosen:
        st.info("Pick at least one head above to see what ablating it does.")
    else:
        after = computations.get_ablated_run(
            selection.model,
            run.engine,
            selection.text,
            run.text_pair,
            selection.bos,
            tuple(chosen),
            ablation,
        )
        before = run  # plain runs carry no losses: the unablated run with them, cached like the ablated one
        if after.token_losses is not None:
            before = computations.get_ablated_run(
                selection.model, run.engine, selection.text, run.text_pair, selection.bos, (), ablation
            )
        table = loss_table(before, after)
        if after.token_losses is not None:
            finite = np.isfinite(after.token_losses)
            mean_before, mean_after = (
                float(np.mean(before.token_losses[finite])),
                float(np.mean(after.token_losses[finite])),
            )
            cols = st.columns(3)
            cols[0].metric("Mean loss before", f"{mean_before:.3f}")
            cols[1].metric(
                "After ablation", f"{mean_after:.3f}", delta=f"{mean_after - mean_before:+.3f}", delta_color="inverse"
            )
            cols[2].metric("Heads ablated", len(chosen))
            what = (
                "loss of predicting each token from the ones before it (nats)"
                if model.lm_head_kind == "causal"
                else "loss of each token when it is masked (nats)"
            )
            charts.show_chart(
                token_change_bars(
                    table["token"].tolist(),
                    table["loss_after"].to_numpy(),
                    table["loss_before"].to_numpy(),
                    label="loss",
                    positions=table["position"].tolist(),
                ),
                key="ablate_losses",
                filename="headscope-ablate-losses",
            )
            st.caption(f"Per token: the {what}, before (grey) and after (red).")
        else:
            st.metric("Output change (cosine distance of the sentence embedding)", f"{after.output_change:.4g}")
            charts.show_chart(
                token_change_bars(
                    table["token"].tolist(),
                    table["output_change"].to_numpy(),
                    label="output change (1 - cos)",
                    positions=table["position"].tolist(),
                ),
                key="ablate_losses",
                filename="headscope-ablate-output-change",
            )
            st.caption(
                "This encoder has no language-model head, so there is no loss: the bars are how far each token's "
                "final vector turned (1 - cosine similarity to the unablated run)."
            )
        st.dataframe(table, hide_index=True, width="stretch")
        first = min(layer for layer, _ in chosen)
        if first + 1 < run.num_layers:
            layer = pickers.url_number(
                st.slider,
                "Attention of a later layer",
                first + 1,
                run.num_layers - 1,
                key="ablate_layer",
                url_key="later_layer",
                default=first + 1,
            )
            st.caption(
                f"Layer {layer}: attention after ablation minus before (red: more attention after, blue: less). "
                f"Layers up to {first} are unchanged."
            )
            views.difference_view(
                after,
                run,
                layer,
                layer,
                key="ablate_difference",
                titles=("after ablation", "before"),
                title=f"Layer {layer}: after − before",
            )

    # 3. One-click experiments, with their controls.
    st.subheader("3. Experiments")
    if model.lm_head_kind == "causal":
        with st.expander("Induction: ablate the top heads of a role vs random heads", expanded=True):
            st.caption(
                "Sequences of random tokens, each repeated once (BOS + 50 tokens + the same 50). A model that "
                "copies predicts the repeated half well; induction heads are how. The top-k heads of the chosen "
                "score are ablated, and, as the control, k random heads in several draws."
            )
            cols = st.columns(4)
            role = pickers.url_select(
                cols[0].selectbox, "Role score", DECODER_SCORES, key="ablate_role", url_key="role", default="induction"
            )
            k = pickers.url_number(
                cols[1].number_input, "k heads", 1, len(names), key="ablate_k", url_key="k", default=min(5, len(names))
            )
            draws = pickers.url_number(
                cols[2].number_input, "Random draws", 2, 20, key="ablate_draws", url_key="draws", default=4
            )
            if cols[3].button("Run", key="ablate_induction_run", type="primary"):
                st.session_state.setdefault("ablate_induction", {})[selection.model] = (
                    int(k),
                    int(draws),
                    role,
                    ablation,
                )
            setting = st.session_state.get("ablate_induction", {}).get(selection.model)
            if setting:
                frame = computations.induction_table(selection.model, *setting)
                summary = summarize_experiment(frame)
                st.dataframe(summary, hide_index=True, width="stretch")
                charts.show_chart(
                    condition_bars(
                        summary, label="loss on the repeated half (nats)", title="Loss on the repeated half"
                    ),
                    key="ablate_induction_chart",
                    filename="headscope-induction",
                )
                with st.expander("Every condition"):
                    st.dataframe(frame, hide_index=True, width="stretch")
    else:
        st.caption("The induction experiment needs a decoder with its language-model head.")

    with st.expander("Importance ranking and the pruning curve (Michel et al. 2019)", expanded=False):
        st.caption(
            "Importance: |dL/dxi| of a gate xi = 1 multiplied on each head's output, summed over sentences and "
            "normalised per layer. Then heads are removed, least important first, and the loss is measured as "
            "they go; the control removes them in random orders. Models without a head use the output change, "
            "and the loss change when each head alone is ablated as importance."
        )
        config = settings()
        cols = st.columns(4)
        sentences = pickers.url_number(
            cols[0].number_input,
            "UD EWT dev sentences",
            2,
            min(500, config.max_profile_sentences),
            key="ablate_sentences",
            url_key="sentences",
            default=min(20, config.max_profile_sentences),
        )
        method = pickers.url_select(
            cols[1].selectbox, "Method", IMPORTANCE_METHODS, key="ablate_method", url_key="method"
        )
        seeds = pickers.url_number(
            cols[2].number_input, "Random orders", 1, 10, key="ablate_seeds", url_key="orders", default=3
        )
        if cols[3].button("Compute", key="ablate_importance_run", type="primary"):
            st.session_state.setdefault("ablate_importance_settings", {})[selection.model] = (
                int(sentences),
                method,
                int(seeds),
            )
        setting = st.session_state.get("ablate_importance_settings", {}).get(selection.model)
        if setting:
            importance, curves = computations.importance_and_pruning(selection.model, *setting, 10)
            st.session_state.setdefault("ablate_importance", {})[selection.model] = importance
            st.caption(
                f"{importance.attrs['method']} importance over {importance.attrs['texts']} sentences, "
                f"measured on the {importance.attrs['loss']}. The heads map above can now be coloured by it."
            )
            charts.show_chart(
                pruning_figure(
                    curves, label=curves.attrs.get("measure", "loss"), title="Pruning: importance vs random order"
                ),
                key="ablate_pruning",
                filename="headscope-pruning",
            )
            st.dataframe(
                importance.sort_values("importance", ascending=False).head(10), hide_index=True, width="stretch"
            )
            st.download_button(
                "Importance (CSV)",
                importance.to_csv(index=False).encode(),
                f"headscope-{downloads.model_slug(selection.model)}-importance.csv",
                "text/csv",
                key="ablate_importance_csv",
            )
