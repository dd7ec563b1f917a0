/* One pass over a block of attention scores, a row at a time while the row is in cache: the softmax, written over
 * the scores, and what a long pass's observers read of the weights (mha_core.engine.blockwise). torch takes a pass
 * over the block for each of these. Built by mha_core/native.py at first use.
 *
 * rows_softmax: block [heads, rows, keys], contiguous float32, the scores in, the weights out. Row r of the block
 * is query row_start + r; a decoder's row sees keys 0 .. row_start + r, and its later keys get weight 0. Per row:
 *   weights     exp(s - m) * (1 / sum_j exp(s_j - m)), m the row's largest score (torch's softmax, in its order)
 *   lse         m + log(sum)
 *   weighted    sum_j w_j s_j (= m + sum_j w_j (s_j - m))
 *   max_weight, argmax   the row's largest weight and its first key (torch.argmax's answer)
 *   chunk_max, chunk_sum the max and sum of each run of `chunk` keys of the weights ([heads, rows, nchunks])
 *   columns     when not NULL, [heads, keys] += the block's weights summed over its rows
 * threads: how many OpenMP threads share the rows. Denormal numbers are flushed to zero inside (each thread's
 * setting is restored): an exponential below float32's smallest normal number would take the slow path.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

/* exp(x) for x <= 0 in float32, a whole vector at a time (Cody-Waite reduction and Cephes' polynomial: within 2 ulp
 * of exp; compiled with -fno-trapping-math so that the selects vectorize: fmaxf would not); 0 below ln(FLT_MIN) = -87.3365. */
static inline float exp_f32(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float low = -87.33654475f;
    float clamped = x < low ? low : (x > 88.0f ? 88.0f : x);
    float n = floorf(clamped * log2e + 0.5f);
    float r = clamped - n * ln2_hi - n * ln2_lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    float value = p * scale.f;
    return x < low ? 0.0f : value;
}

static void one_row(float *restrict w, int64_t keys, int64_t visible, int64_t chunk, int64_t nchunks, float *lse,
                    float *weighted, float *max_weight, int64_t *argmax, float *restrict chunk_max,
                    float *restrict chunk_sum, float *restrict columns) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < visible; j++) m = w[j] > m ? w[j] : m;
    float sum = 0.0f, centred = 0.0f;
#pragma omp simd reduction(+ : sum, centred)
    for (int64_t j = 0; j < visible; j++) {
        float d = w[j] - m, e = exp_f32(d);
        w[j] = e;
        sum += e;
        centred += e * d;
    }
    float inverse = 1.0f / sum;
    *lse = m + logf(sum);
    *weighted = m + centred * inverse;
    float best = -1.0f;
    int64_t best_at = 0;
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t start = c * chunk, stop = start + chunk < keys ? start + chunk : keys;
        int64_t seen = stop < visible ? stop : visible;
        float largest = 0.0f, total = 0.0f;
#pragma omp simd reduction(max : largest) reduction(+ : total)
        for (int64_t j = start; j < seen; j++) {
            float v = w[j] * inverse;
            w[j] = v;
            largest = v > largest ? v : largest;
            total += v;
        }
        for (int64_t j = seen > start ? seen : start; j < stop; j++) w[j] = 0.0f;
        chunk_max[c] = largest;
        chunk_sum[c] = total;
        if (largest > best) { /* the first chunk holding the row's largest weight, then the first key in it */
            best = largest;
            for (int64_t j = start; j < seen; j++)
                if (w[j] == largest) {
                    best_at = j;
                    break;
                }
        }
    }
    *max_weight = best;
    *argmax = best_at;
    if (columns) {
#pragma omp simd
        for (int64_t j = 0; j < visible; j++) columns[j] += w[j];
    }
}

static void add_columns(float *restrict columns, const float *restrict local, int64_t keys) {
    for (int64_t j = 0; j < keys; j++) columns[j] += local[j];
}

int rows_softmax(float *block, int64_t heads, int64_t rows, int64_t keys, int64_t row_start, int causal,
                 int64_t chunk, float *lse, float *weighted, float *max_weight, int64_t *argmax, float *chunk_max,
                 float *chunk_sum, float *columns, int threads) {
    if (heads < 1 || rows < 1 || keys < 1 || chunk < 1 || threads < 1) return 1;
    int64_t nchunks = (keys + chunk - 1) / chunk, total = heads * rows;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
#if defined(__SSE__)
        unsigned int csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040); /* flush denormal results (FTZ) and inputs (DAZ) to zero */
#endif
        float *local = columns ? (float *)calloc((size_t)keys, sizeof(float)) : NULL;
        int64_t local_head = -1;
        if (columns && !local) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t index = 0; index < total; index++) {
            int64_t head = index / rows, r = index % rows;
            if (local && head != local_head) { /* a thread's rows run through the heads in order */
                if (local_head >= 0) {
#pragma omp critical
                    add_columns(columns + local_head * keys, local, keys);
                    memset(local, 0, (size_t)keys * sizeof(float));
                }
                local_head = head;
            }
            int64_t visible = causal ? row_start + r + 1 : keys;
            if (visible > keys) visible = keys;
            if (visible < 1) visible = 1;
            one_row(block + index * keys, keys, visible, chunk, nchunks, lse + index, weighted + index,
                    max_weight + index, argmax + index, chunk_max + index * nchunks, chunk_sum + index * nchunks,
                    (columns && local) ? local : NULL);
        }
        if (local) {
            if (local_head >= 0) {
#pragma omp critical
                add_columns(columns + local_head * keys, local, keys);
            }
            free(local);
        }
#if defined(__SSE__)
        _mm_setcsr(csr);
#endif
    }
    return failed ? 2 : 0;
}
