/* matmul.c - threaded quantised matrix-vector / matrix-matrix products.
 *
 * The activations are quantised once per call (one row per token, in the
 * activation type the weight type pairs with), then the rows of W are cut
 * into chunks handed out to the pool's threads through an atomic counter.
 * Within a chunk each weight row is dotted with a tile of up to TILE_TOK
 * tokens at once, so a row is read from memory once per tile and stays in
 * L1 while the tile's activations (sized to stay in L2) stream past it.
 * Every (token, row) value is computed by one kernel call whose arithmetic
 * does not depend on the tile size, hence on n_tok or the thread count.
 */
#include "matmul.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_types.h"
#include "quant.h"

#define TILE_TOK 32
#define TILE_ACT_BYTES (192 * 1024)
#ifndef PF_ROWS
#define PF_ROWS 4
#endif

struct mm_job {
    strata_vec_dot_fn dot;
    const struct strata_mat *w;
    const char *act;
    size_t act_stride;
    int64_t n_tok, tile;
    float *y;
    int64_t r0, r1, chunk;
    size_t row_bytes;
    int64_t n_chunks;
    atomic_llong next;
};

static void mm_worker(void *vctx, int ith, int nth)
{
    struct mm_job *j = vctx;
    float out[TILE_TOK];
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->n_chunks)
            break;
        int64_t ra = j->r0 + c * j->chunk;
        int64_t rb = ra + j->chunk < j->r1 ? ra + j->chunk : j->r1;
        for (int64_t t0 = 0; t0 < j->n_tok; t0 += j->tile) {
            int nt = (int)(j->n_tok - t0 < j->tile ? j->n_tok - t0 : j->tile);
            const char *a = j->act + (size_t)t0 * j->act_stride;
            for (int64_t r = ra; r < rb; r++) {
                const char *wr = (const char *)j->w->data + (size_t)r * j->w->nb1;
                /* reading a row at a time leaves too few misses in flight
                 * for the core to reach the memory bandwidth: ask for the
                 * row PF_ROWS ahead (into L2) while this one is computed */
                if (PF_ROWS > 0 && nt == 1 && r + PF_ROWS < rb) {
                    const char *pf = wr + PF_ROWS * j->w->nb1;
                    for (size_t o = 0; o < j->row_bytes; o += 64)
                        __builtin_prefetch(pf + o, 0, 2);
                }
                j->dot(j->w->ne0, wr, a, j->act_stride, nt, out);
                for (int t = 0; t < nt; t++)
                    j->y[(t0 + t) * j->w->ne1 + r] = out[t];
            }
        }
    }
}

static int check_mat(const struct strata_mat *w, int64_t n_tok, int64_t r0, int64_t r1,
                     struct strata_err *err)
{
    const char *name = strata_ggml_type_name(w->type);
    if (!strata_quant_supported(w->type))
        return strata_err_set(err, STRATA_E_UNSUPPORTED, "matmul: weight type %s (%u) unsupported",
                              name ? name : "unknown", w->type);
    int64_t bs = strata_ggml_blck_size(w->type);
    if (w->ne0 <= 0 || w->ne0 % bs != 0)
        return strata_err_set(err, STRATA_E_INVALID,
                              "matmul: ne0 %lld of a %s matrix is not a multiple of %lld",
                              (long long)w->ne0, name, (long long)bs);
    if (w->ne1 < 0 || w->nb1 < strata_ggml_row_size(w->type, (uint64_t)w->ne0))
        return strata_err_set(err, STRATA_E_INVALID, "matmul: nb1 %zu too small for %lld %s",
                              w->nb1, (long long)w->ne0, name);
    if (n_tok < 0 || r0 < 0 || r1 > w->ne1 || r0 > r1)
        return strata_err_set(err, STRATA_E_INVALID,
                              "matmul: n_tok %lld, rows [%lld, %lld) of %lld", (long long)n_tok,
                              (long long)r0, (long long)r1, (long long)w->ne1);
    return STRATA_OK;
}

int strata_matmul_q(struct strata_pool *pool, const struct strata_mat *w, const void *act,
                    size_t act_stride, int64_t n_tok, float *y, int64_t r0, int64_t r1,
                    int simd_level, struct strata_err *err)
{
    int rc = check_mat(w, n_tok, r0, r1, err);
    if (rc)
        return rc;
    if (n_tok == 0 || r1 == r0)
        return STRATA_OK;
    if (simd_level < 0)
        simd_level = strata_quant_simd_level();
    struct mm_job job, *j = &job;
    memset(j, 0, sizeof(*j));
    j->dot = strata_quant_vec_dot_fn(w->type, simd_level);
    j->w = w;
    j->row_bytes = strata_ggml_row_size(w->type, (uint64_t)w->ne0);
    j->act = act;
    j->act_stride = act_stride;
    j->n_tok = n_tok;
    int64_t tile = act_stride ? TILE_ACT_BYTES / (int64_t)act_stride : TILE_TOK;
    j->tile = tile < 1 ? 1 : tile > TILE_TOK ? TILE_TOK : tile;
    j->y = y;
    j->r0 = r0;
    j->r1 = r1;
    int nth = strata_pool_n_threads(pool);
    int64_t rows = r1 - r0;
    int64_t chunk = rows / ((int64_t)nth * 4);
    chunk = chunk < 4 ? 4 : chunk > 64 ? 64 : chunk;
    j->chunk = chunk;
    j->n_chunks = (rows + chunk - 1) / chunk;
    atomic_init(&j->next, 0);
    strata_pool_run(nth > 1 && j->n_chunks > 1 ? pool : NULL, mm_worker, j);
    return STRATA_OK;
}

struct qa_job {
    uint32_t vt;
    const float *x;
    int64_t ne0, n_tok;
    char *act;
    size_t act_row;
};

static void qa_worker(void *vctx, int ith, int nth)
{
    struct qa_job *q = vctx;
    for (int64_t t = ith; t < q->n_tok; t += nth)
        strata_quant_quantize_act(q->vt, q->x + t * q->ne0, q->act + (size_t)t * q->act_row,
                                  q->ne0);
}

int strata_matmul_rows(struct strata_pool *pool, const struct strata_mat *w, const float *x,
                       int64_t n_tok, float *y, int64_t r0, int64_t r1, int simd_level,
                       struct strata_err *err)
{
    int rc = check_mat(w, n_tok, r0, r1, err);
    if (rc || n_tok == 0 || r0 == r1)
        return rc;
    uint32_t vt = strata_quant_vec_dot_type(w->type);
    if (vt == STRATA_TYPE_F32) /* float activations: use x in place */
        return strata_matmul_q(pool, w, x, (size_t)w->ne0 * 4, n_tok, y, r0, r1, simd_level,
                               err);
    size_t act_row = strata_quant_act_size(vt, w->ne0);
    /* decoding calls this hundreds of times per token: small activations
     * live on the stack */
    _Alignas(64) char small[16384];
    char *act = act_row * (size_t)n_tok <= sizeof(small) ? small
                                                        : malloc(act_row * (size_t)n_tok);
    if (!act)
        return strata_err_set(err, STRATA_E_NOMEM, "matmul: out of memory for %lld activations",
                              (long long)n_tok);
    struct qa_job q = {vt, x, w->ne0, n_tok, act, act_row};
    strata_pool_run(n_tok > 1 ? pool : NULL, qa_worker, &q);
    rc = strata_matmul_q(pool, w, act, act_row, n_tok, y, r0, r1, simd_level, err);
    if (act != small)
        free(act);
    return rc;
}

int strata_matmul(struct strata_pool *pool, const struct strata_mat *w, const float *x,
                  int64_t n_tok, float *y, struct strata_err *err)
{
    return strata_matmul_rows(pool, w, x, n_tok, y, 0, w->ne1, -1, err);
}
