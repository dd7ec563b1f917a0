"""The app's "Download as HTML" of a head table's maps (ui/widgets/downloads.py): the saved view's own words in the
session's language (the library's view is English unless told), the table's own text as it is."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pandas as pd

from mha_core.views import tables
from ui.i18n import catalog
from ui.widgets.downloads import table_view_language, table_view_page

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
    assert table_view_language("en") == {}
    data, lang, title, heading = page_parts(table_view_page(TABLE, "score").decode("utf-8"))
    assert lang == "en" and data["strings"] == {}
    assert title == heading == f"2 layers x 3 heads: {len(TABLE)} rows"
    assert data["details"][0][-1] == "... and 3 more rows"
