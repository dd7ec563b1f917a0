"""Head roles: which head does what on the current sentence (and, once profiled, on a corpus), with the
evidence for every claim. The measurements are ``mha_core.analysis.metrics`` / ``mha_core.analysis.roles``; the figures
are ``ui.figures.roles``."""

import pandas as pd
import streamlit as st

import mha_core
from mha_core.analysis import roles as roles_module
from mha_core.analysis.metrics import METRIC_DESCRIPTIONS
from mha_core.analysis.roles import ROLE_GROUPS
from ui import computations, figures, session, shell
from ui import page_roles as page
from ui.figures.roles import HOVER_WORDS, ROLE_GROUP_LABELS, SOURCE_KEY, SOURCE_WORDS, head_layout_map, role_map
from ui.i18n import t
from ui.page_roles import RolesSettings
from ui.settings import PROFILE_SENTENCES, settings
from ui.widgets import charts, joint_qk, messages, pickers, sidebar, views

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

GLOSSARY = """
- **Role**: what a head does, named only when a published test says so with numbers: its **score**, the
  **threshold** it passes, how many observations it rests on (**n**), what **chance** would give (attention
  spread evenly, a random choice, or the best fixed-offset rule), and a **95% interval** that must clear chance.
- **Sink / no-op**: a head that puts most of its attention on a token of no content ([CLS], [SEP], BOS or the
  first token) whatever the query: it is resting, not reading.
- **Delimiter**: a head that attends mostly to punctuation.
- **Positional**: the largest weight lands at one fixed offset (the previous token, itself, the next token) for
  nearly every query.
- **Broad**: attention spread nearly evenly over everything visible.
- **Syntactic / coreference / decoder**: found on many sentences (the corpus profile) or on repeated random
  tokens, never on one sentence: which head finds a word's grammatical parent, a pronoun's antecedent, the token
  after an earlier copy of the current one (induction).
- **Held-out half**: a syntactic head is picked on half of the sentences and must prove itself on the other half,
  so a head that won by luck among many does not get the role.
- **Entropy**: how spread out a row of attention is: 0 = all on one token, 1 (normalised) = evenly on all.
- **Jensen-Shannon distance**: how different two heads' attention is, 0 (identical) to 1 bit (disjoint).
- **MDS map**: the heads placed on a plane so that their distances match the Jensen-Shannon distances as well as
  two dimensions allow: heads that attend alike sit together.
"""
MAP_KEY, LAYOUT_KEY = "roles_map", "roles_layout"
S = RolesSettings.declarations()


def select_from_chart(chart_key: str) -> None:
    """A click on the role map or the MDS map selects that head (both carry [layer, head] first)."""
    pickers.select_clicked_head(chart_key)


def profile_controls(run, model_name: str) -> None:
    """The corpus profile: UD EWT dev sentences with gold trees (and, for decoders, repeated random tokens)."""
    with st.expander(t("Corpus profile: syntactic, coreference and decoder heads"), expanded=False):
        st.caption(
            t(
                "Scores every head on sentences of the UD English EWT dev split (gold trees) and, for decoders, "
                "on repeated random tokens. Results are cached per model."
            )
        )
        config = settings()
        cols = st.columns([2, 1])
        sentences = S["sentences"].number(
            cols[0].number_input,
            maximum=config.max_profile_sentences,
            default=min(PROFILE_SENTENCES, config.max_profile_sentences),
            step=10,
        )
        if config.classroom:
            st.caption(
                t(
                    "On this shared server a profile holds at most {count} sentences, and one runs at a time.",
                    count=config.max_profile_sentences,
                )
            )
        if cols[1].button(t("Profile heads"), key="roles_profile_button", type="primary"):
            page.ask_profile(model_name, sentences)
        said = page.run_profile(model_name, run.is_causal, config.classroom)
        if said is not None:
            (st.warning if said[0] == "warning" else st.error)(t(said[1]) if said[0] == "warning" else said[1])


def source_choice(model_name: str) -> str:
    """Where the positional, delimiter and broad roles come from: offered once a corpus profile is done."""
    sentences = page.profiled_sentences(model_name)
    if sentences is None:
        return "sentence"
    declared = S["source"]
    return declared.select(st.radio, horizontal=True, help=t(declared.help, sentences=sentences))


def head_evidence(run, metrics: pd.DataFrame, roles: pd.DataFrame) -> tuple[int, int]:
    """One head: its roles with score, threshold and evidence, its attention, every measurement. Returns the head
    ``(layer, head)``."""
    st.subheader(t("Evidence for one head"))
    cols = st.columns(2)
    layer = pickers.select_layer(run.num_layers, container=cols[0])
    head = pickers.select_head(run.num_heads, container=cols[1])
    own = roles[(roles["layer"] == layer) & (roles["head"] == head)]
    if own.empty:
        st.info(t("Layer {layer} head {head}: no role passes its threshold on this evidence.", layer=layer, head=head))
    else:
        own = page.roles_shown(own).assign(source=[t(source) for source in own["source"]])
        st.dataframe(
            own[["role", "score", "threshold", "n", "baseline", "ci_low", "ci_high", "source", "evidence"]],
            hide_index=True,
            width="stretch",
            column_config={
                "role": st.column_config.TextColumn(t("role")),
                "score": st.column_config.NumberColumn(t("score")),
                "threshold": st.column_config.NumberColumn(t("threshold")),
                "baseline": st.column_config.NumberColumn(t("chance"), format="%.3f"),
                "ci_low": st.column_config.NumberColumn(t("95% CI from"), format="%.3f"),
                "ci_high": st.column_config.NumberColumn(t("95% CI to"), format="%.3f"),
                "n": st.column_config.NumberColumn("n", format="%d"),
                "source": st.column_config.TextColumn(t("source")),
                "evidence": st.column_config.TextColumn(t("evidence")),
            },
        )
        # The evidence in full (a table cell cuts it): a syntactic role's both halves, every role's numbers.
        for role, evidence in zip(own["role"], own["evidence"]):
            st.caption(f"**{role}**: {evidence}")
    left, right = st.columns([3, 2])
    with left:
        charts.show_chart(
            figures.head_heatmap(
                run.attentions[layer, head],
                run.tokens,
                run.tokens,
                title=t("Layer {layer} head {head} on the current sentence", layer=layer, head=head),
                **views.figure_options(run),
            ),
            key="roles_head_heatmap",
            filename=f"headscope-layer{layer}-head{head}",
        )
    with right:
        scores = page.head_measurements(metrics, layer, head)
        st.dataframe(scores, hide_index=True, width="stretch")
    return layer, head


# ---- the page -------------------------------------------------------------------------------------------
st.title(t("Head roles"))
st.caption(
    t(
        "Every head measured on the current sentence and named after the published tests it passes. "
        "Hover a head for its role, score and evidence; click one to open its evidence below. "
        "Formulas and thresholds: docs/metrics.md."
    )
)
with st.expander(t("What the words mean"), icon=":material/menu_book:"):
    st.markdown(t(GLOSSARY))
selection = session.selection()
run = sidebar.current_run()
if run is None:
    st.stop()

with messages.error_display():
    metrics, semantic, distances = computations.sentence_analysis(selection.model, run)
    profile_controls(run, selection.model)
    roles, primary, dependency = page.roles_of(run, selection.model, metrics, semantic, source_choice(selection.model))

    counts = primary["group"].value_counts()
    st.subheader(t("Role of every head"))
    st.caption(
        t(
            "Each cell names its head's role group; the shape in its corner says where the evidence comes from: "
            "{key}. A role is named only when its 95% interval clears what chance would give; a syntactic "
            "role only when it holds on sentences it was not chosen on (table below).",
            key=t(SOURCE_KEY),
        )
    )
    st.caption(" · ".join(f"{t(group)}: {counts.get(group, 0)}" for group in ROLE_GROUPS if counts.get(group, 0)))
    words = {
        word: t(word) for word in (*ROLE_GROUPS, *ROLE_GROUP_LABELS.values(), *SOURCE_WORDS.values(), *HOVER_WORDS)
    }
    charts.show_chart(
        role_map(
            page.roles_shown(primary),
            run.num_layers,
            run.num_heads,
            ROLE_GROUPS,
            title=t("{layers} layers x {heads} heads, coloured by role", layers=run.num_layers, heads=run.num_heads),
            words=words,
        ),
        key=MAP_KEY,
        filename="headscope-roles",
        on_select=lambda: select_from_chart(MAP_KEY),
        selection_mode="points",
    )

    if S["causal"].toggle():
        effect = computations.role_ablation(selection.model, run, primary)
        st.caption(
            t(
                "All heads of a role zero-ablated at once (Ablate page, mha_core.interventions): how much the "
                "{measure} of this sentence rises. A role whose heads change nothing is a pattern the model does "
                "not need here.",
                measure=t(effect["measure"].iloc[0] if len(effect) else "loss"),
            )
        )
        st.dataframe(page.role_effect_shown(effect), hide_index=True, width="stretch")

    if dependency is not None:
        st.subheader(t("Best head per dependency relation, chosen on one half and tested on the other"))
        st.caption(
            t(
                "Clark et al. (2019): accuracy of the head's word-level argmax at finding the parent (or a child) "
                "against a fixed-offset baseline, on UD English EWT dev. The sentences fall in two halves by a hash "
                "of their words: the head is chosen on the selection half, then measured on the held-out half "
                "against the best fixed offset of the held-out half itself (the offset the selection half chose is "
                "shown beside it), with a 95% interval over sentences. A role is named (first column) only when the "
                "held-out margin beats +{margin} in a one-sided test (Student's t over the held-out sentences, at "
                "least {sentences} of them), Holm-corrected over every head, relation and direction tried "
                "(relations with >= {count} cases).",
                margin=f"{roles_module.SYNTACTIC_MIN_MARGIN:.0%}",
                sentences=roles_module.SYNTACTIC_MIN_SENTENCES,
                count=roles_module.SYNTACTIC_MIN_COUNT,
            )
        )
        min_count = S["min_count"].number(st.number_input)
        best = page.heldout_rows(mha_core.best_heldout_heads(dependency, min_count=int(min_count)))
        st.dataframe(
            best,
            hide_index=True,
            width="stretch",
            column_order=list(page.HELDOUT_TABLE),
            column_config={
                column: (
                    st.column_config.NumberColumn(
                        t(label), format=page.HELDOUT_NUMBERS[column], help=t(help_text) or None, width=width
                    )
                    if column in page.HELDOUT_NUMBERS
                    else st.column_config.CheckboxColumn(t(label), help=t(help_text), width=width, pinned=True)
                    if column == "named"
                    else st.column_config.TextColumn(
                        t(label), help=t(help_text) or None, width=width, pinned=column == "relation" or None
                    )
                )
                for column, (label, width, help_text) in page.HELDOUT_TABLE.items()
            },
        )

    st.subheader(t("Map of heads"))
    color_by = S["colour_by"].select(st.radio, horizontal=True)
    st.caption(
        t(
            "Classical MDS of the Jensen-Shannon distances between heads (Clark et al. 2019): heads that "
            "attend alike sit close together."
        )
    )
    if run.num_tokens > computations.DISTANCE_MAX_QUERIES:
        st.caption(
            t(
                "{tokens} tokens: distances are averaged over {queries} evenly spaced query tokens to keep this "
                "page fast.",
                tokens=run.num_tokens,
                queries=computations.DISTANCE_MAX_QUERIES,
            )
        )
    shown_roles = page.roles_shown(primary)[["layer", "head", "role", "group"]]
    table = distances.layout_frame().merge(shown_roles, on=["layer", "head"])
    charts.show_chart(
        head_layout_map(
            table, ROLE_GROUPS, color_by=color_by, title=t("Heads placed by how alike they attend"), words=words
        ),
        key=LAYOUT_KEY,
        filename="headscope-head-map",
        on_select=lambda: select_from_chart(LAYOUT_KEY),
        selection_mode="points",
    )
    if distances.collapse_groups:
        groups = "; ".join(", ".join(f"L{l}H{h}" for l, h in group) for group in distances.collapse_groups)
        st.warning(
            t(
                "Near-identical heads (mean JS divergence < {threshold} bit): {groups}",
                threshold=distances.collapse_threshold,
                groups=groups,
            )
        )
    else:
        st.caption(
            t("No collapse: no two heads are closer than {threshold} bit.", threshold=distances.collapse_threshold)
        )

    st.subheader(t("Per-layer curves"))
    charts.show_chart(
        figures.layer_curves(
            distances.layer_spread(),
            "distance_to_layer",
            label=t("JS divergence to the other heads of the layer (bits)"),
            title=t("Diversity: mean JS distance between the heads of a layer (dots: each head to the others)"),
        ),
        key="roles_diversity",
        filename="headscope-diversity",
    )
    # Each choice in words, worked out now (a format function runs outside the page's run too: AppTest).
    described = {name: t(METRIC_DESCRIPTIONS.get(name, name)) for name in page.measurements(metrics)}
    measure = S["measure"].select(st.selectbox, list(described), format_func=described.get)
    charts.show_chart(
        figures.layer_curves(metrics, measure, label=t(METRIC_DESCRIPTIONS.get(measure, measure))),
        key="roles_curve",
        filename=f"headscope-{measure}",
    )

    chosen = head_evidence(run, metrics, roles)
    joint_qk.section(*chosen, selection.model, selection.engine)  # its queries and keys over a corpus (AttentionViz)
