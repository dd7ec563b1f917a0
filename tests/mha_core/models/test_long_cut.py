"""A long document on an encoder is cut to what the model reads before the run, and says so: the first long example
is 1,069 MiniLM tokens, MiniLM has 512 learned positions (a run of more raised ``ValueError: 1069 tokens exceed
this model's 512 learned positions`` from the engine)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_core.models.long import long_run_limit, run_document, run_long
from tests.conftest import ATTENTION_ATOL
from ui import longdoc

EXAMPLE_TOKENS = 1069  # MiniLM's tokens of the first long example (assets/long/documents.json), checked below


@pytest.fixture(scope="module")
def document(minilm):
    text = longdoc.examples()[0]["text"]
    full = minilm.tokenizer(text, verbose=False)["input_ids"]  # the tokenizer alone, uncut: [CLS] ... [SEP]
    assert len(full) == EXAMPLE_TOKENS
    return text


def test_the_long_path_cuts_an_encoders_document_to_its_positions_and_says_so(minilm, document):
    assert long_run_limit(minilm) == minilm.context_length == 512
    run = run_long(minilm, document)
    assert run.num_tokens == 512 and run.truncated and run.num_input_tokens == EXAMPLE_TOKENS
    assert run.metadata["cut"] == (
        "The document has 1,069 tokens; minilm reads at most 512 (its learned positions), so its first 512 tokens "
        "were read."
    )
    assert run.tokens[0] == "[CLS]" and run.tokens[-1] == "[SEP]"  # cut by the tokenizer: the text ends as a text


@pytest.mark.parametrize("engine", ["transformers", "core"])
def test_both_engines_read_the_same_cut_document(minilm, document, engine):
    """The dense path cuts it too (its cap is the same 512 here), in either engine, and the long run's exact
    weights are those of the engine on the tokens it kept."""
    dense = run_document(minilm, document, engine=engine)
    assert dense.engine == engine and dense.num_tokens == 512
    assert dense.truncated and dense.num_input_tokens == EXAMPLE_TOKENS
    long = run_long(minilm, document)
    assert long.token_ids == dense.metadata["token_ids"]
    for layer, head in ((0, 0), (3, 7), (5, 11)):
        np.testing.assert_allclose(
            long.attention_block(layer, head, (0, 512), (0, 512)), dense.attentions[layer, head], atol=ATTENTION_ATOL
        )


def test_a_context_length_beyond_the_engines_positions_is_cut_before_the_run(minilm, document, monkeypatch):
    """Where a checkpoint's tokenizer or config promise more than the engine's table of learned positions holds,
    the long path cuts at the table, for a text and for token ids alike, instead of failing in the engine."""
    monkeypatch.setattr(minilm, "context_length", 2048)
    assert long_run_limit(minilm) == 512
    run = run_long(minilm, document)
    assert run.num_tokens == 512 and run.metadata["cut"].startswith("The document has 1,069 tokens")
    ids = minilm.tokenizer(document, verbose=False)["input_ids"]
    by_ids = run_long(minilm, token_ids=ids)
    assert by_ids.num_tokens == 512 and by_ids.num_input_tokens == EXAMPLE_TOKENS and by_ids.truncated
    assert by_ids.token_ids == ids[:512] and "cut" in by_ids.metadata


@pytest.mark.slow
def test_the_page_shows_the_cut(minilm, document):
    from tests.page_helpers import open_app

    app = open_app("explore", {"long": "0", "lzoom": "0.0.0-512.0-512"})  # one person's server: the link reads it
    notices = [info.value for info in app.info if "1,069 tokens" in info.value.replace("\\", "")]
    assert len(notices) == 1 and "reads at most 512 \\(its learned positions\\)" in notices[0]
