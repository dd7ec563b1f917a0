"""The Classroom's decoder lesson, after the attention steps: a real decoder (SmolLM2) predicts the next word.

The class votes on the next word first (``ask``: the page's predict-then-reveal, a class vote on a class server),
then sees the model's distribution (``mha_core.operations.Prediction`` through ``ui.compute``), moves the
temperature and watches the choice spread (``walkthrough.temperature_probabilities`` over the kept tokens), and
lets the model write a few tokens (``Generation``), each with the earlier tokens it attended to most (averaged
over one layer's heads: ``walkthrough.attended_earlier``). Settings in the address: ``dprompt``, ``dtemp``,
``dlayer``, ``dwrite``, ``ddraw`` (the random generator's seed).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from mha_core.models.prediction import PREDICTION_KEPT
from mha_core.operations import Generation, Prediction
from mha_core.walkthrough import attended_earlier, temperature_probabilities
from ui import compute
from ui.i18n import t
from ui.i18n import text as tt
from ui.page_classroom import WRITTEN, ClassroomSettings
from ui.widgets import messages

MODEL = "smollm2"
OPTIONS = 4  # words offered in the vote
S = ClassroomSettings.declarations()
SHOWN = 10


def _token(text: str) -> str:
    return repr(text)


def step_decoder(ask) -> None:
    """The lesson's one screen. ``ask(question, answer, shows_answer, options, correct)``: the page's
    predict-then-reveal question (a class vote on a class server)."""
    messages.explain(
        "A decoder such as GPT or SmolLM2 reads a sentence with the same attention heads, then turns the last "
        "token's vector into a score for every word of its vocabulary (the logits); softmax makes them "
        "probabilities. It writes by drawing the next token from them, then reads the longer sentence again."
    )
    with messages.error_display():
        model = compute.get_model(MODEL)
        prompt = S["dec_prompt"].select(st.selectbox)
        table = compute.compute(Prediction.of(model, prompt, k=PREDICTION_KEPT))
        _vote_and_distribution(ask, prompt, table)
        _temperature(table)
        _writing(model, prompt)


def _vote_and_distribution(ask, prompt: str, table: pd.DataFrame) -> None:
    offered = table.head(OPTIONS)
    labels = sorted(_token(token) for token in offered["token"])  # alphabetical: the order gives nothing away
    top = _token(table["token"].iloc[0])

    def distribution() -> None:
        shown = table.head(SHOWN).assign(token=table["token"].head(SHOWN).map(_token))
        st.dataframe(
            shown[["rank", "token", "probability", "logit"]],
            hide_index=True,
            key="cls_dec_table",
            column_config={"probability": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="%.3f")},
        )

    ask(
        tt("Which word will SmolLM2 put after **{prompt}**?", prompt=messages.md_escape(prompt)),
        tt(
            "**{token}**, with probability {probability}. The model gives every token of its vocabulary a "
            "probability; the ten most likely:",
            token=messages.md_escape(top),
            probability=f"{table['probability'].iloc[0]:.2f}",
        ),
        distribution,
        options=labels,
        correct=labels.index(top),
    )


def _temperature(table: pd.DataFrame) -> None:
    st.markdown(t("**Temperature: how the choice spreads**"))
    temperature = S["dec_temperature"].select(st.select_slider)
    spread = temperature_probabilities(table["logit"].to_numpy(), temperature)
    shown = pd.DataFrame({"token": table["token"].map(_token), "at temperature 1": table["probability"]})
    shown[f"at temperature {temperature:g}"] = (
        spread * float(table["probability"].sum()) if temperature == 1 else spread
    )
    st.dataframe(
        shown.head(SHOWN),
        hide_index=True,
        key="cls_dec_spread",
        column_config={
            column: st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="%.3f")
            for column in shown.columns[1:]
        },
    )
    st.caption(
        t(
            "At temperature {temperature}, among the {count} most likely tokens (they hold {share} of the "
            "probability at temperature 1). 0 always takes the most likely token; below 1 the most likely gains, "
            "above 1 the choice spreads over more tokens.",
            temperature=f"{temperature:g}",
            count=len(table),
            share=f"{float(table['probability'].sum()):.0%}",
        )
    )


def _writing(model, prompt: str) -> None:
    st.markdown(t("**The model writes**"))
    if not S["dec_write"].toggle():
        return
    temperature = st.session_state.get(S["dec_temperature"].key, S["dec_temperature"].default)
    draw = S["dec_draw"].number(st.number_input)
    run = compute.compute(
        Generation.of(model, prompt, max_new_tokens=WRITTEN, temperature=float(temperature), seed=int(draw))
    )
    layer = S["dec_layer"].number(st.slider, maximum=run.num_layers - 1, default=run.num_layers // 2)
    generation = run.metadata["generation"]
    sinks = [int(i) for i in np.flatnonzero(run.special_mask[: generation["prompt_tokens"]])]
    rows = []
    for step in generation["steps"]:
        position = step["position"]
        looked = attended_earlier(run.attentions[layer], position, top=3, skip=sinks)
        rows.append(
            {
                "written": _token(model.tokenizer.decode([step["chosen"]])),
                "drawn with probability": step["chosen_sampling_probability"],
                "attends most to": ", ".join(f"{_token(run.tokens[key])} {weight:.2f}" for key, weight in looked),
            }
        )
    text = model.tokenizer.decode(run.metadata["token_ids"][generation["prompt_tokens"] :]).replace("\n", " \u23ce ")
    lead = text[: len(text) - len(text.lstrip())]
    st.markdown(f"{messages.md_escape(prompt)}{lead}**{messages.md_escape(text.strip())}**" if text.strip() else "")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="cls_dec_written")
    st.caption(
        t(
            "Temperature {temperature}, draw {draw}: the same draw writes the same tokens. Each written token's row "
            "of layer {layer}'s attention, averaged over its {heads} heads: the three tokens (itself included) it "
            "attended to most as it was written, the sink (the first, special token, where heads park the attention "
            "they do not need) left out. Explore shows every head of it (write tokens there with +1).",
            temperature=f"{temperature:g}",
            draw=draw,
            layer=layer,
            heads=run.num_heads,
        )
    )
