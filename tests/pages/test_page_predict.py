"""Explore's output section under AppTest (``ui/widgets/predict.py``): the next-token table read from the run's own
pass, the model writing with its settings in the address, the head view grown by the written tokens (marked), a
written token's distribution, and bad values in a link."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from tests.conftest import ATTENTION_ATOL
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2
from tests.page_helpers import head_view_data, open_app, rerun
from tests.pages.test_page_explore_decomposition import address, pick_in_the_view
from ui.headview import LEVELS
from ui.widgets import predict as predict_widget

TEXT = "the cat sat on the mat"
HEAD_VIEW_ATOL = 0.5 / LEVELS + ATTENTION_ATOL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    return str(build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), head=True, randomised=True))


def frame(app, key: str):
    (element,) = [e for e in app.dataframe if e.proto.id.endswith(key) or getattr(e, "key", None) == key] or [None]
    assert element is not None, f"no table {key!r}"
    return element.value


def tables(app) -> list:
    return [e.value for e in app.dataframe]


def test_the_next_token_table_is_the_models_prediction(gpt2_path):
    app = open_app("explore", {"model": gpt2_path, "text": TEXT})
    model = mc.load_model(gpt2_path)
    expected = mc.predict(model, TEXT, k=10)
    (table,) = [t for t in tables(app) if "probability" in t.columns and "rank" in t.columns]
    assert table["id"].tolist() == expected["id"].tolist()
    np.testing.assert_allclose(table["probability"], expected["probability"], rtol=1e-5)
    assert table["token"].tolist() == [repr(t) for t in expected["token"]]


def test_written_tokens_grow_the_head_view(gpt2_path):
    model = mc.load_model(gpt2_path)
    written = mc.generate(model, TEXT, 3, temperature=0.0, stop=None)
    app = open_app("explore", {"model": gpt2_path, "text": TEXT, "gen": "3", "temp": "0.0"})
    data = head_view_data(app)
    n = written.num_tokens
    assert len(data["tokens"]) == n
    generated = written.metadata["generation"]["generated"]
    assert [i for i, token in enumerate(data["tokens"]) if token.startswith(predict_widget.MARK)] == generated
    np.testing.assert_allclose(
        data["enlarged_head"], written.attentions[data["layer"], data["head"]], rtol=0, atol=HEAD_VIEW_ATOL
    )
    # the last written token's distribution: the step of the library's run
    step = written.metadata["generation"]["steps"][-1]
    (table,) = [t for t in tables(app) if "drawn with" in t.columns]
    np.testing.assert_allclose(table["model probability"], step["probabilities"], rtol=1e-6)
    assert table["chosen"].tolist() == [i == step["chosen"] for i in step["ids"]]
    # one more token: the address follows, the view grows by one
    next(b for b in app.button if b.key == "gen_write_1").click()
    rerun(app)
    assert app.query_params["gen"] == ["4"] or app.query_params["gen"] == "4"
    assert (
        len(head_view_data(app)["tokens"]) == min(n + 1, model.max_tokens)
        or written.metadata["generation"]["stopped"] == "stop token"
    )


def test_bad_settings_in_the_link_get_a_notice(gpt2_path):
    app = open_app("explore", {"model": gpt2_path, "text": TEXT, "gen": "x", "temp": "9", "topk": "-1"})
    warnings = " ".join(w.value for w in app.warning).replace("\\", "")  # markdown escapes
    assert "gen=x" in warnings and "temp=9" in warnings and "topk=-1" in warnings
    assert len(head_view_data(app)["tokens"]) == len(mc.load_model(gpt2_path).encode(TEXT))


def test_a_masked_model_predicts_its_mask(tmp_path):
    path = str(build_tiny_bert(tmp_path / "bert", head=True, randomised=True))
    model = mc.load_model(path)
    text = f"the cat {model.tokenizer.mask_token} on the mat"
    app = open_app("explore", {"model": path, "text": text})
    (table,) = [t for t in tables(app) if "rank" in t.columns]
    assert table["id"].tolist() == mc.predict(model, text, k=10)["id"].tolist()
    assert not [b for b in app.button if b.key == "gen_write_1"]  # an encoder does not write


def test_a_sentence_encoder_shows_no_prediction():
    app = open_app("explore", {"model": "minilm", "text": TEXT})
    assert not [t for t in tables(app) if "rank" in t.columns]
    assert not [b for b in app.button if b.key == "gen_write_1"]


def test_a_written_token_comes_from_the_link_and_a_bad_one_gets_a_notice(gpt2_path):
    query = {"model": gpt2_path, "text": TEXT, "gen": "3", "temp": "0.0"}
    written = mc.generate(mc.load_model(gpt2_path), TEXT, 3, temperature=0.0, stop=None)
    positions = [step["position"] for step in written.metadata["generation"]["steps"]]
    app = open_app("explore", {**query, "gtok": str(positions[0])})
    assert app.session_state["gen_token"] == positions[0] and not app.warning
    app = open_app("explore", {**query, "gtok": "99"})
    warnings = " ".join(w.value for w in app.warning).replace("\\", "")
    assert "gtok=99" in warnings and "using the default" in warnings
    assert app.session_state["gen_token"] == positions[-1]  # the last written token


def test_a_written_token_clicked_in_the_head_view_shows_the_distribution_it_was_drawn_from(gpt2_path, monkeypatch):
    model = mc.load_model(gpt2_path)
    written = mc.generate(model, TEXT, 3, temperature=0.7, top_k=20, seed=5, stop=None)
    generation = written.metadata["generation"]
    app = open_app("explore", {"model": gpt2_path, "text": TEXT, "gen": "3", "temp": "0.7", "topk": "20", "seed": "5"})
    data = head_view_data(app)
    assert data["written"] == generation["generated"]  # the written rows' labels are the ones that can be picked
    first = generation["steps"][0]
    assert app.session_state["gen_token"] != first["position"]  # the last written token is shown at first
    pick = {"layer": data["layer"], "head": data["head"], "view": "head", "shape": "heatmap"}
    # The visitor clicks the first written token's label (headview.js: pickToken).
    pick_in_the_view(app, monkeypatch, {**pick, "token": first["position"], "n": 1})
    assert not app.error, [e.value for e in app.error]
    assert app.session_state["gen_token"] == first["position"] and address(app, "gtok") == str(first["position"])
    (table,) = [t for t in tables(app) if "drawn with" in t.columns]
    np.testing.assert_allclose(table["model probability"], first["probabilities"], rtol=1e-6)
    # The sampling distribution is a float32 softmax of the logits divided by the temperature: the app's pass and
    # this one (other thread counts, other summation orders) differ by up to a few float32 steps of the logits.
    np.testing.assert_allclose(table["drawn with"], first["sampling"], rtol=5e-4)
    assert table["token"].tolist() == [repr(model.tokenizer.decode([i])) for i in first["ids"]]
    assert table["chosen"].tolist() == [i == first["chosen"] for i in first["ids"]]
    assert f"{first['chosen_sampling_probability']:.3f}" in " ".join(c.value for c in app.caption)
    # A prompt token's row (not written) changes nothing.
    pick_in_the_view(app, monkeypatch, {**pick, "token": 1, "n": 2})
    assert app.session_state["gen_token"] == first["position"]


def test_a_prompt_token_clicked_shows_the_prediction_at_the_position_before_it(gpt2_path, monkeypatch):
    import torch

    model = mc.load_model(gpt2_path)
    ids = model.encode(TEXT).input_ids
    app = open_app("explore", {"model": gpt2_path, "text": TEXT})
    data = head_view_data(app)
    assert data["token_picks"] and data["written"] == []
    pick = {"layer": data["layer"], "head": data["head"], "view": "head", "shape": "heatmap"}
    position = 3
    pick_in_the_view(app, monkeypatch, {**pick, "token": position, "n": 1})
    assert not app.error, [e.value for e in app.error]
    assert app.session_state["gen_prompt_token"] == position and address(app, "ptok") == str(position)
    (table,) = [t for t in tables(app) if "prompt" in t.columns]
    with torch.no_grad():  # transformers' own logits at the position before the token, independently of the app
        logits = model.lm_model(input_ids=torch.tensor([ids])).logits[0, position - 1].double()
    top = torch.topk(torch.softmax(logits, -1), 10)
    assert table["id"].tolist() == top.indices.tolist()
    np.testing.assert_allclose(table["probability"], top.values.numpy(), rtol=1e-5, atol=1e-7)
    assert table["prompt"].tolist() == [i == ids[position] for i in top.indices.tolist()]
    # The first token has no position before it: nothing changes; Hide forgets the pick (and the address with it).
    pick_in_the_view(app, monkeypatch, {**pick, "token": 0, "n": 2})
    assert app.session_state["gen_prompt_token"] == position
    next(b for b in app.button if b.key == "prompt_token_hide").click()
    rerun(app)
    assert not [t for t in tables(app) if "prompt" in t.columns] and "ptok" not in app.query_params


def test_a_written_word_picked_in_the_word_view_shows_its_last_written_tokens_distribution(gpt2_path, monkeypatch):
    model = mc.load_model(gpt2_path)
    written = mc.generate(model, TEXT, 3, temperature=0.0, stop=None)
    generation = written.metadata["generation"]
    app = open_app("explore", {"model": gpt2_path, "text": TEXT, "gen": "3", "temp": "0.0", "words": "1"})
    data = head_view_data(app)
    assert data["written"], data["tokens"]  # the written words are marked in the word view too
    row = data["written"][0]
    # The run's positions behind that word (an independent grouping: the run's own word ids), its last written one.
    word = int(written.word_ids[generation["generated"][0]])
    behind = [i for i in generation["generated"] if int(written.word_ids[i]) == word]
    pick = {"layer": data["layer"], "head": data["head"], "view": "head", "shape": "heatmap", "token": row, "n": 1}
    pick_in_the_view(app, monkeypatch, pick)
    assert not app.error, [e.value for e in app.error]
    assert behind[-1] != generation["steps"][-1]["position"]  # not the one shown before the pick
    assert app.session_state["gen_token"] == behind[-1]
    step = next(s for s in generation["steps"] if s["position"] == behind[-1])
    (table,) = [t for t in tables(app) if "drawn with" in t.columns]
    np.testing.assert_allclose(table["model probability"], step["probabilities"], rtol=1e-6)
