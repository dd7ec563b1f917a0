"""Lab: train a tiny transformer in the browser and watch its heads specialise."""

from pathlib import Path

import streamlit as st

from mha_core.errors import HeadscopeError
from mha_core.lab import ROLE_THRESHOLD, task_roles
from ui import computations, figures, shell
from ui import page_lab as lab_page
from ui.figures import lab as lab_figures
from ui.i18n import t
from ui.lab_runner import appearance_table, role_name
from ui.page_lab import LabSettings
from ui.widgets import charts, messages

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

POLL_S = 1.0  # how often the live view redraws while training
S = LabSettings.declarations()

st.title(t("Lab: watch heads being born"))
st.markdown(
    t(
        "Here a tiny transformer, built from the same from-scratch multi-head attention as the rest of "
        "Headscope, learns a task while you watch. Its heads start out spreading attention evenly; training "
        "turns some of them into specialists. Pick a task and a size, press **Start**, and keep this page open."
    )
)

left, middle, right = st.columns(3)
task = S["task"].select(left.selectbox)
S["size"].select(middle.selectbox)
total_steps = S["steps"].select(right.select_slider)
left, middle, right = st.columns(3)
S["positions"].select(left.selectbox)
S["seed"].number(middle.number_input, step=1)
S["offset"].number(right.number_input, step=1, disabled=task != "positional")
st.markdown(t(lab_page.TASK_TEXT[task]))

chosen = LabSettings.from_session()
try:
    config = lab_page.lab_config(chosen)
except HeadscopeError as error:
    st.error(messages.public_message(error))
    st.stop()

runner = lab_page.runner_for(config, int(total_steps))
settings_differ = runner.config != config or runner.total_steps != total_steps

buttons = st.columns([1, 1, 1, 4])
finished = runner.lab.step >= runner.total_steps
buttons[0].button(
    t("Resume") if runner.status in ("paused", "stopped") else t("Start"),
    on_click=lab_page.start,
    disabled=runner.running or finished,
    type="primary",
    key="lab_start",
)
buttons[1].button(t("Pause"), on_click=lab_page.pause, disabled=not runner.running, key="lab_pause")
buttons[2].button(t("Reset"), on_click=lab_page.reset, disabled=runner.running, key="lab_reset")
if settings_differ:
    buttons[3].caption(t("The settings above changed: press **Reset** to train a new model with them."))
if runner.message:
    st.warning(t("Training failed: {error}", error=messages.md_escape(runner.message)))
messages.explain(lab_page.WATCH_FOR[runner.config.task])


@st.fragment(run_every=POLL_S if runner.running else None)
def live_view(was_running: bool) -> None:
    snapshot = runner.snapshot()
    if was_running and snapshot.status != "running":
        st.rerun(scope="app")  # training ended: redraw the buttons and stop polling
    status = {
        "new": t("Not started."),
        "running": t("Training..."),
        "paused": t("Paused."),
        "done": t("Finished."),
        "stopped": t("Stopped: the page was closed."),
        "failed": t("Training failed."),
    }[snapshot.status]
    st.progress(
        snapshot.step / snapshot.total_steps,
        text=t(
            "{status} Step {step} of {total}, {seconds} s of training.",
            status=status,
            step=snapshot.step,
            total=snapshot.total_steps,
            seconds=f"{runner.lab.seconds:.1f}",
        )
        + (f" {snapshot.waiting}" if snapshot.waiting else ""),  # the queue's words: ui.budget.queue_message
    )
    if snapshot.history.empty:
        st.caption(t("The curves appear here as soon as training starts."))
        return
    config = runner.config
    charts.show_chart(
        lab_figures.loss_curve(
            snapshot.history,
            snapshot.phase_step if config.task == "induction" else None,
            title=t("Loss: all positions, and the repeated positions only the circuit can predict")
            if config.task == "induction"
            else t("Loss while training"),
            phase_text=t("phase change (step {step})", step="{step}"),
        ),
        key="lab_loss",
        filename="headscope-lab-loss",
    )
    roles = task_roles(config)
    for column, role in zip(st.columns(len(roles)), roles):
        with column:
            charts.show_chart(
                lab_figures.score_curves(
                    snapshot.history,
                    role,
                    threshold=ROLE_THRESHOLD,
                    title=t("{role} score of every head", role=role_name(role, t)),
                    axis_title=t("{role} score", role=role_name(role, t)),
                ),
                key=f"lab_scores_{role}",
                filename=f"headscope-lab-{role}",
            )
    st.dataframe(appearance_table(snapshot.appearance, ROLE_THRESHOLD, t), hide_index=True, key="lab_appearance")
    if snapshot.attention is not None:
        charts.show_chart(
            figures.model_grid(
                snapshot.attention,
                snapshot.tokens,
                causal=True,
                title=t(
                    "Every head on one fixed example (step {step}); tokens are numbers",
                    step=snapshot.history["step"].max(),
                ),
            ),
            key="lab_attention",
            filename="headscope-lab-attention",
        )


live_view(runner.running)

if runner.lab.records and not runner.running:
    st.subheader(t("Switch a head off"))
    st.markdown(
        t(
            "Zero one head's output (its slice of the Concat before W^O) and measure the loss again on the same "
            "sequences. If the loss on the repeated positions jumps, that head was doing the work."
        )
    )
    scores = runner.lab.scores()
    last_role = task_roles(runner.config)[-1]
    best = scores.sort_values(last_role, kind="stable").iloc[-1]
    left, right = st.columns(2)
    layer = (
        S["off_layer"]
        .keyed(task=runner.config.task)
        .number(left.number_input, maximum=runner.config.num_layers - 1, default=int(best["layer"]))
    )
    head = (
        S["off_head"]
        .keyed(task=runner.config.task)
        .number(right.number_input, maximum=runner.config.num_heads - 1, default=int(best["head"]))
    )
    result = computations.lab_ablation(runner.lab, int(layer), int(head))
    repeated = runner.config.task == "induction"
    key = "repeated_loss" if repeated else "loss"
    columns = st.columns(2)
    columns[0].metric(
        t("Loss on the repeated positions, every head on") if repeated else t("Loss, every head on"),
        f"{result[key]:.3f}",
    )
    columns[1].metric(
        t("Loss on the repeated positions, layer {layer} head {head} off", layer=int(layer), head=int(head))
        if repeated
        else t("Loss, layer {layer} head {head} off", layer=int(layer), head=int(head)),
        f"{result['ablated_' + key]:.3f}",
        delta=f"{result['ablated_' + key] - result[key]:+.3f}",
        delta_color="inverse",
    )
    if st.button(t("Open this model in Explore"), key="lab_open_explore", icon=":material/grid_view:"):
        computations.open_lab_in_explore(runner.lab)
        st.switch_page(st.Page(Path(__file__).with_name("explore.py"), url_path="explore"))
    st.caption(
        t(
            "Explore then shows this model's heads on the fixed example, with its head view, lines and downloads. "
            "The model lives in this session only; `python -m mha_core lab --save lab.pt` keeps a checkpoint "
            "that `mha_core.Lab.load` reopens."
        )
    )
