"""Messages: what a page says to its visitor. Text from an address or a user in a message is made inert for
markdown (``md_escape``, ``md_code``: from ``ui.escape``, so that ``ui.compute``'s progress texts use them too) and never shows a server path (``public_message``); an unexpected error is one line, never a
traceback (``error_display``)."""

from __future__ import annotations

import contextlib
import logging

import streamlit as st

from mha_core.errors import HeadscopeError, InputTextError, redact_paths
from ui import address
from ui.escape import md_code, md_escape  # noqa: F401 (the app's one way to put user text in a message)
from ui.i18n import language, t

LOG = logging.getLogger("headscope.app")


INTRO = (
    "**Headscope** shows what every attention head of a transformer does with your sentence. "
    "Each head turns each token (a *query*) into a weighted look at the other tokens (the *keys*); "
    "a heatmap row is one token's attention and sums to 1. Pick a model and type a sentence in the sidebar."
)


FIRST_TEN_MINUTES = """
- **A token** is a piece of text the model reads: a word, or part of one (`##ably` continues the word before
  it), plus markers the model adds, such as `[CLS]` and `[SEP]` or a beginning-of-text token.
- **Each head asks a question of every token.** The token asking is the *query* (a row); the tokens it looks
  at are the *keys* (the columns). A row's weights are how much of its attention the query gives each key;
  they add up to 1. Dark = much attention.
- **Why many heads?** Each head has its own question: one looks at the previous word, one finds a verb's
  subject, many look at nothing in particular. A model combines all their answers; no single head is the
  model's "attention".
- **What is a sink?** Most heads park the attention they do not need on one token of no content (`[CLS]`,
  `[SEP]`, the first token). A head that does that for every query is doing nothing for this sentence.
- **Try it:** click a head in the grid to enlarge it; show it as **Lines** and pick a query token to see
  only its lines; switch to the model view to see every layer at once; the Head roles page names what each head does.
"""


def public_message(error, typed: str | None = None, limit: int = 600) -> str:
    """A library message made fit for any visitor: no server path (but the folder the user typed),
    cut to ``limit`` characters, markdown made inert."""
    text = redact_paths(str(error), keep=(typed,) if typed else ())
    if len(text) > limit:
        text = text[:limit] + "…"
    return md_escape(text)


@contextlib.contextmanager
def error_display():
    """Show library errors as ``st.error`` and anything unexpected as one short line, never a traceback.

    Streamlit's own control flow (rerun, stop, page switch) derives from BaseException and passes through.
    """
    try:
        yield
    except InputTextError as error:
        st.error(t("This text cannot be read: {reason}", reason=public_message(error)))
    except HeadscopeError as error:
        st.error(public_message(error))
    except Exception as error:  # last resort: the page keeps working, the details go to the server log
        LOG.exception("unexpected error in a page")
        st.error(
            t(
                "Something went wrong ({kind}). Try another sentence or model; the details are in the server log.",
                kind=type(error).__name__,
            )
        )


def show_link_notices() -> None:
    """What was wrong with the link this session was opened with, once, above the page."""
    notices = address.take_link_notices()
    if notices:
        st.warning(t("This link was changed to work:") + "\n" + "\n".join(f"- {md_escape(n)}" for n in notices))


def explain(text: str) -> None:
    """A short plain-language note for the class, set apart from the numbers."""
    st.info(t(text), icon=":material/school:")


def engine_note(run) -> None:
    """For the from-scratch engine: how closely it matches transformers."""
    if run.engine == "core" and run.max_abs_diff is not None:
        if run.max_abs_diff == 0:
            text = t("{model}: the from-scratch engine matches transformers exactly (largest difference 0).")
        else:
            text = t(
                "{model}: the from-scratch engine matches transformers to {diff} (largest absolute difference over "
                "every layer, head and weight)."
            )
        st.success(text.format(model=md_escape(run.model_name), diff=f"{run.max_abs_diff:.1e}"))


def run_summary(run) -> str:
    """A run's one line (``run.summary()``: model, family, layers x heads, tokens, engine) in the session's
    language, escaped; a run of another kind (an encoder-decoder's) as its library writes it."""
    if language() == "en" or not hasattr(run, "num_heads") or not hasattr(run, "family"):
        return md_escape(run.summary())
    family = t("{family}, causal", family=run.family) if run.is_causal else run.family
    line = t(
        "{model} ({family}): {layers} layers x {heads} heads, {tokens} tokens",
        model=run.model_name,
        family=family,
        layers=run.num_layers,
        heads=run.num_heads,
        tokens=run.num_tokens,
    )
    if run.truncated:
        line += t(", truncated from {count}", count=run.num_input_tokens)
    if hasattr(run, "stored_bytes"):  # a long run: its size instead of an engine
        return md_escape(line + t(", long run ({size} MB)", size=f"{run.stored_bytes / 2**20:.0f}"))
    line += t(", engine={engine}", engine=run.engine)
    if run.max_abs_diff is not None:
        line += t(", max |core - transformers| = {diff}", diff=f"{run.max_abs_diff:.2e}")
    return md_escape(line)
