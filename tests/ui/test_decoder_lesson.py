"""The Classroom's decoder lesson (``ui/decoder_lesson.py``, step 9): the vote on the next word, the model's
distribution revealed, the temperature's spread and the written tokens with the earlier tokens they attended to;
and the lesson's arithmetic in ``mha_core.walkthrough``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.walkthrough import attended_earlier, temperature_probabilities
from tests.page_helpers import rerun, run_page
from ui.page_classroom import DECODER_PROMPTS as PROMPTS

REVEAL = "Reveal the answer"


def test_temperature_probabilities_are_softmax_of_scaled_logits():
    logits = np.array([3.0, 1.0, 0.5, -2.0])
    for temperature in (0.2, 0.7, 1.0, 2.0):
        expected = torch.softmax(torch.tensor(logits) / temperature, -1).numpy()
        np.testing.assert_allclose(temperature_probabilities(logits, temperature), expected, rtol=1e-12)
    assert temperature_probabilities(logits, 0.0).tolist() == [1.0, 0.0, 0.0, 0.0]
    # below 1 the most likely gains, above 1 it loses
    assert temperature_probabilities(logits, 0.5)[0] > temperature_probabilities(logits, 1)[0]
    assert temperature_probabilities(logits, 2.0)[0] < temperature_probabilities(logits, 1)[0]
    with pytest.raises(ValueError):
        temperature_probabilities(logits, -1.0)


def test_attended_earlier_averages_one_layers_heads():
    heads = np.zeros((2, 4, 4))
    heads[0, 3] = [0.1, 0.6, 0.2, 0.1]
    heads[1, 3] = [0.5, 0.2, 0.2, 0.1]
    assert attended_earlier(heads, 3, top=2) == [(1, pytest.approx(0.4)), (0, pytest.approx(0.3))]
    assert attended_earlier(heads, 3, top=2, skip=[1]) == [(0, pytest.approx(0.3)), (2, pytest.approx(0.2))]


@pytest.mark.slow
def test_the_lesson_votes_reveals_spreads_and_writes():
    model = mc.load_model("smollm2")
    prompt = PROMPTS[1]
    app = run_page("classroom", {"step": "9", "dprompt": prompt, "dtemp": "0.5"})
    assert [h.value for h in app.header if h.value.startswith("Step")] == ["Step 9. A decoder predicts the next word"]
    expected = mc.predict(model, prompt, k=50)
    assert not [d for d in app.dataframe if "rank" in d.value.columns]  # nothing given away before the reveal
    spread = next(d.value for d in app.dataframe if "at temperature 0.5" in d.value.columns)
    np.testing.assert_allclose(
        spread["at temperature 0.5"], temperature_probabilities(expected["logit"], 0.5)[:10], rtol=2e-4, atol=1e-7
    )
    next(t for t in app.toggle if t.label == REVEAL).set_value(True)
    rerun(app)
    table = next(d.value for d in app.dataframe if "rank" in d.value.columns)
    np.testing.assert_allclose(table["probability"], expected["probability"][:10], rtol=1e-4, atol=1e-7)
    assert any("Paris" in m.value and "**Answer:**" in m.value for m in app.markdown)
    # the model writes five tokens at the lesson's temperature: the library's tokens, the attention of its run
    written = run_page("classroom", {"step": "9", "dprompt": prompt, "dtemp": "0.5", "dwrite": "1", "dlayer": "4"})
    run = mc.generate(model, prompt, 5, temperature=0.5, seed=0)
    rows = next(d.value for d in written.dataframe if "attends most to" in d.value.columns)
    steps = run.metadata["generation"]["steps"]
    assert rows["written"].tolist() == [repr(model.tokenizer.decode([s["chosen"]])) for s in steps]
    sinks = list(np.flatnonzero(run.special_mask[: run.metadata["generation"]["prompt_tokens"]]))
    assert sinks == [0]  # the BOS token
    first = attended_earlier(run.attentions[4], steps[0]["position"], top=3, skip=sinks)
    assert rows["attends most to"].iloc[0] == ", ".join(f"{run.tokens[k]!r} {w:.2f}" for k, w in first)


@pytest.mark.slow
def test_the_teaching_doc_says_what_the_lesson_shows():
    from tests.conftest import ROOT

    doc = (ROOT / "docs" / "teaching.md").read_text(encoding="utf-8")
    assert "*Paris*, probability 0.75, the next below 0.02" in doc
    table = mc.predict(mc.load_model("smollm2"), "The capital of France is", k=2)
    assert table["token"].iloc[0] == " Paris" and round(float(table["probability"].iloc[0]), 2) == 0.75
    assert float(table["probability"].iloc[1]) < 0.02
    spread = temperature_probabilities(
        mc.predict(mc.load_model("smollm2"), "The capital of France is", k=50)["logit"], 0.5
    )
    assert spread[0] > 0.99  # "at 0.5 Paris takes almost all of it"
