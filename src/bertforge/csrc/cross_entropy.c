/* Cross-entropy over wide logits (the MLM decoder's n x 30522), fp32 math on fp32 or bf16
 * logits, in as few passes over memory as the math allows:
 *
 *   forward:  per row, the log-sum-exp (a max pass, then a sum-of-exp pass while the row is
 *             still in cache) and row_loss = lse - x[target]; nothing of size n x V is written;
 *   backward: grad = (exp(x - lse) - onehot(target)) * scale in one pass, in the logits' dtype.
 *
 * torch's form writes the fp32 log-probabilities (n x V) in the forward and rereads them twice
 * in the backward, plus a cast for bf16 logits. The loops use GCC/Clang vector extensions (16
 * floats at a time, whatever the instruction set), and exp is Cephes' single-precision
 * polynomial (about 1 ulp on its reduced range). Sums of exponentials go through a double per
 * block of 256 so that 30k-term rows keep fp32 accuracy. Built by bertforge/kernels.py.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define W 16 /* floats per vector */
typedef float f32v __attribute__((vector_size(4 * W)));
typedef int32_t i32v __attribute__((vector_size(4 * W)));
typedef uint32_t u32v __attribute__((vector_size(4 * W)));
typedef uint16_t u16v __attribute__((vector_size(2 * W)));

static inline f32v select(i32v mask, f32v a, f32v b) { /* mask ? a : b, lane by lane */
    return (f32v)(((i32v)a & mask) | ((i32v)b & ~mask));
}

/* exp(x): n = round(x / ln 2), r = x - n ln 2 (two parts), exp(r) by a degree-6 polynomial,
 * times 2^n built in the exponent bits; x clamped to [-80, 88]: exp(-80) ~ 1.8e-35 stays a normal
 * float, since arithmetic on denormals is many times slower. */
static inline f32v exp_v(f32v x) {
    const f32v lo = x - x - 80.0f, hi = x - x + 88.0f; /* e^-80: no denormals */
    x = select(x > lo, x, lo);
    x = select(x < hi, x, hi);
    f32v fx = x * 1.44269504088896341f + 0.5f;
    f32v n = __builtin_convertvector(__builtin_convertvector(fx, i32v), f32v); /* trunc */
    n = n - select(n > fx, n - n + 1.0f, n - n); /* floor */
    x = x - n * 0.693359375f + n * 2.12194440e-4f;
    f32v z = x * x;
    f32v y = x * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    i32v e = (__builtin_convertvector(n, i32v) + 127) << 23; /* 2^n */
    return y * (f32v)e;
}

static inline float exp_s(float x) { /* the same function on one float (row tails) */
    f32v v = {x};
    return exp_v(v)[0];
}

static inline f32v load_f32(const float *p) {
    f32v v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline f32v load_bf16(const uint16_t *p) {
    u16v h;
    memcpy(&h, p, sizeof h);
    return (f32v)(__builtin_convertvector(h, u32v) << 16);
}

static inline float bf16_value(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* fp32 -> bf16, rounding to nearest even; NaN stays NaN. */
static inline u16v round_bf16(f32v f) {
    u32v u = (u32v)f;
    u32v rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    i32v is_nan = (i32v)((u & 0x7fffffffu) > 0x7f800000u);
    u32v out = (u32v)select(is_nan, (f32v)((u >> 16) | 0x40u), (f32v)rounded);
    return __builtin_convertvector(out, u16v);
}

static inline uint16_t round_bf16_s(float f) {
    f32v v = {f};
    return round_bf16(v)[0];
}

/* log-sum-exp of one fp32 row of V values. */
static float row_lse(const float *row, int64_t V) {
    int64_t full = V / W * W;
    float m = row[0];
    if (full) {
        f32v mv = load_f32(row);
        for (int64_t j = W; j < full; j += W) {
            f32v v = load_f32(row + j);
            mv = select(v > mv, v, mv);
        }
        for (int k = 0; k < W; k++) m = mv[k] > m ? mv[k] : m;
    }
    for (int64_t j = full; j < V; j++) m = row[j] > m ? row[j] : m;
    double total = 0.0;
    for (int64_t b = 0; b < full; b += 16 * W) { /* blocks of 256: float lanes, then double */
        f32v s = load_f32(row) * 0.0f;
        int64_t end = b + 16 * W < full ? b + 16 * W : full;
        for (int64_t j = b; j < end; j += W) s += exp_v(load_f32(row + j) - m);
        for (int k = 0; k < W; k++) total += s[k];
    }
    for (int64_t j = full; j < V; j++) total += exp_s(row[j] - m);
    return m + (float)__builtin_log(total);
}

void bertforge_ce_forward_f32(const float *x, const int64_t *target, float *lse, float *row_loss,
                              int64_t n, int64_t V, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * V;
        lse[i] = row_lse(row, V);
        row_loss[i] = lse[i] - row[target[i]];
    }
}

void bertforge_ce_backward_f32(const float *x, const int64_t *target, const float *lse,
                               float *grad, int64_t n, int64_t V, float scale, int threads) {
    int64_t full = V / W * W;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * V;
        float *g = grad + i * V;
        float l = lse[i];
        for (int64_t j = 0; j < full; j += W) {
            f32v v = exp_v(load_f32(row + j) - l) * scale;
            memcpy(g + j, &v, sizeof v);
        }
        for (int64_t j = full; j < V; j++) g[j] = exp_s(row[j] - l) * scale;
        g[target[i]] -= scale;
    }
}

/* bf16 logits: each row is widened into a per-thread fp32 row (`work`, threads x V) first, so
 * that both passes of the forward read fp32 from cache. */
void bertforge_ce_forward_bf16(const uint16_t *x, const int64_t *target, float *lse,
                               float *row_loss, float *work, int64_t n, int64_t V, int threads) {
    int64_t full = V / W * W;
#pragma omp parallel num_threads(threads)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *row = work + (int64_t)t * V;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const uint16_t *src = x + i * V;
            for (int64_t j = 0; j < full; j += W) {
                f32v v = load_bf16(src + j);
                memcpy(row + j, &v, sizeof v);
            }
            for (int64_t j = full; j < V; j++) row[j] = bf16_value(src[j]);
            lse[i] = row_lse(row, V);
            row_loss[i] = lse[i] - row[target[i]];
        }
    }
}

void bertforge_ce_backward_bf16(const uint16_t *x, const int64_t *target, const float *lse,
                                uint16_t *grad, int64_t n, int64_t V, float scale, int threads) {
    int64_t full = V / W * W;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *row = x + i * V;
        uint16_t *g = grad + i * V;
        float l = lse[i];
        for (int64_t j = 0; j < full; j += W) {
            u16v h = round_bf16(exp_v(load_bf16(row + j) - l) * scale);
            memcpy(g + j, &h, sizeof h);
        }
        for (int64_t j = full; j < V; j++) g[j] = round_bf16_s(exp_s(bf16_value(row[j]) - l) * scale);
        int64_t t = target[i];
        g[t] = round_bf16_s(exp_s(bf16_value(row[t]) - l) * scale - scale);
    }
}
