/* quant_dot.c - scalar dot products of weight rows with quantised activations.
 *
 * One plain kernel per type, the reference for the SIMD paths.  Each block's
 * integer sums are exact; floats enter once per block (or per sub-block where
 * the format has float sub-scales), in the order ggml's scalar vec_dot
 * functions use, so the result matches ggml's up to float rounding.
 */
#include <string.h>

#include "iq_tables.h"
#include "quant_impl.h"

#define F16(x) strata_f16_to_f32(x)

static float dot_f32(int64_t n, const void *vw, const float *a)
{
    const float *w = vw;
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += w[i] * a[i];
    return s;
}

static float dot_f16(int64_t n, const void *vw, const float *a)
{
    const strata_f16 *w = vw;
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += F16(w[i]) * a[i];
    return s;
}

static float dot_bf16(int64_t n, const void *vw, const float *a)
{
    const strata_bf16 *w = vw;
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += strata_bf16_to_f32(w[i]) * a[i];
    return s;
}

static float dot_q4_0(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_q4_0 *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((b->qs[j] & 0xF) - 8) * a->qs[j] + ((b->qs[j] >> 4) - 8) * a->qs[j + 16];
        s += (float)sum * (F16(b->d) * F16(a->d));
    }
    return s;
}

static float dot_q4_1(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_q4_1 *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        int sum = 0, asum = 0;
        for (int j = 0; j < 16; j++) {
            sum += (b->qs[j] & 0xF) * a->qs[j] + (b->qs[j] >> 4) * a->qs[j + 16];
            asum += a->qs[j] + a->qs[j + 16];
        }
        float da = F16(a->d);
        s += (float)sum * (F16(b->d) * da) + F16(b->m) * (da * (float)asum);
    }
    return s;
}

static uint32_t qh32(const uint8_t qh[4])
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static float dot_q5_0(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_q5_0 *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        uint32_t h = qh32(b->qh);
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = ((b->qs[j] & 0xF) | ((h >> j) & 1) << 4) - 16;
            int q1 = ((b->qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4) - 16;
            sum += q0 * a->qs[j] + q1 * a->qs[j + 16];
        }
        s += (float)sum * (F16(b->d) * F16(a->d));
    }
    return s;
}

static float dot_q5_1(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_q5_1 *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        uint32_t h = qh32(b->qh);
        int sum = 0, asum = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (b->qs[j] & 0xF) | ((h >> j) & 1) << 4;
            int q1 = (b->qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4;
            sum += q0 * a->qs[j] + q1 * a->qs[j + 16];
            asum += a->qs[j] + a->qs[j + 16];
        }
        float da = F16(a->d);
        s += (float)sum * (F16(b->d) * da) + F16(b->m) * (da * (float)asum);
    }
    return s;
}

static float dot_q8_0(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_q8_0 *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += b->qs[j] * a->qs[j];
        s += (float)sum * (F16(b->d) * F16(a->d));
    }
    return s;
}

static float dot_iq4_nl(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_iq4_nl *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += strata_kvalues_iq4nl[b->qs[j] & 0xF] * a->qs[j] +
                   strata_kvalues_iq4nl[b->qs[j] >> 4] * a->qs[j + 16];
        s += (float)sum * (F16(b->d) * F16(a->d));
    }
    return s;
}

static float dot_mxfp4(int64_t n, const void *vw, const struct strata_block_q8_0 *a)
{
    const struct strata_block_mxfp4 *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++, b++, a++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += strata_kvalues_mxfp4[b->qs[j] & 0xF] * a->qs[j] +
                   strata_kvalues_mxfp4[b->qs[j] >> 4] * a->qs[j + 16];
        s += (float)sum * (strata_e8m0_half(b->e) * F16(a->d));
    }
    return s;
}

/* ---- K-quants against Q8_K ---------------------------------------------- */

static float dot_q2_K(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_q2_K *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int isum = 0, msum = 0;
        for (int k = 0; k < 256; k++) {
            int h = k / 128, r = k % 128;
            int q = (b->qs[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            isum += (b->scales[k / 16] & 0xF) * q * a->qs[k];
        }
        for (int g = 0; g < 16; g++)
            msum += (b->scales[g] >> 4) * a->bsums[g];
        s += a->d * F16(b->d) * (float)isum - a->d * F16(b->dmin) * (float)msum;
    }
    return s;
}

static float dot_q3_K(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_q3_K *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int8_t sc[16];
        strata_q3k_scales(b->scales, sc);
        int isum = 0;
        for (int k = 0; k < 256; k++) {
            int h = k / 128, r = k % 128;
            int lo = (b->qs[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            int hb = (b->hmask[r % 32] >> (4 * h + r / 32)) & 1;
            isum += sc[k / 16] * (lo - (hb ? 0 : 4)) * a->qs[k];
        }
        s += a->d * F16(b->d) * (float)isum;
    }
    return s;
}

static float dot_q4_K(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_q4_K *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            strata_q4k_scale_min(j, b->scales, &sc, &m);
            const uint8_t *q = b->qs + 32 * (j / 2);
            int sub = 0;
            for (int l = 0; l < 32; l++)
                sub += (j % 2 ? q[l] >> 4 : q[l] & 0xF) * a->qs[32 * j + l];
            isum += sc * sub;
            msum += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
        }
        s += a->d * F16(b->d) * (float)isum - a->d * F16(b->dmin) * (float)msum;
    }
    return s;
}

static float dot_q5_K(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_q5_K *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            strata_q4k_scale_min(j, b->scales, &sc, &m);
            const uint8_t *q = b->qs + 32 * (j / 2);
            int sub = 0;
            for (int l = 0; l < 32; l++) {
                int v = (j % 2 ? q[l] >> 4 : q[l] & 0xF) | ((b->qh[l] >> j) & 1) << 4;
                sub += v * a->qs[32 * j + l];
            }
            isum += sc * sub;
            msum += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
        }
        s += a->d * F16(b->d) * (float)isum - a->d * F16(b->dmin) * (float)msum;
    }
    return s;
}

static float dot_q6_K(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_q6_K *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int isum = 0;
        for (int g = 0; g < 16; g++) {
            int sub = 0;
            for (int k = 16 * g; k < 16 * g + 16; k++) {
                int h = k / 128, r = k % 128, l = r % 32, quarter = r / 32;
                uint8_t lb = b->ql[64 * h + l + 32 * (quarter & 1)];
                int lo = quarter < 2 ? lb & 0xF : lb >> 4;
                int hi = (b->qh[32 * h + l] >> (2 * quarter)) & 3;
                sub += ((lo | hi << 4) - 32) * a->qs[k];
            }
            isum += b->scales[g] * sub;
        }
        s += a->d * F16(b->d) * (float)isum;
    }
    return s;
}

/* ---- i-quants against Q8_K ------------------------------------------------ */

static int grid_dot8(uint64_t g, uint8_t signs, const int8_t *q)
{
    int s = 0;
    for (int j = 0; j < 8; j++) {
        int v = (int8_t)(g >> (8 * j));
        s += (signs >> j & 1 ? -v : v) * q[j];
    }
    return s;
}

static float dot_iq2_xxs(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq2_xxs *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t w0 = (uint32_t)b->qs[4 * ib] | (uint32_t)b->qs[4 * ib + 1] << 16;
            uint32_t w1 = (uint32_t)b->qs[4 * ib + 2] | (uint32_t)b->qs[4 * ib + 3] << 16;
            int sum = 0;
            for (int l = 0; l < 4; l++)
                sum += grid_dot8(strata_iq2xxs_grid[(w0 >> (8 * l)) & 0xff],
                                 strata_ksigns_iq2xs[(w1 >> (7 * l)) & 127],
                                 a->qs + 32 * ib + 8 * l);
            bsum += sum * (int)(2 * (w1 >> 28) + 1);
        }
        /* d * (0.5 + s) / 4 = d * (2s + 1) / 8 */
        s += F16(b->d) * a->d * (float)bsum * 0.125f;
    }
    return s;
}

static float dot_iq2_xs(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq2_xs *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++) {
                uint16_t q = b->qs[4 * ib + l];
                int ls = 2 * ((b->scales[ib] >> (4 * (l / 2))) & 0xF) + 1;
                bsum += ls * grid_dot8(strata_iq2xs_grid[q & 511], strata_ksigns_iq2xs[q >> 9],
                                       a->qs + 32 * ib + 8 * l);
            }
        }
        s += F16(b->d) * a->d * (float)bsum * 0.125f;
    }
    return s;
}

static float dot_iq2_s(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq2_s *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            for (int l = 0; l < 4; l++) {
                int idx = b->qs[4 * ib + l] | ((b->qh[ib] << (8 - 2 * l)) & 0x300);
                int ls = 2 * ((b->scales[ib] >> (4 * (l / 2))) & 0xF) + 1;
                bsum += ls * grid_dot8(strata_iq2s_grid[idx], b->qs[32 + 4 * ib + l],
                                       a->qs + 32 * ib + 8 * l);
            }
        }
        s += F16(b->d) * a->d * (float)bsum * 0.125f;
    }
    return s;
}

static float dot_iq3_xxs(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq3_xxs *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        const uint8_t *qs = b->qs, *ss = b->qs + 64;
        int bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t w = (uint32_t)ss[4 * ib] | (uint32_t)ss[4 * ib + 1] << 8 |
                         (uint32_t)ss[4 * ib + 2] << 16 | (uint32_t)ss[4 * ib + 3] << 24;
            int sum = 0;
            for (int l = 0; l < 4; l++) {
                uint64_t g = strata_iq3xxs_grid[qs[8 * ib + 2 * l]] |
                             (uint64_t)strata_iq3xxs_grid[qs[8 * ib + 2 * l + 1]] << 32;
                sum += grid_dot8(g, strata_ksigns_iq2xs[(w >> (7 * l)) & 127],
                                 a->qs + 32 * ib + 8 * l);
            }
            bsum += sum * (int)(2 * (w >> 28) + 1);
        }
        /* d * (0.5 + s) / 2 = d * (2s + 1) / 4 */
        s += F16(b->d) * a->d * (float)bsum * 0.25f;
    }
    return s;
}

static float dot_iq3_s(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq3_s *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int bsum = 0;
        for (int ib = 0; ib < 8; ib++) {
            int ls = 1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 0xF);
            uint8_t qh = b->qh[ib];
            int sum = 0;
            for (int l = 0; l < 4; l++) {
                int i1 = b->qs[8 * ib + 2 * l] | ((qh << (8 - 2 * l)) & 256);
                int i2 = b->qs[8 * ib + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
                uint64_t g = strata_iq3s_grid[i1] | (uint64_t)strata_iq3s_grid[i2] << 32;
                sum += grid_dot8(g, b->signs[4 * ib + l], a->qs + 32 * ib + 8 * l);
            }
            bsum += sum * ls;
        }
        s += F16(b->d) * a->d * (float)bsum;
    }
    return s;
}

static float dot_iq1_s(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq1_s *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int sumi = 0, sumd = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t qh = b->qh[ib];
            int ls = 2 * ((qh >> 12) & 7) + 1;
            int sum = 0;
            for (int l = 0; l < 4; l++)
                sum += grid_dot8(strata_iq1s_grid[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)],
                                 0, a->qs + 32 * ib + 8 * l);
            sumi += ls * sum;
            int q8sum = a->bsums[2 * ib] + a->bsums[2 * ib + 1];
            sumd += ls * (qh & 0x8000 ? -q8sum : q8sum);
        }
        s += F16(b->d) * a->d * ((float)sumi + STRATA_IQ1S_DELTA * (float)sumd);
    }
    return s;
}

static float dot_iq1_m(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq1_m *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int sumi = 0, sumd = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t sc = (uint16_t)(b->scales[2 * (ib / 2)] | b->scales[2 * (ib / 2) + 1] << 8);
            int shift = 6 * (ib % 2);
            int ls[2] = {2 * ((sc >> shift) & 7) + 1, 2 * ((sc >> (shift + 3)) & 7) + 1};
            for (int l = 0; l < 4; l++) {
                int nib = (b->qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0xF;
                int idx = b->qs[4 * ib + l] | ((nib & 7) << 8);
                const int8_t *q = a->qs + 32 * ib + 8 * l;
                int q8sum = 0;
                for (int j = 0; j < 8; j++)
                    q8sum += q[j];
                sumi += ls[l / 2] * grid_dot8(strata_iq1s_grid[idx], 0, q);
                sumd += ls[l / 2] * (nib & 8 ? -q8sum : q8sum);
            }
        }
        s += F16(strata_iq1m_scale(b)) * a->d *
             ((float)sumi + STRATA_IQ1M_DELTA * (float)sumd);
    }
    return s;
}

static float dot_iq4_xs(int64_t n, const void *vw, const struct strata_block_q8_K *a)
{
    const struct strata_block_iq4_xs *b = vw;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++, b++, a++) {
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
                     (((b->scales_h >> (2 * ib)) & 3) << 4);
            const uint8_t *qs = b->qs + 16 * ib;
            const int8_t *q = a->qs + 32 * ib;
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += strata_kvalues_iq4nl[qs[j] & 0xF] * q[j] +
                       strata_kvalues_iq4nl[qs[j] >> 4] * q[j + 16];
            isum += (ls - 32) * sum;
        }
        s += F16(b->d) * a->d * (float)isum;
    }
    return s;
}

/* Wrap a one-dot kernel into the n_act form of strata_vec_dot_fn. */
#define MULTI(name, atype)                                                                  \
    static void multi_##name(int64_t n, const void *w, const void *act, size_t stride,      \
                             int n_act, float *out)                                         \
    {                                                                                       \
        for (int t = 0; t < n_act; t++)                                                     \
            out[t] = dot_##name(n, w, (const atype *)((const char *)act + (size_t)t * stride)); \
    }
MULTI(f32, float)
MULTI(f16, float)
MULTI(bf16, float)
MULTI(q4_0, struct strata_block_q8_0)
MULTI(q4_1, struct strata_block_q8_0)
MULTI(q5_0, struct strata_block_q8_0)
MULTI(q5_1, struct strata_block_q8_0)
MULTI(q8_0, struct strata_block_q8_0)
MULTI(iq4_nl, struct strata_block_q8_0)
MULTI(mxfp4, struct strata_block_q8_0)
MULTI(q2_K, struct strata_block_q8_K)
MULTI(q3_K, struct strata_block_q8_K)
MULTI(q4_K, struct strata_block_q8_K)
MULTI(q5_K, struct strata_block_q8_K)
MULTI(q6_K, struct strata_block_q8_K)
MULTI(iq2_xxs, struct strata_block_q8_K)
MULTI(iq2_xs, struct strata_block_q8_K)
MULTI(iq2_s, struct strata_block_q8_K)
MULTI(iq3_xxs, struct strata_block_q8_K)
MULTI(iq3_s, struct strata_block_q8_K)
MULTI(iq1_s, struct strata_block_q8_K)
MULTI(iq1_m, struct strata_block_q8_K)
MULTI(iq4_xs, struct strata_block_q8_K)

const strata_vec_dot_fn strata_quant_dot_scalar[STRATA_TYPE_COUNT] = {
    [STRATA_TYPE_F32] = multi_f32,
    [STRATA_TYPE_F16] = multi_f16,
    [STRATA_TYPE_BF16] = multi_bf16,
    [STRATA_TYPE_Q4_0] = multi_q4_0,
    [STRATA_TYPE_Q4_1] = multi_q4_1,
    [STRATA_TYPE_Q5_0] = multi_q5_0,
    [STRATA_TYPE_Q5_1] = multi_q5_1,
    [STRATA_TYPE_Q8_0] = multi_q8_0,
    [STRATA_TYPE_IQ4_NL] = multi_iq4_nl,
    [STRATA_TYPE_MXFP4] = multi_mxfp4,
    [STRATA_TYPE_Q2_K] = multi_q2_K,
    [STRATA_TYPE_Q3_K] = multi_q3_K,
    [STRATA_TYPE_Q4_K] = multi_q4_K,
    [STRATA_TYPE_Q5_K] = multi_q5_K,
    [STRATA_TYPE_Q6_K] = multi_q6_K,
    [STRATA_TYPE_IQ2_XXS] = multi_iq2_xxs,
    [STRATA_TYPE_IQ2_XS] = multi_iq2_xs,
    [STRATA_TYPE_IQ2_S] = multi_iq2_s,
    [STRATA_TYPE_IQ3_XXS] = multi_iq3_xxs,
    [STRATA_TYPE_IQ3_S] = multi_iq3_s,
    [STRATA_TYPE_IQ1_S] = multi_iq1_s,
    [STRATA_TYPE_IQ1_M] = multi_iq1_m,
    [STRATA_TYPE_IQ4_XS] = multi_iq4_xs,
};
