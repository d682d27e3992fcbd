/* expert_cpu_avx512.c - AVX-512 rows of the 8-bit path of expert_cpu.c, two weight rows
 * per 512-bit register (row a in the low eight lanes, row b in the high eight) against
 * one load of the activations.  The integer dot products use VNNI's vpdpbusd (unsigned
 * weight quants times signed activation quants, summed in 32 bits without
 * saturation: exact); the float combination is the eight-lane order of
 * expert_cpu_int.h, so each row's bits are those of the scalar and AVX2 rows.
 * Compiled with -mavx512f/bw/vl/dq -mavx512vnni (mk/expert_cpu.mk); called only when
 * the CPU has them (strata_quant_simd_detect's AVX-512 level). */
#include "expert_cpu_int.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include <string.h>

#include "ggml_types.h"

#ifndef PF_HINT
/* into L2 (one thread reading from memory on the dev machine: 13-14 GB/s; into L1,
 * whose miss buffers are fewer: 7) */
#define PF_HINT _MM_HINT_T1
#endif

static inline float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static inline uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 32 bytes of row a, then 32 of row b */
static inline __m512i load2(const uint8_t *a, const uint8_t *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* 32 activation quants in both halves */
static inline __m512i bcast32(const int8_t *x)
{
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x));
}

/* [a x 8 | b x 8] */
static inline __m512 pair_ps(float a, float b)
{
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

/* the AVX2 rows' horizontal sum: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline float hsum8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static inline void store_pair(__m512 acc, float *ya, float *yb)
{
    *ya = hsum8(_mm512_castps512_ps256(acc));
    float b = hsum8(_mm512_extractf32x8_ps(acc, 1));
    if (yb)
        *yb = b;
}

/* Four 128-bit lanes of p[0..3] summed per register: lane k of the result holds
 * [sum of p[0]'s lane k, ..., sum of p[3]'s lane k]. */
static inline __m512i sum4x4(const __m512i *p)
{
    __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]),
                                   _mm512_unpackhi_epi32(p[0], p[1]));
    __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]),
                                   _mm512_unpackhi_epi32(p[2], p[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

/* u = sum4x4 of groups 0-3, v = of groups 4-7, each [a: first half | a: second half |
 * b: first half | b: second half] -> [a: 0..7 | b: 0..7], the halves added */
static inline __m512i join_halves(__m512i u, __m512i v)
{
    __m512i s = _mm512_add_epi32(_mm512_shuffle_i32x4(u, v, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i32x4(u, v, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_shuffle_i32x4(s, s, _MM_SHUFFLE(3, 1, 2, 0));
}

/* the 6-bit scales and mins of a Q4_K / Q5_K super-block (12 bytes at q) as eight
 * bytes each, sub-block j in byte j (the packing of ggml-common.h's get_scale_min_k4) */
static inline void scales_k4(const uint8_t *q, uint64_t *sc, uint64_t *mn)
{
    const uint32_t u0 = u32_at(q), u1 = u32_at(q + 4), u2 = u32_at(q + 8);
    const uint32_t s_hi = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
    *sc = (uint64_t)(u0 & 0x3F3F3F3Fu) | (uint64_t)s_hi << 32;
    *mn = (uint64_t)(u1 & 0x3F3F3F3Fu) | (uint64_t)m_hi << 32;
}

static void pair_q8_0(const uint8_t *ra, const uint8_t *rb, int64_t ne0, const int8_t *xq,
                      const float *xd, float *ya, float *yb)
{
    __m512 acc = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t b = 0; b < ne0 / 32; b++) {
        const uint8_t *ba = ra + b * 34, *bb = rb + b * 34;
        __m512i w = load2(ba + 2, bb + 2), x = bcast32(xq + 32 * b);
        /* |w| times x with w's sign: the AVX2 rows' sign trick, exact */
        __mmask64 neg = _mm512_movepi8_mask(w);
        __m512i xs = _mm512_mask_sub_epi8(x, neg, zero, x);
        __m512i p = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w), xs);
        __m512 s = pair_ps(f16_at(ba) * xd[b], f16_at(bb) * xd[b]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc);
    }
    store_pair(acc, ya, yb);
}

static void pair_q45_k(int q5, const uint8_t *ra, const uint8_t *rb, int64_t ne0,
                       const int8_t *xq, const float *xd, const int32_t *bsum, float *ya,
                       float *yb)
{
    const int bs = q5 ? 176 : 144, qso = q5 ? 48 : 16;
    const __m512i m4 = _mm512_set1_epi8(0x0F), v16 = _mm512_set1_epi8(0x10);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < ne0 / 256; sb++) {
        const uint8_t *ba = ra + sb * bs, *bb = rb + sb * bs;
        const int8_t *x = xq + sb * 256;
        __m512i qh = q5 ? load2(ba + 16, bb + 16) : zero;
        __m512i p[8];
        for (int g = 0; g < 4; g++) {
            __m512i q = load2(ba + qso + 32 * g, bb + qso + 32 * g);
            __m512i lo = _mm512_and_si512(q, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            if (q5) {
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, _mm512_set1_epi8(
                                                                          (char)(1 << (2 * g)))),
                                          lo, v16);
                hi = _mm512_mask_add_epi8(
                    hi, _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(2 << (2 * g)))), hi,
                    v16);
            }
            p[2 * g] = _mm512_dpbusd_epi32(zero, lo, bcast32(x + 64 * g));
            p[2 * g + 1] = _mm512_dpbusd_epi32(zero, hi, bcast32(x + 64 * g + 32));
        }
        /* sub-block j's dot of row a in lane j, of row b in lane 8 + j */
        __m512 dots = _mm512_cvtepi32_ps(join_halves(sum4x4(p), sum4x4(p + 4)));
        uint64_t sca, mna, scb, mnb;
        scales_k4(ba + 4, &sca, &mna);
        scales_k4(bb + 4, &scb, &mnb);
        __m512 vsc = _mm512_cvtepi32_ps(
            _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)scb, (long long)sca)));
        __m512 vmn = _mm512_cvtepi32_ps(
            _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)mnb, (long long)mna)));
        __m512 vbs = _mm512_cvtepi32_ps(
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(bsum + sb * 8))));
        __m512 vxd = _mm512_castsi512_ps(
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xd + sb * 8))));
        __m512 t = _mm512_sub_ps(
            _mm512_mul_ps(pair_ps(f16_at(ba), f16_at(bb)), _mm512_mul_ps(vsc, dots)),
            _mm512_mul_ps(pair_ps(f16_at(ba + 2), f16_at(bb + 2)), _mm512_mul_ps(vmn, vbs)));
        acc = _mm512_fmadd_ps(vxd, t, acc);
    }
    store_pair(acc, ya, yb);
}

static void pair_q6_k(const uint8_t *ra, const uint8_t *rb, int64_t ne0, const int8_t *xq,
                      const float *xd, const int32_t *bsum, float *ya, float *yb)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i zero = _mm512_setzero_si512();
    /* scale groups in the order sum4x4 leaves them: even groups, then odd */
    const __m128i sperm = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m512i bperm0 = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7);
    const __m512i bperm1 = _mm512_add_epi32(bperm0, _mm512_set1_epi32(8));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < ne0 / 256; sb++) {
        const uint8_t *ba = ra + sb * 210, *bb = rb + sb * 210;
        const int8_t *x = xq + sb * 256;
        __m512i p[8];
        for (int ip = 0; ip < 2; ip++) {
            __m512i q0 = load2(ba + 64 * ip, bb + 64 * ip);
            __m512i q1 = load2(ba + 64 * ip + 32, bb + 64 * ip + 32);
            __m512i qh = load2(ba + 128 + 32 * ip, bb + 128 + 32 * ip);
            /* quants 32 s + l of this half: low 4 bits from q0 / q1 (high nibbles for
             * s >= 2), bits 4-5 from bits 2 s, 2 s + 1 of qh */
            __m512i w[4];
            w[0] = _mm512_or_si512(_mm512_and_si512(q0, m4),
                                   _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
            w[1] = _mm512_or_si512(_mm512_and_si512(q1, m4),
                                   _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
            w[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q0, 4), m4),
                                   _mm512_and_si512(qh, m30));
            w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q1, 4), m4),
                                   _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
            for (int s = 0; s < 4; s++)
                p[4 * ip + s] = _mm512_dpbusd_epi32(zero, w[s], bcast32(x + 128 * ip + 32 * s));
        }
        /* 16-value group dots: [a: 0, 2, 4, 6 | a: 1, 3, 5, 7 | b: ... ] and 8..15 */
        __m512i u = sum4x4(p), v = sum4x4(p + 4);
        __m128i sa = _mm_loadu_si128((const __m128i *)(ba + 192));
        __m128i sbv = _mm_loadu_si128((const __m128i *)(bb + 192));
        __m512i sc0 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_unpacklo_epi64(sa, sbv), sperm));
        __m512i sc1 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_unpackhi_epi64(sa, sbv), sperm));
        /* the quants' -32: 32 times the activations' 16-value sums */
        __m512i b16 = _mm512_loadu_si512((const void *)(bsum + sb * 16));
        __m512i o0 = _mm512_slli_epi32(_mm512_permutexvar_epi32(bperm0, b16), 5);
        __m512i o1 = _mm512_slli_epi32(_mm512_permutexvar_epi32(bperm1, b16), 5);
        u = _mm512_mullo_epi32(_mm512_sub_epi32(u, o0), sc0);
        v = _mm512_mullo_epi32(_mm512_sub_epi32(v, o1), sc1);
        __m512 vxd = _mm512_castsi512_ps(
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xd + sb * 8))));
        __m512 t = _mm512_mul_ps(vxd, _mm512_cvtepi32_ps(join_halves(u, v)));
        acc = _mm512_fmadd_ps(t, pair_ps(f16_at(ba + 208), f16_at(bb + 208)), acc);
    }
    store_pair(acc, ya, yb);
}

#ifndef PF_BYTES
#define PF_BYTES 4096 /* best of 2-16 KiB on the dev machine */
#endif

static size_t row_bytes(uint32_t type, int64_t ne0)
{
    switch (type) {
    case STRATA_TYPE_Q8_0: return (size_t)(ne0 / 32) * 34;
    case STRATA_TYPE_Q4_K: return (size_t)(ne0 / 256) * 144;
    case STRATA_TYPE_Q5_K: return (size_t)(ne0 / 256) * 176;
    case STRATA_TYPE_Q6_K: return (size_t)(ne0 / 256) * 210;
    default: return 0;
    }
}

static inline void prefetch_row(const uint8_t *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64)
        _mm_prefetch((const char *)p + o, PF_HINT);
}

void strata_xcpu_rows_q8_avx512(uint32_t type, const uint8_t *w, size_t nb1, int64_t n_rows,
                                int64_t ne0, const int8_t *xq, const float *xd,
                                const int32_t *bsum, float *y)
{
    /* one core keeps too few misses in flight for the memory bandwidth on its own:
     * ask for the rows about PF_BYTES ahead while this pair is computed (rows
     * beyond n_rows belong to another thread's chunk).  Single-thread reads of a
     * 256 MiB Q4_K matrix on the dev machine: 6.8 GB/s without, 14 GB/s with. */
    const size_t len = row_bytes(type, ne0);
    const int64_t ahead = (int64_t)((PF_BYTES + nb1 - 1) / nb1);
    for (int64_t r = 0; r < ahead && r < n_rows; r++)
        prefetch_row(w + (size_t)r * nb1, len);
    for (int64_t r = 0; r < n_rows; r += 2) {
        for (int64_t k = r + ahead; k < r + ahead + 2 && k < n_rows; k++)
            prefetch_row(w + (size_t)k * nb1, len);
        /* an odd last row goes through as both rows of a pair */
        const uint8_t *ra = w + (size_t)r * nb1, *rb = r + 1 < n_rows ? ra + nb1 : ra;
        float *yb = r + 1 < n_rows ? y + r + 1 : NULL;
        switch (type) {
        case STRATA_TYPE_Q8_0: pair_q8_0(ra, rb, ne0, xq, xd, y + r, yb); break;
        case STRATA_TYPE_Q4_K: pair_q45_k(0, ra, rb, ne0, xq, xd, bsum, y + r, yb); break;
        case STRATA_TYPE_Q5_K: pair_q45_k(1, ra, rb, ne0, xq, xd, bsum, y + r, yb); break;
        case STRATA_TYPE_Q6_K: pair_q6_k(ra, rb, ne0, xq, xd, bsum, y + r, yb); break;
        default:
            y[r] = 0.0f;
            if (yb)
                *yb = 0.0f;
            break;
        }
    }
}

void strata_xcpu_quantize_q8_avx512(const float *x, int64_t n, int8_t *q, float *d,
                                    int32_t *bsum, int g)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / 32; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        /* max is exact in any order; a NaN is skipped as fmaxf skips it (max_ps
         * returns its second operand when the first is NaN) */
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_andnot_ps(sign, v1), m);
        float amax = _mm512_reduce_max_ps(m);
        float s = amax / 127.0f;
        d[b] = s;
        __m512i i0 = _mm512_setzero_si512(), i1 = i0;
        if (s > 0.0f) {
            /* x / s rounded in the current mode (nearest, ties to even): lrintf's bits */
            __m512 vs = _mm512_set1_ps(s);
            i0 = _mm512_cvtps_epi32(_mm512_div_ps(v0, vs));
            i1 = _mm512_cvtps_epi32(_mm512_div_ps(v1, vs));
        }
        __m128i q0 = _mm512_cvtepi32_epi8(i0), q1 = _mm512_cvtepi32_epi8(i1);
        _mm_storeu_si128((__m128i *)(q + 32 * b), q0);
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), q1);
        /* the sums of the stored quants (a NaN's INT_MIN is stored as 0, as lrintf's
         * value cast to int8) */
        i0 = _mm512_cvtepi8_epi32(q0);
        i1 = _mm512_cvtepi8_epi32(q1);
        if (g == 16) {
            bsum[2 * b] = _mm512_reduce_add_epi32(i0);
            bsum[2 * b + 1] = _mm512_reduce_add_epi32(i1);
        } else {
            bsum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        }
    }
}

int strata_xcpu_have_avx512(void)
{
    return 1;
}

#else

void strata_xcpu_rows_q8_avx512(uint32_t type, const uint8_t *w, size_t nb1, int64_t n_rows,
                                int64_t ne0, const int8_t *xq, const float *xd,
                                const int32_t *bsum, float *y)
{
    (void)type;
    (void)w;
    (void)nb1;
    (void)ne0;
    (void)xq;
    (void)xd;
    (void)bsum;
    for (int64_t r = 0; r < n_rows; r++)
        y[r] = 0.0f;
}

void strata_xcpu_quantize_q8_avx512(const float *x, int64_t n, int8_t *q, float *d,
                                    int32_t *bsum, int g)
{
    (void)x;
    (void)n;
    (void)q;
    (void)d;
    (void)bsum;
    (void)g;
}

int strata_xcpu_have_avx512(void)
{
    return 0;
}

#endif
