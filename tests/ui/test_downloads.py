"""Download file names say what the file holds: model, engine, text, layer and head. The "Download as HTML" of a head
table's maps says the view's own words in the session's language (the library's view is English unless told), the
table's own text as it is."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pandas as pd

from mha_core.run import AttentionRun
from mha_core.views import tables
from ui.i18n import catalog
from ui.widgets.downloads import download_name, model_slug, slug, table_view_page, view_language


def run_of(model_name: str, text: str, engine: str = "transformers", text_pair: str | None = None) -> AttentionRun:
    n = 3
    return AttentionRun(
        model_name=model_name,
        family="bert",
        is_causal=False,
        tokens=["[CLS]", "x", "[SEP]"],
        attentions=np.full((1, 1, n, n), 1 / n, dtype=np.float32),
        special_mask=np.array([True, False, True]),
        word_ids=np.array([-1, 0, -1]),
        words=["x"],
        segment_ids=np.zeros(n, dtype=np.int64),
        engine=engine,
        text=text,
        text_pair=text_pair,
    )


def test_slug_keeps_words_cut_at_a_word_boundary():
    assert slug("The cat sat on the mat because it was tired.") == "the-cat-sat-on-the-mat-because-it-was"
    assert len("the-cat-sat-on-the-mat-because-it-was") <= 40 < len("the-cat-sat-on-the-mat-because-it-was-tired")
    assert slug("Crème brûlée, s'il vous plaît!") == "creme-brulee-s-il-vous-plait"
    assert slug("../../etc/passwd <b>x</b>") == "etc-passwd-b-x-b"
    assert slug("猫坐在垫子上") == ""
    assert slug("x" * 100) == "x" * 40  # one long word is cut, not dropped


def test_download_names_say_model_text_layer_and_head():
    text = "The cat sat on the mat because it was tired."
    run = run_of("minilm", text)
    assert download_name(run, ".npz") == "headscope-minilm-the-cat-sat-on-the-mat-because-it-was.npz"
    assert (
        download_name(run, ".csv", layer=5, head=11)
        == "headscope-minilm-the-cat-sat-on-the-mat-because-it-was-layer5-head11.csv"
    )
    # Another model, another text, another engine: another name.
    assert download_name(run_of("smollm2", "A dog barked."), ".npz") == "headscope-smollm2-a-dog-barked.npz"
    assert download_name(run_of("minilm", text, engine="core"), ".npz").startswith("headscope-minilm-core-the-cat-")
    assert download_name(run.to_words(), ".npz").startswith("headscope-minilm-words-the-cat-")
    assert download_name(run.without_special(), ".npz").startswith("headscope-minilm-no-special-the-cat-")
    # A sentence pair: both texts in the name (as far as it goes).
    assert download_name(run_of("minilm", "Where?", text_pair="Here."), ".npz") == "headscope-minilm-where-here.npz"
    # A folder is named by its last part, never the whole server path; text without Latin letters by a digest.
    folder = run_of("/srv/models/bert-base-uncased/", "猫坐在垫子上")
    name = download_name(folder, ".npz")
    assert (
        name.startswith("headscope-bert-base-uncased-text-")
        and len(name) == len("headscope-bert-base-uncased-text-") + 8 + 4
    )
    assert name != download_name(run_of("/srv/models/bert-base-uncased", "狗"), ".npz")
    assert model_slug("C:\\models\\My Model") == "my-model" and model_slug("///") == "model"


def test_the_view_download_is_the_head_view_as_one_page():
    import json
    import re

    from mha_core.views import heads
    from ui.widgets.downloads import view_page

    run = run_of("minilm", "x y")
    page = view_page(run, 0, 0).decode("utf-8")
    data = json.loads(re.search(r'id="hs-data">(.*?)</script>', page, flags=re.DOTALL).group(1))
    assert data["tokens"] == run.tokens and (data["layer"], data["head"], data["view"]) == (0, 0, "head")
    np.testing.assert_allclose(heads.unpack(data)[0], run.attentions[0], atol=0.5 / 255 + 1e-6, rtol=0)
    assert download_name(run, ".html", layer=0, head=0) == "headscope-minilm-x-y-layer0-head0.html"


ROWS = tables.DETAIL_ROWS + 3  # head (0, 0) has more rows than the view lists: its "more rows" line shows
TABLE = pd.DataFrame(
    {
        "layer": [0] * ROWS + [1, 1],
        "head": [0] * ROWS + [1, 2],
        "score": [*np.linspace(-0.5, 0.5, ROWS), 0.25, 0.75],
        "role": ["local"] * ROWS + ["sink", "previous"],
    }
)
LATIN_WORD = re.compile(r"[A-Za-z]{2,}")


def page_parts(page: str) -> tuple[dict, str, str, str]:
    """(the view's data as its script reads it, the page's <html lang>, its <title>, its heading)."""
    (data,) = re.findall(r'<script type="application/json" id="hs-data">(.*?)</script>', page, flags=re.DOTALL)
    (lang,) = re.findall(r'<html lang="([^"]*)">', page)
    (title,) = re.findall(r"<title>(.*?)</title>", page)
    (heading,) = re.findall(r"<h1[^>]*>(.*?)</h1>", page)
    return json.loads(data), lang, html.unescape(title), html.unescape(heading)


def test_a_chinese_download_of_a_table_view_says_its_own_words_in_chinese():
    data, lang, title, heading = page_parts(table_view_page(TABLE, "score", "zh").decode("utf-8"))
    zh = catalog("zh")
    assert lang == "zh-CN"
    assert title == heading == f"2 层 x 3 个头：{len(TABLE)} 行"
    # Every word the view's script shows is sent in Chinese, and none of them is left English.
    assert data["strings"] == {text: zh[text] for text in tables.VIEW_TEXTS}
    assert [text for text in data["strings"].values() if LATIN_WORD.search(re.sub(r"\{\w+\}", "", text))] == []
    # What the packing writes itself: the line after a head's first rows; the table's rows stay its own text.
    lines = data["details"][0]
    assert lines[-1] == "……还有 3 行" and lines[0] == "score -0.5, role local"
    assert data["details"][1 * 3 + 2] == ["score 0.75, role previous"]


def test_a_composition_download_names_its_pairs_in_chinese():
    pairs = pd.DataFrame(
        {
            "sender_layer": [0, 0],
            "sender_head": [1, 0],
            "receiver_layer": [1, 1],
            "receiver_head": [0, 0],
            "q": [0.2, 0.9],
        }
    )
    _, _, title, _ = page_parts(table_view_page(pairs, None, "zh").decode("utf-8"))
    assert title == "2 对头：每个接收头最强的发送头（q）"


def test_the_default_stays_english():
    assert view_language("en", tables.VIEW_TEXTS) == {}
    data, lang, title, heading = page_parts(table_view_page(TABLE, "score").decode("utf-8"))
    assert lang == "en" and data["strings"] == {}
    assert title == heading == f"2 layers x 3 heads: {len(TABLE)} rows"
    assert data["details"][0][-1] == "... and 3 more rows"


def test_a_chinese_download_of_the_head_view_sends_its_script_its_chinese_words():
    """The head view's file of a Chinese session: every word its script translates (``ui.headview.VIEW_TEXTS``) sent
    in Chinese, the page Chinese (``<html lang>``); English: none sent, the script's own words."""
    from ui.headview import VIEW_TEXTS
    from ui.widgets.downloads import view_page

    run = run_of("minilm", "x y")
    data, lang, title, heading = page_parts(view_page(run, 0, 0, "zh").decode("utf-8"))
    zh = catalog("zh")
    assert lang == "zh-CN" and data["strings"] == {text: zh[text] for text in VIEW_TEXTS}
    assert title == heading == f'minilm： "x y"（{len(run.tokens)} 个 token）'  # the page's title in Chinese too
    assert data["strings"]["Head view"] == "头视图" and data["tokens"] == run.tokens  # the tokens stay the text's
    english, lang, title, _ = page_parts(view_page(run, 0, 0).decode("utf-8"))
    assert lang == "en" and "strings" not in english and title == f'minilm: "x y" ({len(run.tokens)} tokens)'


def test_a_chinese_download_of_the_long_view_sends_its_script_its_chinese_words():
    """The long view's file of a Chinese session: every word its script translates (``ui.longview.VIEW_TEXTS``) sent
    in Chinese with the view's data as shown, the page Chinese; English: none sent, the data unchanged."""
    from ui.longview import VIEW_TEXTS
    from ui.widgets.downloads import long_view_page

    shown = {"layer": 1, "head": 2, "n": 40, "region": [0, 40, 0, 40], "reduce": "max"}
    data, lang, title, _ = page_parts(long_view_page(shown, "m: 40 tokens (long document)", "zh").decode("utf-8"))
    zh = catalog("zh")
    assert lang == "zh-CN" and data["strings"] == {text: zh[text] for text in VIEW_TEXTS}
    assert data["strings"]["Zoom out"] == "缩小" and data["strings"]["max"] == "最大值"
    assert {key: data[key] for key in shown} == shown and title == "m: 40 tokens (long document)"
    english, lang, _, _ = page_parts(long_view_page(shown, "m", "en").decode("utf-8"))
    assert lang == "en" and english == shown
