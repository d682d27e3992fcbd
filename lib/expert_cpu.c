/* expert_cpu.c - routed experts on the CPU with the GPU backend's numerics
 * (expert_cpu.h).  Block layouts are those of the GGUF specification (ggml-common.h);
 * the 8-bit scheme is the one kernels/matvec_q8.cu runs. */
#include "expert_cpu.h"

#include <math.h>
#include <stdatomic.h>
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

static void quantize_scalar(const float *x, int64_t n, int8_t *q, float *d)
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

static int use_avx512(int simd_level)
{
    if (simd_level < 0)
        simd_level = strata_quant_simd_level();
    return simd_level >= STRATA_SIMD_AVX512 && strata_xcpu_have_avx512();
}

static int use_avx2(int simd_level)
{
    if (simd_level < 0)
        simd_level = strata_quant_simd_level();
    return simd_level >= STRATA_SIMD_AVX2 && strata_xcpu_have_avx2();
}

/* the SIMD level whose rows run: STRATA_SIMD_* capped by what this build has */
static int simd_for(int simd_level)
{
    return use_avx512(simd_level) ? STRATA_SIMD_AVX512
           : use_avx2(simd_level) ? STRATA_SIMD_AVX2
                                  : STRATA_SIMD_SCALAR;
}

/* n values (n % 32 == 0) to q8 quants, block scales and the quants' sums per g
 * values (16 or 32) */
static void quantize_sums(int simd, const float *x, int64_t n, int8_t *q, float *d,
                          int32_t *bsum, int g)
{
    if (simd >= STRATA_SIMD_AVX512) {
        strata_xcpu_quantize_q8_avx512(x, n, q, d, bsum, g);
        return;
    }
    if (simd >= STRATA_SIMD_AVX2) {
        strata_xcpu_quantize_q8_avx2(x, n, q, d, bsum, g);
        return;
    }
    quantize_scalar(x, n, q, d);
    for (int64_t b = 0; b < n / g; b++) {
        int sm = 0;
        for (int i = 0; i < g; i++)
            sm += q[b * g + i];
        bsum[b] = sm;
    }
}

void strata_xcpu_quantize_q8(const float *x, int64_t n, int8_t *q, float *d)
{
    quantize_scalar(x, n, q, d);
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

/* the SIMD rows' horizontal sum of eight lanes (expert_cpu_int.h) */
static float hsum8(const float *l)
{
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* One row of ne0 quantised weights times one q8 row (xq, xd; bsum: the quants' sums
 * per 32 values, per 16 for Q6_K): exact integer dot products per scale group, then
 * the float combination of the SIMD rows, lane by lane (expert_cpu_int.h). */
static float dot_q8_row(uint32_t type, const uint8_t *row, int64_t ne0, const int8_t *xq,
                        const float *xd, const int32_t *bsum)
{
    float acc[8] = {0};
    switch (type) {
    case STRATA_TYPE_Q8_0:
        for (int64_t b = 0; b < ne0 / 32; b++) {
            const uint8_t *blk = row + b * 34;
            const float s = f16_at(blk) * xd[b];
            for (int k = 0; k < 8; k++) {
                int dt = 0;
                for (int l = 4 * k; l < 4 * k + 4; l++)
                    dt += (int)(int8_t)blk[2 + l] * xq[b * 32 + l];
                acc[k] = fmaf((float)dt, s, acc[k]);
            }
        }
        break;
    case STRATA_TYPE_Q4_K:
    case STRATA_TYPE_Q5_K: {
        const int q5 = type == STRATA_TYPE_Q5_K, bs = q5 ? 176 : 144;
        for (int64_t sb = 0; sb < ne0 / 256; sb++) {
            const uint8_t *blk = row + sb * bs, *qs = blk + (q5 ? 48 : 16), *qh = blk + 16;
            const int8_t *x = xq + sb * 256;
            const float d = f16_at(blk), dmin = f16_at(blk + 2);
            for (int j = 0; j < 8; j++) {
                /* sub-block j: nibbles (j & 1) of bytes 32 (j / 2) .. + 31, high bit j of qh */
                const int g = j / 2, h = j & 1;
                int dot = 0, sc, mn;
                for (int l = 0; l < 32; l++) {
                    int v = (qs[32 * g + l] >> (4 * h)) & 0xF;
                    if (q5)
                        v |= ((qh[l] >> j) & 1) << 4;
                    dot += v * x[32 * j + l];
                }
                scale_min_k4(j, blk + 4, &sc, &mn);
                float t = d * ((float)sc * (float)dot) -
                          dmin * ((float)mn * (float)bsum[sb * 8 + j]);
                acc[j] = fmaf(xd[sb * 8 + j], t, acc[j]);
            }
        }
        break;
    }
    case STRATA_TYPE_Q6_K:
        for (int64_t sb = 0; sb < ne0 / 256; sb++) {
            const uint8_t *blk = row + sb * 210;
            const int8_t *x = xq + sb * 256;
            const float d = f16_at(blk + 208);
            for (int ip = 0; ip < 2; ip++) {
                const uint8_t *ql = blk + 64 * ip, *qh = blk + 128 + 32 * ip;
                const int8_t *sc = (const int8_t *)(blk + 192 + 8 * ip);
                for (int s = 0; s < 4; s++) {
                    /* values 128 ip + 32 s + l: one q8 block, two scale groups of 16 */
                    const uint8_t *lo = ql + 32 * (s & 1);
                    const int sh = 4 * (s >> 1);
                    const int8_t *xb = x + 128 * ip + 32 * s;
                    int d0 = 0, d1 = 0;
                    for (int l = 0; l < 32; l++) {
                        int w = (((lo[l] >> sh) & 0xF) | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
                        if (l < 16)
                            d0 += w * xb[l];
                        else
                            d1 += w * xb[l];
                    }
                    const int j = 4 * ip + s;
                    float t = xd[sb * 8 + j] * (float)(sc[2 * s] * d0 + sc[2 * s + 1] * d1);
                    acc[j] = fmaf(t, d, acc[j]);
                }
            }
        }
        break;
    default:
        break;
    }
    return hsum8(acc);
}

/* One matrix times n_tok prepared input rows. */
struct mm_seg {
    int mode, simd;
    const struct strata_mat *w;
    int n_tok;
    const float *x;    /* F32 / F16: [n_tok, ne0] (F16: already rounded) */
    const int8_t *xq;  /* Q8: [n_tok, ne0] */
    const float *xd;   /* Q8: [n_tok, ne0 / 32] */
    const int32_t *bs; /* Q8: [n_tok, ne0 / 16] quant sums per 32 (per 16: Q6_K) values */
    float *y;
};

/* row r of a float-path segment, every token */
static void seg_row_float(const struct mm_seg *j, int64_t r)
{
    const struct strata_mat *w = j->w;
    const int64_t ne0 = w->ne0, ne1 = w->ne1;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->nb1;
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

static void prefetch_row(const uint8_t *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64)
        __builtin_prefetch(p + o, 0, 2);
}

/* rows [r0, r1) of a segment, every token (a token's rows are taken together, so the
 * weights stay in the caches across the tokens of a verify window) */
static void seg_rows(const struct mm_seg *j, int64_t r0, int64_t r1)
{
    const struct strata_mat *w = j->w;
    const int64_t ne0 = w->ne0, ne1 = w->ne1;
    const uint8_t *base = (const uint8_t *)w->data;
    if (j->mode != STRATA_XCPU_Q8) {
        for (int64_t r = r0; r < r1; r++)
            seg_row_float(j, r);
        return;
    }
    for (int t = 0; t < j->n_tok; t++) {
        const int8_t *xq = j->xq + (int64_t)t * ne0;
        const float *xd = j->xd + (int64_t)t * (ne0 / QB);
        const int32_t *bs = j->bs + (int64_t)t * (ne0 / 16);
        float *y = j->y + (int64_t)t * ne1;
        if (j->simd >= STRATA_SIMD_AVX512) {
            strata_xcpu_rows_q8_avx512(w->type, base + (size_t)r0 * w->nb1, w->nb1, r1 - r0,
                                       ne0, xq, xd, bs, y + r0);
            continue;
        }
        /* rows about 4 KiB ahead into L2 while this one is computed, as the AVX-512
         * rows do (2 threads of AVX2 rows reading from memory: 12.4 GB/s without,
         * 12.9 with, 11.7 with only the next row) */
        const int64_t ahead = (int64_t)((4096 + w->nb1 - 1) / w->nb1);
        for (int64_t r = r0; r < r0 + ahead && r < r1; r++)
            prefetch_row(base + (size_t)r * w->nb1, w->nb1);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = base + (size_t)r * w->nb1;
            if (r + ahead < r1)
                prefetch_row(row + ahead * w->nb1, w->nb1);
            y[r] = j->simd >= STRATA_SIMD_AVX2
                       ? strata_xcpu_dot_q8_avx2(w->type, row, ne0, xq, xd, bs)
                       : dot_q8_row(w->type, row, ne0, xq, xd, bs);
        }
    }
}

/* Guided self-scheduling of rows [0, rows) among nth threads: a thread takes about
 * 1 / (2 nth) of the rows left, a multiple of 16 between 16 and max: long runs of rows
 * (read faster from memory) while plenty is left, short ones at the end, so the
 * threads finish together; a thread that starts late or runs slow holds up no more
 * than its last short chunk.  Returns the first row (*r1: the end), -1 when none is
 * left. */
static int64_t grab_rows(atomic_llong *next, int64_t rows, int nth, int64_t max, int64_t *r1)
{
    int64_t r0 = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (r0 >= rows)
            return -1;
        int64_t c = (rows - r0) / (2 * (int64_t)nth) / 16 * 16;
        c = c < 16 ? 16 : c > max ? max : c;
        if (atomic_compare_exchange_weak_explicit(next, &r0, r0 + c, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *r1 = r0 + c < rows ? r0 + c : rows;
            return r0;
        }
    }
}

/* A pool job over the rows of several segments at once (every down projection of a
 * layer's CPU experts in one run), rows handed out by grab_rows. */
struct mm_job {
    const struct mm_seg *seg;
    int n_seg;
    int64_t rows;
    atomic_llong next;
};

/* at most 64 rows a chunk: 40 KiB of 768 Q6_K weights, 72 KiB of 2,048 Q4_K ones */
#define MAX_ROWS 64

static void mm_worker(void *ctx, int ith, int nth)
{
    struct mm_job *j = ctx;
    int64_t r0, r1;
    (void)ith;
    while ((r0 = grab_rows(&j->next, j->rows, nth, MAX_ROWS, &r1)) >= 0) {
        int64_t base = 0;
        for (int i = 0; i < j->n_seg && base < r1; i++) {
            const int64_t ne1 = j->seg[i].w->ne1;
            const int64_t lo = r0 > base ? r0 : base, hi = r1 < base + ne1 ? r1 : base + ne1;
            if (lo < hi)
                seg_rows(&j->seg[i], lo - base, hi - base);
            base += ne1;
        }
    }
}

static void run_rows(struct strata_pool *pool, const struct mm_seg *seg, int n_seg)
{
    struct mm_job j = {seg, n_seg, 0, 0};
    for (int i = 0; i < n_seg; i++)
        j.rows += seg[i].w->ne1;
    atomic_init(&j.next, 0);
    strata_pool_run(pool, mm_worker, &j);
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

static size_t q8_bytes(int64_t n)
{
    return (((size_t)n + 15) & ~(size_t)15) + 4 * (size_t)(n / QB) + 4 * (size_t)(n / 16);
}

/* bs groups of a type: 16 values for Q6_K (its scale groups), else 32 */
static int bs_group(uint32_t type)
{
    return type == STRATA_TYPE_Q6_K ? 16 : 32;
}

/* Prepare segment j's inputs x [n_tok, w->ne0] in scratch (q8 rows, or f16-rounded
 * floats); returns the bytes of scratch used (strata_xcpu_scratch_bytes at most). */
static size_t seg_prepare(struct mm_seg *j, int mode, int simd, const struct strata_mat *w,
                          const float *x, int n_tok, float *y, void *scratch)
{
    const int64_t n = (int64_t)n_tok * w->ne0;
    memset(j, 0, sizeof *j);
    j->mode = mode;
    j->simd = simd;
    j->w = w;
    j->n_tok = n_tok;
    j->y = y;
    j->x = x;
    if (mode == STRATA_XCPU_Q8) {
        int8_t *q = scratch;
        float *d = (float *)((char *)scratch + (((size_t)n + 15) & ~(size_t)15));
        int32_t *bs = (int32_t *)(d + n / QB);
        for (int t = 0; t < n_tok; t++)
            quantize_sums(simd, x + (int64_t)t * w->ne0, w->ne0, q + (int64_t)t * w->ne0,
                          d + (int64_t)t * (w->ne0 / QB), bs + (int64_t)t * (w->ne0 / 16),
                          bs_group(w->type));
        j->xq = q;
        j->xd = d;
        j->bs = bs;
        return q8_bytes(n);
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
    seg_prepare(&seg, mode, simd_for(simd_level), w, x, n_tok, y, scratch);
    run_rows(pool, &seg, 1);
    return 0;
}

size_t strata_xcpu_ffn_work_bytes(int64_t n_embd, int64_t n_ff, int n_tok)
{
    int64_t m = n_embd > n_ff ? n_embd : n_ff;
    return 8 * (size_t)n_tok * (size_t)n_ff + 8 * (size_t)n_tok * (size_t)m +
           128 * ((size_t)n_tok + 1);
}

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

/* One expert of a batch in the gate/up run: its gate and up segments write g and u
 * [n_tok, n_ff]; each chunk of rows of n_ff then applies SwiGLU to its rows
 * (h = silu(g) * u, in place of g) and prepares them for the down projection: f16
 * rounding, or, for the 8-bit path, the q8 blocks of 32 rows, each quantised by
 * whichever chunk completes it (done[] counts its rows).  So the SwiGLU and
 * the down projection's input quantisation run on every thread, not between the two
 * pool runs on one. */
struct gu_expert {
    struct mm_seg gate, up;
    int64_t n_ff, row0;  /* its rows in the run's: row0 .. row0 + n_ff */
    int down_mode, down_g, simd;
    float *u;
    int8_t *hq;          /* Q8 down: [n_tok, n_ff] */
    float *hd;           /* [n_tok, n_ff / 32] */
    int32_t *hbs;        /* [n_tok, n_ff / 16] */
    atomic_int *done;    /* [n_ff / 32] */
};

struct gu_job {
    struct gu_expert *ex;
    int n_ex;
    int64_t rows; /* rows of n_ff of all experts */
    atomic_llong next;
};

static void gu_unit(struct gu_expert *e, int64_t r0, int64_t r1)
{
    const int64_t nf = e->n_ff;
    seg_rows(&e->gate, r0, r1);
    seg_rows(&e->up, r0, r1);
    for (int t = 0; t < e->gate.n_tok; t++) {
        float *h = e->gate.y + (int64_t)t * nf;
        const float *u = e->u + (int64_t)t * nf;
        for (int64_t r = r0; r < r1; r++) {
            float g = h[r];
            h[r] = g / (1.0f + expf(-g)) * u[r];
            if (e->down_mode == STRATA_XCPU_F16)
                h[r] = strata_f16_to_f32(strata_f32_to_f16(h[r]));
        }
    }
    if (e->down_mode != STRATA_XCPU_Q8)
        return;
    for (int64_t b = r0 / QB; b * QB < r1; b++) {
        const int64_t lo = b * QB > r0 ? b * QB : r0, hi = (b + 1) * QB < r1 ? (b + 1) * QB : r1;
        const int n = (int)(hi - lo);
        /* acq_rel: the other half's h rows are visible to the one that quantises */
        if (atomic_fetch_add_explicit(&e->done[b], n, memory_order_acq_rel) + n != QB)
            continue;
        for (int t = 0; t < e->gate.n_tok; t++)
            quantize_sums(e->simd, e->gate.y + (int64_t)t * nf + b * QB, QB,
                          e->hq + (int64_t)t * nf + b * QB, e->hd + (int64_t)t * (nf / QB) + b,
                          e->hbs + (int64_t)t * (nf / 16) + (e->down_g == 16 ? 2 * b : b),
                          e->down_g);
    }
}

/* Rows of n_ff of every expert at most 64 a chunk (gate and up: 128 weight rows, 144
 * KiB of 2,048 Q4_K weights): longer runs of rows read memory faster (a 1-token
 * expert on the dev machine's 2 threads, from memory: 22 GB/s in chunks of 16, 25 in
 * chunks of 32). */
static void gu_worker(void *ctx, int ith, int nth)
{
    struct gu_job *j = ctx;
    int64_t r0, r1;
    int i = 0;
    (void)ith;
    while ((r0 = grab_rows(&j->next, j->rows, nth, MAX_ROWS, &r1)) >= 0) {
        /* a thread's chunks come in increasing order: the expert only moves forward */
        while (i + 1 < j->n_ex && j->ex[i + 1].row0 <= r0)
            i++;
        for (int k = i; k < j->n_ex && j->ex[k].row0 < r1; k++) {
            struct gu_expert *e = &j->ex[k];
            const int64_t lo = r0 > e->row0 ? r0 - e->row0 : 0;
            const int64_t hi = r1 < e->row0 + e->n_ff ? r1 - e->row0 : e->n_ff;
            if (lo < hi)
                gu_unit(e, lo, hi);
        }
    }
}

/* An earlier expert's gate segment whose q8 input is that of x [n_tok, g->ne0] for g
 * (the same values, bit for bit, and bs groups): in a decode step every expert of the
 * token has a copy of the same row. */
static const struct mm_seg *same_q8_input(const struct gu_expert *ge, int n,
                                          const struct strata_mat *g, const float *x, int n_tok)
{
    for (int k = n - 1; k >= 0; k--) {
        const struct mm_seg *s = &ge[k].gate;
        if (s->mode == STRATA_XCPU_Q8 && s->n_tok == n_tok && s->w->ne0 == g->ne0 &&
            bs_group(s->w->type) == bs_group(g->type) &&
            (s->x == x || !memcmp(s->x, x, sizeof(float) * (size_t)n_tok * (size_t)g->ne0)))
            return s;
    }
    return NULL;
}

int strata_xcpu_ffn_batch(struct strata_pool *pool, const struct strata_xcpu_expert *ex,
                          int n_ex, int matvec, int q8, void *work, struct strata_err *err)
{
    struct gu_expert *ge = NULL;
    struct mm_seg *dseg = NULL;
    atomic_int *done = NULL;
    int rc = 0, T = 0, n_act = 0;
    int64_t n_blocks = 0;
    const int simd = simd_for(-1);
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
        if (ex[i].n_tok > 0) {
            T += ex[i].n_tok;
            n_act++;
            n_blocks += g->ne1 / QB;
        }
    }
    if (!n_ex || !T)
        return 0;
    ge = malloc(sizeof *ge * (size_t)n_act);
    dseg = malloc(sizeof *dseg * (size_t)n_act);
    done = malloc(sizeof *done * (size_t)(n_blocks + 1));
    if (!ge || !dseg || !done) {
        rc = strata_err_set(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t b = 0; b < n_blocks; b++)
        atomic_init(&done[b], 0);
    /* work: g and u [T, n_ff] (expert after expert), then each expert's prepared
     * inputs (one q8 or f16 copy of x for gate and up where they take the same one,
     * and the down projection's q8 input) */
    size_t gu_bytes = 0;
    for (int i = 0; i < n_ex; i++)
        gu_bytes += 4 * (size_t)(ex[i].n_tok > 0 ? ex[i].n_tok : 0) * (size_t)ex[i].gate.ne1;
    float *gbuf = work, *ubuf = (float *)((char *)work + ALIGN64(gu_bytes));
    char *scr = (char *)work + 2 * ALIGN64(gu_bytes);
    struct gu_job j = {ge, 0, 0, 0};
    size_t off = 0;
    int64_t go = 0, bo = 0;
    for (int i = 0; i < n_ex; i++) {
        const int nt = ex[i].n_tok;
        if (nt <= 0)
            continue;
        const struct strata_mat *g = &ex[i].gate, *u = &ex[i].up, *d = &ex[i].down;
        const int q = matvec && q8 && strata_xcpu_ffn_q8(g, d);
        const int mode = strata_xcpu_mode_for(g, matvec, q);
        struct gu_expert *e = &ge[j.n_ex++];
        memset(e, 0, sizeof *e);
        const struct mm_seg *same = mode == STRATA_XCPU_Q8 ? same_q8_input(ge, j.n_ex - 1, g,
                                                                             ex[i].x, nt)
                                                          : NULL;
        if (same) {
            e->gate = *same; /* x quantised once per token, not once per expert */
            e->gate.w = g;
            e->gate.y = gbuf + go;
        } else {
            off += ALIGN64(seg_prepare(&e->gate, mode, simd, g, ex[i].x, nt, gbuf + go,
                                       scr + off));
        }
        if (mode != STRATA_XCPU_Q8 || bs_group(g->type) == bs_group(u->type)) {
            e->up = e->gate; /* the same prepared x */
            e->up.w = u;
            e->up.y = ubuf + go;
        } else {
            off += ALIGN64(seg_prepare(&e->up, mode, simd, u, ex[i].x, nt, ubuf + go, scr + off));
        }
        e->n_ff = g->ne1;
        e->row0 = j.rows;
        j.rows += g->ne1;
        e->down_mode = strata_xcpu_mode_for(d, matvec, q);
        e->down_g = bs_group(d->type);
        e->simd = simd;
        e->u = ubuf + go;
        e->done = done + bo;
        bo += g->ne1 / QB;
        /* the down projection reads h (in g's place) as the gate/up run prepares it */
        struct mm_seg *ds = &dseg[j.n_ex - 1];
        memset(ds, 0, sizeof *ds);
        ds->mode = e->down_mode;
        ds->simd = simd;
        ds->w = d;
        ds->n_tok = nt;
        ds->x = gbuf + go;
        ds->y = ex[i].y;
        if (ds->mode == STRATA_XCPU_Q8) {
            const int64_t n = (int64_t)nt * g->ne1;
            e->hq = (int8_t *)(scr + off);
            e->hd = (float *)(scr + off + (((size_t)n + 15) & ~(size_t)15));
            e->hbs = (int32_t *)(e->hd + n / QB);
            ds->xq = e->hq;
            ds->xd = e->hd;
            ds->bs = e->hbs;
            off += ALIGN64(q8_bytes(n));
        }
        go += (int64_t)nt * g->ne1;
    }
    atomic_init(&j.next, 0);
    strata_pool_run(pool, gu_worker, &j);
    run_rows(pool, dseg, n_act);
out:
    free(ge);
    free(dseg);
    free(done);
    return rc;
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
