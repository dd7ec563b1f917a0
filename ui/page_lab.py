"""The Lab page's settings (``LabSettings``, declared once: ``ui.page_settings``) and its logic: the model a
choice of task, size, positions, seed and offset makes (``lab_config``), and the session's one training
(``runner_for``, ``start``, ``pause``, ``reset``: a ``ui.lab_runner.LabRunner``). ``pages/lab.py`` draws them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import streamlit as st

from mha_core.lab import POSITIONS, LabConfig
from ui import compute, session
from ui.i18n import language
from ui.lab_runner import LabRunner
from ui.page_settings import PageSettings, setting

RUNNER = "lab_runner"  # the session's LabRunner: page state, not a setting (it trains in a thread of its own)

TASK_LABELS = {
    "induction": "Induction: continue a repeated segment",
    "positional": "Positional: repeat the token k steps back",
    "largest": "Content: the largest token so far",
}
TASK_TEXT = {
    "induction": (
        "Each training sequence is random tokens in which one segment appears twice, at a random place. "
        "The second time, the model can predict the segment if it finds the earlier copy of the current "
        "token and reads what came after it. That takes **two heads working together**: a previous-token "
        "head in layer 0 writes *which token came before me* into every position, and an **induction "
        "head** in layer 1 searches for the position whose previous token equals the current token. "
        "Because the copy's place and distance change every time, no single positional head can do it."
    ),
    "positional": (
        "The model must output the token k steps back. One head that always looks exactly k positions "
        "back solves it: watch one head's offset score climb while the loss drops."
    ),
    "largest": (
        "The model must output the largest token seen so far. A head has to find the key with the largest "
        "*content*, wherever it is: its score is the attention on the position holding that token."
    ),
}
WATCH_FOR = {
    "induction": (
        "**What to watch for.** For a while the loss on the repeated positions barely moves: the model only "
        "knows which tokens are common. Then, within a few dozen steps, it falls off a cliff (the **phase "
        "change**, marked in green). At the same moment one layer-1 head's induction score shoots up, and a "
        "layer-0 head's previous-token score rises with it. In the attention grid, the layer-0 head draws a "
        "line just below the diagonal; the induction head draws a second, shifted diagonal in the part "
        "where the segment repeats. Finally switch that head off below: the repeated-position loss goes "
        "back up, so that head really is the mechanism, not a coincidence."
    ),
    "positional": (
        "**What to watch for.** One head's attention becomes a line k cells below the diagonal; its score "
        "nears 1 and the loss falls towards 0. Switch that head off and the loss jumps back."
    ),
    "largest": (
        "**What to watch for.** A head stops spreading its attention and puts it on the biggest token so "
        "far; in the grid its columns light up at the positions of new maxima."
    ),
}
# By their name in the link.
SIZES = {
    "2x4": dict(num_layers=2, num_heads=4, d_model=64),
    # 32 token values: at d_model 32, 128 left the induction loss on its plateau for 600 steps (32: phase
    # change at step 250, previous-token head 0.82 by step 600, seed 0).
    "2x2": dict(num_layers=2, num_heads=2, d_model=32, vocab_size=32),
    "3x4": dict(num_layers=3, num_heads=4, d_model=64),
    "2x4-mlp": dict(num_layers=2, num_heads=4, d_model=64, mlp=True),
}
SIZE_LABELS = {
    "2x4": "2 layers x 4 heads, d_model 64 (default)",
    "2x2": "2 layers x 2 heads, d_model 32 (fastest)",
    "3x4": "3 layers x 4 heads, d_model 64",
    "2x4-mlp": "2 layers x 4 heads, d_model 64, with MLPs",
}
STEP_CHOICES = [100, 250, 500, 1000, 1500, 3000]


@dataclass(frozen=True)
class LabSettings(PageSettings):
    """Every setting of the Lab page. The head switched off is a head of the trained model (its bounds follow
    the model; its session key names the task, so each task keeps its own)."""

    task: str = setting("lab_task", "task", "choice", "induction", label="Task", options=TASK_LABELS)
    size: str = setting("lab_size", "size", "choice", "2x4", label="Model size", options=SIZE_LABELS)
    steps: int = setting(
        "lab_steps", "steps", "choice", 1000, label="Training steps", options={n: str(n) for n in STEP_CHOICES}
    )
    positions: str = setting(
        "lab_positions", "encoding", "choice", "learned", label="Positional encoding", options={p: p for p in POSITIONS}
    )
    seed: int = setting("lab_seed", "seed", "number", 0, label="Seed", minimum=0, maximum=10_000)
    offset: int = setting("lab_offset", "k", "number", 3, label="k (positional task)", minimum=1, maximum=8)
    off_layer: int = setting("lab_ablate_layer_{task}", "off_layer", "number", 0, label="Layer", minimum=0)
    off_head: int = setting("lab_ablate_head_{task}", "off_head", "number", 0, label="Head", minimum=0)


def lab_config(chosen: LabSettings) -> LabConfig:
    """The model the settings describe (``HeadscopeError`` for a combination the Lab refuses)."""
    return LabConfig(
        task=chosen.task,
        positions=chosen.positions,
        seed=int(chosen.seed),
        offset=int(chosen.offset),
        **SIZES[chosen.size],
    )


def runner_for(config: LabConfig, total_steps: int) -> LabRunner:
    """The session's training: a new one while the current one has not started and its settings changed."""
    runner: LabRunner | None = st.session_state.get(RUNNER)
    untouched = runner is not None and runner.status == "new"
    if runner is None or (untouched and (runner.config != config or runner.total_steps != total_steps)):
        # The training's thread does not know the session: its queue notice takes the language this run knows.
        run = partial(compute.run_admitted, lang=language())
        runner = st.session_state[RUNNER] = LabRunner(config, total_steps, run, presence=session.presence())
    return runner


def start() -> None:
    st.session_state[RUNNER].start()


def pause() -> None:
    st.session_state[RUNNER].pause()
    st.session_state[RUNNER].join(timeout=5)


def reset() -> None:
    old = st.session_state.pop(RUNNER, None)
    if old is not None:
        old.stop()
