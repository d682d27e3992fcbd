/* dequant.cuh - device decoders of the GGUF block types.
 *
 * strata_dq<T>::chunk(row, c, v) writes the 8 consecutive values [8c, 8c + 8) of a
 * row of type T to v.  A row is the concatenation of its blocks (ggml-common.h block
 * structs; the layouts are those of the GGUF specification and gguf-py's
 * quants.py).  Every block type's value count is a multiple of 8, and for the
 * i-quants a chunk of 8 is exactly one grid entry, so each chunk decodes from one
 * block without a loop.  Plain types (F32, F16, BF16) take the element count n so
 * that a row length that is not a multiple of 8 reads no further than its end.
 *
 * Blocks are read byte- or 16-bit-wise: several block sizes (18, 22, 34, 110 bytes)
 * only guarantee 2-byte alignment and MXFP4's 17-byte block none at all.
 */
#ifndef STRATA_KERNELS_DEQUANT_CUH
#define STRATA_KERNELS_DEQUANT_CUH

#include "gpu.h"
#include "iq_tables.h"

/* Type ids as in lib/ggml_types.h (GGUF enum ggml_type); repeated here because the
 * kernels are C++ compiled without the library's headers. */
enum {
    KT_F32 = 0, KT_F16 = 1, KT_Q4_0 = 2, KT_Q4_1 = 3, KT_Q5_0 = 6, KT_Q5_1 = 7,
    KT_Q8_0 = 8, KT_Q2_K = 10, KT_Q3_K = 11, KT_Q4_K = 12, KT_Q5_K = 13, KT_Q6_K = 14,
    KT_IQ2_XXS = 16, KT_IQ2_XS = 17, KT_IQ3_XXS = 18, KT_IQ1_S = 19, KT_IQ4_NL = 20,
    KT_IQ3_S = 21, KT_IQ2_S = 22, KT_IQ4_XS = 23, KT_IQ1_M = 29, KT_BF16 = 30,
    KT_MXFP4 = 39,
};

/* Calls M(T) for every weight type the kernels decode. */
#define STRATA_FOR_EACH_KTYPE(M)                                                         \
    M(KT_F32) M(KT_F16) M(KT_BF16) M(KT_Q4_0) M(KT_Q4_1) M(KT_Q5_0) M(KT_Q5_1)          \
    M(KT_Q8_0) M(KT_Q2_K) M(KT_Q3_K) M(KT_Q4_K) M(KT_Q5_K) M(KT_Q6_K) M(KT_IQ2_XXS)     \
    M(KT_IQ2_XS) M(KT_IQ2_S) M(KT_IQ3_XXS) M(KT_IQ3_S) M(KT_IQ1_S) M(KT_IQ1_M)          \
    M(KT_IQ4_NL) M(KT_IQ4_XS) M(KT_MXFP4)

static __device__ __forceinline__ uint32_t ld16(const uint8_t *p)
{
    return *(const uint16_t *)p;
}
static __device__ __forceinline__ uint32_t ld32_a2(const uint8_t *p)
{
    return ld16(p) | (ld16(p + 2) << 16);
}
static __device__ __forceinline__ float ldh(const uint8_t *p)
{
    return strata_h2f((uint16_t)ld16(p));
}

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of Q4_K/Q5_K. */
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Nibble layout shared by Q4_0, Q4_1, IQ4_NL, MXFP4 and the sub-blocks of IQ4_XS:
 * values 0..15 are the low nibbles of qs[0..15], values 16..31 the high nibbles.
 * Chunk s (0..3) of a 32-value block: the 8 nibbles it selects. */
static __device__ __forceinline__ void nibbles8(const uint8_t *qs, int s, int q[8])
{
    const uint8_t *p = qs + (s & 1) * 8;
    int sh = (s >> 1) * 4;
#pragma unroll
    for (int j = 0; j < 8; j++)
        q[j] = (p[j] >> sh) & 0xF;
}

template <int T> struct strata_dq;

template <> struct strata_dq<KT_F32> {
    enum { QK = 1, BYTES = 4 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int n)
    {
        const float *r = (const float *)row;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = 8 * c + j < n ? r[8 * c + j] : 0.0f;
    }
};
template <> struct strata_dq<KT_F16> {
    enum { QK = 1, BYTES = 2 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int n)
    {
        const uint16_t *r = (const uint16_t *)row;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = 8 * c + j < n ? strata_h2f(r[8 * c + j]) : 0.0f;
    }
};
template <> struct strata_dq<KT_BF16> {
    enum { QK = 1, BYTES = 2 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int n)
    {
        const uint16_t *r = (const uint16_t *)row;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = 8 * c + j < n ? strata_bf2f(r[8 * c + j]) : 0.0f;
    }
};

template <> struct strata_dq<KT_Q4_0> {
    enum { QK = 32, BYTES = 18 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        float d = ldh(b);
        int q[8];
        nibbles8(b + 2, c & 3, q);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (float)(q[j] - 8) * d;
    }
};
template <> struct strata_dq<KT_Q4_1> {
    enum { QK = 32, BYTES = 20 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        float d = ldh(b), m = ldh(b + 2);
        int q[8];
        nibbles8(b + 4, c & 3, q);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (float)q[j] * d + m;
    }
};
template <> struct strata_dq<KT_Q5_0> {
    enum { QK = 32, BYTES = 22 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        float d = ldh(b);
        uint32_t qh = ld32_a2(b + 2);
        int q[8];
        nibbles8(b + 6, c & 3, q);
        int e0 = (c & 3) * 8;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (float)((q[j] | (int)(((qh >> (e0 + j)) & 1) << 4)) - 16) * d;
    }
};
template <> struct strata_dq<KT_Q5_1> {
    enum { QK = 32, BYTES = 24 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        float d = ldh(b), m = ldh(b + 2);
        uint32_t qh = ld32_a2(b + 4);
        int q[8];
        nibbles8(b + 8, c & 3, q);
        int e0 = (c & 3) * 8;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (float)(q[j] | (((qh >> (e0 + j)) & 1) << 4)) * d + m;
    }
};
template <> struct strata_dq<KT_Q8_0> {
    enum { QK = 32, BYTES = 34 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        float d = ldh(b);
        const int8_t *qs = (const int8_t *)(b + 2) + (c & 3) * 8;
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (float)qs[j] * d;
    }
};

/* K-quants: 256-value super-blocks, 32 chunks each.  For Q2_K/Q3_K value i of a
 * block sits in qs[32 * (i / 128) + i % 32] at bit 2 * ((i % 128) / 32) and uses
 * scale i / 16 (ggml's dequantize_row_q2_K/q3_K loop order, flattened). */
template <> struct strata_dq<KT_Q2_K> {
    enum { QK = 256, BYTES = 84 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int i0 = (c & 31) * 8;
        float d = ldh(b + 80), dmin = ldh(b + 82);
        int sc = b[i0 / 16];
        float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
        const uint8_t *q = b + 16 + 32 * (i0 / 128) + i0 % 32;
        int sh = 2 * ((i0 % 128) / 32);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = dl * (float)((q[j] >> sh) & 3) - ml;
    }
};
template <> struct strata_dq<KT_Q3_K> {
    enum { QK = 256, BYTES = 110 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int i0 = (c & 31) * 8;
        int is = i0 / 16;
        const uint8_t *s = b + 96;
        int lo = is < 8 ? (s[is] & 0xF) : (s[is - 8] >> 4);
        int hi = (s[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
        float dl = ldh(b + 108) * (float)((lo | (hi << 4)) - 32);
        int n = i0 / 128, sh = 2 * ((i0 % 128) / 32), l0 = i0 % 32;
        const uint8_t *q = b + 32 + 32 * n + l0;
        const uint8_t *hm = b + l0;
        int mbit = 1 << (4 * n + sh / 2);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = dl * (float)(((q[j] >> sh) & 3) - ((hm[j] & mbit) ? 0 : 4));
    }
};
template <> struct strata_dq<KT_Q4_K> {
    enum { QK = 256, BYTES = 144 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, g = sub >> 3, half = (sub >> 2) & 1, l0 = (sub & 3) * 8;
        int sc, m;
        scale_min_k4(2 * g + half, b + 4, &sc, &m);
        float d = ldh(b) * (float)sc, mn = ldh(b + 2) * (float)m;
        uint2 w = *(const uint2 *)(b + 16 + 32 * g + l0);
        int sh = 4 * half;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[j] = d * (float)((w.x >> (8 * j + sh)) & 0xF) - mn;
            v[4 + j] = d * (float)((w.y >> (8 * j + sh)) & 0xF) - mn;
        }
    }
};
template <> struct strata_dq<KT_Q5_K> {
    enum { QK = 256, BYTES = 176 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, g = sub >> 3, half = (sub >> 2) & 1, l0 = (sub & 3) * 8;
        int sc, m;
        scale_min_k4(2 * g + half, b + 4, &sc, &m);
        float d = ldh(b) * (float)sc, mn = ldh(b + 2) * (float)m;
        const uint8_t *ql = b + 48 + 32 * g + l0, *qh = b + 16 + l0;
        int sh = 4 * half, hb = 1 << (2 * g + half);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = d * (float)(((ql[j] >> sh) & 0xF) + ((qh[j] & hb) ? 16 : 0)) - mn;
    }
};
template <> struct strata_dq<KT_Q6_K> {
    enum { QK = 256, BYTES = 210 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int i0 = (c & 31) * 8;
        int n = i0 / 128, qd = (i0 % 128) / 32, l0 = i0 % 32;
        /* blocks are 2-byte aligned: read the 8 low and 8 high bytes as 16-bit words */
        const uint8_t *ql = b + 64 * n + l0 + 32 * (qd & 1);
        const uint8_t *qh = b + 128 + 32 * n + l0;
        float d = ldh(b + 208) * (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * qd];
        int shl = 4 * (qd >> 1), shh = 2 * qd;
        uint32_t lw[4], hw[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            lw[j] = ld16(ql + 2 * j);
            hw[j] = ld16(qh + 2 * j);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int lo = (int)((lw[j / 2] >> (8 * (j & 1) + shl)) & 0xF);
            int hi = (int)((hw[j / 2] >> (8 * (j & 1) + shh)) & 3);
            v[j] = d * (float)((lo | (hi << 4)) - 32);
        }
    }
};

/* Apply the 8 sign bits of s to the 8 grid bytes g. */
static __device__ __forceinline__ void grid_signs(uint64_t g, uint32_t s, float db, float *v)
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float x = db * (float)((g >> (8 * j)) & 0xFF);
        v[j] = (s >> j) & 1 ? -x : x;
    }
}

template <> struct strata_dq<KT_IQ2_XXS> {
    enum { QK = 256, BYTES = 66 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        const uint8_t *q = b + 2 + 8 * ib;
        uint32_t aux1 = ld32_a2(q + 4);
        float db = ldh(b) * (0.5f + (float)(aux1 >> 28)) * 0.25f;
        grid_signs(strata_iq2xxs_grid[q[l]], strata_ksigns_iq2xs[(aux1 >> (7 * l)) & 127], db,
                   v);
    }
};
template <> struct strata_dq<KT_IQ2_XS> {
    enum { QK = 256, BYTES = 74 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        uint32_t q = ld16(b + 2 + 2 * sub);
        float db = ldh(b) * (0.5f + (float)((b[66 + ib] >> (4 * (l >> 1))) & 0xF)) * 0.25f;
        grid_signs(strata_iq2xs_grid[q & 511], strata_ksigns_iq2xs[q >> 9], db, v);
    }
};
template <> struct strata_dq<KT_IQ2_S> {
    enum { QK = 256, BYTES = 82 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        const uint8_t *qs = b + 2;
        int idx = qs[sub] | ((b[66 + ib] << (8 - 2 * l)) & 0x300);
        float db = ldh(b) * (0.5f + (float)((b[74 + ib] >> (4 * (l >> 1))) & 0xF)) * 0.25f;
        grid_signs(strata_iq2s_grid[idx], qs[32 + sub], db, v);
    }
};
template <> struct strata_dq<KT_IQ3_XXS> {
    enum { QK = 256, BYTES = 98 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        uint32_t aux = ld32_a2(b + 66 + 4 * ib);
        float db = ldh(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const uint8_t *qs = b + 2 + 8 * ib + 2 * l;
        uint64_t g = (uint64_t)strata_iq3xxs_grid[qs[0]] |
                     ((uint64_t)strata_iq3xxs_grid[qs[1]] << 32);
        grid_signs(g, strata_ksigns_iq2xs[(aux >> (7 * l)) & 127], db, v);
    }
};
template <> struct strata_dq<KT_IQ3_S> {
    enum { QK = 256, BYTES = 110 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        const uint8_t *qs = b + 2 + 8 * ib + 2 * l;
        int qh = b[66 + ib];
        float db = ldh(b) * (float)(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib & 1))) & 0xF));
        uint64_t g = (uint64_t)strata_iq3s_grid[qs[0] | ((qh << (8 - 2 * l)) & 256)] |
                     ((uint64_t)strata_iq3s_grid[qs[1] | ((qh << (7 - 2 * l)) & 256)] << 32);
        grid_signs(g, b[74 + 4 * ib + l], db, v);
    }
};
template <> struct strata_dq<KT_IQ1_S> {
    enum { QK = 256, BYTES = 50 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        uint32_t qh = ld16(b + 34 + 2 * ib);
        float dl = ldh(b) * (float)(2 * ((qh >> 12) & 7) + 1);
        float delta = (qh & 0x8000) ? -STRATA_IQ1S_DELTA : STRATA_IQ1S_DELTA;
        uint64_t g = strata_iq1s_grid[b[2 + sub] | (((qh >> (3 * l)) & 7) << 8)];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = dl * ((float)(int8_t)((g >> (8 * j)) & 0xFF) + delta);
    }
};
template <> struct strata_dq<KT_IQ1_M> {
    enum { QK = 256, BYTES = 56 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2, l = sub & 3;
        const uint8_t *sc8 = b + 48;
        uint32_t s0 = ld16(sc8), s1 = ld16(sc8 + 2), s2 = ld16(sc8 + 4), s3 = ld16(sc8 + 6);
        uint32_t dbits = (s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000);
        float d = strata_h2f((uint16_t)dbits);
        uint32_t sc = ld16(sc8 + 2 * (ib / 2));
        float dl = d * (float)(2 * ((sc >> (6 * (ib & 1) + 3 * (l >> 1))) & 7) + 1);
        int qh = b[32 + 2 * ib + (l >> 1)];
        int idx = b[sub] | ((qh << ((l & 1) ? 4 : 8)) & 0x700);
        float delta = (qh & ((l & 1) ? 0x80 : 0x08)) ? -STRATA_IQ1M_DELTA : STRATA_IQ1M_DELTA;
        uint64_t g = strata_iq1s_grid[idx];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = dl * ((float)(int8_t)((g >> (8 * j)) & 0xFF) + delta);
    }
};
template <> struct strata_dq<KT_IQ4_NL> {
    enum { QK = 32, BYTES = 18 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        float d = ldh(b);
        int q[8];
        nibbles8(b + 2, c & 3, q);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = d * (float)strata_kvalues_iq4nl[q[j]];
    }
};
template <> struct strata_dq<KT_IQ4_XS> {
    enum { QK = 256, BYTES = 136 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 5) * BYTES;
        int sub = c & 31, ib = sub >> 2;
        int ls = ((b[4 + ib / 2] >> (4 * (ib & 1))) & 0xF) | (((ld16(b + 2) >> (2 * ib)) & 3) << 4);
        float dl = ldh(b) * (float)(ls - 32);
        int q[8];
        nibbles8(b + 8 + 16 * ib, sub & 3, q);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = dl * (float)strata_kvalues_iq4nl[q[j]];
    }
};
template <> struct strata_dq<KT_MXFP4> {
    enum { QK = 32, BYTES = 17 };
    static __device__ __forceinline__ void chunk(const uint8_t *row, int c, float *v, int)
    {
        const uint8_t *b = row + (c >> 2) * BYTES;
        /* E8M0 scale halved, because the fp4 table holds doubled values (ggml's
         * GGML_E8M0_TO_FP32_HALF). */
        uint32_t e = b[0];
        float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        int q[8];
        nibbles8(b + 1, c & 3, q);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = d * (float)strata_kvalues_fp4[q[j]];
    }
};

#endif
