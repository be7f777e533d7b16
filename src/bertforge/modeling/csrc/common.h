/* What bertforge's C kernels share: float vectors of one machine register (GCC/Clang vector
 * extensions), Cephes' single-precision exp on them, bf16 <-> fp32 conversions, and the dropout
 * masks of the row-wise kernels.
 * Every element type a kernel serves is a flag (0: fp32, 1: bf16) of an always-inlined body,
 * so that each exported function is compiled for one type with no branch left inside its loops.
 */
#ifndef BERTFORGE_COMMON_H
#define BERTFORGE_COMMON_H

#include <stdint.h>
#include <string.h>

/* Floats per vector: one register of the instruction set the library is built for. A wider
 * vector than the registers is legal C, but GCC then lowers comparisons and conversions lane by
 * lane (16-float vectors on an AVX2 Zen 3: exp ran ~9x slower than with 8-float ones). */
#if defined(__AVX512F__)
#define W 16
#elif defined(__AVX__)
#define W 8
#else
#define W 4 /* SSE2 (x86-64's baseline) and NEON: 128-bit registers */
#endif
#define INLINE static inline __attribute__((always_inline))

typedef float f32v __attribute__((vector_size(4 * W)));
typedef int32_t i32v __attribute__((vector_size(4 * W)));
typedef uint32_t u32v __attribute__((vector_size(4 * W)));
typedef uint16_t u16v __attribute__((vector_size(2 * W)));

INLINE f32v select(i32v mask, f32v a, f32v b) { /* mask ? a : b, lane by lane */
    return (f32v)(((i32v)a & mask) | ((i32v)b & ~mask));
}

/* exp(x): n = round(x / ln 2), r = x - n ln 2 (two parts), exp(r) by a degree-6 polynomial,
 * times 2^n built in the exponent bits; x clamped to [-80, 88]: exp(-80) ~ 1.8e-35 stays a
 * normal float, since arithmetic on denormals is many times slower. */
INLINE f32v exp_v(f32v x) {
    const f32v lo = x - x - 80.0f, hi = x - x + 88.0f;
    x = select(x > lo, x, lo);
    x = select(x < hi, x, hi);
    f32v fx = x * 1.44269504088896341f + 0.5f;
    f32v n = __builtin_convertvector(__builtin_convertvector(fx, i32v), f32v); /* trunc */
    n = n - select(n > fx, n - n + 1.0f, n - n);                              /* floor */
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

INLINE float exp_s(float x) { /* the same function on one float */
    f32v v = {x};
    return exp_v(v)[0];
}

/* bf16 is the upper half of an fp32; fp32 -> bf16 rounds to nearest even, NaN stays NaN. */
INLINE u16v round_bf16(f32v f) {
    u32v u = (u32v)f;
    u32v rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    i32v is_nan = (i32v)((u & 0x7fffffffu) > 0x7f800000u);
    u32v out = (u32v)select(is_nan, (f32v)((u >> 16) | 0x40u), (f32v)rounded);
    return __builtin_convertvector(out, u16v);
}

/* Element k of an fp32 (bf16 = 0) or bf16 (bf16 = 1) array, as float; and the store back. */
INLINE float get1(const void *p, int bf16, int64_t k) {
    if (!bf16) return ((const float *)p)[k];
    union { uint32_t u; float f; } v = {(uint32_t)((const uint16_t *)p)[k] << 16};
    return v.f;
}

INLINE void put1(void *p, int bf16, int64_t k, float f) {
    if (!bf16) {
        ((float *)p)[k] = f;
        return;
    }
    union { float f; uint32_t u; } v = {f};
    uint32_t u = v.u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    ((uint16_t *)p)[k] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

/* W elements from k on, as a vector; and the store back. */
INLINE f32v get_v(const void *p, int bf16, int64_t k) {
    if (!bf16) {
        f32v v;
        memcpy(&v, (const float *)p + k, sizeof v);
        return v;
    }
    u16v h;
    memcpy(&h, (const uint16_t *)p + k, sizeof h);
    return (f32v)(__builtin_convertvector(h, u32v) << 16);
}

INLINE void put_v(void *p, int bf16, int64_t k, f32v v) {
    if (!bf16) {
        memcpy((float *)p + k, &v, sizeof v);
        return;
    }
    u16v h = round_bf16(v);
    memcpy((uint16_t *)p + k, &h, sizeof h);
}

/* ---- random keep-masks for dropout (csrc/dropout.c and the fused kernels) ------------------- */
#define GOLDEN 0x9e3779b97f4a7c15ULL

INLINE uint64_t mix(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The dropout factors of row `row` (of length n) of a row-wise kernel: keep[j] = scale when the
 * 16-bit uniform of element j is >= threshold, else 0. With q = ceil(n / 4) words per row, word
 * w = mix(seed + (row * q + w) * GOLDEN) gives the uniforms of elements w, w + q, w + 2q, w + 3q
 * (its four 16-bit quarters): a pure function of (seed, row, j), so a backward pass recomputes
 * the mask instead of storing it, and every loop below is a plain vector loop. */
INLINE void row_keep(uint64_t seed, int64_t row, int64_t n, uint32_t threshold, float scale,
                     float *keep) {
    int64_t q = (n + 3) / 4;
    uint64_t base = seed + (uint64_t)row * (uint64_t)q * GOLDEN;
    for (int64_t w = 0; w < q; w++) {
        uint64_t r = mix(base + (uint64_t)w * GOLDEN);
        for (int k = 0; k < 4; k++) {
            int64_t j = w + k * q;
            if (j < n) keep[j] = ((uint32_t)(r >> (16 * k)) & 0xffffu) >= threshold ? scale : 0.0f;
        }
    }
}

/* Sum of a vector's lanes. */
INLINE float hsum(f32v v) {
    float s = 0.0f;
    for (int k = 0; k < W; k++) s += v[k];
    return s;
}

#endif
