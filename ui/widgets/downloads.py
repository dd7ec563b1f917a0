"""Downloads of a run: the whole run as .npz, one head as CSV and the view as one self-contained HTML page (the head
and model views, offline: ``mha_core.views.standalone``), named by model, text, layer and head, built only when
clicked (``ui.computations.deferred``); a head table's maps (the Circuits page's) as such a page too
(``table_view_download``)."""

from __future__ import annotations

import hashlib
import io
import re
import unicodedata

import streamlit as st

from mha_core.views import standalone, tables
from ui import computations, headview, longview
from ui.i18n import HTML_LANG, language, t, translate

SLUG_CHARS = 40  # a file name's share of the text: about the first six words


def slug(text: str, limit: int = SLUG_CHARS) -> str:
    """``text`` as a short, safe piece of a file name: ASCII letters and digits joined by single dashes,
    cut at a word boundary within ``limit`` characters ("The cat sat." -> "the-cat-sat"); empty when the
    text has no such characters (a sentence in Chinese, say)."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", ascii_text.lower())
    kept = ""
    for word in words:
        candidate = f"{kept}-{word}" if kept else word
        if len(candidate) > limit:
            break
        kept = candidate
    return kept or (words[0][:limit] if words else "")


def model_slug(name: str) -> str:
    """A model's name in a file name: its last path part (a folder is not shown whole), slugged."""
    return slug(str(name).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]) or "model"


def download_name(run, suffix: str, layer: int | None = None, head: int | None = None) -> str:
    """A download's file name from what it holds, ``headscope-<model>[-core][-words][-no-special]-<text>``
    ``[-layerL][-headH]`` and ``suffix`` (".npz"); a text with no Latin letters or digits is named by a short
    digest of it ("text-1a2b3c4d")."""
    text = " ".join(t for t in (run.text, run.text_pair) if t)
    parts = ["headscope", model_slug(run.model_name)]
    if run.engine not in ("transformers", "toy"):
        parts.append(run.engine)
    if run.level == "word":
        parts.append("words")
    if run.metadata.get("special_tokens_removed"):
        parts.append("no-special")
    parts.append(slug(text) or "text-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:8])
    if layer is not None:
        parts.append(f"layer{layer}")
    if head is not None:
        parts.append(f"head{head}")
    return "-".join(parts) + suffix


def downloads(run, layer: int, head: int, key_prefix: str = "") -> None:
    """The whole run as .npz and the selected head as CSV, named by model, text, layer and head; both built
    only when clicked, by callables that do not hold the run (``computations.deferred``: Streamlit keeps them as long
    as the session); the saved view's words in the session's language (captured here, in the script run)."""
    lang = language()
    cols = st.columns(3)
    cols[0].download_button(
        t("Attention tensor (.npz)"),
        data=computations.deferred(run, lambda view: view.to_npz_bytes()),
        file_name=download_name(run, ".npz"),
        mime="application/octet-stream",
        key=f"{key_prefix}dl_npz",
        help=t(
            "All {layers} x {heads} heads, tokens and masks; load with mha_core.AttentionRun.load.",
            layers=run.num_layers,
            heads=run.num_heads,
        ),
    )

    def head_csv(view) -> bytes:
        buffer = io.StringIO()
        view.head_frame(layer, head).to_csv(buffer, float_format="%.6g")
        return buffer.getvalue().encode("utf-8")

    cols[1].download_button(
        t("Layer {layer} head {head} weights (.csv)", layer=layer, head=head),
        data=computations.deferred(run, head_csv),
        file_name=download_name(run, ".csv", layer=layer, head=head),
        mime="text/csv",
        key=f"{key_prefix}dl_csv",
    )
    cols[2].download_button(
        t("View as HTML (.html)"),
        data=computations.deferred(run, lambda view: view_page(view, layer, head, lang)),
        file_name=download_name(run, ".html", layer=layer, head=head),
        mime="text/html",
        key=f"{key_prefix}dl_html",
        help=t(
            "The head and model views as one file: data and scripts inside, opens offline in any browser "
            "(click heads, switch layers). Weights at one byte each (within 0.002)."
        ),
    )


def view_page(run, layer: int, head: int, lang: str = "en") -> bytes:
    """The run's head view (the model view one click away) as one self-contained HTML page in ``lang``, UTF-8."""
    return standalone.html(run, layer=layer, head=head, **view_language(lang, headview.VIEW_TEXTS)).encode("utf-8")


def long_view_page(data: dict, title: str, lang: str = "en") -> bytes:
    """The long view's ``data`` (``longview.pack_layer`` or ``pack_model``'s) as one self-contained HTML page in
    ``lang`` (the script's own words translated: ``longview.VIEW_TEXTS``), UTF-8."""
    options = view_language(lang, longview.VIEW_TEXTS)  # none in English
    data = {**data, "strings": options["strings"]} if options else data
    return standalone.page(standalone.View("longview", data, title, lang=options.get("lang", "en"))).encode("utf-8")


def long_view_download(run, data: dict, key: str) -> None:
    """The long view as it is shown (``data``: ``longview.pack_layer`` or ``pack_model``'s) as one self-contained HTML
    page; built when clicked. The file shows this region: zooming further needs the run (the app, or ``mc.show``)."""
    title = t("{model}: {count} tokens (long document)", model=run.model_name, count=f"{run.num_tokens:,}")
    name = f"headscope-{model_slug(run.model_name)}-long-{run.num_tokens}-layer{data['layer']}-head{data['head']}.html"
    lang = language()  # known in this script run, not where the file is built
    st.download_button(
        t("View as HTML (.html)"),
        data=lambda: long_view_page(data, title, lang),
        file_name=name,
        mime="text/html",
        key=key,
        help=t("This view as one file: data and scripts inside, opens offline in any browser."),
    )


def view_language(lang: str, texts) -> dict:
    """A saved view's options in ``lang``: its own words (``texts``, in English, each with its translation) and its
    page's ``<html lang>``; English: none (the library's own words)."""
    if lang == "en":
        return {}
    return {"strings": {text: translate(text, lang) for text in texts}, "lang": HTML_LANG[lang]}


def table_view_page(table, column: str | None = None, lang: str = "en") -> bytes:
    """A head table's view as one self-contained HTML page in ``lang``, UTF-8."""
    return standalone.html(table, column=column, **view_language(lang, tables.VIEW_TEXTS)).encode("utf-8")


def table_view_download(table, file_name: str, key: str, column: str | None = None) -> None:
    """A head table's maps (``mha_core.views.tables``: the copying, previous-token, attribution and patching scores,
    or the composition of pairs of heads) as one self-contained HTML page, ``column`` shown first: every numeric
    column a click away, each head's rows in words, the view's own words in the session's language; built when
    clicked."""
    lang = language()  # known in this script run, not where the file is built
    st.download_button(
        t("Download the maps as HTML (.html)"),
        data=lambda: table_view_page(table, column, lang),
        file_name=file_name,
        mime="text/html",
        key=key,
        help=t(
            "These maps as one file: data and scripts inside, opens offline in any browser (pick a column, click a "
            "head for its numbers)."
        ),
    )
