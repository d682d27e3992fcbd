/* kernels.h - launchers of the GPU kernels (kernels/NAME.cu), callable from the backend
 * and the kernel tests.  C++ (compiled by nvcc or hipcc); only kernels/gpu.h knows
 * which runtime it is.
 *
 * Every launcher checks its shapes, computes the grid, launches on ctx->stream and
 * checks the launch.  It returns 0 or STRATA_E_INVALID / STRATA_E_UNSUPPORTED /
 * STRATA_E_GPU with a message in err naming the kernel, its grid and shapes, the
 * device and the runtime's message.  With ctx->sync_debug set (STRATA_SYNC_DEBUG=1)
 * each launch is followed by a stream synchronisation so that an asynchronous fault
 * is reported by the launch that caused it.  Launchers never synchronise otherwise,
 * so a sequence of them can be captured into a graph.
 *
 * Tensor shapes are written ggml-style, innermost (contiguous) dimension first:
 * a weight matrix [ne0 = n_in, ne1 = n_out] has ne1 rows of ne0 values each.
 */
#ifndef STRATA_KERNELS_KERNELS_H
#define STRATA_KERNELS_KERNELS_H

#include "gpu.h"

extern "C" {
#include "err.h"
}

struct strata_gpu_ctx {
    cudaStream_t stream;
    struct strata_gpu_info info;
    int sync_debug; /* synchronise after every launch */
};

/* Fill info for device dev (runtime index after *_VISIBLE_DEVICES masking). */
int strata_gpu_info_query(int dev, struct strata_gpu_info *info, struct strata_err *err);

/* Check the launch just made: returns 0, or STRATA_E_GPU with a message naming the
 * kernel, its grid, block and shapes (a printf-style description), the device and
 * the runtime's error.  Synchronises first when ctx->sync_debug is set. */
int strata_k_check(struct strata_gpu_ctx *ctx, const char *kernel, dim3 grid, dim3 block,
                   struct strata_err *err, const char *shapes_fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Set err (may be NULL) and return code; printf-style message. */
int strata_k_err(struct strata_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 1 if the kernels decode weights of this GGUF type (enum strata_ggml_type). */
int strata_k_type_supported(uint32_t type);
/* Values per block and bytes per block of a type the kernels decode; 0 otherwise. */
int strata_k_blck(uint32_t type);
int strata_k_block_bytes(uint32_t type);

/* A weight tensor in device memory: ne1 rows of ne0 values of a GGUF type, rows nb1
 * bytes apart; a stack of matrices (experts) nb2 bytes apart. */
struct strata_k_weight {
    uint32_t type;
    int64_t ne0, ne1;
    size_t nb1, nb2;
    const void *data;
};

/* Batched dequantising matrix-vector products, decode-sized batches.
 *
 * For slot s < n_slot, with e = ids ? ids[s] : 0 (expert e of the stack) and
 * xs = x + (s / x_group) * x_stride (so x_group slots share one input row):
 *   glu == 0:  y[s * y_stride + r] = (add ? add[s * y_stride + r] : 0) + dot(W_e row r, xs)
 *   glu == 1:  y[s * y_stride + r] = silu(dot(W_e row r, xs)) * dot(U_e row r, xs)
 * for r < ne1; W = w (the gate in GLU mode), U = up (same type and shape; NULL unless
 * glu).  x, y, add are float32 device pointers; add may equal y.  The sum for each
 * output has a fixed order that depends only on ne0 and the device's warp size, not
 * on n_slot or the position of the slot: a one-token product and a windowed product
 * give bitwise equal results for the same row and input. */
struct strata_k_mv_args {
    const struct strata_k_weight *w, *up;
    int glu;
    const int32_t *ids;
    int n_slot, x_group;
    const float *x;
    int64_t x_stride;
    float *y;
    int64_t y_stride;
    const float *add;
};
int strata_k_matvec(struct strata_gpu_ctx *ctx, const struct strata_k_mv_args *a,
                    struct strata_err *err);

/* Dequantise rows of w: dst[i * ne0 + k] = W row rows[i], value k, as float32
 * (rows: n_rows int32 device indices; NULL means rows 0..n_rows-1).  Used for the
 * token embedding lookup and by the tests. */
int strata_k_get_rows(struct strata_gpu_ctx *ctx, const struct strata_k_weight *w,
                      const int32_t *rows, int n_rows, float *dst, struct strata_err *err);

/* Dequantise all of w (expert e, all rows) to half precision: dst[r * ne0 + k]. */
int strata_k_dequant_f16(struct strata_gpu_ctx *ctx, const struct strata_k_weight *w,
                         int expert, __half *dst, struct strata_err *err);

#endif
