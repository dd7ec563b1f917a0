"""Per-head measurements, computed at once over ``[layers, heads, n, n]``.

Every formula, threshold and source paper is in ``docs/metrics.md``. Conventions:

- A query row that sums to 0 (padding, a fully masked row) is left out of every average.
- A key is *visible* to query i when its token is real (its own row has mass in some head) and,
  for a causal model, when j <= i. Maximum entropy of query i is ``log(number of visible keys)``.
- Rows are divided by their total, so weights that do not sum exactly to 1 still give
  proportions.

``head_metrics`` and the profile's ``batch_head_metrics`` read the attention tensor in one compiled
pass (``mha_core.analysis.metrics_kernel``, numba, float32 weights); the rest is numpy (numpy, not torch: for
sentence-sized inputs torch's thread-pool start-up costs more than the arithmetic, and numpy's float32
log and einsum reductions are as fast or faster at n = 512; bench/metrics.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from ..run import AttentionRun, head_indices, per_head_frame

# A row with total below this is treated as all zeros.
ROW_EPS = 1e-6

# ---- pattern thresholds (docs/metrics.md explains each) ------------------------------------
KOVALEVA_VERTICAL_MIN = 0.6  # vertical: >= 60% of mass on the two most-attended key columns
KOVALEVA_DIAGONAL_MIN = 0.6  # diagonal: >= 60% of mass on offsets -1, 0, +1
KOVALEVA_MIXED_MIN = 0.6  # vertical+diagonal: the two together >= 60% ...
KOVALEVA_MIXED_EACH_MIN = 0.2  # ... with each of them >= 20%
KOVALEVA_BLOCK_MIN = 0.9  # block (two-segment input): >= 90% of mass inside the query's segment
KOVALEVA_VERTICAL_COLUMNS = 2  # how many key columns count as "vertical"

TUTORIAL_UNIFORM_MIN = 0.9  # uniform: normalised entropy >= 0.9
TUTORIAL_LOCAL_MIN = 0.6  # local: >= 60% of mass within |i - j| <= TUTORIAL_LOCAL_WINDOW
TUTORIAL_LOCAL_WINDOW = 2
TUTORIAL_SPARSE_MAX = 0.35  # sparse: normalised entropy <= 0.35 (and not local)

JS_SMOOTHING = 0.001  # Clark et al. 2019: add 0.001 / n to every weight of a row
COLLAPSE_MAX_DISTANCE = 0.01  # collapse: heads whose mean JS divergence is below 0.01 bit

METRIC_COLUMNS = [
    "layer",
    "head",
    "num_queries",
    "entropy",
    "normalized_entropy",
    "confidence",
    "mean_distance",
    "prev_token_mass",
    "self_mass",
    "next_token_mass",
    "argmax_offset",
    "argmax_offset_share",
    "special_mass",
    "sink_mass",
    "punctuation_mass",
    "same_segment_mass",
    "diagonal_mass",
    "vertical_mass",
    "local_mass",
    "kovaleva_pattern",
    "seed_pattern",
    # What the role statistics (mha_core.analysis.roles) need: spreads over query rows, what uniform attention or a
    # random argmax would give, and how many queries the positional share counts.
    "normalized_entropy_sd",
    "sink_mass_sd",
    "sink_mass_uniform",
    "punctuation_mass_sd",
    "punctuation_mass_uniform",
    "argmax_offset_queries",
    "argmax_offset_chance",
]
# Every column in words, for people who have not read the papers (the app's labels and glossary).
METRIC_DESCRIPTIONS = {
    "num_queries": "query tokens measured (rows with any attention)",
    "entropy": "spread of attention, in nats (0 = all on one token)",
    "normalized_entropy": "spread of attention, 0 = all on one token, 1 = even over every visible token",
    "confidence": "largest weight of a row: how much the top token gets",
    "mean_distance": "average distance, in tokens, between a token and what it attends to",
    "prev_token_mass": "attention on the token just before",
    "self_mass": "attention on the token itself",
    "next_token_mass": "attention on the token just after",
    "argmax_offset": "the offset (key minus query position) that most often gets the largest weight",
    "argmax_offset_share": "how often the largest weight is at that offset",
    "special_mass": "attention on special tokens ([CLS], [SEP], BOS)",
    "sink_mass": "attention on positions of no content (special tokens and the first token): a sink",
    "punctuation_mass": "attention on punctuation",
    "same_segment_mass": "attention that stays inside the query's own sentence of a pair",
    "diagonal_mass": "attention within one token of the query (previous, self, next)",
    "vertical_mass": "attention on the two tokens the whole head looks at most (a 'vertical' stripe)",
    "local_mass": "attention within two tokens of the query",
    "kovaleva_pattern": "pattern class of Kovaleva et al. 2019 (vertical, diagonal, block, ...)",
    "seed_pattern": "pattern class of the tutorials (local, global, sparse, uniform)",
    "normalized_entropy_sd": "spread of the normalised entropy over the queries (or sentences)",
    "sink_mass_sd": "spread of the sink attention over the queries (or sentences)",
    "sink_mass_uniform": "sink attention that attention spread evenly would give",
    "punctuation_mass_sd": "spread of the punctuation attention over the queries (or sentences)",
    "punctuation_mass_uniform": "punctuation attention that attention spread evenly would give",
    "argmax_offset_queries": "queries for which the positional offset exists",
    "argmax_offset_chance": "how often a random choice of key would land on that offset",
}
# batch_head_metrics' columns, in the order it returns them.
_BATCH_COLUMNS = (
    *(name for name in METRIC_COLUMNS[2:] if not name.endswith("_pattern")),
    "kovaleva_pattern",
    "seed_pattern",
)
KOVALEVA_PATTERNS = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")  # in test order
TUTORIAL_PATTERNS = ("uniform", "local", "sparse", "global")  # in test order


# ---- masks --------------------------------------------------------------------------------
def token_is_real(attentions: np.ndarray) -> np.ndarray:
    """bool ``[n]``: the token's own query row has mass in at least one head (not padding)."""
    row_total = attentions.sum(axis=-1)
    return (row_total > ROW_EPS).any(axis=(0, 1))


def visible_keys(num_tokens: int, is_causal: bool, real_tokens: np.ndarray | None = None) -> np.ndarray:
    """bool ``[n, n]``: True where query i can see key j."""
    visible = np.ones((num_tokens, num_tokens), dtype=bool)
    if is_causal:
        visible = np.tril(visible)
    if real_tokens is not None:
        visible &= real_tokens[None, :]
    return visible


def _rows_x_log_x(attentions: np.ndarray, block_rows: int = 4096) -> np.ndarray:
    """``sum_j a_ij ln a_ij`` for every row of ``[..., n]`` (0 ln 0 = 0), float32.

    The log goes through one small reused buffer, a block of rows at a time, instead of a temporary
    as large as the whole tensor: about a third faster at 144 heads x 512 tokens (cache, no page faults).
    """
    n = attentions.shape[-1]
    flat = attentions.reshape(-1, n)
    out = np.empty(flat.shape[0], dtype=np.float32)
    buffer = np.empty((min(block_rows, flat.shape[0]), n), dtype=np.float32)
    for start in range(0, flat.shape[0], block_rows):
        block = flat[start : start + block_rows]
        logs = buffer[: len(block)]
        np.maximum(block, np.float32(1e-30), out=logs)
        np.log(logs, out=logs)
        out[start : start + block_rows] = np.einsum("rj,rj->r", block, logs)
    return out.reshape(attentions.shape[:-1])


# ---- head_metrics -------------------------------------------------------------------------
def head_metrics(run: AttentionRun) -> pd.DataFrame:
    """One row per (layer, head) with every measurement of docs/metrics.md."""
    columns = batch_head_metrics(
        run.attentions[None], run.special_mask[None], run.punctuation_mask[None], run.segment_ids[None], run.is_causal
    )
    num_layers, num_heads = run.num_layers, run.num_heads
    columns = {name: values[0] for name, values in columns.items()}
    if run.norms is not None:
        columns.update(norm_metrics(run))
    return per_head_frame(num_layers, num_heads, **columns)


def norm_metrics(run: AttentionRun) -> dict[str, np.ndarray]:
    """Per head ``[L, H]``, for a run made with ``norms=True`` (Kobayashi et al. 2020):

    value_norm          mean over tokens of ||f_h(x_j)||, the size of what the head can move
    output_norm         mean over query tokens of ||sum_j alpha_ij f_h(x_j)||, what it does move
    special_weight      mean over queries of the attention weight on special tokens ([CLS], [SEP], BOS)
    special_norm_share  mean over queries of the special tokens' share of sum_j ||alpha_ij f_h(x_j)||
    """
    special = run.special_mask
    norm_totals = run.norms.sum(axis=-1)
    share = np.divide(
        run.norms[..., special].sum(axis=-1), norm_totals, out=np.zeros_like(norm_totals), where=norm_totals > 0
    )
    return {
        "value_norm": run.value_norms.mean(axis=-1),
        "output_norm": run.output_norms.mean(axis=-1),
        "special_weight": run.attentions[..., special].sum(axis=-1).mean(axis=-1),
        "special_norm_share": share.mean(axis=-1),
    }


def warm_up() -> None:
    """Compile the metrics kernel now, or load it from numba's on-disk cache (about 4 s the first time on a
    machine, 0.5 s after), so that the first measurement does not wait for it (a server calls this in a
    background thread when it starts)."""
    attention = np.full((1, 1, 1, 2, 2), 0.5, dtype=np.float32)
    batch_head_metrics(attention, np.zeros((1, 2), bool), np.zeros((1, 2), bool), np.zeros((1, 2), np.int64), False)


def batch_head_metrics(
    attentions: np.ndarray,
    special_mask: np.ndarray,
    punctuation_mask: np.ndarray,
    segment_ids: np.ndarray,
    is_causal: bool,
) -> dict[str, np.ndarray]:
    """``head_metrics`` of B sentences at once: every ``METRIC_COLUMNS`` entry but layer and head, as ``[B, L*H]``.

    ``attentions [B, L, H, n, n]`` holds each sentence padded to the batch's n with all-zero rows and
    columns (the padding then counts as neither query nor key, as in a trimmed run); the masks
    ``[B, n]`` mark each sentence's special and punctuation tokens and its segments. One compiled pass
    over the tensor (``mha_core.analysis.metrics_kernel``, imported here so that ``import mha_core`` does not load numba),
    which reads float32 weights (float64 attentions are rounded to float32 first).
    """
    from . import metrics_kernel  # numba: compiled on first use

    attentions = np.ascontiguousarray(attentions, dtype=np.float32)  # one compiled kernel (float32)
    batch, num_layers, num_heads = attentions.shape[:3]
    special = np.asarray(special_mask, dtype=bool)
    # A sink: a position that carries no word of the text's content, where heads park attention they
    # do not use (Clark et al. 2019 on [SEP]; Xiao et al. 2023 on the first token of a decoder).
    sinks = special.copy()
    sinks[:, 0] = True
    segment_ids = np.ascontiguousarray(segment_ids, dtype=np.int64)
    out = np.empty((len(metrics_kernel.FLOAT_COLUMNS), batch, num_layers, num_heads))
    out_int = np.empty((len(metrics_kernel.INT_COLUMNS), batch, num_layers, num_heads), dtype=np.int64)
    real = metrics_kernel.measure_batch(
        attentions=attentions,
        special=special.astype(np.float64),
        sinks=sinks.astype(np.float64),
        punctuation=np.asarray(punctuation_mask, dtype=bool).astype(np.float64),
        segment_ids=segment_ids,
        is_causal=bool(is_causal),
        row_eps=ROW_EPS,
        local_window=TUTORIAL_LOCAL_WINDOW,
        vertical_columns=KOVALEVA_VERTICAL_COLUMNS,
        out=out,
        out_int=out_int,
    )
    columns = {
        name: values.reshape(batch, num_layers * num_heads) for name, values in zip(metrics_kernel.FLOAT_COLUMNS, out)
    }
    columns.update(
        {
            name: values.reshape(batch, num_layers * num_heads)
            for name, values in zip(metrics_kernel.INT_COLUMNS, out_int)
        }
    )
    real_segments = np.where(real, segment_ids, -1)
    num_segments = np.zeros(batch, dtype=np.int64)
    for segment in np.unique(real_segments[real_segments >= 0]):  # one or two
        num_segments += (real_segments == segment).any(axis=-1)
    columns["kovaleva_pattern"] = kovaleva_pattern(
        columns["vertical_mass"],
        columns.pop("diagonal_only_mass"),
        columns["same_segment_mass"],
        num_segments=num_segments[:, None],
    )
    columns["seed_pattern"] = tutorial_pattern(columns["normalized_entropy"], columns["local_mass"])
    return {name: columns[name] for name in _BATCH_COLUMNS}


def kovaleva_pattern(
    vertical: np.ndarray, diagonal: np.ndarray, same_segment: np.ndarray, num_segments: int | np.ndarray
) -> np.ndarray:
    """Kovaleva et al. 2019's five classes from the (disjoint) vertical and diagonal masses."""
    vertical = np.nan_to_num(np.asarray(vertical, dtype=float))
    diagonal = np.nan_to_num(np.asarray(diagonal, dtype=float))
    same_segment = np.nan_to_num(np.asarray(same_segment, dtype=float))
    mixed = (
        (vertical + diagonal >= KOVALEVA_MIXED_MIN)
        & (vertical >= KOVALEVA_MIXED_EACH_MIN)
        & (diagonal >= KOVALEVA_MIXED_EACH_MIN)
    )
    block = (num_segments >= 2) & (same_segment >= KOVALEVA_BLOCK_MIN)
    return np.select(
        [vertical >= KOVALEVA_VERTICAL_MIN, diagonal >= KOVALEVA_DIAGONAL_MIN, mixed, block],
        KOVALEVA_PATTERNS[:-1],
        default=KOVALEVA_PATTERNS[-1],
    ).astype(object)


def tutorial_pattern(normalized_entropy: np.ndarray, local_mass: np.ndarray) -> np.ndarray:
    """The seeds' four patterns: uniform, local, sparse, otherwise global."""
    normalized_entropy = np.asarray(normalized_entropy, dtype=float)
    local_mass = np.nan_to_num(np.asarray(local_mass, dtype=float))
    return np.select(
        [
            normalized_entropy >= TUTORIAL_UNIFORM_MIN,
            local_mass >= TUTORIAL_LOCAL_MIN,
            normalized_entropy <= TUTORIAL_SPARSE_MAX,
        ],
        TUTORIAL_PATTERNS[:-1],
        default=TUTORIAL_PATTERNS[-1],
    ).astype(object)


# ---- head_distances -----------------------------------------------------------------------
@dataclass
class HeadDistances:
    """Distances between every pair of heads of one run and what follows from them.

    distances        ``[L*H, L*H]`` mean over query tokens of the Jensen-Shannon divergence (bits, 0..1)
    layout           ``[L*H, 2]`` classical MDS of ``distances``
    layer_diversity  ``[L]`` mean distance over the pairs of heads within each layer
    collapse_groups  groups (size >= 2) of heads whose patterns are near-identical, as (layer, head) pairs
    """

    layer: np.ndarray
    head: np.ndarray
    distances: np.ndarray
    layout: np.ndarray
    layer_diversity: np.ndarray
    collapse_groups: list[list[tuple[int, int]]] = field(default_factory=list)
    collapse_threshold: float = COLLAPSE_MAX_DISTANCE

    def layout_frame(self) -> pd.DataFrame:
        """layer, head, x, y: one row per head."""
        return pd.DataFrame({"layer": self.layer, "head": self.head, "x": self.layout[:, 0], "y": self.layout[:, 1]})

    def layer_spread(self) -> pd.DataFrame:
        """layer, head, distance_to_layer: each head's mean distance to the other heads of its layer
        (the mean of these over a layer is ``layer_diversity``)."""
        return pd.DataFrame(
            {
                "layer": self.layer,
                "head": self.head,
                "distance_to_layer": distance_to_own_layer(self.distances, self.layer),
            }
        )


def distance_to_own_layer(distances: np.ndarray, layer_of: np.ndarray) -> np.ndarray:
    """``[L*H]``: each head's mean distance to the other heads of its layer (NaN for a layer of one head)."""
    same = (layer_of[:, None] == layer_of[None, :]) & ~np.eye(len(layer_of), dtype=bool)
    count = same.sum(axis=1)
    total = np.where(same, distances, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def query_sample(query_valid: np.ndarray, max_queries: int | None) -> np.ndarray:
    """Indices of the query rows to use: all valid ones, or ``max_queries`` of them evenly spaced."""
    valid = np.flatnonzero(query_valid)
    if max_queries is None or len(valid) <= max_queries:
        return valid
    return valid[np.unique(np.linspace(0, len(valid) - 1, max_queries).round().astype(int))]


def smoothed_rows(run: AttentionRun, max_queries: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows normalised and smoothed as in Clark et al. 2019: p + 0.001 / k over the k visible keys,
    renormalised. Returns ``([L*H, q, n] float32, query_valid [q])`` for the q query rows kept."""
    num_layers, num_heads, n, _ = run.attentions.shape
    real = token_is_real(run.attentions)
    visible = visible_keys(n, run.is_causal, real)
    keep = np.arange(n) if max_queries is None else query_sample(real, max_queries)
    attn = run.attentions[:, :, keep]
    visible, real = visible[keep], real[keep]
    row_total = attn.sum(axis=-1, keepdims=True)
    rows = attn / np.where(row_total > ROW_EPS, row_total, 1.0).astype(np.float32)
    smoothing = (visible / np.maximum(visible.sum(axis=1, keepdims=True), 1)).astype(np.float32)
    rows += np.float32(JS_SMOOTHING) * smoothing
    rows /= np.maximum(rows.sum(axis=-1, keepdims=True), np.float32(ROW_EPS))
    return rows.reshape(num_layers * num_heads, len(keep), n), real


def js_distance_matrix(rows: np.ndarray, query_valid: np.ndarray, pair_block_bytes: int = 4 << 20) -> np.ndarray:
    """Mean over valid queries of JS(p, q) in bits for every pair of heads.

    With s = p + q and m = s / 2:  JS(p, q) = H(m) - (H(p) + H(q)) / 2  and
    H(m) = ln 2 - (1/2) sum s ln s  (because sum s = 2), so only sum s ln s needs the pair.
    Pairs run in blocks of about 4 MB (cache-sized: a third of the time of 32 MB blocks; the blocks
    cut the pair list, not the heads).
    """
    num_heads = rows.shape[0]
    valid = query_valid.astype(np.float64)
    num_valid = max(float(valid.sum()), 1.0)
    row_entropy = -_rows_x_log_x(rows).astype(np.float64)  # [heads, q]
    first, second = np.triu_indices(num_heads, k=1)
    block = max(1, pair_block_bytes // max(1, rows[0].nbytes))
    divergence = np.zeros(len(first), dtype=np.float64)
    for start in range(0, len(first), block):
        a, b = first[start : start + block], second[start : start + block]
        pair_sum = rows[a]
        pair_sum += rows[b]  # s = p + q, [pairs, q, n]
        # Keys a causal mask hides are exactly 0 in both heads, and 0 ln 0 = 0.
        js_rows = np.log(2) - 0.5 * _rows_x_log_x(pair_sum) - 0.5 * (row_entropy[a] + row_entropy[b])
        divergence[start : start + block] = (np.maximum(js_rows, 0) * valid).sum(axis=-1) / num_valid
    distances = np.zeros((num_heads, num_heads), dtype=np.float64)
    distances[first, second] = divergence / np.log(2)
    distances[second, first] = distances[first, second]
    return distances


def classical_mds(distances: np.ndarray, dims: int = 2) -> np.ndarray:
    """Classical (Torgerson) MDS: B = -1/2 J D^2 J, coordinates = top eigenvectors * sqrt(eigenvalues)."""
    distances = np.asarray(distances, dtype=np.float64)
    count = distances.shape[0]
    centering = np.eye(count) - np.full((count, count), 1.0 / count)
    gram = -0.5 * centering @ (distances**2) @ centering
    eigenvalues, eigenvectors = np.linalg.eigh((gram + gram.T) / 2)
    order = np.argsort(eigenvalues)[::-1][:dims]
    coords = eigenvectors[:, order] * np.sqrt(np.clip(eigenvalues[order], 0, None))
    # Fix each axis's sign so the layout does not flip between runs.
    signs = np.sign(coords[np.abs(coords).argmax(axis=0), np.arange(coords.shape[1])])
    coords = coords * np.where(signs == 0, 1, signs)
    if coords.shape[1] < dims:
        coords = np.pad(coords, ((0, 0), (0, dims - coords.shape[1])))
    return coords


def connected_groups(close: np.ndarray) -> list[list[int]]:
    """Connected components (size >= 2) of a symmetric boolean adjacency matrix, each in ascending order,
    ordered by their first member."""
    _, labels = connected_components(csr_matrix(np.asarray(close, dtype=bool)), directed=False)
    groups = [np.flatnonzero(labels == label).tolist() for label in np.unique(labels)]
    return sorted((group for group in groups if len(group) >= 2), key=lambda group: group[0])


def head_distances(
    run: AttentionRun, collapse_threshold: float = COLLAPSE_MAX_DISTANCE, max_queries: int | None = None
) -> HeadDistances:
    """Clark et al. 2019 head distances, their MDS layout, per-layer diversity and collapse groups.

    The cost is (number of head pairs) x n^2; ``max_queries`` averages over that many evenly spaced
    query rows instead of all of them (an estimate, for long texts).
    """
    num_layers, num_heads = run.num_layers, run.num_heads
    rows, query_valid = smoothed_rows(run, max_queries)
    distances = js_distance_matrix(rows, query_valid)
    layer_of, head_of = head_indices(num_layers, num_heads)
    # Every head of a layer has the same number of partners, so the mean of their spreads is the
    # mean over the layer's pairs.
    spread = distance_to_own_layer(distances, layer_of).reshape(num_layers, num_heads)
    diversity = spread.mean(axis=1) if num_heads > 1 else np.full(num_layers, np.nan)
    close = (distances < collapse_threshold) & ~np.eye(len(layer_of), dtype=bool)
    groups = [[(int(layer_of[i]), int(head_of[i])) for i in group] for group in connected_groups(close)]
    return HeadDistances(
        layer=layer_of,
        head=head_of,
        distances=distances,
        layout=classical_mds(distances),
        layer_diversity=diversity,
        collapse_groups=groups,
        collapse_threshold=collapse_threshold,
    )


# ---- semantic similarity ------------------------------------------------------------------
def semantic_scores(run: AttentionRun, embeddings: np.ndarray) -> pd.DataFrame:
    """Pearson correlation, per head, between a_ij and cos(e_i, e_j) of the model's input embeddings.

    Pairs used: i != j, both tokens real and not special, key visible to the query.
    """
    embeddings = np.asarray(embeddings, dtype=np.float64)
    num_layers, num_heads, n, _ = run.attentions.shape
    if embeddings.shape[0] != n:
        raise ValueError(f"embeddings have {embeddings.shape[0]} rows but the run has {n} tokens")
    unit = embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    cosine = unit @ unit.T
    real = token_is_real(run.attentions) & ~run.special_mask
    pairs = visible_keys(n, run.is_causal, real) & real[:, None] & ~np.eye(n, dtype=bool)
    weights = run.attentions[:, :, pairs].astype(np.float64)  # [L, H, P]
    similarity = cosine[pairs]  # [P]
    correlation = np.full((num_layers, num_heads), np.nan)
    if pairs.sum() >= 3 and similarity.std() > 0:
        w_centered = weights - weights.mean(axis=-1, keepdims=True)
        s_centered = similarity - similarity.mean()
        denominator = np.sqrt((w_centered**2).sum(axis=-1) * (s_centered**2).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            correlation = np.where(denominator > 0, (w_centered * s_centered).sum(axis=-1) / denominator, np.nan)
    return per_head_frame(
        num_layers, num_heads, semantic_correlation=correlation, num_pairs=int(pairs.sum()), num_sentences=1
    )
