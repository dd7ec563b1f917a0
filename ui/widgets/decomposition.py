"""Explore's "Why does this head look there?": one cell of the enlarged head (a query and a key) split into the parts
its score gets from each pair of sources (``mha_core.score_decomposition``), as a question and its one-sentence
answer for a class, a sentence per side, a (query source x key source) heatmap and a ranked list, with the head's
OV/QK summary (``mha_core.ov_circuit`` at the key's token, ``mha_core.copying_scores``). The query and the key are
kept in the address (``score_query``, ``score_key``) beside the switch that shows the section (``decompose``); a cell
clicked on the head view (or Enter on the keyboard's cell) sets all three (``take_cell``)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from mha_core.interventions.decomposition import FAMILIES, ScoreDecomposition, quote_token
from mha_core.operations import CopyingScores, Decomposition, OVCircuit
from ui.compute import compute, get_model, ready
from ui.figures.decomposition import decomposition_heatmap
from ui.page_explore import ExploreSettings
from ui.widgets import charts, messages

TOP_SOURCES = 10  # sources per side in the heatmap (the rest summed as "other sources")
RANKED_ROWS = 12  # pairs in the ranked list
OV_TOP = 5  # output tokens of the head's OV circuit at the key's token
DECODER_FAMILIES = ("gpt2", "llama")  # of the decomposition's FAMILIES: the OV circuit ends in the unembedding
S = ExploreSettings.declarations()

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
    shown = S["decompose"].toggle()
    if not shown:
        st.caption(ABOUT + " Switch it on to choose a query and a key.")
        return
    names = list(run.tokens)
    n = len(names)
    query_column, key_column = st.columns(2)
    query = S["score_query"].select(
        query_column.selectbox,
        range(n),
        default=n - 1,
        format_func=lambda i: f"{i}: {names[i]}",
    )
    keys = range(query + 1) if run.is_causal else range(n)
    row = np.asarray(run.attentions[layer, head, query][: len(keys)])
    key = S["score_key"].select(
        key_column.selectbox,
        keys,
        default=int(row.argmax()),  # the key the head looks at most
        format_func=lambda i: f"{i}: {names[i]}  ({row[i]:.0%})",
    )
    parts = decomposition(model_name, engine, run, (layer, head, query, key))
    show(parts)
    with messages.error_display():
        circuit_summary(model_name, run, parts)


def take_cell(run, words: bool, hide_special: bool, cell: tuple) -> None:
    """A cell ``(layer, head, row, column)`` picked on the head view (positions of the view the toggles make of
    ``run``) opens its decomposition on the next run: the switch on, the query and the key set (the address
    follows). A cell with no score of its own (outside the view, or hidden by the causal mask) changes nothing."""
    positions = run_cell(run, words, hide_special, cell)
    if positions is None:
        return
    S["decompose"].set(True)
    S["score_query"].set(positions[0])
    S["score_key"].set(positions[1])


def view_units(run, words: bool, hide_special: bool) -> list[np.ndarray]:
    """The run's token positions behind each position of the view the toggles make (``ui.widgets.views.shaped_run``:
    word level first, then without the special units)."""
    if words and run.level != "word":
        unit_of_token, _, special, _ = run.word_groups()
        units = [np.flatnonzero(unit_of_token == unit) for unit in range(len(special))]
    else:
        units, special = [np.array([i]) for i in range(run.num_tokens)], np.asarray(run.special_mask)
    if hide_special and np.any(special):
        units = [unit for unit, is_special in zip(units, special, strict=True) if not is_special]
    return units


def run_cell(run, words: bool, hide_special: bool, cell: tuple) -> tuple[int, int] | None:
    """The ``(query, key)`` token positions of ``run`` behind a view's cell ``(layer, head, row, column)``: a word's
    last token as the query (in a decoder it has read the whole word) and, of the key word's tokens that query
    sees, the one the head gives the most weight; None for a cell outside the view or with no key the query sees."""
    layer, head, row, column = cell
    units = view_units(run, words, hide_special)
    if not (0 <= row < len(units) and 0 <= column < len(units)):
        return None
    query = int(units[row][-1])
    keys = units[column][units[column] <= query] if run.is_causal else units[column]
    if len(keys) == 0:
        return None
    weights = np.asarray(run.attentions[layer, head, query])[keys]
    return query, int(keys[int(weights.argmax())])


def decomposition(model_name: str, engine: str, run, cell: tuple) -> ScoreDecomposition:
    """The decomposition of ``cell`` ``(layer, head, query, key)`` of ``run``'s text, through ``ui.compute``."""
    model = get_model(model_name)
    encoded = encoded_text(model, run)
    layer, head, query, key = cell
    operation = Decomposition(model.name, encoded, layer=layer, head=head, query=query, key_position=key, engine=engine)
    return compute(operation, model)


def encoded_text(model, run):
    """``run``'s text as the model reads it (the decomposition's token positions are its)."""
    return model.encode(run.text, run.text_pair, bos=run.metadata.get("bos"))


def show(parts: ScoreDecomposition) -> None:
    """The decomposition in words (a question and its answer), as a heatmap and as a ranked list."""
    st.markdown("**" + messages.md_escape(parts.question()) + "**")
    st.markdown(messages.md_escape(parts.why()))
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


def circuit_summary(model_name: str, run, parts: ScoreDecomposition) -> None:
    """The head's weights in a few lines: what its OV circuit writes when it attends to the key's token
    (``mc.ov_circuit``), and its copying and previous-token scores (``mc.copying_scores``: every head's at once,
    tens of seconds for a deep model, so computed on a click unless the server has them already)."""
    model = get_model(model_name)
    token_id = int(encoded_text(model, run).input_ids[parts.key])
    ov = compute(OVCircuit(model.name, parts.layer, parts.head, (token_id,), OV_TOP), model)
    st.markdown(messages.md_escape(ov_words(parts, ov)))
    every_head = CopyingScores(model.name)
    if not (
        ready(every_head)
        or st.button("Its copying and previous-token scores (every head's, once per model)", key="decompose_copying")
    ):
        return
    scores = compute(every_head, model)
    row = scores[(scores["layer"] == parts.layer) & (scores["head"] == parts.head)].iloc[0]
    st.markdown(messages.md_escape(score_words(parts, row)))


def ov_words(parts: ScoreDecomposition, ov) -> str:
    """What the head's OV circuit writes at the key's token (``ov_circuit``'s table), in words: a decoder's through
    its unembedding (the logits it raises), an encoder's through its embedding matrix (Dar et al. 2022)."""
    key_token = quote_token(parts.tokens[parts.key])
    outputs = ", ".join(repr(token) for token in ov["output_token"])
    own_rank = next(iter(ov.attrs["self_rank"].values()))
    raises = "raises the logits of" if parts.family in DECODER_FAMILIES else "writes most along the embeddings of"
    return (
        f"What {parts.layer}-{parts.head} writes (its OV circuit, from the weights alone): attending to {key_token} it "
        f"{raises} {outputs}; {key_token} itself ranks {own_rank}."
    )


def score_words(parts: ScoreDecomposition, row) -> str:
    """The head's row of ``copying_scores`` in words."""
    return (
        f"Its copying score is {row['copying']:+.2f} (+1 copies what it reads, -1 suppresses it) and its QK circuit "
        f"alone puts {row['previous_token']:.0%} of its attention on the previous position."
    )
