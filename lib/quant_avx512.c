/* quant_avx512.c - AVX-512 (F/BW/VL/DQ/VNNI) dot kernels (compiled with those
 * flags, see mk/quant.mk; called only when CPUID reports them).  Most integer
 * kernels are the shared 256-bit ones with VNNI's fused multiply-adds; Q4_K,
 * IQ4_XS and IQ2_XS have 512-bit kernels here and IQ1_M one that unpacks its
 * scales with AVX-512 instructions (measured faster; 512-bit Q8_0 and Q5_K
 * were not). */
#define SIMD_VNNI 1
#define NT_MAX 8 /* 32 vector registers: eight activation rows per pass */
#define SIMD_PREFIX avx512_
#include "quant_simd.inc"

static inline float hsum512(__m512 v)
{
    __m256 x = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return K(hsum)(x);
}

/* vpermw indices: lanes 0..15 -> scale 2k, lanes 16..31 -> scale 2k+1 */
static const uint16_t q4k_perm[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
     3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
     5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
     7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7},
};

/* Q4_K/Q5_K scales and mins as two vectors of 8 x int16. */
static inline void k4_scales_vec(const uint8_t *s, __m128i *sc, __m128i *m)
{
    uint32_t u[3], v[4];
    memcpy(u, s, 12);
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    v[0] = u[0] & k6;
    v[1] = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);
    v[2] = u[1] & k6;
    v[3] = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);
    __m128i x = _mm_loadu_si128((const __m128i *)v);
    *sc = _mm_cvtepu8_epi16(x);
    *m = _mm_cvtepu8_epi16(_mm_srli_si128(x, 8));
}

/* The 4-bit quants of a Q4_K/Q5_K block as 4 x 64 bytes in element order. */
static inline void q4k_unpack(const uint8_t *qs, __m512i q[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        __m512i bits = _mm512_loadu_si512(qs + 64 * h);
        __m512i lo = _mm512_and_si512(bits, m4);                       /* groups 4h, 4h+2 */
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4); /* 4h+1, 4h+3 */
        q[2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);     /* groups 4h, 4h+1 */
        q[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE); /* groups 4h+2, 4h+3 */
    }
}

/* The shared tail of Q4_K and Q5_K: q[4] unpacked quants (element order). */
static inline __attribute__((always_inline)) void k45_tokens(const int nt, __m512i q[4],
                                                             __m128i sc, __m128i mins, float dw,
                                                             float dmw,
                                                             const struct strata_block_q8_K *const *a,
                                                             int64_t i, __m512 *acc, __m128 *accm)
{
    __m512i scz = _mm512_castsi128_si512(sc);
    __m512i s16[4];
    for (int k = 0; k < 4; k++)
        s16[k] = _mm512_permutexvar_epi16(_mm512_loadu_si512(q4k_perm[k]), scz);
    for (int t = 0; t < nt; t++) {
        const struct strata_block_q8_K *y = &a[t][i];
        __m512i s = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            __m512i p = _mm512_maddubs_epi16(q[k], _mm512_loadu_si512(y->qs + 64 * k));
            s = _mm512_dpwssd_epi32(s, p, s16[k]);
        }
        __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums),
                                    _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
        __m128i pm = _mm_madd_epi16(mins, bs);
        acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * dw), _mm512_cvtepi32_ps(s), acc[t]);
        accm[t] = _mm_fmadd_ps(_mm_set1_ps(y->d * dmw), _mm_cvtepi32_ps(pm), accm[t]);
    }
}

BODY K(q4_K_512_body)(BARGS)
{
    const struct strata_block_q4_K *w = vw;
    int64_t nb = n / 256;
    PASS_BEGIN(struct strata_block_q8_K)
    __m512 acc[NT_MAX];
    __m128 accm[NT_MAX];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
        accm[t] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const struct strata_block_q4_K *b = &w[i];
        __m128i sc, mins;
        k4_scales_vec(b->scales, &sc, &mins);
        __m512i q[4];
        q4k_unpack(b->qs, q);
        k45_tokens(nt, q, sc, mins, K(h2f)(b->d), K(h2f)(b->dmin), a, i, acc, accm);
    }
    for (int t = 0; t < nt; t++)
        out[t0 + t] = hsum512(acc[t]) - K(hsum128)(accm[t]);
    PASS_END
}
DEFINE_KERNEL(q4_K_512)

/* IQ4_XS with 512-bit registers: 64 weights per register, signs as masks. */
BODY K(iq4_xs_512_body)(BARGS)
{
    const struct strata_block_iq4_xs *w = vw;
    int64_t nb = n / 256;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)strata_kvalues_iq4nl));
    /* 128-bit chunks in element order: group g = low nibbles, then high */
    const __m512i order0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i order1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    PASS_BEGIN(struct strata_block_q8_K)
    __m512 acc[NT_MAX];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const struct strata_block_iq4_xs *b = &w[i];
        __m512i ax[4], s16[4];
        __mmask64 neg[4];
        for (int h = 0; h < 2; h++) {
            __m512i x = _mm512_loadu_si512(b->qs + 64 * h);
            __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
            __m512i v0 = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, order0, hi));
            __m512i v1 = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, order1, hi));
            neg[2 * h] = _mm512_movepi8_mask(v0);
            neg[2 * h + 1] = _mm512_movepi8_mask(v1);
            ax[2 * h] = _mm512_abs_epi8(v0);
            ax[2 * h + 1] = _mm512_abs_epi8(v1);
        }
        uint32_t sl;
        memcpy(&sl, b->scales_l, 4);
        uint16_t ls[8];
        for (int ib = 0; ib < 8; ib++)
            ls[ib] = (uint16_t)((((sl >> (4 * ib)) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4)) -
                                32);
        __m512i lsz = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)ls));
        for (int k = 0; k < 4; k++)
            s16[k] = _mm512_permutexvar_epi16(_mm512_loadu_si512(q4k_perm[k]), lsz);
        float dw = K(h2f)(b->d);
        for (int t = 0; t < nt; t++) {
            const struct strata_block_q8_K *y = &a[t][i];
            __m512i s = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                __m512i q = _mm512_loadu_si512(y->qs + 64 * k);
                __m512i sy = _mm512_mask_sub_epi8(q, neg[k], _mm512_setzero_si512(), q);
                s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(ax[k], sy), s16[k]);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y->d * dw), _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        out[t0 + t] = hsum512(acc[t]);
    PASS_END
}
DEFINE_KERNEL(iq4_xs_512)

/* vpermw indices: lanes 8j..8j+7 -> scale 4k+j (IQ2_XS: a scale per 16 weights) */
static const uint16_t iq2_perm[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
     6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9,
     10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

/* IQ2_XS with 512-bit registers: the sign bytes are computed (7 stored bits
 * plus their parity, the rule of the ksigns table) for the whole block at
 * once and applied as mask registers. */
BODY K(iq2_xs_512_body)(BARGS)
{
    const struct strata_block_iq2_xs *w = vw;
    int64_t nb = n / 256;
    const __m256i m9 = _mm256_set1_epi16(511);
    PASS_BEGIN(struct strata_block_q8_K)
    __m512 acc[NT_MAX];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const struct strata_block_iq2_xs *b = &w[i];
        __m256i q0 = K(load)(b->qs), q1 = K(load)(b->qs + 16);
        uint16_t gi[32];
        _mm256_storeu_si256((__m256i *)gi, _mm256_and_si256(q0, m9));
        _mm256_storeu_si256((__m256i *)(gi + 16), _mm256_and_si256(q1, m9));
        /* 32 sign bytes: s7 | parity(s7) << 7 */
        __m256i s7 = _mm256_permute4x64_epi64(
            _mm256_packus_epi16(_mm256_srli_epi16(q0, 9), _mm256_srli_epi16(q1, 9)), 0xD8);
        __m256i p = _mm256_xor_si256(s7, _mm256_srli_epi16(s7, 4));
        p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 2));
        p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 1));
        p = _mm256_and_si256(p, _mm256_set1_epi8(1));
        __m256i sb = _mm256_or_si256(s7, _mm256_slli_epi16(p, 7));
        uint64_t sm[4];
        _mm256_storeu_si256((__m256i *)sm, sb);
        /* scales 2s+1 in element order, one per 16 weights */
        __m128i sc = _mm_loadl_epi64((const __m128i *)b->scales);
        __m128i lo = _mm_and_si128(sc, _mm_set1_epi8(0x0F));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F));
        __m128i s8 = _mm_unpacklo_epi8(lo, hi);
        s8 = _mm_add_epi8(_mm_add_epi8(s8, s8), _mm_set1_epi8(1));
        __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(s8));
        __m512i g[4], scv[4];
        for (int k = 0; k < 4; k++) {
            const uint16_t *x = gi + 8 * k;
            __m256i a0 = K(gather4x64)(strata_iq2xs_grid, x[0], x[1], x[2], x[3]);
            __m256i a1 = K(gather4x64)(strata_iq2xs_grid, x[4], x[5], x[6], x[7]);
            g[k] = _mm512_inserti64x4(_mm512_castsi256_si512(a0), a1, 1);
            scv[k] = _mm512_permutexvar_epi16(_mm512_loadu_si512(iq2_perm[k]), s16);
        }
        for (int t = 0; t < nt; t++) {
            const struct strata_block_q8_K *y = &a[t][i];
            __m512i s = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                __m512i q = _mm512_loadu_si512(y->qs + 64 * k);
                q = _mm512_mask_sub_epi8(q, (__mmask64)sm[k], _mm512_setzero_si512(), q);
                s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(g[k], q), scv[k]);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(K(h2f)(b->d) * 0.125f * y->d),
                                     _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        out[t0 + t] = hsum512(acc[t]);
    PASS_END
}
DEFINE_KERNEL(iq2_xs_512)

/* IQ1_M, AVX-512 flavour: the 16 sub-block scales and the 32 delta signs of
 * a block are unpacked with vector instructions once per block instead of
 * per group of 32 weights. */
static const uint16_t iq1m_lanes4[16] = {0x0000, 0x000f, 0x00f0, 0x00ff, 0x0f00, 0x0f0f, 0x0ff0, 0x0fff, 0xf000, 0xf00f, 0xf0f0, 0xf0ff, 0xff00, 0xff0f, 0xfff0, 0xffff};
static const uint16_t iq1m_pair_idx[8][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},
    {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13},
    {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

BODY K(iq1_m_512_body)(BARGS)
{
    const struct strata_block_iq1_m *w = vw;
    int64_t nb = n / 256;
    const __m256i ones = _mm256_set1_epi8(1);
    const __m256i shifts = _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
    const __m256i words = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                           4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7);
    PASS_BEGIN(struct strata_block_q8_K)
    __m256 acc[NT_MAX];
    for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const struct strata_block_iq1_m *b = &w[i];
        /* nibble k of qh (k = 4 ib + l): 3 high index bits and the delta sign */
        __m128i qh = _mm_loadu_si128((const __m128i *)b->qh);
        __m128i m15 = _mm_set1_epi8(15);
        __m128i lo = _mm_and_si128(qh, m15), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m15);
        __m256i nib = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
        uint32_t dneg = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(nib, 4));
        nib = _mm256_and_si256(nib, _mm256_set1_epi8(7));
        uint16_t gi[32];
        __m256i q = K(load)(b->qs);
        for (int h = 0; h < 2; h++) {
            __m256i qw = _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(q, 1)
                                                : _mm256_castsi256_si128(q));
            __m256i nw = _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(nib, 1)
                                                : _mm256_castsi256_si128(nib));
            _mm256_storeu_si256((__m256i *)(gi + 16 * h),
                                _mm256_or_si256(qw, _mm256_slli_epi16(nw, 8)));
        }
        /* scale k = 2 * ((word[k/4] >> 3(k%4)) & 7) + 1, words in lanes */
        __m256i sw = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)b->scales));
        sw = _mm256_shuffle_epi8(sw, words);
        __m256i lsv = _mm256_and_si256(_mm256_srlv_epi16(sw, shifts), _mm256_set1_epi16(7));
        lsv = _mm256_add_epi16(_mm256_add_epi16(lsv, lsv), _mm256_set1_epi16(1));
        __m256i s1[NT_MAX], s2[NT_MAX];
        for (int t = 0; t < nt; t++)
            s1[t] = s2[t] = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t *gx = gi + 4 * ib;
            __m256i g = K(gather4x64)(strata_iq1s_grid, gx[0], gx[1], gx[2], gx[3]);
            g = _mm256_add_epi8(g, ones);
            __m256i scv = _mm256_permutexvar_epi16(K(load)(iq1m_pair_idx[ib]), lsv);
            __mmask16 neg = iq1m_lanes4[(dneg >> (4 * ib)) & 15];
            __m256i dsc = _mm256_mask_sub_epi16(scv, neg, _mm256_setzero_si256(), scv);
            for (int t = 0; t < nt; t++) {
                __m256i y = K(load)(a[t][i].qs + 32 * ib);
                __m256i qs16 = _mm256_maddubs_epi16(ones, y);
                __m256i g16 = _mm256_sub_epi16(_mm256_maddubs_epi16(g, y), qs16);
                s1[t] = _mm256_dpwssd_epi32(s1[t], g16, scv);
                s2[t] = _mm256_dpwssd_epi32(s2[t], qs16, dsc);
            }
        }
        float dw = K(h2f)(strata_iq1m_scale(b));
        for (int t = 0; t < nt; t++) {
            __m256 v = _mm256_fmadd_ps(_mm256_set1_ps(STRATA_IQ1M_DELTA), _mm256_cvtepi32_ps(s2[t]),
                                       _mm256_cvtepi32_ps(s1[t]));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[t][i].d), v, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++)
        out[t0 + t] = K(hsum)(acc[t]);
    PASS_END
}
DEFINE_KERNEL(iq1_m_512)

const strata_vec_dot_fn strata_quant_dot_avx512[STRATA_TYPE_COUNT] = {
    [STRATA_TYPE_F32] = K(f32),
    [STRATA_TYPE_F16] = K(f16),
    [STRATA_TYPE_BF16] = K(bf16),
    [STRATA_TYPE_Q4_0] = K(q4_0),
    [STRATA_TYPE_Q4_1] = K(q4_1),
    [STRATA_TYPE_Q5_0] = K(q5_0),
    [STRATA_TYPE_Q5_1] = K(q5_1),
    [STRATA_TYPE_Q8_0] = K(q8_0),
    [STRATA_TYPE_IQ4_NL] = K(iq4_nl),
    [STRATA_TYPE_MXFP4] = K(mxfp4),
    [STRATA_TYPE_Q2_K] = K(q2_K),
    [STRATA_TYPE_Q3_K] = K(q3_K),
    [STRATA_TYPE_Q4_K] = K(q4_K_512),
    [STRATA_TYPE_Q5_K] = K(q5_K),
    [STRATA_TYPE_Q6_K] = K(q6_K),
    [STRATA_TYPE_IQ2_XXS] = K(iq2_xxs),
    [STRATA_TYPE_IQ2_XS] = K(iq2_xs_512),
    [STRATA_TYPE_IQ2_S] = K(iq2_s),
    [STRATA_TYPE_IQ3_XXS] = K(iq3_xxs),
    [STRATA_TYPE_IQ3_S] = K(iq3_s),
    [STRATA_TYPE_IQ1_S] = K(iq1_s),
    [STRATA_TYPE_IQ1_M] = K(iq1_m_512),
    [STRATA_TYPE_IQ4_XS] = K(iq4_xs_512),
};
