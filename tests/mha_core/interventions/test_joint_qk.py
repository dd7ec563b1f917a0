"""The joint query-key view (``mha_core.joint_qk``): one head's queries and keys over a corpus in one 2-D projection.

The projection is recomputed here independently: the queries and keys read at the named points with
``run_with_cache``, rotated in the Llama case with transformers' own rotary code (checked against the model's own
scores), the scaling and translation written out in numpy, PCA by numpy's SVD; the coordinates must agree up to
each axis's sign. The claim that the scaling and translation change no attention weight is checked against the
weights the model itself computed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.interventions.joint_qk import JointQKError, encode_corpus, head_vectors, normalized
from mha_core.operations import JointQueryKey
from tests.model_fixtures import CORPUS, build_tiny_bert, build_tiny_gpt2, build_tiny_llama, build_tiny_mpnet

SENTENCES = CORPUS[:4]
# Coordinates are float64 projections of float32 vectors from a float32 pass in either engine; a wrong step (a
# key head off by one, a rotation missing, the translation on the wrong side) moves points by a large fraction of
# the cloud's size, float32 rounding by ~1e-6 of it.
RELATIVE_TOL = 1e-4
WEIGHT_TOL = 2e-5  # attention weights recomputed in float64 from float32 vectors, against float32 weights


def build(kind: str, path):
    if kind == "mpnet":
        return mc.load_model(str(build_tiny_mpnet(path)))
    builder = {"bert": build_tiny_bert, "gpt2": build_tiny_gpt2, "llama": build_tiny_llama}[kind]
    return mc.load_model(str(builder(path, randomised=True)))


@pytest.fixture(scope="module", params=["bert", "mpnet", "gpt2", "llama"])
def model(request, tmp_path_factory):
    return build(request.param, tmp_path_factory.mktemp(request.param))


def reference_vectors(model, text: str, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    """The head's queries and keys ``[n, e]`` (float64) read here: the named points, the key group of a
    grouped-query model, transformers' rotary embedding in a Llama model."""
    q_name, k_name = f"blocks.{layer}.attn.hook_q", f"blocks.{layer}.attn.hook_k"
    _, cache = model.run_with_cache(text, names=[q_name, k_name])
    queries, keys = cache[q_name][0], cache[k_name][0]  # [n, h, e], [n, kv, e]
    key_head = head * keys.shape[1] // queries.shape[1]
    q, k = queries[:, head], keys[:, key_head]
    if model.family == "llama":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

        config = model.hf_model.config
        positions = torch.arange(q.shape[0])[None]
        cos, sin = LlamaRotaryEmbedding(config)(q[None], positions)
        q, k = apply_rotary_pos_emb(q[None, None], k[None, None], cos, sin)
        q, k = q[0, 0], k[0, 0]
    return q.double().numpy(), k.double().numpy()


def reference_projection(model, texts, layer: int, head: int, normalize: bool = True) -> np.ndarray:
    """Every sentence's queries then every sentence's keys, scaled and translated as the docstring says, on the
    first two principal axes (numpy SVD)."""
    pairs = [reference_vectors(model, text, layer, head) for text in texts]
    q = np.concatenate([p[0] for p in pairs])
    k = np.concatenate([p[1] for p in pairs])
    if normalize:
        c = math.sqrt(np.linalg.norm(k, axis=1).mean() / np.linalg.norm(q, axis=1).mean())
        q, k = q * c, k / c
        k = k + (q.mean(axis=0) - k.mean(axis=0))
    points = np.concatenate([q, k])
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def assert_equal_up_to_sign(actual: np.ndarray, expected: np.ndarray) -> None:
    size = np.abs(expected).max()
    for axis in range(2):
        sign = np.sign(actual[:, axis] @ expected[:, axis])
        np.testing.assert_allclose(actual[:, axis], sign * expected[:, axis], atol=RELATIVE_TOL * size)


@pytest.mark.parametrize("normalize", [True, False])
def test_projection_equals_an_independent_pca(model, normalize):
    layer, head = model.num_layers - 1, model.num_heads - 1  # the last head: in Llama, the second key group
    view = mc.joint_qk(model, SENTENCES, layer, head, normalize=normalize)
    expected = reference_projection(model, SENTENCES, layer, head, normalize)
    assert_equal_up_to_sign(view.table[["x", "y"]].to_numpy(), expected)
    lengths = [len(model.encode(text)) for text in SENTENCES]
    assert len(view.table) == 2 * sum(lengths)
    assert list(view.table["kind"]) == ["query"] * sum(lengths) + ["key"] * sum(lengths)
    first = view.table[view.table["sentence"] == 0]
    assert list(first["position"][: lengths[0]]) == list(range(lengths[0]))
    assert list(first["token"][: lengths[0]]) == list(model.run(SENTENCES[0]).tokens)
    # The explained variance is the share of the two axes' squared singular values.
    centred = expected - expected.mean(axis=0)
    assert view.explained_variance[0] >= view.explained_variance[1] > 0
    assert sum(view.explained_variance) <= 1 + 1e-9
    assert view.explained_variance[0] == pytest.approx(
        (centred[:, 0] ** 2).sum() / total_variance(model, SENTENCES, layer, head, normalize), rel=1e-4
    )


def total_variance(model, texts, layer, head, normalize) -> float:
    pairs = [reference_vectors(model, text, layer, head) for text in texts]
    q, k = np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])
    if normalize:
        c = math.sqrt(np.linalg.norm(k, axis=1).mean() / np.linalg.norm(q, axis=1).mean())
        q, k = q * c, k / c
        k = k + (q.mean(axis=0) - k.mean(axis=0))
    points = np.concatenate([q, k])
    return float(((points - points.mean(axis=0)) ** 2).sum())


def test_the_sign_of_each_axis_is_fixed(model):
    """The largest loading of each axis is positive: the same corpus gives the same picture, in either engine."""
    view = mc.joint_qk(model, SENTENCES, 0, 0)
    again = mc.joint_qk(model, SENTENCES, 0, 0, engine="core")
    size = np.abs(view.table[["x", "y"]].to_numpy()).max()
    np.testing.assert_allclose(view.table[["x", "y"]], again.table[["x", "y"]], atol=RELATIVE_TOL * size)


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_scaling_and_translation_leave_every_attention_weight_unchanged(kind, tmp_path):
    """softmax(s * q_i . (k_j / c + t) * c) = softmax(s * q_i . k_j + s * c * q_i . t): a constant per row, which
    the softmax ignores. The weights recomputed from the moved vectors equal the model's own weights."""
    model = build(kind, tmp_path)
    layer, head = model.num_layers - 1, model.num_heads - 1
    texts = encode_corpus(model, SENTENCES)
    pairs = [head_vectors(model, text.encoded, layer, head) for text in texts]
    _, _, c, t = normalized(torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs]))
    assert float(t.norm()) > 1e-3  # the keys do move
    for text, (q, k) in zip(SENTENCES, pairs):
        run = model.run(text)
        weights = run.attentions[layer, head].astype(np.float64)
        n = q.shape[0]
        scale = 1 / math.sqrt(q.shape[1])
        visible = np.tril(np.ones((n, n), bool)) if model.is_causal else np.ones((n, n), bool)
        for moved_q, moved_k in ((q, k), (q * c, k / c + t)):
            scores = scale * moved_q.double().numpy() @ moved_k.double().numpy().T
            scores = np.where(visible, scores, -np.inf)
            recomputed = np.exp(scores - scores.max(axis=1, keepdims=True))
            recomputed /= recomputed.sum(axis=1, keepdims=True)
            np.testing.assert_allclose(recomputed, weights, atol=WEIGHT_TOL)
        # The moved scores differ from the original ones, by a constant per query row.
        shift = scale * (q * c).double().numpy() @ (k / c + t).double().numpy().T - scale * (q @ k.T).double().numpy()
        assert np.abs(shift).max() > 1e-4
        np.testing.assert_allclose(shift, shift[:, :1].repeat(n, axis=1), atol=1e-5)


def test_normalised_clouds_share_their_centre_and_mean_norm_before_translation():
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(50, 8, generator=generator) * 3 + 1
    keys = torch.randn(60, 8, generator=generator) * 0.5 - 2
    moved_q, moved_k, c, t = normalized(queries, keys)
    torch.testing.assert_close(moved_q.mean(0), moved_k.mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(moved_k, keys / c + t)
    torch.testing.assert_close(t, (queries * c).mean(0) - (keys / c).mean(0))
    assert float(moved_q.norm(dim=1).mean()) == pytest.approx(float((keys / c).norm(dim=1).mean()), rel=1e-5)
    assert c == pytest.approx(math.sqrt(float(keys.norm(dim=1).mean() / queries.norm(dim=1).mean())))


def test_pos_tags_come_from_the_trees(tmp_path):
    model = build("bert", tmp_path)
    tree = mc.Sentence(
        words=["the", "cat", "sat"], heads=[2, 3, 0], relations=["det", "nsubj", "root"], tags=["DET", "NOUN", "VERB"]
    )
    view = mc.joint_qk(model, [tree, "the dog"], 0, 1)
    table = view.table
    first = table[(table["sentence"] == 0) & (table["kind"] == "key")]
    assert list(first["token"]) == ["[CLS]", "the", "cat", "sat", "[SEP]"]
    assert list(first["pos"]) == ["", "DET", "NOUN", "VERB", ""]
    assert set(table[table["sentence"] == 1]["pos"]) == {""}  # a plain string has no tree
    assert view.context(0, 2) == (("[CLS]", "the", "cat", "sat", "[SEP]"), 2)
    assert view.sentence_texts == ("the cat sat", "the dog")


def test_max_points_cuts_the_corpus_in_order(tmp_path):
    model = build("gpt2", tmp_path)
    lengths = [len(model.encode(text)) for text in SENTENCES]
    cap = lengths[0] + 2
    view = mc.joint_qk(model, SENTENCES, 0, 0, max_points=cap)
    queries = view.table[view.table["kind"] == "query"]
    assert len(queries) == cap and len(view.table) == 2 * cap
    assert list(queries["sentence"]) == [0] * lengths[0] + [1, 1]
    assert list(queries["position"][-2:]) == [0, 1]
    assert len(view.sentence_tokens) == 2


def test_tsne_is_seeded_and_gives_every_point(tmp_path):
    model = build("bert", tmp_path)
    first = mc.joint_qk(model, SENTENCES[:2], 1, 0, method="tsne")
    again = mc.joint_qk(model, SENTENCES[:2], 1, 0, method="tsne")
    assert first.explained_variance is None
    assert np.isfinite(first.table[["x", "y"]].to_numpy()).all()
    np.testing.assert_allclose(first.table[["x", "y"]], again.table[["x", "y"]], rtol=1e-6, atol=1e-6)
    assert len(first.table) == 2 * sum(len(model.encode(text)) for text in SENTENCES[:2])


def test_clear_errors(tmp_path):
    model = build("bert", tmp_path)
    with pytest.raises(JointQKError, match="'pca', 'tsne'"):
        mc.joint_qk(model, SENTENCES, 0, 0, method="umap")
    with pytest.raises(JointQKError, match="Layer 9 is outside the model's 2 layers"):
        mc.joint_qk(model, SENTENCES, 9, 0)
    with pytest.raises(JointQKError, match="Head 4 is outside"):
        mc.joint_qk(model, SENTENCES, 0, 4)
    with pytest.raises(JointQKError, match="no sentences"):
        mc.joint_qk(model, [], 0, 0)
    with pytest.raises(JointQKError, match="at least 2"):
        mc.joint_qk(model, SENTENCES, 0, 0, max_points=1)


def test_the_operation_runs_the_view_and_bounds_its_memory(tmp_path):
    model = build("llama", tmp_path)
    op = JointQueryKey.of(model, SENTENCES, 1, 3, max_points=30)
    assert op == JointQueryKey.of(model, list(SENTENCES), 1, 3, max_points=30)
    assert op.key != JointQueryKey.of(model, SENTENCES, 1, 2, max_points=30).key
    assert op.key != JointQueryKey.of(model, SENTENCES[:3], 1, 3, max_points=30).key
    value = op.run(model)
    direct = mc.joint_qk(model, SENTENCES, 1, 3, max_points=30)
    np.testing.assert_allclose(value.table[["x", "y"]], direct.table[["x", "y"]], rtol=1e-9, atol=1e-12)
    # The estimate: the longest sentence's pass and the kept points; more points, more bytes.
    longest = max(len(model.encode(text)) for text in SENTENCES)
    from mha_core.operations.base import pass_peak_bytes

    assert op.peak_bytes(model) > pass_peak_bytes(model.num_layers, model.num_heads, longest)
    assert JointQueryKey.of(model, SENTENCES, 1, 3, max_points=60).peak_bytes(model) > op.peak_bytes(model)


# ---- real weights --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "mpnet", "smollm2"])
def test_real_models_projection_equals_an_independent_pca(name):
    model = mc.load_model(name)
    texts = ["The cat sat on the mat because it was tired.", "She gave him the book she had bought."]
    layer, head = model.num_layers // 2, model.num_heads - 1
    view = mc.joint_qk(model, texts, layer, head)
    assert_equal_up_to_sign(view.table[["x", "y"]].to_numpy(), reference_projection(model, texts, layer, head))
