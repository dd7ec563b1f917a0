"""Explore's "Why does this head look there?": one cell of the enlarged head (a query and a key) split into the parts
its score gets from each pair of sources (``mha_core.score_decomposition``), as a question and its one-sentence
answer for a class, a sentence per side, a (query source x key source) heatmap and a ranked list, with the head's
OV/QK summary (``mha_core.ov_circuit`` at the key's token, ``mha_core.copying_scores``). The query and the key are
kept in the address (``score_query``, ``score_key``) beside the switch that shows the section (``decompose``); a cell
clicked on the head view (or Enter on the keyboard's cell) sets all three (``take_cell``)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from mha_core.interventions.decomposition import FAMILIES, POSITION_BIAS, ScoreDecomposition, quote_token
from mha_core.operations import CopyingScores, Decomposition, OVCircuit
from ui.compute import compute, get_model, ready
from ui.figures.decomposition import decomposition_heatmap
from ui.i18n import t
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
    st.subheader(t("Why does this head look there?"))
    if run.family not in FAMILIES:
        st.caption(
            t(
                "The score decomposition follows BERT, MPNet, GPT-2 and Llama-family models (MiniLM, "
                "all-mpnet-base-v2, SmolLM2); this model is not one of them."
            )
        )
        return
    shown = S["decompose"].toggle()
    if not shown:
        st.caption(t(ABOUT) + " " + t("Switch it on to choose a query and a key."))
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
    st.markdown("**" + messages.md_escape(question(parts)) + "**")
    st.markdown(messages.md_escape(why(parts)))
    st.markdown("\n".join("- " + messages.md_escape(sentence) for sentence in summary(parts)))
    matrix, rows, columns = parts.grouped(TOP_SOURCES)
    title = t(
        "Head {layer}-{head}: its score {score} by query source x key source",
        layer=parts.layer,
        head=parts.head,
        score=f"{parts.score:.2f}",
    )
    charts.show_chart(
        decomposition_heatmap(matrix, rows, columns, title=title),
        key="decomposition_map",
        filename=f"headscope-layer{parts.layer}-head{parts.head}-score-parts",
    )
    bias = (
        " "
        + t(
            "MPNet's learned bias for this distance adds {bias}, a part of no source.",
            bias=f"{parts.position_bias:+.2f}",
        )
        if parts.family == "mpnet"
        else ""
    )
    st.caption(
        messages.md_escape(
            t(
                "Each cell is one pair's part of the score (red adds, blue takes away); the cells add up to {total}, "
                "the model's score is {score}.",
                total=f"{parts.matrix.sum():.3f}",
                score=f"{parts.score:.3f}",
            )
            + bias
            + " "
            + norm_words(parts)
        )
    )
    table = parts.table().head(RANKED_ROWS)
    table.columns = [t("query side"), t("key side"), t("part of the score")]
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
        or st.button(t("Its copying and previous-token scores (every head's, once per model)"), key="decompose_copying")
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
    return t(
        "What {name} writes (its OV circuit, from the weights alone): attending to {token} it raises the logits of "
        "{outputs}; {token} itself ranks {rank}."
        if parts.family in DECODER_FAMILIES
        else "What {name} writes (its OV circuit, from the weights alone): attending to {token} it writes most along "
        "the embeddings of {outputs}; {token} itself ranks {rank}.",
        name=f"{parts.layer}-{parts.head}",
        token=key_token,
        outputs=outputs,
        rank=own_rank,
    )


def score_words(parts: ScoreDecomposition, row) -> str:
    """The head's row of ``copying_scores`` in words."""
    return t(
        "Its copying score is {copying} (+1 copies what it reads, -1 suppresses it) and its QK circuit alone puts "
        "{previous} of its attention on the previous position.",
        copying=f"{row['copying']:+.2f}",
        previous=f"{row['previous_token']:.0%}",
    )


# ---- the decomposition in the session's words (the library's ``question``, ``why``, ``summary``, ``norm_words``) --
def source_words(label: str) -> str:
    """A source's label as a phrase (``decomposition.source_phrase``'s), in the session's language."""
    if label[0].isdigit():
        return t("head {name}'s output", name=label)
    if label.startswith("MLP"):
        return t("{name}'s output", name=label)
    return t(SOURCE_WORDS.get(label, label))


SOURCE_WORDS = {
    "token embedding": "the token embedding",
    "position embedding": "the position embedding",
    "segment embedding": "the segment embedding",
    "biases": "the biases",
}
SIDE_SENTENCES = {
    "query": "The query side of {name}'s score comes mostly from {source} at the query's position ({token}, "
    "{position}): {value} of {score}.",
    "key": "The key side of {name}'s score comes mostly from {source} at the key's position ({token}, {position}): "
    "{value} of {score}.",
}


def pair_words(parts: ScoreDecomposition, pair) -> str:
    """One row of ``parts.table()``: a query-side source at the query meeting a key-side source at the key."""
    if pair["query_source"] == POSITION_BIAS:
        return t("its learned bias for that distance")
    return t(
        "{query_source} at {query} meeting {key_source} at {key}",
        query_source=source_words(pair["query_source"]),
        query=quote_token(parts.tokens[parts.query]),
        key_source=source_words(pair["key_source"]),
        key=quote_token(parts.tokens[parts.key]),
    )


def _cell(parts: ScoreDecomposition) -> dict:
    """The head and its (query, key) cell, as the sentences below name them."""
    return {
        "layer": parts.layer,
        "head": parts.head,
        "query": quote_token(parts.tokens[parts.query]),
        "key": quote_token(parts.tokens[parts.key]),
    }


def question(parts: ScoreDecomposition) -> str:
    return t("Why does head {layer}-{head} look at {key} from {query}?", **_cell(parts))


def why(parts: ScoreDecomposition) -> str:
    table = parts.table()
    said = [
        t("the largest part is {pair} ({value})", pair=pair_words(parts, table.iloc[0]), value=_signed(table.iloc[0]))
    ]
    if len(table) > 1:
        said.append(t("the next {pair} ({value})", pair=pair_words(parts, table.iloc[1]), value=_signed(table.iloc[1])))
    return t(
        "Head {layer}-{head} looks from {query} at {key} ({weight} of its attention): of its score {score}, {parts}.",
        **_cell(parts),
        weight=f"{parts.weight:.0%}",
        score=f"{parts.score:.2f}",
        parts=t(", ").join(said),
    )


def _signed(row) -> str:
    return f"{row['contribution']:+.2f}"


def summary(parts: ScoreDecomposition) -> list[str]:
    sentences = []
    for side, position in (("query", parts.query), ("key", parts.key)):
        label, value = parts.top_source(side)
        sentences.append(
            t(
                SIDE_SENTENCES[side],
                name=f"{parts.layer}-{parts.head}",
                source=source_words(label),
                token=quote_token(parts.tokens[position]),
                position=position,
                value=f"{value:+.2f}",
                score=f"{parts.score:.2f}",
            )
        )
    return sentences


def norm_words(parts: ScoreDecomposition) -> str:
    if parts.post_norm:
        return t(
            "Each LayerNorm's scale (its input's standard deviation) is frozen at its value in this run; with it "
            "fixed, the norm's centring and gain are linear, so every earlier source passes through every later norm "
            "and the parts add up exactly to the score."
        )
    said = t(
        "The layer's {kind} scale at the query's and at the key's position is frozen at its value in this run; with "
        "it fixed the norm is linear, so the parts add up exactly to the score.",
        kind="RMSNorm" if parts.family == "llama" else "LayerNorm",
    )
    return said + (" " + t("The rotary rotation of each position is linear too.") if parts.family == "llama" else "")
