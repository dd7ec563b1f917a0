"""Explore's "What does the prediction depend on?" (issue 33): the sentence's tokens coloured by each attribution
method side by side with attention and rollout, the methods' agreement, which heads agree, and the deletion and
insertion curves (``mha_core.interventions.token_attribution`` and ``faithfulness``, one ``TokenAttribution``
operation through ``ui.compute.compute``). Every setting is in the address (``?attr=1&atarget=&apair=&amethods=
&aref=``)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from mha_core.interventions.faithfulness import RANDOM, head_agreement, mean_curves
from mha_core.interventions.token_attribution import GRADIENT_METHODS, METHOD_LABELS, METHODS
from mha_core.operations.attribution import TokenAttribution
from ui import compute, session
from ui.figures.attribution import agreement_matrix, removal_curves, token_scores
from ui.figures.causal import head_score_map
from ui.widgets import charts, messages, pickers

DEFAULT_PAIR = "A dog sat on a mat."
REFERENCES = ("integrated_gradients", "occlusion", "gradient_x_input")  # what the heads are compared with


def operation(model, selection, target, methods) -> TokenAttribution:
    """The operation for the sidebar's sentence (tokenized once, as ``model.run`` does)."""
    encoded = model.encode(selection.text, None, selection.bos)
    return TokenAttribution(model.name, encoded, target, tuple(methods))


def _target(model):
    """What is explained: the next token (empty: the model's top one) or, for a sentence encoder, a second
    sentence; None when this model has neither (a notice says so)."""
    if model.lm_head_kind == "causal":
        typed = pickers.url_text(
            "Next token to explain (empty: the model's own top prediction; mind the leading space)",
            key="attr_target",
            url_key="atarget",
            default="",
            what="token",
        )
        return typed or None
    if not model.is_causal:
        return pickers.url_text(
            "Second sentence: the prediction explained is its similarity with the sidebar's sentence",
            key="attr_pair",
            url_key="apair",
            default=DEFAULT_PAIR,
            what="second sentence",
        )
    st.info(
        f"{messages.md_escape(model.name)} has {model.head_description}: token attribution explains a decoder's "
        "next token or a sentence encoder's similarity of two sentences.",
        icon=":material/info:",
    )
    return None


def section() -> None:
    """The section, drawn under Explore's views."""
    st.subheader("What does the prediction depend on?")
    with messages.error_display():
        selection = session.selection()
        model = compute.get_model(selection.model)
        if getattr(model, "is_encoder_decoder", False):
            st.info("Token attribution reads single-stack models (SmolLM2, MiniLM, MPNet).", icon=":material/info:")
            return
        st.caption(
            "Gradient-based scores (integrated gradients, gradient x input) and occlusion measure what the "
            "prediction depends on; attention, attention norms and rollout say where the heads look. Do they "
            "agree? Red: the token raises the prediction; blue: lowers it. Each row is scaled to its largest value."
        )
        target = _target(model)
        if target is None and model.lm_head_kind != "causal":
            return
        methods = pickers.url_multiselect(
            "Methods", METHODS, key="attr_methods", url_key="amethods", default=list(METHODS),
            format_func=METHOD_LABELS.get,
        )  # fmt: skip
        if not methods:
            st.info("Pick at least one method.")
            return
        op = operation(model, selection, target, methods)
        if not pickers.start_button("Score the tokens", key="attribution", ready=compute.ready(op)):
            return
        explained = compute.compute(op, model)
        show(explained, model)


def labelled(order: str) -> str:
    """A method's label, or the random orders'."""
    return METHOD_LABELS.get(order, "random order (mean of seeds)")


def show(explained, model) -> None:
    """The scores, the agreement, the heads' agreement and the curves of one ``Explanation``."""
    attribution = explained.attribution
    ordinary = attribution.ordinary
    tokens = [attribution.tokens[p] for p in ordinary]
    what = (
        f"the log-probability of the next token {attribution.target!r}"
        if attribution.kind == "next token"
        else "the similarity of the two sentences (cosine of mean-pooled embeddings)"
    )
    st.caption(
        messages.md_escape(
            f"Explained: {what}, {attribution.prediction:.3f} on the whole sentence. Special tokens (BOS, CLS, SEP) "
            "are left out: attention sinks there."
        )
    )
    rows = {METHOD_LABELS[m]: attribution.method_scores(m) for m in attribution.methods}
    layer, head = int(st.session_state.get("layer", 0)), int(st.session_state.get("head", 0))
    if layer < model.num_layers and head < model.num_heads:
        rows[f"Head {layer}.{head} (the selected head's row)"] = attribution.head_rows[layer, head, ordinary]
    charts.show_chart(token_scores(tokens, rows), key="attr_tokens", filename="headscope-token-attribution")
    if attribution.completeness_error is not None:
        st.caption(
            f"Integrated gradients ({attribution.metadata['steps']} steps): the scores sum to the prediction's change "
            f"from the baseline (zero vectors) up to {attribution.completeness_error:+.4f} "
            f"(the change: {attribution.prediction - attribution.baseline_prediction:+.4f})."
        )
    left, right = st.columns(2)
    with left:
        charts.show_chart(
            agreement_matrix(
                [METHOD_LABELS[m] for m in explained.agreement.index],
                explained.agreement.to_numpy(),
                "Agreement (Spearman, |score|)",
            ),
            key="attr_agreement",
        )
    references = [m for m in REFERENCES if m in attribution.methods]
    with right:
        if references:
            reference = pickers.url_select(
                st.selectbox, "Heads compared with", references, key="attr_reference", url_key="aref",
                format_func=METHOD_LABELS.get,
            )  # fmt: skip
            agreement = head_agreement(attribution, reference)
            charts.show_chart(
                head_score_map(np.nan_to_num(agreement), [(layer, head)], label="Spearman", signed=True),
                key="attr_heads",
            )
            best = np.unravel_index(np.nanargmax(agreement), agreement.shape) if np.isfinite(agreement).any() else None
            if best is not None:
                st.caption(
                    f"Head {best[0]}.{best[1]}'s row agrees best with {METHOD_LABELS[reference].lower()} "
                    f"(Spearman {agreement[best]:.2f})."
                )
    if explained.faithfulness is not None:
        curves = explained.faithfulness.curves
        label = "log-probability" if attribution.kind == "next token" else "similarity"
        left, right = st.columns(2)
        for column, curve in zip((left, right), ("deletion", "insertion")):
            lines = {labelled(order): line for order, line in mean_curves(curves, curve).items()}
            title = f"{curve.capitalize()}: most important first"
            with column:
                charts.show_chart(removal_curves(lines, labelled(RANDOM), curve, label, title), key=f"attr_{curve}")
        table = explained.faithfulness.aopc.copy()
        table["method"] = [labelled(m) for m in table["method"]]
        st.dataframe(table, hide_index=True)
        st.caption(
            "AOPC (DeYoung et al. 2020): deletion, the mean drop as the top tokens are removed (dropped from the "
            "sequence); insertion, the mean rise as they are added back to the special tokens alone. Higher is "
            "more faithful; compare with the random order."
        )
    if not any(m in attribution.methods for m in GRADIENT_METHODS):
        st.caption("Add integrated gradients or gradient x input to compare attention with the gradients.")
