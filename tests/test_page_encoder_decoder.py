"""Explore and Compare with an encoder-decoder model (a tiny random BART and T5 saved here, picked as the
sidebar's "Other" folder, as a user picks t5-small or facebook/bart-base): the source and target boxes, the
model writing the target, the switch between the three attentions in the address, and the head view's data
decoded and checked against runs computed here."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ATTENTION_ATOL
from tests.model_fixtures import build_tiny_bart, build_tiny_t5
from tests.page_helpers import head_view_data, open_app, rerun

pytestmark = pytest.mark.slow

SOURCE = "The cat sat on the mat."
TARGET = "A dog chased the cat."
LEVEL = 1 / 255  # the head view sends weights as bytes: off by at most half a level


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    import mha_core as mc

    path = build_tiny_bart(tmp_path_factory.mktemp("bart"))
    return str(path), mc.load_model(str(path))


def texts_of(app, kind: str) -> str:
    return " ".join(str(element.value) for element in app.get(kind))


def test_explore_shows_cross_attention_with_two_token_lists(bart):
    path, model = bart
    app = open_app("explore", {"model": path, "source": SOURCE, "target": TARGET, "write": "0", "layer": "1"})
    assert "kind" not in app.query_params  # cross-attention is the default: the address leaves it out
    data = head_view_data(app, "s2s_view_cross")
    reference = model.run(SOURCE, TARGET)
    assert data["tokens"] == reference.cross.tokens and data["key_tokens"] == reference.cross.key_tokens
    assert data["tokens"] != data["key_tokens"] and data["layer"] == 1
    np.testing.assert_allclose(data["weights_by_layer"][1], reference.cross.attentions[1], atol=LEVEL / 2 + 1e-6)
    assert "target token (attending)" not in texts_of(app, "markdown")  # drawn by the browser, not the server


def test_the_kind_is_in_the_address_and_switches_the_view(bart):
    path, model = bart
    app = open_app("explore", {"model": path, "source": SOURCE, "target": TARGET, "write": "0", "kind": "decoder"})
    data = head_view_data(app, "s2s_view_decoder")
    reference = model.run(SOURCE, TARGET)
    assert data["causal"] and data["key_tokens"] is None and data["tokens"] == reference.decoder.tokens
    np.testing.assert_allclose(data["weights_by_layer"][0], reference.decoder.attentions[0], atol=LEVEL / 2 + 1e-6)
    app.segmented_control(key="s2s_kind").set_value("encoder")
    rerun(app)
    assert app.query_params["kind"] == "encoder"
    data = head_view_data(app, "s2s_view_encoder")
    assert data["tokens"] == reference.encoder.tokens and not data["causal"]
    app = open_app("explore", {"model": path, "source": SOURCE, "target": TARGET, "write": "0", "kind": "sideways"})
    assert "The link's kind=sideways is not one of cross, encoder, decoder" in texts_of(app, "warning")
    head_view_data(app, "s2s_view_cross")  # a kind the address gets wrong shows the default


def test_the_model_writes_the_target(bart):
    path, model = bart
    app = open_app("explore", {"model": path, "source": SOURCE})
    reference = model.run(SOURCE)  # greedy, as the page
    assert reference.generated
    data = head_view_data(app, "s2s_view_cross")
    assert data["tokens"] == reference.cross.tokens
    np.testing.assert_allclose(data["weights_by_layer"][0], reference.cross.attentions[0], atol=LEVEL / 2 + 1e-6)
    assert "The model wrote:" in texts_of(app, "markdown")


def test_word_level_and_core_engine(tmp_path):
    import mha_core as mc

    path = str(build_tiny_t5(tmp_path / "t5"))
    query = {"model": path, "source": SOURCE, "target": TARGET, "write": "0", "words": "1", "engine": "core"}
    app = open_app("explore", query)
    reference = mc.load_model(path).run(SOURCE, TARGET, engine="core").to_words()
    data = head_view_data(app, "s2s_view_cross")
    assert data["tokens"] == reference.cross.tokens and data["key_tokens"] == reference.cross.key_tokens
    np.testing.assert_allclose(data["weights_by_layer"][0], reference.cross.attentions[0], atol=LEVEL / 2 + 1e-6)
    assert "max |core − transformers|" in texts_of(app, "caption")


def test_compare_shows_two_layers_of_cross_attention(bart):
    path, model = bart
    app = open_app("compare", {"model": path, "source": SOURCE, "target": TARGET, "write": "0"})
    reference = model.run(SOURCE, TARGET)
    left, right = head_view_data(app, "s2s_compare_left"), head_view_data(app, "s2s_compare_right")
    assert (left["layer"], right["layer"]) == (0, 1)
    for data in (left, right):
        assert data["key_tokens"] == reference.cross.key_tokens
        np.testing.assert_allclose(
            data["weights_by_layer"][data["layer"]],
            reference.cross.attentions[data["layer"]],
            atol=LEVEL / 2 + ATTENTION_ATOL,
        )


def test_other_pages_say_what_they_read(bart):
    path, _ = bart
    app = open_app("roles", {"model": path})
    assert "is an encoder\\-decoder model" in texts_of(app, "error")


def test_every_setting_comes_back_from_its_link(bart):
    """A link that sets every setting of the encoder-decoder Explore to a value other than its default."""
    path, model = bart
    settings = {
        "source": SOURCE,
        "target": TARGET,
        "write": "0",
        "kind": "decoder",
        "words": "1",
        "layer": "1",
        "head": "2",
        "view": "model",
    }
    app = open_app("explore", {"model": path, **settings})
    assert {key: app.query_params[key] for key in settings} == settings
    state = app.session_state
    assert (state["s2s_source"], state["s2s_target"], state["s2s_write"]) == (SOURCE, TARGET, False)
    assert (state["s2s_kind"], state["s2s_words"], state["explore_view"]) == ("decoder", True, "model")
    data = head_view_data(app, "s2s_view_decoder")
    assert (data["view"], data["layer"], data["head"]) == ("model", 1, 2)
    reference = model.run(SOURCE, TARGET).to_words().decoder
    assert data["tokens"] == reference.tokens
    np.testing.assert_allclose(data["weights_by_layer"][1], reference.attentions[1], atol=LEVEL / 2 + 1e-6)
