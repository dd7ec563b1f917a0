/* Attention a row at a time while the row is in cache, where torch takes a pass over all the scores for each step.
 * Built by mha_core/native.py at first use.
 *
 * rows_softmax: one pass over a block of attention scores: the softmax, written over the scores, and what a long
 * pass's observers read of the weights (mha_core.engine.blockwise).
 * attend (below): one sequence's dense attention, scores, softmax and output, 8 query rows at a time
 * (mha_core.attention.scaled_dot_product_attention).
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

/* w[j] = exp(w[j] - m) for j < visible (>= 1), m the largest of them (torch's softmax, in its order): returns their
 * sum; *max = m, *centred = sum_j exp(w_j - m) (w_j - m). */
static inline float exponentials(float *restrict w, int64_t visible, float *max, float *centred) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < visible; j++) m = w[j] > m ? w[j] : m;
    float sum = 0.0f, c = 0.0f;
#pragma omp simd reduction(+ : sum, c)
    for (int64_t j = 0; j < visible; j++) {
        float d = w[j] - m, e = exp_f32(d);
        w[j] = e;
        sum += e;
        c += e * d;
    }
    *max = m;
    *centred = c;
    return sum;
}

static void one_row(float *restrict w, int64_t keys, int64_t visible, int64_t chunk, int64_t nchunks, float *lse,
                    float *weighted, float *max_weight, int64_t *argmax, float *restrict chunk_max,
                    float *restrict chunk_sum, float *restrict columns) {
    float m, centred, sum = exponentials(w, visible, &m, &centred);
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

/* ---- attend: one sequence's dense attention, every head, a block of query rows at a time ----------------------
 *
 * For each head and each block of 8 query rows: the rows' scores (into the weights' memory), their softmax in place
 * while the rows are in cache, and their output. torch takes three passes over the [heads, n_q, n_k] scores for the
 * same (bmm, softmax, bmm). Layouts (MultiHeadAttention's one-sequence projection, W X^T):
 *   q  element (h, i, c) at q[h * q_head + c * q_dim + i]   (each head's Q^T, [d_k, n_q], rows of queries)
 *   k  element (h, j, c) at k[h * k_head + c * k_dim + j]   (each head's K^T)
 *   v  element (h, j, c) at v[h * v_head + c * v_dim + j]   (each head's V^T)
 *   weights [heads, n_q, n_k], contiguous; out element (i, h, c) at out[i * heads * d_k + h * d_k + c] (Concat).
 * scores = scale * q . k; a decoder's (causal) row i sees keys j <= i + n_k - n_q, the later keys get weight 0 and a
 * row that sees none gets all-zero weights and output. */

typedef float vec16 __attribute__((vector_size(64))); /* GCC's and clang's vectors: AVX-512, or split to AVX/SSE/NEON */

static inline vec16 load16(const float *p) {
    vec16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store16(float *p, vec16 v) { memcpy(p, &v, sizeof v); }

#define TILE 8
#define EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* spill[0 .. width) = scale * sum_{t < count} x[t * x_step] * m[t * m_step + 0 .. width), width 32 or 16: one row
 * of a product, for the rows that do not fill a tile of 8. */
static void row_product(const float *restrict x, int64_t x_step, const float *restrict m, int64_t m_step,
                        int64_t count, int width, float scale, float *restrict spill) {
    vec16 a0 = {0}, a1 = {0};
    for (int64_t t = 0; t < count; t++) {
        float value = x[t * x_step];
        a0 += value * load16(m + t * m_step);
        if (width == 32) a1 += value * load16(m + t * m_step + 16);
    }
    store16(spill, a0 * scale);
    store16(spill + 16, a1 * scale);
}

/* s[r * keys_all + j] = scale * sum_c q[c * q_dim + r] * k[c * padded + j], r < rows (8, or fewer for the last
 * rows), j < keys: 8 x 32 tiles held in registers, each key vector loaded once for the 8 rows. k: a head's K^T,
 * [d_k, padded], each row padded with zeros to a multiple of 32 keys, so that the last tile reads whole vectors (it
 * is written through ``spill``, as far as ``keys``). */
static void scores_tile(const float *restrict q, int64_t q_dim, const float *restrict k, int64_t padded, int64_t d_k,
                        float scale, float *restrict s, int64_t keys_all, int64_t keys, int rows) {
    float spill[TILE][32];
    for (int64_t j = 0; j < keys; j += 32) {
        int whole = j + 32 <= keys;
        if (rows == TILE) {
#define DECLARE(r) vec16 a##r##0 = {0}, a##r##1 = {0};
            EACH_ROW(DECLARE)
            for (int64_t c = 0; c < d_k; c++) {
                const float *kr = k + c * padded + j, *qr = q + c * q_dim;
                vec16 k0 = load16(kr), k1 = load16(kr + 16);
#define ADD(r) { float x = qr[r]; a##r##0 += x * k0; a##r##1 += x * k1; }
                EACH_ROW(ADD)
            }
            if (whole) {
#define STORE(r) store16(s + r * keys_all + j, a##r##0 * scale); store16(s + r * keys_all + j + 16, a##r##1 * scale);
                EACH_ROW(STORE)
                continue;
            }
#define SPILL_S(r) store16(spill[r], a##r##0 * scale); store16(spill[r] + 16, a##r##1 * scale);
            EACH_ROW(SPILL_S)
        } else {
            for (int r = 0; r < rows; r++) row_product(q + r, q_dim, k + j, padded, d_k, 32, scale, spill[r]);
        }
        int64_t width = whole ? 32 : keys - j;
        for (int r = 0; r < rows; r++) memcpy(s + r * keys_all + j, spill[r], (size_t)width * sizeof(float));
    }
}

/* softmax of w[0 .. visible) in place (exp(s - max) times 1 / their sum); the keys from visible on get 0 (all of
 * them when visible <= 0). */
static void softmax_row(float *restrict w, int64_t keys, int64_t visible) {
    if (visible > keys) visible = keys;
    if (visible <= 0) {
        memset(w, 0, (size_t)keys * sizeof(float));
        return;
    }
    float m, centred, inverse = 1.0f / exponentials(w, visible, &m, &centred);
#pragma omp simd
    for (int64_t j = 0; j < visible; j++) w[j] *= inverse;
    for (int64_t j = visible; j < keys; j++) w[j] = 0.0f;
}

/* out[r * out_row + c] = sum_{j < keys} w[r * keys_all + j] * values[j * padded + c], r < rows (8 or 1), c < d_k;
 * values: a head's V, [n_k, padded], padded = d_k rounded up to 16 (zeros after d_k). */
static void values_tile(const float *restrict w, int64_t keys_all, int64_t keys, int rows,
                        const float *restrict values, int64_t padded, int64_t d_k, float *restrict out,
                        int64_t out_row) {
    float spill[TILE][32];
    for (int64_t c = 0; c < padded; c += 32) {
        int64_t width = padded - c < 32 ? padded - c : 32; /* 32 or 16 */
        if (rows == TILE && width == 32) {
#define DECLARE_V(r) vec16 a##r##0 = {0}, a##r##1 = {0};
            EACH_ROW(DECLARE_V)
            for (int64_t j = 0; j < keys; j++) {
                const float *vr = values + j * padded + c;
                vec16 v0 = load16(vr), v1 = load16(vr + 16);
#define ADD_V(r) { float x = w[r * keys_all + j]; a##r##0 += x * v0; a##r##1 += x * v1; }
                EACH_ROW(ADD_V)
            }
#define SPILL(r) store16(spill[r], a##r##0); store16(spill[r] + 16, a##r##1);
            EACH_ROW(SPILL)
        } else {
            for (int r = 0; r < rows; r++)
                row_product(w + r * keys_all, 1, values + c, padded, keys, (int)width, 1.0f, spill[r]);
        }
        int64_t stop = d_k - c < 32 ? d_k - c : 32;
        for (int r = 0; r < rows; r++) memcpy(out + r * out_row + c, spill[r], (size_t)stop * sizeof(float));
    }
}

int attend(const float *q, const float *k, const float *v, int64_t heads, int64_t n_q, int64_t n_k, int64_t d_k,
           int64_t q_head, int64_t q_dim, int64_t k_head, int64_t k_dim, int64_t v_head, int64_t v_dim, float scale,
           int causal, float *weights, float *out, int threads) {
    if (heads < 1 || n_q < 1 || n_k < 1 || d_k < 1 || threads < 1) return 1;
    int64_t padded = (d_k + 15) / 16 * 16, key_padded = (n_k + 31) / 32 * 32;
    int64_t blocks = (n_q + TILE - 1) / TILE, offset = n_k - n_q;
    /* each head's V, row-major [n_k, padded], and K^T, [d_k, key_padded], zeros after the last column */
    float *values = (float *)malloc((size_t)(heads * (n_k * padded + d_k * key_padded)) * sizeof(float));
    if (!values) return 2;
    float *keys_t = values + heads * n_k * padded;
#pragma omp parallel num_threads(threads)
    {
#if defined(__SSE__)
        unsigned int csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040); /* flush denormal results (FTZ) and inputs (DAZ) to zero */
#endif
#pragma omp for schedule(static)
        for (int64_t h = 0; h < heads; h++) {
            for (int64_t j = 0; j < n_k; j++) {
                float *row = values + (h * n_k + j) * padded;
                for (int64_t c = 0; c < d_k; c++) row[c] = v[h * v_head + c * v_dim + j];
                for (int64_t c = d_k; c < padded; c++) row[c] = 0.0f;
            }
            for (int64_t c = 0; c < d_k; c++) {
                float *row = keys_t + (h * d_k + c) * key_padded;
                for (int64_t j = 0; j < n_k; j++) row[j] = k[h * k_head + c * k_dim + j];
                for (int64_t j = n_k; j < key_padded; j++) row[j] = 0.0f;
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t index = 0; index < heads * blocks; index++) {
            int64_t h = index / blocks, i0 = (index % blocks) * TILE;
            int rows = n_q - i0 < TILE ? (int)(n_q - i0) : TILE;
            float *w = weights + (h * n_q + i0) * n_k;
            /* the keys any row of the block sees: its last row's */
            int64_t keys = causal ? i0 + rows + offset : n_k;
            if (keys > n_k) keys = n_k;
            if (keys < 0) keys = 0;
            scores_tile(q + h * q_head + i0, q_dim, keys_t + h * d_k * key_padded, key_padded, d_k, scale, w, n_k,
                        keys, rows);
            for (int r = 0; r < rows; r++) softmax_row(w + r * n_k, n_k, causal ? i0 + r + 1 + offset : n_k);
            values_tile(w, n_k, keys, rows, values + h * n_k * padded, padded, d_k, out + i0 * heads * d_k + h * d_k,
                        heads * d_k);
        }
#if defined(__SSE__)
        _mm_setcsr(csr);
#endif
    }
    free(values);
    return 0;
}
