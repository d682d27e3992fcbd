/* vision.h - the vision encoder of Qwen2-VL / Qwen2.5-VL projector GGUFs
 * (mmproj-*.gguf, general.architecture = clip), on the CPU or, in a GPU build,
 * on the device (strata_vision_set_backend; kernels/vision.cu).
 *
 * Model (Hugging Face Qwen2_5_VisionTransformerPretrainedModel and
 * Qwen2VisionTransformerPretrainedModel): a 3-D convolution patch embedding
 * over 2 frames of patch x patch pixels (stored as two temporal halves,
 * v.patch_embd.weight and v.patch_embd.weight.1), 2-D rotary positions (the
 * first half of each head's rotary frequencies follows the patch row, the
 * second the column), n_layer blocks of pre-norm attention and MLP, then the
 * patch merger: a norm (v.post_ln), every merge x merge patches concatenated,
 * Linear (mm.0), GELU, Linear (mm.2).
 *   qwen2.5vl: RMSNorm, SiLU-gated MLP, window attention (windows of
 *              clip.vision.window_size pixels, default 112) except every
 *              clip.vision.n_wa_pattern-th block, which attends to the
 *              whole image;
 *   qwen2vl:   LayerNorm, fc1 / QuickGELU / fc2 MLP, full attention.
 * Hyper-parameters come from the clip.vision.* keys.
 *
 * Output: one row of projection_dim floats per image token, in the order
 * Hugging Face returns them (merge blocks row-major), ready to be spliced
 * into the language model's input at the image placeholder tokens.
 */
#ifndef STRATA_VISION_H
#define STRATA_VISION_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"
#include "gguf.h"
#include "image.h"
#include "pool.h"

enum strata_vision_projector {
    STRATA_VISION_QWEN2VL = 1,
    STRATA_VISION_QWEN25VL,
};

struct strata_vision_hparams {
    int projector;         /* enum strata_vision_projector */
    int patch_size;        /* clip.vision.patch_size */
    int n_embd;            /* clip.vision.embedding_length */
    int n_ff;              /* clip.vision.feed_forward_length */
    int n_layer;           /* clip.vision.block_count */
    int n_head;            /* clip.vision.attention.head_count */
    float eps;             /* clip.vision.attention.layer_norm_epsilon */
    int n_out;             /* clip.vision.projection_dim: the language model's n_embd */
    int merge;             /* clip.vision.spatial_merge_size, default 2 */
    int temporal;          /* frames per patch, 2 */
    int n_wa_pattern;      /* clip.vision.n_wa_pattern (qwen2.5vl), 0 = all full */
    int window_size;       /* pixels, clip.vision.window_size, default 112 */
    float mean[3], std[3]; /* clip.vision.image_mean / image_std */
};

struct strata_vision;

/* Load the encoder from an open mmproj GGUF (g must outlive the encoder).
 * Errors: STRATA_E_UNSUPPORTED (another projector type: the message names
 * it), STRATA_E_NOTFOUND (a key or tensor is missing: named),
 * STRATA_E_FORMAT (a tensor has the wrong shape or type: named),
 * STRATA_E_NOMEM. */
int strata_vision_load(struct strata_vision **out, const struct strata_gguf *g,
                       struct strata_err *err);
void strata_vision_free(struct strata_vision *v);
const struct strata_vision_hparams *strata_vision_hparams(const struct strata_vision *v);

/* Choose where strata_vision_encode runs:
 *   "cpu"          the CPU (the default after strata_vision_load);
 *   "auto"         the GPU when this build has one and its runtime sees a device
 *                  (an info line says when it falls back to the CPU);
 *   "cuda", "hip"  the GPU of a build for that runtime ("gpu": whichever it is).
 * device: GPU ordinal after CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES masking, -1 = 0.
 * A GPU backend uploads the weights once (kernels/vision.h); encoding then runs one
 * image at a time on the device (callers serialise calls, as strata_embed_serve does).
 * Errors: STRATA_E_UNSUPPORTED (a backend this build does not have, or an unknown
 * name: the message names it and the build to use), STRATA_E_GPU (no device, runtime
 * failure), STRATA_E_INVALID (device out of range), STRATA_E_NOMEM.  On error the
 * encoder runs on the CPU. */
int strata_vision_set_backend(struct strata_vision *v, const char *name, int device,
                              struct strata_err *err);

/* "cpu", "cuda" or "hip": where strata_vision_encode runs now. */
const char *strata_vision_backend(const struct strata_vision *v);

/* Encode patches (strata_image_patches output for this model's patch,
 * merge, temporal, mean and std): pixel [n_patches][3 * temporal * patch^2]
 * on a grid_h x grid_w patch grid (both multiples of merge).
 * *out: malloc'ed [n_tokens][n_out], n_tokens = n_patches / merge^2, owned
 * by the caller.  pool may be NULL (it is not used on a GPU backend).
 * Errors: STRATA_E_INVALID (grid), STRATA_E_NOMEM, STRATA_E_GPU (GPU backend:
 * names the kernel, its shapes, the block and the device). */
int strata_vision_encode(struct strata_vision *v, struct strata_pool *pool, const float *pixel,
                         int grid_h, int grid_w, float **out, int *n_tokens,
                         struct strata_err *err);

/* Decode, resize within [min_pixels, max_pixels] (smart_resize with factor
 * patch * merge) and encode one image.  grid_h/grid_w (may be NULL) receive
 * the token grid (after the merge).  Errors as strata_image_load and
 * strata_vision_encode. */
int strata_vision_encode_image(struct strata_vision *v, struct strata_pool *pool,
                               const struct strata_image *img, int64_t min_pixels,
                               int64_t max_pixels, float **out, int *n_tokens, int *grid_h,
                               int *grid_w, struct strata_err *err);

/* The embedding payload (strata-embed(1), PAYLOAD): a 40-byte
 * little-endian header
 *   0  char[8]  magic "STRATAEB"
 *   8  u32      version (1)
 *   12 u32      n_tokens
 *   16 u32      n_embd
 *   20 u32      grid_t (1 for an image)
 *   24 u32      grid_h (tokens, after the merge)
 *   28 u32      grid_w
 *   32 u32      flags (0)
 *   36 u32      reserved (0)
 * followed by n_tokens rows of n_embd float32, row-major. */
#define STRATA_EMBD_MAGIC "STRATAEB"
#define STRATA_EMBD_HEADER_SIZE 40

struct strata_embd_header {
    uint32_t version, n_tokens, n_embd, grid_t, grid_h, grid_w, flags;
};

/* Write header and rows to f.  Errors: STRATA_E_IO. */
int strata_embd_write(FILE *f, const struct strata_embd_header *h, const float *rows,
                      struct strata_err *err);
/* Read a payload from f (a file or a pipe).  *rows malloc'ed, caller frees.
 * Errors: STRATA_E_FORMAT (bad magic/version, truncated: says which),
 * STRATA_E_LIMIT (more than 2^20 tokens or 2^16 dims), STRATA_E_NOMEM. */
int strata_embd_read(FILE *f, const char *name, struct strata_embd_header *h, float **rows,
                     struct strata_err *err);

#endif
