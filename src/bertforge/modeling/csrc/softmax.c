/* Attention probabilities with dropout over the rows of (rows, T) fp32 scores, forward and
 * backward each in one pass (the scores of a (B, nh, Tq, T) batch, row-major):
 *
 *   forward:  probs = softmax(scores * scale) with the padded keys (mask[b, t] == 0) left out,
 *             written over the scores; dropped = probs * keep (the dropout mask of row-wise
 *             kernels, common.h) in a second buffer; both are kept for the backward;
 *   backward: grad_scores = (grad_dropped * dropped - probs * sum(grad_dropped * dropped)) * scale,
 *             written over grad_dropped: since dropped = probs * keep, this is softmax's backward
 *             of the dropout's backward, with no mask to recompute.
 *
 * torch's explicit attention runs the scaling of q, the masking, the softmax, the dropout and
 * their backwards as separate passes over the (B, nh, T, T) scores. A row whose keys are all
 * padding gets the uniform distribution, as torch's softmax over equal (masked) scores gives.
 * Built by kernels.py.
 */
#include "common.h"

#define VEC_LOOP(j, n) for (j = 0; j + W <= (n); j += W)

/* mask: (batches, T) bytes, 1 at real keys, or NULL; row r belongs to batch r / rows_per_batch.
 * dropped is written only when threshold > 0 (it may be NULL otherwise). */
void bertforge_softmax_dropout_forward_f32(float *scores, float *dropped, const uint8_t *mask,
                                           int64_t rows, int64_t T, int64_t rows_per_batch,
                                           float scale, uint64_t seed, uint32_t threshold,
                                           float keep_scale, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *s = scores + r * T;
        const uint8_t *mk = mask ? mask + (r / rows_per_batch) * T : 0;
        float keep[threshold ? T : 1];
        int64_t j;
        float m = -__builtin_inff();
        if (mk) {
            for (j = 0; j < T; j++) { /* masked keys: -inf, so that exp gives exactly 0 */
                s[j] = mk[j] ? s[j] * scale : -__builtin_inff();
                m = s[j] > m ? s[j] : m;
            }
        } else {
            f32v mv = (f32v){0} - __builtin_inff();
            VEC_LOOP(j, T) {
                f32v v = get_v(s, 0, j) * scale;
                put_v(s, 0, j, v);
                mv = select(v > mv, v, mv);
            }
            for (int k = 0; k < W; k++) m = mv[k] > m ? mv[k] : m;
            for (; j < T; j++) {
                s[j] *= scale;
                m = s[j] > m ? s[j] : m;
            }
        }
        if (m == -__builtin_inff()) { /* every key is padding: uniform, as torch gives */
            for (j = 0; j < T; j++) s[j] = 0.0f;
            m = 0.0f;
            mk = 0;
        }
        f32v acc = {0};
        float tail = 0.0f;
        VEC_LOOP(j, T) {
            f32v e = exp_v(get_v(s, 0, j) - m); /* exp_v clamps at -80: masked keys -> ~1e-35 */
            put_v(s, 0, j, e);
            acc += e;
        }
        for (; j < T; j++) {
            s[j] = exp_s(s[j] - m);
            tail += s[j];
        }
        if (mk) { /* exactly zero at padded keys, not exp(-80) */
            acc = (f32v){0};
            tail = 0.0f;
            for (j = 0; j < T; j++) {
                s[j] = mk[j] ? s[j] : 0.0f;
                tail += s[j];
            }
        }
        float inv = 1.0f / (hsum(acc) + tail);
        if (threshold) row_keep(seed, r, T, threshold, keep_scale, keep);
        float *d = threshold && dropped ? dropped + r * T : 0;
        VEC_LOOP(j, T) {
            f32v p = get_v(s, 0, j) * inv;
            put_v(s, 0, j, p);
            if (d) put_v(d, 0, j, p * get_v(keep, 0, j));
        }
        for (; j < T; j++) {
            s[j] *= inv;
            if (d) d[j] = s[j] * keep[j];
        }
    }
}

/* dropped may be probs itself (no dropout). */
void bertforge_softmax_dropout_backward_f32(float *grad, const float *probs, const float *dropped,
                                            int64_t rows, int64_t T, float scale, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *g = grad + r * T;
        const float *p = probs + r * T, *d = dropped + r * T;
        f32v acc = {0};
        float tail = 0.0f;
        int64_t j;
        VEC_LOOP(j, T) acc += get_v(g, 0, j) * get_v(d, 0, j);
        for (; j < T; j++) tail += g[j] * d[j];
        float c = hsum(acc) + tail;
        VEC_LOOP(j, T) {
            f32v v = (get_v(g, 0, j) * get_v(d, 0, j) - get_v(p, 0, j) * c) * scale;
            put_v(g, 0, j, v);
        }
        for (; j < T; j++) g[j] = (g[j] * d[j] - p[j] * c) * scale;
    }
}
