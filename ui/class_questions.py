"""Predict together: a question the whole class answers on its own screens, the teacher sees the spread, then reveals.

Two kinds: each predict-then-reveal step of the Classroom page (``classroom_question``), asked of the class as
soon as the teacher's page draws it; and a question the teacher poses in Explore (``explore_question``): "which
token will this head attend to most from X?", answered by clicking a token while the head stays hidden. Only the
teacher's session makes, reveals or resets a question (the role is decided on the server, ``ui.follow``); a
student sends only the number of an answer offered, once per question, under the identity the server signed for
its browser (a session without one is told how to get one and cannot answer). One client address may send at
most ``ANSWERS_PER_CLIENT_PER_S`` answers a second; those refused here never reach the class's own cap. A student's
answer buttons are a fragment of their own: a click reruns them alone, so the answer is acknowledged at once
however many students click together. A class file locked for longer than the store waits tells the student to
click again; nothing is shown as an error. Everything shown is drawn by this code (answers are numbers; labels
are the teacher's tokens, escaped).
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np
import streamlit as st

from ui import class_session, follow
from ui.figures.answers import answers_figure
from ui.i18n import t
from ui.widgets.charts import memo_key, presenting, show_chart
from ui.widgets.messages import md_escape

LIVE_S = 1.0  # how often the teacher's count and histogram refresh
PRESENTED_CHART_HEIGHT = 230  # the class's answers beside the answer on a projector (enlarged by presentation mode)
ANSWERS_PER_CLIENT_PER_S = 3  # answers one client address may send a second (the class's own cap is 60)
SLOW_DOWN, LOCKED, NO_IDENTITY = "slow down", "locked", "no identity"
MESSAGES = {
    class_session.ALREADY: "You have already answered this question.",
    class_session.CLOSED: "This question is closed: the teacher has revealed the answer.",
    class_session.BUSY: "Many answers at this moment: click your answer again in a second.",
    SLOW_DOWN: "Many answers from this device at this moment: click your answer again in a second.",
    LOCKED: "Your answer could not be saved just now: click it again.",
}
NO_IDENTITY_NOTE = (
    "To answer, this browser needs the class's cookie: allow cookies for this site and open the class link again "
    "(the link the teacher's server printed, or its QR code)."
)
BUSY_NOTE = ":material/hourglass_top: The class's answers file is busy for a moment; this part comes back by itself."
_CLIENT_ANSWERS = class_session.ClientLimits(ANSWERS_PER_CLIENT_PER_S, 1.0)


def question_key(parts: tuple) -> str:
    """A question's key from what defines it: the same view and question make the same key on every screen."""
    return hashlib.sha1("\n".join(map(str, parts)).encode()).hexdigest()[:16]


def _options(question) -> list[str]:
    """The answers offered, as this screen shows them: a Classroom question's words ("More", "Less") in the screen's
    language (the class's store keeps them in English, so every screen reads its own); tokens as they are."""
    return [t(option) for option in question.options] if question.kind == "classroom" else list(question.options)


def _labels(question) -> list[str]:
    return [md_escape(option) for option in _options(question)]


def _live_answers(key: str) -> None:
    try:
        question = follow.store().question(follow.session_id(), key)
        counts = follow.store().counts(follow.session_id(), key)
    except class_session.StoreBusy:
        return  # the next refresh reads them
    if question is None:
        return
    st.markdown(t("**{count}** answer(s) so far.", count=sum(counts)))
    options = _options(question)
    show_chart(
        lambda: answers_figure(options, counts),
        key=f"class_live_{key}",
        memo=memo_key("live", options=options, counts=counts),
    )


def _submit(key: str) -> None:
    choice = st.session_state.get(f"class_pick_{key}")
    if choice is None:
        return
    student = follow.student_id()
    if student is None:
        result = NO_IDENTITY
    elif not _CLIENT_ANSWERS.allow(st.context.ip_address or "this machine"):
        result = SLOW_DOWN
    else:
        try:
            result = follow.store().answer(follow.session_id(), key, student, int(choice))
        except class_session.StoreBusy:
            result = LOCKED
        except ValueError:  # not an answer offered (a forged message): nothing stored, nothing to say
            return
    st.session_state[f"class_result_{key}"] = result
    if result != class_session.ACCEPTED:
        # Cleared, not forgotten: the browser is sent the empty value and holds it, so the refused answer is not
        # sent again with the next poll (a forgotten key leaves the browser's value to be submitted later, unclicked),
        # and the same answer can be clicked again.
        st.session_state[f"class_pick_{key}"] = None


def _teacher_action(action, session: str, key: str) -> None:
    """Reveal or reset (a button's callback); a class file locked too long says so instead of failing."""
    try:
        action(session, key)
    except class_session.StoreBusy:
        st.session_state[f"class_teacher_busy_{key}"] = True


def _teacher_controls(question) -> None:
    store, session = follow.store(), follow.session_id()
    if not question.revealed:
        st.fragment(run_every=LIVE_S)(_live_answers)(question.key)
    if st.session_state.pop(f"class_teacher_busy_{question.key}", False):
        st.warning(t("The class's answers file is busy: click again."))
    reveal, reset = st.columns(2)
    reveal.button(
        t("Reveal to the class"),
        key=f"class_reveal_{question.key}",
        on_click=_teacher_action,
        args=(store.reveal, session, question.key),
        disabled=question.revealed,
        icon=":material/visibility:",
    )
    reset.button(
        t("Ask again (clear the answers)"),
        key=f"class_reset_{question.key}",
        on_click=_teacher_action,
        args=(store.reset, session, question.key),
        icon=":material/restart_alt:",
    )


def _mine(key: str) -> int | None:
    student = follow.student_id()
    if student is None:
        return None
    with contextlib.suppress(class_session.StoreBusy):
        return follow.store().answer_of(follow.session_id(), key, student)
    return None


@st.fragment
def _answer_box(key: str, labels: list[str]) -> None:
    """A student's answer buttons, or the answer once given: a fragment, so that a click reruns only this (the
    acknowledgement reaches the student at once, however many click together)."""
    if follow.student_id() is None:
        st.info(t(NO_IDENTITY_NOTE), icon=":material/cookie:")
        return
    mine = _mine(key)
    result = st.session_state.pop(f"class_result_{key}", None)
    if result in MESSAGES and (result != class_session.ALREADY or mine is None):
        st.warning(t(MESSAGES[result]))
    if mine is None:
        st.pills(
            t("Your answer"),
            list(range(len(labels))),
            format_func=labels.__getitem__,
            key=f"class_pick_{key}",
            on_change=_submit,
            args=(key,),
        )
    else:
        st.success(t("Your answer: **{answer}**. Wait for the teacher to reveal it.", answer=labels[mine]))


def _student_controls(question) -> int | None:
    """The answer buttons (or the student's answer once given) until the reveal; returns the student's answer."""
    if not question.revealed:
        _answer_box(question.key, _labels(question))
    return _mine(question.key)


def _revealed(question, mine: int | None, answer_md: str | None) -> None:
    try:
        counts = follow.store().counts(follow.session_id(), question.key)
    except class_session.StoreBusy:
        st.caption(t(BUSY_NOTE))
        return
    # On a projector the answer and the class's chart sit side by side, so both show on the screen under the
    # prompt (one below the other, the chart fell below the fold at 1400 x 900).
    text, chart = st.columns([2, 3], vertical_alignment="center") if presenting() else (st.container(),) * 2
    if answer_md:
        text.markdown(t("**Answer:** {answer}", answer=answer_md))
    text.caption(t("The class's {count} answer(s), the model's answer in green.", count=sum(counts)))
    with chart:
        options, height = _options(question), PRESENTED_CHART_HEIGHT if presenting() else 300
        show_chart(
            lambda: answers_figure(options, counts, question.correct, question.model_values, mine, height=height),
            key=f"class_result_chart_{question.key}",
            memo=memo_key(
                "result",
                options=options,
                counts=counts,
                correct=question.correct,
                model=question.model_values,
                mine=mine,
                height=height,
            ),
        )


def classroom_question(digest: str, prompt_md: str, options, correct: int, answer_md: str, shows_answer) -> bool:
    """A Classroom step's prediction asked of the class (the prompt already drawn by the page). False when this
    screen is not in a class asking it (the page then draws its own private reveal)."""
    role, session = follow.role(), follow.session_id()
    if role is None:
        return False
    store = follow.store()
    try:
        if role == follow.TEACHER:
            question = store.ask(session, digest, "classroom", prompt_md, options=options, correct=correct)
        else:
            question = store.question(session, digest)
    except class_session.StoreBusy:
        st.caption(t(BUSY_NOTE))
        return False
    if question is None:  # the teacher is not asking this one
        return False
    mine = _teacher_controls(question) if role == follow.TEACHER else _student_controls(question)
    if question.revealed:
        _revealed(question, mine, answer_md)
        if shows_answer is not None:
            shows_answer()
    return True


# ---- Explore: which token will this head attend to? -------------------------------------------------------------
def _ask_in_explore(view, layer: int, head: int) -> None:
    """The teacher's form: pick the token the question is about, and ask."""
    names = list(view.tokens)
    focus = st.selectbox(
        t("From which token?"),
        list(range(len(names))),
        format_func=lambda index: f"{index}: {names[index]}",
        key="class_explore_focus",
    )
    if st.button(t("Ask the class"), key="class_explore_ask", icon=":material/quiz:"):
        # A decoder's token sees only itself and the tokens before it: only those are answers.
        keys = names[: focus + 1] if view.is_causal else names
        row = np.asarray(view.attentions[layer, head, focus, : len(keys)], dtype=float)
        prompt = (
            f"Which token will layer {layer}, head {head} attend to most from "
            f"**{md_escape(names[focus])}** (token {focus})?"
        )
        key = question_key(("explore", view.model_name, view.text, view.text_pair, view.level, layer, head, focus))
        try:
            follow.store().ask(
                follow.session_id(),
                key,
                "explore",
                prompt,
                keys,
                correct=int(np.argmax(row)),
                model_values=row,
                current=True,
            )
        except class_session.StoreBusy:
            st.warning(t("The class's answers file is busy: click again."))
            return
        st.rerun(scope="app")


def explore_question(view, layer: int, head: int) -> bool:
    """Explore's class question (the session's current one), above the view; True while the head must stay
    hidden (asked and not revealed, on the teacher's screen and on the screens that follow it)."""
    if follow.role() is None:
        return False
    store, session = follow.store(), follow.session_id()
    try:
        current = store.view(session).current_question
        question = store.question(session, current) if current else None
    except class_session.StoreBusy:
        st.caption(t(BUSY_NOTE))
        return False
    if question is not None and question.kind != "explore":
        question = None
    with st.container(border=True):
        if question is None:
            if not follow.is_teacher():
                return False
            with st.expander(t("Ask the class about this head"), icon=":material/quiz:"):
                _ask_in_explore(view, layer, head)
            return False
        st.markdown(":material/quiz: " + t("**Class question:** {question}", question=question.prompt))
        if follow.is_teacher():
            _teacher_controls(question)
            if st.button(t("Close the question"), key="class_explore_close", icon=":material/close:"):
                try:
                    store.close_current(session)
                except class_session.StoreBusy:
                    st.warning(t("The class's answers file is busy: click again."))
                else:
                    st.rerun(scope="app")
            mine = None
        else:
            mine = _student_controls(question)
        if question.revealed:
            _revealed(question, mine, None)
    return not question.revealed and follow.following()
