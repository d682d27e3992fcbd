/* quant_testutil.h - random blocks and reference dots for the quant tests. */
#ifndef STRATA_QUANT_TESTUTIL_H
#define STRATA_QUANT_TESTUTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

static uint64_t qt_rng = 0x9e3779b97f4a7c15ull;

static uint32_t qt_rand(void)
{
    qt_rng ^= qt_rng << 13;
    qt_rng ^= qt_rng >> 7;
    qt_rng ^= qt_rng << 17;
    return (uint32_t)(qt_rng >> 16);
}

/* uniform in [-1, 1) */
__attribute__((unused)) static float qt_uniform(void)
{
    return (float)((int32_t)qt_rand() % 1000000) / 1000000.f;
}

__attribute__((unused)) static void qt_put_f16(uint8_t *p, float v)
{
    strata_f16 h = strata_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* A sane random scale: magnitude in [0.002, 0.02], random sign if signed. */
__attribute__((unused)) static float qt_scale(int allow_negative)
{
    float v = 0.002f + 0.018f * fabsf(qt_uniform());
    return allow_negative && (qt_rand() & 1) ? -v : v;
}

static const uint32_t qt_types[] = {
    STRATA_TYPE_F32,    STRATA_TYPE_F16,     STRATA_TYPE_BF16,   STRATA_TYPE_Q4_0,
    STRATA_TYPE_Q4_1,   STRATA_TYPE_Q5_0,    STRATA_TYPE_Q5_1,   STRATA_TYPE_Q8_0,
    STRATA_TYPE_Q2_K,   STRATA_TYPE_Q3_K,    STRATA_TYPE_Q4_K,   STRATA_TYPE_Q5_K,
    STRATA_TYPE_Q6_K,   STRATA_TYPE_IQ1_S,   STRATA_TYPE_IQ1_M,  STRATA_TYPE_IQ2_XXS,
    STRATA_TYPE_IQ2_XS, STRATA_TYPE_IQ2_S,   STRATA_TYPE_IQ3_XXS, STRATA_TYPE_IQ3_S,
    STRATA_TYPE_IQ4_NL, STRATA_TYPE_IQ4_XS,  STRATA_TYPE_MXFP4,
};
#define QT_N_TYPES (sizeof(qt_types) / sizeof(qt_types[0]))

/* Fill nb blocks of type with random bits, then give every float scale field
 * a sane value (random bits there would be nan/inf or astronomically large). */
__attribute__((unused)) static void qt_random_blocks(uint32_t type, void *buf, int64_t nb)
{
    size_t bsz = strata_ggml_type_size(type);
    uint8_t *p = buf;
    for (size_t i = 0; i < bsz * (size_t)nb; i++)
        p[i] = (uint8_t)qt_rand();
    for (int64_t b = 0; b < nb; b++, p += bsz) {
        switch (type) {
        case STRATA_TYPE_F32: memcpy(p, &(float){qt_uniform()}, 4); break;
        case STRATA_TYPE_F16: qt_put_f16(p, qt_uniform()); break;
        case STRATA_TYPE_BF16: {
            strata_bf16 h = strata_f32_to_bf16(qt_uniform());
            p[0] = (uint8_t)h;
            p[1] = (uint8_t)(h >> 8);
            break;
        }
        case STRATA_TYPE_Q4_1:
        case STRATA_TYPE_Q5_1:
            qt_put_f16(p, qt_scale(0));
            qt_put_f16(p + 2, qt_scale(1));
            break;
        case STRATA_TYPE_Q4_K:
        case STRATA_TYPE_Q5_K:
            qt_put_f16(p, qt_scale(0));
            qt_put_f16(p + 2, qt_scale(0));
            break;
        case STRATA_TYPE_Q2_K:
            qt_put_f16(p + 80, qt_scale(0));
            qt_put_f16(p + 82, qt_scale(0));
            break;
        case STRATA_TYPE_Q3_K: qt_put_f16(p + 108, qt_scale(1)); break;
        case STRATA_TYPE_Q6_K: qt_put_f16(p + 208, qt_scale(1)); break;
        case STRATA_TYPE_MXFP4: p[0] = (uint8_t)(118 + qt_rand() % 12); break;
        case STRATA_TYPE_IQ1_M: {
            strata_f16 h = strata_f32_to_f16(qt_scale(1));
            for (int i = 0; i < 4; i++) /* top nibble of each 16-bit scale word */
                p[48 + 2 * i + 1] = (uint8_t)((p[48 + 2 * i + 1] & 0x0F) |
                                              (((h >> (4 * i)) & 0xF) << 4));
            break;
        }
        default: qt_put_f16(p, qt_scale(1)); break; /* d first */
        }
    }
}

/* Dequantised activations (what the kernel actually multiplies with). */
__attribute__((unused)) static void qt_act_values(uint32_t vt, const void *act, int64_t n, double *out)
{
    if (vt == STRATA_TYPE_F32) {
        for (int64_t i = 0; i < n; i++)
            out[i] = ((const float *)act)[i];
    } else if (vt == STRATA_TYPE_Q8_0) {
        const struct strata_block_q8_0 *b = act;
        for (int64_t i = 0; i < n; i++)
            out[i] = (double)strata_f16_to_f32(b[i / 32].d) * b[i / 32].qs[i % 32];
    } else {
        const struct strata_block_q8_K *b = act;
        for (int64_t i = 0; i < n; i++)
            out[i] = (double)b[i / 256].d * b[i / 256].qs[i % 256];
    }
}

#endif
