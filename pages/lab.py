"""Lab: train a tiny transformer in the browser and watch its heads specialise."""

from pathlib import Path

import streamlit as st

from mha_core.errors import HeadscopeError
from mha_core.lab import POSITIONS, ROLE_THRESHOLD, TASKS, LabConfig, task_roles
from ui import compute, figures, session, shell
from ui.figures import lab as lab_figures
from ui.lab_runner import LabRunner, appearance_table
from ui.settings import lab_slots
from ui.widgets import charts, messages, pickers

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

POLL_S = 1.0  # how often the live view redraws while training
RUNNER = "lab_runner"

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

st.title("Lab: watch heads being born")
st.markdown(
    "Here a tiny transformer, built from the same from-scratch multi-head attention as the rest of "
    "Headscope, learns a task while you watch. Its heads start out spreading attention evenly; training "
    "turns some of them into specialists. Pick a task and a size, press **Start**, and keep this page open."
)

left, middle, right = st.columns(3)
task = pickers.url_select(left.selectbox, "Task", TASKS, key="lab_task", url_key="task", format_func=TASK_LABELS.get)
size = pickers.url_select(
    middle.selectbox, "Model size", SIZES, key="lab_size", url_key="size", format_func=SIZE_LABELS.get
)
total_steps = pickers.url_select(
    right.select_slider, "Training steps", STEP_CHOICES, key="lab_steps", url_key="steps", default=1000
)
left, middle, right = st.columns(3)
positions = pickers.url_select(
    left.selectbox, "Positional encoding", POSITIONS, key="lab_positions", url_key="encoding"
)
seed = pickers.url_number(middle.number_input, "Seed", 0, 10_000, key="lab_seed", url_key="seed", default=0, step=1)
offset = pickers.url_number(
    right.number_input,
    "k (positional task)",
    1,
    8,
    key="lab_offset",
    url_key="k",
    default=3,
    step=1,
    disabled=task != "positional",
)
st.markdown(TASK_TEXT[task])

try:
    config = LabConfig(task=task, positions=positions, seed=int(seed), offset=int(offset), **SIZES[size])
except HeadscopeError as error:
    st.error(messages.public_message(error))
    st.stop()

runner: LabRunner | None = st.session_state.get(RUNNER)
untouched = runner is not None and runner.status == "new"
if runner is None or (untouched and (runner.config != config or runner.total_steps != total_steps)):
    runner = st.session_state[RUNNER] = LabRunner(
        config, total_steps, lab_slots(), presence=session.presence(), admit=compute.lab_admission(config)
    )
settings_differ = runner.config != config or runner.total_steps != total_steps


def start() -> None:
    st.session_state[RUNNER].start()


def pause() -> None:
    st.session_state[RUNNER].pause()
    st.session_state[RUNNER].join(timeout=5)


def reset() -> None:
    old = st.session_state.pop(RUNNER, None)
    if old is not None:
        old.stop()


buttons = st.columns([1, 1, 1, 4])
finished = runner.lab.step >= runner.total_steps
buttons[0].button(
    "Resume" if runner.status in ("paused", "stopped") else "Start",
    on_click=start,
    disabled=runner.running or finished,
    type="primary",
    key="lab_start",
)
buttons[1].button("Pause", on_click=pause, disabled=not runner.running, key="lab_pause")
buttons[2].button("Reset", on_click=reset, disabled=runner.running, key="lab_reset")
if settings_differ:
    buttons[3].caption("The settings above changed: press **Reset** to train a new model with them.")
if runner.message:
    st.warning(messages.md_escape(runner.message))
messages.explain(WATCH_FOR[runner.config.task])


@st.fragment(run_every=POLL_S if runner.running else None)
def live_view(was_running: bool) -> None:
    snapshot = runner.snapshot()
    if was_running and snapshot.status != "running":
        st.rerun(scope="app")  # training ended: redraw the buttons and stop polling
    status = {
        "new": "Not started.",
        "running": "Training...",
        "paused": "Paused.",
        "done": "Finished.",
        "stopped": "Stopped: the page was closed.",
        "failed": "Training failed.",
    }[snapshot.status]
    st.progress(
        snapshot.step / snapshot.total_steps,
        text=f"{status} Step {snapshot.step} of {snapshot.total_steps}, {runner.lab.seconds:.1f} s of training."
        + (f" {snapshot.waiting}" if snapshot.waiting else ""),
    )
    if snapshot.history.empty:
        st.caption("The curves appear here as soon as training starts.")
        return
    config = runner.config
    charts.show_chart(
        lab_figures.loss_curve(
            snapshot.history,
            snapshot.phase_step if config.task == "induction" else None,
            title="Loss: all positions, and the repeated positions only the circuit can predict"
            if config.task == "induction"
            else "Loss while training",
        ),
        key="lab_loss",
        filename="headscope-lab-loss",
    )
    roles = task_roles(config)
    for column, role in zip(st.columns(len(roles)), roles):
        with column:
            charts.show_chart(
                lab_figures.score_curves(snapshot.history, role, threshold=ROLE_THRESHOLD),
                key=f"lab_scores_{role}",
                filename=f"headscope-lab-{role}",
            )
    st.dataframe(appearance_table(snapshot.appearance, ROLE_THRESHOLD), hide_index=True, key="lab_appearance")
    if snapshot.attention is not None:
        charts.show_chart(
            figures.model_grid(
                snapshot.attention,
                snapshot.tokens,
                causal=True,
                title=f"Every head on one fixed example (step {snapshot.history['step'].max()}); tokens are numbers",
            ),
            key="lab_attention",
            filename="headscope-lab-attention",
        )


live_view(runner.running)

if runner.lab.records and not runner.running:
    st.subheader("Switch a head off")
    st.markdown(
        "Zero one head's output (its slice of the Concat before W^O) and measure the loss again on the same "
        "sequences. If the loss on the repeated positions jumps, that head was doing the work."
    )
    scores = runner.lab.scores()
    last_role = task_roles(runner.config)[-1]
    best = scores.sort_values(last_role, kind="stable").iloc[-1]
    left, right = st.columns(2)
    layer = pickers.url_number(
        left.number_input,
        "Layer",
        0,
        runner.config.num_layers - 1,
        key=f"lab_ablate_layer_{runner.config.task}",
        url_key="off_layer",
        default=int(best["layer"]),
    )
    head = pickers.url_number(
        right.number_input,
        "Head",
        0,
        runner.config.num_heads - 1,
        key=f"lab_ablate_head_{runner.config.task}",
        url_key="off_head",
        default=int(best["head"]),
    )
    result = runner.lab.ablation(int(layer), int(head))
    label = "Loss on the repeated positions" if runner.config.task == "induction" else "Loss"
    key = "repeated_loss" if runner.config.task == "induction" else "loss"
    columns = st.columns(2)
    columns[0].metric(f"{label}, every head on", f"{result[key]:.3f}")
    columns[1].metric(
        f"{label}, layer {int(layer)} head {int(head)} off",
        f"{result['ablated_' + key]:.3f}",
        delta=f"{result['ablated_' + key] - result[key]:+.3f}",
        delta_color="inverse",
    )
    if st.button("Open this model in Explore", key="lab_open_explore", icon=":material/grid_view:"):
        compute.open_lab_in_explore(runner.lab)
        st.switch_page(st.Page(Path(__file__).with_name("explore.py"), url_path="explore"))
    st.caption(
        "Explore then shows this model's heads on the fixed example, with its head view, lines and downloads. "
        "The model lives in this session only; `python -m mha_core lab --save lab.pt` keeps a checkpoint "
        "that `mha_core.Lab.load` reopens."
    )
