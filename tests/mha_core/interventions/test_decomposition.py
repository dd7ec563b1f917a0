"""The score decomposition: one head's (query, key) score split into (query source, key source) parts.

The parts must add up to the model's own score (read from the attention weights the pass returns: the difference
of two keys' scores is the difference of their log weights), in both engines, for every family the decomposition
knows (BERT, MPNet, GPT-2, Llama on small random checkpoints of two or three layers; MiniLM and SmolLM2 in the slow tests).
A first-layer head's parts are also computed here by hand from the weights (numpy), and a planted case (position
vectors and biases set to zero) must put the whole score on the (token embedding, token embedding) pair.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.interventions.readout import CircuitError
from mha_core.operations import Decomposition
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2, build_tiny_llama, build_tiny_mpnet

TEXT = "The cat sat on the mat."
# The parts are float64 sums of float32 activations; the model's score is a float32 dot product after ~3 layers of
# float32 arithmetic. A wrong part (a norm's scale unfrozen, a head's slice off by one, a missing bias) is off by
# 1e-2 of the score's size or more; float32 rounding by 1e-6 of it.
RELATIVE_TOL = 1e-4


def build(kind: str, path):
    # Three layers where the builder takes the count (the others' two: in BERT and MPNet layer 1's sources pass
    # through layer 0's two norms and the embeddings' norm).
    layers = {"llama": {"num_hidden_layers": 3}}.get(kind, {})
    if kind == "mpnet":
        return mc.load_model(str(build_tiny_mpnet(path)))
    builder = {"bert": build_tiny_bert, "gpt2": build_tiny_gpt2, "llama": build_tiny_llama}[kind]
    return mc.load_model(str(builder(path, randomised=True, **layers)))


@pytest.fixture(scope="module", params=["bert", "mpnet", "gpt2", "llama"])
def model(request, tmp_path_factory):
    return build(request.param, tmp_path_factory.mktemp(request.param))


def cells(model, n: int) -> list[tuple[int, int, int, int]]:
    """A few cells of every layer: the last query with several keys, a middle query with itself."""
    chosen = []
    for layer in range(model.num_layers):
        head = (layer + 1) % model.num_heads
        chosen += [(layer, head, n - 1, key) for key in (0, 1, n // 2, n - 1)]
        chosen.append((layer, head, n // 2, n // 2 if model.is_causal else n - 1))
    return chosen


def log_weight_gap(attentions: np.ndarray, cell, other_key: int) -> float:
    layer, head, query, key = cell
    row = attentions[layer, head, query].astype(np.float64)
    return float(np.log(row[key]) - np.log(row[other_key]))


@pytest.mark.parametrize("engine", ["transformers", "core"])
def test_parts_sum_to_the_models_score(model, engine):
    run, cache = model.run_with_cache(TEXT, names=lambda name: name.endswith("hook_attn_scores"), engine=engine)
    n = len(run.tokens)
    for cell in cells(model, n):
        layer, head, query, key = cell
        parts = mc.score_decomposition(model, TEXT, *cell, engine=engine)
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0, head].double()
        size = float(scores[torch.isfinite(scores)].abs().max())
        assert parts.total == pytest.approx(float(scores[query, key]), abs=RELATIVE_TOL * size)
        assert parts.score == pytest.approx(float(scores[query, key]), abs=RELATIVE_TOL * size)
        # Two keys' scores differ by the log of their weights' ratio (the softmax's normaliser cancels).
        other = 0
        gap = parts.total - mc.score_decomposition(model, TEXT, layer, head, query, other, engine=engine).total
        assert gap == pytest.approx(log_weight_gap(run.attentions, cell, other), abs=RELATIVE_TOL * size + 1e-4)
        assert parts.weight == pytest.approx(float(run.attentions[layer, head, query, key]), abs=1e-5)
        # The sides and the table are the same numbers, grouped.
        assert parts.side("query").sum() + parts.position_bias == pytest.approx(parts.total, rel=1e-9, abs=1e-9)
        assert parts.side("key").sum() + parts.position_bias == pytest.approx(parts.total, rel=1e-9, abs=1e-9)
        assert parts.table()["contribution"].sum() == pytest.approx(parts.total, rel=1e-9, abs=1e-9)


def test_several_cells_from_one_pass_equal_each_alone(model):
    from mha_core.interventions.decomposition import score_decompositions

    n = len(model.encode(TEXT).input_ids)
    chosen = [(1, 0, n - 1, 1), (0, 2, n - 2, 0), (1, 3, 2, 2)]
    together = score_decompositions(model, TEXT, chosen)
    assert [(p.layer, p.head, p.query, p.key) for p in together] == chosen
    for parts, cell in zip(together, chosen):
        alone = mc.score_decomposition(model, TEXT, *cell)
        np.testing.assert_allclose(parts.matrix, alone.matrix, rtol=1e-12, atol=1e-12)
        assert parts.score == alone.score and parts.sources == alone.sources


def test_sources_are_every_earlier_component(model):
    n = len(model.encode(TEXT).input_ids)
    layer = model.num_layers - 1
    parts = mc.score_decomposition(model, TEXT, layer, 0, n - 1, 1)
    kinds = [source[0] for source in parts.sources]
    assert kinds.count("head") == layer * model.num_heads
    assert kinds.count("mlp") == layer
    assert ("pos_embed" in kinds) == (model.family != "llama")  # rotary models have no position vectors
    assert ("segment" in kinds) == (model.family == "bert")
    assert kinds[:2] == ["biases", "embed"]
    assert parts.matrix.shape == (len(kinds), len(kinds))
    assert (parts.position_bias != 0.0) == (model.family == "mpnet")
    table = parts.table()
    assert len(table) == len(kinds) ** 2 + (model.family == "mpnet")
    magnitudes = table["contribution"].abs().to_numpy()
    assert np.all(magnitudes[:-1] >= magnitudes[1:])  # ranked


def test_grouped_keeps_the_largest_sources_and_the_sum(model):
    n = len(model.encode(TEXT).input_ids)
    parts = mc.score_decomposition(model, TEXT, model.num_layers - 1, 0, n - 1, 1)
    matrix, rows, columns = parts.grouped(top=3)
    assert matrix.shape == (4, 4) and rows[-1] == columns[-1] == "other sources"
    assert matrix.sum() == pytest.approx(parts.matrix.sum(), rel=1e-9, abs=1e-12)
    query_side, key_side = parts.side("query"), parts.side("key")
    assert set(rows[:-1]) == set(query_side.abs().nlargest(3).index)
    assert set(columns[:-1]) == set(key_side.abs().nlargest(3).index)
    labels = parts.labels
    i, j = labels.index(rows[0]), labels.index(columns[1])
    assert matrix[0, 1] == parts.matrix[i, j]
    whole, rows, columns = parts.grouped(top=len(labels))
    assert rows == columns == labels
    np.testing.assert_array_equal(whole, parts.matrix)


def test_a_first_layer_heads_parts_by_hand(tmp_path):
    """GPT-2, layer 0: the query is LN(token + position) W_Q + b_Q; every part written out with numpy."""
    model = build("gpt2", tmp_path)
    base = model.hf_model
    ids = model.encode(TEXT).input_ids
    query, key, head = len(ids) - 1, 2, 1
    parts = mc.score_decomposition(model, TEXT, 0, head, query, key)
    tokens = base.wte.weight.detach().double().numpy()
    positions = base.wpe.weight.detach().double().numpy()
    ln = base.h[0].ln_1
    gain, ln_bias, eps = ln.weight.detach().double().numpy(), ln.bias.detach().double().numpy(), ln.eps
    weight = base.h[0].attn.c_attn.weight.detach().double().numpy()  # Conv1D: [d, 3d]
    bias = base.h[0].attn.c_attn.bias.detach().double().numpy()
    d = tokens.shape[1]
    d_head = d // model.num_heads
    q_cols = slice(head * d_head, (head + 1) * d_head)
    k_cols = slice(d + head * d_head, d + (head + 1) * d_head)

    def side(position, columns):
        token, place = tokens[ids[position]], positions[position]
        total = token + place
        scale = np.sqrt(((total - total.mean()) ** 2).mean() + eps)
        by_source = {
            "token embedding": (token - token.mean()) / scale * gain @ weight[:, columns],
            "position embedding": (place - place.mean()) / scale * gain @ weight[:, columns],
            "biases": ln_bias @ weight[:, columns] + bias[columns],
        }
        return by_source

    queries, keys = side(query, q_cols), side(key, k_cols)
    table = parts.table().set_index(["query_source", "key_source"])["contribution"]
    for q_source, q_vector in queries.items():
        for k_source, k_vector in keys.items():
            expected = float(q_vector @ k_vector) / np.sqrt(d_head)
            assert table[(q_source, k_source)] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_a_planted_score_sits_on_the_token_pair(tmp_path):
    """With the position vectors and every bias at zero, the whole score is (token embedding, token embedding)."""
    model = build("gpt2", tmp_path)
    base = model.hf_model
    with torch.no_grad():
        base.wpe.weight.zero_()
        base.h[0].ln_1.bias.zero_()
        base.h[0].attn.c_attn.bias.zero_()
    n = len(model.encode(TEXT).input_ids)
    parts = mc.score_decomposition(model, TEXT, 0, 2, n - 1, 1)
    labels = parts.labels
    embed = labels.index("token embedding")
    assert abs(parts.score) > 1e-3
    assert parts.matrix[embed, embed] == pytest.approx(parts.score, rel=1e-5)
    rest = parts.matrix.copy()
    rest[embed, embed] = 0.0
    assert np.abs(rest).max() < 1e-6 * abs(parts.score) + 1e-9
    assert parts.top_source("query") == ("token embedding", pytest.approx(parts.score, rel=1e-5))
    assert "token embedding" in parts.why() and "token embedding" in parts.summary()[1]


def test_words(model):
    n = len(model.encode(TEXT).input_ids)
    parts = mc.score_decomposition(model, TEXT, model.num_layers - 1, 1, n - 1, 2)
    query_sentence, key_sentence = parts.summary()
    top_key, value = parts.top_source("key")
    assert key_sentence.startswith(f"The key side of {model.num_layers - 1}-1's score comes mostly from")
    assert top_key in key_sentence and f"{value:+.2f}" in key_sentence
    assert query_sentence.startswith("The query side")
    assert parts.why().startswith(f"Head {model.num_layers - 1}-1 looks from")
    assert "frozen" in parts.norm_words()


def test_the_sentence_for_a_class_names_the_two_largest_pairs(model):
    n = len(model.encode(TEXT).input_ids)
    layer, query, key = model.num_layers - 1, n - 1, 1
    parts = mc.score_decomposition(model, TEXT, layer, 0, query, key)
    tokens = parts.tokens
    assert (
        parts.question() == f"Why does head {layer}-0 look at '{tokens[key].strip()}' from '{tokens[query].strip()}'?"
    )
    # The two largest parts in magnitude, found here from the matrix and the position bias (MPNet's), not the table.
    values = np.append(parts.matrix.reshape(-1), parts.position_bias if parts.family == "mpnet" else [])
    first, second = np.argsort(-np.abs(values), kind="stable")[:2]
    count = len(parts.labels)

    def words(index: int) -> str:
        if index == count * count:
            return "its learned bias for that distance"
        query_source, key_source = parts.labels[index // count], parts.labels[index % count]
        phrase = {True: "head {}'s output", False: "the {}"}
        query_words = "{}'s output" if query_source.startswith("MLP") else phrase[query_source[0].isdigit()]
        key_words = "{}'s output" if key_source.startswith("MLP") else phrase[key_source[0].isdigit()]
        return (
            f"{query_words.format(query_source)} at '{tokens[query].strip()}' meeting "
            f"{key_words.format(key_source)} at '{tokens[key].strip()}'"
        )

    assert parts.why() == (
        f"Head {layer}-0 looks from '{tokens[query].strip()}' at '{tokens[key].strip()}' ({parts.weight:.0%} of its "
        f"attention): of its score {parts.score:.2f}, the largest part is {words(first)} ({values[first]:+.2f}), "
        f"the next {words(second)} ({values[second]:+.2f})."
    )


def test_bad_cells_are_clear_errors(tmp_path):
    decoder = build("gpt2", tmp_path)
    n = len(decoder.encode(TEXT).input_ids)
    with pytest.raises(CircuitError, match="comes after the query"):
        mc.score_decomposition(decoder, TEXT, 0, 0, 1, 3)
    with pytest.raises(CircuitError, match="outside the text's"):
        mc.score_decomposition(decoder, TEXT, 0, 0, n, 0)
    with pytest.raises(CircuitError, match="Layer 9 is outside"):
        mc.score_decomposition(decoder, TEXT, 9, 0, 1, 0)
    with pytest.raises(CircuitError, match="Head 7 is outside"):
        mc.score_decomposition(decoder, TEXT, 0, 7, 1, 0)


def test_the_operation_runs_the_library_function(model):
    encoded = model.encode(TEXT)
    op = Decomposition(model=model.name, text=encoded, layer=1, head=0, query=len(encoded) - 1, key_position=0)
    same = Decomposition(model=model.name, text=model.encode(TEXT), layer=1, head=0, query=op.query, key_position=0)
    assert op.key == same.key
    # Every field names the value: another layer, head, query or key is another cache entry.
    for change in ({"layer": 0}, {"head": 1}, {"query": op.query - 1}, {"key_position": 1}):
        other = dataclasses.replace(op, **change)
        assert other.key != op.key and other != op, change
    assert op.work_class is mc.operations.LIGHT
    assert op.peak_bytes(model) > 0
    value = op.run(model)
    direct = mc.score_decomposition(model, TEXT, 1, 0, op.query, 0)
    np.testing.assert_allclose(value.matrix, direct.matrix, rtol=1e-9, atol=1e-12)


# ---- real weights --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_real_models_parts_sum_to_the_score(name):
    model = mc.load_model(name)
    text = "The cat sat on the mat because the cat was tired."
    run, cache = model.run_with_cache(text, names=lambda point: point.endswith("hook_attn_scores"))
    n = len(run.tokens)
    for layer in (0, model.num_layers // 2, model.num_layers - 1):
        head = layer % model.num_heads
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0, head].double()
        size = float(scores[torch.isfinite(scores)].abs().max())
        for key in (0, 2, n - 2):
            parts = mc.score_decomposition(model, text, layer, head, n - 1, key)
            assert parts.total == pytest.approx(float(scores[n - 1, key]), abs=RELATIVE_TOL * size)
