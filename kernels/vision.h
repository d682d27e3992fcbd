/* vision.h - the vision encoder on the GPU (kernels/vision.cu): the Qwen2-VL /
 * Qwen2.5-VL tower of lib/vision.h with its weights in VRAM.
 *
 * The first part is plain C: lib/vision.c (compiled with -DSTRATA_WITH_GPU) describes
 * the loaded model with host pointers and calls strata_vision_gpu_open / _encode.
 * The second part (C++ only) declares the launchers of the kernels the engine does not
 * have (norm with bias, bias + activation, gated MLP, 2-D rotary, non-causal windowed
 * attention, merge gather), for the encoder and the GPU tests.
 *
 * Shapes are written as in kernels.h, innermost dimension last in the C sense:
 * [rows][cols]; "ld" is the distance between rows in floats.
 */
#ifndef STRATA_KERNELS_VISION_H
#define STRATA_KERNELS_VISION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "err.h"

/* A linear layer as the GGUF stores it: ne1 rows of ne0 values of a GGUF type (any
 * type lib/quant.h decodes), rows nb1 bytes apart; bias [ne1] float32 or NULL. */
struct strata_vision_gpu_linear {
    uint32_t type;
    int64_t ne0, ne1;
    size_t nb1;
    const void *data;
    const float *bias;
};

struct strata_vision_gpu_block {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [n_embd]; a bias makes it LayerNorm */
    struct strata_vision_gpu_linear q, k, v, o;
    /* gate.data non-NULL: down(silu(gate x) * up x); else down(quick_gelu(up x)) */
    struct strata_vision_gpu_linear gate, up, down;
};

/* The encoder, host pointers borrowed for the duration of strata_vision_gpu_open. */
struct strata_vision_gpu_model {
    int n_embd, n_ff, n_head, n_layer, n_out, merge, kdim;
    float eps;
    const float *patch_w; /* [n_embd][kdim] float32 (both temporal halves) */
    const float *patch_b; /* [n_embd] or NULL */
    const struct strata_vision_gpu_block *blk; /* [n_layer] */
    const float *post_w, *post_b;              /* v.post_ln: [n_embd], bias optional */
    struct strata_vision_gpu_linear mm0, mm2;  /* merger: [merge^2 n_embd] -> n_out */
};

/* The patch layout of one image, made by lib/vision.c (the same for CPU and GPU):
 * row[i], col[i]: patch i's position on the grid (rotary angles); for window
 * attention, order[] lists the patches window by window, window w holding
 * order[win_start[w] .. win_start[w + 1]).  full[l] != 0: block l attends to the
 * whole image. */
struct strata_vision_gpu_layout {
    int n_patches, n_win;
    const int *row, *col;  /* [n_patches] */
    const int *order;      /* [n_patches] */
    const int *win_start;  /* [n_win + 1] */
    const unsigned char *full; /* [n_layer] */
};

struct strata_vision_gpu;

/* "cuda" or "hip": the runtime this build's kernels are for. */
const char *strata_vision_gpu_runtime(void);

/* Devices the runtime sees (0 when the runtime cannot start). */
int strata_vision_gpu_n_devices(void);

/* Upload the encoder's weights to device `device` (runtime index; -1 = 0), once:
 * every projection dequantised to f16 with its rows padded to a multiple of 64
 * (the mat-mat kernel's K step) with zeros.  Errors: STRATA_E_GPU (no device, runtime
 * failure: names the call and the device), STRATA_E_INVALID (device out of range, a
 * head dim the attention kernel cannot run), STRATA_E_UNSUPPORTED (no kernels for the
 * device's architecture in this build), STRATA_E_NOMEM (VRAM or host). */
int strata_vision_gpu_open(struct strata_vision_gpu **out, const struct strata_vision_gpu_model *m,
                           int device, struct strata_err *err);

/* Encode pixel [n_patches][kdim] (host) laid out as lay says into out [n_patches /
 * merge^2][n_out] (host, caller-allocated).  Scratch VRAM grows to the largest image
 * seen.  One call at a time per encoder.  Errors: STRATA_E_GPU (a launch or copy
 * failed: names the kernel, its grid and shapes, and the device), STRATA_E_NOMEM. */
int strata_vision_gpu_encode(struct strata_vision_gpu *g, const float *pixel,
                             const struct strata_vision_gpu_layout *lay, float *out,
                             struct strata_err *err);

/* One line naming the device, e.g. "cuda device 0 (NVIDIA H200, sm_90), 2.3 MiB". */
const char *strata_vision_gpu_describe(const struct strata_vision_gpu *g);

void strata_vision_gpu_free(struct strata_vision_gpu *g);

#ifdef __cplusplus
}

#include "kernels.h"

/* y[r][c] = norm(x[r]) * w[c] (+ b[c]) for r < n_rows, c < n: LayerNorm when b is
 * non-NULL (mean removed), RMSNorm otherwise.  x, y: row strides ld_x, ld_y. */
int strata_k_vision_norm(struct strata_gpu_ctx *ctx, const float *x, int64_t ld_x,
                         const float *w, const float *b, float *y, int64_t ld_y, int n,
                         int n_rows, float eps, struct strata_err *err);

enum { STRATA_K_ACT_NONE = 0, STRATA_K_ACT_GELU = 1, STRATA_K_ACT_QUICK_GELU = 2 };

/* y[r][c] = act(y[r][c] + (b ? b[c] : 0)) for r < n_rows, c < n (row stride ld).
 * GELU is the exact (erf) form; QuickGELU is x * sigmoid(1.702 x). */
int strata_k_vision_bias_act(struct strata_gpu_ctx *ctx, float *y, int64_t ld, const float *b,
                             int n, int n_rows, int act, struct strata_err *err);

/* g[r][c] = silu(g[r][c] + bg[c]) * (u[r][c] + bu[c]) (biases may be NULL), c < n. */
int strata_k_vision_glu(struct strata_gpu_ctx *ctx, float *g, const float *u, int64_t ld,
                        const float *bg, const float *bu, int n, int n_rows,
                        struct strata_err *err);

/* The 2-D rotary table: cs[t][i] = (cos, sin) of the angle of pair i < hd/2 of patch
 * t: the first hd/4 pairs turn with row[t], the next hd/4 with col[t], frequency
 * 10000^(-2 (i mod hd/4) / (hd/2)) (Qwen2-VL VisionRotaryEmbedding, dim hd/2).
 * row, col: [n] int32 device arrays.  hd a multiple of 4. */
int strata_k_vision_rope_table(struct strata_gpu_ctx *ctx, const int32_t *row, const int32_t *col,
                               int n, int hd, float2 *cs, struct strata_err *err);

/* Rotate pairs (i, i + hd/2) of every head of q and k (k may be NULL) [n][n_head * hd]
 * (row stride ld) by cs (strata_k_vision_rope_table). */
int strata_k_vision_rope(struct strata_gpu_ctx *ctx, float *q, float *k, int64_t ld,
                         const float2 *cs, int n, int n_head, int hd, struct strata_err *err);

/* Non-causal attention inside windows.  q, k, v, out: [n][n_head * hd] (row stride
 * ld).  With order == NULL every patch attends to all n; otherwise patch order[p]
 * attends to the patches order[win_start[w] .. win_start[w + 1]) of its window
 * w = pos_win[p].  out = softmax(scale q.K^T) V per head.  hd <= 128, a multiple of 4;
 * ld a multiple of 4. */
int strata_k_vision_attn(struct strata_gpu_ctx *ctx, const float *q, const float *k,
                         const float *v, float *out, int64_t ld, int n, int n_head, int hd,
                         const int32_t *order, const int32_t *win_start, const int32_t *pos_win,
                         float scale, struct strata_err *err);

/* y[t][j * n + c] = x[t * mm + j][c] for t < n_tok, j < mm, c < n: every mm
 * consecutive rows of x side by side (the patch merger's view). */
int strata_k_vision_merge(struct strata_gpu_ctx *ctx, const float *x, int64_t ld_x, int n,
                          int mm, int n_tok, float *y, int64_t ld_y, struct strata_err *err);
#endif

#endif
