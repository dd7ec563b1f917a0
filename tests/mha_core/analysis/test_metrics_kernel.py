"""The compiled head metrics (``mha_core.analysis.metrics_kernel`` behind ``batch_head_metrics`` / ``head_metrics``) against
the numpy implementation they replaced, kept here as the reference: about twenty vectorised passes
over ``[B, L, H, n, n]``, each one definition of docs/metrics.md."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from mha_core.analysis.metrics import (
    KOVALEVA_VERTICAL_COLUMNS,
    ROW_EPS,
    TUTORIAL_LOCAL_WINDOW,
    _rows_x_log_x,
    batch_head_metrics,
    head_metrics,
    kovaleva_pattern,
    tutorial_pattern,
    visible_keys,
)
from tests.conftest import METRIC_TOL, ROOT

LABELS = ("num_queries", "argmax_offset", "argmax_offset_queries", "kovaleva_pattern", "seed_pattern")


# ---- the reference: the numpy code of batch_head_metrics before the kernel ------------------
def _masked_mean(values: np.ndarray, weights: np.ndarray, count: np.ndarray | None = None) -> np.ndarray:
    """Mean over the last axis counting only entries where ``weights`` is True; NaN when none.
    ``count``: the number of True entries of ``weights`` per row, when the caller already has it."""
    weights = np.asarray(weights)
    if weights.dtype != bool:
        weights = weights > 0
    if count is None:
        count = np.count_nonzero(weights, axis=-1)
    # The sum as a matrix-vector product: faster than .sum(axis=-1) over short rows.
    total = np.matmul(np.where(weights, values, 0.0), np.ones(values.shape[-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _masked_sd(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Sample standard deviation over the last axis of the entries where ``weights`` is True (NaN below two)."""
    count = np.count_nonzero(weights, axis=-1)
    mean = _masked_mean(values, weights, count)
    squares = np.matmul(np.where(weights, (values - mean[..., None]) ** 2, 0.0), np.ones(values.shape[-1]))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 1, np.sqrt(squares / np.maximum(count - 1, 1)), np.nan)


def _offset_weights(attentions: np.ndarray, offset: int) -> np.ndarray:
    """``a[i, i + offset]`` for every head and query, ``[L, H, n]``, 0 where i + offset is outside."""
    n = attentions.shape[-1]
    diag = np.diagonal(attentions, offset=offset, axis1=-2, axis2=-1)  # [L, H, n - |offset|]
    out = np.zeros(attentions.shape[:-1], dtype=np.float64)
    if offset >= 0:
        out[..., : n - offset] = diag
    else:
        out[..., -offset:] = diag
    return out


def _mass_on(attentions: np.ndarray, key_sets: list[np.ndarray]) -> list[np.ndarray]:
    """``sum_{j in keys} a_ij`` for every sentence, head and query and each bool ``keys [B, n]``: ``[B, L, H, n]``
    each, from ``[B, L, H, n, n]`` in one batched matrix product (float32 accumulation)."""
    weights = np.stack(key_sets, axis=-1).astype(np.float32)[:, None, None]  # [B, 1, 1, n, sets]
    masses = np.matmul(attentions, weights).astype(np.float64)
    return [masses[..., index] for index in range(len(key_sets))]


def _offset_possible(visible: np.ndarray, offset: int) -> np.ndarray:
    """bool ``[B, n]``: query i can see key i + offset, from ``visible [B, n, n]``."""
    n = visible.shape[-1]
    rows = np.arange(n)
    cols = rows + offset
    inside = (cols >= 0) & (cols < n)
    possible = np.zeros(visible.shape[:-1], dtype=bool)
    possible[:, inside] = visible[:, rows[inside], cols[inside]]
    return possible


@dataclass
class _Rows:
    """What every measurement of a padded batch ``[B, L, H, n, n]`` needs about its rows and keys."""

    attentions: np.ndarray
    row_total: np.ndarray  # [B, L, H, n] float64
    query_valid: np.ndarray  # [B, L, H, n]: the row has mass (a real query)
    safe_total: np.ndarray  # row_total, 1 where the row is empty (safe to divide by)
    real: np.ndarray  # [B, n]: the token is real (not padding)
    visible: np.ndarray  # [B, n, n]: query i can see key j
    num_visible: np.ndarray  # [B, n]
    is_causal: bool = False
    num_valid: np.ndarray | None = None  # [B, L, H]: valid query rows per head

    def __post_init__(self):
        if self.num_valid is None:
            self.num_valid = np.count_nonzero(self.query_valid, axis=-1)

    @classmethod
    def of(cls, attentions: np.ndarray, is_causal: bool) -> _Rows:
        n = attentions.shape[-1]
        # A matrix-vector product (float32 accumulation): twice as fast as .sum(axis=-1) on short rows.
        row_total = np.matmul(attentions, np.ones(n, dtype=np.float32)).astype(np.float64)
        query_valid = row_total > ROW_EPS
        real = query_valid.any(axis=(1, 2))
        visible = visible_keys(n, is_causal)[None] & real[:, None, :]
        return cls(
            attentions,
            row_total,
            query_valid,
            np.where(query_valid, row_total, 1.0),
            real,
            visible,
            visible.sum(axis=-1),
            is_causal,
        )

    def mean(self, per_row: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        """Mean over each head's valid query rows: ``[B, L, H, n] -> [B, L, H]``."""
        if valid is None:
            return _masked_mean(per_row, self.query_valid, self.num_valid)
        return _masked_mean(per_row, valid)

    def sd(self, per_row: np.ndarray) -> np.ndarray:
        """Standard deviation over each head's valid query rows."""
        return _masked_sd(per_row, self.query_valid)

    def uniform_share(self, keys: np.ndarray) -> np.ndarray:
        """Per head, the mean share of ``keys [B, n]`` among each query's visible keys: what attention
        spread evenly would give them (the baseline of a mass)."""
        visible_in_keys = (self.visible & keys[:, None, :]).sum(axis=-1)  # [B, n]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(self.num_visible > 0, visible_in_keys / np.maximum(self.num_visible, 1), 0.0)
        return self.mean(np.broadcast_to(_per_query(share), self.query_valid.shape))


def _per_query(values: np.ndarray) -> np.ndarray:
    """``[B, n]`` -> ``[B, 1, 1, n]``, to broadcast against ``[B, L, H, n]``."""
    return values[:, None, None, :]


def _entropies(rows: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(entropy, normalised entropy, its sd over queries) per head. For the normalised row p = a / t:
    H(p) = H_raw / t + log t with H_raw = -sum a log a (a = 0 contributes 0, the limit of a log a);
    normalised by log(number of visible keys), over queries with more than one key."""
    raw_entropy = -_rows_x_log_x(rows.attentions).astype(np.float64)
    entropy_rows = raw_entropy / rows.safe_total + np.log(rows.safe_total)
    has_choice = rows.query_valid & _per_query(rows.num_visible > 1)
    max_entropy = np.log(np.where(rows.num_visible > 1, rows.num_visible, np.e))
    normalized = entropy_rows / _per_query(max_entropy)
    return rows.mean(entropy_rows), rows.mean(normalized, has_choice), _masked_sd(normalized, has_choice)


def _group_masses(rows: _Rows, special_mask, punctuation_mask, segment_ids) -> dict[str, np.ndarray]:
    """Share of each row on special tokens, on sink positions (special tokens and the first token), on
    punctuation, and inside the query's own segment; spreads and uniform baselines for the roles."""
    segment_ids = np.where(rows.real, segment_ids, -1)
    in_segments = [segment_ids == segment for segment in np.unique(segment_ids[segment_ids >= 0])]  # one or two
    # A sink: a position that carries no word of the text's content, where heads park attention they
    # do not use (Clark et al. 2019 on [SEP]; Xiao et al. 2023 on the first token of a decoder).
    sinks = special_mask.copy()
    sinks[:, 0] = True
    special, sink, punctuation, *segment_masses = _mass_on(
        rows.attentions, [special_mask, sinks, punctuation_mask, *in_segments]
    )
    same_segment = np.zeros_like(rows.row_total)
    num_segments = np.zeros(rows.attentions.shape[0], dtype=np.int64)
    for in_segment, segment_mass in zip(in_segments, segment_masses):
        same_segment += np.where(_per_query(in_segment), segment_mass, 0.0)
        num_segments += in_segment.any(axis=-1)
    sink_rows, punctuation_rows = sink / rows.safe_total, punctuation / rows.safe_total
    return {
        "special_mass": rows.mean(special / rows.safe_total),
        "sink_mass": rows.mean(sink_rows),
        "sink_mass_sd": rows.sd(sink_rows),
        "sink_mass_uniform": rows.uniform_share(sinks),
        "punctuation_mass": rows.mean(punctuation_rows),
        "punctuation_mass_sd": rows.sd(punctuation_rows),
        "punctuation_mass_uniform": rows.uniform_share(punctuation_mask.astype(bool)),
        "same_segment_mass": rows.mean(same_segment / rows.safe_total),
        "num_segments": num_segments,
    }


def _offset_masses(rows: _Rows) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
    """Per-row weight at each offset j - i in [-2, 2], and the per-head means of the offset measures."""
    offsets = {
        d: _offset_weights(rows.attentions, d) / rows.safe_total
        for d in range(-TUTORIAL_LOCAL_WINDOW, TUTORIAL_LOCAL_WINDOW + 1)
    }
    possible = {d: rows.query_valid & _per_query(_offset_possible(rows.visible, d)) for d in (-1, 0, 1)}
    return offsets, {
        "prev_token_mass": rows.mean(offsets[-1], possible[-1]),
        "self_mass": rows.mean(offsets[0], possible[0]),
        "next_token_mass": rows.mean(offsets[1], possible[1]),
        "local_mass": rows.mean(sum(offsets.values())),
    }


def _vertical_and_diagonal(rows: _Rows, offsets: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vertical mass, diagonal mass, diagonal mass outside the vertical columns) per head.

    Vertical: the ``KOVALEVA_VERTICAL_COLUMNS`` key columns that receive the most attention over all
    queries of the head. Kovaleva's classes are disjoint: a top column on the diagonal counts as vertical only.
    """
    attn = rows.attentions
    batch, num_layers, num_heads, n, _ = attn.shape
    column_mass = np.matmul(np.ones(n, dtype=np.float32), attn)  # [B, L, H, n], faster than .sum(axis=-2)
    k = min(KOVALEVA_VERTICAL_COLUMNS, n)
    # The k largest, ties to the lower index (k argmax passes: cheaper than sorting every row).
    remaining = column_mass.copy()
    top_columns = np.empty(column_mass.shape[:-1] + (k,), dtype=np.int64)  # [B, L, H, k]
    for rank in range(k):
        top_columns[..., rank] = remaining.argmax(axis=-1)
        np.put_along_axis(remaining, top_columns[..., rank, None], -np.inf, axis=-1)
    # Gathered from the flat tensor by computed positions (cheaper than take_along_axis).
    row_starts = (np.arange(batch * num_layers * num_heads) * (n * n))[:, None] + np.arange(n)[None, :] * n
    diagonal_rows = offsets[-1] + offsets[0] + offsets[1]
    vertical_rows = np.zeros_like(diagonal_rows)
    diagonal_only_rows = diagonal_rows.copy()
    positions = np.arange(n)
    for rank in range(k):  # k = 2 terms added in order, as a sum over the last axis would
        column = top_columns[..., rank].reshape(-1, 1)
        weight = attn.reshape(-1)[row_starts + column].reshape(rows.row_total.shape).astype(np.float64)
        weight /= rows.safe_total  # [B, L, H, n]
        vertical_rows += weight
        near_diagonal = np.abs(top_columns[..., rank, None] - positions) <= 1
        diagonal_only_rows -= np.where(near_diagonal, weight, 0.0)
    return rows.mean(vertical_rows), rows.mean(diagonal_rows), rows.mean(diagonal_only_rows)


def _argmax_offset(rows: _Rows) -> dict[str, np.ndarray]:
    """The positional test per head: the offset j - i that holds the argmax most often, the share of
    queries for which it does, how many queries that share counts (those for which the offset exists:
    query 0 has no previous token), the share a random argmax would give them, and the mean largest
    weight of a row. Ties go to the offset nearest 0."""
    attn = rows.attentions
    batch, num_layers, num_heads, n, _ = attn.shape
    positions = np.arange(n)
    argmax_key = attn.argmax(axis=-1)
    max_weight = attn.reshape(-1, n)[np.arange(argmax_key.size), argmax_key.reshape(-1)].reshape(argmax_key.shape)
    num_offsets = 2 * n - 1
    flat_head = np.arange(batch * num_layers * num_heads).reshape(batch, num_layers, num_heads, 1)
    codes = (flat_head * num_offsets + argmax_key - positions + n - 1)[rows.query_valid]
    counts = np.bincount(codes, minlength=flat_head.size * num_offsets).reshape(
        batch, num_layers, num_heads, num_offsets
    )
    offset_values = np.arange(num_offsets) - (n - 1)
    mode_offset = (counts * (2 * n) - np.abs(offset_values)).argmax(axis=-1) - (n - 1)  # [B, L, H]
    mode_count = counts.max(axis=-1)
    key_of_mode = positions + mode_offset[..., None]  # [B, L, H, n]
    inside = (key_of_mode >= 0) & (key_of_mode < n)
    # visible[b, i, j] is real[b, j] (and j <= i for a causal model): read it without a 5-D gather.
    real_key = np.take_along_axis(
        np.broadcast_to(rows.real[:, None, None, :], inside.shape), np.clip(key_of_mode, 0, n - 1), axis=-1
    )
    mode_possible = inside & real_key
    if rows.is_causal:
        mode_possible &= (mode_offset <= 0)[..., None]
    counted = mode_possible & rows.query_valid
    mode_queries = counted.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mode_share = np.where(mode_queries > 0, mode_count / np.maximum(mode_queries, 1), np.nan)
        chance = _per_query(1.0 / np.maximum(rows.num_visible, 1))
    return {
        "argmax_offset": mode_offset,
        "argmax_offset_share": mode_share,
        "argmax_offset_queries": mode_queries,
        "argmax_offset_chance": _masked_mean(np.broadcast_to(chance, counted.shape), counted),
        "confidence": rows.mean(max_weight / rows.safe_total),
    }


def reference_batch_head_metrics(
    attentions: np.ndarray,
    special_mask: np.ndarray,
    punctuation_mask: np.ndarray,
    segment_ids: np.ndarray,
    is_causal: bool,
) -> dict[str, np.ndarray]:
    """The numpy passes ``metrics.batch_head_metrics`` made before the kernel: the reference it is held to."""
    batch, num_layers, num_heads, n, _ = attentions.shape
    rows = _Rows.of(attentions, is_causal)
    entropy, normalized_entropy, normalized_entropy_sd = _entropies(rows)
    groups = _group_masses(rows, special_mask, punctuation_mask, segment_ids)
    offsets, offset_masses = _offset_masses(rows)
    vertical, diagonal, diagonal_only = _vertical_and_diagonal(rows, offsets)
    positional = _argmax_offset(rows)
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]).astype(np.float32)
    distance_rows = np.einsum("blhij,ij->blhi", attentions, distance).astype(np.float64) / rows.safe_total

    per_head = {
        "num_queries": rows.num_valid,
        "entropy": entropy,
        "normalized_entropy": normalized_entropy,
        "confidence": positional["confidence"],
        "mean_distance": rows.mean(distance_rows),
        "prev_token_mass": offset_masses["prev_token_mass"],
        "self_mass": offset_masses["self_mass"],
        "next_token_mass": offset_masses["next_token_mass"],
        "argmax_offset": positional["argmax_offset"],
        "argmax_offset_share": positional["argmax_offset_share"],
        "special_mass": groups["special_mass"],
        "sink_mass": groups["sink_mass"],
        "punctuation_mass": groups["punctuation_mass"],
        "same_segment_mass": groups["same_segment_mass"],
        "diagonal_mass": diagonal,
        "vertical_mass": vertical,
        "local_mass": offset_masses["local_mass"],
        "normalized_entropy_sd": normalized_entropy_sd,
        "sink_mass_sd": groups["sink_mass_sd"],
        "sink_mass_uniform": groups["sink_mass_uniform"],
        "punctuation_mass_sd": groups["punctuation_mass_sd"],
        "punctuation_mass_uniform": groups["punctuation_mass_uniform"],
        "argmax_offset_queries": positional["argmax_offset_queries"],
        "argmax_offset_chance": positional["argmax_offset_chance"],
    }
    columns = {name: values.reshape(batch, num_layers * num_heads) for name, values in per_head.items()}
    columns["kovaleva_pattern"] = kovaleva_pattern(
        columns["vertical_mass"],
        diagonal_only.reshape(batch, num_layers * num_heads),
        columns["same_segment_mass"],
        num_segments=groups["num_segments"][:, None],
    )
    columns["seed_pattern"] = tutorial_pattern(columns["normalized_entropy"], columns["local_mass"])
    return columns


# ---- the comparisons -------------------------------------------------------------------------
def assert_same_columns(ours: dict, reference: dict) -> None:
    assert list(ours) == list(reference)
    for name, expected in reference.items():
        if name in LABELS:
            np.testing.assert_array_equal(ours[name], expected, err_msg=name)
            assert ours[name].dtype == expected.dtype, name
        else:
            np.testing.assert_allclose(ours[name], expected, **METRIC_TOL, err_msg=name)


def softmax_heads(rng, shape, lengths, causal, temperature=3.0):
    """``[B, L, H, n, n]`` softmax attention, each sentence padded with zero rows and columns beyond its length."""
    batch, num_layers, num_heads, n = shape
    scores = rng.normal(size=(batch, num_layers, num_heads, n, n)) * temperature
    attentions = np.zeros_like(scores)
    for b, length in enumerate(lengths):
        block = scores[b, :, :, :length, :length]
        if causal:
            block = np.where(np.tril(np.ones((length, length), bool)), block, -np.inf)
        weights = np.exp(block - block.max(-1, keepdims=True))
        attentions[b, :, :, :length, :length] = weights / weights.sum(-1, keepdims=True)
    return attentions.astype(np.float32)


def token_masks(lengths, n, pair=False):
    batch = len(lengths)
    special = np.zeros((batch, n), bool)
    punctuation = np.zeros((batch, n), bool)
    segments = np.full((batch, n), -1)
    for b, length in enumerate(lengths):
        special[b, [0, length - 1]] = True
        punctuation[b, 2:length:4] = True
        segments[b, :length] = 0
        if pair:
            special[b, length // 2] = True
            segments[b, length // 2 + 1 : length] = 1
    punctuation &= ~special
    return special, punctuation, segments


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pair", [False, True])
def test_kernel_equals_the_numpy_reference_on_a_padded_random_batch(causal, pair):
    rng = np.random.default_rng(7 + causal + 2 * pair)
    lengths = [11, 7, 4, 11, 9]
    attentions = softmax_heads(rng, (5, 2, 3, 11), lengths, causal)
    # Ties: a uniform head (every argmax and top column tied), two identical key columns, and a row left empty
    # in one head only (a query that still counts as real through the other heads).
    attentions[0, 0, 0, :11, :11] = np.tril(np.ones((11, 11))) / np.arange(1, 12)[:, None] if causal else 1 / 11
    attentions[1, 1, 2, :7, 3:7:2] = 0.25
    attentions[3, 0, 1, 4] = 0.0
    masks = token_masks(lengths, 11, pair)
    ours = batch_head_metrics(attentions, *masks, causal)
    assert_same_columns(ours, reference_batch_head_metrics(attentions, *masks, causal))
    assert (ours["num_queries"][3].reshape(2, 3)[0, 1] == 10) and (ours["num_queries"][2] == 4).all()


def test_kernel_equals_the_reference_with_weight_on_a_token_that_is_not_real():
    """A key whose own rows are empty in every head is not real: it is in no query's segment, not visible."""
    rng = np.random.default_rng(1)
    attentions = softmax_heads(rng, (2, 1, 2, 8), [8, 8], causal=False)
    attentions[0, :, :, 5, :] = 0.0  # token 5 is not real, but queries still put weight on it
    masks = token_masks([8, 8], 8, pair=True)
    assert_same_columns(
        batch_head_metrics(attentions, *masks, False), reference_batch_head_metrics(attentions, *masks, False)
    )


def test_a_sentence_measures_the_same_alone_and_inside_a_padded_batch():
    """Padding weights add exactly 0; only the SIMD order of a row's float64 sums depends on the padded
    length (differences of a few 1e-16), and every label is the same."""
    rng = np.random.default_rng(5)
    lengths = [12, 6, 9]
    attentions = softmax_heads(rng, (3, 2, 4, 12), lengths, causal=False)
    masks = token_masks(lengths, 12, pair=True)
    batch = batch_head_metrics(attentions, *masks, False)
    length = lengths[1]
    alone = batch_head_metrics(
        np.ascontiguousarray(attentions[1:2, :, :, :length, :length]),
        *(mask[1:2, :length] for mask in masks),
        False,
    )
    for name, values in alone.items():
        if name in LABELS:
            np.testing.assert_array_equal(batch[name][1], values[0], err_msg=name)
        else:
            np.testing.assert_allclose(batch[name][1], values[0], rtol=1e-12, atol=1e-14, err_msg=name)


def test_head_metrics_equals_the_reference_on_hand_built_heads():
    from tests.mha_core.analysis.test_metrics import block_head, cls_head, make_run, previous_token_head, uniform_head

    segments = [0] * 5 + [1] * 5
    run = make_run([previous_token_head(), uniform_head(), cls_head(), block_head(segments)], segments=segments)
    ours = head_metrics(run)
    reference = reference_batch_head_metrics(
        run.attentions[None], run.special_mask[None], run.punctuation_mask[None], run.segment_ids[None], False
    )
    assert_same_columns({name: ours[name].to_numpy()[None] for name in reference}, reference)
    assert list(ours["kovaleva_pattern"][:3]) == ["diagonal", "heterogeneous", "vertical"]


@pytest.mark.slow
def test_kernel_equals_the_reference_on_minilm_batches_of_ud_sentences():
    """Real attention: the profile's own padded batches (UD EWT dev, MiniLM), every column and label."""
    import mha_core
    from mha_core.analysis.syntax import ud_ewt_dev
    from mha_core.corpus.measure import _forward_batches, _padded
    from mha_core.corpus.reading import model_input

    model = mha_core.load_model("minilm")
    inputs = [model_input(sentence) for sentence in ud_ewt_dev(max_sentences=48)]
    for _, attentions, infos, is_causal in _forward_batches(model, inputs, 16):
        width = attentions.shape[-1]
        masks = (
            _padded([info.special_mask for info in infos], width, False),
            _padded([info.punctuation_mask for info in infos], width, False),
            _padded([info.segment_ids for info in infos], width, -1),
        )
        assert_same_columns(
            batch_head_metrics(attentions, *masks, is_causal),
            reference_batch_head_metrics(attentions, *masks, is_causal),
        )


def test_importing_the_library_does_not_load_numba():
    """The kernel module (and numba, ~0.5 s) is imported on the first measurement, not with mha_core."""
    code = "import sys, mha_core; print('numba' in sys.modules, 'mha_core.analysis.metrics_kernel' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_warm_up_compiles_the_kernel_a_measurement_uses():
    from mha_core.analysis import metrics, metrics_kernel

    metrics.warm_up()
    assert len(metrics_kernel.measure_batch.signatures) == 1
    # A real measurement afterwards needs no other specialisation (the wrapper fixes every dtype).
    attention = np.full((2, 1, 3, 4, 4), 0.25, dtype=np.float64)
    metrics.batch_head_metrics(attention, np.zeros((2, 4), int), np.zeros((2, 4), int), np.zeros((2, 4), int), True)
    assert len(metrics_kernel.measure_batch.signatures) == 1
