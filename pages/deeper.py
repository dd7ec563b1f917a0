"""Deeper: what attention weights leave out. Rollout and flow, norm-based attention, the neuron view."""

import numpy as np
import streamlit as st

import mha_core as mc
from mha_core.errors import HeadscopeError
from ui import computations, shell
from ui.figures import deeper as figures
from ui.i18n import t
from ui.page_deeper import DeeperSettings
from ui.widgets import charts, messages, pickers, sidebar

shell.in_app()  # a page's own address opened on a new server: run it inside app.py
S = DeeperSettings.declarations()

st.title(t("Deeper"))
st.markdown(
    t(
        "Attention weights alone mislead. This page shows the views researchers use instead: **rollout and "
        "flow** (what a token's final representation draws on, through every layer), **norm-based attention** "
        "(how much each attended token actually moves the representation), the **neuron view** (which "
        "dimensions of the query and key make a head attend where it does) and a **corpus search** for tokens "
        "the model treats alike. all-mpnet-base-v2 (12 x 12 heads, "
        "choose *mpnet* in the sidebar) is the size of the models in Clark et al. 2019."
    )
)

run = sidebar.current_run()
if run is None:
    st.stop()
tokens = run.tokens

# ---- 1. rollout and flow ------------------------------------------------------------------------------
st.subheader(t("1. Attention rollout: what each token's representation draws on"))
rollout = computations.rollout(run)
layer = S["layer"].layer(run.num_layers, default=run.num_layers - 1)
charts.show_chart(
    figures.token_matrix(rollout[layer], tokens, t("Rollout after layer {layer}", layer=layer)),
    key="deeper_rollout",
    filename="headscope-rollout",
)
st.caption(
    t(
        "Abnar & Zuidema (2020): each layer's head-mean attention is mixed half and half with the identity (the "
        "residual connection), rows renormalised, and the layers multiplied: R_l = A_l R_(l-1). Row i: the input "
        "tokens token i draws on after this layer."
    )
)
if run.num_tokens <= mc.analysis.flow.MAX_FLOW_TOKENS and S["flow"].toggle():
    flow = computations.flow(run, layer)
    charts.show_chart(
        figures.token_matrix(flow, tokens, t("Attention flow after layer {layer}", layer=layer), colorbar="flow"),
        key="deeper_flow_chart",
        filename="headscope-flow",
    )
    st.caption(
        t(
            "The maximum flow from each token after this layer to each input token, with the same capacities; "
            "each row divided by its sum (as in the authors' released code), so a row shares out 1 like rollout's. "
            "The raw max-flow values: `mha_core.attention_flow(run, normalize=False)`."
        )
    )

# ---- 2. norm-based attention ----------------------------------------------------------------------------
st.subheader(t("2. Weight against norm: ||α f(x)||"))
head = S["head"].head(run.num_heads)


try:
    normed = computations.run_with_norms(run)
except HeadscopeError as error:
    st.error(messages.public_message(error))
    st.stop()
charts.show_chart(
    figures.weights_and_norms(
        normed.attentions[layer, head],
        normed.norms[layer, head],
        tokens,
        t("Layer {layer}, head {head}", layer=layer, head=head),
    ),
    key="deeper_norms",
    filename="headscope-norms",
)
metrics = computations.metrics_for(normed)
row = metrics[(metrics["layer"] == layer) & (metrics["head"] == head)].iloc[0]
left, right = st.columns(2)
left.metric(t("Weight on special tokens"), f"{row['special_weight']:.2f}")
right.metric(t("Their share of the norms"), f"{row['special_norm_share']:.2f}")
st.caption(
    t(
        "Kobayashi et al. (2020): a head adds α_ij f(x_j) for each token j, with f(x) = (x W_V + b_V) W_O (its value "
        "projection, then its slice of the output projection). Heads often park weight on [CLS]/[SEP] or BOS, "
        "whose f(x) is short: large in weight, small in norm. Each row is scaled to sum to 1 on both sides."
    )
)
NORM_COLUMNS = ("layer", "head", "value_norm", "output_norm", "special_weight", "special_norm_share")
with st.expander(t("Per-head value and output norms")):
    st.dataframe(
        metrics[list(NORM_COLUMNS)].rename(columns={column: t(column) for column in NORM_COLUMNS}), hide_index=True
    )

# ---- 3. the neuron view -----------------------------------------------------------------------------------
st.subheader(t("3. Neuron view: why this head attends where it does"))
query = S["query"].select(
    st.selectbox,
    range(run.num_tokens),
    default=min(1, run.num_tokens - 1),
    format_func=lambda i: f"{i}: {tokens[i]}",
)
view = computations.neuron_view(run, layer, head, query)
if view.rotated:
    st.info(
        t(
            "This model uses rotary positions: the query and key vectors shown are after the rotation, as the score "
            "sees them (each pair of dimensions turned by an angle that grows with the position)."
        )
    )
if np.any(view.bias):
    st.caption(t("MPNet adds a learned bias by relative position to each score: score = q·k / √d + bias."))
charts.show_chart(
    figures.neuron_products(
        view.tokens, view.products, view.visible, t("q × k, query {query}: {token}", query=query, token=tokens[query])
    ),
    key="deeper_neuron_products",
    filename="headscope-neuron",
)
charts.show_chart(
    figures.neuron_scores(view.tokens, view.scores, view.weights, view.visible, t("Scores and softmax")),
    key="deeper_neuron_scores",
    filename="headscope-neuron-scores",
)
st.caption(
    t(
        "Summing a row of q × k gives the dot product; divided by √{d} it is the score; the softmax of the scores "
        "is the head's attention. Largest difference from the model's own attention row: {difference}.",
        d=view.query.shape[0],
        difference=f"{float(np.abs(view.weights - view.attention).max()):.1e}",
    )
)

# ---- 4. corpus search -----------------------------------------------------------------------------------------
st.subheader(t("4. Search a corpus for tokens like this one"))
st.markdown(
    t(
        "The UD English EWT dev sentences, searched for the tokens nearest to **{token}** (token {query}): by the "
        "**representation** layer {layer} reads, or by the **attention pattern** of head {layer}-{head} (its weight "
        "by offset from the token and on special tokens).",
        token=messages.md_escape(tokens[query]),
        query=query,
        layer=layer,
        head=head,
    )
)
left, right = st.columns(2)
kind = S["search_kind"].select(left.radio, horizontal=True)
size = S["search_size"].select(right.select_slider)
if S["search"].toggle(on_change=pickers.mark_started, args=(S["search"].key,)) and pickers.start_button(
    t("Build the search index"),
    key="deeper_search",
    ready=computations.corpus_index_ready(run.model_name, layer, head, kind, size),
):
    index = computations.corpus_index(run.model_name, layer, head, kind, size)
    vector = computations.search_vector(run, query, layer, head, kind)
    found = index.search(vector, k=10)
    FOUND_COLUMNS = ("rank", "distance", "left", "token", "right")
    st.dataframe(
        found[list(FOUND_COLUMNS)].rename(columns={column: t(column) for column in FOUND_COLUMNS}), hide_index=True
    )
    st.caption(
        t(
            "{count} tokens of {size} sentences, nearest first (`sklearn.neighbors.NearestNeighbors`, exact). Tokens of the "
            "same word in similar roles come first when the layer or head encodes that role.",
            count=f"{len(index):,}",
            size=size,
        )
    )
