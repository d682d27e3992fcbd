/* expert_cpu_avx2.c - AVX2 rows of the 8-bit path of expert_cpu.c: the same integer
 * dot products per scale group (maddubs of unsigned weight quants and signed
 * activation quants, exact: no pair sum exceeds 32,512), scaled and summed in eight
 * float lanes in the order of expert_cpu_int.h, which the scalar and AVX-512 rows
 * follow to the bit.  Compiled with -mavx2 -mfma (mk/expert_cpu.mk); called only when
 * the CPU has them. */
#include "expert_cpu_int.h"

#if defined(__AVX2__)
#include <immintrin.h>
#include <string.h>

#include "ggml_types.h"
#include "quant.h"

static float f16_at(const uint8_t *p)
{
    strata_f16 h;
    memcpy(&h, p, sizeof h);
    return strata_f16_to_f32(h);
}

static float hsum(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* [sum of p[0]'s lanes, ..., sum of p[7]'s lanes] */
static __m256i sum8(const __m256i *p)
{
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    __m128i lo = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i hi = _mm_add_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    return _mm256_setr_m128i(lo, hi);
}

static void scale_min_k4(int j, const uint8_t *q, int32_t *sc, int32_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

float strata_xcpu_dot_q8_avx2(uint32_t type, const uint8_t *row, int64_t ne0, const int8_t *xq,
                              const float *xd, const int32_t *bsum)
{
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    switch (type) {
    case STRATA_TYPE_Q8_0:
        for (int64_t b = 0; b < ne0 / 32; b++) {
            const uint8_t *blk = row + b * 34;
            __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
            __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
            __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc = _mm256_fmadd_ps(f, _mm256_set1_ps(f16_at(blk) * xd[b]), acc);
        }
        return hsum(acc);
    case STRATA_TYPE_Q4_K:
    case STRATA_TYPE_Q5_K: {
        const int q5 = type == STRATA_TYPE_Q5_K, bs = q5 ? 176 : 144;
        const __m256i m1 = _mm256_set1_epi8(1);
        for (int64_t sb = 0; sb < ne0 / 256; sb++) {
            const uint8_t *blk = row + sb * bs, *qs = blk + (q5 ? 48 : 16);
            const int8_t *x = xq + sb * 256;
            int32_t sc[8], mn[8];
            for (int j = 0; j < 8; j++)
                scale_min_k4(j, blk + 4, &sc[j], &mn[j]);
            __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16))
                            : _mm256_setzero_si256();
            __m256i p[8];
            for (int g = 0; g < 4; g++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
                __m256i lo = _mm256_and_si256(q, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                if (q5) {
                    __m256i bl = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m1);
                    __m256i bh = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), m1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(bl, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(bh, 4));
                }
                __m256i xl = _mm256_loadu_si256((const __m256i *)(x + 64 * g));
                __m256i xh = _mm256_loadu_si256((const __m256i *)(x + 64 * g + 32));
                p[2 * g] = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones);
                p[2 * g + 1] = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones);
            }
            /* per sub-block j: d8[j] * (d * sc[j] * dot_j - dmin * mn[j] * sum_j), the
             * integer products exact in float (below 2^24) */
            __m256 dots = _mm256_cvtepi32_ps(sum8(p));
            __m256 vsc = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)sc));
            __m256 vmn = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)mn));
            __m256 vbs = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(bsum + sb * 8)));
            __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(f16_at(blk)),
                                                   _mm256_mul_ps(vsc, dots)),
                                     _mm256_mul_ps(_mm256_set1_ps(f16_at(blk + 2)),
                                                   _mm256_mul_ps(vmn, vbs)));
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(xd + sb * 8), t, acc);
        }
        return hsum(acc);
    }
    case STRATA_TYPE_Q6_K: {
        const __m256i m2 = _mm256_set1_epi8(3);
        for (int64_t sb = 0; sb < ne0 / 256; sb++) {
            const uint8_t *blk = row + sb * 210;
            const int8_t *x = xq + sb * 256;
            /* bsum holds 16-value sums for Q6_K: the -32 offset per scale group */
            const int32_t *b16 = bsum + sb * 16;
            __m256i p[8];
            for (int ip = 0; ip < 2; ip++) {
                const uint8_t *ql = blk + 64 * ip;
                const int8_t *sc = (const int8_t *)(blk + 192 + 8 * ip);
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * ip));
                __m256i q0 = _mm256_loadu_si256((const __m256i *)ql);
                __m256i q1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                for (int s = 0; s < 4; s++) {
                    __m256i lo = s & 1 ? q1 : q0;
                    lo = _mm256_and_si256(s >> 1 ? _mm256_srli_epi16(lo, 4) : lo, m4);
                    __m256i h = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m2);
                    __m256i w = _mm256_or_si256(lo, _mm256_slli_epi16(h, 4));
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 128 * ip + 32 * s));
                    __m256i scv = _mm256_setr_m128i(_mm_set1_epi16(sc[2 * s]),
                                                    _mm_set1_epi16(sc[2 * s + 1]));
                    __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), scv);
                    /* the quants' -32, exactly, per scale group of 16 */
                    p[4 * ip + s] = _mm256_sub_epi32(
                        v, _mm256_setr_epi32(32 * sc[2 * s] * b16[8 * ip + 2 * s], 0, 0, 0,
                                             32 * sc[2 * s + 1] * b16[8 * ip + 2 * s + 1], 0,
                                             0, 0));
                }
            }
            __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xd + sb * 8), _mm256_cvtepi32_ps(sum8(p)));
            acc = _mm256_fmadd_ps(t, _mm256_set1_ps(f16_at(blk + 208)), acc);
        }
        return hsum(acc);
    }
    default:
        return 0.0f;
    }
}

void strata_xcpu_quantize_q8_avx2(const float *x, int64_t n, int8_t *q, float *d,
                                  int32_t *bsum, int g)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 32; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
            /* max_ps returns its second operand when the first is NaN: NaNs are
             * skipped, as fmaxf skips them; the max itself is exact in any order */
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m);
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float s = _mm_cvtss_f32(h) / 127.0f;
        d[b] = s;
        int32_t qi[32] = {0};
        if (s > 0.0f) {
            /* x / s rounded in the current mode (nearest, ties to even): lrintf's bits */
            const __m256 vs = _mm256_set1_ps(s);
            for (int k = 0; k < 4; k++)
                _mm256_storeu_si256((__m256i *)(qi + 8 * k),
                                    _mm256_cvtps_epi32(_mm256_div_ps(v[k], vs)));
        }
        /* int8 as the scalar path casts lrintf's value (a NaN's INT_MIN becomes 0) */
        int32_t s0 = 0, s1 = 0;
        for (int j = 0; j < 32; j++) {
            q[32 * b + j] = (int8_t)qi[j];
            if (j < 16)
                s0 += q[32 * b + j];
            else
                s1 += q[32 * b + j];
        }
        if (g == 16) {
            bsum[2 * b] = s0;
            bsum[2 * b + 1] = s1;
        } else {
            bsum[b] = s0 + s1;
        }
    }
}

int strata_xcpu_have_avx2(void)
{
    return 1;
}

#else

float strata_xcpu_dot_q8_avx2(uint32_t type, const uint8_t *row, int64_t ne0, const int8_t *xq,
                              const float *xd, const int32_t *bsum)
{
    (void)type;
    (void)row;
    (void)ne0;
    (void)xq;
    (void)xd;
    (void)bsum;
    return 0.0f;
}

void strata_xcpu_quantize_q8_avx2(const float *x, int64_t n, int8_t *q, float *d,
                                  int32_t *bsum, int g)
{
    (void)x;
    (void)n;
    (void)q;
    (void)d;
    (void)bsum;
    (void)g;
}

int strata_xcpu_have_avx2(void)
{
    return 0;
}

#endif
