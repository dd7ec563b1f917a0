"""The interface's catalog (ui/i18n.py, ui/locales/zh.json): every entry has both languages and the same
{fields}; translation falls back to English, fills fields after translating; and every text the translated files
hand to Streamlit goes through ``t()`` with an entry in the catalog (checked on their syntax trees)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ui import i18n

ROOT = Path(__file__).resolve().parents[2]
CJK = re.compile(r"[\u4e00-\u9fff]")
LATIN_WORD = re.compile(r"[A-Za-z]{2,}")

# The files translated whole: every text they give Streamlit goes through t() (README: which pages are translated).
TRANSLATED_FILES = [
    "app.py",
    "ui/widgets/sidebar.py",
    "ui/widgets/messages.py",
    "ui/follow.py",
    "pages/classroom.py",
    "ui/page_classroom.py",
    "ui/class_questions.py",
    "ui/decoder_lesson.py",
    "pages/explore.py",
    "ui/widgets/views.py",
    "ui/widgets/pickers.py",
    "ui/widgets/predict.py",
    "ui/widgets/decomposition.py",
    "ui/widgets/downloads.py",
    "ui/longdoc.py",
    "ui/attribution_view.py",
    "ui/encoder_decoder.py",
    "pages/compare.py",
    "pages/circuits.py",
    "ui/heads_circuits.py",
    "pages/positions.py",
    "pages/lab.py",
    "pages/deeper.py",
    "pages/roles.py",
    "ui/page_roles.py",
    "ui/widgets/joint_qk.py",
    "pages/ablate.py",
    "ui/page_ablate.py",
    "pages/heads.py",
    "ui/heads_page.py",
    "ui/page_heads.py",
]
# Streamlit calls that draw text, and the keywords that carry text (st.latex, st.code, st.html are not text to read).
DRAWS_TEXT = {
    "title", "header", "subheader", "markdown", "caption", "write", "text", "info", "warning", "error", "success",
    "toast", "button", "toggle", "checkbox", "radio", "selectbox", "multiselect", "slider", "select_slider",
    "number_input", "text_input", "text_area", "segmented_control", "expander", "tabs", "progress", "page_link",
    "download_button", "popover", "metric", "image", "status", "spinner", "form_submit_button",
}  # fmt: skip
TEXT_KEYWORDS = {"label", "help", "placeholder", "caption", "text", "body"}
ICON = re.compile(r":material/[a-z_]+:")
LOGGERS = {"LOG", "logging", "logger"}  # the server log stays English


def catalog_items():
    return sorted(i18n.catalog("zh").items())


def test_every_entry_has_both_languages_and_the_same_fields():
    entries = catalog_items()
    assert len(entries) > 40
    for english, chinese in entries:
        assert english.strip() and chinese.strip(), english
        assert CJK.search(chinese) or not LATIN_WORD.search(english), (english, chinese)  # Chinese, unless a name
        assert i18n.fields(english) == i18n.fields(chinese), english


def test_translate_looks_up_then_fills_the_fields():
    assert i18n.translate("Model", "zh") == "模型"
    assert i18n.translate("Model", "en") == "Model"
    assert i18n.translate("Not in the catalog", "zh") == "Not in the catalog"  # English where there is no entry
    shown = i18n.translate("Still showing {model}.", "zh", model="{Model}")
    assert shown == "仍在显示 {Model}。"  # a value is filled in, never looked up or formatted again
    assert i18n.translate(r"\frac{a}{b}", "zh") == r"\frac{a}{b}"  # no values: braces stay
    with pytest.raises(ValueError, match="unknown language"):
        i18n.translate("Model", "fr")


def literal_parts(node) -> list[str]:
    """The string literals of an expression that are not inside a ``t(...)`` call (f-strings' constant parts too)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "t":
        return []
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        return [part for value in node.values for part in literal_parts(value)]
    if isinstance(node, ast.FormattedValue):
        return literal_parts(node.value)
    if isinstance(node, ast.BinOp):
        return literal_parts(node.left) + literal_parts(node.right)
    if isinstance(node, ast.IfExp):
        return literal_parts(node.body) + literal_parts(node.orelse)
    if isinstance(node, ast.Dict):  # a text picked from a dict of texts
        return [part for value in node.values for part in literal_parts(value)]
    if isinstance(node, ast.Subscript):
        return literal_parts(node.value)
    return []  # a value computed elsewhere (a name, a call): not a literal here


def untranslated(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in DRAWS_TEXT or getattr(node.func.value, "id", "") in LOGGERS:
            continue
        texts = node.args[:1] + [k.value for k in node.keywords if k.arg in TEXT_KEYWORDS]
        for text in texts:
            for part in literal_parts(text):
                if LATIN_WORD.search(ICON.sub("", part)):
                    found.append(f"{path.name}:{node.lineno}: {part[:60]!r}")
    return found


def translated_keys(path: Path) -> list[tuple[int, str]]:
    """The literal texts a file gives ``t()`` (and ``explain()``, which translates its text)."""
    keys = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name in {"t", "explain"} and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            keys.append((node.lineno, node.args[0].value))
    return keys


@pytest.mark.parametrize("name", TRANSLATED_FILES)
def test_every_text_given_to_streamlit_goes_through_the_catalog(name):
    path = ROOT / name
    assert untranslated(path) == []
    catalog = i18n.catalog("zh")
    missing = [f"{name}:{line}: {key[:60]!r}" for line, key in translated_keys(path) if key not in catalog]
    assert missing == []


def test_the_check_finds_a_literal_given_to_streamlit(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "st.header('Input')\nst.caption(f':material/info: {x} tokens')\nst.toggle(t('Model'), help='Help text')\n"
        "st.info(t('Model') + ' more')\nst.markdown(':material/info:')\nst.latex('x_{i}')\nLOG.warning('a log')\n"
    )
    assert [line.split(":")[1] for line in untranslated(bad)] == ["1", "2", "3", "4"]
    assert translated_keys(bad) == [(3, "Model"), (4, "Model")]


def test_a_text_is_named_by_its_english_in_either_language(monkeypatch):
    """A class question's identity (``Text.english``) is the same on an English and a Chinese screen; what each
    screen shows is its own language, nested texts too."""
    question = i18n.text("In head {h}, which key will **{token}** score highest?", h=2, token="sat")
    steps = i18n.text("{first} and {second}", first="**a**", second=i18n.text("More"))
    shown = {}
    for lang in ("en", "zh"):
        monkeypatch.setattr(i18n, "language", lambda lang=lang: lang)
        assert question.english() == "In head 2, which key will **sat** score highest?"
        assert steps.english() == "**a** and More"
        shown[lang] = (str(question), str(steps), str(i18n.joined(["Partly", i18n.text("Partly")], "; ")))
    assert shown["en"] == (question.english(), steps.english(), "Partly; Partly")
    assert shown["zh"] == ("在头 2 中，**sat** 给哪个键的分数最高？", "**a** 和 多于一半", "Partly; 部分是")


def test_the_server_serves_a_chinese_link_as_chinese():
    from ui.server import BASE_URL_SCRIPT, asks_chinese, with_base_url

    html = b'<!doctype html><html lang="en"><head><title>x</title></head></html>'
    assert with_base_url(html, chinese=True).startswith(b'<!doctype html><html lang="zh-CN"><head>' + BASE_URL_SCRIPT)
    assert b'<html lang="en">' in with_base_url(html)
    assert asks_chinese({"query_string": b"page=classroom&lang=zh"})
    assert not asks_chinese({"query_string": b"lang=zhx"}) and not asks_chinese({"query_string": b"lang=en"})
    assert not asks_chinese({})


def constant(path: Path, name: str):
    """A module-level constant of a file, read from its syntax tree (app.py cannot be imported outside a run)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def test_the_texts_kept_in_constants_and_the_classrooms_settings_are_in_the_catalog():
    """What the translated files hand t() by name (a constant, a declaration's words) has its entry: an English
    text edited without its translation shows in English, and this fails."""
    from mha_core import walkthrough
    from ui import class_questions, page_classroom
    from ui.figures import teaching
    from ui.page_classroom import ClassroomSettings
    from ui.settings import ENGINE_LABELS
    from ui.widgets import messages, sidebar

    texts = [
        messages.INTRO,
        messages.FIRST_TEN_MINUTES,
        constant(ROOT / "app.py", "PAGE_GUIDE"),
        *page_titles(),
        sidebar.EMPTY_TEXT_NOTICE,
        sidebar.SENTENCE_LABEL,
        ENGINE_LABELS["core"],
        walkthrough.CHOSEN_MATRICES_REASON,
        *class_questions.MESSAGES.values(),
        class_questions.NO_IDENTITY_NOTE,
        class_questions.BUSY_NOTE,
        *teaching.SCORE_LABELS.values(),
        *(title for title in page_classroom_step_titles()),
    ]
    for declared in ClassroomSettings.declarations().values():
        texts += [declared.label, declared.help or ""]
        texts += [words for words in (declared.options or {}).values() if isinstance(words, str)]
    texts += [page_classroom.CLASS_SENTENCE]  # an example sentence: stays English, no entry wanted
    catalog = i18n.catalog("zh")
    wanted = [text for text in texts if LATIN_WORD.search(text) and text not in NOT_TRANSLATED]
    assert [text[:60] for text in wanted if text not in catalog] == []


def test_the_lab_deeper_and_head_view_texts_kept_in_constants_are_in_the_catalog():
    """The Lab's and Deeper's settings and texts held in constants, the Lab figures' fixed words and every word the
    head view's script is sent (``VIEW_TEXTS``: what a screen reader reads included) have their entries."""
    from ui import page_lab
    from ui.figures import lab as lab_figures
    from ui.headview import VIEW_TEXTS
    from ui.page_deeper import DeeperSettings
    from ui.page_lab import LabSettings

    texts = [*page_lab.TASK_TEXT.values(), *page_lab.WATCH_FOR.values(), *lab_figures.LOSS_LABELS.values()]
    from mha_core.views.tables import VIEW_TEXTS as TABLE_VIEW_TEXTS  # the saved table view's own words
    from ui.longview import VIEW_TEXTS as LONG_VIEW_TEXTS  # the long view's own words

    texts += ["training step", "cross-entropy (nats)", *VIEW_TEXTS, *TABLE_VIEW_TEXTS, *LONG_VIEW_TEXTS]
    for settings in (LabSettings, DeeperSettings):
        for declared in settings.declarations().values():
            texts += [declared.label, declared.help or ""]
            texts += [words for words in (declared.options or {}).values() if isinstance(words, str)]
    catalog = i18n.catalog("zh")
    wanted = [text for text in texts if LATIN_WORD.search(text)]
    assert [text[:60] for text in wanted if text not in catalog] == []


# English on purpose: example sentences and the decoder lesson's prompts (the models read English), names.
NOT_TRANSLATED = {
    "When Mary and John went to the store, John gave a drink to",
    "The cat sat on the",
    "The capital of France is",
    "Once upon a time, there was a",
    "d_model",
    "Q1",
    "K1",
    "V1",
}


def page_titles() -> list[str]:
    """The navigation's titles, from app.py's PAGES."""
    tree = ast.parse((ROOT / "app.py").read_text(encoding="utf-8"))
    pages = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PAGES")
    return [element.elts[1].value for element in pages.value.elts]


def page_classroom_step_titles() -> list[str]:
    """The Classroom's step titles, from pages/classroom.py's STEPS."""
    tree = ast.parse((ROOT / "pages" / "classroom.py").read_text(encoding="utf-8"))
    steps = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "STEPS")
    return [element.elts[0].value for element in steps.value.elts]


def test_a_figures_words_are_translated_in_chinese_only(monkeypatch):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    def figure():
        fig = make_subplots(rows=1, cols=2, subplot_titles=["head 1", "head 12"])
        fig.add_trace(go.Heatmap(z=[[1]], name="head 1"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[1], y=[1], name="scaled dot product"), row=1, col=2)
        fig.update_xaxes(title="d_k (dimensions per head)")
        fig.update_layout(title="Attention weights A_i = softmax(scores): each row sums to 1")
        return fig

    monkeypatch.setattr(i18n, "language", lambda: "en")
    english = figure()
    assert i18n.translate_figure(english).to_dict() == figure().to_dict()  # English: unchanged
    monkeypatch.setattr(i18n, "language", lambda: "zh")
    fig = i18n.translate_figure(figure())
    assert [a.text for a in fig.layout.annotations] == ["头 1", "头 12"]
    assert [trace.name for trace in fig.data] == ["头 1", "缩放点积"]
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "d_k（每个头的维数）"
    assert fig.layout.title.text == "注意力权重 A_i = softmax(scores)：每行之和为 1"
    assert i18n.shown("stage 3") == "stage 3" and i18n.shown("") == ""  # no entry: as it is
    assert i18n.shown("layer 3") == "层 3"
    # A title wrapped onto lines finds its words' entry; a heatmap's colour-bar title is translated too.
    assert i18n.shown("share of the text's<br>tokens removed") == "文本中被移除的 token 比例"
    scale = i18n.translate_figure(go.Figure(go.Heatmap(z=[[1]], colorbar=dict(title=dict(text="part of the score")))))
    assert scale.data[0].colorbar.title.text == "分数中的份额"


def test_a_hover_templates_words_are_translated_its_fields_and_tags_kept(monkeypatch):
    """``translate_hover``: the words between Plotly's fields and tags by their catalog entries; the fields (with
    their formats and indices), ``<br>``, ``<b>`` and the ``<extra>`` box (a trace's own label) stay as they are."""
    assert i18n.hover_words("layer %{x} head %{customdata}<br>weight %{z:.4f}<extra>PE[p+k]</extra>") == [
        "layer",
        "head",
        "weight",
    ]
    template = "<b>layer %{customdata[0]} head %{customdata[1]}</b><br>strongest: %{text}<extra>step one</extra>"
    assert i18n.translate_hover(template, "zh") == (
        "<b>层 %{customdata[0]} 头 %{customdata[1]}</b><br>最强: %{text}<extra>step one</extra>"
    )
    assert i18n.translate_hover("%{y} → %{x}: %{z:.3f}<extra></extra>", "zh") == "%{y} → %{x}: %{z:.3f}<extra></extra>"
    # Numbers written into the words stay; a run without an entry stays English (the page tests find it).
    assert i18n.translate_hover("layer 3 head 12<br>step %{x}", "zh") == "层 3 头 12<br>步骤 %{x}"
    assert i18n.translate_hover("no such words %{x}", "zh") == "no such words %{x}"
    # A text between fields with an entry of its own is translated whole (its parenthesis too).
    assert (
        i18n.translate_hover("step %{x}<br>loss (all positions) %{y:.3f}", "zh")
        == "步骤 %{x}<br>损失（所有位置） %{y:.3f}"
    )
    # One template per point: each translated; English: unchanged; not a text: as it is.
    assert i18n.translate_hover(["query %{text}", "key %{text}"], "zh") == ["查询 %{text}", "键 %{text}"]
    assert i18n.translate_hover("layer %{x}", "en") == "layer %{x}" and i18n.translate_hover(None, "zh") is None
    # translate_figure applies it to every trace's hover template, in Chinese only.
    import plotly.graph_objects as go

    def figure():
        return go.Figure(go.Scatter(x=[1], y=[2], hovertemplate="step %{x}<br>score %{y:.3f}<extra></extra>"))

    monkeypatch.setattr(i18n, "language", lambda: "en")
    assert i18n.translate_figure(figure()).data[0].hovertemplate == "step %{x}<br>score %{y:.3f}<extra></extra>"
    monkeypatch.setattr(i18n, "language", lambda: "zh")
    assert i18n.translate_figure(figure()).data[0].hovertemplate == "步骤 %{x}<br>分数 %{y:.3f}<extra></extra>"


def test_the_long_view_is_sent_every_word_its_script_translates_and_no_other():
    """Every text longview.js passes to its translator (``s.tr("...")``, a button's label and title, both sides of a
    choice inside ``s.tr``, a constant given to it) is one ``ui.longview.VIEW_TEXTS`` sends; every one sent is one of
    those (or the view kit's row template, or a pooling's name the script translates from its data)."""
    import re
    from pathlib import Path

    from ui.longview import VIEW_TEXTS

    script = (Path(__file__).resolve().parents[2] / "mha_core/views/assets/longview/longview.js").read_text("utf-8")
    quoted = r'"((?:[^"\\]|\\.)*)"'
    found = {m[1] for m in re.finditer(r"\btr\(\s*" + quoted, script)}
    found |= {m[1] for m in re.finditer(r"\btr\(\s*'([^']*)'", script)}
    for m in re.finditer(r"\bbutton\(\s*" + quoted + r",\s*" + quoted, script):
        found |= {m[1], m[2]}
    choice = r"[^()]*?\?\s*" + quoted + r"\s*:\s*" + quoted
    for m in re.finditer(r"\btr\(\s*" + choice, script):
        found |= {m[1], m[2]}
    for name in set(re.findall(r"\btr\((\w+)[,)]", script)):  # a constant or a variable given to it
        for m in re.finditer(rf"const {name} = (?:{choice}|{quoted});", script):
            found |= {text for text in m.groups() if text is not None}
    found = {text for text in found if not re.fullmatch(r"\\u[0-9a-f]{4}", text)}  # not the arrows' glyphs
    assert sorted(found - set(VIEW_TEXTS)) == []
    from_data = {'{noun} {i} "{token}" attends most to {tops}', "max", "mean"}  # ROW_WORDS; data.reduce's values
    assert sorted(set(VIEW_TEXTS) - found - from_data) == []


def test_the_long_documents_cut_notice_is_the_librarys_sentence_in_english_and_said_in_chinese(monkeypatch):
    """Explore's notice for a document cut to what the model reads: in English the library's own sentence
    (``metadata["cut"]``, from the same numbers), in Chinese the catalog's, with the numbers and the model's name."""
    from types import SimpleNamespace

    from mha_core.models.long import cut_notice
    from ui.longdoc import cut_words

    run = SimpleNamespace(num_input_tokens=1069, num_tokens=512, model_name="minilm", is_causal=False)
    monkeypatch.setattr(i18n, "language", lambda: "en")
    assert cut_words(run) == cut_notice(SimpleNamespace(name="minilm", is_causal=False), 1069, 512)
    monkeypatch.setattr(i18n, "language", lambda: "zh")
    assert (
        cut_words(run)
        == "这篇文档有 1,069 个 token；minilm 最多读 512 个（它学到的位置数），所以只读了它的前 512 个 token。"
    )
    decoder = SimpleNamespace(num_input_tokens=9000, num_tokens=8192, model_name="smollm2", is_causal=True)
    assert "最多读 8,192 个（它的上下文长度）" in cut_words(decoder)
