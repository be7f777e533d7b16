/* Bias + exact GELU over the rows of an (n, I) fp32 matrix (the feed-forward's first half, after
 * a bias-free product), forward and backward each in one pass:
 *
 *   forward:  out = gelu(x + bias), gelu(u) = u * Phi(u) = u / 2 * (1 + erf(u / sqrt 2));
 *   backward: grad_x = grad * gelu'(x + bias), gelu'(u) = Phi(u) + u * phi(u), and the bias
 *             gradient (the column sums of grad_x) summed per thread in the same pass.
 *
 * torch writes the bias into the product's buffer before the GEMM (a pass), applies GELU in
 * another, and in the backward runs GELU's derivative and the bias' column sums as two passes.
 * erf is Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, the formula of torch's own
 * vectorised erf); its exp(-z^2) is also phi's, so each element costs one exp and one division.
 * Built by kernels.py.
 */
#include "common.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define VEC_LOOP(j, n) for (j = 0; j + W <= (n); j += W)
#define SQRT1_2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

/* Phi(u) = (1 + erf(u / sqrt 2)) / 2 and phi(u) = exp(-u^2 / 2) / sqrt(2 pi), lane by lane. */
INLINE void normal_v(f32v u, f32v *cdf, f32v *pdf) {
    f32v z = u * SQRT1_2;
    i32v neg = (i32v)(z < 0.0f);
    f32v az = select(neg, -z, z);
    f32v t = 1.0f / (1.0f + 0.3275911f * az);
    f32v e = exp_v(-z * z);
    f32v poly = t * (0.254829592f +
                     t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    f32v r = 1.0f - poly * e; /* erf(|z|) */
    *cdf = 0.5f + 0.5f * select(neg, -r, r);
    *pdf = e * INV_SQRT_2PI;
}

INLINE void normal_s(float u, float *cdf, float *pdf) {
    f32v c, p, v = {u};
    normal_v(v, &c, &p);
    *cdf = c[0];
    *pdf = p[0];
}

void bertforge_bias_gelu_forward_f32(const float *x, const float *bias, float *out, int64_t n,
                                     int64_t I, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * I;
        float *oi = out + i * I;
        int64_t j;
        VEC_LOOP(j, I) {
            f32v u = get_v(xi, 0, j) + get_v(bias, 0, j), cdf, pdf;
            normal_v(u, &cdf, &pdf);
            put_v(oi, 0, j, u * cdf);
        }
        for (; j < I; j++) {
            float u = xi[j] + bias[j], cdf, pdf;
            normal_s(u, &cdf, &pdf);
            oi[j] = u * cdf;
        }
    }
}

/* grad_x may be x itself (each element is read before it is written); work: I floats per
 * thread. */
void bertforge_bias_gelu_backward_f32(const float *grad, const float *x, const float *bias,
                                      float *grad_x, float *grad_bias, float *work, int64_t n,
                                      int64_t I, int threads) {
    int used = 1;
#pragma omp parallel num_threads(threads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#pragma omp single
        used = omp_get_num_threads();
#endif
        float *db = work + (int64_t)t * I;
        memset(db, 0, I * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const float *gi = grad + i * I, *xi = x + i * I;
            float *gx = grad_x + i * I;
            int64_t j;
            VEC_LOOP(j, I) {
                f32v u = get_v(xi, 0, j) + get_v(bias, 0, j), cdf, pdf;
                normal_v(u, &cdf, &pdf);
                f32v g = get_v(gi, 0, j) * (cdf + u * pdf);
                put_v(gx, 0, j, g);
                put_v(db, 0, j, get_v(db, 0, j) + g);
            }
            for (; j < I; j++) {
                float u = xi[j] + bias[j], cdf, pdf;
                normal_s(u, &cdf, &pdf);
                float g = gi[j] * (cdf + u * pdf);
                gx[j] = g;
                db[j] += g;
            }
        }
    }
    for (int64_t j = 0; j < I; j++) { /* threads' partial sums, in a fixed order */
        float s = 0.0f;
        for (int t = 0; t < used; t++) s += work[(int64_t)t * I + j];
        grad_bias[j] = s;
    }
}

/* GeGLU over the rows of an (n, 2I) fp32 matrix h = [a | g] (ModernBERT's mlp.Wi output, the
 * gated half a first), forward and backward each in one pass:
 *
 *   forward:  out = gelu(a) * g, an (n, I) matrix;
 *   backward: grad_a = grad * g * gelu'(a) and grad_g = grad * gelu(a), written side by side as
 *             the (n, 2I) gradient of h, gelu(a) recomputed from h (nothing else is saved).
 *
 * torch applies GELU (a pass that writes gelu(a), which autograd keeps) and the product (a
 * second); its backward runs the product's two gradients, GELU's derivative and the
 * concatenation of the halves: four passes and two (n, I) temporaries. */
void bertforge_geglu_forward_f32(const float *h, float *out, int64_t n, int64_t I, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *ai = h + i * 2 * I, *gi = ai + I;
        float *oi = out + i * I;
        int64_t j;
        VEC_LOOP(j, I) {
            f32v u = get_v(ai, 0, j), cdf, pdf;
            normal_v(u, &cdf, &pdf);
            put_v(oi, 0, j, u * cdf * get_v(gi, 0, j));
        }
        for (; j < I; j++) {
            float u = ai[j], cdf, pdf;
            normal_s(u, &cdf, &pdf);
            oi[j] = u * cdf * gi[j];
        }
    }
}

void bertforge_geglu_backward_f32(const float *grad, const float *h, float *grad_h, int64_t n,
                                  int64_t I, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *ai = h + i * 2 * I, *gi = ai + I, *di = grad + i * I;
        float *da = grad_h + i * 2 * I, *dg = da + I;
        int64_t j;
        VEC_LOOP(j, I) {
            f32v u = get_v(ai, 0, j), cdf, pdf;
            normal_v(u, &cdf, &pdf);
            f32v d = get_v(di, 0, j);
            put_v(da, 0, j, d * get_v(gi, 0, j) * (cdf + u * pdf));
            put_v(dg, 0, j, d * u * cdf);
        }
        for (; j < I; j++) {
            float u = ai[j], cdf, pdf;
            normal_s(u, &cdf, &pdf);
            da[j] = di[j] * gi[j] * (cdf + u * pdf);
            dg[j] = di[j] * u * cdf;
        }
    }
}
