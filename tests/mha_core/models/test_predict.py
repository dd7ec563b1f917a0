"""The model's output (``mha_core.models.prediction``, ``mha_core.models.generation``, ``operations.output``): the
next-token table equals softmax of transformers' logits, a run keeps its prediction from its own pass, and
``generate`` writes token by token with the key/value cache while its attentions equal one pass over the final
sequence and its greedy choice equals transformers' ``generate``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.errors import HeadscopeError, InputTextError
from mha_core.models.generation import generate, sampling_distribution, stop_ids
from mha_core.models.prediction import predict, prediction_frame, run_prediction
from mha_core.operations import Generation, Prediction
from mha_core.operations.base import pass_peak_bytes
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    return mc.load_model("smollm2")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return mc.load_model(str(build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), head=True, randomised=True)))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return mc.load_model(str(build_tiny_bert(tmp_path_factory.mktemp("bert"), head=True, randomised=True)))


def reference_logits(model, ids: list[int], position: int = -1) -> torch.Tensor:
    """transformers' own logits at ``position`` from the whole checkpoint (the LM head on its own model)."""
    with torch.inference_mode():
        return model.lm_model(input_ids=torch.tensor([ids])).logits[0, position].float()


def check_table(frame, logits: torch.Tensor, k: int) -> None:
    probabilities = torch.softmax(logits.double(), -1)
    top = torch.topk(probabilities, k)
    assert list(frame.columns) == ["rank", "token", "id", "probability", "logit"]
    assert frame["rank"].tolist() == list(range(1, k + 1))
    assert frame["id"].tolist() == top.indices.tolist()
    np.testing.assert_allclose(frame["probability"], top.values.numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(frame["logit"], logits[top.indices].numpy(), rtol=1e-5, atol=1e-5)


# ---- predict ----
@pytest.mark.parametrize("name", ["smollm2", "gpt2"])
def test_predict_is_softmax_of_transformers_logits(name, request):
    model = request.getfixturevalue(name)
    frame = predict(model, PROMPT, k=7)
    ids = model.encode(PROMPT).input_ids
    check_table(frame, reference_logits(model, ids), 7)
    assert frame["token"].tolist() == [model.tokenizer.decode([i]) for i in frame["id"]]
    assert mc.predict is predict


def test_smollm2_knows_the_capital(smollm2):
    assert predict(smollm2, PROMPT, k=1)["token"].iloc[0].strip() == "Paris"


def test_masked_model_predicts_at_its_mask_or_a_chosen_position(bert):
    text = f"the cat {bert.tokenizer.mask_token} on the mat"
    encoded = bert.encode(text)
    where = encoded.input_ids.index(bert.tokenizer.mask_token_id)
    check_table(predict(bert, text, k=5), reference_logits(bert, encoded.input_ids, where), 5)
    check_table(predict(bert, text, k=5, position=2), reference_logits(bert, encoded.input_ids, 2), 5)
    with pytest.raises(InputTextError, match=r"no \[MASK\]"):
        predict(bert, "the cat sat on the mat")
    with pytest.raises(InputTextError, match="outside"):
        predict(bert, text, position=99)


def test_a_sentence_encoder_without_a_head_predicts_nothing():
    minilm = mc.load_model("minilm")
    with pytest.raises(HeadscopeError, match="no language-model head"):
        predict(minilm, "The cat sat.")
    assert minilm.run("The cat sat.", predict=True).metadata.get("prediction") is None


def test_bad_k_is_refused(gpt2):
    with pytest.raises(InputTextError, match="k must be"):
        predict(gpt2, PROMPT, k=0)


class PassCounter:
    """Counts the calls of the base transformers model (one per forward pass)."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.hf_model.register_forward_pre_hook(self.counted)

    def counted(self, module, args):
        self.count += 1

    def close(self):
        self.handle.remove()


@pytest.mark.parametrize("name", ["smollm2", "gpt2"])
def test_a_run_keeps_the_prediction_of_its_own_single_pass(name, request):
    model = request.getfixturevalue(name)
    counter = PassCounter(model)
    try:
        run = model.run(PROMPT, predict=True)
        assert counter.count == 1
    finally:
        counter.close()
    plain = model.run(PROMPT)
    np.testing.assert_array_equal(run.attentions, plain.attentions)  # keeping the logits changes no weight
    assert plain.metadata.get("prediction") is None
    frame = run_prediction(run, model.tokenizer, k=10)
    check_table(frame, reference_logits(model, run.metadata["token_ids"]), 10)
    assert run.metadata["prediction"]["position"] == run.num_tokens - 1
    # the run's file keeps it
    path = run.save(__import__("tempfile").mkdtemp() + "/run.npz")
    assert mc.AttentionRun.load(path).metadata["prediction"] == run.metadata["prediction"]


def test_the_core_engine_predicts_the_same(gpt2):
    core = predict(gpt2, PROMPT, k=5, engine="core")
    np.testing.assert_allclose(core["probability"], predict(gpt2, PROMPT, k=5)["probability"], rtol=1e-4)


def test_prediction_frame_cuts_to_k(gpt2):
    run = gpt2.run(PROMPT, predict=True)
    assert len(prediction_frame(gpt2.tokenizer, run.metadata["prediction"], 3)) == 3
    assert len(run.metadata["prediction"]["ids"]) == 50


# ---- sampling ----
def test_sampling_distribution_temperature_top_k_top_p():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    np.testing.assert_allclose(sampling_distribution(logits, 1.0), torch.softmax(logits, -1), rtol=1e-6)
    np.testing.assert_allclose(sampling_distribution(logits, 0.5), torch.softmax(logits / 0.5, -1), rtol=1e-6)
    assert sampling_distribution(logits, 0.0).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    p = torch.softmax(logits, -1)
    top2 = sampling_distribution(logits, 1.0, top_k=2)
    np.testing.assert_allclose(top2[:2], p[:2] / p[:2].sum(), rtol=1e-6)
    assert top2[2:].tolist() == [0.0, 0.0, 0.0]
    # nucleus: the smallest set of most likely tokens reaching p (here the first three: 0.56 + 0.21 < 0.85 <= + 0.13)
    cumulative = torch.cumsum(p, 0)
    assert cumulative[1] < 0.85 <= cumulative[2]
    nucleus = sampling_distribution(logits, 1.0, top_p=0.85)
    np.testing.assert_allclose(nucleus[:3], p[:3] / p[:3].sum(), rtol=1e-6)
    assert nucleus[3:].tolist() == [0.0, 0.0]
    for bad in ({"temperature": -1.0}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(InputTextError):
            sampling_distribution(logits, **{"temperature": 1.0, **bad})


# ---- generate ----
@pytest.mark.parametrize("name", ["smollm2", "gpt2"])
def test_greedy_equals_transformers_generate(name, request):
    model = request.getfixturevalue(name)
    ids = model.encode(PROMPT).input_ids
    with torch.inference_mode():
        expected = model.lm_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=model.pad_token_id,
        )[0, len(ids) :].tolist()
    run = generate(model, PROMPT, 8, temperature=0.0, stop=())
    assert run.metadata["token_ids"][len(ids) :] == expected
    assert run.metadata["generation"]["generated"] == list(range(len(ids), len(ids) + 8))
    assert mc.generate is generate


@pytest.mark.parametrize("name", ["smollm2", "gpt2"])
def test_written_run_equals_one_pass_over_the_final_sequence(name, request):
    model = request.getfixturevalue(name)
    run = generate(model, PROMPT, 6, temperature=1.0, top_k=20, seed=3, stop=())
    whole = model.run_ids(run.metadata["token_ids"])
    assert run.attentions.shape == whole.attentions.shape
    np.testing.assert_allclose(run.attentions, whole.attentions, atol=2e-5)
    assert run.tokens == whole.tokens
    # each step's distribution is the model's at the token before it (a pass over the prefix)
    for step in run.metadata["generation"]["steps"]:
        prefix = run.metadata["token_ids"][: step["position"]]
        probabilities = torch.softmax(reference_logits(model, prefix).double(), -1)
        assert step["chosen"] == run.metadata["token_ids"][step["position"]]
        assert step["chosen_probability"] == pytest.approx(float(probabilities[step["chosen"]]), rel=1e-3, abs=1e-6)
        np.testing.assert_allclose(step["probabilities"], probabilities[step["ids"]].numpy(), rtol=1e-3, atol=1e-6)
        assert step["ids"] == torch.topk(probabilities, 10).indices.tolist()
        assert 0 < step["chosen_sampling_probability"] <= 1


def test_the_same_seed_writes_the_same_tokens_and_more_tokens_extend_them(gpt2):
    five = generate(gpt2, PROMPT, 5, temperature=1.5, seed=11, stop=())
    six = generate(gpt2, PROMPT, 6, temperature=1.5, seed=11, stop=())
    assert six.metadata["token_ids"][: five.num_tokens] == five.metadata["token_ids"]
    np.testing.assert_allclose(six.attentions[:, :, : five.num_tokens, : five.num_tokens], five.attentions, atol=1e-6)
    seeds = {tuple(generate(gpt2, PROMPT, 5, temperature=1.5, seed=s, stop=()).metadata["token_ids"]) for s in range(4)}
    assert len(seeds) > 1  # a random model at temperature 1.5: four seeds do not all write the same


def test_a_stop_token_ends_the_text(gpt2):
    greedy = generate(gpt2, PROMPT, 6, temperature=0.0, stop=())
    start = greedy.metadata["generation"]["prompt_tokens"]
    third = greedy.metadata["token_ids"][start + 2]
    first_third = greedy.metadata["token_ids"][start:].index(third)
    stopped = generate(gpt2, PROMPT, 6, temperature=0.0, stop=[third])
    assert stopped.metadata["token_ids"] == greedy.metadata["token_ids"][: start + first_third + 1]
    assert stopped.metadata["generation"]["stopped"] == "stop token"
    assert greedy.metadata["generation"]["stopped"] == "maximum"
    assert stop_ids(gpt2, None) == (gpt2.tokenizer.eos_token_id,)
    assert stop_ids(gpt2, gpt2.tokenizer.eos_token) == (gpt2.tokenizer.eos_token_id,)
    with pytest.raises(InputTextError, match="not in"):
        stop_ids(gpt2, "no-such-token-anywhere")


def test_progress_counts_steps_and_raising_stops(gpt2):
    seen = []
    generate(gpt2, PROMPT, 3, stop=(), progress=lambda done, total, message: seen.append((done, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]

    class Stop(Exception):
        pass

    def stop_at_two(done, total, message):
        if done == 2:
            raise Stop

    with pytest.raises(Stop):
        generate(gpt2, PROMPT, 5, stop=(), progress=stop_at_two)
    assert generate(gpt2, PROMPT, 2, temperature=0.0, stop=()).num_tokens == len(gpt2.encode(PROMPT)) + 2


def test_the_model_limit_and_bad_requests(gpt2, bert):
    long_prompt = " ".join(["cat"] * (gpt2.max_tokens - 3))
    room = gpt2.max_tokens - len(gpt2.encode(long_prompt))
    run = generate(gpt2, long_prompt, 50, stop=())
    assert run.num_tokens == gpt2.max_tokens and run.metadata["generation"]["stopped"] == "length"
    assert len(run.metadata["generation"]["generated"]) == room
    with pytest.raises(InputTextError, match="max_new_tokens"):
        generate(gpt2, PROMPT, 1000)
    with pytest.raises(HeadscopeError, match="does not write"):
        generate(bert, "the cat", 2)


# ---- operations ----
def test_operations_run_the_same_and_describe_themselves(gpt2):
    operation = Prediction.of(gpt2, PROMPT, k=4)
    assert operation == Prediction.of(gpt2, PROMPT, k=4) and operation != Prediction.of(gpt2, PROMPT, k=5)
    assert operation.run(gpt2).equals(predict(gpt2, PROMPT, k=4))
    written = Generation.of(gpt2, PROMPT, max_new_tokens=3, temperature=0.7, seed=2)
    run = written.run(gpt2)
    assert run.metadata["token_ids"] == generate(gpt2, PROMPT, 3, temperature=0.7, seed=2).metadata["token_ids"]
    assert run.metadata["cache_key"] == written.key
    n = len(gpt2.encode(PROMPT)) + 3
    assert written.peak_bytes(gpt2) == pass_peak_bytes(gpt2.num_layers, gpt2.num_heads, n)
    assert written.progress_label == "Writing 3 tokens"
