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
from ui.i18n import joined, t
from ui.i18n import text as tt
from ui.page_classroom import ClassroomSettings
from ui.page_explore import DEFAULT_PAIR, ExploreSettings
from ui.settings import model_choices
from ui.widgets import charts, messages, pickers

S = ExploreSettings.declarations()
CLASS_STARTED = "_cls_attribution_started"
CLASS_MODELS = ("smollm2", "minilm", "mpnet")  # the Classroom's choice: a decoder first, then sentence encoders
REFERENCES = ("integrated_gradients", "occlusion", "gradient_x_input")  # what the heads are compared with


def operation(model, selection, target, methods) -> TokenAttribution:
    """The operation for the sidebar's sentence (tokenized once, as ``model.run`` does)."""
    encoded = model.encode(selection.text, None, selection.bos)
    return TokenAttribution(model.name, encoded, target, tuple(methods))


def _target(model):
    """What is explained: the next token (empty: the model's top one) or, for a sentence encoder, a second
    sentence; None when this model has neither (a notice says so)."""
    if model.lm_head_kind == "causal":
        typed = S["attr_target"].text(what="token")
        return typed or None
    if not model.is_causal:
        return S["attr_pair"].text(what="second sentence")
    st.info(
        t(
            "{model} has {head}: token attribution explains a decoder's next token or a sentence encoder's "
            "similarity of two sentences.",
            model=messages.md_escape(model.name),
            head=model.head_description,
        ),
        icon=":material/info:",
    )
    return None


def section() -> None:
    """The section, drawn under Explore's views."""
    st.subheader(t("What does the prediction depend on?"))
    # Opt-in: scoring the tokens takes dozens of forward passes (integrated gradients' steps, occlusion, the deletion
    # and insertion curves), too many to run under every sentence Explore shows.
    if not ExploreSettings.declared("attr_on").toggle(
        help=t(
            "Integrated gradients, gradient x input, occlusion, attention norms, rollout and attention, with "
            "their agreement and deletion curves: dozens of forward passes."
        ),
    ):
        st.caption(t("Switch it on to measure which input tokens the model's prediction depends on."))
        return
    with messages.error_display():
        selection = session.selection()
        model = compute.get_model(selection.model)
        if getattr(model, "is_encoder_decoder", False):
            st.info(t("Token attribution reads single-stack models (SmolLM2, MiniLM, MPNet)."), icon=":material/info:")
            return
        st.caption(
            t(
                "Gradient-based scores (integrated gradients, gradient x input) and occlusion measure what the "
                "prediction depends on; attention, attention norms and rollout say where the heads look. Do they "
                "agree? Red: the token raises the prediction; blue: lowers it. Each row is scaled to its largest "
                "value."
            )
        )
        target = _target(model)
        if target is None and model.lm_head_kind != "causal":
            return
        methods = S["attr_methods"].multiselect(list(METHODS), format_func=lambda m: t(METHOD_LABELS[m]))
        if not methods:
            st.info(t("Pick at least one method."))
            return
        op = operation(model, selection, target, methods)
        if not pickers.start_button(t("Score the tokens"), key="attribution", ready=compute.ready(op)):
            return
        explained = compute.compute(op, model)
        show(explained, model)


def labelled(order: str) -> str:
    """A method's label, or the random orders'."""
    return t(METHOD_LABELS.get(order, "random order (mean of seeds)"))


def show(explained, model) -> None:
    """The scores, the agreement, the heads' agreement and the curves of one ``Explanation``."""
    attribution = explained.attribution
    ordinary = attribution.ordinary
    tokens = [attribution.tokens[p] for p in ordinary]
    what = (
        t("the log-probability of the next token {token}", token=repr(attribution.target))
        if attribution.kind == "next token"
        else t("the similarity of the two sentences (cosine of mean-pooled embeddings)")
    )
    st.caption(
        messages.md_escape(
            t(
                "Explained: {what}, {value} on the whole sentence. Special tokens (BOS, CLS, SEP) are left out: "
                "attention sinks there.",
                what=what,
                value=f"{attribution.prediction:.3f}",
            )
        )
    )
    rows = {labelled(m): attribution.method_scores(m) for m in attribution.methods}
    layer, head = int(st.session_state.get("layer", 0)), int(st.session_state.get("head", 0))
    if layer < model.num_layers and head < model.num_heads:
        rows[t("Head {layer}.{head} (the selected head's row)", layer=layer, head=head)] = attribution.head_rows[
            layer, head, ordinary
        ]
    charts.show_chart(token_scores(tokens, rows), key="attr_tokens", filename="headscope-token-attribution")
    if attribution.completeness_error is not None:
        st.caption(
            t(
                "Integrated gradients ({steps} steps): the scores sum to the prediction's change from the baseline "
                "(zero vectors) up to {error} (the change: {change}).",
                steps=attribution.metadata["steps"],
                error=f"{attribution.completeness_error:+.4f}",
                change=f"{attribution.prediction - attribution.baseline_prediction:+.4f}",
            )
        )
    left, right = st.columns(2)
    with left:
        charts.show_chart(
            agreement_matrix(
                [labelled(m) for m in explained.agreement.index],
                explained.agreement.to_numpy(),
                t("Agreement (Spearman, |score|)"),
            ),
            key="attr_agreement",
        )
    references = [m for m in REFERENCES if m in attribution.methods]
    with right:
        if references:
            reference = S["attr_reference"].select(st.selectbox, references, format_func=labelled)
            agreement = head_agreement(attribution, reference)
            charts.show_chart(
                head_score_map(np.nan_to_num(agreement), [(layer, head)], label="Spearman", signed=True),
                key="attr_heads",
            )
            best = np.unravel_index(np.nanargmax(agreement), agreement.shape) if np.isfinite(agreement).any() else None
            if best is not None:
                st.caption(
                    t(
                        "Head {layer}.{head}'s row agrees best with {method} (Spearman {value}).",
                        layer=best[0],
                        head=best[1],
                        method=labelled(reference).lower(),
                        value=f"{agreement[best]:.2f}",
                    )
                )
    if explained.faithfulness is not None:
        curves = explained.faithfulness.curves
        label = t("log-probability") if attribution.kind == "next token" else t("similarity")
        left, right = st.columns(2)
        for column, curve in zip((left, right), ("deletion", "insertion")):
            lines = {labelled(order): line for order, line in mean_curves(curves, curve).items()}
            title = t("Deletion: most important first") if curve == "deletion" else t("Insertion: most important first")
            with column:
                charts.show_chart(removal_curves(lines, labelled(RANDOM), curve, label, title), key=f"attr_{curve}")
        table = explained.faithfulness.aopc.copy()
        table["method"] = [labelled(m) for m in table["method"]]
        st.dataframe(table, hide_index=True)
        st.caption(
            t(
                "AOPC (DeYoung et al. 2020): deletion, the mean drop as the top tokens are removed (dropped from the "
                "sequence); insertion, the mean rise as they are added back to the special tokens alone. Higher is "
                "more faithful; compare with the random order."
            )
        )
    if not any(m in attribution.methods for m in GRADIENT_METHODS):
        st.caption(t("Add integrated gradients or gradient x input to compare attention with the gradients."))


# ---- the Classroom's closing step --------------------------------------------------------------------------
def agreement_words(value: float) -> str:
    """A Spearman correlation in words for the class."""
    if value != value:
        return "not measurable here"
    if value >= 0.7:
        return "strong"
    if value >= 0.3:
        return "moderate"
    if value >= 0.1:
        return "weak"
    return "none or negative"


def classroom_models() -> list[str]:
    """The models the closing step offers: the embedded ones this server allows."""
    offered = model_choices()
    return [name for name in CLASS_MODELS if name in offered]


def classroom_step(ask) -> None:
    """ "Is attention explanation?": on the sidebar's sentence and model, the class predicts whether the tokens
    attention favours are the tokens the prediction depends on, then sees the measured agreement. ``ask`` is the
    Classroom's predict-then-reveal question."""
    messages.explain(
        "Attention says where a head looks. Does it say why the model predicts what it does? Jain and Wallace "
        "(2019) found raw attention agrees poorly with gradient-based importance; Wiegreffe and Pinter (2019) "
        "answered that it depends on the test. Measure it on the class's sentence: integrated gradients and "
        "occlusion change the input and watch the prediction; attention and rollout only read the weights."
    )
    with messages.error_display():
        name = ClassroomSettings.declared("attr_model").select(st.selectbox, classroom_models())
        text = ClassroomSettings.declared("attr_text").text(what="sentence")
        # Heavy work on a click only (also on the one page of every step): nothing loads before it.
        if st.button(t("Measure it on this sentence"), key="cls_attr_go", type="primary"):
            st.session_state[CLASS_STARTED] = True
        if not st.session_state.get(CLASS_STARTED):
            return
        model = compute.get_model(name)
        target = None if model.lm_head_kind == "causal" else DEFAULT_PAIR
        if target is not None:
            st.caption(
                t(
                    "A sentence encoder: its similarity with {pair} is explained.",
                    pair=messages.md_escape(repr(DEFAULT_PAIR)),
                )
            )
        selection = session.Selection(model=name, engine="transformers", text=text, text_pair=None)
        op = operation(model, selection, target, METHODS)
        closing_question(ask, compute.compute(op, model))


def closing_question(ask, explained) -> None:
    """The question of ``classroom_step`` and its answer, measured."""
    agreement = explained.agreement
    reference = "integrated_gradients"
    lines = [
        tt(
            "{method}: Spearman {value} ({words})",
            method=tt(METHOD_LABELS[m]),
            value=f"{agreement.loc[m, reference]:+.2f}",
            words=tt(agreement_words(agreement.loc[m, reference])),
        )
        for m in ("attention", "rollout", "attention_norms", "occlusion")
    ]

    measured = agreement.loc["attention", reference]
    correct = 0 if measured >= 0.7 else 1 if measured >= 0.3 else 2  # agreement_words' strong, moderate, weak

    def evidence() -> None:
        attribution = explained.attribution
        tokens = [attribution.tokens[p] for p in attribution.ordinary]
        rows = {METHOD_LABELS[m]: attribution.method_scores(m) for m in attribution.methods}
        charts.show_chart(token_scores(tokens, rows), key="cls_attr_tokens")

    ask(
        tt("Are the tokens the last layer attends to most the tokens the prediction depends on most?"),
        tt(
            "Measured against integrated gradients on this sentence: {lines}. The published finding: raw attention "
            "agrees poorly, norm- and rollout-based scores somewhat better (docs/findings.md measures it over many "
            "sentences).",
            lines=joined(lines, "; "),
        ),
        evidence,
        options=["Yes, the same tokens", "Partly", "No, different tokens"],  # kept in English; each screen its own
        correct=correct,
    )
