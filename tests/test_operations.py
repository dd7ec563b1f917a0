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
from mha_core.operations import (
    HEAVY,
    LIGHT,
    Attention,
    Attribution,
    LogitLens,
    Operation,
    Patching,
    operation,
    prompt,
)
from mha_core.operations.base import RUN_PEAK_FACTOR, attention_bytes
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
