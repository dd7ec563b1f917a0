"""Computations that describe themselves (``mha_core.operations``): a key derived from the fields, the work class
declared once, and the input tokenized once, from the estimate through the run (a counting tokenizer wraps the
model's own)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

import mha_core as mc
from mha_core.models.long import needle_question, run_long, run_needle
from mha_core.operations import (
    HEAVY,
    LIGHT,
    Attention,
    Attribution,
    LogitLens,
    LongAttention,
    NeedleTest,
    Operation,
    Patching,
    operation,
    prompt,
)
from mha_core.operations.base import RUN_PEAK_FACTOR, attention_bytes
from mha_core.operations.long import long_run_bytes, needle_run_bytes
from tests.model_fixtures import build_tiny_gpt2

TEXT = "The cat sat on the mat."
CLEAN, CORRUPTED = "The cat sat on the mat.", "The dog sat on the mat."


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    return mc.load_model(str(build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), head=True, randomised=True)))


class CountingTokenizer:
    """The model's tokenizer, counting the calls that tokenize each text (``calls[text]``)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, Counter()

    def __call__(self, text, *args, **kwargs):
        self.calls[text] += 1
        return self.tokenizer(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


@pytest.fixture
def calls(decoder, monkeypatch) -> Counter:
    counting = CountingTokenizer(decoder.encoder.tokenizer)
    monkeypatch.setattr(decoder.encoder, "tokenizer", counting)
    return counting.calls


def test_a_key_is_derived_from_the_fields(decoder):
    first, again = Attention.of(decoder, TEXT), Attention.of(decoder, TEXT)
    assert first is not again and first == again and hash(first) == hash(again) and len({first, again}) == 1
    assert first.key[:2] == ("Attention", decoder.name) and first.key[2].startswith("tokens:")
    assert json.loads(json.dumps(first.key)) == json.loads(json.dumps(list(first.key)))  # a key travels as JSON
    other_text = Attention.of(decoder, CORRUPTED)
    ablated = Attention(decoder.name, first.encoded, ablate=[[0, 1]])  # lists given: the same key as tuples
    assert other_text.key != first.key and other_text.key[2] != first.key[2]
    assert ablated.key == Attention(decoder.name, first.encoded, ablate=((0, 1),)).key != first.key
    assert dataclasses.replace(first, norms=True).key == (*first.key[:-1], True) and first.key[-1] is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.norms = True  # frozen: a key cannot drift from the fields it names


def test_an_operation_declares_its_work_class_in_its_own_body():
    with pytest.raises(TypeError, match="declares no work_class"):

        @operation
        class Undeclared(Operation):
            size: int

    @operation
    class Light(Operation):
        work_class = LIGHT
        size: int

    with pytest.raises(TypeError, match="declares no work_class"):  # not inherited: each says its own

        @operation
        class Inheriting(Light):
            pass

    assert Light(1).work_class is LIGHT and Light(1).work_class.share is None and HEAVY.share == "heavy"


def test_a_field_may_not_hide_the_cache_key():
    # A field named ``key`` would be the instance's ``key``: two operations differing in every other field would
    # share one cache entry.
    with pytest.raises(TypeError, match="field named 'key'"):

        @operation
        class Keyed(Operation):
            work_class = LIGHT
            layer: int
            key: int


def test_a_run_is_tokenized_once_for_its_estimate_and_its_run(decoder, calls):
    made = Attention.of(decoder, TEXT)
    n = len(made.encoded)
    estimate = made.peak_bytes(decoder)
    run = made.run(decoder)
    assert calls[TEXT] == 1  # tokenized when the operation was made, and never again
    assert estimate == int(RUN_PEAK_FACTOR * attention_bytes(decoder.num_layers, decoder.num_heads, n))
    assert estimate == int(RUN_PEAK_FACTOR * run.attentions.nbytes)
    assert tuple(run.metadata["cache_key"]) == made.key  # what is computed from the run is named after it
    reference = decoder.run(TEXT)  # the library's own call tokenizes: the counter counts it
    assert calls[TEXT] == 2
    np.testing.assert_array_equal(run.attentions, reference.attentions)


def test_the_circuits_prompts_are_tokenized_once_for_attribution_patching_and_the_lens(decoder, calls):
    answer, foil = " mat", " sat"
    clean, corrupted = prompt(decoder, CLEAN, "clean prompt"), prompt(decoder, CORRUPTED, "corrupted prompt")
    operations = [
        Attribution(decoder.name, clean, answer, foil),
        Patching(decoder.name, clean, corrupted, answer, foil),
        LogitLens(decoder.name, clean, k=3),
    ]
    values = [(made.peak_bytes(decoder), made.run(decoder)) for made in operations]
    assert (calls[CLEAN], calls[CORRUPTED]) == (1, 1)  # the page's four uses of the clean prompt: one tokenization
    assert all(peak > 0 for peak, _ in values)
    # The same tables as the library's functions on the texts (which tokenize them again).
    expected = [
        mc.logit_attribution(decoder, CLEAN, answer, foil),
        mc.patch(decoder, CLEAN, CORRUPTED, answer, foil),
        mc.logit_lens(decoder, CLEAN, k=3),
    ]
    assert (calls[CLEAN], calls[CORRUPTED]) == (4, 2)
    for (_, value), reference in zip(values, expected):
        pd.testing.assert_frame_equal(value, reference)


def test_a_long_run_is_named_by_its_tokens_and_bos_and_a_needle_test_by_its_prompt(decoder):
    """A long run's key holds its tokens' digest and whether it begins with the BOS token; a needle test's holds its
    whole prompt (ids, the needle's place, the answer's room). Each reserves its own estimate, in heavy work's share,
    and runs as the library's function does."""
    document = " ".join([TEXT] * 6)
    with_bos, without = (LongAttention.of(decoder, text=document, bos=bos) for bos in (True, False))
    assert with_bos.encoded.added_bos and not without.encoded.added_bos
    assert (with_bos.key[-1], without.key[-1]) == (True, False) and with_bos.key[2] != without.key[2]
    assert LongAttention.of(decoder, text=document, bos=True) == with_bos and with_bos.work_class is HEAVY
    assert with_bos.peak_bytes(decoder) == long_run_bytes(decoder, len(with_bos.encoded))
    run = with_bos.run(decoder)
    reference = run_long(decoder, document, bos=True)
    assert run.token_ids == reference.token_ids
    np.testing.assert_allclose(run.attention_overview(1, 0), reference.attention_overview(1, 0), atol=1e-6, rtol=0)

    haystack = " ".join([CORRUPTED] * 12)
    prompt = needle_question(decoder, haystack, "The code is red.", "What is the code?", depth=0.3, num_tokens=60)
    deeper = needle_question(decoder, haystack, "The code is red.", "What is the code?", depth=0.7, num_tokens=60)
    test = NeedleTest(decoder.name, prompt)
    assert test.key == NeedleTest(decoder.name, dataclasses.replace(prompt)).key != NeedleTest(decoder.name, deeper).key
    assert json.loads(json.dumps(test.key)) == json.loads(json.dumps(list(test.key)))  # plain JSON, as every key
    assert test.work_class is HEAVY and test.num_tokens == len(prompt.token_ids)
    assert test.peak_bytes(decoder) == needle_run_bytes(decoder, len(prompt.token_ids), prompt.answer_tokens)
    assert test.peak_bytes(decoder) >= long_run_bytes(decoder, len(prompt.token_ids) + prompt.answer_tokens)
    answered, expected = test.run(decoder), run_needle(decoder, prompt)
    assert answered.metadata["needle"] == expected.metadata["needle"] and answered.token_ids == expected.token_ids
