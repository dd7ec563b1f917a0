"""Explore's "Why does this head look there?": one cell of the enlarged head (a query and a key) split into the parts
its score gets from each pair of sources (``mha_core.score_decomposition``), as a sentence for a class, a sentence
per side, a (query source x key source) heatmap and a ranked list. The query and the key are kept in the address
(``score_query``, ``score_key``) beside the switch that shows the section (``decompose``)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from mha_core.interventions.decomposition import FAMILIES, ScoreDecomposition
from mha_core.operations import Decomposition
from ui.compute import compute, get_model
from ui.figures.decomposition import decomposition_heatmap
from ui.page_explore import ExploreSettings
from ui.widgets import charts, messages

TOP_SOURCES = 10  # sources per side in the heatmap (the rest summed as "other sources")
RANKED_ROWS = 12  # pairs in the ranked list

ABOUT = (
    "A head's score for a key is its query (from the token looking) times its key (from the token looked at). "
    "Both are sums of what earlier parts of the model wrote at those tokens: the token and position embeddings, "
    "each earlier head, each earlier MLP. Splitting both sides splits the score into pairs of sources."
)


def section(run, layer: int, head: int, model_name: str, engine: str) -> None:
    """The section under the head view, for the enlarged head ``(layer, head)`` of ``run`` (the sidebar's model
    ``model_name``, computed in ``engine``)."""
    st.subheader("Why does this head look there?")
    if run.family not in FAMILIES:
        st.caption(
            "The score decomposition follows BERT, MPNet, GPT-2 and Llama-family models (MiniLM, all-mpnet-base-v2, "
            "SmolLM2); this model is not one of them."
        )
        return
    shown = ExploreSettings.declared("decompose").toggle()
    if not shown:
        st.caption(ABOUT + " Switch it on to choose a query and a key.")
        return
    names = list(run.tokens)
    n = len(names)
    query_column, key_column = st.columns(2)
    query = ExploreSettings.declared("score_query").select(
        query_column.selectbox,
        range(n),
        default=n - 1,
        format_func=lambda i: f"{i}: {names[i]}",
    )
    keys = range(query + 1) if run.is_causal else range(n)
    row = np.asarray(run.attentions[layer, head, query][: len(keys)])
    key = ExploreSettings.declared("score_key").select(
        key_column.selectbox,
        keys,
        default=int(row.argmax()),  # the key the head looks at most
        format_func=lambda i: f"{i}: {names[i]}  ({row[i]:.0%})",
    )
    parts = decomposition(model_name, engine, run, (layer, head, query, key))
    show(parts)


def decomposition(model_name: str, engine: str, run, cell: tuple) -> ScoreDecomposition:
    """The decomposition of ``cell`` ``(layer, head, query, key)`` of ``run``'s text, through ``ui.compute``."""
    model = get_model(model_name)
    encoded = model.encode(run.text, run.text_pair, bos=run.metadata.get("bos"))
    layer, head, query, key = cell
    operation = Decomposition(model.name, encoded, layer=layer, head=head, query=query, key_position=key, engine=engine)
    return compute(operation, model)


def show(parts: ScoreDecomposition) -> None:
    """The decomposition in words, as a heatmap and as a ranked list."""
    st.markdown("**" + messages.md_escape(parts.why()) + "**")
    st.markdown("\n".join("- " + messages.md_escape(sentence) for sentence in parts.summary()))
    matrix, rows, columns = parts.grouped(TOP_SOURCES)
    title = f"Head {parts.layer}-{parts.head}: its score {parts.score:.2f} by query source x key source"
    charts.show_chart(
        decomposition_heatmap(matrix, rows, columns, title=title),
        key="decomposition_map",
        filename=f"headscope-layer{parts.layer}-head{parts.head}-score-parts",
    )
    bias = (
        f" MPNet's learned bias for this distance adds {parts.position_bias:+.2f}, a part of no source."
        if parts.family == "mpnet"
        else ""
    )
    st.caption(
        messages.md_escape(
            f"Each cell is one pair's part of the score (red adds, blue takes away); the cells add up to "
            f"{parts.matrix.sum():.3f}, the model's score is {parts.score:.3f}.{bias} " + parts.norm_words()
        )
    )
    table = parts.table().head(RANKED_ROWS)
    table.columns = ["query side", "key side", "part of the score"]
    st.dataframe(table, hide_index=True, width="stretch")
