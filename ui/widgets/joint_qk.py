"""The Head roles page's joint query-key view of the chosen head (``mha_core.joint_qk``, AttentionViz): its queries
and keys over sentences of the UD English EWT dev split in one plane, coloured by kind, position or POS tag; a click
on a point shows its sentence with the token marked and a link that opens the sentence in Explore. Its settings
are the page's (``RolesSettings``: ``qk``, ``qk_sentences``, ``qk_method``, ``qk_colour``)."""

from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.interventions.joint_qk import METHODS, JointQK
from mha_core.operations import JointQueryKey
from ui.compute import compute, get_model, ready
from ui.figures.joint_qk import joint_qk_figure
from ui.i18n import t
from ui.page_roles import RolesSettings
from ui.widgets import charts, messages, pickers

CHART_KEY = "roles_joint_qk_map"
# Queries (and as many keys) the page projects at most: 40 sentences of the dev split are about 700 tokens. It bounds
# the passes too (the sentences are read until it is reached), so the view stays light work on a shared server.
APP_MAX_POINTS = 1500

ABOUT = (
    "A head scores a key by the dot product of a query (from the token looking) and a key (from the token looked "
    "at). Drawn in one plane, over many sentences, a key sits near the queries that score it highly: clusters show "
    "what the head matches (Yeh et al. 2023, AttentionViz)."
)
NORMALISED = (
    "Keys are moved so that their centre is the queries' centre, and queries and keys scaled to the same mean "
    "length: neither changes any attention weight (every key's score for a query gains the same amount, and a "
    "softmax ignores that), so nearness reads as a high score."
)


def section(layer: int, head: int, model_name: str, engine: str) -> None:
    """The section for head ``(layer, head)`` of the sidebar's model ``model_name`` (computed in ``engine``)."""
    st.subheader(t("Its queries and keys over a corpus"))
    if not RolesSettings.declared("joint_qk").toggle():
        st.caption(t(ABOUT))
        return
    cols = st.columns([1, 1, 2])
    sentences = RolesSettings.declared("qk_sentences").number(cols[0].number_input, step=10)
    method = RolesSettings.declared("qk_method").select(cols[1].radio, horizontal=True)
    colour = RolesSettings.declared("qk_colour").select(cols[2].radio, horizontal=True)
    operation = joint_operation(model_name, engine, (layer, head), sentences, method)
    # Heavy work (a pass per sentence): on a class's server a link only starts it once computed.
    if not pickers.start_button(t("Project the queries and keys"), key="joint_qk", ready=ready(operation)):
        return
    view = compute(operation, get_model(model_name))
    if len(view.sentence_tokens) < sentences:
        st.caption(
            t(
                "The first {count} sentences only: the view keeps at most {points} queries (and as many keys).",
                count=len(view.sentence_tokens),
                points=f"{APP_MAX_POINTS:,}",
            )
        )
    show(view, colour, model_name)


def joint_operation(model_name: str, engine: str, cell: tuple[int, int], sentences: int, method: str) -> JointQueryKey:
    """The view of head ``cell`` over the first ``sentences`` of the UD EWT dev split, as an operation."""
    corpus = ud_ewt_dev(int(sentences))
    return JointQueryKey.of(
        get_model(model_name), corpus, *cell, method=method, max_points=APP_MAX_POINTS, engine=engine
    )


def axis_titles(view: JointQK) -> tuple[str, str]:
    """ "PC 1 (23% of the variance)" for PCA; "t-SNE 1" for t-SNE (whose axes have no meaning of their own)."""
    if view.explained_variance is None:
        return f"{METHODS[view.method]} 1", f"{METHODS[view.method]} 2"
    first, second = view.explained_variance
    return t("PC 1 ({share} of the variance)", share=f"{first:.0%}"), f"PC 2 ({second:.0%})"


def clicked_row(event, count: int) -> int | None:
    """The table row of the point clicked in the chart (its ``customdata[0]``), or None."""
    try:
        custom = event["selection"]["points"][0]["customdata"]
        if isinstance(custom, dict):  # a typed array comes back as {"0": ..., "1": ...}
            custom = [custom[index] for index in sorted(custom, key=int)]
        row = int(custom[0])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return row if 0 <= row < count else None


def marked_context(tokens, position: int) -> str:
    """The sentence's tokens as markdown, each escaped, the point's token in bold between brackets."""
    return " ".join(
        f"**[{messages.md_escape(token)}]**" if index == position else messages.md_escape(token)
        for index, token in enumerate(tokens)
    )


def explore_link(model_name: str, text: str, cell: tuple[int, int], focus: int | None) -> str:
    """The Explore page's address for ``text`` with head ``cell`` enlarged (and the query ``focus`` chosen)."""
    query = {"model": model_name, "text": text, "layer": cell[0], "head": cell[1]}
    if focus is not None:
        query["focus"] = focus
    return "/explore?" + urlencode(query)


def show(view: JointQK, colour: str, model_name: str) -> None:
    """The figure, what the projection keeps, and the clicked point's context."""
    table = view.table
    title = t(
        "Head {layer}-{head}: {count} queries and as many keys ({method})",
        layer=view.layer,
        head=view.head,
        count=len(table) // 2,
        method=METHODS[view.method],
    )
    event = charts.show_chart(
        joint_qk_figure(table, colour, axis_titles(view), title=title),
        key=CHART_KEY,
        filename=f"headscope-layer{view.layer}-head{view.head}-queries-keys",
        on_select="rerun",
        selection_mode="points",
    )
    kept = (
        t("The two axes keep {share} of the points' variance.", share=f"{sum(view.explained_variance):.0%}")
        if view.explained_variance is not None
        else t("t-SNE keeps neighbours, not distances: the axes have no units.")
    )
    parts = [t("Circles are queries, diamonds keys."), t(NORMALISED) if view.normalize else "", kept]
    st.caption(" ".join([*(part for part in parts if part), t("Click a point for its sentence.")]))
    row = clicked_row(event, len(table))
    if row is None:
        return
    point = table.iloc[row]
    tokens, position = view.context(int(point["sentence"]), int(point["position"]))
    tag = f" ({point['pos']})" if point["pos"] else ""
    st.markdown(
        t(
            "**{kind}** {token}{tag}, sentence {sentence}, position {position}: ",
            kind=t(point["kind"].capitalize()),
            token=messages.md_code(point["token"]),
            tag=messages.md_escape(tag),
            sentence=int(point["sentence"]),
            position=position,
        )
        + marked_context(tokens, position)
    )
    focus = position if point["kind"] == "query" else None
    st.link_button(
        t("Open the sentence in Explore"),
        explore_link(model_name, view.sentence_texts[int(point["sentence"])], (view.layer, view.head), focus),
    )
