/* quant.c - GGUF block formats: conversions, reference decoders, activation
 * quantisation and the run-time choice of dot kernels.
 *
 * The reference decoders follow the block layouts of ggml/src/ggml-common.h
 * and the decoding formulas of ggml's dequantize_row_* / gguf-py's
 * quants.py, one plain loop per type.  They are the ground truth that every
 * fast path (SIMD here, GPU kernels elsewhere) is tested against.
 */
#include "quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "iq_tables.h"
#include "quant_impl.h"

_Static_assert(sizeof(struct strata_block_q4_0) == 18, "q4_0 block size");
_Static_assert(sizeof(struct strata_block_q4_1) == 20, "q4_1 block size");
_Static_assert(sizeof(struct strata_block_q5_0) == 22, "q5_0 block size");
_Static_assert(sizeof(struct strata_block_q5_1) == 24, "q5_1 block size");
_Static_assert(sizeof(struct strata_block_q8_0) == 34, "q8_0 block size");
_Static_assert(sizeof(struct strata_block_iq4_nl) == 18, "iq4_nl block size");
_Static_assert(sizeof(struct strata_block_mxfp4) == 17, "mxfp4 block size");
_Static_assert(sizeof(struct strata_block_q2_K) == 84, "q2_K block size");
_Static_assert(sizeof(struct strata_block_q3_K) == 110, "q3_K block size");
_Static_assert(sizeof(struct strata_block_q4_K) == 144, "q4_K block size");
_Static_assert(sizeof(struct strata_block_q5_K) == 176, "q5_K block size");
_Static_assert(sizeof(struct strata_block_q6_K) == 210, "q6_K block size");
_Static_assert(sizeof(struct strata_block_q8_K) == 292, "q8_K block size");
_Static_assert(sizeof(struct strata_block_iq2_xxs) == 66, "iq2_xxs block size");
_Static_assert(sizeof(struct strata_block_iq2_xs) == 74, "iq2_xs block size");
_Static_assert(sizeof(struct strata_block_iq2_s) == 82, "iq2_s block size");
_Static_assert(sizeof(struct strata_block_iq3_xxs) == 98, "iq3_xxs block size");
_Static_assert(sizeof(struct strata_block_iq3_s) == 110, "iq3_s block size");
_Static_assert(sizeof(struct strata_block_iq1_s) == 50, "iq1_s block size");
_Static_assert(sizeof(struct strata_block_iq1_m) == 56, "iq1_m block size");
_Static_assert(sizeof(struct strata_block_iq4_xs) == 136, "iq4_xs block size");

/* ---- scalar conversions ----------------------------------------------- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float strata_f16_to_f32(strata_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

strata_f16 strata_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan (keep nan quiet) */
        return (strata_f16)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (strata_f16)(sign | 0x7c00);
    if (abs < 0x38800000u) {
        /* result is subnormal in f16: scale so the rounding happens in the
         * float addition (round to nearest even by the FPU) */
        float a = bits_f32(abs) + 0.5f; /* 0.5 = 2^-1: ulp 2^-24 */
        return (strata_f16)(sign | (f32_bits(a) - 0x3f000000u));
    }
    uint32_t mant_odd = (abs >> 13) & 1;
    abs += 0xfffu + mant_odd; /* round to nearest even at bit 13 */
    return (strata_f16)(sign | ((abs - (112u << 23)) >> 13));
}

float strata_bf16_to_f32(strata_bf16 h)
{
    return bits_f32((uint32_t)h << 16);
}

strata_bf16 strata_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (strata_bf16)((u >> 16) | 64); /* quiet nan */
    return (strata_bf16)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#define F16(x) strata_f16_to_f32(x)

/* ---- SIMD levels -------------------------------------------------------- */

int strata_quant_simd_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return STRATA_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return STRATA_SIMD_AVX2;
#endif
    return STRATA_SIMD_SCALAR;
}

static const char *const simd_names[STRATA_SIMD_COUNT] = {"scalar", "avx2", "avx512"};

const char *strata_quant_simd_name(int level)
{
    return level >= 0 && level < STRATA_SIMD_COUNT ? simd_names[level] : "?";
}

/* Set once (pthread_once) from CPUID and the environment, then read-only. */
static int simd_level_cached;
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;

static void simd_init(void)
{
    int level = strata_quant_simd_detect();
    const char *e = getenv("STRATA_SIMD");
    if (e) {
        for (int i = 0; i < STRATA_SIMD_COUNT; i++)
            if (strcmp(e, simd_names[i]) == 0 && i < level)
                level = i;
    }
    simd_level_cached = level;
}

int strata_quant_simd_level(void)
{
    pthread_once(&simd_once, simd_init);
    return simd_level_cached;
}

/* ---- reference decoders -------------------------------------------------- */

static void deq_f32(const void *src, float *y, int64_t nb)
{
    memcpy(y, src, (size_t)nb * 4);
}

static void deq_f16(const void *src, float *y, int64_t nb)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < nb; i++)
        y[i] = F16((strata_f16)(p[2 * i] | (p[2 * i + 1] << 8)));
}

static void deq_bf16(const void *src, float *y, int64_t nb)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < nb; i++)
        y[i] = strata_bf16_to_f32((strata_bf16)(p[2 * i] | (p[2 * i + 1] << 8)));
}

static void deq_q4_0(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q4_0 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = F16(b->d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b->qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q4_1 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = F16(b->d), m = F16(b->m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b->qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}

/* 5th bit of element j (0..31) of a Q5_0/Q5_1 block: bit j of qh. */
static int q5_hbit(const uint8_t qh[4], int j)
{
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                 (uint32_t)qh[3] << 24;
    return (h >> j) & 1;
}

static void deq_q5_0(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q5_0 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = F16(b->d);
        for (int j = 0; j < 16; j++) {
            int q0 = (b->qs[j] & 0xF) | q5_hbit(b->qh, j) << 4;
            int q1 = (b->qs[j] >> 4) | q5_hbit(b->qh, j + 16) << 4;
            y[j] = (float)(q0 - 16) * d;
            y[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

static void deq_q5_1(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q5_1 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = F16(b->d), m = F16(b->m);
        for (int j = 0; j < 16; j++) {
            int q0 = (b->qs[j] & 0xF) | q5_hbit(b->qh, j) << 4;
            int q1 = (b->qs[j] >> 4) | q5_hbit(b->qh, j + 16) << 4;
            y[j] = (float)q0 * d + m;
            y[j + 16] = (float)q1 * d + m;
        }
    }
}

static void deq_q8_0(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q8_0 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = F16(b->d);
        for (int j = 0; j < 32; j++)
            y[j] = (float)b->qs[j] * d;
    }
}

static void deq_iq4_nl(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq4_nl *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = F16(b->d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)strata_kvalues_iq4nl[b->qs[j] & 0xF];
            y[j + 16] = d * (float)strata_kvalues_iq4nl[b->qs[j] >> 4];
        }
    }
}

static void deq_mxfp4(const void *src, float *y, int64_t nb)
{
    const struct strata_block_mxfp4 *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 32) {
        float d = strata_e8m0_half(b->e);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)strata_kvalues_mxfp4[b->qs[j] & 0xF] * d;
            y[j + 16] = (float)strata_kvalues_mxfp4[b->qs[j] >> 4] * d;
        }
    }
}

/* Q2_K: 16 groups of 16; element k of 128-half h sits in qs[32h + k%32] at bit
 * pair (k/32); group scale/min are the low/high nibbles of scales[]. */
static void deq_q2_K(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q2_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 256) {
        float d = F16(b->d), dmin = F16(b->dmin);
        for (int k = 0; k < 256; k++) {
            int h = k / 128, r = k % 128;
            int q = (b->qs[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            int g = k / 16;
            float dl = d * (float)(b->scales[g] & 0xF);
            float ml = dmin * (float)(b->scales[g] >> 4);
            y[k] = dl * (float)q - ml;
        }
    }
}

static void deq_q3_K(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q3_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 256) {
        float d = F16(b->d);
        int8_t sc[16];
        strata_q3k_scales(b->scales, sc);
        for (int k = 0; k < 256; k++) {
            int h = k / 128, r = k % 128;
            int lo = (b->qs[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            /* high bit: bit (4h + r/32) of hmask[r % 32]; a clear bit subtracts 4 */
            int hb = (b->hmask[r % 32] >> (4 * h + r / 32)) & 1;
            float dl = d * (float)sc[k / 16];
            y[k] = dl * (float)(lo - (hb ? 0 : 4));
        }
    }
}

static void deq_q4_K(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q4_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 256) {
        float d = F16(b->d), dmin = F16(b->dmin);
        for (int j = 0; j < 8; j++) { /* 8 groups of 32 */
            uint8_t sc, m;
            strata_q4k_scale_min(j, b->scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = j % 2 ? q[l] >> 4 : q[l] & 0xF;
                y[32 * j + l] = d1 * (float)v - m1;
            }
        }
    }
}

static void deq_q5_K(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q5_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 256) {
        float d = F16(b->d), dmin = F16(b->dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            strata_q4k_scale_min(j, b->scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = j % 2 ? q[l] >> 4 : q[l] & 0xF;
                v |= ((b->qh[l] >> j) & 1) << 4;
                y[32 * j + l] = d1 * (float)v - m1;
            }
        }
    }
}

static void deq_q6_K(const void *src, float *y, int64_t nb)
{
    const struct strata_block_q6_K *b = src;
    for (int64_t i = 0; i < nb; i++, b++, y += 256) {
        float d = F16(b->d);
        for (int k = 0; k < 256; k++) {
            int h = k / 128, r = k % 128, l = r % 32, quarter = r / 32;
            /* low nibble: ql[64h + l + 32*(quarter&1)], low or high half by quarter/2 */
            uint8_t lb = b->ql[64 * h + l + 32 * (quarter & 1)];
            int lo = quarter < 2 ? lb & 0xF : lb >> 4;
            int hi = (b->qh[32 * h + l] >> (2 * quarter)) & 3;
            int q = (lo | hi << 4) - 32;
            y[k] = d * (float)b->scales[k / 16] * (float)q;
        }
    }
}

/* The 8 signed grid values of an i-quant grid entry. */
static void grid8(uint64_t g, int8_t out[8])
{
    for (int j = 0; j < 8; j++)
        out[j] = (int8_t)(g >> (8 * j));
}

static void deq_iq2_xxs(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq2_xxs *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        for (int ib = 0; ib < 8; ib++) {
            /* 32 elements: 4 grid indices (bytes of word 0), then 4 x 7 sign
             * bits and a 4-bit scale in word 1 */
            uint32_t w0 = (uint32_t)b->qs[4 * ib] | (uint32_t)b->qs[4 * ib + 1] << 16;
            uint32_t w1 = (uint32_t)b->qs[4 * ib + 2] | (uint32_t)b->qs[4 * ib + 3] << 16;
            float db = d * (0.5f + (float)(w1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                int8_t g[8];
                grid8(strata_iq2xxs_grid[(w0 >> (8 * l)) & 0xff], g);
                uint8_t s = strata_ksigns_iq2xs[(w1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++)
                    *y++ = db * (float)g[j] * (s & strata_kmask_iq2xs[j] ? -1.f : 1.f);
            }
        }
    }
}

static void deq_iq2_xs(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq2_xs *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        for (int ib = 0; ib < 8; ib++) {
            float db[2] = {d * (0.5f + (float)(b->scales[ib] & 0xF)) * 0.25f,
                           d * (0.5f + (float)(b->scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++) {
                uint16_t q = b->qs[4 * ib + l]; /* 9-bit grid index, 7 sign bits */
                int8_t g[8];
                grid8(strata_iq2xs_grid[q & 511], g);
                uint8_t s = strata_ksigns_iq2xs[q >> 9];
                for (int j = 0; j < 8; j++)
                    *y++ = db[l / 2] * (float)g[j] * (s & strata_kmask_iq2xs[j] ? -1.f : 1.f);
            }
        }
    }
}

static void deq_iq2_s(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq2_s *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        const uint8_t *qs = b->qs, *signs = b->qs + 32;
        for (int ib = 0; ib < 8; ib++) {
            float db[2] = {d * (0.5f + (float)(b->scales[ib] & 0xF)) * 0.25f,
                           d * (0.5f + (float)(b->scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++) {
                /* 10-bit index: 8 bits in qs, 2 bits of qh[ib] */
                int idx = qs[4 * ib + l] | ((b->qh[ib] << (8 - 2 * l)) & 0x300);
                int8_t g[8];
                grid8(strata_iq2s_grid[idx], g);
                uint8_t s = signs[4 * ib + l];
                for (int j = 0; j < 8; j++)
                    *y++ = db[l / 2] * (float)g[j] * (s & strata_kmask_iq2xs[j] ? -1.f : 1.f);
            }
        }
    }
}

static void deq_iq3_xxs(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq3_xxs *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        const uint8_t *qs = b->qs, *ss = b->qs + 64; /* 64 grid bytes, 8 sign/scale words */
        for (int ib = 0; ib < 8; ib++) {
            uint32_t w = (uint32_t)ss[4 * ib] | (uint32_t)ss[4 * ib + 1] << 8 |
                         (uint32_t)ss[4 * ib + 2] << 16 | (uint32_t)ss[4 * ib + 3] << 24;
            float db = d * (0.5f + (float)(w >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                uint8_t s = strata_ksigns_iq2xs[(w >> (7 * l)) & 127];
                uint32_t g1 = strata_iq3xxs_grid[qs[8 * ib + 2 * l]];
                uint32_t g2 = strata_iq3xxs_grid[qs[8 * ib + 2 * l + 1]];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * (float)((g1 >> (8 * j)) & 0xff) *
                           (s & strata_kmask_iq2xs[j] ? -1.f : 1.f);
                    y[j + 4] = db * (float)((g2 >> (8 * j)) & 0xff) *
                               (s & strata_kmask_iq2xs[j + 4] ? -1.f : 1.f);
                }
                y += 8;
            }
        }
    }
}

static void deq_iq3_s(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq3_s *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        for (int ib = 0; ib < 8; ib++) {
            int sc = (b->scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
            float db = d * (float)(1 + 2 * sc);
            uint8_t qh = b->qh[ib];
            for (int l = 0; l < 4; l++) {
                /* 9-bit indices: 8 bits in qs, the 9th is bit (2l) / (2l+1) of qh */
                int i1 = b->qs[8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256);
                int i2 = b->qs[8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
                uint32_t g1 = strata_iq3s_grid[i1], g2 = strata_iq3s_grid[i2];
                uint8_t s = b->signs[4 * ib + l];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * (float)((g1 >> (8 * j)) & 0xff) *
                           (s & strata_kmask_iq2xs[j] ? -1.f : 1.f);
                    y[j + 4] = db * (float)((g2 >> (8 * j)) & 0xff) *
                               (s & strata_kmask_iq2xs[j + 4] ? -1.f : 1.f);
                }
                y += 8;
            }
        }
    }
}

static void deq_iq1_s(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq1_s *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        for (int ib = 0; ib < 8; ib++) {
            uint16_t qh = b->qh[ib];
            float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            float delta = qh & 0x8000 ? -STRATA_IQ1S_DELTA : STRATA_IQ1S_DELTA;
            for (int l = 0; l < 4; l++) {
                int8_t g[8];
                grid8(strata_iq1s_grid[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], g);
                for (int j = 0; j < 8; j++)
                    *y++ = dl * ((float)g[j] + delta);
            }
        }
    }
}

static void deq_iq1_m(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq1_m *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(strata_iq1m_scale(b));
        for (int ib = 0; ib < 8; ib++) {
            uint16_t sc = (uint16_t)(b->scales[2 * (ib / 2)] | b->scales[2 * (ib / 2) + 1] << 8);
            int shift = 6 * (ib % 2);
            float dl[2] = {d * (float)(2 * ((sc >> shift) & 7) + 1),
                           d * (float)(2 * ((sc >> (shift + 3)) & 7) + 1)};
            const uint8_t *qh = b->qh + 2 * ib;
            for (int l = 0; l < 4; l++) {
                /* 11-bit index: 8 bits in qs, 3 bits and a delta sign in a
                 * nibble of qh */
                int nib = (qh[l / 2] >> (4 * (l % 2))) & 0xF;
                int idx = b->qs[4 * ib + l] | ((nib & 7) << 8);
                float delta = nib & 8 ? -STRATA_IQ1M_DELTA : STRATA_IQ1M_DELTA;
                int8_t g[8];
                grid8(strata_iq1s_grid[idx], g);
                for (int j = 0; j < 8; j++)
                    *y++ = dl[l / 2] * ((float)g[j] + delta);
            }
        }
    }
}

static void deq_iq4_xs(const void *src, float *y, int64_t nb)
{
    const struct strata_block_iq4_xs *b = src;
    for (int64_t i = 0; i < nb; i++, b++) {
        float d = F16(b->d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
                     (((b->scales_h >> (2 * ib)) & 3) << 4);
            float dl = d * (float)(ls - 32);
            const uint8_t *qs = b->qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)strata_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * (float)strata_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

typedef void (*deq_fn)(const void *src, float *y, int64_t nb);

static deq_fn deq_table(uint32_t type)
{
    switch (type) {
    case STRATA_TYPE_F32: return deq_f32;
    case STRATA_TYPE_F16: return deq_f16;
    case STRATA_TYPE_BF16: return deq_bf16;
    case STRATA_TYPE_Q4_0: return deq_q4_0;
    case STRATA_TYPE_Q4_1: return deq_q4_1;
    case STRATA_TYPE_Q5_0: return deq_q5_0;
    case STRATA_TYPE_Q5_1: return deq_q5_1;
    case STRATA_TYPE_Q8_0: return deq_q8_0;
    case STRATA_TYPE_Q2_K: return deq_q2_K;
    case STRATA_TYPE_Q3_K: return deq_q3_K;
    case STRATA_TYPE_Q4_K: return deq_q4_K;
    case STRATA_TYPE_Q5_K: return deq_q5_K;
    case STRATA_TYPE_Q6_K: return deq_q6_K;
    case STRATA_TYPE_IQ2_XXS: return deq_iq2_xxs;
    case STRATA_TYPE_IQ2_XS: return deq_iq2_xs;
    case STRATA_TYPE_IQ2_S: return deq_iq2_s;
    case STRATA_TYPE_IQ3_XXS: return deq_iq3_xxs;
    case STRATA_TYPE_IQ3_S: return deq_iq3_s;
    case STRATA_TYPE_IQ1_S: return deq_iq1_s;
    case STRATA_TYPE_IQ1_M: return deq_iq1_m;
    case STRATA_TYPE_IQ4_NL: return deq_iq4_nl;
    case STRATA_TYPE_IQ4_XS: return deq_iq4_xs;
    case STRATA_TYPE_MXFP4: return deq_mxfp4;
    default: return NULL;
    }
}

int strata_quant_supported(uint32_t type)
{
    return deq_table(type) != NULL;
}

int strata_quant_dequant_ref(uint32_t type, const void *src, float *dst, int64_t n,
                             struct strata_err *err)
{
    deq_fn f = deq_table(type);
    if (!f) {
        const char *name = strata_ggml_type_name(type);
        return strata_err_set(err, STRATA_E_UNSUPPORTED, "no decoder for tensor type %s (%u)",
                              name ? name : "unknown", type);
    }
    int64_t bs = strata_ggml_blck_size(type);
    if (n < 0 || n % bs != 0)
        return strata_err_set(err, STRATA_E_INVALID,
                              "%lld elements of %s: not a multiple of the block size %lld",
                              (long long)n, strata_ggml_type_name(type), (long long)bs);
    f(src, dst, n / bs);
    return STRATA_OK;
}

void strata_quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    deq_fn f = deq_table(type);
    if (f)
        f(src, dst, n / strata_ggml_blck_size(type));
}

/* ---- activations ---------------------------------------------------------- */

uint32_t strata_quant_vec_dot_type(uint32_t type)
{
    switch (type) {
    case STRATA_TYPE_F32:
    case STRATA_TYPE_F16:
    case STRATA_TYPE_BF16:
        return STRATA_TYPE_F32;
    case STRATA_TYPE_Q4_0:
    case STRATA_TYPE_Q4_1:
    case STRATA_TYPE_Q5_0:
    case STRATA_TYPE_Q5_1:
    case STRATA_TYPE_Q8_0:
    case STRATA_TYPE_IQ4_NL:
    case STRATA_TYPE_MXFP4:
        return STRATA_TYPE_Q8_0;
    default:
        return deq_table(type) ? STRATA_TYPE_Q8_K : 0xffffffffu;
    }
}

size_t strata_quant_act_size(uint32_t vec_type, int64_t n)
{
    switch (vec_type) {
    case STRATA_TYPE_Q8_0: return (size_t)(n / 32) * sizeof(struct strata_block_q8_0);
    case STRATA_TYPE_Q8_K: return (size_t)(n / 256) * sizeof(struct strata_block_q8_K);
    case STRATA_TYPE_F32: return (size_t)n * 4;
    default: return 0;
    }
}

/* ggml's nearest_int: round half to even (the FPU's default mode). */
static int nearest_int(float v)
{
    return (int)lrintf(v);
}

/* As ggml's x86 quantize_row_q8_0: q = nearest-even(x * 127/amax), d = amax/127
 * stored as f16.  (Its portable reference rounds half away from zero with
 * 1/d; the x86 path is what llama.cpp runs here.) */
static void quantize_q8_0(const float *x, struct strata_block_q8_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, y++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float id = amax != 0.f ? 127.f / amax : 0.0f;
        y->d = strata_f32_to_f16(amax / 127.f);
        for (int j = 0; j < 32; j++)
            y->qs[j] = (int8_t)nearest_int(x[j] * id);
    }
}

static void quantize_q8_K(const float *x, struct strata_block_q8_K *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 256, y++) {
        float max = 0, amax = 0;
        for (int j = 0; j < 256; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.f) {
            memset(y, 0, sizeof(*y));
            continue;
        }
        /* -127 rather than -128 keeps every q in [-127, 127] (ggml does the same) */
        float iscale = -127.f / max;
        for (int j = 0; j < 256; j++) {
            int v = nearest_int(iscale * x[j]);
            y->qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += y->qs[16 * g + j];
            y->bsums[g] = (int16_t)s;
        }
        y->d = 1.f / iscale;
    }
}

void strata_quant_quantize_act(uint32_t vec_type, const float *x, void *dst, int64_t n)
{
    if (vec_type != STRATA_TYPE_F32 && strata_quant_simd_level() >= STRATA_SIMD_AVX2) {
        strata_quant_act_avx2(vec_type, x, dst, n);
        return;
    }
    switch (vec_type) {
    case STRATA_TYPE_Q8_0: quantize_q8_0(x, dst, n / 32); break;
    case STRATA_TYPE_Q8_K: quantize_q8_K(x, dst, n / 256); break;
    case STRATA_TYPE_F32: memcpy(dst, x, (size_t)n * 4); break;
    default: break;
    }
}

/* ---- dot kernels ------------------------------------------------------------ */

strata_vec_dot_fn strata_quant_vec_dot_fn(uint32_t type, int level)
{
    if (type >= STRATA_TYPE_COUNT)
        return NULL;
    if (level >= STRATA_SIMD_AVX512 && strata_quant_dot_avx512[type])
        return strata_quant_dot_avx512[type];
    if (level >= STRATA_SIMD_AVX2 && strata_quant_dot_avx2[type])
        return strata_quant_dot_avx2[type];
    return strata_quant_dot_scalar[type];
}

float strata_quant_vec_dot(uint32_t type, int64_t n, const void *w, const void *act)
{
    strata_vec_dot_fn f = strata_quant_vec_dot_fn(type, strata_quant_simd_level());
    float out = 0;
    if (f)
        f(n, w, act, 0, 1, &out);
    return out;
}
