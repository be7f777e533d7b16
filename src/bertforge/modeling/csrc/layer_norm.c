/* Bias + dropout + residual add + LayerNorm over the rows of an (n, H) fp32 matrix, forward and
 * backward each in one pass over memory (the end of BERT's post-LN blocks:
 * LayerNorm(dropout(y + bias) + residual), y a bias-free projection):
 *
 *   forward:  h = (y + bias) * keep + residual, written over y (the caller's buffer, which nobody
 *             else holds); out = (h - mean) * rstd * gamma + beta; mean and rstd kept per row;
 *   backward: from grad_out, h, mean and rstd: grad_h (the residual's gradient), grad_y = grad_h *
 *             keep (the same mask, recomputed from the seed), and the gamma, beta and bias
 *             gradients summed per thread, then across threads.
 *
 * torch adds the bias in the product's GEMM (a pass to broadcast it first), runs dropout, the
 * add, the normalisation and its backward as separate passes over the matrix, plus the column
 * sums of the bias, gamma and beta gradients. Rows are short (H = 256
 * for BERT-Mini): each is read from memory once and reused from L1. Built by kernels.py.
 */
#include "common.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define VEC_LOOP(j, n) for (j = 0; j + W <= (n); j += W)

/* One row of the forward; bias, res or keep NULL: none. */
INLINE void norm_row(float *y, const float *bias, const float *res, const float *gamma,
                     const float *beta, float *out, float *mean_out, float *rstd_out,
                     const float *keep, int64_t H, float eps) {
    f32v acc = {0};
    float tail = 0.0f;
    int64_t j;
    VEC_LOOP(j, H) {
        f32v v = get_v(y, 0, j);
        if (bias) v += get_v(bias, 0, j);
        if (keep) v *= get_v(keep, 0, j);
        if (res) v += get_v(res, 0, j);
        put_v(y, 0, j, v);
        acc += v;
    }
    for (; j < H; j++) {
        float v = y[j] + (bias ? bias[j] : 0.0f);
        v = v * (keep ? keep[j] : 1.0f) + (res ? res[j] : 0.0f);
        y[j] = v;
        tail += v;
    }
    float mean = (hsum(acc) + tail) / (float)H;
    acc = (f32v){0};
    tail = 0.0f;
    VEC_LOOP(j, H) {
        f32v d = get_v(y, 0, j) - mean;
        acc += d * d;
    }
    for (; j < H; j++) tail += (y[j] - mean) * (y[j] - mean);
    float rstd = 1.0f / __builtin_sqrtf((hsum(acc) + tail) / (float)H + eps);
    VEC_LOOP(j, H) {
        f32v xhat = (get_v(y, 0, j) - mean) * rstd;
        put_v(out, 0, j, xhat * get_v(gamma, 0, j) + get_v(beta, 0, j));
    }
    for (; j < H; j++) out[j] = (y[j] - mean) * rstd * gamma[j] + beta[j];
    *mean_out = mean;
    *rstd_out = rstd;
}

void bertforge_add_norm_forward_f32(float *y, const float *bias, const float *res,
                                    const float *gamma, const float *beta, float *out, float *mean, float *rstd,
                                    int64_t n, int64_t H, uint64_t seed, uint32_t threshold,
                                    float scale, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float keep[threshold ? H : 1];
        if (threshold) row_keep(seed, i, H, threshold, scale, keep);
        norm_row(y + i * H, bias, res ? res + i * H : 0, gamma, beta, out + i * H, mean + i,
                 rstd + i, threshold ? keep : 0, H, eps);
    }
}

/* grad_y is written only when threshold > 0 (no dropout: grad_y is grad_h; it may be NULL); grad_extra (may be NULL) is a gradient of
 * h from elsewhere, added to grad_h; grad_bias (may be NULL) receives the column sums of grad_y;
 * work holds 3 * H floats per thread. */
void bertforge_add_norm_backward_f32(const float *grad_out, const float *h, const float *mean,
                                     const float *rstd, const float *gamma,
                                     const float *grad_extra, float *grad_h,
                                     float *grad_y, float *grad_gamma, float *grad_beta,
                                     float *grad_bias,
                                     float *work, int64_t n, int64_t H, uint64_t seed,
                                     uint32_t threshold, float scale, int threads) {
    int used = 1;
#pragma omp parallel num_threads(threads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#pragma omp single
        used = omp_get_num_threads();
#endif
        float *dg = work + (int64_t)t * 3 * H, *db = dg + H, *dy = db + H;
        memset(dg, 0, 3 * H * sizeof(float));
        float keep[threshold ? H : 1];
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *go = grad_out + i * H, *x = h + i * H;
            float m = mean[i], r = rstd[i];
            /* sums over the row: g = grad_out * gamma, a = mean(g), b = mean(g * xhat) */
            f32v va = {0}, vb = {0};
            float sa = 0.0f, sb = 0.0f;
            int64_t j;
            VEC_LOOP(j, H) {
                f32v gov = get_v(go, 0, j), xhat = (get_v(x, 0, j) - m) * r;
                f32v g = gov * get_v(gamma, 0, j);
                va += g;
                vb += g * xhat;
                put_v(dg, 0, j, get_v(dg, 0, j) + gov * xhat);
                put_v(db, 0, j, get_v(db, 0, j) + gov);
            }
            for (; j < H; j++) {
                float xhat = (x[j] - m) * r, g = go[j] * gamma[j];
                sa += g;
                sb += g * xhat;
                dg[j] += go[j] * xhat;
                db[j] += go[j];
            }
            float a = (hsum(va) + sa) / (float)H, b = (hsum(vb) + sb) / (float)H;
            float *gh = grad_h + i * H, *gy = threshold && grad_y ? grad_y + i * H : 0;
            const float *ge = grad_extra ? grad_extra + i * H : 0;
            if (gy) row_keep(seed, i, H, threshold, scale, keep);
            VEC_LOOP(j, H) {
                f32v xhat = (get_v(x, 0, j) - m) * r;
                f32v v = (get_v(go, 0, j) * get_v(gamma, 0, j) - a - xhat * b) * r;
                if (ge) v += get_v(ge, 0, j);
                put_v(gh, 0, j, v);
                if (gy) v *= get_v(keep, 0, j);
                if (gy) put_v(gy, 0, j, v);
                if (grad_bias) put_v(dy, 0, j, get_v(dy, 0, j) + v);
            }
            for (; j < H; j++) {
                float xhat = (x[j] - m) * r;
                float v = (go[j] * gamma[j] - a - xhat * b) * r + (ge ? ge[j] : 0.0f);
                gh[j] = v;
                if (gy) v *= keep[j];
                if (gy) gy[j] = v;
                if (grad_bias) dy[j] += v;
            }
        }
    }
    for (int64_t j = 0; j < H; j++) { /* threads' partial sums, in a fixed order */
        float sg = 0.0f, sb = 0.0f, sy = 0.0f;
        for (int t = 0; t < used; t++) {
            sg += work[(int64_t)t * 3 * H + j];
            sb += work[(int64_t)t * 3 * H + H + j];
            sy += work[(int64_t)t * 3 * H + 2 * H + j];
        }
        grad_gamma[j] = sg;
        grad_beta[j] = sb;
        if (grad_bias) grad_bias[j] = sy;
    }
}
