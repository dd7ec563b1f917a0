"""OV and QK circuits, copying and previous-token scores, composition, path patching (``mha_core.interventions.qkov``,
``path_patching``).

The folded weights are checked against the model's own activations at the named points (a head's queries, keys,
values and output at two positions: their difference cancels every bias); the token circuits against the full
vocab x vocab matrix built here from the checkpoint's raw weights; the copying score's eigenvalue identity against
the full matrix's eigenvalues; composition against d x d products and norms taken by torch; path patching on
planted heads whose answer is known by construction, in both engines, and on SmolLM2's induction prompt.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.interventions import qkov
from mha_core.interventions.path_patching import path_patch
from mha_core.interventions.prompts import TASKS_BY_NAME
from mha_core.interventions.readout import CircuitError
from mha_core.operations import Composition, CopyingScores, OVCircuit, PathPatching, QKCircuit, prompt
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2, build_tiny_llama

# Folded weights against activations: float32 products over d = 32 of values ~1 (measured differences 1e-6).
ACT_TOL = dict(rtol=1e-4, atol=1e-4)
# Circuits in float32 against the full matrix computed here in float64.
CIRCUIT_TOL = dict(rtol=1e-4, atol=1e-4)


def build(path, kind: str, **overrides):
    builders = {"gpt2": build_tiny_gpt2, "llama": build_tiny_llama}
    untied = {"tie_word_embeddings": False} if kind == "llama" else {}
    return mc.load_model(str(builders[kind](path, head=True, randomised=True, **untied, **overrides)))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def decoder(request, tmp_path_factory):
    layers = {"num_hidden_layers": 3} if request.param == "llama" else {}  # the GPT-2 fixture has 2 layers
    return build(tmp_path_factory.mktemp(request.param), request.param, **layers)


def raw_head(model, layer: int, head: int) -> dict:
    """The checkpoint's own matrices of one head as ``[in, out]``, read here from the transformers modules (not
    through ``qkov``): W_Q, W_K, W_V (the KV head serving ``head``), W_O, the norm gain before the attention, and
    whether that norm centres (LayerNorm)."""
    base = model.hf_model
    if model.family == "gpt2":
        block = base.h[layer]
        e = block.attn.c_attn.weight.shape[1] // 3 // model.num_heads
        q, k, v = block.attn.c_attn.weight.detach().double().split(model.num_heads * e, dim=1)
        part = slice(head * e, (head + 1) * e)
        return dict(
            q=q[:, part],
            k=k[:, part],
            v=v[:, part],
            o=block.attn.c_proj.weight.detach().double()[part],
            gain=block.ln_1.weight.detach().double(),
            centre=True,
        )
    block = base.layers[layer]
    attention = block.self_attn
    e = attention.q_proj.weight.shape[0] // model.num_heads
    group = model.num_heads // model.hf_model.config.num_key_value_heads
    part, kv = slice(head * e, (head + 1) * e), slice((head // group) * e, (head // group + 1) * e)
    return dict(
        q=attention.q_proj.weight.detach().double()[part].t(),
        k=attention.k_proj.weight.detach().double()[kv].t(),
        v=attention.v_proj.weight.detach().double()[kv].t(),
        o=attention.o_proj.weight.detach().double()[:, part].t(),
        gain=block.input_layernorm.weight.detach().double(),
        centre=False,
    )


def folded(matrix: torch.Tensor, gain: torch.Tensor, centre: bool) -> torch.Tensor:
    """fold_ln by hand: (I - 11^T/d) diag(g) W for a LayerNorm, diag(g) W for an RMSNorm."""
    matrix = gain[:, None] * matrix
    if centre:
        d = matrix.shape[0]
        matrix = (torch.eye(d, dtype=matrix.dtype) - torch.full((d, d), 1.0 / d, dtype=matrix.dtype)) @ matrix
    return matrix


def unembedding(model) -> torch.Tensor:
    """W_U as ``[d, vocab]`` with the final norm's gain folded (centred for GPT-2's LayerNorm)."""
    head = model.lm_model.get_output_embeddings().weight.detach().double().t()
    norm = model.hf_model.ln_f if model.family == "gpt2" else model.hf_model.norm
    return folded(head, norm.weight.detach().double(), model.family == "gpt2")


# ---- the folded weights against the model's activations -------------------------------------------------------
def test_folded_weights_give_the_models_own_queries_keys_values_and_outputs(decoder):
    """(normalised input at i - at j) x folded W = (q_i - q_j), for every head's q, k, v, and (z_i - z_j) x W_O =
    (attention output_i - output_j) summed over heads: the biases cancel, the folded gain and centring do not."""
    weights = qkov.head_weights(decoder)
    names = [
        f"blocks.{layer}.{point}"
        for layer in range(decoder.num_layers)
        for point in (
            "ln1.hook_normalized",
            "attn.hook_q",
            "attn.hook_k",
            "attn.hook_v",
            "attn.hook_z",
            "hook_attn_out",
        )
    ]
    _, cache = decoder.run_with_cache("The cat sat on the mat and the dog", names=names)
    group = decoder.num_heads // cache["blocks.0.attn.hook_k"].shape[2]  # query heads per KV head
    for layer in range(decoder.num_layers):
        x = cache[f"blocks.{layer}.ln1.hook_normalized"][0]
        dx = x[1:] - x[:1]
        for head in range(decoder.num_heads):
            for point, matrix, index in (
                ("q", weights.w_q, head),
                ("k", weights.w_k, head // group),
                ("v", weights.w_v, head // group),
            ):
                actual = cache[f"blocks.{layer}.attn.hook_{point}"][0][:, index]
                torch.testing.assert_close(dx @ matrix[layer, head], actual[1:] - actual[:1], **ACT_TOL)
        z = cache[f"blocks.{layer}.attn.hook_z"][0]
        written = torch.einsum("nhe,hed->nd", z, weights.w_o[layer])
        out = cache[f"blocks.{layer}.hook_attn_out"][0]
        torch.testing.assert_close(written[1:] - written[:1], out[1:] - out[:1], **ACT_TOL)


# ---- token circuits against the full matrix ------------------------------------------------------------------
def full_ov(model, layer: int, head: int) -> torch.Tensor:
    raw = raw_head(model, layer, head)
    embedding = model.hf_model.get_input_embeddings().weight.detach().double()
    return embedding @ folded(raw["v"], raw["gain"], raw["centre"]) @ raw["o"] @ unembedding(model)


def full_qk(model, layer: int, head: int) -> torch.Tensor:
    raw = raw_head(model, layer, head)
    embedding = model.hf_model.get_input_embeddings().weight.detach().double()
    q = embedding @ folded(raw["q"], raw["gain"], raw["centre"])
    k = embedding @ folded(raw["k"], raw["gain"], raw["centre"])
    return q @ k.t() / math.sqrt(raw["q"].shape[1])


@pytest.mark.parametrize("layer, head", [(0, 1), (-1, 3)])
def test_ov_and_qk_circuits_are_the_top_entries_of_the_full_matrix(decoder, layer, head):
    layer = layer % decoder.num_layers
    ids = [5, 17, 120, 250]
    for circuit, full, column in ((qkov.ov_circuit, full_ov, "output_id"), (qkov.qk_circuit, full_qk, "key_id")):
        table = circuit(decoder, layer, head, k=7, tokens=ids)
        matrix = full(decoder, layer, head)
        for token in ids:
            rows = table[table["token_id"] == token]
            expected = matrix[token].topk(7)
            np.testing.assert_allclose(rows["value"].to_numpy(), expected.values.numpy(), **CIRCUIT_TOL)
            assert rows[column].tolist() == expected.indices.tolist()
            assert rows["rank"].tolist() == list(range(1, 8))
    self_rank = qkov.ov_circuit(decoder, layer, head, k=3, tokens=ids).attrs["self_rank"]
    ov = full_ov(decoder, layer, head)
    for token in ids:  # ranks among entries within float32 rounding of the token's own may differ
        own = ov[token, token]
        assert int((ov[token] > own + 1e-4).sum()) + 1 <= self_rank[token] <= int((ov[token] > own - 1e-4).sum()) + 1


def test_top_columns_over_chunks_equals_one_topk():
    generator = torch.Generator().manual_seed(3)
    left, right = torch.randn(5, 4, generator=generator), torch.randn(4, 1000, generator=generator)
    values, columns = qkov.top_columns(left, right, 9, chunk=64)
    expected = (left @ right).topk(9)
    torch.testing.assert_close(values, expected.values)
    assert torch.equal(columns, expected.indices)


def test_circuit_tokens_text_ids_and_one_token_strings(decoder):
    ids = decoder.tokenizer.encode(" the cat", add_special_tokens=False)
    assert qkov.circuit_tokens(decoder, " the cat") == list(dict.fromkeys(ids))
    with pytest.raises(qkov.QKOVError, match="from 0 to"):
        qkov.circuit_tokens(decoder, [10**6])
    with pytest.raises(qkov.QKOVError, match="layer must be"):
        qkov.ov_circuit(decoder, decoder.num_layers, 0)


# ---- copying --------------------------------------------------------------------------------------------------
def test_copying_score_from_the_small_product_equals_the_full_matrixs(decoder):
    """The e nonzero eigenvalues of the vocab x vocab OV circuit are those of the e x e product."""
    weights = qkov.head_weights(decoder)
    for layer, head in ((0, 0), (1, 2)):
        full = full_ov(decoder, layer, head).numpy()
        big = np.linalg.eigvals(full)
        big = big[np.abs(big) > 1e-6 * np.abs(big).max()]
        small = qkov.ov_eigenvalues(weights, layer, head)
        assert len(big) == len(small) == weights.d_head
        np.testing.assert_allclose(
            np.sort_complex(big), np.sort_complex(small), rtol=1e-3, atol=1e-3 * np.abs(big).max()
        )
        expected = np.real(big.sum()) / np.abs(big).sum()
        assert qkov.copying_score(small) == pytest.approx(expected, rel=1e-4, abs=1e-5)
    table = mc.copying_scores(decoder)
    assert len(table) == decoder.num_layers * decoder.num_heads
    assert table["copying"].between(-1, 1).all() and table["previous_token"].between(0, 1).all()


def test_copying_score_of_planted_circuits():
    """W_V W_O W_U W_E = +I copies (score 1), -I suppresses (-1), a rotation by 90 degrees in each plane 0."""
    assert qkov.copying_score(np.ones(4)) == 1.0
    assert qkov.copying_score(-np.ones(4)) == -1.0
    assert qkov.copying_score(np.array([1j, -1j, 2j, -2j])) == pytest.approx(0.0)


def test_previous_token_score_of_a_head_without_queries_is_uniform_attention(tmp_path):
    """W_Q = 0 makes every score 0: a causal head attends uniformly, 1/(i+1) on the previous token at position i."""
    model = build(tmp_path, "gpt2")
    weights = qkov.head_weights(model)
    weights.w_q[1, 2].zero_()
    scores = qkov.previous_token_scores(weights, length=10)
    assert scores[1, 2] == pytest.approx(np.mean([1 / (i + 1) for i in range(1, 10)]), rel=1e-6)


# ---- composition ----------------------------------------------------------------------------------------------
def test_composition_scores_equal_the_norms_of_the_d_by_d_products(decoder):
    """In float64 against torch's norms of the explicit d x d products; the table (float32) within 1e-3 of that."""
    weights = qkov.head_weights(decoder)
    table = mc.composition(decoder)
    assert len(table) == decoder.num_heads**2 * (decoder.num_layers * (decoder.num_layers - 1) // 2)
    w = {name: getattr(weights, f"w_{name}").double() for name in "qkvo"}
    exact = {mode: qkov.composition_scores(weights, mode, dtype=torch.float64) for mode in "qkv"}

    def score(a, b):
        return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))

    for row in table.sample(12, random_state=0).itertuples():
        sl, sh, rl, rh = row.sender_layer, row.sender_head, row.receiver_layer, row.receiver_head
        ov_a = w["v"][sl, sh] @ w["o"][sl, sh]
        qk_b = w["q"][rl, rh] @ w["k"][rl, rh].t()
        ov_b = w["v"][rl, rh] @ w["o"][rl, rh]
        expected = {"q": score(ov_a, qk_b), "k": score(ov_a, qk_b.t()), "v": score(ov_a, ov_b)}
        for mode in "qkv":
            assert exact[mode][sl, sh, rl, rh] == pytest.approx(expected[mode], rel=1e-9)
            assert getattr(row, mode) == pytest.approx(expected[mode], rel=1e-3)
            assert getattr(row, f"{mode}_excess") == pytest.approx(getattr(row, mode) - table.attrs["baseline"][mode])
    assert np.isnan(exact["q"][1, 0, 0, 0]) and np.isnan(exact["q"][1, 0, 1, 2])


def test_composition_baseline_is_the_mean_score_of_random_matrices():
    """Against explicit d x d products of other random draws: the same mean within a few standard errors."""
    generator = torch.Generator().manual_seed(11)
    d, e = 48, 8
    draws = []
    for _ in range(200):
        v, q, k = (torch.randn(d, e, generator=generator, dtype=torch.float64) for _ in range(3))
        o = torch.randn(e, d, generator=generator, dtype=torch.float64)
        ov, qk = v @ o, q @ k.t()
        draws.append(float(torch.linalg.norm(ov @ qk) / (torch.linalg.norm(ov) * torch.linalg.norm(qk))))
    spread = np.std(draws) / math.sqrt(len(draws)) + np.std(draws) / math.sqrt(qkov.BASELINE_DRAWS)
    assert qkov.composition_baseline(d, e, "q") == pytest.approx(np.mean(draws), abs=4 * spread)


# ---- path patching --------------------------------------------------------------------------------------------
CLEAN, CORRUPTED = "The cat sat on the mat.", "The dog sat on the mat."
# A path that carries nothing: the patched batch against the single clean run differ by float32 rounding of the
# logits (measured 1.4e-6 of the normalised score); a path that carries something moves it by 1e-2 or more here.
ZERO = 1e-4


def answer_foil(model) -> tuple[str, str]:
    words = [w for w in (" cat", " dog", " mat", " sat", " the", " on") if len(model.tokenizer.encode(w)) == 1]
    return words[0], words[1]


def test_path_patching_planted_heads(tmp_path):
    """Known by construction on a GPT-2 of 2 layers: a receiver whose queries are 0 (W_Q and b_Q zeroed) scores
    every key 0 whatever the keys, so nothing passes through its queries or its keys (score exactly 0) while its
    values carry the senders' change; a sender whose W_O is 0 writes nothing (0 through every input); a sender in
    the receiver's layer cannot reach it (NaN)."""
    model = build(tmp_path, "gpt2")
    attn = model.hf_model.h[1].attn
    e = attn.c_attn.weight.shape[1] // 3 // model.num_heads
    with torch.no_grad():
        attn.c_attn.weight[:, e : 2 * e] = 0  # head 1-1's queries
        attn.c_attn.bias[e : 2 * e] = 0
        model.hf_model.h[0].attn.c_proj.weight[3 * e : 4 * e] = 0  # head 0-3 writes nothing
    answer, foil = answer_foil(model)
    for engine in ("transformers", "core"):
        scores = {
            via: path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=[(1, 1)], via=via, engine=engine)
            for via in ("q", "k", "v")
        }
        for via in ("q", "k"):
            assert scores[via]["score"].iloc[:4].abs().max() < ZERO
        table = scores["v"].set_index(["layer", "head"])["score"]
        assert abs(table.loc[(0, 3)]) < ZERO
        assert (table.loc[[(0, 0), (0, 1), (0, 2)]].abs() > 10 * ZERO).all()
        assert table.loc[[(1, head) for head in range(4)]].isna().all()
    assert scores["v"].attrs["via"] == "v" and scores["v"].attrs["receivers"] == [(1, 1)]


def test_path_patching_engines_agree_and_one_sender_is_its_row_of_the_sweep(tmp_path):
    """A Llama of 3 layers with grouped KV heads: the sweep (in batches of 3) is the same in both engines, and one
    sender alone scores what its row of the sweep says."""
    model = build(tmp_path, "llama", num_hidden_layers=3)
    answer, foil = answer_foil(model)
    receivers = [(2, 0), (2, 3)]
    sweep = path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=receivers, via="k", batch_size=3)
    core = path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=receivers, via="k", engine="core")
    np.testing.assert_allclose(sweep["score"], core["score"], rtol=1e-3, atol=1e-4)
    one = path_patch(model, CLEAN, CORRUPTED, answer, foil, sender=(1, 2), receivers=receivers, via="k")
    assert len(one) == 1
    assert one["score"].iloc[0] == pytest.approx(
        sweep.set_index(["layer", "head"])["score"][(1, 2)], rel=1e-4, abs=1e-6
    )
    # Keys are per KV head (2 KV heads for 4 query heads): the table says which KV heads were patched.
    assert sweep.attrs["kv_heads"] == [(2, 0), (2, 1)]


def test_path_patching_refuses_bad_requests(tmp_path):
    model = build(tmp_path, "gpt2")
    answer, foil = answer_foil(model)
    with pytest.raises(CircuitError, match="through one of q, k, v"):
        path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=[(1, 0)], via="z")
    with pytest.raises(CircuitError, match="at least one receiver"):
        path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=[])
    with pytest.raises(CircuitError, match="outside"):
        path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=[(9, 0)])


def test_encoders_read_through_the_embedding_at_both_ends(tmp_path):
    """Dar et al. 2022: an encoder's OV circuit is E W_V W_O E^T (raw weights)."""
    model = mc.load_model(str(build_tiny_bert(tmp_path)))
    attention = model.hf_model.encoder.layer[1].attention
    e = attention.self.query.weight.shape[0] // model.num_heads
    part = slice(2 * e, 3 * e)
    embedding = model.hf_model.get_input_embeddings().weight.detach().double()
    w_v = attention.self.value.weight.detach().double()[part].t()
    w_o = attention.output.dense.weight.detach().double()[:, part].t()
    full = embedding @ w_v @ w_o @ embedding.t()
    table = qkov.ov_circuit(model, 1, 2, k=4, tokens=[7, 30])
    for token in (7, 30):
        assert table[table["token_id"] == token]["output_id"].tolist() == full[token].topk(4).indices.tolist()
    with pytest.raises(CircuitError, match="next-token"):
        path_patch(model, "a b", "a c", "a", "b", receivers=[(1, 0)])


# ---- operations --------------------------------------------------------------------------------------------------
def test_operations_run_the_library_functions(decoder):
    table = OVCircuit(decoder.name, 1, 2, tokens=(5, 17), k=3).run(decoder)
    assert table.equals(qkov.ov_circuit(decoder, 1, 2, k=3, tokens=[5, 17]))
    assert QKCircuit(decoder.name, 1, 2, tokens=(5,), k=3).run(decoder).equals(qkov.qk_circuit(decoder, 1, 2, 3, [5]))
    assert OVCircuit(decoder.name, 1, 2).key != QKCircuit(decoder.name, 1, 2).key
    assert CopyingScores(decoder.name).run(decoder).equals(mc.copying_scores(decoder))
    assert Composition(decoder.name).peak_bytes(decoder) > 0
    answer, foil = answer_foil(decoder)
    last = decoder.num_layers - 1
    op = PathPatching(decoder.name, prompt(decoder, CLEAN), prompt(decoder, CORRUPTED), answer, foil, ((last, 1),), "v")
    expected = path_patch(decoder, CLEAN, CORRUPTED, answer, foil, receivers=[(last, 1)], via="v")
    np.testing.assert_allclose(op.run(decoder)["score"], expected["score"], rtol=1e-5, atol=1e-6)
    assert op.peak_bytes(decoder) > 0 and op.work_class.value == "heavy"


# ---- SmolLM2 ----------------------------------------------------------------------------------------------------
INDUCTION_HEADS = [(17, 3), (17, 4), (18, 6), (18, 7)]  # docs/findings.md, section 3


@pytest.fixture(scope="module")
def smollm2():
    return mc.load_model("smollm2")


@pytest.mark.slow
def test_smollm2_previous_token_head_16_0_k_composes_with_the_induction_heads(smollm2):
    """docs/findings.md section 9: the previous-token head 16-0 (detector score 0.87) writes what the induction heads
    17-3, 17-4, 18-6, 18-7 read through their keys, about 4x the random baseline, and not what they read through
    their queries (about 1x)."""
    table = mc.composition(smollm2).set_index(["sender_layer", "sender_head", "receiver_layer", "receiver_head"])
    baseline = table.attrs["baseline"]
    for receiver in INDUCTION_HEADS:
        row = table.loc[(16, 0, *receiver)]
        assert row["k"] > 3 * baseline["k"], receiver
        assert row["q"] < 2 * baseline["q"], receiver


@pytest.mark.slow
def test_smollm2_induction_path_from_16_0_goes_through_keys_not_queries(smollm2):
    task = TASKS_BY_NAME["induction"]
    scores = {
        via: path_patch(
            smollm2,
            task.clean,
            task.corrupted,
            task.answer,
            task.foil,
            sender=(16, 0),
            receivers=INDUCTION_HEADS,
            via=via,
        )["score"].iloc[0]
        for via in ("q", "k")
    }
    assert abs(scores["k"]) > 3 * abs(scores["q"]), scores
