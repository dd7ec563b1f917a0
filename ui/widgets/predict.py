"""Explore's output section: what the model predicts next, and the model writing token by token.

``grown(run)`` is the run Explore draws: the sidebar's run, or, once the visitor has had the model write
(``?gen=`` tokens), the run over the sentence and the written tokens (``mha_core.operations.Generation`` through
``ui.compute.compute``), the written tokens marked. ``section(run)`` draws the next-token table (read from the
run itself: the run's own pass kept its last position's logits, no second pass), the writing controls (all in
the address: ``gen``, ``temp``, ``topk``, ``topp``, ``seed``) and, for a written token, the distribution it was
drawn from. A masked language model shows its prediction at the text's mask token."""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from mha_core.models.generation import MAX_NEW_TOKENS
from mha_core.models.prediction import run_prediction
from mha_core.operations import Generation, Prediction
from ui import compute, session
from ui.i18n import t
from ui.page_explore import ExploreSettings
from ui.widgets import messages

SHOWN = 10  # rows of the next-token table
MARK = "\u25b8"  # before a written token in the head view
WRITE_COUNTS = (1, 5, 10)
S = ExploreSettings.declarations()
WRITING = ("gen_count", "temperature", "top_k", "top_p", "seed")  # the writing settings (ExploreSettings' fields)


def _settings() -> dict:
    """The writing settings, each from this session, else the link (checked, a notice for a bad value), else
    its default."""
    return {name: S[name].start() for name in WRITING}


def writes(run) -> bool:
    """Whether the run's model writes text (a decoder with its language-model head): its pass kept a prediction,
    or it is a written run."""
    has_head = run.metadata.get("prediction") is not None or run.metadata.get("generation") is not None
    return bool(run.is_causal) and has_head


def generation_operation(run, count: int, settings: dict) -> Generation:
    """The operation writing ``count`` tokens after the run's sentence with ``settings``."""
    selection = session.selection()
    model = compute.get_model(run.model_name)
    return Generation.of(
        model,
        selection.text,
        bos=selection.bos,
        max_new_tokens=int(count),
        temperature=float(settings["temperature"]),
        top_k=int(settings["top_k"]) or None,
        top_p=None if settings["top_p"] >= 1.0 else float(settings["top_p"]),
        seed=int(settings["seed"]),
    )


def marked(run):
    """A copy of a written run whose written tokens (and words) begin with ``MARK``, for the head view."""
    written = set(run.metadata.get("generation", {}).get("generated", ()))
    if not written:
        return run
    tokens = [f"{MARK}{token}" if i in written else token for i, token in enumerate(run.tokens)]
    words = list(run.words)
    for i in written:
        word = int(run.word_ids[i])
        if 0 <= word < len(words) and not words[word].startswith(MARK):
            words[word] = f"{MARK}{words[word]}"
    return dataclasses.replace(run, tokens=tokens, words=words)


def grown(run):
    """The run Explore draws: ``run`` itself, or, after the visitor had the model write, the written run (marked)."""
    if run is None or not writes(run):
        return run
    settings = _settings()
    if settings["gen_count"] <= 0:
        return run
    return marked(compute.compute(generation_operation(run, settings["gen_count"], settings)))


def written_rows(view) -> list[int]:
    """The positions of ``view`` (a run as the toggles shape it) that hold a written token (marked by ``marked``)."""
    return [i for i, token in enumerate(view.tokens) if str(token).startswith(MARK)]


_FOLLOW = "predict_follow_token"  # a written token was picked on the head view: rerun the page once


def take_token(run, units: list, row: int) -> None:
    """A token's label picked on the head view (``row`` of the view whose run positions are ``units``): for a
    written token the output section shows the distribution it was drawn from (the last written token of the
    row's unit: a word's tokens are written one by one); for a prompt token, the model's prediction at the
    position before it (before the unit's first token). The first token and a row outside the view change nothing."""
    steps = run.metadata.get("generation", {}).get("steps", ())
    drawn = {int(step["position"]) for step in steps}
    if not 0 <= row < len(units) or not writes(run):
        return
    positions = [int(i) for i in units[row] if int(i) in drawn]
    if positions:
        S["written"].set(positions[-1])
        S["prompt_token"].set(0)
    elif int(units[row][0]) > 0:
        S["prompt_token"].set(int(units[row][0]))
    else:
        return
    st.session_state[_FOLLOW] = True


def follow_token() -> None:
    """After ``take_token``: the whole page again (the head view is a fragment; the output section is not in it)."""
    if st.session_state.pop(_FOLLOW, False):
        st.rerun(scope="app")


def _write(count: int) -> None:
    S["gen_count"].set(min(int(st.session_state.get(S["gen_count"].key, 0)) + count, MAX_NEW_TOKENS))


def _clear() -> None:
    S["gen_count"].set(0)


def prediction_table(frame: pd.DataFrame, key: str) -> None:
    """The k most likely tokens with their probabilities (a bar in each row)."""
    shown = frame.assign(token=frame["token"].map(repr))[["rank", "token", "probability", "logit", "id"]]
    st.dataframe(
        shown,
        hide_index=True,
        key=key,
        column_config={
            "probability": st.column_config.ProgressColumn("probability", min_value=0.0, max_value=1.0, format="%.3f"),
            "logit": st.column_config.NumberColumn("logit", format="%.2f"),
        },
    )


def step_frame(step: dict, tokenizer) -> pd.DataFrame:
    """One written token's distribution: its most likely tokens with the model's probability and the probability
    it was drawn with (after temperature, top-k, top-p), the chosen one marked."""
    return pd.DataFrame(
        {
            "token": [repr(tokenizer.decode([i])) for i in step["ids"]],
            "model probability": step["probabilities"],
            "drawn with": step["sampling"],
            "chosen": [i == step["chosen"] for i in step["ids"]],
        }
    )


def section(run) -> None:
    """The prediction of the run's pass, the writing controls and a written token's distribution (see the module)."""
    generation = None if run is None else run.metadata.get("generation")
    if run is None or (run.metadata.get("prediction") is None and generation is None):
        return
    model = compute.get_model(run.model_name)
    st.subheader(t("What the model predicts"))
    if not run.is_causal:
        record = run.metadata["prediction"]
        st.caption(
            t(
                "The masked language model's guesses for the mask token at position {position} (probabilities: "
                "softmax of its logits over the whole vocabulary; the same pass as the heads above).",
                position=record["position"],
            )
        )
        prediction_table(run_prediction(run, model.tokenizer, SHOWN), "predict_table")
        return
    table, controls = st.columns([3, 2])
    with table:
        if generation is None:
            st.caption(
                t(
                    "The next token after the sentence: the model's ten most likely, with their probabilities "
                    "(softmax of its logits over the whole vocabulary), read from the same forward pass as the heads "
                    "above."
                )
            )
            prediction_table(run_prediction(run, model.tokenizer, SHOWN), "predict_table")
        else:
            written_token(run, generation, model.tokenizer)
    with controls:
        write_controls(run, generation)
    before_prompt_token(run, model)


def _forget_prompt_token() -> None:
    S["prompt_token"].set(0)


def before_prompt_token(run, model) -> None:
    """The prompt token picked on the head view (``ptok``; 0: none): the model's ten most likely tokens at the
    position before it (one pass over the prompt, ``Prediction`` through ``ui.compute``), the prompt's own token
    marked. Labelled as what it is: the model's expectation there, not a distribution the token was drawn from."""
    position = int(S["prompt_token"].start())
    S["prompt_token"].keep()
    generated = run.metadata.get("generation", {}).get("generated", ())
    prompt = run.num_tokens - len(generated)
    if not 1 <= position < prompt:
        return
    selection = session.selection()
    encoded = model.encode(selection.text, bos=selection.bos)
    if position >= len(encoded):
        return
    operation = Prediction.of(
        model, selection.text, selection.bos, k=SHOWN, position=position - 1, engine=selection.engine
    )
    frame = compute.compute(operation)
    actual = int(encoded.input_ids[position])
    st.markdown(f"**{t('Before a prompt token')}**")
    st.caption(
        t(
            "Token {position} ({token}) is the prompt's, not written by the model. Below: what the model predicted at "
            "position {before}, before it saw that token (its ten most likely next tokens); the prompt's token is "
            "marked when it is among them.",
            position=position,
            token=messages.md_escape(repr(str(run.tokens[position]))),
            before=position - 1,
        )
    )
    shown = frame.assign(token=frame["token"].map(repr), prompt=frame["id"] == actual)
    st.dataframe(
        shown[["rank", "token", "probability", "prompt", "id"]],
        hide_index=True,
        key="prompt_token_table",
        column_config={
            "probability": st.column_config.ProgressColumn("probability", min_value=0.0, max_value=1.0, format="%.3f"),
        },
    )
    st.button(t("Hide"), key="prompt_token_hide", on_click=_forget_prompt_token)


def write_controls(run, generation: dict | None) -> None:
    """Write one token or several (temperature, top-k, top-p, seed: all kept in the address)."""
    _settings()
    st.markdown(t("**Let the model write**"))
    S["temperature"].select(st.select_slider)
    left, right = st.columns(2)
    S["top_k"].select(left.selectbox)
    S["top_p"].select(right.selectbox)
    S["seed"].number(st.number_input, step=1)
    count = st.session_state[S["gen_count"].key]
    buttons = st.columns(len(WRITE_COUNTS) + 1)
    for column, n in zip(buttons, WRITE_COUNTS):
        column.button(
            f"+{n}",
            key=f"gen_write_{n}",
            on_click=_write,
            args=(n,),
            disabled=count >= MAX_NEW_TOKENS,
            help=t("Write {count} more tokens.", count=n) if n > 1 else t("Write 1 more token."),
        )
    buttons[-1].button(
        t("Clear"), key="gen_clear", on_click=_clear, disabled=count == 0, help=t("Back to the sentence.")
    )
    if generation is not None:
        written = len(generation["generated"])
        note = t("{count} token(s) written ({mark} in the head view)", count=written, mark=MARK)
        if generation["stopped"] == "stop token":
            note += t("; the model ended the text")
        elif generation["stopped"] == "length":
            note += t("; the model's token limit is reached")
        st.caption(note + t("."))
    S["gen_count"].keep()


def written_token(run, generation: dict, tokenizer) -> None:
    """Choose a written token: the distribution it was drawn from."""
    steps = generation["steps"]
    if not steps:
        st.caption(t("No token written yet."))
        return
    positions = [step["position"] for step in steps]
    tokens = list(run.tokens)
    by_position = {step["position"]: step for step in steps}
    position = S["written"].select(
        st.selectbox, positions, default=positions[-1], format_func=lambda i: f"{i}: {tokens[i]}"
    )
    step = by_position[position]
    st.caption(
        t(
            "Token {position} was drawn with probability {drawn} (the model's own: {own}); temperature "
            "{temperature}. The ten most likely tokens at that step:",
            position=position,
            drawn=f"{step['chosen_sampling_probability']:.3f}",
            own=f"{step['chosen_probability']:.3f}",
            temperature=f"{generation['temperature']:g}",
        )
    )
    st.dataframe(
        step_frame(step, tokenizer),
        hide_index=True,
        key="gen_step_table",
        column_config={
            "model probability": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="%.3f"),
            "drawn with": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="%.3f"),
        },
    )
    st.caption(
        t("In the head view, the written token's row shows which earlier tokens each head attended to as it wrote it.")
    )
