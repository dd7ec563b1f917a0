"""Chinese on screen (``lang=zh``) under AppTest: every text a page shows (text elements, expanders' labels,
widgets' labels, help and choices, the figures' words (their hover templates' too), the word columns of tables), and the Latin words among them
that are not allowed English. One check for every page's Chinese test (tests/pages/test_page_*_zh.py)."""

from __future__ import annotations

import re

from tests.page_helpers import plotly_elements

TEXT_KINDS = ("title", "header", "subheader", "markdown", "caption", "info", "warning", "error", "success")
WIDGET_KINDS = (
    "radio", "selectbox", "toggle", "button", "slider", "select_slider", "number_input", "text_input",
    "segmented_control", "multiselect", "checkbox",
)  # fmt: skip
# What stays in Latin letters in the Chinese interface: names, symbols and the terms the course notes
# (/work/shared/seeds) themselves write in Latin letters (token, softmax, d_model, d_k, Concat, ...).
ALLOWED = {
    "headscope", "transformer", "transformers", "token", "softmax", "d_model", "d_k", "sqrt", "inf", "masked",
    "one", "hot", "logits", "smollm", "gpt", "minilm", "spearman", "rollout", "batch", "reshape", "query", "key",
    "value", "multiheadattention", "bos", "csv", "cookie", "english", "language", "concat", "jain", "wallace",
    "wiegreffe", "pinter", "docs", "findings", "md", "hugging", "face", "hub", "attention", "sink", "weights",
    "multihead", "logit", "sat", "cat", "the", "down", "mpnet", "all", "base",
    "log", "exp",
    "scores",  # the tutorial's own variable, quoted in its formula (scores1 = Q1 @ K1^T / sqrt(d_k))
    # Names: authors and methods cited, a corpus, tools and formats.
    "clark", "bertviz", "deyoung", "wu", "wilson", "streamingllm", "holm", "jensen", "shannon", "web", "treebank",
    "npz", "html", "mha_core", "core", "max", "round", "bert", "llama", "mlp",
    "attentionviz", "kendall", "seeds",
    "top",  # top-k, top-p: written so in Chinese texts too
    "sin", "cos", "pos", "rope",  # a formula's symbols, rotary position embedding's name
    "elhage", "wang", "kovaleva", "vig", "belinkov", "abnar", "zuidema", "kobayashi", "voita", "michel", "yeh",
}  # fmt: skip
ICON = re.compile(r":material/[a-z_]+:")
TABLE_WORDS = ("step", "kind", "quantity", "note")  # the tables' columns of words (the others: formulas, numbers)
CODE = re.compile(r"`[^`]*`")
QUOTED_TOKEN = re.compile(r"'[^'\n]*'")  # a model's token as the decoder lesson shows it (its repr)
WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
TAG = re.compile(r"<br>")  # a figure's line break
# A hover template's markup: Plotly's fields (%{x}, %{customdata[0]:.3f}), its secondary box (<extra>...</extra>:
# a trace's own label, kept as it is) and tags; what is left are its words.
HOVER_MARKUP = re.compile(r"%\{[^}]*\}|<extra>.*?</extra>|<[^>]*>", re.DOTALL)


def hover_texts(trace: dict) -> list[str]:
    """The words of a trace's hover template(s) (one, or one per point), its markup removed."""
    template = trace.get("hovertemplate") or []
    return [HOVER_MARKUP.sub(" ", one) for one in ([template] if isinstance(template, str) else template)]


def visible_texts(app) -> list[str]:
    """Every text the screen shows: elements of text, expanders' labels, widgets' labels, help and choices."""
    texts = [str(element.value) for kind in TEXT_KINDS for element in app.get(kind)]
    texts += [element.label for element in app.expander]
    for kind in WIDGET_KINDS:
        for element in app.get(kind):
            texts += [element.label, getattr(element, "help", None) or ""]
            texts += [str(option) for option in (getattr(element, "options", None) or [])]
    for spec in plotly_elements(app).values():  # the figures' words: titles, subplot and axis titles, trace names
        layout = spec.get("layout", {})
        texts.append(str(layout.get("title", {}).get("text", "")))
        texts += [str(annotation.get("text", "")) for annotation in layout.get("annotations", [])]
        texts += [str(axis.get("title", {}).get("text", "")) for name, axis in layout.items() if name[1:5] == "axis"]
        texts += [str(trace.get("name", "")) for trace in spec.get("data", []) if trace.get("showlegend") is not False]
        texts += [text for trace in spec.get("data", []) for text in hover_texts(trace)]  # what a hover shows
    for frame in app.dataframe:  # the tables' words (their formulas and numbers stay as they are)
        data = frame.value
        texts += [str(cell) for column in TABLE_WORDS if column in data.columns for cell in data[column]]
    return [text for text in texts if text]


TOKEN_CHOICE = re.compile(r"\d+: .*")  # a token picked by its position ("4: on", "12: ▸As  (8%)"): the text's own


def english_words(texts: list[str], sentences=()) -> list[str]:
    """The Latin words of ``texts`` that are not allowed English (example sentences and tokens removed first)."""
    found = []
    for text in texts:
        if TOKEN_CHOICE.fullmatch(text):
            continue
        text = TAG.sub(" ", QUOTED_TOKEN.sub("", CODE.sub("", ICON.sub("", text))))
        for sentence in sentences:  # whole words only ("cat" is not in "Concat")
            text = re.sub(rf"(?<![A-Za-z]){re.escape(sentence)}(?![A-Za-z])", "", text)
        words = WORD.findall(text)  # a word with a digit or an underscore is a symbol: d_model, head_1, W_1, scores1
        found += [w for w in words if len(w) > 1 and w.isalpha() and w.lower() not in ALLOWED and not w.isupper()]
    return found


def untranslated_on_screen(app, sentences=()) -> list[str]:
    """The untranslated English words of everything ``app`` shows (``sentences``: English on purpose, removed)."""
    return english_words(visible_texts(app), sentences=sentences)
