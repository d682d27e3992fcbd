/* expert_cpu.c - routed experts on the CPU with the GPU backend's numerics
 * (expert_cpu.h).  Block layouts are those of the GGUF specification (ggml-common.h);
 * the 8-bit scheme is the one kernels/matvec_q8.cu runs. */
#include "expert_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expert_cpu_int.h"
#include "ggml_types.h"
#include "pool.h"
#include "quant.h"

#define QB 32 /* values per q8 activation block */
#define CHUNK 256
#define TGROUP 8

int strata_xcpu_q8_supported(uint32_t type)
{
    return type == STRATA_TYPE_Q4_K || type == STRATA_TYPE_Q5_K || type == STRATA_TYPE_Q6_K ||
           type == STRATA_TYPE_Q8_0;
}

int strata_xcpu_ffn_q8(const struct strata_mat *gate, const struct strata_mat *down)
{
    return strata_xcpu_q8_supported(gate->type) && strata_xcpu_q8_supported(down->type) &&
           gate->ne1 % 32 == 0 && gate->ne1 == down->ne0;
}

int strata_xcpu_mode_for(const struct strata_mat *w, int matvec, int q8)
{
    if (matvec)
        return q8 ? STRATA_XCPU_Q8 : STRATA_XCPU_F32;
    return w->ne0 % 64 == 0 ? STRATA_XCPU_F16 : STRATA_XCPU_F32;
}

static float f16_at(const uint8_t *p)
{
    strata_f16 h;
    memcpy(&h, p, sizeof h);
    return strata_f16_to_f32(h);
}

/* round half to even, as the GPU's __float2int_rn (the default rounding mode) */
static int8_t q8_round(float v)
{
    return (int8_t)lrintf(v);
}

void strata_xcpu_quantize_q8(const float *x, int64_t n, int8_t *q, float *d)
{
    for (int64_t b = 0; b < n / QB; b++) {
        const float *xb = x + b * QB;
        float amax = 0.0f;
        for (int j = 0; j < QB; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float s = amax / 127.0f;
        d[b] = s;
        for (int j = 0; j < QB; j++)
            q[b * QB + j] = s > 0.0f ? q8_round(xb[j] / s) : 0;
    }
}

/* (sc, m) of sub-block j of a Q4_K / Q5_K super-block's 12 packed 6-bit scales */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static int dot_i8(const uint8_t *w, const int8_t *x, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += (int)w[i] * x[i];
    return s;
}

static int sum_i8(const int8_t *x, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return s;
}

/* One row of ne0 quantised weights times one q8 row (xq, xd): exact integer dot
 * products per scale group, scaled in float as the GPU's per-type dot does. */
static float dot_q8_row(uint32_t type, const uint8_t *row, int64_t ne0, const int8_t *xq,
                        const float *xd)
{
    float sum = 0.0f;
    uint8_t v[64];
    switch (type) {
    case STRATA_TYPE_Q8_0:
        for (int64_t b = 0; b < ne0 / 32; b++) {
            const uint8_t *blk = row + b * 34;
            int dt = 0;
            for (int j = 0; j < 32; j++)
                dt += (int)(int8_t)blk[2 + j] * xq[b * 32 + j];
            sum += f16_at(blk) * xd[b] * (float)dt;
        }
        break;
    case STRATA_TYPE_Q4_K:
    case STRATA_TYPE_Q5_K: {
        const int q5 = type == STRATA_TYPE_Q5_K, bs = q5 ? 176 : 144;
        for (int64_t sb = 0; sb < ne0 / 256; sb++) {
            const uint8_t *blk = row + sb * bs, *qs = blk + (q5 ? 48 : 16), *qh = blk + 16;
            const int8_t *x = xq + sb * 256;
            const float *d8 = xd + sb * 8;
            float a = 0.0f, m = 0.0f;
            for (int g = 0; g < 4; g++) {
                for (int l = 0; l < 32; l++) {
                    v[l] = qs[32 * g + l] & 0xF;
                    v[32 + l] = qs[32 * g + l] >> 4;
                    if (q5) {
                        v[l] |= ((qh[l] >> (2 * g)) & 1) << 4;
                        v[32 + l] |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
                    }
                }
                for (int h = 0; h < 2; h++) {
                    int j = 2 * g + h, sc, mn;
                    scale_min_k4(j, blk + 4, &sc, &mn);
                    a += d8[j] * (float)(sc * dot_i8(v + 32 * h, x + 32 * j, 32));
                    m += d8[j] * (float)(mn * sum_i8(x + 32 * j, 32));
                }
            }
            sum += f16_at(blk) * a - f16_at(blk + 2) * m;
        }
        break;
    }
    case STRATA_TYPE_Q6_K:
        for (int64_t sb = 0; sb < ne0 / 256; sb++) {
            const uint8_t *blk = row + sb * 210;
            const int8_t *x = xq + sb * 256;
            const float *d8 = xd + sb * 8;
            float a = 0.0f;
            for (int ip = 0; ip < 2; ip++) {
                const uint8_t *ql = blk + 64 * ip, *qh = blk + 128 + 32 * ip;
                const int8_t *sc = (const int8_t *)(blk + 192 + 8 * ip);
                for (int s = 0; s < 4; s++) {
                    /* values 128 ip + 32 s + l: one q8 block, two scale groups of 16 */
                    const uint8_t *lo = ql + 32 * (s & 1);
                    int sh = 4 * (s >> 1);
                    int8_t w[32];
                    for (int l = 0; l < 32; l++)
                        w[l] = (int8_t)((((lo[l] >> sh) & 0xF) | (((qh[l] >> (2 * s)) & 3) << 4)) -
                                        32);
                    const int8_t *xb = x + 128 * ip + 32 * s;
                    int d0 = 0, d1 = 0;
                    for (int l = 0; l < 16; l++) {
                        d0 += w[l] * xb[l];
                        d1 += w[16 + l] * xb[16 + l];
                    }
                    a += d8[4 * ip + s] * (float)(sc[2 * s] * d0 + sc[2 * s + 1] * d1);
                }
            }
            sum += f16_at(blk + 208) * a;
        }
        break;
    default:
        break;
    }
    return sum;
}

/* One matrix times n_tok prepared input rows. */
struct mm_seg {
    int mode, avx2;
    const struct strata_mat *w;
    int n_tok;
    const float *x;    /* F32 / F16: [n_tok, ne0] (F16: already rounded) */
    const int8_t *xq;  /* Q8: [n_tok, ne0] */
    const float *xd;   /* Q8: [n_tok, ne0 / 32] */
    const int32_t *bs; /* Q8: [n_tok, ne0 / 16] quant sums per 32 (per 16: Q6_K) values */
    float *y;
};

/* A pool job over the rows of several segments at once: thread ith takes its share
 * of all of them, so that a layer's CPU experts need one pool run, not one per
 * matrix. */
struct mm_job {
    const struct mm_seg *seg;
    int n_seg;
    int64_t rows;
};

static void seg_row(const struct mm_seg *j, int64_t r)
{
    const struct strata_mat *w = j->w;
    const int64_t ne0 = w->ne0, ne1 = w->ne1;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->nb1;
    if (j->mode == STRATA_XCPU_Q8) {
        for (int t = 0; t < j->n_tok; t++)
            j->y[(int64_t)t * ne1 + r] =
                j->avx2 ? strata_xcpu_dot_q8_avx2(w->type, row, ne0, j->xq + (int64_t)t * ne0,
                                                  j->xd + (int64_t)t * (ne0 / QB),
                                                  j->bs + (int64_t)t * (ne0 / 16))
                        : dot_q8_row(w->type, row, ne0, j->xq + (int64_t)t * ne0,
                                     j->xd + (int64_t)t * (ne0 / QB));
        return;
    }
    /* chunks of the row dequantised once for a group of tokens */
    const int64_t blck = strata_ggml_blck_size(w->type);
    const int64_t chunk = blck >= CHUNK ? blck : CHUNK / blck * blck;
    const size_t cbytes = strata_ggml_row_size(w->type, chunk);
    for (int t0 = 0; t0 < j->n_tok; t0 += TGROUP) {
        int nt = j->n_tok - t0 < TGROUP ? j->n_tok - t0 : TGROUP;
        float acc[TGROUP] = {0};
        for (int64_t c0 = 0; c0 < ne0; c0 += chunk) {
            float v[CHUNK];
            int64_t nc = ne0 - c0 < chunk ? ne0 - c0 : chunk;
            strata_quant_dequant_row(w->type, row + (size_t)(c0 / chunk) * cbytes, v, nc);
            if (j->mode == STRATA_XCPU_F16)
                for (int64_t i = 0; i < nc; i++)
                    v[i] = strata_f16_to_f32(strata_f32_to_f16(v[i]));
            for (int t = 0; t < nt; t++) {
                const float *xt = j->x + (int64_t)(t0 + t) * ne0 + c0;
                float a = acc[t];
                for (int64_t i = 0; i < nc; i++)
                    a += v[i] * xt[i];
                acc[t] = a;
            }
        }
        for (int t = 0; t < nt; t++)
            j->y[(int64_t)(t0 + t) * ne1 + r] = acc[t];
    }
}

static void mm_worker(void *ctx, int ith, int nth)
{
    const struct mm_job *j = ctx;
    int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth, base = 0;
    for (int i = 0; i < j->n_seg && r0 < r1; i++) {
        const int64_t ne1 = j->seg[i].w->ne1;
        for (; r0 < r1 && r0 < base + ne1; r0++)
            seg_row(&j->seg[i], r0 - base);
        base += ne1;
    }
}

static const char *type_name(uint32_t t)
{
    return strata_ggml_type_name(t) ? strata_ggml_type_name(t) : "?";
}

static int check_mat(int mode, const struct strata_mat *w, struct strata_err *err)
{
    const char *tn = type_name(w->type);
    if (mode == STRATA_XCPU_Q8 ? !strata_xcpu_q8_supported(w->type)
                               : !strata_quant_supported(w->type))
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "CPU expert: weight type %s has no %s dot product", tn,
                              mode == STRATA_XCPU_Q8 ? "8-bit" : "float");
    int64_t blck = strata_ggml_blck_size(w->type);
    if (w->ne0 <= 0 || w->ne1 <= 0 || !blck || w->ne0 % blck ||
        (mode == STRATA_XCPU_Q8 && w->ne0 % QB))
        return strata_err_set(err, STRATA_E_INVALID,
                              "CPU expert: %s matrix of ne0=%lld ne1=%lld (block %lld)", tn,
                              (long long)w->ne0, (long long)w->ne1, (long long)blck);
    if (blck > CHUNK)
        return strata_err_set(err, STRATA_E_UNSUPPORTED,
                              "CPU expert: %s blocks of %lld values", tn, (long long)blck);
    return 0;
}

/* Prepare segment j's inputs x [n_tok, w->ne0] in scratch (q8 rows, or f16-rounded
 * floats); returns the bytes of scratch used (strata_xcpu_scratch_bytes at most). */
static size_t seg_prepare(struct mm_seg *j, int mode, int avx2, const struct strata_mat *w,
                          const float *x, int n_tok, float *y, void *scratch)
{
    const int64_t n = (int64_t)n_tok * w->ne0;
    memset(j, 0, sizeof *j);
    j->mode = mode;
    j->avx2 = avx2;
    j->w = w;
    j->n_tok = n_tok;
    j->y = y;
    j->x = x;
    if (mode == STRATA_XCPU_Q8) {
        int8_t *q = scratch;
        float *d = (float *)((char *)scratch + (((size_t)n + 15) & ~(size_t)15));
        int32_t *bs = (int32_t *)(d + n / QB);
        const int64_t g = w->type == STRATA_TYPE_Q6_K ? 16 : 32, per = w->ne0 / g;
        for (int t = 0; t < n_tok; t++) {
            const int8_t *qt = q + (int64_t)t * w->ne0;
            strata_xcpu_quantize_q8(x + (int64_t)t * w->ne0, w->ne0, q + (int64_t)t * w->ne0,
                                    d + (int64_t)t * (w->ne0 / QB));
            for (int64_t b = 0; b < per; b++) {
                int sm = 0;
                for (int64_t i = 0; i < g; i++)
                    sm += qt[b * g + i];
                bs[(int64_t)t * (w->ne0 / 16) + b] = sm;
            }
        }
        j->xq = q;
        j->xd = d;
        j->bs = bs;
        return (((size_t)n + 15) & ~(size_t)15) + 4 * (size_t)(n / QB) + 4 * (size_t)(n / 16);
    }
    if (mode == STRATA_XCPU_F16) {
        float *xh = scratch;
        for (int64_t i = 0; i < n; i++)
            xh[i] = strata_f16_to_f32(strata_f32_to_f16(x[i]));
        j->x = xh;
        return 4 * (size_t)n;
    }
    return 0;
}

static int use_avx2(int simd_level)
{
    if (simd_level < 0)
        simd_level = strata_quant_simd_level();
    return simd_level >= STRATA_SIMD_AVX2 && strata_xcpu_have_avx2();
}

size_t strata_xcpu_scratch_bytes(int64_t ne0, int n_tok)
{
    return 4 * (size_t)n_tok * (size_t)ne0 + 64;
}

int strata_xcpu_matmul(struct strata_pool *pool, int mode, const struct strata_mat *w,
                       const float *x, int n_tok, float *y, void *scratch,
                       struct strata_err *err)
{
    return strata_xcpu_matmul_simd(pool, mode, w, x, n_tok, y, scratch, -1, err);
}

int strata_xcpu_matmul_simd(struct strata_pool *pool, int mode, const struct strata_mat *w,
                            const float *x, int n_tok, float *y, void *scratch, int simd_level,
                            struct strata_err *err)
{
    int rc = check_mat(mode, w, err);
    if (rc || n_tok <= 0)
        return rc;
    struct mm_seg seg;
    seg_prepare(&seg, mode, use_avx2(simd_level), w, x, n_tok, y, scratch);
    struct mm_job j = {&seg, 1, w->ne1};
    strata_pool_run(pool, mm_worker, &j);
    return 0;
}

size_t strata_xcpu_ffn_work_bytes(int64_t n_embd, int64_t n_ff, int n_tok)
{
    int64_t m = n_embd > n_ff ? n_embd : n_ff;
    return 8 * (size_t)n_tok * (size_t)n_ff + 8 * (size_t)n_tok * (size_t)m +
           128 * ((size_t)n_tok + 1);
}

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

int strata_xcpu_ffn_batch(struct strata_pool *pool, const struct strata_xcpu_expert *ex,
                          int n_ex, int matvec, int q8, void *work, struct strata_err *err)
{
    struct mm_seg *seg = NULL;
    int rc = 0, T = 0;
    const int avx2 = use_avx2(-1);
    for (int i = 0; i < n_ex; i++) {
        const struct strata_mat *g = &ex[i].gate, *u = &ex[i].up, *d = &ex[i].down;
        if (u->ne0 != g->ne0 || u->ne1 != g->ne1 || d->ne0 != g->ne1 || d->ne1 != g->ne0)
            return strata_err_set(err, STRATA_E_INVALID,
                                  "CPU expert: ffn_gate [%lld, %lld], ffn_up [%lld, %lld] and "
                                  "ffn_down [%lld, %lld] do not chain",
                                  (long long)g->ne1, (long long)g->ne0, (long long)u->ne1,
                                  (long long)u->ne0, (long long)d->ne1, (long long)d->ne0);
        const int q = matvec && q8 && strata_xcpu_ffn_q8(g, d);
        if ((rc = check_mat(strata_xcpu_mode_for(g, matvec, q), g, err)) ||
            (rc = check_mat(strata_xcpu_mode_for(u, matvec, q), u, err)) ||
            (rc = check_mat(strata_xcpu_mode_for(d, matvec, q), d, err)))
            return rc;
        T += ex[i].n_tok > 0 ? ex[i].n_tok : 0;
    }
    if (!n_ex || !T)
        return 0;
    seg = malloc(sizeof *seg * 2 * (size_t)n_ex);
    if (!seg)
        return strata_err_set(err, STRATA_E_NOMEM, "out of memory");
    /* gate and up of every expert in one pool run; [T, n_ff] each, expert after expert */
    size_t gu_bytes = 0;
    for (int i = 0; i < n_ex; i++)
        gu_bytes += 4 * (size_t)(ex[i].n_tok > 0 ? ex[i].n_tok : 0) * (size_t)ex[i].gate.ne1;
    float *gbuf = work, *ubuf = (float *)((char *)work + ALIGN64(gu_bytes));
    char *scr = (char *)work + 2 * ALIGN64(gu_bytes);
    struct mm_job j = {seg, 0, 0};
    size_t off = 0;
    int64_t go = 0;
    for (int i = 0; i < n_ex; i++) {
        const int nt = ex[i].n_tok;
        if (nt <= 0)
            continue;
        const int q = matvec && q8 && strata_xcpu_ffn_q8(&ex[i].gate, &ex[i].down);
        off += ALIGN64(seg_prepare(&seg[j.n_seg], strata_xcpu_mode_for(&ex[i].gate, matvec, q),
                                   avx2, &ex[i].gate, ex[i].x, nt, gbuf + go, scr + off));
        j.rows += ex[i].gate.ne1;
        j.n_seg++;
        off += ALIGN64(seg_prepare(&seg[j.n_seg], strata_xcpu_mode_for(&ex[i].up, matvec, q),
                                   avx2, &ex[i].up, ex[i].x, nt, ubuf + go, scr + off));
        j.rows += ex[i].up.ne1;
        j.n_seg++;
        go += (int64_t)nt * ex[i].gate.ne1;
    }
    strata_pool_run(pool, mm_worker, &j);
    for (int64_t i = 0; i < go; i++)
        gbuf[i] = gbuf[i] / (1.0f + expf(-gbuf[i])) * ubuf[i];
    /* the down projections in a second run */
    j.n_seg = 0;
    j.rows = 0;
    off = 0;
    go = 0;
    for (int i = 0; i < n_ex; i++) {
        const int nt = ex[i].n_tok;
        if (nt <= 0)
            continue;
        const int q = matvec && q8 && strata_xcpu_ffn_q8(&ex[i].gate, &ex[i].down);
        off += ALIGN64(seg_prepare(&seg[j.n_seg], strata_xcpu_mode_for(&ex[i].down, matvec, q),
                                   avx2, &ex[i].down, gbuf + go, nt, ex[i].y, scr + off));
        j.rows += ex[i].down.ne1;
        j.n_seg++;
        go += (int64_t)nt * ex[i].gate.ne1;
    }
    strata_pool_run(pool, mm_worker, &j);
    free(seg);
    return 0;
}

int strata_xcpu_ffn(struct strata_pool *pool, const struct strata_mat *gate,
                    const struct strata_mat *up, const struct strata_mat *down, int matvec,
                    int q8, const float *x, int n_tok, float *y, void *work,
                    struct strata_err *err)
{
    struct strata_xcpu_expert e;
    e.gate = *gate;
    e.up = *up;
    e.down = *down;
    e.x = x;
    e.y = y;
    e.n_tok = n_tok;
    return strata_xcpu_ffn_batch(pool, &e, 1, matvec, q8, work, err);
}
