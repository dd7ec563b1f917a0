"""The interface's language: English, or Simplified Chinese (简体中文, the course notes' language). One catalog:
``ui/locales/zh.json`` maps each English text (the key, as the code writes it) to its Chinese. ``t(text, **fields)``
gives the text in the session's language (the sidebar's switch, ``?lang=zh`` in the address), with ``{fields}``
filled in; a text the catalog does not hold shows in English. The library (``mha_core``) stays English.

Fields are filled after translation, so a value (a token, a number, a user's text) is never looked up: put what
changes in ``{fields}`` and keep the key fixed. Values are not escaped here: escape user text before
(``ui.widgets.messages.md_escape``)."""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

LANG_KEY = "lang"  # the session key of the sidebar's switch, and the address key (``?lang=zh``)
LANGUAGES = {"en": "English", "zh": "中文"}
HTML_LANG = {"en": "en", "zh": "zh-CN"}  # the page's <html lang>, which screen readers speak by
LANGUAGE_LABEL = "Language / 语言"  # the switch's label, in both: whoever opens the page can find it
LOCALES = Path(__file__).resolve().parent / "locales"


@cache
def catalog(lang: str) -> dict[str, str]:
    """English text -> its ``lang`` text (empty for English)."""
    if lang == "en":
        return {}
    return json.loads((LOCALES / f"{lang}.json").read_text(encoding="utf-8"))


def fields(text: str) -> set[str]:
    """The names of the ``{fields}`` of ``text`` (``str.format``'s)."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def translate(text: str, lang: str, /, **values) -> str:
    """``text`` in ``lang`` (English where the catalog has no entry), its ``{fields}`` filled with ``values``
    (a text given no values is returned as it is: braces in LaTeX or code stay)."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}; one of {', '.join(LANGUAGES)}")
    text = catalog(lang).get(text, text)
    return text.format(**values) if values else text


def language() -> str:
    """The session's language: the switch's value, else (before the sidebar draws it) the address's ``lang``.
    Known in a script run only: work in another thread (``ui.jobs``) is given the language its run captured."""
    import streamlit as st  # streamlit: the catalog and ``translate`` import without it (``ui.budget``'s notice)

    state = st.session_state  # each read of it takes Streamlit's lock: read once, the second key only when needed
    lang = state.get(LANG_KEY)
    if lang is None:
        lang = state.get(f"_{LANG_KEY}")
    if lang is None:
        lang = st.query_params.get(LANG_KEY)
    return lang if lang in LANGUAGES else "en"


def chinese() -> bool:
    return language() == "zh"


def t(text: str, /, **values) -> str:
    """``text`` in the session's language, its ``{fields}`` filled with ``values``."""
    return translate(text, language(), **values)


@dataclass(frozen=True)
class Text:
    """A text to show later, kept as its catalog key and values: ``str(text)`` is the session's language,
    ``english()`` the same words in English (what stays the same on every screen: a question's identity, which
    a class shares whatever language each screen shows). A value may be a ``Text`` too."""

    key: str
    values: dict = field(default_factory=dict)

    def english(self) -> str:
        values = {name: value.english() if isinstance(value, Text) else value for name, value in self.values.items()}
        return translate(self.key, "en", **values)

    def __str__(self) -> str:
        return t(self.key, **self.values)


def text(key: str, /, **values) -> Text:
    """``Text(key, values)``: a text in both languages, shown later (``str()``) in the session's."""
    return Text(key, values)


def joined(parts, separator: str) -> Text:
    """``parts`` (texts or ``Text``) joined by ``separator``, each shown in the session's language."""
    names = [f"part{i}" for i in range(len(parts))]
    return Text(separator.join(f"{{{name}}}" for name in names), dict(zip(names, parts, strict=True)))


def view_words(texts) -> dict[str, str]:
    """A view script's own words (``texts``, in English) with their translations in the session's language, sent with
    its data (the script's ``translator``); English: none (the script's own words)."""
    return {text: t(text) for text in texts} if chinese() else {}


NUMBERED = re.compile(r"(?P<words>[A-Za-z][A-Za-z ]*?) (?P<number>\d+)")  # "head 2": words, then a number


def shown(text: str | None) -> str | None:
    """A figure's text in the session's language: its catalog entry (a title wrapped with ``<br>``: its words'
    entry), else (a numbered name, "head 2") its words' entry and the number; else as it is."""
    if not text:
        return text
    translated = t(text)
    if translated != text:
        return translated
    if "<br>" in text and (translated := t(unwrapped := text.replace("<br>", " "))) != unwrapped:
        return translated  # a title wrapped onto lines: its words' entry
    numbered = NUMBERED.fullmatch(text)
    if numbered is not None and (words := t(numbered["words"])) != numbered["words"]:
        return f"{words} {numbered['number']}"
    return text


# A hover template's parts that are not words: Plotly's fields (``%{x}``, ``%{z:.3f}``, ``%{customdata[0]}``), the
# secondary box (``<extra>...</extra>``, kept whole), tags (``<br>``, ``<b>``).
HOVER_MARKUP = re.compile(r"(%\{[^}]*\}|<extra>.*?</extra>|<[^>]*>)", re.DOTALL)
# Words between them: words of letters (and ' _ -) joined by single spaces. Numbers and punctuation stay.
HOVER_WORDS = re.compile(r"[A-Za-z][A-Za-z_'-]*(?: [A-Za-z][A-Za-z_'-]*)*")


def hover_words(template: str) -> list[str]:
    """The word runs of a hover template, outside its fields and tags (what ``translate_hover`` looks up)."""
    return [
        run for i, part in enumerate(HOVER_MARKUP.split(template)) if i % 2 == 0 for run in HOVER_WORDS.findall(part)
    ]


def translate_hover(template, lang: str):
    """A hover template (or a list of them, one per point) with its words in ``lang``: each text between Plotly's
    fields and tags by its catalog entry, else each run of words in it by its own (none: as it is); fields, tags,
    numbers and punctuation kept."""
    if isinstance(template, (list, tuple)):
        return [translate_hover(one, lang) for one in template]
    if not isinstance(template, str) or lang == "en":
        return template
    words = catalog(lang)
    parts = HOVER_MARKUP.split(template)
    for i in range(0, len(parts), 2):  # the even parts are outside the markup
        whole = parts[i].strip()
        if whole in words:  # a text between two fields that has an entry of its own ("loss (all positions)")
            parts[i] = parts[i].replace(whole, words[whole])
        else:
            parts[i] = HOVER_WORDS.sub(lambda run: words.get(run[0], run[0]), parts[i])
    return "".join(parts)


def translate_figure(fig):
    """A Plotly figure's words (its title, subplot titles, axis titles, trace names, colour-bar titles and the words
    of its hover templates) in the session's language, in place; English: unchanged. ``ui.figures`` stays pure
    Plotly: the app translates what it shows."""
    if not chinese():
        return fig
    layout = fig.layout
    if layout.title and layout.title.text:
        layout.title.text = shown(layout.title.text)
    for annotation in layout.annotations or ():
        annotation.text = shown(annotation.text)
    for name in [name for name in layout if name.startswith(("xaxis", "yaxis"))]:
        axis = layout[name]
        if axis.title and axis.title.text:
            axis.title.text = shown(axis.title.text)
    for trace in fig.data:
        if getattr(trace, "name", None):
            trace.name = shown(trace.name)
        colorbar = getattr(trace, "colorbar", None)  # a heatmap's scale
        if colorbar is not None and colorbar.title and colorbar.title.text:
            colorbar.title.text = shown(colorbar.title.text)
        if getattr(trace, "hovertemplate", None):
            trace.hovertemplate = translate_hover(trace.hovertemplate, language())
    return fig
