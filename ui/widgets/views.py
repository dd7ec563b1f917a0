"""Views of a run shared by pages: the layer's heads, Explore's head and model view (``ui.headview``), the
difference map of two runs, and the run reshaped by the word-level and hide-special toggles."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pandas as pd
import streamlit as st

from mha_core.analysis.alignment import IDENTICAL_ATOL, NoAlignment, layer_difference
from mha_core.analysis.metrics import METRIC_DESCRIPTIONS
from mha_core.engine.registry import FAMILIES
from mha_core.operations.derived import View
from ui import computations, figures, headview
from ui.i18n import t
from ui.widgets.charts import PRESENTATION_SCALE, presenting, show_chart
from ui.widgets.messages import md_escape, public_message
from ui.widgets.pickers import set_head, set_layer, url_select


def shaped_run(run, words: bool, hide_special: bool):
    """The run as the toggles ask (word level first, then without special tokens: ``operations.derived.View``),
    cached with the run (and so counted in the server's memory budget)."""
    if not (words or hide_special):
        return run
    return computations.from_run(View.of(run, words=words, hide_special=hide_special), run)


def figure_options(run) -> dict:
    """Causal mask and sentence-pair boundary for a run's figures."""
    segments = run.segment_ids if np.any(run.segment_ids != run.segment_ids[0]) else None
    return {"causal": bool(run.is_causal), "segment_ids": segments}


# Cells a figure may send to the browser (4 bytes each): the layer x head grid of MiniLM at 128 tokens
# is 1.18 M cells. Larger runs show their first tokens only, with a notice, so a view stays fast.
MODEL_VIEW_MAX_CELLS = headview.ALL_LAYERS_MAX_CELLS  # so the model view always has every layer


HEAD_VIEW_MAX_CELLS = 800_000  # the Plotly head view (Compare): 4 bytes a cell, and a chart of them
# Explore's canvas head view sends one layer at one byte a weight: every token of a model's longest input (512) for
# up to 16 heads (MiniLM at 512 tokens: 3.1 MB a layer), so a sentence at the model's limit is shown whole.
CANVAS_HEAD_MAX_CELLS = 16 * 512 * 512


def token_limit(max_cells: int, num_tiles: int) -> int:
    """How many tokens ``num_tiles`` tiles of n x n may have within ``max_cells`` (at least 8)."""
    return max(8, int((max_cells / max(num_tiles, 1)) ** 0.5))


def first_tokens(
    run, max_cells: int, num_tiles: int, what: str, rest: str = "the one-head view and the downloads have them all"
):
    """The run cut to its first k tokens so that ``num_tiles`` tiles of k x k fit in ``max_cells``; the
    notice says where the rest is (``rest``)."""
    limit = token_limit(max_cells, num_tiles)
    if run.num_tokens <= limit:
        return run
    st.caption(
        t(
            "The {what} shows the first {limit} of {count} tokens, to stay fast in the browser; {rest}.",
            what=t(what),
            limit=limit,
            count=run.num_tokens,
            rest=t(rest),
        )
    )
    keep = slice(0, limit)
    return dataclasses.replace(
        run,
        attentions=run.attentions[:, :, keep, keep],
        tokens=run.tokens[keep],
        raw_tokens=run.raw_tokens[keep],
        special_mask=run.special_mask[keep],
        word_ids=run.word_ids[keep],
        segment_ids=run.segment_ids[keep],
    )


def head_view(run, layer: int, key: str, columns: int = 4, width_hint: int = 1000, on_click=None, colorbar=True):
    """All heads of one layer as one figure; a click on a head calls ``on_click`` (a selection callback).
    ``colorbar=False`` where a chart beside it shows the same colour scale (Explore's enlarged head)."""
    run = first_tokens(run, HEAD_VIEW_MAX_CELLS, run.num_heads, "head view")
    fig = figures.head_grid(
        run.attentions[layer],
        run.tokens,
        columns=columns,
        width_hint=width_hint,
        title=t("Layer {layer}: all {heads} heads", layer=layer, heads=run.num_heads),
        colorbar=colorbar,
        **figure_options(run),
    )
    selectable = {"on_select": on_click, "selection_mode": "points"} if on_click else {}
    return show_chart(fig, key=key, filename=f"headscope-layer{layer}-heads", **selectable)


def attention_view(
    run, view: str, layer: int, head: int, key: str, shape: str = "heatmap", on_pick=None, written=(), token_picks=False
):
    """Explore's head view or model view (``view``), drawn in the browser (``ui.headview``): the layer slider,
    a click on a head and the switches between the views and the head's shapes redraw there at once; the
    layer and head selection follows here (and in the link) on the next rerun, and ``on_pick(pick)`` gets
    the rest of the visitor's pick (``view`` and ``shape``, a picked cell or token). ``written``: the rows of
    tokens the model wrote (their labels are marked and can be picked); ``token_picks``: the other rows' labels
    after the first can be picked too."""
    per_layer = token_limit(CANVAS_HEAD_MAX_CELLS, run.num_heads)
    whole = token_limit(MODEL_VIEW_MAX_CELLS, run.num_layers * run.num_heads)
    if view == "model":
        shown = first_tokens(run, MODEL_VIEW_MAX_CELLS, run.num_layers * run.num_heads, "model view")
    else:
        shown = first_tokens(
            run,
            CANVAS_HEAD_MAX_CELLS,
            run.num_heads,
            "head view",
            rest="the Lines view and the downloads have them all",
        )
    options = figure_options(shown)
    data = headview.pack(
        shown.attentions,
        shown.tokens,
        layer,
        head,
        causal=options["causal"],
        segment_ids=options["segment_ids"],
        shape=shape,
        text_scale=PRESENTATION_SCALE if presenting() else 1.0,
        view=view,
        switchable=min(run.num_tokens, per_layer) == min(run.num_tokens, whole),
        written=[int(i) for i in written if int(i) < shown.num_tokens],
        token_picks=token_picks,
    )

    def picked(pick: dict) -> None:
        set_layer(pick["layer"])
        set_head(pick["head"])
        if on_pick is not None:
            on_pick(pick)

    return headview.show(data, key=key, on_pick=picked)


def _listed(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (t(" and {count} more", count=len(items) - limit) if len(items) > limit else "")


def alignment_note(difference) -> str:
    """What a difference map compares, in words: position by position or word by word, which positions hold
    different tokens, which words the two tokenizers cut differently, and whether heads were averaged."""
    alignment = difference.alignment
    notes = []
    if alignment.level == "token" and alignment.differing:
        positions = [f"{i} ({md_escape(alignment.labels[i])})" for i in alignment.differing]
        notes.append(
            t(
                "Compared position by position (both have {count} tokens). Positions {positions} hold different "
                "tokens on the two sides (left | right): there the rows and columns compare different words.",
                count=alignment.num_units,
                positions=_listed(positions),
            )
            if len(positions) > 1
            else t(
                "Compared position by position (both have {count} tokens). Position {positions} holds different "
                "tokens on the two sides (left | right): there the rows and columns compare different words.",
                count=alignment.num_units,
                positions=_listed(positions),
            )
        )
    elif alignment.level == "word":
        notes.append(
            t(
                "The two runs cut the text into different tokens, so they are compared word by word, over the "
                "{count} words they share: attention to a word sums its tokens', a word's attention averages its "
                "tokens'. Special tokens are left out and every row is rescaled to sum to 1 over these words.",
                count=alignment.num_units,
            )
        )
        if alignment.merged:
            merged = [f"*{md_escape(alignment.labels[u])}*" for u in alignment.merged]
            notes.append(
                t("{words}: one unit each, because the tokenizers cut them differently.", words=_listed(merged))
            )
    if difference.head_averaged:
        left, right = difference.heads
        counts = (
            t("{left} heads against {right}", left=left, right=right)
            if left != right
            else t("even with {count} heads each", count=left)
        )
        notes.append(
            t(
                "Heads of two different models do not correspond one to one ({counts}), so this is the difference "
                "of each layer's average over its heads.",
                counts=counts,
            )
        )
    return " ".join(notes)


# The measurements a per-layer curve can show (Compare), in words: ``METRIC_DESCRIPTIONS``.
CURVES = ("normalized_entropy", "mean_distance", "confidence", "sink_mass", "prev_token_mass", "local_mass")


def metric_curves(runs_by_name: dict, key: str) -> None:
    """Per-layer curves of one head measurement (chosen here, ``?summary=``), one line per run."""
    metric = url_select(
        st.selectbox,
        t("Per-layer summary"),
        CURVES,
        key=f"{key}_metric",
        url_key="summary",
        format_func=lambda name: t(METRIC_DESCRIPTIONS[name]),
    )
    tables = [computations.metrics_for(side).assign(series=name) for name, side in runs_by_name.items()]
    show_chart(
        figures.layer_curves(
            pd.concat(tables, ignore_index=True),
            metric,
            series="series",
            label=t(METRIC_DESCRIPTIONS[metric]),
            title=t("Per layer: {measure}", measure=t(METRIC_DESCRIPTIONS[metric])),
        ),
        key=f"{key}_curve",
    )


# How Compare pairs the layers of two models of different depths.
PAIRINGS = {"depth": "By relative depth", "hand": "By hand"}


def depth_matched_layer(layer: int, layers: int, other_layers: int) -> int:
    """The layer of a model of ``other_layers`` layers at the relative depth of ``layer`` of one of ``layers``:
    round(layer * (other_layers - 1) / (layers - 1)), halves up (the first with the first, the last with the last)."""
    if layers <= 1:
        return 0
    return min(other_layers - 1, int(np.floor(layer * (other_layers - 1) / (layers - 1) + 0.5)))


def pairing_note(pairing: str, left: tuple[str, int, int], right: tuple[str, int, int]) -> str:
    """Which layers are shown against each other, and why: ``left`` and ``right`` are (model name, its number of
    layers, the layer shown)."""
    (left_name, left_layers, left_layer), (right_name, right_layers, right_layer) = left, right
    shown = t(
        "Layer {left_layer} of {left_name} (of 0 to {left_last}) against layer {right_layer} of {right_name} "
        "(of 0 to {right_last})",
        left_layer=left_layer,
        left_name=md_escape(left_name),
        left_last=left_layers - 1,
        right_layer=right_layer,
        right_name=md_escape(right_name),
        right_last=right_layers - 1,
    )
    if pairing == "depth":
        exact = left_layer * (right_layers - 1) / max(left_layers - 1, 1)
        formula = f"round({left_layer} × {right_layers - 1} / {max(left_layers - 1, 1)}) = round({exact:.3g})"
        return t(
            "{shown}: paired by relative depth, {formula} = {layer}, so the first layers and the last layers meet.",
            shown=shown,
            formula=formula,
            layer=right_layer,
        )
    if left_layers != right_layers:
        return t(
            "{shown}: paired by hand (the two models have {left} and {right} layers).",
            shown=shown,
            left=left_layers,
            right=right_layers,
        )
    return shown + t(".")


# Differences below this are the size of float32 rounding between two exact computations of one model
# (the from-scratch engine against transformers: about 1e-6 after six layers).
ROUNDING_SIZE = 1e-4


def difference_view(
    left_run, right_run, left_layer: int, right_layer: int, key: str, titles: tuple[str, str], title: str | None = None
) -> bool:
    """One layer of each run as one difference map (left minus right) on a fixed colour scale, over the tokens
    or words both share (``mha_core.analysis.alignment``), with a note on what was compared; "identical within 1e-6"
    instead of a map of rounding. False (and a notice) where no token or word of one stands for one of the
    other: the caller shows the two side by side. ``title``: the map's own title (default: the two layers)."""
    try:
        difference = layer_difference(left_run, right_run, left_layer, right_layer)
    except NoAlignment as error:
        st.info(t("{reason} They are shown side by side.", reason=public_message(error)))
        return False
    st.markdown(f"**{md_escape(titles[0])} − {md_escape(titles[1])}**")
    note = alignment_note(difference)
    if note:
        st.caption(note)
    if difference.identical:
        st.success(
            t(
                "Identical within {atol}: the largest difference of any weight is {largest}, float32 rounding, so "
                "there is no map to draw.",
                atol=f"{IDENTICAL_ATOL:.0e}".replace("e-0", "e-"),
                largest=f"{difference.largest:.1e}",
            )
        )
        return True
    alignment = difference.alignment
    values, labels = difference.values, alignment.labels
    limit = token_limit(HEAD_VIEW_MAX_CELLS, values.shape[0])
    if len(labels) > limit:
        st.caption(
            t(
                "The difference map shows the first {limit} of {count} units, to stay fast in the browser.",
                limit=limit,
                count=len(labels),
            )
        )
        values, labels = values[:, :limit, :limit], labels[:limit]
    same_positions = alignment.level == "token"
    causal = bool(left_run.is_causal and right_run.is_causal)
    pair = figure_options(left_run)["segment_ids"] if same_positions else None
    fig = figures.difference_map(
        values,
        labels,
        title=title
        or t(
            "Layer {left} − layer {right}, {heads}",
            left=left_layer,
            right=right_layer,
            heads=t("the average of the heads") if difference.head_averaged else t("every head"),
        ),
        head_averaged=difference.head_averaged,
        causal=causal,
        segment_ids=None if pair is None else pair[: len(labels)],
    )
    show_chart(fig, key=key, filename="headscope-difference")
    rounding = " " + t("(float32 rounding: white on this scale)") if difference.largest < ROUNDING_SIZE else ""
    st.caption(
        t(
            "Largest difference: {largest}{rounding}. Colours on a fixed scale, −1 to 1 (the most two weights can "
            "differ): red where the left attends more, blue where the right does.",
            largest=f"{difference.largest:.2e}",
            rounding=rounding,
        )
    )
    return True


# The attention-sink note shows once at least this share of the heads park most of their attention on a token
# of no content (MiniLM on "The cat sat on the mat because it was tired.": 34 of 72).
SINK_NOTE_SHARE = 0.25


def sink_note(run) -> None:
    """The attention-sink note, when at least ``SINK_NOTE_SHARE`` of the run's heads put most of their attention
    on a token of no content (a head's ``sink_mass`` of 0.5 or more): one line of caption above the view (the
    explanation in its help), so that it takes the view's place by no more than a line."""
    sinks = computations.metrics_for(run)["sink_mass"].to_numpy() >= 0.5
    if sinks.mean() >= SINK_NOTE_SHARE:
        st.caption(
            ":material/info: "
            + t(
                "{sinks} of the {heads} heads put most of their attention on a token of no content: an "
                "*attention sink*.",
                sinks=int(sinks.sum()),
                heads=sinks.size,
            ),
            help=t(
                "[CLS], [SEP], BOS or the first token: where a head parks attention when it has nothing to do. "
                "Look for the heads that do not."
            ),
        )


def layer_code(run) -> None:
    """For the from-scratch engine: the layer code that computed the run's weights, in an expander."""
    source = layer_source_code(run.family) if run.engine == "core" else None
    if source:
        with st.expander(t("The from-scratch layer code that computed these weights")):
            st.code(source, language="python")


def layer_source_code(family: str) -> str | None:
    """The from-scratch engine's own code for ``family``: its layer function and the helpers it calls,
    as the family registry names them; None for a family the engine does not replay."""
    entry = FAMILIES.get(family)
    if entry is None:
        return None
    return "\n\n".join(inspect.getsource(function) for function in (entry.layer, *entry.helpers))
