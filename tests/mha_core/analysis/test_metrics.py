"""head_metrics / head_distances / semantic_scores on hand-built attention with known answers."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from mha_core.analysis.metrics import classical_mds, connected_groups, head_distances, head_metrics, semantic_scores
from mha_core.run import AttentionRun, is_punctuation

N = 10


def make_run(heads, tokens=None, special=None, segments=None, causal=False) -> AttentionRun:
    """A run from ``[L, H, n, n]`` (or a list of [n, n] heads = one layer)."""
    attentions = np.asarray(heads, dtype=np.float32)
    if attentions.ndim == 3:
        attentions = attentions[None]
    n = attentions.shape[-1]
    tokens = tokens or ["[CLS]"] + [f"w{i}" for i in range(1, n - 1)] + ["[SEP]"]
    special = np.array([t in ("[CLS]", "[SEP]", "<s>") for t in tokens]) if special is None else np.asarray(special)
    return AttentionRun(
        model_name="hand",
        family="toy",
        is_causal=causal,
        tokens=tokens,
        attentions=attentions,
        special_mask=special,
        word_ids=np.where(special, -1, np.arange(n)),
        words=tokens,
        segment_ids=np.zeros(n, dtype=int) if segments is None else np.asarray(segments),
    )


def previous_token_head(n=N):
    head = np.zeros((n, n))
    head[np.arange(1, n), np.arange(n - 1)] = 1.0
    head[0, 0] = 1.0
    return head


def uniform_head(n=N):
    return np.full((n, n), 1.0 / n)


def cls_head(n=N):
    head = np.zeros((n, n))
    head[:, 0] = 1.0
    return head


def block_head(segments):
    segments = np.asarray(segments)
    same = (segments[:, None] == segments[None, :]).astype(float)
    return same / same.sum(axis=1, keepdims=True)


def test_previous_token_uniform_and_cls_heads_have_their_known_values():
    metrics = head_metrics(make_run([previous_token_head(), uniform_head(), cls_head()]))
    prev, uniform, cls = (metrics.iloc[i] for i in range(3))

    assert prev["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert prev["confidence"] == pytest.approx(1.0)
    assert prev["prev_token_mass"] == pytest.approx(1.0)  # queries 1..9, each all on i - 1
    assert prev["self_mass"] == pytest.approx(0.1)  # only query 0
    assert prev["next_token_mass"] == pytest.approx(0.0)
    assert prev["mean_distance"] == pytest.approx(0.9)  # nine queries at distance 1, one at 0
    assert prev["argmax_offset"] == -1 and prev["argmax_offset_share"] == pytest.approx(1.0)
    assert prev["special_mass"] == pytest.approx(0.2)  # query 0 -> [CLS], query 1 -> [CLS]
    assert prev["kovaleva_pattern"] == "diagonal" and prev["seed_pattern"] == "local"

    assert uniform["entropy"] == pytest.approx(math.log(N), rel=1e-6)
    assert uniform["normalized_entropy"] == pytest.approx(1.0, rel=1e-6)
    assert uniform["confidence"] == pytest.approx(0.1)
    assert uniform["mean_distance"] == pytest.approx(sum(abs(i - j) for i in range(N) for j in range(N)) / N**2)
    assert uniform["special_mass"] == pytest.approx(0.2)
    assert uniform["argmax_offset_share"] == pytest.approx(0.1)  # ties: the argmax is key 0 for every query
    assert uniform["seed_pattern"] == "uniform" and uniform["kovaleva_pattern"] == "heterogeneous"

    assert cls["special_mass"] == pytest.approx(1.0)
    assert cls["normalized_entropy"] == pytest.approx(0.0, abs=1e-6)
    assert cls["mean_distance"] == pytest.approx(np.mean(np.arange(N)))
    assert cls["vertical_mass"] == pytest.approx(1.0)
    assert cls["kovaleva_pattern"] == "vertical" and cls["seed_pattern"] == "sparse"


def test_block_head_on_a_sentence_pair():
    segments = [0] * 6 + [1] * 6
    metrics = head_metrics(make_run([block_head(segments), uniform_head(12)], segments=segments))
    assert metrics.loc[0, "same_segment_mass"] == pytest.approx(1.0)
    assert metrics.loc[0, "kovaleva_pattern"] == "block"
    assert metrics.loc[0, "normalized_entropy"] == pytest.approx(math.log(6) / math.log(12), rel=1e-6)
    assert metrics.loc[1, "same_segment_mass"] == pytest.approx(0.5)
    assert metrics.loc[1, "kovaleva_pattern"] != "block"


def test_causal_rows_normalise_by_the_keys_each_query_can_see():
    n = 8
    causal_uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    metrics = head_metrics(make_run([causal_uniform, previous_token_head(n)], causal=True))
    # Uniform over the i + 1 visible keys is maximal entropy for every query (query 0 has no choice: left out).
    assert metrics.loc[0, "normalized_entropy"] == pytest.approx(1.0, rel=1e-6)
    assert metrics.loc[0, "entropy"] == pytest.approx(np.mean(np.log(np.arange(1, n + 1))), rel=1e-6)
    assert np.isnan(metrics.loc[0, "next_token_mass"])  # no query of a decoder sees its next token
    assert metrics.loc[1, "argmax_offset"] == -1 and metrics.loc[1, "argmax_offset_share"] == pytest.approx(1.0)


def test_zero_rows_are_left_out():
    n = 8
    padded = np.zeros((2, n, n))
    padded[0, :6, :6] = previous_token_head(6)
    padded[1, :6, :6] = uniform_head(6)
    tokens = ["[CLS]", "a", "b", ",", "c", "[SEP]", "[PAD]", "[PAD]"]
    special = [True, False, False, False, False, True, True, True]
    full = head_metrics(make_run(padded, tokens=tokens, special=special))
    trimmed = head_metrics(make_run(padded[:, :6, :6], tokens=tokens[:6], special=special[:6]))
    numeric = full.select_dtypes("number").columns
    np.testing.assert_allclose(full[numeric].to_numpy(float), trimmed[numeric].to_numpy(float), rtol=1e-6, atol=1e-9)
    assert (full["num_queries"] == 6).all()
    assert full.loc[1, "normalized_entropy"] == pytest.approx(1.0, rel=1e-6)  # max entropy is log 6, not log 8
    assert full.loc[1, "punctuation_mass"] == pytest.approx(1 / 6)


# ---- a straightforward loop over heads and queries, as the reference -----------------------
def reference_metrics(run: AttentionRun) -> list[dict]:
    n = run.num_tokens
    punct = [is_punctuation(t) and not s for t, s in zip(run.tokens, run.special_mask)]
    rows_out = []
    for layer in range(run.num_layers):
        for head in range(run.num_heads):
            a = run.attentions[layer, head].astype(np.float64)
            stats = {
                k: []
                for k in ("entropy", "norm", "conf", "dist", "prev", "self", "next", "special", "punct", "segment")
            }
            offsets = []
            possible = Counter()
            for i in range(n):
                keys = [j for j in range(n) if (j <= i or not run.is_causal)]
                p = a[i] / a[i].sum()
                h = -sum(p[j] * math.log(p[j]) for j in keys if p[j] > 0)
                stats["entropy"].append(h)
                if len(keys) > 1:
                    stats["norm"].append(h / math.log(len(keys)))
                stats["conf"].append(p.max())
                stats["dist"].append(sum(p[j] * abs(i - j) for j in keys))
                for name, d in (("prev", -1), ("self", 0), ("next", 1)):
                    if i + d in keys:
                        stats[name].append(p[i + d])
                stats["special"].append(sum(p[j] for j in keys if run.special_mask[j]))
                stats["punct"].append(sum(p[j] for j in keys if punct[j]))
                stats["segment"].append(sum(p[j] for j in keys if run.segment_ids[j] == run.segment_ids[i]))
                offsets.append(int(np.argmax(p)) - i)
                for j in keys:
                    possible[j - i] += 1
            counts = Counter(offsets)
            best = max(counts.values())
            mode = min((d for d in counts if counts[d] == best), key=lambda d: (abs(d), d))
            rows_out.append(
                {
                    "entropy": np.mean(stats["entropy"]),
                    "normalized_entropy": np.mean(stats["norm"]),
                    "confidence": np.mean(stats["conf"]),
                    "mean_distance": np.mean(stats["dist"]),
                    "prev_token_mass": np.mean(stats["prev"]) if stats["prev"] else np.nan,
                    "self_mass": np.mean(stats["self"]),
                    "next_token_mass": np.mean(stats["next"]) if stats["next"] else np.nan,
                    "argmax_offset": mode,
                    "argmax_offset_share": counts[mode] / possible[mode],
                    "special_mass": np.mean(stats["special"]),
                    "punctuation_mass": np.mean(stats["punct"]),
                    "same_segment_mass": np.mean(stats["segment"]),
                }
            )
    return rows_out


@pytest.mark.parametrize("causal", [False, True])
def test_vectorised_metrics_equal_a_per_head_loop(causal):
    rng = np.random.default_rng(3)
    n, layers, heads = 9, 2, 3
    scores = rng.normal(size=(layers, heads, n, n)) * 3
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    tokens = ["[CLS]", "the", "cat", ",", "sat", "[SEP]", "on", "it", "[SEP]"]
    run = make_run(weights, tokens=tokens, segments=[0] * 6 + [1] * 3, causal=causal)
    ours = head_metrics(run)
    reference = reference_metrics(run)
    for column in reference[0]:
        np.testing.assert_allclose(
            ours[column].to_numpy(float), [r[column] for r in reference], rtol=1e-5, atol=1e-6, err_msg=column
        )


# ---- distances ------------------------------------------------------------------------------
def js_bits(p, q):
    m = [(a + b) / 2 for a, b in zip(p, q)]
    kl = lambda x, y: sum(a * math.log2(a / b) for a, b in zip(x, y) if a > 0)  # noqa: E731
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def test_js_distance_zero_for_identical_heads_and_hand_value_for_a_known_pair():
    n = 2
    identity = np.eye(n)
    swap = np.eye(n)[::-1]
    run = make_run([identity, identity.copy(), swap], tokens=["a", "b"], special=[False, False])
    result = head_distances(run)
    eps = 0.001 / n
    p = [(1 + eps) / 1.001, eps / 1.001]
    expected = js_bits(p, p[::-1])  # both query rows give the same divergence
    assert result.distances[0, 1] == pytest.approx(0.0, abs=1e-7)
    assert result.distances[0, 2] == pytest.approx(expected, rel=1e-4)
    assert result.distances[2, 1] == pytest.approx(expected, rel=1e-4)
    assert result.collapse_groups == [[(0, 0), (0, 1)]]
    assert result.layer_diversity[0] == pytest.approx(2 * expected / 3, rel=1e-4)


def test_js_distance_averages_over_queries_and_respects_the_causal_mask():
    n = 3
    causal_uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    diagonal = np.eye(n)
    run = make_run([causal_uniform, diagonal], tokens=["a", "b", "c"], special=[False] * 3, causal=True)
    result = head_distances(run)
    per_query = []
    for i in range(n):
        k = i + 1
        u = [(1 / k + 0.001 / k) / 1.001] * k
        d = [((1.0 if j == i else 0.0) + 0.001 / k) / 1.001 for j in range(k)]
        per_query.append(js_bits(u, d))
    assert result.distances[0, 1] == pytest.approx(np.mean(per_query), rel=1e-4)


def test_mds_recovers_distances_of_a_planar_configuration():
    points = np.array([[0, 0], [3, 0], [3, 4], [0, 4], [1.5, 2]], dtype=float)
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
    layout = classical_mds(distances)
    recovered = np.linalg.norm(layout[:, None] - layout[None], axis=-1)
    np.testing.assert_allclose(recovered, distances, atol=1e-9)


def test_head_distances_layout_shapes_and_layer_diversity():
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(6), size=(3, 4, 6))
    run = make_run(weights, tokens=list("abcdef"), special=[False] * 6)
    result = head_distances(run)
    assert result.distances.shape == (12, 12) and result.layout.shape == (12, 2)
    np.testing.assert_allclose(result.distances, result.distances.T)
    for layer in range(3):
        block = result.distances[layer * 4 : (layer + 1) * 4, layer * 4 : (layer + 1) * 4]
        assert result.layer_diversity[layer] == pytest.approx(block[np.triu_indices(4, 1)].mean())
    assert result.collapse_groups == []
    frame = result.layout_frame()
    assert list(frame.columns) == ["layer", "head", "x", "y"] and len(frame) == 12


# ---- semantic ---------------------------------------------------------------------------------
def test_semantic_correlation_matches_numpy_on_visible_non_special_pairs():
    rng = np.random.default_rng(1)
    n = 7
    embeddings = rng.normal(size=(n, 5))
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    cosine = unit @ unit.T
    follows_similarity = np.exp(4 * cosine)
    follows_similarity /= follows_similarity.sum(1, keepdims=True)
    random_head = rng.dirichlet(np.ones(n), size=n)
    tokens = ["[CLS]", "a", "b", "c", "d", "e", "[SEP]"]
    run = make_run([follows_similarity, random_head], tokens=tokens)
    result = semantic_scores(run, embeddings)
    pairs = [(i, j) for i in range(1, n - 1) for j in range(1, n - 1) if i != j]
    for head, weights in enumerate((follows_similarity, random_head)):
        expected = np.corrcoef([weights[i, j] for i, j in pairs], [cosine[i, j] for i, j in pairs])[0, 1]
        assert result.loc[head, "semantic_correlation"] == pytest.approx(expected, rel=1e-6)
    assert result.loc[0, "semantic_correlation"] > 0.7 > abs(result.loc[1, "semantic_correlation"])
    assert (result["num_pairs"] == len(pairs)).all()


def test_sampled_queries_average_over_the_chosen_rows_only():
    rng = np.random.default_rng(5)
    weights = rng.dirichlet(np.ones(8), size=(1, 3, 8))
    run = make_run(weights, tokens=list("abcdefgh"), special=[False] * 8)
    full = head_distances(run)
    sampled = head_distances(run, max_queries=3)  # rows 0, 4 (3.5 rounds to 4) and 7
    assert sampled.distances.shape == full.distances.shape
    assert not np.allclose(sampled.distances, full.distances)
    # Each kept row, alone in a run of its own (every query a copy of it), gives that row's divergence.
    per_row = []
    for i in (0, 4, 7):
        row_run = make_run(
            np.broadcast_to(weights[:, :, i : i + 1], (1, 3, 8, 8)).copy(), tokens=list("abcdefgh"), special=[False] * 8
        )
        per_row.append(head_distances(row_run).distances)
    np.testing.assert_allclose(sampled.distances, np.mean(per_row, axis=0), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_connected_groups_against_networkx(seed):
    import networkx as nx

    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((12, 12)) < 0.12, k=1)
    close = upper | upper.T
    graph = nx.Graph()
    graph.add_nodes_from(range(12))
    graph.add_edges_from(zip(*np.nonzero(upper)))
    expected = sorted(sorted(component) for component in nx.connected_components(graph) if len(component) >= 2)
    assert connected_groups(close) == expected
    assert connected_groups(np.zeros((3, 3), dtype=bool)) == []
