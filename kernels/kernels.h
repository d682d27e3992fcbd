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
    int pdl;        /* launch the decode kernels as programmatic dependent launches */
    int prio;       /* != 0: strata_k_launch gives its kernels this priority (CUDA; a
                       captured node keeps it, see cudaGraphInstantiateFlagUseNodePriority) */
};

#ifdef STRATA_GPU_CUDA
/* A launch configuration on ctx's stream with one launch attribute at (the caller's). */
static inline cudaLaunchConfig_t strata_k_cfg(const struct strata_gpu_ctx *ctx, dim3 grid,
                                              dim3 block, size_t smem, cudaLaunchAttribute *at)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cfg;
}
#endif

#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
/* Timeline builds (gpu.h): the host's launches in order (kernel, grid, block), for
 * naming the device's records; strata_tl_open allocates the device buffer and points
 * every translation unit's copy at it (STRATA_TIMELINE_FILE, default timeline.csv, is
 * where strata_tl_close writes both lists).  Both are no-ops after a failure. */
extern "C" void strata_tl_host_launch(const void *k, dim3 grid, dim3 block);
extern "C" void strata_tl_open(void);
extern "C" void strata_tl_close(void);
/* A host-side mark of a one-token forward call: 0 on entry, then 1, 2, ... in order;
 * the time between consecutive marks (and from the last to the next call's 0) is summed
 * and written out by strata_tl_close. */
extern "C" void strata_tl_host_mark(int i);
#endif

/* Launch k on ctx->stream with smem bytes of dynamic shared memory.  With ctx->pdl
 * (CUDA, sm_90+) as a programmatic dependent launch: k may be scheduled while the
 * previous kernel finishes (hiding the launch latency of a chain of small decode
 * kernels), so k must call strata_pdl_wait() before its first access to memory the
 * kernels before it write.  The launch is checked by strata_k_check. */
template <typename... P, typename... A>
static inline void strata_k_launch_smem(const struct strata_gpu_ctx *ctx, void (*k)(P...),
                                        dim3 grid, dim3 block, size_t smem, A... args)
{
#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
    strata_tl_host_launch((const void *)k, grid, block);
#endif
#ifdef STRATA_GPU_CUDA
    if (ctx->pdl) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = strata_k_cfg(ctx, grid, block, smem, at);
        (void)cudaLaunchKernelEx(&cfg, k, args...);
        return;
    }
    if (ctx->prio) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributePriority;
        at[0].val.priority = ctx->prio;
        cudaLaunchConfig_t cfg = strata_k_cfg(ctx, grid, block, smem, at);
        (void)cudaLaunchKernelEx(&cfg, k, args...);
        return;
    }
#endif
    k<<<grid, block, smem, ctx->stream>>>(args...);
}

/* strata_k_launch_smem without dynamic shared memory. */
template <typename... P, typename... A>
static inline void strata_k_launch(const struct strata_gpu_ctx *ctx, void (*k)(P...), dim3 grid,
                                   dim3 block, A... args)
{
    strata_k_launch_smem(ctx, k, grid, block, 0, args...);
}

/* Launch kernel k (a __global__ function's address) with its arguments' addresses in
 * args as a cooperative launch: every block of the grid is resident at once, or the
 * launch fails (what a grid-wide barrier needs).  Returns the runtime's error. */
static inline cudaError_t strata_k_launch_coop(const struct strata_gpu_ctx *ctx, const void *k,
                                               dim3 grid, dim3 block, void **args,
                                               size_t smem)
{
#ifdef STRATA_GPU_CUDA
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = strata_k_cfg(ctx, grid, block, smem, at);
    return cudaLaunchKernelExC(&cfg, k, args);
#else
    return hipLaunchCooperativeKernel(k, grid, block, args, (unsigned)smem, ctx->stream);
#endif
}

/* Fill info for device dev (runtime index after *_VISIBLE_DEVICES masking). */
int strata_gpu_info_query(int dev, struct strata_gpu_info *info, struct strata_err *err);

/* 0 if this build holds kernels the device can run (its own SASS / code object, or
 * PTX the driver compiles); else STRATA_E_UNSUPPORTED naming the device's architecture
 * and the build variable to set. */
int strata_gpu_check_image(const struct strata_gpu_info *info, struct strata_err *err);

/* 1 if the environment variable name is set to something other than "0" (a switch such
 * as STRATA_NO_MVQ_STREAM=1). */
int strata_k_env_on(const char *name);

/* strata_k_env_on(name) read once: *cache, a static int of the caller's that starts at
 * -1, keeps the answer for the process (a kernel launcher's switch). */
int strata_k_switch_off(const char *name, int *cache);

/* Defines static int fn(void): 1 unless the environment sets name (a switch such as
 * STRATA_NO_MVQ_BULK=1), read once (strata_k_switch_off). */
#define STRATA_K_SWITCH_ON(fn, name)                                                           \
    static int fn(void)                                                                        \
    {                                                                                          \
        static int off = -1;                                                                   \
        return !strata_k_switch_off(name, &off);                                               \
    }

/* The virtual architecture the loaded code of kernel func was compiled for (80 for
 * sm_80 / compute_80 code, also when the driver JIT-compiled its PTX for a newer device),
 * or 0 when the runtime cannot tell (cudaFuncGetAttributes' ptxVersion). */
int strata_k_code_arch(const void *func);

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

/* ---- 8-bit activations for the decode mat-vec (llama.cpp's MMVQ idea) ----
 *
 * A q8 row of n values (n % 32 == 0) is n int8 quants followed by n / 32 float32
 * scales, padded to 16 bytes (strata_k_q8_row_bytes); value i = d[i / 32] * q[i], with
 * d = max |x| / 127 over the 32 values and q = round-to-nearest-even(x / d) (0 where
 * d == 0).  Rows of a batch are strata_k_q8_row_bytes(n) apart. */
size_t strata_k_q8_row_bytes(int64_t n);

/* For n_rows rows of x (row stride x_stride floats): v = norm ? RMSNorm(x) * w : x
 * (w [n] or NULL; the formula and summation order of strata_k_rms_norm, so v equals
 * its output bitwise), written as float32 to y (row stride n; y may be NULL) and as q8
 * rows to yq.  n % 32 == 0. */
int strata_k_quantize_q8(struct strata_gpu_ctx *ctx, const float *x, int64_t x_stride, int n,
                         int n_rows, int norm, const float *w, float eps, float *y, void *yq,
                         struct strata_err *err);

/* 1 if strata_k_matvec_q8 takes weights of this GGUF type (Q4_K, Q5_K, Q6_K, Q8_0). */
int strata_k_matvec_q8_supported(uint32_t type);

/* An RMSNorm fused into the kernel that reads its rows: weight w [n], eps, and the
 * normed rows written as floats y [n_tok, n] (or NULL) and q8 rows yq (or NULL; rows of
 * strata_k_q8_row_bytes(n)), the bits strata_k_quantize_q8 (norm on) writes. */
struct strata_k_norm_q8 {
    const float *w;
    float eps;
    float *y;
    void *yq;
};

/* Mat-vec products of quantised weights with q8 activations: integer dot products of
 * 32-value blocks (dp4a), scaled once per block.
 *
 * mode PLAIN, GLU: as strata_k_matvec, slot s (< n_slot) reading q8 row s / x_group of
 * xq (rows of ne0 values) and expert ids[s] (ids NULL: matrix 0); y may be NULL in GLU
 * mode when yq is set.  GLU only: yq (if not NULL) receives each slot's n_slot output
 * rows as q8 rows of ne1 values (ne1 % 32 == 0), quantised as strata_k_quantize_q8 does.
 * mode COMBINE (the routed experts' down projections and their weighted sum, one
 * launch): for token t < n_slot, with slot s = t * k + j,
 *   y[t * y_stride + r] = (add ? add[t * y_stride + r] : 0)
 *                         + sum_j cw[s] * dot(W_ids[s] row r, q8 row s / x_group).
 * add may equal y.  As with strata_k_matvec, the order of every sum depends only on
 * ne0, ne1, k and the device, never on n_slot: a row of a windowed product is bitwise
 * the one-token result.
 * Fused RMSNorm (PLAIN, COMBINE; counter not NULL): once every row of token t is
 * written, the last block to finish applies strata_k_quantize_q8 with norm and weight
 * nw to y row t (ne1 values, ne1 % 32 == 0): float rows to ny (row stride ne1; may be
 * NULL), q8 rows to nyq.  counter: n_slot ints of device memory, zero before the launch
 * and zero again after it (so a captured graph can replay it).  This saves the launch
 * of the norm that follows a residual add (the sum of squares runs over the block's
 * threads, so the float rows may differ from strata_k_rms_norm's in the last bit). */
enum { STRATA_K_MVQ_PLAIN = 0, STRATA_K_MVQ_GLU = 1, STRATA_K_MVQ_COMBINE = 2 };
struct strata_k_qkv_args;
struct strata_k_mvq_args {
    const struct strata_k_weight *w, *up;
    int mode;
    const int32_t *ids;
    int n_slot, x_group, k;
    const float *cw;
    const void *xq;
    float *y;
    int64_t y_stride;
    const float *add;
    void *yq;
    const float *nw;
    float eps;
    float *ny;
    void *nyq;
    int *counter;
    /* GLU and COMBINE with ids: etab [3 * n_expert] device-readable pointers to expert
     * e's gate, up and down matrices (etab[3 e], [3 e + 1], [3 e + 2]), used instead
     * of w->data + e * nb2 (GLU: gate and up; COMBINE: down), so that each expert may
     * live anywhere the device can read: a VRAM slot, or mapped host memory read over
     * PCIe.  The same products in the same order; NULL: the stacks. */
    const void *const *etab;
    /* etab_slot: etab is indexed by slot instead (3 s + part for GLU slot s, 3 sl + 2 for
     * COMBINE assignment sl): pointers resolved for this batch */
    int etab_slot;
    /* One slot (or NULL): the slot's argmax also folded into *argmax_key (atomicMax of
     * gpu.h's strata_argmax_key of every output row: the largest value, the lowest row
     * of equal ones, NaN never; the caller zeroes it first; key 0: every value NaN), so
     * that greedy decoding needs no argmax launch.  Done by streamed launches only:
     * *argmax_done (required with argmax_key) is set to 1 when the launch did it, to 0
     * when strata_k_argmax must still run. */
    unsigned long long *argmax_key;
    int *argmax_done;
    /* One slot (or NULL): the output rows also stored to y_host, the device's address of
     * mapped pinned host memory of ne1 floats (cudaHostGetDevicePointer), a chunk's
     * consecutive rows together (one 64-byte write for the output projection's 16), so
     * that a one-row pass's logits are on the host when the launch completes, with no
     * copy after it.  y is written as well.  Done by streamed launches only:
     * *y_host_done (required with y_host) is set to 1 when the launch did it, to 0 when
     * the caller must copy y.  Refused with a second weight (w2). */
    float *y_host;
    int *y_host_done;
    /* How PLAIN products read their weights.  2: streamed (no ids, no fused norm: a
     * fixed grid copies chunks of rows to shared memory while it computes the chunk
     * before, every slot from the same copy); 1: staged (2 rows per group, Q6_K/Q8_0,
     * rows 16-byte aligned: each block copies its rows to shared memory first); -1:
     * neither; 0: streamed where ne1 >= 16384 (the output projection) unless
     * STRATA_NO_MVQ_STREAM=1, else staged where it applies unless STRATA_NO_MVQ_STAGE=1.
     * The results are the same bits whichever way. */
    int stage;
    /* PLAIN without ids (or NULL): the activations are x_in (n_slot rows of ne0 floats,
     * row stride ne0) normed with in_norm->w and in_norm->eps, computed by every block
     * of a streamed launch into its shared memory (the bits strata_k_quantize_q8 writes;
     * block 0 also writes them to in_norm->y, if not NULL, and in_norm->yq, required),
     * so that no norm launch precedes the product; xq is then not read.  Streamed
     * whatever stage says, except -1; where the streamed kernel does not apply,
     * strata_k_quantize_q8 runs first (same bits).  PLAIN launches without ids ask L2
     * for their own rows before they wait for the kernel before (STRATA_NO_L2_AHEAD=1:
     * not). */
    const float *x_in;
    const struct strata_k_norm_q8 *in_norm;
    /* PLAIN without ids, one slot per token (or NULL): the rows are those of a merged
     * q/k/v product, output row r of slot t belonging to head r / post->hd of
     * strata_k_qkv_post's numbering (y must be post->q, with post->k and post->v after
     * the q and k heads' rows and every stride y_stride), and the launch also does
     * strata_k_qkv_post's work on the heads it writes: the block that completes a
     * head's rows (post_counters: one int per head, zero before and after the launch)
     * runs qkv_post_head on it for every slot, in groups of qkv_post_threads(hd)
     * threads with qkv_post_kernel's sums, so the bits are the separate launch's.
     * Done by streamed launches only: *post_done (required with post) is set to 1 when
     * the launch did it, to 0 when the product ran another way and strata_k_qkv_post
     * must still follow. */
    const struct strata_k_qkv_args *post;
    int *post_counters;
    int *post_done;
    /* PLAIN without ids, with x_in/in_norm (or NULL): a second weight of the same ne0
     * whose rows follow w's, output columns ne1 .. ne1 + w2->ne1 - 1 of each slot (a
     * merged q/k product and its v of another type), read in the same streamed launch;
     * a post then covers its rows too.  Done for the pairs Q4_K/Q6_K and Q5_K/Q6_K only:
     * *w2_done (required) is set to 1 when the launch did it, to 0 when the caller must
     * run w2's product itself. */
    const struct strata_k_weight *w2;
    int *w2_done;
    /* PLAIN (or NULL): every output value of slot t, row r also stored as a half at
     * y16[(*y16_pos + t) * y16_stride + r]: a v product's rows straight into the kv
     * cache, the bits strata_k_qkv_post stores for them (y is still written) */
    __half *y16;
    const int32_t *y16_pos;
    int64_t y16_stride;
    /* GLU of one token's k routed experts (n_slot == x_group == k, no etab), or NULL:
     * route_logits [route_n_expert] are its router logits (strata_k_moe_router_topk with
     * no counter), and every block routes the token itself with moe.cuh's route_warp
     * (softmax, the k largest, renormalised when route_norm, times route_scale: the ids
     * and weights strata_k_moe_route gives, bit for bit) before its expert's rows; the
     * first block also stores them to ids (which must be given, [k]) and route_w [k] for
     * the launches after.  One launch's dependent round trips fewer than a router that
     * routes in its last block (docs/performance.md). */
    const float *route_logits;
    int route_n_expert, route_norm;
    float route_scale;
    float *route_w;
    /* PLAIN and COMBINE mvq_kernel launches (not streamed, not GLU), or NULL: bytes
     * [next_l2[i], + next_l2_bytes[i]) asked for in L2 by the launch's threads before its
     * PDL wait - the weights of a launch that follows (the next layer's q/k/v after the
     * experts' down), whose own requests then find them there.  A hint only: nothing is
     * read back. */
    const void *next_l2[2];
    size_t next_l2_bytes[2];
};
int strata_k_matvec_q8(struct strata_gpu_ctx *ctx, const struct strata_k_mvq_args *a,
                       struct strata_err *err);

/* Streamed launches (strata_k_mvq_args.stage) made by this process so far: for tests
 * that must know the streamed kernel ran rather than its fallback. */
unsigned long strata_k_mvq_stream_launches(void);

/* Dequantise rows of w: dst[i * ne0 + k] = W row rows[i], value k, as float32
 * (rows: n_rows int32 device indices; NULL means rows 0..n_rows-1).  Used for the
 * token embedding lookup and by the tests. */
int strata_k_get_rows(struct strata_gpu_ctx *ctx, const struct strata_k_weight *w,
                      const int32_t *rows, int n_rows, float *dst, struct strata_err *err);

/* dst[t * n_cols + i] = (half) x[t * x_stride + i] for t < n_rows, i < n_cols. */
int strata_k_to_f16(struct strata_gpu_ctx *ctx, const float *x, int64_t x_stride, int n_rows,
                    int n_cols, __half *dst, struct strata_err *err);

/* Dequantise all of w (expert e, all rows) to half precision: dst[r * ne0 + k]. */
int strata_k_dequant_f16(struct strata_gpu_ctx *ctx, const struct strata_k_weight *w,
                         int expert, __half *dst, struct strata_err *err);

/* ---- row operations ---- */

/* RMSNorm of n_rows rows of n values: y = x / sqrt(mean(x^2) + eps) * w (w [n] or
 * NULL).  y may equal x. */
int strata_k_rms_norm(struct strata_gpu_ctx *ctx, const float *x, const float *w, float *y,
                      int n, int n_rows, float eps, struct strata_err *err);

/* Rotary position embedding parameters (ggml's rope with YaRN; corr_dims from
 * ggml_rope_yarn_corr_dims, computed by strata_k_rope_init). */
struct strata_k_rope {
    int mode;           /* 0: pairs (2i, 2i+1) (llama); 2: pairs (i, i + n_rot/2) (neox) */
    int n_rot;          /* rotated dimensions (<= head dim) */
    float freq_base, freq_scale, ext_factor, attn_factor;
    float corr_dims[2];
};
void strata_k_rope_init(struct strata_k_rope *r, int mode, int n_rot, float freq_base,
                        float freq_scale, int n_ctx_orig, float ext_factor, float attn_factor,
                        float beta_fast, float beta_slow);

/* After the q/k/v projections of n_tok tokens at positions *pos0 + t (pos0: one
 * int32 in device memory, so that a captured graph serves every step):
 * q [n_tok, n_head, hd] gets the per-head RMSNorm (q_norm [hd], if non-NULL) and RoPE
 * in place; k [n_tok, n_head_kv, hd] gets k_norm and RoPE and is stored with v
 * [n_tok, n_head_kv, hd] as f16 into the kv cache at rows *pos0 + t (k_cache, v_cache:
 * [n_ctx, n_head_kv, hd] f16 of this layer).  Row strides of q, k, v in floats. */
struct strata_k_qkv_args {
    float *q, *k, *v;
    int64_t q_stride, k_stride, v_stride;
    const float *q_norm, *k_norm;
    float eps;
    const struct strata_k_rope *rope;
    const int32_t *pos0;
    int n_tok, n_head, n_head_kv, hd;
    __half *k_cache, *v_cache;
};
int strata_k_qkv_post(struct strata_gpu_ctx *ctx, const struct strata_k_qkv_args *a,
                      struct strata_err *err);
/* The same for heads h0 .. h1 - 1 only, numbered q heads (0 .. n_head - 1), then k heads,
 * then v heads (the order of a merged q/k/v product's rows).  Errors: STRATA_E_INVALID
 * (shape, or an empty or out-of-range head range). */
int strata_k_qkv_post_heads(struct strata_gpu_ctx *ctx, const struct strata_k_qkv_args *a,
                            int h0, int h1, struct strata_err *err);

/* Causal GQA attention of n_tok queries at positions *pos0 + t over the kv cache
 * rows 0 .. *pos0 + t: out[t, h, :] = softmax(scale * q_h . K^T) V for query head h
 * and kv head h / (n_head / n_head_kv).  q [n_tok, n_head, hd] (row stride q_stride
 * floats), out [n_tok, n_head, hd] contiguous.  The kv range is split into n_split
 * parts computed in parallel and merged (split-K, for decode); partial results go to
 * scratch (strata_k_attn_scratch_bytes).  A query's parts follow its own position, so
 * its result does not depend on the other queries of the batch (a verify window equals
 * one-token calls bitwise).  max_kv bounds *pos0 + n_tok (the
 * grid is sized from it, so a captured graph stays valid while the cache grows).
 * hd <= 128. */
struct strata_k_attn_args {
    const float *q;
    int64_t q_stride;
    const __half *k_cache, *v_cache;
    float *out;
    const int32_t *pos0;
    int n_tok, n_head, n_head_kv, hd, max_kv, n_split;
    float scale;
    float *scratch;
    /* optional (NULL: unused).  counters: strata_k_attn_counters() ints of device memory,
     * zero before and after the launch: the splits are merged by the last block of each
     * tile instead of a second launch.  out_q8: the output also as 8-bit rows of
     * out_q8_row bytes (strata_k_quantize_q8's format and bytes); needs hd % 32 == 0,
     * and counters when n_split > 1 */
    int *counters;
    void *out_q8;
    int64_t out_q8_row;
    /* keys per split at least (a multiple of 32; 0: 128): a row of kv length L uses
     * min(n_split, ceil(L / split_keys)) splits.  The layout depends on L and this only,
     * so a decode and a verify window must use the same value */
    int split_keys;
    /* 1: a batch without splits (n_split 1, no counters, no 8-bit output) with hd 32, 64
     * or 128 runs on the matrix units where the device has them (NVIDIA sm_80+): q and P
     * rounded to f16, sums in f32 (prefill; the FMA kernel otherwise) */
    int mma;
    /* 1: batches of at most 8 rows a kv head (decodes) on the 32-row tiles of larger
     * batches too, instead of a 32-lane group a row; the same bits either way (tests) */
    int tiles;
};
/* ints of the counters of strata_k_attention for batches of up to n_tok tokens */
size_t strata_k_attn_counters(int n_tok, int n_head, int n_head_kv);
size_t strata_k_attn_scratch_bytes(int n_tok, int n_head, int hd, int n_split);
int strata_k_attention(struct strata_gpu_ctx *ctx, const struct strata_k_attn_args *a,
                       struct strata_err *err);

/* ---- MoE ---- */

/* Router: logits [n_tok, n_expert] -> ids [n_tok, k] and weights [n_tok, k]: softmax
 * over all experts, the k largest (ties to the lower id), renormalised to sum 1 when
 * norm, times scale.  n_expert <= 1024. */
int strata_k_moe_route(struct strata_gpu_ctx *ctx, const float *logits, int n_tok,
                       int n_expert, int k, int norm, float scale, int32_t *ids, float *w,
                       struct strata_err *err);

/* Where a one-token router launch also leaves its results for the host: pinned host
 * memory the device can write (device addresses); ids [k] the chosen experts, xn [n] (or
 * NULL) the experts' input row (the normed row when the launch norms, else x), and flag,
 * written seq last, once ids and xn are visible to the host - so the host can plan the
 * layer's experts without a copy back and a synchronisation of the stream. */
struct strata_k_host_route {
    int32_t *ids;
    float *xn;
    unsigned *flag;
    unsigned seq;
};

/* The router and strata_k_moe_route in one launch, for decode-sized batches: logits
 * [n_tok, n_expert] = x [n_tok, n] (row stride n) times the F32 router rw [n_expert rows
 * of n], then ids and w as strata_k_moe_route (same results for the same logits).
 * counter: an int of device memory, zero before and after the launch; NULL: the
 * logits only, ids and w not written (the experts' gate/up launch routes the token
 * itself: strata_k_mvq_args.route_logits; hr must be NULL).  n_tok <= 64,
 * n % 4 == 0, x 16-byte aligned.  A token's logits do not depend on n_tok (bitwise).
 * fn (or NULL): x is the residual row, normed first (ffn_norm) with fn->w and fn->eps,
 * the normed rows written to fn->y / fn->yq; logits, y and yq are bitwise those of
 * strata_k_quantize_q8 followed by this kernel on its float rows (n % 32 == 0, all
 * pointers 16-byte aligned; else STRATA_E_INVALID).  hr (or NULL): n_tok 1 only, the
 * results for the host as strata_k_host_route says (xn 16-byte aligned). */
int strata_k_moe_router_topk(struct strata_gpu_ctx *ctx, const struct strata_k_weight *rw,
                             const float *x, int n_tok, float *logits, int *counter, int k,
                             int norm, float scale, int32_t *ids, float *w,
                             const struct strata_k_norm_q8 *fn,
                             const struct strata_k_host_route *hr, struct strata_err *err);

/* out[t, :] = (add ? add[t, :] : 0) + sum_j w[t, j] * y[t * k + j, :], j in order.
 * y [n_tok * k, n], out/add [n_tok, n]; out may equal add. */
int strata_k_moe_combine(struct strata_gpu_ctx *ctx, const float *y, const float *w, int n_tok,
                         int k, int n, const float *add, float *out, struct strata_err *err);

/* Sort the n_tok * k routed assignments by expert for the grouped mat-mat:
 * perm [n_tok * k] (assignment ids t * k + j grouped by expert), and a tile list of
 * at most STRATA_K_MM_BN assignments of one expert each: tiles [3 * max_tiles]
 * (expert, start, end) indexing perm,
 * and n_tiles [1].  max_tiles = strata_k_moe_max_tiles(n_tok * k, n_expert). */
#define STRATA_K_MM_BN 64
#define STRATA_K_MM_BM 64
int strata_k_moe_max_tiles(int n_asg, int n_expert);
int strata_k_moe_plan(struct strata_gpu_ctx *ctx, const int32_t *ids, int n_asg,
                      int n_expert, int32_t *perm, int32_t *tiles, int32_t *n_tiles,
                      struct strata_err *err);

/* ---- mat-mat (prefill and verify batches) ----
 *
 * Dequantises weight tiles to f16 and multiplies on the matrix units (mma.sync where
 * STRATA_GPU_MMA_F16, an FMA loop elsewhere), accumulating in f32.
 * Dense (tiles == NULL): y[t * y_stride + r] = (add ? add[..] : 0) + W row r . x[t].
 * Grouped (tiles from strata_k_moe_plan): for each assignment i of a tile of expert e,
 * y[i * y_stride + r] = W_e row r . x[(i / x_div) * x_stride].
 * glu: silu(W . x) * (U . x) as in strata_k_matvec. */
struct strata_k_mm_args {
    const struct strata_k_weight *w, *up;
    int glu;
    int n_tok;              /* dense: tokens; grouped: assignments */
    const int32_t *perm, *tiles, *n_tiles;
    int max_tiles, x_div;
    const float *x;
    int64_t x_stride;
    float *y;
    int64_t y_stride;
    const float *add;
    /* xh (optional, device scratch of n_x * ne0 halves): where the device has matrix
     * units (NVIDIA sm_80+), x is converted there to f16 first and the pipelined
     * kernel runs (the same results bit for bit).  n_x: the rows of x the product
     * reads (0: n_tok, or n_tok / x_div rounded up when grouped; set it where perm
     * indexes more assignments than n_tok). */
    __half *xh;
    int n_x;
};
int strata_k_matmul(struct strata_gpu_ctx *ctx, const struct strata_k_mm_args *a,
                    struct strata_err *err);

/* ---- element-wise and sampling ---- */

/* y[i] = a[i] + b[i], n values. */
int strata_k_add(struct strata_gpu_ctx *ctx, const float *a, const float *b, float *y, int64_t n,
                 struct strata_err *err);

/* For each of n_rows rows of n logits: the index of the largest (the lowest index
 * among equals; NaN never wins) -> ids[row], -1 for a row without a number. */
int strata_k_argmax(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                    int32_t *ids, struct strata_err *err);

/* For each of n_rows rows of n logits: log sum_i exp(logits[i]) -> out[row] (double),
 * as strata_sampler_log_sum_exp (the largest plus the log of the float exponentials
 * relative to it, summed in double, in another order); NaN logits are skipped.  A
 * token's logprob is its logit minus it.  One block per row. */
int strata_k_logsumexp(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                       double *out, struct strata_err *err);

/* The most logits strata_k_topk returns per row. */
#define STRATA_K_TOPK_MAX 64

/* Bytes of device scratch strata_k_topk and strata_k_topk_lse need for these shapes (at
 * most n_rows x 96 KB); 0 for shapes they refuse. */
size_t strata_k_topk_scratch(int n, int n_rows, int k);

/* The k largest logits of each of n_rows rows of n (1 <= k <= min(n,
 * STRATA_K_TOPK_MAX)), best first in strata_sampler_topk's order (larger first, the
 * lower index among equal ones, -0 equal to +0, NaN never): ids [n_rows, k] and vals
 * [n_rows, k] (either may be NULL); a place without a number left gets id -1 and
 * -inf.  scratch: strata_k_topk_scratch(n, n_rows, k) bytes of device memory.  One
 * block takes the k best of each part of a row (up to 4,096 logits): the keys at or
 * above the k-th largest of at least k group maxima, ranked, or where too many pass a
 * sort of the part in shared memory; then one block per row the parts' best the same
 * way: two launches (one for a row of one part).  The
 * engine's sampler applies top_p, min_p and temperature on these on the host.  Errors:
 * STRATA_E_INVALID (shapes, missing scratch), STRATA_E_GPU. */
int strata_k_topk(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows, int k,
                  void *scratch, int32_t *ids, float *vals, struct strata_err *err);

/* strata_k_topk, and with lse (not NULL) each row's log-sum-exp into lse [n_rows], as
 * strata_k_logsumexp computes it (the same float exponentials relative to the row's
 * largest logit, summed in double in another order), by the same blocks' parts of the
 * row: the parts' maxima with the top-k's first launch, their sums in a second, the
 * total with the parts' merge - several blocks a row instead of one.  A row of one part
 * runs strata_k_logsumexp.  Errors: those of strata_k_topk. */
int strata_k_topk_lse(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                      int k, void *scratch, int32_t *ids, float *vals, double *lse,
                      struct strata_err *err);

/* ---- the fused decode step (decode_step.cu) ----
 * One token through every layer of a MoE model in one persistent kernel: the
 * products, norms, RoPE, attention and routing of the separate decode kernels, run by
 * the same device functions in the same order (so the step's hidden state is bitwise
 * that of the separate launches), with a grid-wide barrier between the stages of a
 * layer instead of a kernel boundary, and the next stage's weights asked into L2 while
 * the current one runs.  The output norm and projection stay separate launches. */

/* One 8-bit-activation product of the step, as strata_k_matvec_q8 would run it: type,
 * rows ne1, 32-value units per row nu, lanes per row tpr (strata_k_mvq_tpr), and the
 * rows a lane group takes at once R (1, 2 or 4; any R gives the same sums). */
struct strata_k_step_mv {
    const uint8_t *w, *u; /* u: GLU's up matrix */
    size_t nb1, nb2;
    uint32_t type;
    int ne1, nu, tpr, R;
};

/* One layer of the step (device memory).  qa and aa are the layer's q/k norm, RoPE and
 * attention arguments for a one-token batch, as the separate launches take them (their
 * host pointer qa.rope is not read: the rope is strata_k_step_args.rope). */
struct strata_k_step_layer {
    const float *attn_norm, *ffn_norm;
    const float *router; /* F32 [n_expert, n_embd] */
    struct strata_k_step_mv qkv[3]; /* attn_qkv, or its pieces, into q at column qkv_col */
    int qkv_col[3], n_qkv;
    struct strata_k_step_mv wo, gate_up, down;
    struct strata_k_qkv_args qa;
    struct strata_k_attn_args aa;
};

struct strata_k_step_args {
    const struct strata_k_step_layer *layers; /* [n_layer], device memory */
    int n_layer, n_embd, n_q, n_expert, k, norm_topk, hd, n_ff_exp;
    float eps, wscale;
    struct strata_k_rope rope;
    float *x;            /* [n_embd] the hidden state, in and out */
    float *logits;       /* [n_expert] router logits scratch */
    int32_t *eids;       /* [k] the last layer's routing, out */
    float *ew;           /* [k] */
    void *attq;          /* q8 row of n_q: the attention output */
    void *actq;          /* [k] q8 rows of n_ff_exp: the experts' SwiGLU output */
    unsigned long long *bar; /* one counter of device memory, zero before the first launch */
    /* optional (NULL: off): [n_layer * 21 + 1] device clock readings (strata_dev_clock)
     * of block 0: [0] the start, [2 s + 1] and [2 s + 2] when stage s (0 .. 7 n_layer - 1)
     * had its own work done and when its barrier was passed, [14 n_layer + 1 + s] when
     * the first part of stage s was done (stages 1, 4, 5, 6 and 7 of each layer only) */
    unsigned long long *trace;
    int dry;         /* 1: barriers only, no work (what the barriers cost) */
};

/* Lanes per row of an 8-bit-activation product of nu units per row and k experts
 * summed per row: strata_k_matvec_q8's choice, which fixes the sums' order.  At most
 * the cap (strata_k_mvq_set_tpr_cap). */
int strata_k_mvq_tpr(int nu, int k);

/* The most lanes per row of the 8-bit-activation products from now on: 4, 8, 16, or 32
 * (any other value; the default).  A measurement switch (the backend sets it at start
 * from STRATA_MVQ_TPR): set it before any product runs, not between a decode and the
 * windows it must equal. */
void strata_k_mvq_set_tpr_cap(int cap);

/* 1 if the step kernel can run this model's shapes (head dim 32, 64 or 128, n_embd and
 * n_ff_exp multiples of 32, n_expert <= 1024, k <= 32). */
int strata_k_decode_step_supported(int n_embd, int hd, int n_ff_exp, int n_expert, int k);

/* Blocks of a step launch on this device (co-resident: the barriers need every block
 * running), blocks_per_sm of them per multiprocessor at most (0: as many as fit).
 * Returns 0 on failure. */
int strata_k_decode_step_blocks(const struct strata_gpu_ctx *ctx,
                                const struct strata_k_step_args *a, int blocks_per_sm);

/* Launch the step on ctx's stream with n_blocks blocks (strata_k_decode_step_blocks)
 * as a cooperative launch.  Errors: STRATA_E_INVALID (shapes), STRATA_E_UNSUPPORTED (the
 * launch was refused and the device is still usable: run the separate kernels),
 * STRATA_E_GPU (a device fault). */
int strata_k_decode_step(struct strata_gpu_ctx *ctx, const struct strata_k_step_args *a,
                         int n_blocks, struct strata_err *err);

#endif
