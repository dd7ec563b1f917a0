"""Download file names say what the file holds: model, engine, text, layer and head."""

from __future__ import annotations

import numpy as np

from mha_core.run import AttentionRun
from ui.widgets.downloads import download_name, model_slug, slug


def run_of(model_name: str, text: str, engine: str = "transformers", text_pair: str | None = None) -> AttentionRun:
    n = 3
    return AttentionRun(
        model_name=model_name,
        family="bert",
        is_causal=False,
        tokens=["[CLS]", "x", "[SEP]"],
        attentions=np.full((1, 1, n, n), 1 / n, dtype=np.float32),
        special_mask=np.array([True, False, True]),
        word_ids=np.array([-1, 0, -1]),
        words=["x"],
        segment_ids=np.zeros(n, dtype=np.int64),
        engine=engine,
        text=text,
        text_pair=text_pair,
    )


def test_slug_keeps_words_cut_at_a_word_boundary():
    assert slug("The cat sat on the mat because it was tired.") == "the-cat-sat-on-the-mat-because-it-was"
    assert len("the-cat-sat-on-the-mat-because-it-was") <= 40 < len("the-cat-sat-on-the-mat-because-it-was-tired")
    assert slug("Crème brûlée, s'il vous plaît!") == "creme-brulee-s-il-vous-plait"
    assert slug("../../etc/passwd <b>x</b>") == "etc-passwd-b-x-b"
    assert slug("猫坐在垫子上") == ""
    assert slug("x" * 100) == "x" * 40  # one long word is cut, not dropped


def test_download_names_say_model_text_layer_and_head():
    text = "The cat sat on the mat because it was tired."
    run = run_of("minilm", text)
    assert download_name(run, ".npz") == "headscope-minilm-the-cat-sat-on-the-mat-because-it-was.npz"
    assert (
        download_name(run, ".csv", layer=5, head=11)
        == "headscope-minilm-the-cat-sat-on-the-mat-because-it-was-layer5-head11.csv"
    )
    # Another model, another text, another engine: another name.
    assert download_name(run_of("smollm2", "A dog barked."), ".npz") == "headscope-smollm2-a-dog-barked.npz"
    assert download_name(run_of("minilm", text, engine="core"), ".npz").startswith("headscope-minilm-core-the-cat-")
    assert download_name(run.to_words(), ".npz").startswith("headscope-minilm-words-the-cat-")
    assert download_name(run.without_special(), ".npz").startswith("headscope-minilm-no-special-the-cat-")
    # A sentence pair: both texts in the name (as far as it goes).
    assert download_name(run_of("minilm", "Where?", text_pair="Here."), ".npz") == "headscope-minilm-where-here.npz"
    # A folder is named by its last part, never the whole server path; text without Latin letters by a digest.
    folder = run_of("/srv/models/bert-base-uncased/", "猫坐在垫子上")
    name = download_name(folder, ".npz")
    assert (
        name.startswith("headscope-bert-base-uncased-text-")
        and len(name) == len("headscope-bert-base-uncased-text-") + 8 + 4
    )
    assert name != download_name(run_of("/srv/models/bert-base-uncased", "狗"), ".npz")
    assert model_slug("C:\\models\\My Model") == "my-model" and model_slug("///") == "model"


def test_the_view_download_is_the_head_view_as_one_page():
    import json
    import re

    from mha_core.views import heads
    from ui.widgets.downloads import view_page

    run = run_of("minilm", "x y")
    page = view_page(run, 0, 0).decode("utf-8")
    data = json.loads(re.search(r'id="hs-data">(.*?)</script>', page, flags=re.DOTALL).group(1))
    assert data["tokens"] == run.tokens and (data["layer"], data["head"], data["view"]) == (0, 0, "head")
    np.testing.assert_allclose(heads.unpack(data)[0], run.attentions[0], atol=0.5 / 255 + 1e-6, rtol=0)
    assert download_name(run, ".html", layer=0, head=0) == "headscope-minilm-x-y-layer0-head0.html"
