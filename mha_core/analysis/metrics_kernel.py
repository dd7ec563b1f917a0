"""The head metrics of a padded batch in one compiled pass (numba), for ``metrics.batch_head_metrics``.

``measure_batch`` walks each sentence, head and query row of ``[B, L, H, n, n]`` once and accumulates
everything the per-head columns need (row total, sum of a ln a, the masses on special, sink,
punctuation and same-segment keys, the distance-weighted sum, the row's argmax, the weights at
offsets -2..2, the column masses of the vertical test), then finishes each head's means, spreads and
baselines from those per-row values. The meaning of every quantity is the one ``docs/metrics.md`` and
``mha_core.analysis.metrics`` describe; the numpy code that computed them in about twenty passes over the
5-D tensor is kept as the reference in ``tests/mha_core/analysis/test_metrics_kernel.py``.

Sums run in float64 in key order, one row at a time: a sentence's values do not depend on which
other sentences share its batch, nor on how far it is padded (a padding weight is 0 and adds
nothing). numba compiles on the first call (``cache=True`` keeps the machine code next to this file,
or in numba's user cache directory when that is read-only) and this module is imported only when a
batch is measured, so ``import mha_core`` does not load numba.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

# Columns of the float output, in order.
FLOAT_COLUMNS = (
    "entropy",
    "normalized_entropy",
    "normalized_entropy_sd",
    "confidence",
    "mean_distance",
    "prev_token_mass",
    "self_mass",
    "next_token_mass",
    "argmax_offset_share",
    "argmax_offset_chance",
    "special_mass",
    "sink_mass",
    "sink_mass_sd",
    "sink_mass_uniform",
    "punctuation_mass",
    "punctuation_mass_sd",
    "punctuation_mass_uniform",
    "same_segment_mass",
    "diagonal_mass",
    "vertical_mass",
    "diagonal_only_mass",
    "local_mass",
)
INT_COLUMNS = ("num_queries", "argmax_offset", "argmax_offset_queries")
(
    _ENTROPY,
    _NORMALIZED,
    _NORMALIZED_SD,
    _CONFIDENCE,
    _DISTANCE,
    _PREV,
    _SELF,
    _NEXT,
    _MODE_SHARE,
    _MODE_CHANCE,
    _SPECIAL,
    _SINK,
    _SINK_SD,
    _SINK_UNIFORM,
    _PUNCTUATION,
    _PUNCTUATION_SD,
    _PUNCTUATION_UNIFORM,
    _SAME_SEGMENT,
    _DIAGONAL,
    _VERTICAL,
    _DIAGONAL_ONLY,
    _LOCAL,
) = range(len(FLOAT_COLUMNS))
_NUM_QUERIES, _MODE, _MODE_QUERIES = range(len(INT_COLUMNS))


def _compiled(function=None, **options):
    """``njit`` with numba's on-disk cache, or without it when no cache location is writable (a read-only
    package and no writable user cache directory: numba then refuses ``cache=True``); it then compiles
    once per process."""
    if function is None:
        return lambda function: _compiled(function, **options)
    try:
        return njit(cache=True, **options)(function)
    except RuntimeError:
        return njit(**options)(function)


@_compiled
def _mean(values, mask):
    """Mean of ``values[i]`` where ``mask[i]``; NaN when none (``metrics._masked_mean``)."""
    total = 0.0
    count = 0
    for i in range(values.shape[0]):
        if mask[i]:
            total += values[i]
            count += 1
    if count == 0:
        return np.nan
    return total / count


@_compiled
def _sd(values, mask):
    """Sample standard deviation of ``values[i]`` where ``mask[i]``; NaN below two (``metrics._masked_sd``)."""
    mean = _mean(values, mask)
    squares = 0.0
    count = 0
    for i in range(values.shape[0]):
        if mask[i]:
            squares += (values[i] - mean) ** 2
            count += 1
    if count < 2:
        return np.nan
    return math.sqrt(squares / (count - 1))


@intrinsic
def _bits_of(typingctx, value):
    """The bits of a float32 as an int32 (a bitcast: no conversion, vectorizable)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int32))

    return types.int32(types.float32), codegen


@intrinsic
def _float_of(typingctx, bits):
    """The float32 whose bits are ``bits`` (int32)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


_SQRT2 = math.sqrt(2.0)
_LN2 = math.log(2.0)


@_compiled(fastmath={"reassoc", "contract", "nsz"}, error_model="numpy")
def _row_sums(row, special, sinks, punctuation, segment_ids, i, column_mass):
    """One query row: (total, sum a ln a, mass on special keys, on sinks, on punctuation, on the query's
    segment, sum a |i - j|); adds the row to ``column_mass``.

    The sums may be reassociated, so the loop over keys runs in SIMD lanes: in float64, the order
    depends only on the row's length. ln a is computed from the float32 bits, a = m 2^e with m in
    [sqrt(1/2), sqrt(2)): ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^11
    (truncation below 2e-11; the C library's log would keep the loop scalar, at twice the time).
    a = 0 gives m = 1 and a finite log, so 0 ln 0 = 0; subnormal weights (below 1.2e-38) contribute
    below 1e-36.
    """
    segment = segment_ids[i]
    total = 0.0
    x_log_x = 0.0
    on_special = 0.0
    on_sink = 0.0
    on_punctuation = 0.0
    on_segment = 0.0
    distance = 0.0
    for j in range(row.shape[0]):
        weight = row[j]
        x = np.float64(weight)
        bits = _bits_of(weight)
        m = np.float64(_float_of((bits & 0x7FFFFF) | 0x3F800000))
        e = np.float64(((bits >> 23) & 0xFF) - 127)
        above = m > _SQRT2
        m = m * 0.5 if above else m
        e = e + 1.0 if above else e
        s = (m - 1.0) / (m + 1.0)
        s2 = s * s
        log_m = 2.0 * s * (1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 / 11)))))
        x_log_x += x * (e * _LN2 + log_m)
        total += x
        on_special += x * special[j]
        on_sink += x * sinks[j]
        on_punctuation += x * punctuation[j]
        on_segment += x if segment_ids[j] == segment else 0.0
        distance += x * abs(i - j)
        column_mass[j] += x
    return total, x_log_x, on_special, on_sink, on_punctuation, on_segment, distance


@_compiled
def measure_batch(
    attentions,
    special,
    sinks,
    punctuation,
    segment_ids,
    is_causal,
    row_eps,
    local_window,
    vertical_columns,
    out,
    out_int,
):
    """Fill ``out [len(FLOAT_COLUMNS), B, L, H]`` and ``out_int [len(INT_COLUMNS), B, L, H]``; return
    ``real [B, n]`` (the token's row has mass in some head).

    ``special``, ``sinks``, ``punctuation`` ``[B, n]`` float64 0/1 key weights; ``segment_ids [B, n]`` int64
    (-1 for padding).
    """
    batch, num_layers, num_heads, n, _ = attentions.shape
    real = np.zeros((batch, n), dtype=np.bool_)
    # Per-row values of one sentence, [L, H, n]: what the second phase needs once `real` is known.
    valid = np.zeros((num_layers, num_heads, n), dtype=np.bool_)
    safe_total = np.ones((num_layers, num_heads, n))
    entropy_rows = np.zeros((num_layers, num_heads, n))
    same_segment_rows = np.zeros((num_layers, num_heads, n))
    near_rows = np.zeros((3, num_layers, num_heads, n))  # weights at offsets -1, 0, +1 over the row total
    mode_of_head = np.zeros((num_layers, num_heads), dtype=np.int64)
    mode_count_of_head = np.zeros((num_layers, num_heads), dtype=np.int64)
    # Per-row values used within one head.
    confidence_rows = np.zeros(n)
    distance_rows = np.zeros(n)
    special_rows = np.zeros(n)
    sink_rows = np.zeros(n)
    punctuation_rows = np.zeros(n)
    local_rows = np.zeros(n)
    diagonal_rows = np.zeros(n)
    vertical_rows = np.zeros(n)
    diagonal_only_rows = np.zeros(n)
    argmax_key = np.zeros(n, dtype=np.int64)
    column_mass = np.zeros(n)
    offset_counts = np.zeros(2 * n - 1, dtype=np.int64)
    num_top = min(vertical_columns, n)
    top = np.zeros(num_top, dtype=np.int64)
    num_visible = np.zeros(n, dtype=np.int64)
    sink_share = np.zeros(n)
    punctuation_share = np.zeros(n)
    mask = np.zeros(n, dtype=np.bool_)
    chance = np.zeros(n)

    for b in range(batch):
        # ---- phase 1: every row of every head, once ----
        for layer in range(num_layers):
            for head in range(num_heads):
                column_mass[:] = 0.0
                offset_counts[:] = 0
                count = 0
                for i in range(n):
                    row = attentions[b, layer, head, i]
                    total, x_log_x, on_special, on_sink, on_punctuation, on_segment, distance = _row_sums(
                        row=row,
                        special=special[b],
                        sinks=sinks[b],
                        punctuation=punctuation[b],
                        segment_ids=segment_ids[b],
                        i=i,
                        column_mass=column_mass,
                    )
                    best_key = 0
                    for j in range(1, n):  # the first largest weight, as numpy's argmax
                        if row[j] > row[best_key]:
                            best_key = j
                    is_valid = total > row_eps
                    valid[layer, head, i] = is_valid
                    safe = total if is_valid else 1.0
                    safe_total[layer, head, i] = safe
                    if is_valid:
                        count += 1
                        real[b, i] = True
                        offset_counts[best_key - i + n - 1] += 1
                    argmax_key[i] = best_key
                    entropy_rows[layer, head, i] = -x_log_x / safe + math.log(safe)
                    confidence_rows[i] = np.float64(row[best_key]) / safe
                    distance_rows[i] = distance / safe
                    special_rows[i] = on_special / safe
                    sink_rows[i] = on_sink / safe
                    punctuation_rows[i] = on_punctuation / safe
                    same_segment_rows[layer, head, i] = on_segment if segment_ids[b, i] >= 0 else 0.0
                    local = 0.0
                    for offset in range(-local_window, local_window + 1):
                        key = i + offset
                        near = np.float64(row[key]) / safe if 0 <= key < n else 0.0
                        local += near
                        if -1 <= offset <= 1:
                            near_rows[offset + 1, layer, head, i] = near
                    local_rows[i] = local
                    diagonal_rows[i] = near_rows[0, layer, head, i] + near_rows[1, layer, head, i]
                    diagonal_rows[i] += near_rows[2, layer, head, i]
                # The vertical columns: the most attended keys over all rows, ties to the lower index.
                for rank in range(num_top):
                    best_key = -1
                    for j in range(n):
                        taken = False
                        for earlier in range(rank):
                            taken = taken or top[earlier] == j
                        if not taken and (best_key < 0 or column_mass[j] > column_mass[best_key]):
                            best_key = j
                    top[rank] = best_key
                for i in range(n):
                    vertical = 0.0
                    diagonal_only = diagonal_rows[i]
                    for rank in range(num_top):
                        weight = np.float64(attentions[b, layer, head, i, top[rank]]) / safe_total[layer, head, i]
                        vertical += weight
                        if abs(top[rank] - i) <= 1:
                            diagonal_only -= weight
                    vertical_rows[i] = vertical
                    diagonal_only_rows[i] = diagonal_only
                # The offset that holds the argmax most often; ties to the offset nearest 0, then the negative.
                best_score = -(2 * n)
                mode_index = 0
                for index in range(2 * n - 1):
                    score = offset_counts[index] * (2 * n) - abs(index - (n - 1))
                    if score > best_score:
                        best_score = score
                        mode_index = index
                mode_of_head[layer, head] = mode_index - (n - 1)
                mode_count_of_head[layer, head] = offset_counts[mode_index]
                row_valid = valid[layer, head]
                out_int[_NUM_QUERIES, b, layer, head] = count
                out[_ENTROPY, b, layer, head] = _mean(entropy_rows[layer, head], row_valid)
                out[_CONFIDENCE, b, layer, head] = _mean(confidence_rows, row_valid)
                out[_DISTANCE, b, layer, head] = _mean(distance_rows, row_valid)
                out[_SPECIAL, b, layer, head] = _mean(special_rows, row_valid)
                out[_SINK, b, layer, head] = _mean(sink_rows, row_valid)
                out[_SINK_SD, b, layer, head] = _sd(sink_rows, row_valid)
                out[_PUNCTUATION, b, layer, head] = _mean(punctuation_rows, row_valid)
                out[_PUNCTUATION_SD, b, layer, head] = _sd(punctuation_rows, row_valid)
                out[_LOCAL, b, layer, head] = _mean(local_rows, row_valid)
                out[_DIAGONAL, b, layer, head] = _mean(diagonal_rows, row_valid)
                out[_VERTICAL, b, layer, head] = _mean(vertical_rows, row_valid)
                out[_DIAGONAL_ONLY, b, layer, head] = _mean(diagonal_only_rows, row_valid)

        # ---- phase 2: what depends on which tokens are real (visible keys) ----
        for i in range(n):
            visible = 0
            on_sinks = 0
            on_punctuation = 0
            for j in range(n):
                if real[b, j] and (j <= i or not is_causal):
                    visible += 1
                    on_sinks += sinks[b, j] > 0.0
                    on_punctuation += punctuation[b, j] > 0.0
            num_visible[i] = visible
            sink_share[i] = on_sinks / visible if visible > 0 else 0.0
            punctuation_share[i] = on_punctuation / visible if visible > 0 else 0.0
            chance[i] = 1.0 / max(visible, 1)
        # A key that is not real but lies in a segment (weight on a token whose own rows are empty in every
        # head) is outside every query's segment: take its weight back out of the same-segment sums.
        for j in range(n):
            if real[b, j] or segment_ids[b, j] < 0:
                continue
            for layer in range(num_layers):
                for head in range(num_heads):
                    for i in range(n):
                        if segment_ids[b, i] == segment_ids[b, j]:
                            same_segment_rows[layer, head, i] -= np.float64(attentions[b, layer, head, i, j])
        for layer in range(num_layers):
            for head in range(num_heads):
                row_valid = valid[layer, head]
                for i in range(n):
                    same_segment_rows[layer, head, i] /= safe_total[layer, head, i]
                    entropy_rows[layer, head, i] /= math.log(num_visible[i]) if num_visible[i] > 1 else 1.0
                    mask[i] = row_valid[i] and num_visible[i] > 1
                out[_NORMALIZED, b, layer, head] = _mean(entropy_rows[layer, head], mask)
                out[_NORMALIZED_SD, b, layer, head] = _sd(entropy_rows[layer, head], mask)
                out[_SAME_SEGMENT, b, layer, head] = _mean(same_segment_rows[layer, head], row_valid)
                out[_SINK_UNIFORM, b, layer, head] = _mean(sink_share, row_valid)
                out[_PUNCTUATION_UNIFORM, b, layer, head] = _mean(punctuation_share, row_valid)
                for column, offset in ((_PREV, -1), (_SELF, 0), (_NEXT, 1)):
                    for i in range(n):
                        key = i + offset
                        mask[i] = row_valid[i] and 0 <= key < n and real[b, key] and (offset <= 0 or not is_causal)
                    out[column, b, layer, head] = _mean(near_rows[offset + 1, layer, head], mask)
                mode = mode_of_head[layer, head]
                queries = 0
                for i in range(n):
                    key = i + mode
                    mask[i] = row_valid[i] and 0 <= key < n and real[b, key] and (mode <= 0 or not is_causal)
                    queries += mask[i]
                out_int[_MODE, b, layer, head] = mode
                out_int[_MODE_QUERIES, b, layer, head] = queries
                out[_MODE_SHARE, b, layer, head] = mode_count_of_head[layer, head] / queries if queries > 0 else np.nan
                out[_MODE_CHANCE, b, layer, head] = _mean(chance, mask)
    return real
