/* Dropout for CPU tensors: the keep-mask drawn from a counter-based generator and applied in the
 * same pass as the 1 / (1 - p) scaling.
 *
 * Element i is kept when its 16-bit uniform u_i >= threshold (threshold = round(p * 2^16)). The
 * elements go in blocks of 256; in a block, element j reads bits 16 * (j / 64) .. + 15 of word
 * mix(seed + (64 * block + j % 64) * GOLDEN), mix being the splitmix64 finaliser: one 64-bit
 * word gives four uniforms, and every inner loop below is a plain vector loop. The mask is a
 * pure function of (seed, i): the backward pass recomputes it instead of keeping it, and the
 * result does not depend on the number of threads.
 *
 * Built by bertforge/kernels.py with the system C compiler; bertforge falls back to torch ops
 * when no compiler is available.
 */
#include "common.h"

#define BLOCK 256
#define WORDS 64 /* BLOCK / 4 */

/* The 16-bit uniforms of one block: u[j] for j < BLOCK. */
INLINE void block_uniforms(uint64_t seed, int64_t block, uint32_t *u) {
    uint64_t r[WORDS];
    uint64_t base = seed + (uint64_t)block * WORDS * GOLDEN;
    for (int w = 0; w < WORDS; w++) r[w] = mix(base + (uint64_t)w * GOLDEN);
    for (int k = 0; k < 4; k++)
        for (int w = 0; w < WORDS; w++) u[k * WORDS + w] = (uint32_t)(r[w] >> (16 * k)) & 0xffffu;
}

/* out[i] = x[i] * scale where kept, 0 elsewhere; x and out may be the same buffer. */
INLINE void dropout(const void *x, void *out, int64_t n, uint64_t seed, uint32_t threshold,
                    float scale, int threads, int bf16) {
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        uint32_t u[BLOCK];
        block_uniforms(seed, b, u);
        int64_t start = b * BLOCK, len = n - start < BLOCK ? n - start : BLOCK;
        for (int64_t j = 0; j < len; j++) {
            float v = u[j] >= threshold ? get1(x, bf16, start + j) * scale : 0.0f;
            put1(out, bf16, start + j, v);
        }
    }
}

void bertforge_dropout_f32(const float *x, float *out, int64_t n, uint64_t seed,
                           uint32_t threshold, float scale, int threads) {
    dropout(x, out, n, seed, threshold, scale, threads, 0);
}

void bertforge_dropout_bf16(const uint16_t *x, uint16_t *out, int64_t n, uint64_t seed,
                            uint32_t threshold, float scale, int threads) {
    dropout(x, out, n, seed, threshold, scale, threads, 1);
}

/* Floats per vector in this build (W of common.h): lets Python report and the tests check which
 * instruction set's code runs. */
int bertforge_vector_width(void) { return W; }
