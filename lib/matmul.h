/* matmul.h - quantised matrix-vector and matrix-matrix products on the CPU.
 *
 * A weight matrix is ne1 rows of ne0 elements in a GGUF block type (one row =
 * ne0 / blck_size blocks, rows nb1 bytes apart), as a 2-D GGUF tensor is
 * stored (ne[0] contiguous).  Activations and results are float32.
 */
#ifndef STRATA_MATMUL_H
#define STRATA_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "pool.h"

struct strata_mat {
    uint32_t type;    /* GGUF tensor type */
    int64_t ne0;      /* columns (contiguous, the K dim) */
    int64_t ne1;      /* rows */
    size_t nb1;       /* bytes per row (>= strata_ggml_row_size(type, ne0)) */
    const void *data; /* ne1 rows; not owned */
};

/* y[t*ne1 + r] = dot(W row r, x[t*ne0 ...]) for t < n_tok, r < ne1.
 * x: [n_tok, ne0] float32; y: [n_tok, ne1] float32 (caller-allocated).
 * Quantises the activations once per call (Q8_0 or Q8_K, as the weight type
 * pairs, see quant.h; F32/F16/BF16 weights dot against float32 activations)
 * and reuses each weight row for a tile of tokens.  The value of each (t, r)
 * is bitwise independent of n_tok and of the thread count (each dot has a
 * fixed reduction order) -- speculative decoding relies on it.
 * pool may be NULL (runs on the calling thread).
 * Errors: STRATA_E_UNSUPPORTED (type), STRATA_E_INVALID (ne0 not a multiple
 * of the block size, nb1 too small, n_tok < 0), STRATA_E_NOMEM. */
int strata_matmul(struct strata_pool *pool, const struct strata_mat *w, const float *x,
                  int64_t n_tok, float *y, struct strata_err *err);

/* As strata_matmul, for the rows [r0, r1) only: y keeps the full [n_tok, ne1]
 * layout and only those columns are written.  simd_level < 0 means
 * strata_quant_simd_level(); otherwise the kernels of that level (tests). */
int strata_matmul_rows(struct strata_pool *pool, const struct strata_mat *w, const float *x,
                       int64_t n_tok, float *y, int64_t r0, int64_t r1, int simd_level,
                       struct strata_err *err);

/* Same, with the activations already quantised by the caller (act: n_tok rows
 * of strata_quant_act_size(strata_quant_vec_dot_type(w->type), ne0) bytes,
 * act_stride bytes apart) -- lets several matrices that read the same input
 * (e.g. ffn_gate and ffn_up, or the experts of a layer) share one
 * quantisation.  No allocation. */
int strata_matmul_q(struct strata_pool *pool, const struct strata_mat *w, const void *act,
                    size_t act_stride, int64_t n_tok, float *y, int64_t r0, int64_t r1,
                    int simd_level, struct strata_err *err);

#endif
