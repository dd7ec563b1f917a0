"""Explore and Compare with an encoder-decoder model (a tiny random BART and T5 saved here, picked as the
sidebar's "Other" folder, as a user picks t5-small or facebook/bart-base): the source and target boxes, the
model writing the target, the switch between the three attentions in the address, and the head view's data
decoded and checked against runs computed here."""

from __future__ import annotations

import html

import numpy as np
import pytest

from tests.conftest import ATTENTION_ATOL
from tests.model_fixtures import build_tiny_bart, build_tiny_t5
from tests.page_helpers import head_view_data, open_app, plotly_elements, rerun
from ui.encoder_decoder import KIND_LABELS

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


@pytest.fixture(scope="module", params=["bart", "t5"])
def seq2seq(request, tmp_path_factory):
    """A tiny random BART and T5: their folders and models."""
    import mha_core as mc

    build = {"bart": build_tiny_bart, "t5": build_tiny_t5}[request.param]
    path = build(tmp_path_factory.mktemp(request.param))
    return str(path), mc.load_model(str(path))


def labels_of(app, kind: str) -> list[str]:
    return [element.proto.label for element in app.get(kind)]


def test_every_explore_section_applies_or_says_why(seq2seq):
    """Every section of Explore with an encoder-decoder: the three attentions' views, the toggles, the sink note,
    the lines, the downloads, the layer code; the long document says it reads single-stack models; no error."""
    path, model = seq2seq
    query = {"model": path, "source": SOURCE, "target": TARGET, "write": "0"}
    reference = model.run(SOURCE, TARGET)
    for kind in ("cross", "encoder", "decoder"):
        app = open_app("explore", {**query, "kind": kind})
        assert not app.error, [e.value for e in app.error]
        data = head_view_data(app, f"s2s_view_{kind}")
        np.testing.assert_allclose(
            data["weights_by_layer"][0], reference.kind(kind).attentions[0], atol=LEVEL / 2 + 1e-6
        )
        assert "The long pass reads single-stack models" in texts_of(app, "info")
        assert "Something went wrong" not in texts_of(app, "error")
        assert [label for label in labels_of(app, "download_button") if label != "SVG for slides"] == [
            "Encoder, decoder and cross-attention (.npz)",
            f"{KIND_LABELS[kind].split(' (')[0]}, layer 0 head 0 (.csv)",
            "View as HTML (.html)",
        ]
        assert "The selected head as lines (BertViz style)" in [e.label for e in app.expander]
        # The sink note: shown exactly when a quarter or more of this attention's heads park most of their weight
        # on a token of no content (computed here from the run).
        sinks = mc_head_metrics(reference.kind(kind))["sink_mass"].to_numpy() >= 0.5
        assert ("an *attention sink*" in texts_of(app, "caption")) == bool(sinks.mean() >= 0.25)
    # Hide special tokens: every kind loses them, rows renormalised.
    app = open_app("explore", {**query, "hide": "1"})
    data = head_view_data(app, "s2s_view_cross")
    hidden = reference.without_special().cross
    assert data["tokens"] == hidden.tokens and data["key_tokens"] == hidden.key_tokens
    assert len(hidden.key_tokens) < len(reference.cross.key_tokens)
    np.testing.assert_allclose(data["weights_by_layer"][0], hidden.attentions[0], atol=LEVEL / 2 + 1e-6)
    # The from-scratch engine: its layer code, as for single-stack models.
    app = open_app("explore", {**query, "engine": "core"})
    assert "The from-scratch layer code that computed these weights" in [e.label for e in app.expander]
    assert not app.error


def test_compare_shows_two_layers_their_difference_and_curves_for_every_attention(seq2seq):
    path, model = seq2seq
    reference = model.run(SOURCE, TARGET)
    for kind in ("cross", "encoder", "decoder"):
        view = reference.kind(kind)
        app = open_app("compare", {"model": path, "source": SOURCE, "target": TARGET, "write": "0", "kind": kind})
        assert not app.error, [e.value for e in app.error]
        left, right = head_view_data(app, "s2s_compare_left"), head_view_data(app, "s2s_compare_right")
        assert (left["layer"], right["layer"]) == (0, view.num_layers - 1)
        np.testing.assert_allclose(left["weights_by_layer"][0], view.attentions[0], atol=LEVEL / 2 + ATTENTION_ATOL)
        app.toggle(key="s2s_compare_difference").set_value(True)
        rerun(app)
        # Both layers stay, and the difference comes below them: every head, left minus right, the columns the
        # source's tokens for cross-attention.
        head_view_data(app, "s2s_compare_left"), head_view_data(app, "s2s_compare_right")
        charts = plotly_elements(app)
        trace = charts["s2s_compare_difference_grid"]["data"][0]
        n, m = view.attentions.shape[2:]
        assert (trace["zmin"], trace["zmax"]) == (-1, 1)
        z = np.asarray(trace["z"], dtype=np.float64)
        first = z[:n, :m]  # head 0, the grid's first tile
        want = view.attentions[0, 0] - view.attentions[-1, 0]
        if view.is_causal:
            want = np.where(np.triu(np.ones((n, m), dtype=bool), k=1), np.nan, want)
        np.testing.assert_allclose(first, want, atol=ATTENTION_ATOL)
        keys = view.key_tokens if kind == "cross" else view.tokens
        assert [html.unescape(x).rsplit(" ", 1)[-1] for x in trace["x"][:m]] == [t.rsplit(" ", 1)[-1] for t in keys]
        # Per-layer curves of this attention's measurements.
        table = mc_head_metrics(view)
        metric = app.selectbox(key="s2s_compare_metric").value
        curve = charts["s2s_compare_curve"]["data"]
        np.testing.assert_allclose(curve[1]["y"], table.groupby("layer")[metric].mean().to_numpy(), atol=1e-5)


def mc_head_metrics(run):
    from mha_core import head_metrics

    return head_metrics(run)
