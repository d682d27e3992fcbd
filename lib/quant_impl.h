/* quant_impl.h - internals shared by quant.c and the per-ISA kernel files.
 *
 * Each kernel file fills a table indexed by GGUF type id; a NULL entry means
 * the level has no kernel of its own for the type and the next lower level's
 * is used.  The AVX2/AVX-512 files are compiled with their ISA flags
 * (mk/quant.mk) and are only ever called after CPUID said yes.
 */
#ifndef STRATA_QUANT_IMPL_H
#define STRATA_QUANT_IMPL_H

#include "quant.h"

extern const strata_vec_dot_fn strata_quant_dot_scalar[STRATA_TYPE_COUNT];
extern const strata_vec_dot_fn strata_quant_dot_avx2[STRATA_TYPE_COUNT];
extern const strata_vec_dot_fn strata_quant_dot_avx512[STRATA_TYPE_COUNT];

/* AVX2 activation quantisation (quant_avx2.c), bit-identical to the scalar
 * code in quant.c; vec_type STRATA_TYPE_Q8_0 or STRATA_TYPE_Q8_K. */
void strata_quant_act_avx2(uint32_t vec_type, const float *x, void *dst, int64_t n);

/* 6-bit scale and min j (0..7) of a Q4_K/Q5_K block's 12 packed bytes. */
static inline void strata_q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 16 signed 6-bit scales of a Q3_K block (value - 32), from 12 bytes:
 * low 4 bits in bytes 0..7 (two per byte), high 2 bits in bytes 8..11. */
static inline void strata_q3k_scales(const uint8_t *s, int8_t out[16])
{
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
        int hi = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* 2^(e-127) / 2: the E8M0 scale of an MXFP4 block, halved because the value
 * table holds doubled fp4 values (ggml's e8m0_to_fp32_half). */
static inline float strata_e8m0_half(uint8_t e)
{
    union { uint32_t u; float f; } v;
    v.u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

/* The f16 scale of an IQ1_M block, spread over the top 4 bits of its four
 * 16-bit scale words. */
static inline strata_f16 strata_iq1m_scale(const struct strata_block_iq1_m *b)
{
    uint16_t sc[4];
    for (int i = 0; i < 4; i++)
        sc[i] = (uint16_t)(b->scales[2 * i] | (b->scales[2 * i + 1] << 8));
    return (strata_f16)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                        (sc[3] & 0xf000));
}

#endif
