/* quant_avx2.c - AVX2 + FMA + F16C dot kernels (compiled with those flags,
 * see mk/quant.mk; called only when CPUID reports them). */
#define SIMD_VNNI 0
#define SIMD_PREFIX avx2_
#include "quant_simd.inc"

const strata_vec_dot_fn strata_quant_dot_avx2[STRATA_TYPE_COUNT] = {SIMD_TABLE_ENTRIES};

/* ---- activation quantisation, bit for bit as the scalar code in quant.c --- */

static inline float hmax8(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline int hsum8_epi32(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
    return _mm_cvtsi128_si32(x);
}

/* 32 int32 (4 vectors) -> 32 int8 in order */
static inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void strata_quant_act_avx2(uint32_t vec_type, const float *x, void *dst, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    if (vec_type == STRATA_TYPE_Q8_0) {
        struct strata_block_q8_0 *y = dst;
        for (int64_t i = 0; i < n / 32; i++, x += 32, y++) {
            __m256 v[4], m = _mm256_setzero_ps();
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_loadu_ps(x + 8 * k);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
            }
            float amax = hmax8(m);
            float id = amax != 0.f ? 127.f / amax : 0.0f;
            y->d = strata_f32_to_f16(amax / 127.f);
            __m256 mul = _mm256_set1_ps(id);
            __m256i q[4];
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], mul));
            _mm256_storeu_si256((__m256i *)y->qs, pack32(q[0], q[1], q[2], q[3]));
        }
        return;
    }
    struct strata_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / 256; i++, x += 256, y++) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
        float amax = hmax8(m);
        if (amax == 0.f) {
            memset(y, 0, sizeof(*y));
            continue;
        }
        float max = 0;
        for (int j = 0; j < 256; j++) /* the first element of largest magnitude */
            if (x[j] == amax || x[j] == -amax) {
                max = x[j];
                break;
            }
        float iscale = -127.f / max;
        __m256 mul = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int g = 0; g < 8; g++) { /* 32 elements, two bsums */
            __m256i q[4];
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * k), mul)),
                    lim);
            _mm256_storeu_si256((__m256i *)(y->qs + 32 * g), pack32(q[0], q[1], q[2], q[3]));
            y->bsums[2 * g] = (int16_t)hsum8_epi32(_mm256_add_epi32(q[0], q[1]));
            y->bsums[2 * g + 1] = (int16_t)hsum8_epi32(_mm256_add_epi32(q[2], q[3]));
        }
        y->d = 1.f / iscale;
    }
}
