/* attnviz's one pass over a block of attention scores (`core/fused.py` builds and calls it).

A block is U = B·H units (a batch row's head) of b query rows over W keys, float32, row-major:
row i of unit u at s + (u·b + i)·W. Each row is turned from scores into probabilities in place
(softmax: the row's largest score taken off before the exponential, as torch does), its entropy
−Σ p ln p = ln Z − Σ p s written where asked, and then, while the row is still in the core's
cache, every reduction the recorders asked of the block (`core/reductions.py`):

    tables    Σ_j p[j] t[c, j], each of a group's K columns (a table shared by every unit, or
              each unit's own): out (U, b, K)
    queries   out[r, j] += w[r, i] p[j] over the block's rows i: out (U, R, W), zero on entry
    keymax    the row's largest p[j] over the keys a mask marks, −1 where the block has none:
              out (U, b)
    bins      the max (or sum) of each square of `size` rows by `size` keys, squares at
              multiples of `size` of the text's rows and keys: out (U, count, C), C = ⌈W/size⌉,
              set here; each key's over a bin's rows first, into `scratch` (U, count, W),
              then, once a unit's rows are done, `size` keys at a time into a cell
    lists     Σ p[k] over the row's own keys k (row i's: keys[offsets[i] … offsets[i+1]−1],
              those past the row's width counting 0), in double, in the order listed: out
              (U, b) doubles `stride` apart

A causal block (`causal`, no mask) has row i see keys 0 … start + i: the later keys are 0. Units
run in parallel (OpenMP), rows within a unit in order, so no two threads write one output. The
reductions read GROUP rows at once: a table's column, an accumulator or a bin is then read
from the cache once for GROUP rows, not once for each. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define GROUP 4

int64_t attnviz_fused_version(void) { return 5; }

/* Row r (of v keys seen, W in all) from scores into probabilities, in place; its entropy. */
static float softmax(float *r, int64_t v, int64_t W)
{
    float m = r[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 1; j < v; j++) m = r[j] > m ? r[j] : m;
    double sum = 0.0, es = 0.0;
#pragma omp simd reduction(+ : sum, es)
    for (int64_t j = 0; j < v; j++) {
        float e = expf(r[j] - m);
        sum += e;
        es += (double)e * r[j];
        r[j] = e;
    }
    float inv = (float)(1.0 / sum);
#pragma omp simd
    for (int64_t j = 0; j < v; j++) r[j] *= inv;
    if (v < W) memset(r + v, 0, (size_t)(W - v) * sizeof(float));
    return (float)(m + log(sum) - es / sum);
}

/* Σ_j p[j] t[j] of GROUP rows p0 … p3 (rows past the group's are p0 again, dropped) and 4
   columns t0 … t3 of a table, over keys 0 … v−1: a[row][column]. */
static void four_by_four(const float *p0, const float *p1, const float *p2, const float *p3,
                         const float *t0, const float *t1, const float *t2, const float *t3,
                         int64_t v, float a[4][4])
{
    float a00 = 0.f, a01 = 0.f, a02 = 0.f, a03 = 0.f, a10 = 0.f, a11 = 0.f, a12 = 0.f, a13 = 0.f;
    float a20 = 0.f, a21 = 0.f, a22 = 0.f, a23 = 0.f, a30 = 0.f, a31 = 0.f, a32 = 0.f, a33 = 0.f;
#pragma omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, \
                               a30, a31, a32, a33)
    for (int64_t j = 0; j < v; j++) {
        float x0 = t0[j], x1 = t1[j], x2 = t2[j], x3 = t3[j];
        float q0 = p0[j], q1 = p1[j], q2 = p2[j], q3 = p3[j];
        a00 += q0 * x0, a01 += q0 * x1, a02 += q0 * x2, a03 += q0 * x3;
        a10 += q1 * x0, a11 += q1 * x1, a12 += q1 * x2, a13 += q1 * x3;
        a20 += q2 * x0, a21 += q2 * x1, a22 += q2 * x2, a23 += q2 * x3;
        a30 += q3 * x0, a31 += q3 * x1, a32 += q3 * x2, a33 += q3 * x3;
    }
    a[0][0] = a00, a[0][1] = a01, a[0][2] = a02, a[0][3] = a03;
    a[1][0] = a10, a[1][1] = a11, a[1][2] = a12, a[1][3] = a13;
    a[2][0] = a20, a[2][1] = a21, a[2][2] = a22, a[2][3] = a23;
    a[3][0] = a30, a[3][1] = a31, a[3][2] = a32, a[3][3] = a33;
}


void attnviz_fused_block(
    float *s, int64_t U, int64_t b, int64_t W, int64_t start, int64_t causal, float *entropy,
    int64_t n_tables, const int64_t *table_at, const int64_t *table_k,
    const int64_t *table_unit, const int64_t *table_col, const int64_t *table_out,
    int64_t n_queries, const int64_t *query_at, const int64_t *query_r,
    const int64_t *query_stride, const int64_t *query_out,
    int64_t n_keymax, const int64_t *keymax_marks, const int64_t *keymax_any,
    const int64_t *keymax_out,
    int64_t n_bins, const int64_t *bin_size, const int64_t *bin_largest, const int64_t *bin_out,
    const int64_t *bin_scratch,
    int64_t n_lists, const int64_t *list_offsets, const int64_t *list_keys,
    const int64_t *list_out, const int64_t *list_stride,
    int64_t threads)
{
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t u = 0; u < U; u++) {
        for (int64_t g = 0; g < n_bins; g++) {
            int64_t count = (start + b - 1) / bin_size[g] - start / bin_size[g] + 1;
            memset((float *)bin_scratch[g] + u * count * W, 0, (size_t)(count * W) * sizeof(float));
        }
        for (int64_t first = 0; first < b; first += GROUP) {
            int64_t n = b - first < GROUP ? b - first : GROUP;  /* rows in this group */
            float *p[GROUP];
            int64_t seen = 0;  /* keys the group's rows see: its last row's */
            for (int64_t k = 0; k < GROUP; k++) {
                int64_t i = first + (k < n ? k : 0);
                p[k] = s + (u * b + i) * W;
                if (k >= n) continue;
                int64_t v = causal ? start + i + 1 : W;
                if (v > W) v = W;
                float h = softmax(p[k], v, W);
                if (entropy) entropy[u * b + i] = h;
                seen = v > seen ? v : seen;
            }
            /* the rows' sums over each table's columns, 4 rows by 4 columns at a time */
            for (int64_t g = 0; g < n_tables; g++) {
                const float *t = (const float *)table_at[g] + u * table_unit[g];
                int64_t K = table_k[g], col = table_col[g];
                float *out = (float *)table_out[g];
                for (int64_t c = 0; c < K; c += 4) {
                    const float *x[4];
                    for (int64_t e = 0; e < 4; e++) x[e] = t + (c + e < K ? c + e : c) * col;
                    float a[4][4];
                    four_by_four(p[0], p[1], p[2], p[3], x[0], x[1], x[2], x[3], seen, a);
                    for (int64_t k = 0; k < n; k++)
                        for (int64_t e = 0; e < 4 && c + e < K; e++)
                            out[(u * b + first + k) * K + c + e] = a[k][e];
                }
            }
            /* each key's weighted sum over the rows */
            for (int64_t g = 0; g < n_queries; g++) {
                const float *w = (const float *)query_at[g];
                int64_t R = query_r[g];
                for (int64_t q = 0; q < R; q++) {
                    float c[GROUP];
                    for (int64_t k = 0; k < GROUP; k++)
                        c[k] = k < n ? w[q * query_stride[g] + first + k] : 0.f;
                    float *out = (float *)query_out[g] + (u * R + q) * W;
                    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
                    float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
#pragma omp simd
                    for (int64_t j = 0; j < seen; j++)
                        out[j] += c0 * p0[j] + c1 * p1[j] + c2 * p2[j] + c3 * p3[j];
                }
            }
            /* each row's largest weight on the marked keys */
            for (int64_t g = 0; g < n_keymax; g++) {
                const float *marks = (const float *)keymax_marks[g];
                const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
                float m0 = 0.f, m1 = 0.f, m2 = 0.f, m3 = 0.f;
#pragma omp simd reduction(max : m0, m1, m2, m3)
                for (int64_t j = 0; j < seen; j++) {
                    float x = marks[j], y0 = p0[j] * x, y1 = p1[j] * x, y2 = p2[j] * x,
                          y3 = p3[j] * x;
                    m0 = y0 > m0 ? y0 : m0, m1 = y1 > m1 ? y1 : m1;
                    m2 = y2 > m2 ? y2 : m2, m3 = y3 > m3 ? y3 : m3;
                }
                float m[GROUP] = {m0, m1, m2, m3};
                for (int64_t k = 0; k < n; k++)
                    ((float *)keymax_out[g])[u * b + first + k] = keymax_any[g] ? m[k] : -1.f;
            }
            /* each row's sum over its own keys, while the row is in cache */
            for (int64_t g = 0; g < n_lists; g++) {
                const int64_t *offsets = (const int64_t *)list_offsets[g];
                const int64_t *keys = (const int64_t *)list_keys[g];
                double *out = (double *)list_out[g];
                for (int64_t k = 0; k < n; k++) {
                    int64_t i = first + k;
                    double sum = 0.0;
                    for (int64_t c = offsets[i]; c < offsets[i + 1]; c++)
                        if (keys[c] < W) sum += (double)p[k][keys[c]];
                    out[(u * b + i) * list_stride[g]] = sum;
                }
            }
            /* the squares' rows: each row's into its own row bin, key by key, a run of rows of
               one bin at once */
            for (int64_t g = 0; g < n_bins; g++) {
                int64_t size = bin_size[g], largest = bin_largest[g];
                int64_t count = (start + b - 1) / size - start / size + 1;
                for (int64_t k = 0; k < n;) {
                    int64_t bin = (start + first + k) / size, run = 1;
                    while (k + run < n && (start + first + k + run) / size == bin) run++;
                    float *out = (float *)bin_scratch[g] + (u * count + bin - start / size) * W;
                    const float *p0 = p[k], *p1 = p[k + (run > 1)], *p2 = p[k + 2 * (run > 2)],
                                *p3 = p[k + 3 * (run > 3)];  /* a row twice: max, or 0 × */
                    if (largest) {
#pragma omp simd
                        for (int64_t j = 0; j < seen; j++) {
                            float x = p0[j] > p1[j] ? p0[j] : p1[j];
                            float y = p2[j] > p3[j] ? p2[j] : p3[j];
                            x = x > y ? x : y;
                            out[j] = x > out[j] ? x : out[j];
                        }
                    } else {
                        float c1 = run > 1, c2 = run > 2, c3 = run > 3;
#pragma omp simd
                        for (int64_t j = 0; j < seen; j++)
                            out[j] += p0[j] + c1 * p1[j] + c2 * p2[j] + c3 * p3[j];
                    }
                    k += run;
                }
            }
        }
        /* then the squares' keys: each row bin's keys, `size` at a time, into one cell */
        for (int64_t g = 0; g < n_bins; g++) {
            int64_t size = bin_size[g], largest = bin_largest[g], C = (W + size - 1) / size;
            int64_t count = (start + b - 1) / size - start / size + 1;
            for (int64_t r = 0; r < count; r++) {
                const float *row = (const float *)bin_scratch[g] + (u * count + r) * W;
                float *out = (float *)bin_out[g] + (u * count + r) * C;
                for (int64_t c = 0; c < C; c++) {
                    int64_t lo = c * size, hi = lo + size < W ? lo + size : W;
                    float m = 0.f;  /* weights are ≥ 0: a max from 0 */
                    if (largest) {
#pragma omp simd reduction(max : m)
                        for (int64_t j = lo; j < hi; j++) m = row[j] > m ? row[j] : m;
                    } else {
#pragma omp simd reduction(+ : m)
                        for (int64_t j = lo; j < hi; j++) m += row[j];
                    }
                    out[c] = m;
                }
            }
        }
    }
}
