"""The Classroom page's settings (``ClassroomSettings``, declared once: ``ui.page_settings``) and its logic: the
answers a link opens revealed (``reveal=``), each question's switch, and the step Back and Next move to.
``pages/classroom.py`` draws the steps."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import streamlit as st

import mha_core as mc
from mha_core import walkthrough
from ui.figures import teaching
from ui.i18n import t
from ui.page_explore import TEMPERATURES
from ui.page_settings import PageSettings, setting

SOURCES = {
    "words": "Four words: The cat sat down",
    "tutorial": "A popular tutorial's worked example",
    "random": "Random numbers, any size",
}
STEP_COUNT = 10  # the steps of pages/classroom.py's STEPS (tests/pages/test_page_classroom.py checks it)
CLASS_SENTENCE = "When Mary and John went to the store, John gave a drink to"  # step 10's sentence
DECODER_PROMPTS = ("The cat sat on the", "The capital of France is", "Once upon a time, there was a")  # step 9
WRITTEN = 5  # tokens the model writes in step 9
REVEAL_URL_KEY = "reveal"
REVEAL_LINK = re.compile(r"[0-9a-f]{12}(,[0-9a-f]{12}){0,15}")


@dataclass(frozen=True)
class ClassroomSettings(PageSettings):
    """Every setting of the Classroom page. The sizes and the seed apply to random numbers; the head to follow
    is one of the example's heads."""

    source: str = setting("cls_source", "numbers", "choice", "words", label="Numbers", options=SOURCES)
    seq_len: int = setting("cls_seq_len", "length", "number", 4, label="Sequence length", minimum=2, maximum=12)
    d_model: int = setting(
        "cls_d_model",
        "d_model",
        "choice",
        8,
        label="d_model",
        options={d: str(d) for d in (4, 8, 12, 16, 24, 32, 64, 128, 256, 512)},
    )
    heads: int = setting(
        "cls_heads", "heads", "choice", 2, label="Heads", options={h: str(h) for h in (1, 2, 3, 4, 6, 8)}
    )
    seed: int = setting("cls_seed", "seed", "number", 0, label="Random seed", minimum=0, maximum=1_000_000)
    score: str = setting(
        "cls_score",
        "score",
        "choice",
        "scaled",
        label="Score function",
        options={name: teaching.SCORE_LABELS.get(name, name) for name in mc.SCORE_FUNCTIONS},
    )
    causal: bool = setting(
        "cls_causal", "causal", "flag", False, label="Causal mask (a token sees only itself and earlier tokens)"
    )
    all_steps: bool = setting("cls_all", "all", "flag", False, label="All steps on one page")
    head: int = setting("cls_head", "follow", "choice", 0, label="Head to follow")
    printed: str = setting(
        "cls_printed",
        "printed",
        "choice",
        next(iter(walkthrough.TUTORIAL_PRINTED)),
        label="Matrix",
        options={name: name for name in walkthrough.TUTORIAL_PRINTED},
    )
    step: int = setting("cls_step", "step", "number", 1, minimum=1, maximum=STEP_COUNT)
    # Step 10, "Is attention explanation?" (ui/attribution_view.py): the model (one of the embedded ones this
    # server offers) and the class's sentence.
    attr_model: str | None = setting("cls_attr_model", "amodel", "choice", label="Model")
    attr_text: str = setting("cls_attr_text", "atext", "text", CLASS_SENTENCE, label="The class's sentence")
    # Step 9, a decoder predicting and writing (ui/decoder_lesson.py): the sentence, the temperature, the switch
    # that lets it write, the draw, and the layer whose heads are averaged (its range and default follow the model).
    dec_prompt: str = setting(
        "cls_dec_prompt",
        "dprompt",
        "choice",
        DECODER_PROMPTS[0],
        label="Sentence",
        options={p: p for p in DECODER_PROMPTS},
    )
    dec_temperature: float = setting(
        "cls_dec_temperature",
        "dtemp",
        "choice",
        1.0,
        label="Temperature",
        help="The logits are divided by the temperature before softmax.",
        options={t: str(t) for t in TEMPERATURES},
    )
    dec_write: bool = setting("cls_dec_write", "dwrite", "flag", False, label=f"Let the model write {WRITTEN} tokens")
    dec_draw: int = setting(
        "cls_dec_draw", "ddraw", "number", 0, label="Draw", help="Another draw, other tokens.", minimum=0, maximum=999
    )
    dec_layer: int | None = setting(
        "cls_dec_layer", "dlayer", "number", label="Layer whose heads are averaged", minimum=0
    )


def head_choices(num_heads: int) -> dict[int, str]:
    """The heads to follow as the page names them (from 1)."""
    return {i: t("head {n}", n=i + 1) for i in range(num_heads)}


# The walkthrough's note on one printed entry of a matrix (``mha_core.walkthrough``): "Q1 = X @ W_1^Q: row 1 of X
# times column 2 of W_1^Q".
ENTRY_NOTE = re.compile(
    r"(?P<name>\S+) = X @ (?P<weights>\S+): row (?P<row>\d+) of X times column (?P<column>\d+) of \S+"
)


def entry_note(note: str) -> str:
    """A discrepancy's note in the screen's language: a matrix entry's note by its pattern, the others whole."""
    match = ENTRY_NOTE.fullmatch(note)
    if match is None:
        return t(note)
    return t("{name} = X @ {weights}: row {row} of X times column {column} of {weights}", **match.groupdict())


def question_digest(question: str, answer: str) -> str:
    """A question's name in the address (``reveal=``): the same question with the same answer, the same name."""
    return hashlib.sha1(f"{question}\n{answer}".encode()).hexdigest()[:12]


def reveal_key(digest: str) -> str:
    """The session key of the "Reveal the answer" switch of the question ``digest``."""
    return f"cls_reveal_{digest}"


def start_reveal(digest: str, revealed_in_link) -> str:
    """The session key of the question ``digest``'s "Reveal the answer" switch, which starts, once, as the link
    says (``revealed_in_link()``: the digests it opens revealed, asked only then)."""
    key = reveal_key(digest)
    if key not in st.session_state:
        st.session_state[key] = digest in revealed_in_link()
    return key


def revealed_in(raw: str | None) -> set[str]:
    """The answers the link's ``reveal=`` opens revealed; ``ValueError`` for a value that is no such list."""
    if raw is None:
        return set()
    if not REVEAL_LINK.fullmatch(raw):
        raise ValueError("a list of revealed answers")
    return set(raw.split(","))


def moved(step: int, by: int, count: int = STEP_COUNT) -> int:
    """The step Back (``by`` -1) or Next (1) moves to, within 1 to ``count``."""
    return min(max(step + by, 1), count)
