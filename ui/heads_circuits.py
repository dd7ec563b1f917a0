"""The Circuits page's weight circuits and path patching (``mha_core.interventions.qkov``, ``path_patching``):
every head's copying and previous-token scores as maps, the composition graph filtered by strength, one head's OV
and QK top tokens, and path patching from every sender into a chosen receiver set as a layers x heads map.

Each computation is an operation of ``mha_core.operations.qkov`` run by ``ui.compute.compute``; every setting is in
the page's address (``pickers.url_*``). The page calls ``weights_section`` and ``path_patching_section``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import streamlit as st

from mha_core.errors import quoted
from mha_core.interventions.readout import CircuitError
from mha_core.operations import Composition, CopyingScores, OVCircuit, PathPatching, QKCircuit
from ui import compute
from ui.figures.causal import head_score_map
from ui.figures.qkov import composition_graph, edge_list
from ui.i18n import t
from ui.page_circuits import MODE_LABELS, VIA_LABELS, CircuitsSettings
from ui.widgets import charts, downloads, messages, pickers

S = CircuitsSettings.declarations()
DEFAULT_RECEIVERS = {"smollm2": "17-3, 17-4, 18-6, 18-7"}  # SmolLM2's induction heads (docs/findings.md, section 3)
MAX_EDGES = 400  # the graph draws at most this many of the strongest edges
TOP_K = 8
GRAPH_KEY, COPY_KEY, PREV_KEY, PATH_KEY = "qkov_graph", "qkov_copying", "qkov_previous", "qkov_path_map"
CLICKED = "_qkov_open_explore"


def head_pairs(text: str, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
    """``"17-3, 18-6"`` -> ``[(17, 3), (18, 6)]``; a ``CircuitError`` naming the first head that is not one (the
    page's ``error_display`` shows it, escaped)."""
    pairs = []
    for part in (piece.strip() for piece in text.replace(";", ",").split(",")):
        if not part:
            continue
        layer, _, head = part.partition("-")
        if not (layer.strip().isdigit() and head.strip().isdigit()):
            raise CircuitError(f"{quoted(part, 20)} is not a head: write layer-head, e.g. 18-6.")
        pair = (int(layer), int(head))
        if not (pair[0] < num_layers and pair[1] < num_heads):
            raise CircuitError(f"Head {pair[0]}-{pair[1]} is outside this model's {num_layers} x {num_heads} heads.")
        pairs.append(pair)
    if not pairs:
        raise CircuitError("Name at least one receiver head, e.g. 18-6.")
    return list(dict.fromkeys(pairs))


def strongest_edges(table, mode: str, threshold: float, limit: int = MAX_EDGES):
    """The pairs whose ``mode`` score is at least ``threshold`` times the random baseline, strongest first (at
    most ``limit``): (edges ``[m, 4]``, their scores)."""
    baseline = table.attrs["baseline"][mode]
    kept = table[table[mode] >= threshold * baseline].nlargest(limit, mode)
    columns = ["sender_layer", "sender_head", "receiver_layer", "receiver_head"]
    return edge_list(kept[columns].itertuples(index=False, name=None)), kept[mode].to_numpy()


def grid(table, column: str, num_layers: int, num_heads: int) -> np.ndarray:
    """A per-head column as ``[layers, heads]`` (NaN where the table has no row)."""
    values = np.full((num_layers, num_heads), np.nan)
    values[table["layer"].to_numpy(), table["head"].to_numpy()] = table[column].to_numpy()
    return values


def remember_click(chart_key: str):
    def callback() -> None:
        clicked = pickers.clicked_head(chart_key)
        if clicked is not None and clicked[0] is not None:
            st.session_state[CLICKED] = clicked

    return callback


def open_clicked(open_head: Callable[[int, int], None]) -> None:
    """A head clicked on one of this section's charts opens in Explore (``open_head``)."""
    clicked = st.session_state.pop(CLICKED, None)
    if clicked is not None:
        open_head(*clicked)


def weights_section(model_name: str, model, open_head: Callable[[int, int], None]) -> None:
    """Copying and previous-token maps, the composition graph, and one head's OV/QK top tokens."""
    st.subheader(t("What the heads' weights do"))
    if not S["weights"].toggle():
        st.caption(
            t(
                "Copying and previous-token scores of every head, the composition of every pair of heads (Elhage et "
                "al. 2021) and each head's OV and QK top tokens, read from the weights alone: no prompt needed."
            )
        )
        return
    messages.explain(
        "A head's OV circuit (W_V W_O through the embedding and unembedding) is what it writes for a token it attends "
        "to; its copying score is +1 when it raises the logit of the token it reads, -1 when it suppresses it. Its QK "
        "circuit (W_Q W_K^T) is which keys a query prefers; the previous-token score is the attention its QK circuit "
        "alone puts on the previous position. Composition: how much of what an earlier head writes a later head "
        "reads through its queries, keys or values, against random matrices of the same shapes (1x)."
    )
    scores = compute.compute(CopyingScores(model_name), model)
    cols = st.columns(2)
    for col, (column, key, label, title, signed) in zip(
        cols,
        (
            ("copying", COPY_KEY, t("copying score"), t("Copying score (OV circuit's eigenvalues)"), True),
            (
                "previous_token",
                PREV_KEY,
                t("previous-token"),
                t("Previous-token score (QK circuit on positions)"),
                False,
            ),
        ),
    ):
        with col:
            charts.show_chart(
                head_score_map(
                    grid(scores, column, model.num_layers, model.num_heads), label=label, title=title, signed=signed
                ),
                key=key,
                filename=f"headscope-{key.replace('_', '-')}",
                on_select=remember_click(key),
                selection_mode="points",
            )
    slug = downloads.model_slug(model_name)
    downloads.table_view_download(scores, f"headscope-{slug}-copying-previous-token.html", "qkov_maps_html")
    mode = S["composition"].select(st.radio, horizontal=True)
    threshold = S["threshold"].widget(st.slider, 1.0, 6.0, step=0.5)
    if pickers.start_button(
        t("Compute the composition of every pair of heads"),
        key="qkov_composition",
        ready=compute.ready(Composition(model_name)),
    ):
        table = compute.compute(Composition(model_name), model)
        edges, strengths = strongest_edges(table, mode, threshold)
        charts.show_chart(
            composition_graph(
                edges,
                strengths,
                model.num_layers,
                model.num_heads,
                title=t(
                    "{mode}: {count} pairs at {threshold}x the baseline or more",
                    mode=t(MODE_LABELS[mode]),
                    count=len(edges),
                    threshold=f"{threshold:g}",
                ),
            ),
            key=GRAPH_KEY,
            filename="headscope-composition",
            on_select=remember_click(GRAPH_KEY),
            selection_mode="points",
        )
        st.caption(
            t(
                "Random matrices of these shapes score {baseline} (1x). Edges go from an earlier head (lower layer) "
                "to a later one; at most the {count} strongest are drawn. Click a head to open it in Explore.",
                baseline=f"{table.attrs['baseline'][mode]:.4f}",
                count=MAX_EDGES,
            )
        )
        downloads.table_view_download(table, f"headscope-{slug}-composition.html", "qkov_composition_html", mode)
        with st.expander(t("The strongest pairs")):
            st.dataframe(table.nlargest(50, mode), hide_index=True, width="stretch")
    head_tokens(model_name, model)
    open_clicked(open_head)


def head_tokens(model_name: str, model) -> None:
    """One head's OV and QK top tokens at the tokens of a text."""
    cols = st.columns(3)
    layer = S["circuit_layer"].number(cols[0].number_input, maximum=model.num_layers - 1)
    head = S["circuit_head"].number(cols[1].number_input, maximum=model.num_heads - 1)
    text = S["circuit_tokens"].text(container=cols[2])
    with messages.error_display():
        ov = compute.compute(OVCircuit(model_name, layer, head, text, TOP_K), model)
        qk = compute.compute(QKCircuit(model_name, layer, head, text, TOP_K), model)
        left, right = st.columns(2)
        left.markdown(
            t(
                "**OV: what {name} writes** when it attends to each token (top {count} logits raised)",
                name=f"{layer}-{head}",
                count=TOP_K,
            )
        )
        left.dataframe(summary(ov, "output_token"), hide_index=True, width="stretch")
        right.markdown(
            t(
                "**QK: which keys {name} prefers** for a query at each token (top {count})",
                name=f"{layer}-{head}",
                count=TOP_K,
            )
        )
        right.dataframe(summary(qk, "key_token"), hide_index=True, width="stretch")


def summary(table, column: str):
    """One row per token: its top tokens joined, and (OV) the rank of the token itself among the outputs."""
    rows = table.groupby(["token_id", "token"], sort=False)[column].apply(lambda tokens: " | ".join(map(repr, tokens)))
    frame = rows.reset_index().drop(columns="token_id")
    frame["token"] = frame["token"].map(repr)
    ranks = table.attrs.get("self_rank")
    if ranks is not None:
        frame["own rank"] = [ranks[token] for token in dict.fromkeys(table["token_id"])]
    return frame.rename(columns={column: "top tokens"})


def path_patching_section(model_name: str, model, prompts, answer, foil, open_head: Callable[[int, int], None]) -> None:
    """Path patching from every sender into a receiver set, through one input, as a layers x heads map."""
    st.subheader(t("Path patching: through which input does a head reach others?"))
    if not S["paths"].toggle():
        return
    messages.explain(
        "Each sender head's output on the corrupted prompt is patched into the clean run, reaching the logits only "
        "through the receivers' queries, keys or values (every other head's and MLP's output frozen at the clean "
        "run). -1: the whole difference between the prompts goes that way; 0: none of it."
    )
    cols = st.columns([2, 1])
    receivers_text = S["receivers"].text(
        what="receivers", default=DEFAULT_RECEIVERS.get(model_name, f"{model.num_layers - 1}-0"), container=cols[0]
    )
    via = S["via"].select(cols[1].radio, horizontal=True)
    with messages.error_display():
        receivers = tuple(head_pairs(receivers_text, model.num_layers, model.num_heads))
        operation = PathPatching(model_name, prompts[0], prompts[1], answer, foil=foil, receivers=receivers, via=via)
        if not pickers.start_button(
            t("Path-patch every sender"), key="qkov_path_patch", ready=compute.ready(operation)
        ):
            return
        table = compute.compute(operation, model)
        charts.show_chart(
            head_score_map(
                grid(table, "score", model.num_layers, model.num_heads),
                selected=receivers,
                label=t("path score"),
                title=t(
                    "Senders into {count} receivers (x) through their {via}",
                    count=len(receivers),
                    via=t(VIA_LABELS[via]),
                ),
                signed=True,
            ),
            key=PATH_KEY,
            filename="headscope-path-patching",
            on_select=remember_click(PATH_KEY),
            selection_mode="points",
        )
        kv = table.attrs["kv_heads"]
        st.caption(
            t(
                "Blank: heads in no layer before a receiver's (they cannot reach it). Click a head to open it in Explore."
            )
            + (
                " "
                + t(
                    "Keys and values are per KV head: the patched KV heads ({heads}) also serve the other query heads "
                    "of their group.",
                    heads=", ".join(f"{l}-{h}" for l, h in kv),
                )
                if kv
                else ""
            )
        )
        with st.expander(t("Path patching scores")):
            st.dataframe(table.dropna().sort_values("score"), hide_index=True, width="stretch")
    open_clicked(open_head)
