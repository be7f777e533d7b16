/* Cross-entropy over wide logits (the MLM decoder's n x 30522), fp32 math on fp32 or bf16
 * logits, in as few passes over memory as the math allows:
 *
 *   forward:  per row, the log-sum-exp (a max pass, then a sum-of-exp pass while the row is
 *             still in cache) and row_loss = lse - x[target]; nothing of size n x V is written;
 *   backward: grad = (exp(x - lse) - onehot(target)) * scale in one pass, in the logits' dtype;
 *   both at once (fp32, training): per row the log-sum-exp, then the gradient while the row is
 *             still in cache, and its column sums (the decoder bias's gradient) on the way,
 *             instead of rereading the n x V logits in the backward and the gradient for the sum.
 *
 * torch's form writes the fp32 log-probabilities (n x V) in the forward and rereads them twice
 * in the backward, plus a cast for bf16 logits. Sums of exponentials go through a double per
 * block of 256 so that 30k-term rows keep fp32 accuracy. Rows lie `ld` elements apart (ld >= V):
 * the decoder writes its logits with rows padded to 64 bytes, where BLAS runs ~1.7x faster than
 * into rows of 30522 floats, and the gradient gets the same layout. Built by bertforge/kernels.py.
 */
#include "common.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* log-sum-exp of one fp32 row of V values. */
static float row_lse(const float *row, int64_t V) {
    int64_t full = V / W * W;
    float m = row[0];
    if (full) {
        f32v mv = get_v(row, 0, 0);
        for (int64_t j = W; j < full; j += W) {
            f32v v = get_v(row, 0, j);
            mv = select(v > mv, v, mv);
        }
        for (int k = 0; k < W; k++) m = mv[k] > m ? mv[k] : m;
    }
    for (int64_t j = full; j < V; j++) m = row[j] > m ? row[j] : m;
    double total = 0.0;
    for (int64_t b = 0; b < full; b += 16 * W) { /* 16 vectors: floats, then a double */
        f32v s = get_v(row, 0, 0) * 0.0f;
        int64_t end = b + 16 * W < full ? b + 16 * W : full;
        for (int64_t j = b; j < end; j += W) s += exp_v(get_v(row, 0, j) - m);
        for (int k = 0; k < W; k++) total += s[k];
    }
    for (int64_t j = full; j < V; j++) total += exp_s(row[j] - m);
    return m + (float)__builtin_log(total);
}

/* bf16 rows are first widened into a per-thread fp32 row (`work`, threads x V), so that both
 * passes of row_lse read fp32 from cache; fp32 rows are read in place (work unused). */
INLINE void ce_forward(const void *x, const int64_t *target, float *lse, float *row_loss,
                       float *work, int64_t n, int64_t V, int64_t ld, int threads, int bf16) {
    int64_t full = V / W * W;
#pragma omp parallel num_threads(threads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *wide = bf16 ? work + (int64_t)t * V : 0;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *row = (const float *)x + i * ld;
            if (bf16) {
                for (int64_t j = 0; j < full; j += W) put_v(wide, 0, j, get_v(x, 1, i * ld + j));
                for (int64_t j = full; j < V; j++) wide[j] = get1(x, 1, i * ld + j);
                row = wide;
            }
            lse[i] = row_lse(row, V);
            row_loss[i] = lse[i] - row[target[i]];
        }
    }
}

INLINE void ce_backward(const void *x, const int64_t *target, const float *lse, void *grad,
                        int64_t n, int64_t V, int64_t ld, float scale, int threads, int bf16) {
    int64_t full = V / W * W;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        int64_t at = i * ld;
        float l = lse[i];
        for (int64_t j = 0; j < full; j += W)
            put_v(grad, bf16, at + j, exp_v(get_v(x, bf16, at + j) - l) * scale);
        for (int64_t j = full; j < V; j++) put1(grad, bf16, at + j, exp_s(get1(x, bf16, at + j) - l) * scale);
        int64_t t = at + target[i];
        put1(grad, bf16, t, exp_s(get1(x, bf16, t) - l) * scale - scale);
    }
}

void bertforge_ce_forward_f32(const float *x, const int64_t *target, float *lse, float *row_loss,
                              int64_t n, int64_t V, int64_t ld, int threads) {
    ce_forward(x, target, lse, row_loss, 0, n, V, ld, threads, 0);
}

void bertforge_ce_forward_bf16(const uint16_t *x, const int64_t *target, float *lse,
                               float *row_loss, float *work, int64_t n, int64_t V, int64_t ld,
                               int threads) {
    ce_forward(x, target, lse, row_loss, work, n, V, ld, threads, 1);
}

void bertforge_ce_backward_f32(const float *x, const int64_t *target, const float *lse,
                               float *grad, int64_t n, int64_t V, int64_t ld, float scale,
                               int threads) {
    ce_backward(x, target, lse, grad, n, V, ld, scale, threads, 0);
}

void bertforge_ce_backward_bf16(const uint16_t *x, const int64_t *target, const float *lse,
                                uint16_t *grad, int64_t n, int64_t V, int64_t ld, float scale,
                                int threads) {
    ce_backward(x, target, lse, grad, n, V, ld, scale, threads, 1);
}

/* Forward and backward at once: lse, row_loss, grad = (softmax - onehot) * scale (rows `ld`
 * apart, as x) and colsum = the column sums of grad (V floats). `work` holds threads x V
 * partial column sums, each thread's over its own rows; summed in a second pass over V. */
void bertforge_ce_forward_backward_f32(const float *x, const int64_t *target, float *lse,
                                       float *row_loss, float *grad, float *colsum, float *work,
                                       int64_t n, int64_t V, int64_t ld, float scale,
                                       int threads) {
    int64_t full = V / W * W;
    for (int64_t k = 0; k < (int64_t)threads * V; k++) work[k] = 0.0f; /* any team size */
#pragma omp parallel num_threads(threads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *sums = work + (int64_t)t * V;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *row = x + i * ld;
            float *g = grad + i * ld;
            float l = row_lse(row, V);
            lse[i] = l;
            row_loss[i] = l - row[target[i]];
            for (int64_t j = 0; j < full; j += W) {
                f32v v = exp_v(get_v(row, 0, j) - l) * scale;
                put_v(g, 0, j, v);
                put_v(sums, 0, j, get_v(sums, 0, j) + v);
            }
            for (int64_t j = full; j < V; j++) {
                g[j] = exp_s(row[j] - l) * scale;
                sums[j] += g[j];
            }
            g[target[i]] -= scale;
            sums[target[i]] -= scale;
        }
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t j = 0; j < V; j++) {
        float total = 0.0f;
        for (int t = 0; t < threads; t++) total += work[(int64_t)t * V + j];
        colsum[j] = total;
    }
}
