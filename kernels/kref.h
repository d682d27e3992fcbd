/* kref.h - host-side helpers shared by the kernel self-test (kernels/selftest.cu) and
 * the kernel tests (tests/gpu/): a random generator, random inputs that are never zero,
 * random weight blocks of every GGUF block type, and the error measure against the
 * CPU reference.  Host code only; the reference decoders are lib/quant.h's.
 *
 * Every function here is static: each translation unit has its own generator state. */
#ifndef STRATA_KERNELS_KREF_H
#define STRATA_KERNELS_KREF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "ggml_types.h"
#include "quant.h"
}

static uint64_t kt_rng = 0x9e3779b97f4a7c15ull;

/* xorshift64; the upper bits. */
static inline uint32_t kt_u32(void)
{
    kt_rng ^= kt_rng << 13;
    kt_rng ^= kt_rng >> 7;
    kt_rng ^= kt_rng << 17;
    return (uint32_t)(kt_rng >> 16);
}

/* Uniform in [lo, hi). */
static inline float kt_unif(float lo, float hi)
{
    return lo + (hi - lo) * (float)(kt_u32() & 0xffffff) / 16777216.0f;
}

/* Random, never exactly zero: |v| in [0.05, 1) * scale, random sign. */
static inline void kt_fill(float *v, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float a = kt_unif(0.05f, 1.0f) * scale;
        v[i] = (kt_u32() & 1) ? -a : a;
    }
}

/* Router logits in double: lref [n_tok, n_expert] = x [n_tok, n] times w [n_expert, n];
 * returns the largest sum of |products| of a logit (for the comparison's tolerance). */
static inline double kt_router_ref(const float *w, const float *x, int n, int n_expert,
                                   int n_tok, float *lref)
{
    double max_mag = 0;
    for (int t = 0; t < n_tok; t++)
        for (int e = 0; e < n_expert; e++) {
            double a = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                a += (double)w[(size_t)e * n + i] * x[(size_t)t * n + i];
                mag += fabs((double)w[(size_t)e * n + i] * x[(size_t)t * n + i]);
            }
            lref[(size_t)t * n_expert + e] = (float)a;
            max_mag = fmax(max_mag, mag);
        }
    return max_mag;
}

/* Max of |a - b| / (atol + rtol * |b|) over n values; a non-finite a counts as
 * infinite.  *worst: the index of the largest. */
static inline double kt_err(const float *a, const float *b, size_t n, double atol, double rtol,
                            size_t *worst)
{
    double m = 0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(a[i]) ? fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]))
                                  : INFINITY;
        if (e > m || (isinf(e) && !isinf(m))) {
            m = e;
            *worst = i;
        }
    }
    return m;
}

static inline void kt_put_f16(uint8_t *p, float f)
{
    strata_f16 h = strata_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* n_rows rows of ne0 random values of type: random quants and signs with small random
 * scales (float types: uniform in [-1, 1)).  Returns malloc'ed bytes (the caller
 * frees), NULL when out of memory; *row_bytes: bytes per row. */
static inline uint8_t *kt_random_rows(uint32_t type, int64_t ne0, int64_t n_rows,
                                      size_t *row_bytes)
{
    size_t rb = strata_ggml_row_size(type, (uint64_t)ne0);
    uint8_t *w = (uint8_t *)malloc(rb * (size_t)n_rows + 1);
    *row_bytes = rb;
    if (!w)
        return NULL;
    if (type == STRATA_TYPE_F32 || type == STRATA_TYPE_F16 || type == STRATA_TYPE_BF16) {
        int64_t n = ne0 * n_rows;
        for (int64_t i = 0; i < n; i++) {
            float f = kt_unif(-1.0f, 1.0f);
            if (type == STRATA_TYPE_F32)
                memcpy(w + 4 * i, &f, 4);
            else if (type == STRATA_TYPE_F16)
                kt_put_f16(w + 2 * i, f);
            else {
                strata_bf16 b = strata_f32_to_bf16(f);
                memcpy(w + 2 * i, &b, 2);
            }
        }
        return w;
    }
    for (size_t i = 0; i < rb * (size_t)n_rows; i++)
        w[i] = (uint8_t)kt_u32();
    size_t bb = strata_ggml_type_size(type);
    size_t nblk = rb * (size_t)n_rows / bb;
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *blk = w + b * bb;
        for (const int *o = strata_ggml_f16_scale_offsets(type); *o >= 0; o++) {
            float s = kt_unif(0.002f, 0.02f);
            kt_put_f16(blk + *o, (kt_u32() & 1) ? -s : s);
        }
        if (type == STRATA_TYPE_IQ1_M) {
            /* the f16 scale is the top nibbles of the four 16-bit scale words */
            strata_f16 h = strata_f32_to_f16(kt_unif(0.002f, 0.02f));
            for (int k = 0; k < 4; k++) {
                uint16_t s;
                memcpy(&s, blk + 48 + 2 * k, 2);
                s = (uint16_t)((s & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
                memcpy(blk + 48 + 2 * k, &s, 2);
            }
        }
        if (type == STRATA_TYPE_MXFP4)
            blk[0] = (uint8_t)(118 + kt_u32() % 8); /* 2^-9 .. 2^-2 */
    }
    return w;
}

/* Every block type the kernels decode. */
static const uint32_t kt_all_types[] = {
    STRATA_TYPE_F32, STRATA_TYPE_F16, STRATA_TYPE_BF16, STRATA_TYPE_Q4_0, STRATA_TYPE_Q4_1,
    STRATA_TYPE_Q5_0, STRATA_TYPE_Q5_1, STRATA_TYPE_Q8_0, STRATA_TYPE_Q2_K, STRATA_TYPE_Q3_K,
    STRATA_TYPE_Q4_K, STRATA_TYPE_Q5_K, STRATA_TYPE_Q6_K, STRATA_TYPE_IQ2_XXS,
    STRATA_TYPE_IQ2_XS, STRATA_TYPE_IQ2_S, STRATA_TYPE_IQ3_XXS, STRATA_TYPE_IQ3_S,
    STRATA_TYPE_IQ1_S, STRATA_TYPE_IQ1_M, STRATA_TYPE_IQ4_NL, STRATA_TYPE_IQ4_XS,
    STRATA_TYPE_MXFP4,
};
#define KT_N_TYPES ((int)(sizeof(kt_all_types) / sizeof(kt_all_types[0])))

#endif
