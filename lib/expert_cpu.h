/* expert_cpu.h - routed experts computed on the CPU with the GPU backend's numerics.
 *
 * When the GPU backend's expert cache sends a missed expert to the CPU worker pool,
 * the result must be the one the GPU kernels would have given for the same batch, so
 * that where an expert runs does not change the logits.  The GPU multiplies in one of
 * three ways, and so does this module:
 *
 *   Q8  - mat-vec batches (decode, short verify windows) of Q4_K, Q5_K, Q6_K and Q8_0
 *         weights (kernels/matvec_q8.cu, the scheme of llama.cpp's MMVQ): the input
 *         row is quantised to int8 in blocks of 32 values (d = amax / 127, q =
 *         round-half-even(x / d)), each weight scale group is an exact integer dot
 *         product against those quants, scaled in float; the SwiGLU output is
 *         quantised the same way before the down projection.
 *   F32 - mat-vec batches of the other types (kernels/matvec.cu): float inputs times
 *         float-dequantised weights, float sums.
 *   F16 - mat-mat batches (prefill chunks, kernels/matmul.cu): inputs and dequantised
 *         weights rounded to f16, products summed in float (the matrix units' f16 x
 *         f16 -> f32).
 *
 * Only the summation order differs from the GPU (float rounding, ~1e-6 relative).
 */
#ifndef STRATA_EXPERT_CPU_H
#define STRATA_EXPERT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "matmul.h"

struct strata_pool;

enum strata_xcpu_mode {
    STRATA_XCPU_Q8 = 0,
    STRATA_XCPU_F32 = 1,
    STRATA_XCPU_F16 = 2,
};

/* 1 for the weight types the GPU multiplies on 8-bit activations (Q4_K, Q5_K, Q6_K,
 * Q8_0), else 0. */
int strata_xcpu_q8_supported(uint32_t type);

/* The mode the GPU backend uses for one matrix w of an expert in a batch: matvec = 1
 * for a mat-vec batch (at most the backend's mat-vec token count), q8 = 1 when the
 * backend runs 8-bit activations (its default) and the whole FFN qualifies (both
 * matrices of a supported type, gate rows a multiple of 32 equal to the down
 * matrix's columns: strata_xcpu_ffn_q8).  Mat-mat batches use F16 when ne0 % 64 == 0
 * (the tile width), else F32. */
int strata_xcpu_mode_for(const struct strata_mat *w, int matvec, int q8);
/* 1 if the expert FFN (gate, up: [n_ff, n_embd]; down: [n_embd, n_ff]) can take the
 * 8-bit path of a mat-vec batch. */
int strata_xcpu_ffn_q8(const struct strata_mat *gate, const struct strata_mat *down);

/* Quantise n floats (n % 32 == 0) to int8 q[n] and block scales d[n / 32]. */
void strata_xcpu_quantize_q8(const float *x, int64_t n, int8_t *q, float *d);

/* y[t * ne1 + r] = row r of w times input row t, t < n_tok, in the given mode (Q8:
 * x is quantised first).  x: [n_tok, w->ne0] float32; y: [n_tok, w->ne1].  Rows are
 * split over the pool (NULL: inline).  scratch: strata_xcpu_scratch_bytes(w->ne0,
 * n_tok) bytes, 16-byte aligned.  Errors: STRATA_E_UNSUPPORTED (a type without a
 * decoder, or Q8 with a type strata_xcpu_q8_supported refuses: names it),
 * STRATA_E_INVALID (ne0 not a multiple of the block size or, for Q8, of 32). */
int strata_xcpu_matmul(struct strata_pool *pool, int mode, const struct strata_mat *w,
                       const float *x, int n_tok, float *y, void *scratch,
                       struct strata_err *err);
/* The same with the rows of one SIMD level (enum strata_simd of quant.h; the 8-bit
 * path has scalar, AVX2 and AVX-512 VNNI rows, each giving the scalar rows' bits;
 * < 0: strata_quant_simd_level(), which $STRATA_SIMD caps), for tests. */
int strata_xcpu_matmul_simd(struct strata_pool *pool, int mode, const struct strata_mat *w,
                            const float *x, int n_tok, float *y, void *scratch, int simd_level,
                            struct strata_err *err);
size_t strata_xcpu_scratch_bytes(int64_t ne0, int n_tok);

/* One routed expert's FFN for n_tok input rows: y = down(silu(gate x) * (up x)), the
 * modes chosen per matrix as strata_xcpu_mode_for (matvec, q8 as there; in Q8 the
 * SwiGLU output is quantised before the down projection, as the GPU's fused kernel
 * writes it).  x: [n_tok, n_embd]; y: [n_tok, n_embd]; work:
 * strata_xcpu_ffn_work_bytes(n_embd, n_ff, n_tok) bytes.  Errors: those of
 * strata_xcpu_matmul, STRATA_E_INVALID (shapes that do not chain: names them). */
int strata_xcpu_ffn(struct strata_pool *pool, const struct strata_mat *gate,
                    const struct strata_mat *up, const struct strata_mat *down, int matvec,
                    int q8, const float *x, int n_tok, float *y, void *work,
                    struct strata_err *err);
size_t strata_xcpu_ffn_work_bytes(int64_t n_embd, int64_t n_ff, int n_tok);

/* Several experts' FFNs in two pool runs (gate and up of all, with the SwiGLU and the
 * down projection's input quantisation on the same threads; then every down
 * projection), threads taking chunks of rows as they go: expert i maps its n_tok rows
 * x to y, as strata_xcpu_ffn, bit for bit.  work:
 * strata_xcpu_ffn_work_bytes(n_embd, n_ff, total n_tok) for the largest n_embd and n_ff.
 * Errors: as strata_xcpu_ffn (nothing computed), STRATA_E_NOMEM. */
struct strata_xcpu_expert {
    struct strata_mat gate, up, down;
    const float *x; /* [n_tok, n_embd] */
    float *y;       /* [n_tok, n_embd] */
    int n_tok;
};
int strata_xcpu_ffn_batch(struct strata_pool *pool, const struct strata_xcpu_expert *ex,
                          int n_ex, int matvec, int q8, void *work, struct strata_err *err);

#endif
