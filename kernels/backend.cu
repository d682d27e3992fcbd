/* backend.cu - the GPU backend of the engine (lib/engine.h backend interface): the
 * whole model in VRAM, the kv cache in VRAM, one forward pass for prefill chunks,
 * verify windows and decode steps, and the decode step replayed as a CUDA/HIP graph.
 *
 * Batches of at most MATVEC_MAX tokens (decode and verify windows) use the mat-vec
 * kernels, whose result for a token does not depend on the other tokens of the batch;
 * larger batches (prefill chunks) use the mat-mat kernels on the matrix units.  So a
 * verify window's logits are bitwise those of one-token decodes of the same positions.
 *
 * Every runtime call and launch is checked: an error names the kernel or call, the
 * shapes, the layer and the device, and the forward call returns it; the kv cache stays
 * valid below the batch's first position.  STRATA_SYNC_DEBUG=1 synchronises after each
 * launch (and disables the graph) so that an asynchronous fault is reported by the
 * launch that caused it.
 */
#include "kernels.h"
#include "backend_experts.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef STRATA_GPU_CUDA
#include <cublas_v2.h>
#endif

extern "C" {
#include "engine.h"
#include "gguf.h"
#include "log.h"
#include "model.h"
#include "quant.h"
}

/* Host code only: nothing here runs on the device. */
#ifdef STRATA_GPU_HOST_PASS

/* the largest mat-vec batch: a verify window of STRATA_SPEC_MAX (16) drafts plus the
 * accepted token, so every window is bitwise the decode steps */
#define MATVEC_MAX 17
enum { GRAPH_ROW1 = 0, GRAPH_ALL = 1, GRAPH_HOST = 2, GRAPH_VARIANTS = 3 };
#define PROF_MAX_EV 512
#define PROF_MAX_OPS 64
/* STRATA_LOGITS_TOPK: k ids, k values and the log-sum-exp (a double), then from byte
 * TOPK_SCRATCH strata_k_topk_lse's scratch (P x k <= 4096 keys, P <= 4096 parts' maxima
 * and sums) */
#define TOPK_SCRATCH (8 * STRATA_K_TOPK_MAX + 8)
#define TOPK_BYTES (TOPK_SCRATCH + 8 * 4096 + 16 * 4096)

struct dev_layer {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    struct strata_k_weight wq, wk, wv, wo;
    /* q, k (and v) stacked into one matrix when their types agree: one launch, and
     * rows [q | k | v] of each token land side by side (n_qkv = 2 or 3; 0: apart) */
    struct strata_k_weight wqkv;
    int n_qkv;
    struct strata_k_weight gate, up, down;            /* dense FFN */
    struct strata_k_weight gate_inp, gate_exps, up_exps, down_exps;
    int is_moe;
    __half *k_cache, *v_cache; /* [n_ctx, n_head_kv, hd] */
};

struct gpu_state {
    struct strata_gpu_ctx ctx;
    const struct strata_model *m;
    int n_ctx, n_ub, n_split;
    int n_embd, n_head, n_head_kv, hd, n_q, n_kv, n_vocab, n_expert, n_used, n_ff, n_ff_exp;
    struct strata_k_rope rope;
    float eps;
    struct strata_k_weight tok_embd, output;
    float *output_norm;
    struct dev_layer *layers;
    /* scratch for n_ub tokens */
    float *x, *xn, *q, *att, *router, *ew, *act, *eout, *logits, *attn_scratch;
    /* 8-bit activations of mat-vec batches (strata_k_matvec_q8): the normed input, the
     * attention output, the FFN activations; use_q8 = 0 (STRATA_NO_MVQ=1) keeps every
     * mat-vec on float activations */
    void *xq, *attq, *actq;
    int use_q8;
    /* fuse (STRATA_FUSE=1): the RMSNorms as last-block epilogues of the mat-vec before
     * them, router and top-k in one launch.  Off by default: on the H200 the epilogue's
     * single-block norm (L2 reads one round trip at a time) cost more than the launches
     * it saves (docs/performance.md) */
    int fuse;
    /* fuse_route (default; STRATA_NO_FUSE_ROUTE=1 turns it off): router and top-k in one
     * launch for decode batches (moe_router_topk), whatever fuse says */
    int fuse_route;
    /* norm_route (default; STRATA_NO_NORM_ROUTE=1 turns it off): with fuse_route, the
     * ffn_norm (RMSNorm and 8-bit rows) computed by the router's blocks, not launched
     * before it: one launch fewer per MoE layer, the same bits */
    int norm_route;
    /* route_glu (default; STRATA_NO_ROUTE_GLU=1 turns it off): a decode step's router
     * launch leaves the logits only, and every block of the experts' gate/up launch
     * routes the token itself (the same ids and weights): the router's count and its
     * last block's routing leave the chain of dependent round trips */
    int route_glu;
    /* next_l2 (default; STRATA_NO_NEXT_L2=1 turns it off): the experts' down launch asks
     * L2 for the next layer's q/k/v weights before its wait (strata_k_mvq_args.next_l2):
     * the q/k/v launch, scheduled only once the down launch ends, then reads them there */
    int next_l2;
    /* norm_mv (default; STRATA_NO_NORM_MV=1 turns it off): attn_norm and output_norm
     * computed by the blocks of the streamed q8 product that reads them (same bits) */
    int norm_mv;
    /* [2 * MATVEC_MAX] counters of the last-block epilogues: the RMSNorm fused into a
     * mat-vec, then the routing fused into the router */
    int *norm_cnt;
    /* attn_q8 (default; STRATA_NO_ATTQ=1 turns it off): the attention kernel merges its
     * splits in the last block of each tile (counters attn_cnt) and writes the 8-bit rows
     * of attn_output itself: two launches fewer per layer */
    int attn_q8;
    /* att_split_keys (default 32; STRATA_ATT_LONG_SPLITS=1: 0, i.e. 128): the fewest keys
     * a decode attention split takes, so that short contexts spread over more blocks
     * (tg128 957 -> 1,013 tok/s on the H200); decode and verify windows use the same
     * value */
    int att_split_keys;
    /* att_mma (default; STRATA_ATT_MMA=0 turns it off): prefill attention on the matrix
     * units (strata_k_attn_args.mma; pp512 41,010 -> 49,170 tok/s on the H200).  Its
     * numerics differ from the FMA kernel's in the last bits, and the expert cache's
     * host-planned decode paths (CPU experts, staged rounds) still differ from the
     * all-in-VRAM kernels in the last bits too, so over a long prompt a near tie of the
     * routing may go the other way in one of them: test_expert_offload (5e-2 bound, equal
     * greedy ids) failed 3-6 of 189 points with it on in an earlier build of the cache
     * and passes all 285 in this one (docs/performance.md) */
    int att_mma;
    int *attn_cnt;
    /* v_fold (default; STRATA_NO_V_FOLD=1 turns it off): a v of another type than the
     * merged q/k (Q6_K under Q4_K or Q5_K) read in the same streamed launch of a decode
     * step or verify window: one launch fewer on those layers, the same bits (tg128
     * +1.4% on the H200, docs/performance.md).  qkv_post_fuse (off; STRATA_QKV_POST_FUSE=1
     * turns it on): the q/k norms, RoPE and kv store done by the blocks of that launch
     * that complete each head (counters post_cnt, one per head), and a separate v
     * product's rows stored into the v cache by the product: one launch fewer per layer,
     * the same bits, but 1% slower there (each head's tail lengthens the launch) */
    int qkv_post_fuse, v_fold;
    int *post_cnt;
    /* pin_in (default; STRATA_NO_PIN_IN=1 turns it off): pos0 and the token ids go to
     * the device in one copy from pinned memory (h_in), s->ids = s->pos0 + 1 */
    int pin_in;
    int32_t *h_in;
    int32_t *ids, *pos0, *eids, *perm, *tiles, *n_tiles;
    int max_tiles;
    void **allocs;
    size_t n_allocs, cap_allocs, vram_bytes;
    /* decode steps and verify windows replayed as graphs: one per batch size n_tok
     * (1..MATVEC_MAX) and logits rows ([0]: the last, [1]: every row), captured on the
     * second use of the shape: the first runs direct launches, so a shape used once (a
     * short prompt, a draft model's catch-up) never pays a capture (about a millisecond
     * against a 0.15 ms step on an H200).  A graph holds the device pointers and shapes
     * of its launches: whatever changes them (a weight's device copy, the expert slots)
     * must call graphs_drop. */
    /* [n][v]: v GRAPH_ROW1 one row of logits reduced on the device (argmax, top-k),
     * GRAPH_ALL every row, GRAPH_HOST one row for the host (also written to h_row) */
    cudaGraphExec_t graph_exec[MATVEC_MAX + 1][GRAPH_VARIANTS];
    unsigned char graph_off[MATVEC_MAX + 1][GRAPH_VARIANTS]; /* capture failed: direct */
    unsigned char graph_used[MATVEC_MAX + 1][GRAPH_VARIANTS]; /* ran once without a graph */
    unsigned char graph_key[MATVEC_MAX + 1][GRAPH_VARIANTS]; /* makes the argmax key (key_ok) */
    unsigned char graph_row[MATVEC_MAX + 1][GRAPH_VARIANTS]; /* writes h_row itself (row_ok) */
    int use_graph;
    /* ec_graph: offloaded experts, and one-token steps read them through the expert
     * table (strata_gpu_ec_graph_mode): no host work inside such a step, so it is
     * replayed as a graph like the all-in-VRAM step */
    int ec_graph;
    int tab_now; /* this forward is such a step (strata_gpu_ec_decode_graph said so) */
    float *h_logits; /* pinned staging of the top-k, an argmax id or key */
    /* One row of logits, pinned and mapped: the output projection of a one-row pass
     * writes it through d_row (strata_k_mvq_args.y_host), so that it is on the host when
     * the pass ends; else it is copied there.  The engine's row (gpu_host_row).
     * host_row: STRATA_NO_HOST_ROW=1 turns the kernel's writes off; row_ok: the last
     * pass launched (or captured) made them. */
    float *h_row, *d_row;
    int host_row, row_ok;
    int32_t *d_amax; /* the argmax id of STRATA_LOGITS_ARGMAX */
    /* the output projection's argmax key of a one-row pass (strata_k_mvq_args.argmax_key;
     * STRATA_NO_FUSED_ARGMAX=1: not, strata_k_argmax runs after the pass); key_ok: the
     * last pass launched (or captured) made it */
    unsigned long long *d_key;
    int fused_argmax, key_ok;
    /* STRATA_LOGITS_TOPK: k ids, k values and the log-sum-exp (the layout the engine
     * takes), then strata_k_topk's scratch (TOPK_BYTES) */
    int32_t *d_topk;
    /* STRATA_GPU_PROFILE=1: events between the launches of a forward pass (no graph);
     * per-operation totals are logged when the backend is freed */
    int prof;
    cudaEvent_t ev[PROF_MAX_EV];
    const char *ev_name[PROF_MAX_EV];
    int n_ev, ev_ready;
    const char *op_name[PROF_MAX_OPS];
    double op_ms[PROF_MAX_OPS];
    long op_calls[PROF_MAX_OPS];
    int n_ops;
    int cur_tokens;
    /* blas_f32 (default; STRATA_NO_BLAS_F32=1 turns it off): F32 weights of prefill
     * batches (the router) by an FP32 cublasGemmEx instead of the mat-mat kernel */
    int blas_f32;
#ifdef STRATA_GPU_CUDA
    /* cuBLAS, loaded at run time when present: prefill-sized dense projections are
     * dequantised to f16 and multiplied by cublasGemmEx (tensor cores) */
    void *blas_lib;
    cublasHandle_t blas;
    cublasStatus_t (*blas_destroy)(cublasHandle_t);
    cublasStatus_t (*blas_gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                int, const void *, const void *, cudaDataType, int,
                                const void *, cudaDataType, int, const void *, void *,
                                cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
#endif
    __half *wh, *xh; /* f16 scratch: one dense weight, n_ub rows of activations */
    size_t wh_cap, xh_cap;
    /* mmh: the f16 activations of the pipelined mat-mat kernel (strata_k_mm_args.xh),
     * mmh_cap halves; NULL without matrix units or with STRATA_MM_V1=1 (the first
     * kernel, which converts its tiles itself) */
    __half *mmh;
    size_t mmh_cap;
    /* routed experts that do not all fit: a VRAM slot pool (backend_experts.h); NULL
     * when every expert is in VRAM */
    struct strata_gpu_ec *xc;
    /* the fused decode step (strata_k_decode_step; STRATA_FUSED_STEP=1 turns it on):
     * one-token batches of an all-in-VRAM MoE model whose every product takes the 8-bit
     * kernels run their layers as one persistent kernel of step_blocks blocks
     * (STRATA_STEP_BLOCKS=N: at most N a multiprocessor); 0 blocks: the separate
     * launches.  The hidden state is bitwise theirs, so verify windows (which run the
     * separate launches) still equal decode steps.  Off by default: on the H200 it is
     * slower than the separate launches (783 against 1,037-1,053 tok/s, tg128 of the
     * 12-layer synthetic Qwen3-30B-A3B; docs/performance.md) */
    int step_blocks;
    struct strata_k_step_args step;
    /* STRATA_STEP_TRACE=1: the step's per-stage clock readings (step.trace) summed over
     * the steps run, logged when the backend is freed */
    double step_work_ns[7], step_wait_ns[7], step_mid_ns[7];
    long step_traced;
    unsigned long long *step_trace_host; /* [21 * n_layer + 1] */
};

#ifdef STRATA_GPU_CUDA
/* Load cuBLAS if this machine has it; without it the mat-mat kernels do the work. */
static void blas_open(struct gpu_state *s)
{
    if (strata_k_env_on("STRATA_NO_BLAS"))
        return;
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL};
    for (int i = 0; names[i] && !s->blas_lib; i++)
        s->blas_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!s->blas_lib) {
        strata_log_info("cuBLAS not found: prefill uses the built-in mat-mat kernels");
        return;
    }
    cublasStatus_t (*create)(cublasHandle_t *) =
        (cublasStatus_t(*)(cublasHandle_t *))dlsym(s->blas_lib, "cublasCreate_v2");
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) =
        (cublasStatus_t(*)(cublasHandle_t, cudaStream_t))dlsym(s->blas_lib, "cublasSetStream_v2");
    s->blas_destroy = (cublasStatus_t(*)(cublasHandle_t))dlsym(s->blas_lib, "cublasDestroy_v2");
    *(void **)&s->blas_gemm = dlsym(s->blas_lib, "cublasGemmEx");
    if (!create || !set_stream || !s->blas_destroy || !s->blas_gemm ||
        create(&s->blas) != CUBLAS_STATUS_SUCCESS ||
        set_stream(s->blas, s->ctx.stream) != CUBLAS_STATUS_SUCCESS) {
        strata_log_warn("cuBLAS found but unusable: prefill uses the built-in mat-mat kernels");
        s->blas = NULL;
        dlclose(s->blas_lib);
        s->blas_lib = NULL;
        (void)cudaGetLastError();
    }
}
#endif

/* 1 if a batch of n tokens multiplies w on 8-bit activations (strata_k_matvec_q8). */
static int mvq_ok(const struct gpu_state *s, const struct strata_k_weight *w, int n)
{
    return s->use_q8 && n <= MATVEC_MAX && w->data && strata_k_matvec_q8_supported(w->type);
}

/* Record a profiling event before the operation called name. */
static void prof_mark(struct gpu_state *s, const char *name)
{
    if (!s->prof || s->n_ev >= PROF_MAX_EV)
        return;
    if (!s->ev_ready) {
        for (int i = 0; i < PROF_MAX_EV; i++)
            if (cudaEventCreate(&s->ev[i]) != cudaSuccess) {
                (void)cudaGetLastError();
                s->prof = 0;
                return;
            }
        s->ev_ready = 1;
    }
    s->ev_name[s->n_ev] = name;
    if (cudaEventRecord(s->ev[s->n_ev], s->ctx.stream) == cudaSuccess)
        s->n_ev++;
    else
        (void)cudaGetLastError();
}

/* After the stream synchronised: add the intervals to the per-operation totals. */
static void prof_collect(struct gpu_state *s)
{
    for (int i = 0; i + 1 < s->n_ev; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, s->ev[i], s->ev[i + 1]) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        char key[96];
        snprintf(key, sizeof key, "%s%s", s->cur_tokens == 1 ? "decode " : "batch  ", s->ev_name[i]);
        int k = 0;
        while (k < s->n_ops && strcmp(s->op_name[k], key) != 0)
            k++;
        if (k == s->n_ops) {
            if (s->n_ops == PROF_MAX_OPS)
                continue;
            s->op_name[k] = strdup(key);
            if (!s->op_name[k])
                continue;
            s->n_ops++;
        }
        s->op_ms[k] += ms;
        s->op_calls[k]++;
    }
    s->n_ev = 0;
}

static void prof_report(struct gpu_state *s)
{
    double tot[2] = {0, 0};
    for (int k = 0; k < s->n_ops; k++)
        tot[s->op_name[k][0] == 'd'] += s->op_ms[k];
    for (int pass = 0; pass < s->n_ops; pass++) {
        int best = -1;
        for (int k = 0; k < s->n_ops; k++)
            if (s->op_calls[k] >= 0 && (best < 0 || s->op_ms[k] > s->op_ms[best]))
                best = k;
        if (best < 0)
            break;
        strata_log_info("profile %-28s %9.3f ms %6ld calls %8.2f us/call %5.1f%%",
                        s->op_name[best], s->op_ms[best], s->op_calls[best],
                        1e3 * s->op_ms[best] / (s->op_calls[best] ? s->op_calls[best] : 1),
                        100.0 * s->op_ms[best] / (tot[s->op_name[best][0] == 'd'] > 0
                                                      ? tot[s->op_name[best][0] == 'd'] : 1));
        s->op_calls[best] = -1;
    }
    for (int k = 0; k < s->n_ops; k++)
        free((void *)s->op_name[k]);
    s->n_ops = 0;
}

static int gpu_call(struct gpu_state *s, cudaError_t e, const char *what, struct strata_err *err)
{
    if (e == cudaSuccess)
        return 0;
    return strata_k_err(err, STRATA_E_GPU, "%s on %s device %d (%s): %s: %s", what,
                        STRATA_GPU_RUNTIME_NAME, s->ctx.info.device, s->ctx.info.name,
                        cudaGetErrorName(e), cudaGetErrorString(e));
}

static int dalloc(struct gpu_state *s, void **p, size_t bytes, const char *what,
                  struct strata_err *err)
{
    if (s->n_allocs == s->cap_allocs) {
        size_t nc = s->cap_allocs ? 2 * s->cap_allocs : 256;
        void **na = (void **)realloc(s->allocs, nc * sizeof(void *));
        if (!na)
            return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
        s->allocs = na;
        s->cap_allocs = nc;
    }
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError();
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
            (void)cudaGetLastError();
        return strata_k_err(err, STRATA_E_NOMEM,
                            "cannot allocate %.1f MiB of VRAM for %s on device %d (%s): %s "
                            "(%.1f MiB allocated so far, %.1f MiB free)",
                            bytes / 1048576.0, what, s->ctx.info.device, s->ctx.info.name,
                            cudaGetErrorString(e), s->vram_bytes / 1048576.0, fr / 1048576.0);
    }
    s->allocs[s->n_allocs++] = *p;
    s->vram_bytes += bytes;
    return 0;
}

static size_t weight_bytes(const struct strata_weight *w)
{
    int64_t n_mat = w->ne[2] > 0 ? w->ne[2] : 1;
    return w->ne[2] > 1 ? w->nb2 * (size_t)n_mat : w->nb1 * (size_t)(w->ne[1] > 0 ? w->ne[1] : 1);
}

/* Upload a matrix (or a stack of experts) as it is stored. */
static int up_weight(struct gpu_state *s, const struct strata_weight *w, struct strata_k_weight *d,
                     struct strata_err *err)
{
    memset(d, 0, sizeof(*d));
    if (!w->data)
        return 0;
    if (!strata_k_type_supported(w->type))
        return strata_k_err(err, STRATA_E_UNSUPPORTED,
                            "tensor '%s': type %s has no GPU kernel", w->name,
                            strata_ggml_type_name(w->type) ? strata_ggml_type_name(w->type) : "?");
    size_t bytes = weight_bytes(w);
    void *p;
    int rc = dalloc(s, &p, bytes, w->name, err);
    if (rc)
        return rc;
    if ((rc = gpu_call(s, cudaMemcpy(p, w->data, bytes, cudaMemcpyHostToDevice), w->name, err)))
        return rc;
    d->type = w->type;
    d->ne0 = w->ne[0];
    d->ne1 = w->ne[1] > 0 ? w->ne[1] : 1;
    d->nb1 = w->nb1;
    d->nb2 = w->ne[2] > 1 ? w->nb2 : 0;
    d->data = p;
    return 0;
}

/* Stack q, k and v (or q and k) into one matrix when they share type and ne0, so
 * that one launch projects them all. */
static int fuse_qkv(struct gpu_state *s, const struct strata_layer *L, struct dev_layer *D,
                    struct strata_err *err)
{
    const struct strata_weight *w[3] = {&L->wq, &L->wk, &L->wv};
    int n = 1;
    while (n < 3 && w[n]->data && w[n]->type == L->wq.type && w[n]->ne[0] == L->wq.ne[0] &&
           w[n]->nb1 == L->wq.nb1)
        n++;
    D->n_qkv = 0;
    if (n < 2 || getenv("STRATA_NO_QKV_FUSION"))
        return 0;
    size_t bytes = 0;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        bytes += weight_bytes(w[i]);
        rows += w[i]->ne[1];
    }
    void *p;
    int rc = dalloc(s, &p, bytes, "attn_qkv (stacked)", err);
    if (rc)
        return rc;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if ((rc = gpu_call(s, cudaMemcpy((char *)p + off, w[i]->data, weight_bytes(w[i]),
                                         cudaMemcpyHostToDevice), w[i]->name, err)))
            return rc;
        off += weight_bytes(w[i]);
    }
    D->wqkv = D->wq;
    D->wqkv.ne1 = rows;
    D->wqkv.data = p;
    D->n_qkv = n;
    return 0;
}

/* Upload a vector (a norm weight) as float32. */
static int up_vec(struct gpu_state *s, const struct strata_weight *w, float **d,
                  struct strata_err *err)
{
    *d = NULL;
    if (!w->data)
        return 0;
    int64_t n = w->ne[0] * (w->ne[1] > 0 ? w->ne[1] : 1);
    float *h = (float *)malloc(sizeof(float) * (size_t)n);
    if (!h)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    int rc = strata_quant_dequant_ref(w->type, w->data, h, n, err);
    if (!rc)
        rc = dalloc(s, (void **)d, sizeof(float) * (size_t)n, w->name, err);
    if (!rc)
        rc = gpu_call(s, cudaMemcpy(*d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice),
                      w->name, err);
    free(h);
    return rc;
}

/* Forget every captured graph and use count (each size captures again on its second
 * use). */
static void graphs_drop(struct gpu_state *s)
{
    for (int n = 0; n <= MATVEC_MAX; n++)
        for (int a = 0; a < GRAPH_VARIANTS; a++) {
            if (s->graph_exec[n][a])
                (void)cudaGraphExecDestroy(s->graph_exec[n][a]);
            s->graph_exec[n][a] = NULL;
            s->graph_off[n][a] = 0;
            s->graph_used[n][a] = 0;
        }
}

/* The pipelined mat-mat kernel's f16 activations (s->mmh): the widest input of a
 * prefill product, T tokens or A expert assignments.  Nothing where the device has no
 * matrix units or with STRATA_MM_V1=1 (the first kernel). */
static int mmh_alloc(struct gpu_state *s, size_t T, size_t A, size_t ffmax,
                     struct strata_err *err)
{
    if (strata_k_env_on("STRATA_MM_V1") || !s->ctx.info.has_mma_f16)
        return 0;
    size_t w = (size_t)s->n_embd;
    if ((size_t)s->n_q > w)
        w = (size_t)s->n_q;
    if (ffmax > w)
        w = ffmax;
    s->mmh_cap = T * w > A * ffmax ? T * w : A * ffmax;
    return dalloc(s, (void **)&s->mmh, 2 * s->mmh_cap, "f16 mat-mat activations", err);
}

/* s->mmh for a product that reads n_x rows of ne0 values, or NULL if they do not fit. */
static __half *mmh_for(const struct gpu_state *s, int64_t n_x, int64_t ne0)
{
    return s->mmh && (size_t)(n_x * ne0) <= s->mmh_cap ? s->mmh : NULL;
}

static void gpu_free(void *state)
{
    struct gpu_state *s = (struct gpu_state *)state;
    if (!s)
        return;
    if (s->prof && s->n_ops)
        prof_report(s);
#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
    strata_tl_close();
#endif
    if (s->step_traced) {
        static const char *const stage[7] = {"norm+qkv", "qk norm+rope", "attention",
                                             "attn_output", "norm+router", "top-k+gate/up",
                                             "down"};
        const double per = (double)s->step_traced * s->step.n_layer * 1e3;
        char line[512];
        int len = 0;
        for (int i = 0; i < 7 && len < (int)sizeof line; i++)
            len += snprintf(line + len, sizeof line - len, "%s %s %.2f (first part %.2f) + %.2f",
                            i ? "," : "", stage[i], s->step_work_ns[i] / per,
                            s->step_mid_ns[i] / per, s->step_wait_ns[i] / per);
        strata_log_info("decode step stages over %ld steps, µs a layer (block 0's work + "
                        "the barrier; thousands of clock cycles on HIP):%s", s->step_traced,
                        line);
    }
#ifdef STRATA_GPU_CUDA
    if (s->blas)
        s->blas_destroy(s->blas);
    if (s->blas_lib)
        dlclose(s->blas_lib);
#endif
    if (s->ev_ready)
        for (int i = 0; i < PROF_MAX_EV; i++)
            (void)cudaEventDestroy(s->ev[i]);
    graphs_drop(s);
    strata_gpu_ec_free(s->xc);
    for (size_t i = 0; i < s->n_allocs; i++)
        (void)cudaFree(s->allocs[i]);
    if (s->h_logits)
        (void)cudaFreeHost(s->h_logits);
    if (s->h_row)
        (void)cudaFreeHost(s->h_row);
    if (s->h_in)
        (void)cudaFreeHost(s->h_in);
    if (s->ctx.stream)
        (void)cudaStreamDestroy(s->ctx.stream);
    (void)cudaGetLastError();
    free(s->allocs);
    free(s->step_trace_host);
    free(s->layers);
    free(s);
}

/* Give back the host pages of weights that now live in VRAM: when they come from a
 * GGUF file's mapping, its pages leave the resident set (strata_gguf_drop_pages: read
 * again from the page cache or the file if the host ever needs them); an in-memory
 * image or a pack is left as it is.  Without this the dense weights stay resident
 * twice, in VRAM and in the mapping's pages the upload touched. */
static void host_pageout(const struct strata_model *m, const void *p, size_t bytes)
{
    (void)strata_gguf_drop_pages(m->gguf, p, bytes);
}

static void release_host_weights(const struct gpu_state *s)
{
    const struct strata_model *m = s->m;
    if (strata_k_env_on("STRATA_KEEP_HOST_WEIGHTS"))
        return;
    host_pageout(m, m->tok_embd.data, weight_bytes(&m->tok_embd));
    if (m->output.data != m->tok_embd.data)
        host_pageout(m, m->output.data, weight_bytes(&m->output));
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct strata_layer *L = &m->layers[il];
        const struct strata_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_gate,
                                           &L->ffn_up, &L->ffn_down, &L->ffn_gate_inp};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            host_pageout(m, w[i]->data, weight_bytes(w[i]));
        if (!s->xc) {
            /* every routed expert is in VRAM too */
            host_pageout(m, L->ffn_gate_exps.data, weight_bytes(&L->ffn_gate_exps));
            host_pageout(m, L->ffn_up_exps.data, weight_bytes(&L->ffn_up_exps));
            host_pageout(m, L->ffn_down_exps.data, weight_bytes(&L->ffn_down_exps));
        }
    }
}

/* The routed experts of a layer, stacked as stored. */
static int up_experts(struct gpu_state *s, const struct strata_layer *L, struct dev_layer *D,
                      struct strata_err *err)
{
    int rc = up_weight(s, &L->ffn_gate_exps, &D->gate_exps, err);
    if (!rc)
        rc = up_weight(s, &L->ffn_up_exps, &D->up_exps, err);
    if (!rc)
        rc = up_weight(s, &L->ffn_down_exps, &D->down_exps, err);
    return rc;
}

/* With expert cache options (o->backend_cfg, struct strata_ec_cfg): plan the memory;
 * the experts go to a slot pool when they do not all fit, else to VRAM as usual. */
static int place_experts(struct gpu_state *s, const struct strata_engine_opts *o,
                         struct strata_pool *pool, struct strata_err *err)
{
    const struct strata_model *m = s->m;
    struct strata_gpu_ec_in in;
    memset(&in, 0, sizeof(in));
    struct strata_k_weight *gi =
        (struct strata_k_weight *)calloc(m->hp.n_layer, sizeof(struct strata_k_weight));
    if (!gi)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    uint64_t exp_bytes = 0;
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const struct strata_layer *L = &m->layers[il];
        gi[il] = s->layers[il].gate_inp;
        if (L->is_moe)
            exp_bytes += (uint64_t)m->hp.n_expert *
                         (L->ffn_gate_exps.nb1 * L->ffn_gate_exps.ne[1] +
                          L->ffn_up_exps.nb1 * L->ffn_up_exps.ne[1] +
                          L->ffn_down_exps.nb1 * L->ffn_down_exps.ne[1]);
    }
    in.ctx = &s->ctx;
    in.m = m;
    in.cfg = (const struct strata_ec_cfg *)o->backend_cfg;
    in.pool = pool;
    in.pack = o->pack;
    in.gate_inp = gi;
    in.n_ub = s->n_ub;
    in.n_ctx = s->n_ctx;
    in.mv_max = MATVEC_MAX;
    in.use_q8 = s->use_q8;
    in.vram_free = s->ctx.info.vram_free;
    in.kv_bytes = 2 * sizeof(__half) * (uint64_t)m->hp.n_layer * s->n_ctx * s->n_kv;
    uint64_t total = strata_model_total_bytes(m);
    in.dense_bytes = total > exp_bytes ? total - exp_bytes : 0;
    if (in.dense_bytes + in.kv_bytes > s->vram_bytes)
        in.dense_bytes = s->vram_bytes > in.kv_bytes ? s->vram_bytes - in.kv_bytes : 0;
    in.scratch_bytes = s->vram_bytes - in.dense_bytes - in.kv_bytes;
    int rc = strata_gpu_ec_create(&s->xc, &in, err);
    free(gi);
    if (rc || s->xc) {
        /* the expert kernels read the slot pool through these views; the copies and
         * the host work between layers do not fit in a graph, except in one-token
         * steps through the expert table, which needs the 8-bit expert kernels */
        int tab_ok = s->xc && strata_gpu_ec_graph_mode(s->xc);
        for (uint32_t il = 0; s->xc && il < m->hp.n_layer; il++)
            if (m->layers[il].is_moe) {
                struct dev_layer *D = &s->layers[il];
                strata_gpu_ec_views(s->xc, (int)il, &D->gate_exps, &D->up_exps,
                                    &D->down_exps);
                tab_ok = tab_ok && mvq_ok(s, &D->gate_exps, 1) && mvq_ok(s, &D->down_exps, 1) &&
                         D->gate_exps.ne1 % 32 == 0 && D->gate_exps.ne1 == D->down_exps.ne0;
            }
        if (s->xc && strata_gpu_ec_graph_mode(s->xc) && !tab_ok) {
            const char *dm = getenv("STRATA_EC_DECODE");
            if (dm && strcmp(dm, "graph") == 0)
                strata_log_warn("STRATA_EC_DECODE=graph: the experts' weight types have no "
                                "8-bit kernel; decode steps stay host-planned");
            strata_gpu_ec_graph_off(s->xc);
        }
        s->ec_graph = tab_ok;
        s->use_graph = s->use_graph && tab_ok;
        return rc;
    }
    for (uint32_t il = 0; il < m->hp.n_layer && !rc; il++)
        rc = up_experts(s, &m->layers[il], &s->layers[il], err);
    return rc;
}

static int blas_warm(struct gpu_state *s, struct strata_err *err);

/* The q/k norm + RoPE (qa) and attention (aa) arguments of layer D for a batch of n
 * tokens whose attention reads up to max_kv positions: what launch_forward launches, and
 * what the fused decode step runs for one token.  The attention merges its splits and
 * writes attn_output's 8-bit rows itself for mat-vec batches (STRATA_NO_ATTQ=1: not). */
static void layer_attn_args(const struct gpu_state *s, const struct dev_layer *D, int n,
                            int max_kv, struct strata_k_qkv_args *qa,
                            struct strata_k_attn_args *aa)
{
    /* q, k, v of token t: row t of [n, n_q + 2 n_kv] */
    const int qs = s->n_q + 2 * s->n_kv;
    memset(qa, 0, sizeof(*qa));
    qa->q = s->q;
    qa->k = s->q + s->n_q;
    qa->v = qa->k + s->n_kv;
    qa->q_stride = qa->k_stride = qa->v_stride = qs;
    qa->q_norm = D->q_norm;
    qa->k_norm = D->k_norm;
    qa->eps = s->eps;
    qa->rope = &s->rope;
    qa->pos0 = s->pos0;
    qa->n_tok = n;
    qa->n_head = s->n_head;
    qa->n_head_kv = s->n_head_kv;
    qa->hd = s->hd;
    qa->k_cache = D->k_cache;
    qa->v_cache = D->v_cache;
    memset(aa, 0, sizeof(*aa));
    aa->q = s->q;
    aa->q_stride = qs;
    aa->k_cache = D->k_cache;
    aa->v_cache = D->v_cache;
    aa->out = s->att;
    aa->pos0 = s->pos0;
    aa->n_tok = n;
    aa->n_head = s->n_head;
    aa->n_head_kv = s->n_head_kv;
    aa->hd = s->hd;
    aa->max_kv = max_kv;
    aa->n_split = n <= MATVEC_MAX ? s->n_split : 1;
    aa->scale = 1.0f / sqrtf((float)s->hd);
    aa->scratch = s->attn_scratch;
    aa->split_keys = s->att_split_keys;
    aa->mma = s->att_mma && n > MATVEC_MAX;
    if (s->attn_q8 && n <= MATVEC_MAX) {
        aa->counters = s->attn_cnt;
        if (mvq_ok(s, &D->wo, n) && s->hd % 32 == 0) {
            aa->out_q8 = s->attq;
            aa->out_q8_row = (int64_t)strata_k_q8_row_bytes(s->n_q);
        }
    }
}

/* w as a product of the fused decode step: tpr for k experts summed per row (1: PLAIN
 * or GLU), R rows per lane group (PLAIN and COMBINE: the fewest that cover the rows in
 * one pass of the step's groups; GLU: max(1, tpr / 8)).  0 if the 8-bit kernels cannot
 * take w (type, alignment). */
static int step_mv(const struct gpu_state *s, const struct strata_k_weight *w,
                   const struct strata_k_weight *up, int k, int blocks,
                   struct strata_k_step_mv *m)
{
    if (!mvq_ok(s, w, 1) || w->ne0 % 32 || (uintptr_t)w->data & 15 || w->nb1 & 1 || w->nb2 & 1 ||
        ((w->type == STRATA_TYPE_Q4_K || w->type == STRATA_TYPE_Q5_K) &&
         (w->nb1 & 15 || w->nb2 & 15)))
        return 0;
    if (up && (up->type != w->type || up->ne0 != w->ne0 || up->ne1 != w->ne1 ||
               up->nb1 != w->nb1 || up->nb2 != w->nb2 || (uintptr_t)up->data & 15 ||
               w->ne1 % 32))
        return 0;
    memset(m, 0, sizeof(*m));
    m->w = (const uint8_t *)w->data;
    m->u = up ? (const uint8_t *)up->data : NULL;
    m->nb1 = w->nb1;
    m->nb2 = w->nb2;
    m->type = w->type;
    m->ne1 = (int)w->ne1;
    m->nu = (int)(w->ne0 / 32);
    m->tpr = strata_k_mvq_tpr(m->nu, k);
    if (up) {
        m->R = m->tpr / 8 > 1 ? m->tpr / 8 : 1;
    } else {
        const int gpp = blocks * STRATA_GPU_BLOCK / m->tpr;
        m->R = 1;
        while (m->R < 4 && (m->ne1 + m->R - 1) / m->R > gpp)
            m->R *= 2;
    }
    return 1;
}

/* The scale of the routed experts' weights (GGUF expert_weights_scale; 0: none) */
static float expert_wscale(const struct strata_hparams *hp)
{
    return hp->expert_weights_scale > 0 ? hp->expert_weights_scale : 1.0f;
}

/* Set up the fused decode step (STRATA_FUSED_STEP=1) when this model and configuration
 * can take it: every layer MoE with an F32 router and 8-bit products, the default decode
 * kernels (8-bit attention output, fused routing, norms by their own launch), every
 * expert in VRAM, a device that launches cooperative grids.  Otherwise, or when its
 * tables cannot be allocated, s->step_blocks stays 0 (the separate launches) and the
 * log says why; it never fails the backend. */
static void step_setup(struct gpu_state *s)
{
    const struct strata_hparams *hp = &s->m->hp;
    const char *bl = getenv("STRATA_STEP_BLOCKS");
    struct strata_k_step_args *a = &s->step;
    struct strata_err err = {0, ""};
    struct strata_k_step_layer *ly = NULL;
    int coop = 0, blocks = 0;
    s->step_blocks = 0;
    if (!strata_k_env_on("STRATA_FUSED_STEP"))
        return;
    if (cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, s->ctx.info.device) !=
        cudaSuccess)
        coop = 0;
    (void)cudaGetLastError();
    if (s->xc || s->fuse || !s->fuse_route || !s->attn_q8 || !s->use_q8 || hp->n_layer == 0 ||
        !coop ||
        !strata_k_decode_step_supported(s->n_embd, s->hd, s->n_ff_exp, s->n_expert, s->n_used))
        goto off;
    memset(a, 0, sizeof(*a));
    a->n_layer = (int)hp->n_layer;
    a->n_embd = s->n_embd;
    a->n_q = s->n_q;
    a->n_expert = s->n_expert;
    a->k = s->n_used;
    a->norm_topk = hp->expert_weights_norm;
    a->hd = s->hd;
    a->n_ff_exp = s->n_ff_exp;
    a->eps = s->eps;
    a->wscale = expert_wscale(hp);
    a->rope = s->rope;
    a->x = s->x;
    a->logits = s->router;
    a->eids = s->eids;
    a->ew = s->ew;
    a->attq = s->attq;
    a->actq = s->actq;
    a->dry = strata_k_env_on("STRATA_STEP_DRY");
    blocks = strata_k_decode_step_blocks(&s->ctx, a, bl && *bl ? atoi(bl) : 0);
    ly = (struct strata_k_step_layer *)calloc(hp->n_layer, sizeof(*ly));
    if (blocks <= 0 || !ly)
        goto off;
    for (int il = 0; il < a->n_layer; il++) {
        const struct dev_layer *D = &s->layers[il];
        struct strata_k_step_layer *Y = &ly[il];
        int ok = D->is_moe && D->gate_inp.type == STRATA_TYPE_F32 &&
                 D->gate_inp.ne0 == s->n_embd && D->gate_inp.ne1 == s->n_expert &&
                 D->gate_inp.nb1 == 4 * (size_t)s->n_embd && !((uintptr_t)D->gate_inp.data & 15) &&
                 D->gate_exps.ne1 == s->n_ff_exp && D->down_exps.ne0 == s->n_ff_exp &&
                 D->down_exps.ne1 == s->n_embd && step_mv(s, &D->wo, NULL, 1, blocks, &Y->wo) &&
                 step_mv(s, &D->gate_exps, &D->up_exps, 1, blocks, &Y->gate_up) &&
                 step_mv(s, &D->down_exps, NULL, s->n_used, blocks, &Y->down);
        if (D->n_qkv == 3) {
            ok = ok && step_mv(s, &D->wqkv, NULL, 1, blocks, &Y->qkv[0]);
            Y->n_qkv = 1;
        } else if (D->n_qkv == 2) {
            ok = ok && step_mv(s, &D->wqkv, NULL, 1, blocks, &Y->qkv[0]) &&
                 step_mv(s, &D->wv, NULL, 1, blocks, &Y->qkv[1]);
            Y->qkv_col[1] = s->n_q + s->n_kv;
            Y->n_qkv = 2;
        } else {
            ok = ok && step_mv(s, &D->wq, NULL, 1, blocks, &Y->qkv[0]) &&
                 step_mv(s, &D->wk, NULL, 1, blocks, &Y->qkv[1]) &&
                 step_mv(s, &D->wv, NULL, 1, blocks, &Y->qkv[2]);
            Y->qkv_col[1] = s->n_q;
            Y->qkv_col[2] = s->n_q + s->n_kv;
            Y->n_qkv = 3;
        }
        Y->attn_norm = D->attn_norm;
        Y->ffn_norm = D->ffn_norm;
        Y->router = (const float *)D->gate_inp.data;
        layer_attn_args(s, D, 1, s->n_ctx, &Y->qa, &Y->aa);
        if (!ok || !Y->aa.out_q8 || !Y->aa.counters)
            goto off;
    }
    if (dalloc(s, (void **)&a->layers, sizeof(*ly) * hp->n_layer, "decode step tables", &err) ||
        dalloc(s, (void **)&a->bar, sizeof(*a->bar), "decode step barrier", &err) ||
        gpu_call(s, cudaMemcpy((void *)a->layers, ly, sizeof(*ly) * hp->n_layer,
                               cudaMemcpyHostToDevice),
                 "copy of the decode step tables", &err) ||
        gpu_call(s, cudaMemset(a->bar, 0, sizeof(*a->bar)), "cudaMemset (decode step barrier)",
                 &err))
        goto off;
    if (strata_k_env_on("STRATA_STEP_TRACE")) {
        const size_t nt = 21 * (size_t)a->n_layer + 1;
        s->step_trace_host = (unsigned long long *)calloc(nt, sizeof(unsigned long long));
        if (!s->step_trace_host ||
            dalloc(s, (void **)&a->trace, sizeof(unsigned long long) * nt, "decode step trace",
                   &err) ||
            gpu_call(s, cudaMemset(a->trace, 0, sizeof(unsigned long long) * nt),
                     "cudaMemset (decode step trace)", &err)) {
            a->trace = NULL;
            strata_log_warn("decode step trace off: %s", err.msg[0] ? err.msg : "out of memory");
        }
    }
    s->step_blocks = blocks;
    strata_log_info("decode steps as one kernel: %d blocks of %d threads", blocks,
                    STRATA_GPU_BLOCK);
    if (a->dry)
        strata_log_warn("STRATA_STEP_DRY is set: decode steps skip every layer's work (the "
                        "barriers alone are timed); the text is garbage");
    free(ly);
    return;
off:
    free(ly);
    (void)cudaGetLastError();
    strata_log_info("STRATA_FUSED_STEP=1: this model or configuration cannot take the fused "
                    "decode step (%s); decode runs the separate launches",
                    err.msg[0] ? err.msg
                    : !coop ? "no cooperative launch on this device"
                    : s->xc ? "experts are offloaded"
                    : "its layers, types or switches (MoE layers with an F32 router and 8-bit "
                      "products, the default decode kernels)");
}

static int gpu_init(void **state, const struct strata_model *m, const struct strata_engine_opts *o,
                    struct strata_pool *pool, struct strata_err *err)
{
    *state = NULL;
    const struct strata_hparams *hp = &m->hp;
    struct gpu_state *s = (struct gpu_state *)calloc(1, sizeof(*s));
    if (!s)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    int rc = 0, n_dev = 0;
    int dev = o->device >= 0 ? o->device : 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        rc = strata_k_err(err, STRATA_E_GPU, "no %s device available%s%s",
                          STRATA_GPU_RUNTIME_NAME, e != cudaSuccess ? ": " : "",
                          e != cudaSuccess ? cudaGetErrorString(e) : "");
        goto out;
    }
    if (dev >= n_dev) {
        rc = strata_k_err(err, STRATA_E_INVALID, "device %d does not exist (%d %s device%s visible)",
                          dev, n_dev, STRATA_GPU_RUNTIME_NAME, n_dev == 1 ? "" : "s");
        goto out;
    }
    if ((rc = strata_gpu_info_query(dev, &s->ctx.info, err)) ||
        (rc = gpu_call(s, cudaSetDevice(dev), "cudaSetDevice", err)) ||
        (rc = strata_gpu_check_image(&s->ctx.info, err)))
        goto out;
    if ((rc = gpu_call(s, cudaSetDevice(dev), "cudaSetDevice", err)) ||
        (rc = gpu_call(s, cudaStreamCreateWithFlags(&s->ctx.stream, cudaStreamNonBlocking),
                       "cudaStreamCreate", err)))
        goto out;
#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
    strata_tl_open();
#endif
    {
        s->ctx.sync_debug = strata_k_env_on("STRATA_SYNC_DEBUG");
        s->prof = strata_k_env_on("STRATA_GPU_PROFILE");
        s->use_q8 = !strata_k_env_on("STRATA_NO_MVQ");
        s->fuse = strata_k_env_on("STRATA_FUSE");
        s->blas_f32 = !strata_k_env_on("STRATA_NO_BLAS_F32");
        s->fuse_route = s->fuse || !strata_k_env_on("STRATA_NO_FUSE_ROUTE");
        s->norm_route = !strata_k_env_on("STRATA_NO_NORM_ROUTE");
        s->route_glu = !strata_k_env_on("STRATA_NO_ROUTE_GLU");
        s->next_l2 = !strata_k_env_on("STRATA_NO_NEXT_L2");
        s->norm_mv = !strata_k_env_on("STRATA_NO_NORM_MV");
        s->attn_q8 = !strata_k_env_on("STRATA_NO_ATTQ");
        s->qkv_post_fuse = strata_k_env_on("STRATA_QKV_POST_FUSE");
        s->v_fold = !strata_k_env_on("STRATA_NO_V_FOLD");
        s->fused_argmax = !strata_k_env_on("STRATA_NO_FUSED_ARGMAX");
        s->host_row = !strata_k_env_on("STRATA_NO_HOST_ROW");
        s->att_split_keys = strata_k_env_on("STRATA_ATT_LONG_SPLITS") ? 0 : 32;
        s->pin_in = !strata_k_env_on("STRATA_NO_PIN_IN");
        const char *tc = getenv("STRATA_MVQ_TPR"); /* lanes per row of the 8-bit mat-vecs */
        strata_k_mvq_set_tpr_cap(tc ? atoi(tc) : 32);
        const char *am = getenv("STRATA_ATT_MMA");
        s->att_mma = !(am && *am && strcmp(am, "0") == 0);
        /* programmatic dependent launches (sm_90+): each decode kernel is scheduled
         * while the one before it finishes; STRATA_NO_PDL=1 turns them off */
        s->ctx.pdl = !s->ctx.sync_debug && !strata_k_env_on("STRATA_NO_PDL") &&
                     strncmp(s->ctx.info.arch, "sm_", 3) == 0 && atoi(s->ctx.info.arch + 3) >= 90;
        s->use_graph = !s->ctx.sync_debug && !s->prof && !strata_k_env_on("STRATA_NO_GRAPH");
    }
    s->m = m;
    s->n_ctx = o->n_ctx;
    s->n_ub = o->n_prefill > 0 ? o->n_prefill : 512;
    s->n_embd = (int)hp->n_embd;
    s->n_head = (int)hp->n_head;
    s->n_head_kv = (int)hp->n_head_kv;
    s->hd = (int)hp->n_embd_head_k;
    s->n_q = s->n_head * s->hd;
    s->n_kv = s->n_head_kv * s->hd;
    s->n_vocab = (int)hp->n_vocab;
    s->n_expert = (int)hp->n_expert;
    s->n_used = (int)hp->n_expert_used;
    s->n_ff = (int)hp->n_ff;
    s->n_ff_exp = (int)hp->n_ff_exp;
    s->eps = hp->f_norm_rms_eps;
    if (hp->n_embd_head_v != hp->n_embd_head_k || s->hd > 128) {
        rc = strata_k_err(err, STRATA_E_UNSUPPORTED,
                          "head dims k=%u v=%u: the GPU attention needs equal dims <= 128",
                          hp->n_embd_head_k, hp->n_embd_head_v);
        goto out;
    }
    if (s->n_expert && hp->expert_gating != STRATA_GATING_SOFTMAX) {
        rc = strata_k_err(err, STRATA_E_UNSUPPORTED, "expert gating %d is not on the GPU yet",
                          hp->expert_gating);
        goto out;
    }
    strata_k_rope_init(&s->rope, hp->rope_type, (int)hp->n_rot, hp->rope_freq_base,
                       hp->rope_freq_scale > 0 ? hp->rope_freq_scale : 1.0f,
                       (int)(hp->n_ctx_orig_yarn ? hp->n_ctx_orig_yarn : hp->n_ctx_train),
                       hp->rope_scaling == STRATA_ROPE_SCALING_YARN ? hp->yarn_ext_factor : 0.0f,
                       hp->yarn_attn_factor > 0 ? hp->yarn_attn_factor : 1.0f,
                       hp->yarn_beta_fast, hp->yarn_beta_slow);
    {
        int per = s->n_head_kv * ((s->n_head / s->n_head_kv + 31) / 32);
        int ns = per > 0 ? s->ctx.info.n_sm / per : 1;
        s->n_split = ns < 1 ? 1 : ns > 32 ? 32 : ns;
    }

    if ((rc = up_weight(s, &m->tok_embd, &s->tok_embd, err)))
        goto out;
    if (m->output.data == m->tok_embd.data)
        s->output = s->tok_embd;
    else if ((rc = up_weight(s, &m->output, &s->output, err)))
        goto out;
    if ((rc = up_vec(s, &m->output_norm, &s->output_norm, err)))
        goto out;
    s->layers = (struct dev_layer *)calloc(hp->n_layer, sizeof(struct dev_layer));
    if (!s->layers) {
        rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const struct strata_layer *L = &m->layers[il];
        struct dev_layer *D = &s->layers[il];
        if (L->bq.data || L->bk.data || L->bv.data || L->ffn_gate_inp_shexp.data) {
            rc = strata_k_err(err, STRATA_E_UNSUPPORTED,
                              "layer %u: q/k/v biases and shared experts are not on the GPU yet",
                              il);
            goto out;
        }
        if ((rc = up_vec(s, &L->attn_norm, &D->attn_norm, err)) ||
            (rc = up_vec(s, &L->ffn_norm, &D->ffn_norm, err)) ||
            (rc = up_vec(s, &L->attn_q_norm, &D->q_norm, err)) ||
            (rc = up_vec(s, &L->attn_k_norm, &D->k_norm, err)) ||
            (rc = up_weight(s, &L->wq, &D->wq, err)) || (rc = up_weight(s, &L->wk, &D->wk, err)) ||
            (rc = up_weight(s, &L->wv, &D->wv, err)) || (rc = up_weight(s, &L->wo, &D->wo, err)) ||
            (rc = up_weight(s, &L->ffn_gate, &D->gate, err)) ||
            (rc = up_weight(s, &L->ffn_up, &D->up, err)) ||
            (rc = up_weight(s, &L->ffn_down, &D->down, err)) ||
            (rc = up_weight(s, &L->ffn_gate_inp, &D->gate_inp, err)) ||
            (!o->backend_cfg && (rc = up_experts(s, L, D, err))))
            goto out;
        D->is_moe = L->is_moe;
        if ((rc = fuse_qkv(s, L, D, err)))
            goto out;
        size_t kvb = sizeof(__half) * (size_t)s->n_ctx * s->n_kv;
        if ((rc = dalloc(s, (void **)&D->k_cache, kvb, "kv cache", err)) ||
            (rc = dalloc(s, (void **)&D->v_cache, kvb, "kv cache", err)))
            goto out;
    }
    {
        size_t T = (size_t)s->n_ub, A = T * (s->n_used > 0 ? s->n_used : 1);
        size_t ffmax = (size_t)(s->n_ff > s->n_ff_exp ? s->n_ff : s->n_ff_exp);
        s->max_tiles = s->n_expert ? strata_k_moe_max_tiles((int)A, s->n_expert) : 1;
        size_t sb = strata_k_attn_scratch_bytes(MATVEC_MAX, s->n_head, s->hd, s->n_split);
        if ((rc = dalloc(s, (void **)&s->x, 4 * T * s->n_embd, "activations", err)) ||
            (rc = dalloc(s, (void **)&s->xn, 4 * T * s->n_embd, "activations", err)) ||
            (rc = dalloc(s, (void **)&s->q, 4 * T * (s->n_q + 2 * s->n_kv), "activations",
                         err)) ||
            (rc = dalloc(s, (void **)&s->att, 4 * T * s->n_q, "activations", err)) ||
            (rc = dalloc(s, (void **)&s->router, 4 * T * (s->n_expert + 1), "router", err)) ||
            (rc = dalloc(s, (void **)&s->ew, 4 * A, "router", err)) ||
            (rc = dalloc(s, (void **)&s->eids, 4 * A, "router", err)) ||
            (rc = dalloc(s, (void **)&s->perm, 4 * A, "router", err)) ||
            (rc = dalloc(s, (void **)&s->tiles, 12 * (size_t)s->max_tiles, "router", err)) ||
            (rc = dalloc(s, (void **)&s->n_tiles, 4, "router", err)) ||
            (rc = dalloc(s, (void **)&s->act, 4 * A * ffmax, "ffn activations", err)) ||
            (rc = dalloc(s, (void **)&s->eout, 4 * A * s->n_embd, "expert outputs", err)) ||
            (rc = dalloc(s, (void **)&s->logits, 4 * T * s->n_vocab, "logits", err)) ||
            (rc = dalloc(s, (void **)&s->attn_scratch, sb, "attention scratch", err)) ||
            (rc = dalloc(s, (void **)&s->xq, MATVEC_MAX * strata_k_q8_row_bytes(s->n_embd),
                         "8-bit activations", err)) ||
            (rc = dalloc(s, (void **)&s->attq, MATVEC_MAX * strata_k_q8_row_bytes(s->n_q),
                         "8-bit activations", err)) ||
            (rc = dalloc(s, (void **)&s->actq,
                         MATVEC_MAX * (A / T) * strata_k_q8_row_bytes((int64_t)ffmax),
                         "8-bit activations", err)) ||
            (rc = dalloc(s, (void **)&s->norm_cnt, 2 * sizeof(int) * MATVEC_MAX,
                         "epilogue counters", err)) ||
            (rc = mmh_alloc(s, T, A, ffmax, err)) ||
            (rc = gpu_call(s, cudaMemset(s->norm_cnt, 0, 2 * sizeof(int) * MATVEC_MAX),
                           "cudaMemset (epilogue counters)", err)) ||
            (rc = dalloc(s, (void **)&s->attn_cnt,
                         sizeof(int) * strata_k_attn_counters(MATVEC_MAX, s->n_head,
                                                              s->n_head_kv),
                         "attention counters", err)) ||
            (rc = gpu_call(s, cudaMemset(s->attn_cnt, 0,
                                         sizeof(int) * strata_k_attn_counters(
                                                           MATVEC_MAX, s->n_head, s->n_head_kv)),
                           "cudaMemset (attention counters)", err)) ||
            (rc = dalloc(s, (void **)&s->post_cnt,
                         sizeof(int) * (size_t)(s->n_head + 2 * s->n_head_kv),
                         "q/k/v post counters", err)) ||
            (rc = gpu_call(s, cudaMemset(s->post_cnt, 0,
                                         sizeof(int) * (size_t)(s->n_head + 2 * s->n_head_kv)),
                           "cudaMemset (q/k/v post counters)", err)) ||
            (rc = dalloc(s, (void **)&s->pos0, 4 * (T + 1), "positions and token ids", err)) ||
            (rc = gpu_call(s, cudaMallocHost((void **)&s->h_in, 4 * (T + 1)),
                           "cudaMallocHost (positions and token ids)", err)))
            goto out;
        s->ids = s->pos0 + 1;
    }
#ifdef STRATA_GPU_CUDA
    blas_open(s);
    if (s->blas) {
        size_t wmax = 0, xmax = (size_t)s->n_embd;
        for (uint32_t il = 0; il < hp->n_layer; il++) {
            const struct dev_layer *D = &s->layers[il];
            const struct strata_k_weight *ws[] = {&D->wqkv, &D->wq, &D->wv, &D->wo, &D->gate,
                                                  &D->down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
                if (ws[i]->data && (size_t)(ws[i]->ne0 * ws[i]->ne1) > wmax)
                    wmax = (size_t)(ws[i]->ne0 * ws[i]->ne1);
            if ((size_t)s->n_q > xmax)
                xmax = (size_t)s->n_q;
            if ((size_t)s->n_ff > xmax)
                xmax = (size_t)s->n_ff;
        }
        s->wh_cap = wmax;
        s->xh_cap = xmax * (size_t)s->n_ub;
        if ((rc = dalloc(s, (void **)&s->wh, 2 * s->wh_cap, "f16 weight scratch", err)) ||
            (rc = dalloc(s, (void **)&s->xh, 2 * s->xh_cap, "f16 activation scratch", err)))
            goto out;
    }
#endif
    /* the row mapped for the output projection's writes, else plain pinned memory that
     * the row is copied into (d_row stays NULL) */
    if (cudaHostAlloc((void **)&s->h_row, 4 * (size_t)s->n_vocab, cudaHostAllocMapped) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        s->h_row = NULL;
        if ((rc = gpu_call(s, cudaMallocHost((void **)&s->h_row, 4 * (size_t)s->n_vocab),
                           "cudaMallocHost (logits row)", err)))
            goto out;
        s->host_row = 0;
    }
    if ((rc = gpu_call(s, cudaMallocHost((void **)&s->h_logits,
                                         4 * (size_t)(2 * STRATA_K_TOPK_MAX + 2)),
                       "cudaMallocHost (logits)", err)) ||
        (rc = dalloc(s, (void **)&s->d_amax, 256, "argmax id", err)) ||
        (rc = dalloc(s, (void **)&s->d_key, 256, "argmax key", err)) ||
        (rc = dalloc(s, (void **)&s->d_topk, TOPK_BYTES, "top-k logits", err)))
        goto out;
    if ((o->backend_cfg && (rc = place_experts(s, o, pool, err))) || (rc = blas_warm(s, err)))
        goto out;
    if (s->host_row && cudaHostGetDevicePointer((void **)&s->d_row, s->h_row, 0) != cudaSuccess) {
        (void)cudaGetLastError(); /* not mapped here: the row is copied */
        s->d_row = NULL;
    }
    release_host_weights(s);
    step_setup(s);
    strata_log_info("%s backend on device %d: %s (%s, %d SMs, warp %d), %.1f MiB of VRAM for "
                    "weights, kv cache (%d positions) and scratch (%d tokens)",
                    STRATA_GPU_RUNTIME_NAME, dev, s->ctx.info.name, s->ctx.info.arch,
                    s->ctx.info.n_sm, s->ctx.info.warp_size, s->vram_bytes / 1048576.0, s->n_ctx,
                    s->n_ub);
    *state = s;
    s = NULL;
out:
    gpu_free(s);
    return rc;
}

/* y [n, w->ne1] (+)= W x for n tokens, rows of x n_in floats apart. */
#ifdef STRATA_GPU_CUDA
/* y [n x ne1] (row stride y_stride) = beta y + x [n x ne0] W^T by cublasGemmEx, W [ne1 rows
 * of ne0] of type wt at wd as stored, x of type xt at xd (row stride ldx), FP32 sums:
 * column-major C [ne1 x n] = W^T-as-stored [ne1 x ne0] * X [ne0 x n]. */
static int blas_gemm(struct gpu_state *s, const struct strata_k_weight *w, int n, const void *wd,
                     cudaDataType wt, const void *xd, int64_t ldx, cudaDataType xt, float beta,
                     float *y, int64_t y_stride, struct strata_err *err)
{
    const float one = 1.0f;
    cublasStatus_t st = s->blas_gemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->ne1, n,
                                     (int)w->ne0, &one, wd, wt, (int)w->ne0, xd, xt, (int)ldx,
                                     &beta, y, CUDA_R_32F, (int)y_stride, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return strata_k_err(err, STRATA_E_GPU,
                            "cublasGemmEx (%s) [%lld x %lld] x %d tokens on device %d (%s): "
                            "status %d", wt == CUDA_R_32F ? "FP32" : "FP16", (long long)w->ne1,
                            (long long)w->ne0, n, s->ctx.info.device, s->ctx.info.name, (int)st);
    return strata_k_check(&s->ctx, "cublasGemmEx", dim3(1), dim3(1), err,
                          "ne0=%lld ne1=%lld n=%d", (long long)w->ne0, (long long)w->ne1, n);
}
#endif

static int proj(struct gpu_state *s, const struct strata_k_weight *w, const float *x,
                int64_t x_stride, int n, float *y, int64_t y_stride, const float *add,
                struct strata_err *err);

/* The router of a full prefill chunk once, on zeros, at start: cuBLAS loads the kernels
 * of a shape on its first use, which cost a process's first 2,048-token chunk about 60
 * ms on the H200 (pp2048 12.7k tok/s against 19.8k with the router off cuBLAS). */
static int blas_warm(struct gpu_state *s, struct strata_err *err)
{
#ifdef STRATA_GPU_CUDA
    if (!s->blas || !s->blas_f32 || s->n_ub <= MATVEC_MAX)
        return 0;
    for (uint32_t il = 0; il < s->m->hp.n_layer; il++) {
        const struct dev_layer *D = &s->layers[il];
        if (!D->is_moe || !D->gate_inp.data || D->gate_inp.type != STRATA_TYPE_F32)
            continue;
        int rc = gpu_call(s, cudaMemsetAsync(s->xn, 0, 4 * (size_t)s->n_ub * s->n_embd,
                                             s->ctx.stream), "cudaMemset (activations)", err);
        if (!rc)
            rc = proj(s, &D->gate_inp, s->xn, s->n_embd, s->n_ub, s->router, s->n_expert, NULL,
                      err);
        if (!rc)
            rc = gpu_call(s, cudaStreamSynchronize(s->ctx.stream), "router warm-up", err);
        return rc;
    }
#else
    (void)s;
    (void)err;
#endif
    return 0;
}

static int proj(struct gpu_state *s, const struct strata_k_weight *w, const float *x,
                int64_t x_stride, int n, float *y, int64_t y_stride, const float *add,
                struct strata_err *err)
{
#ifdef STRATA_GPU_CUDA
    if (s->blas && s->blas_f32 && n > MATVEC_MAX && w->type == STRATA_TYPE_F32 && !add &&
        w->nb1 == 4 * (size_t)w->ne0)
        /* F32 weights (the MoE router, 128 rows: too few for the f16 path's tiles, and
         * the built-in mat-mat kernel would give it only ne1 / 64 x n / 64 blocks) as
         * stored, in FP32 */
        return blas_gemm(s, w, n, w->data, CUDA_R_32F, x, x_stride, CUDA_R_32F, 0.0f, y,
                         y_stride, err);
    if (s->blas && n > MATVEC_MAX && (!add || add == y) && w->ne0 % 8 == 0 && y_stride % 4 == 0 &&
        (size_t)(w->ne0 * w->ne1) <= s->wh_cap && (size_t)(w->ne0 * n) <= s->xh_cap &&
        w->ne1 >= 256) {
        int rc = strata_k_dequant_f16(&s->ctx, w, 0, s->wh, err);
        if (!rc)
            rc = strata_k_to_f16(&s->ctx, x, x_stride, n, (int)w->ne0, s->xh, err);
        if (rc)
            return rc;
        return blas_gemm(s, w, n, s->wh, CUDA_R_16F, s->xh, w->ne0, CUDA_R_16F, add ? 1.0f : 0.0f,
                         y, y_stride, err);
    }
#endif
    if (n > MATVEC_MAX && w->ne0 % 64 == 0) {
        struct strata_k_mm_args a;
        memset(&a, 0, sizeof(a));
        a.w = w;
        a.n_tok = n;
        a.x = x;
        a.x_stride = x_stride;
        a.y = y;
        a.y_stride = y_stride;
        a.add = add;
        a.xh = mmh_for(s, n, w->ne0);
        return strata_k_matmul(&s->ctx, &a, err);
    }
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof(a));
    a.w = w;
    a.n_slot = n;
    a.x_group = 1;
    a.x = x;
    a.x_stride = x_stride;
    a.y = y;
    a.y_stride = y_stride;
    a.add = add;
    return strata_k_matvec(&s->ctx, &a, err);
}

/* silu(G x) * (U x) for n inputs; experts: ids [n * k] pick the matrices, input rows
 * shared by k slots. */
static int glu(struct gpu_state *s, const struct strata_k_weight *g, const struct strata_k_weight *u,
               const float *x, int n, int k, const int32_t *ids, float *y, struct strata_err *err)
{
    int rows = n * k;
    if (n > MATVEC_MAX && g->ne0 % 64 == 0) {
        struct strata_k_mm_args a;
        memset(&a, 0, sizeof(a));
        a.w = g;
        a.up = u;
        a.glu = 1;
        a.n_tok = rows;
        if (ids) {
            a.perm = s->perm;
            a.tiles = s->tiles;
            a.n_tiles = s->n_tiles;
            a.max_tiles = strata_k_moe_max_tiles(rows, s->n_expert);
            a.x_div = k;
        }
        a.x = x;
        a.x_stride = g->ne0;
        a.y = y;
        a.y_stride = g->ne1;
        a.xh = mmh_for(s, n, g->ne0);
        return strata_k_matmul(&s->ctx, &a, err);
    }
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof(a));
    a.w = g;
    a.up = u;
    a.glu = 1;
    a.ids = ids;
    a.n_slot = rows;
    a.x_group = k;
    a.x = x;
    a.x_stride = g->ne0;
    a.y = y;
    a.y_stride = g->ne1;
    return strata_k_matvec(&s->ctx, &a, err);
}

/* The routed experts' down projections: y[i] = W_{ids[i]} x[i], i < rows. */
static int down_exps(struct gpu_state *s, const struct strata_k_weight *w, const float *x,
                     int n_tok, int rows, float *y, struct strata_err *err)
{
    if (n_tok > MATVEC_MAX && w->ne0 % 64 == 0) {
        struct strata_k_mm_args a;
        memset(&a, 0, sizeof(a));
        a.w = w;
        a.n_tok = rows;
        a.perm = s->perm;
        a.tiles = s->tiles;
        a.n_tiles = s->n_tiles;
        a.max_tiles = strata_k_moe_max_tiles(rows, s->n_expert);
        a.x_div = 1;
        a.x = x;
        a.x_stride = w->ne0;
        a.y = y;
        a.y_stride = w->ne1;
        a.xh = mmh_for(s, rows, w->ne0);
        return strata_k_matmul(&s->ctx, &a, err);
    }
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof(a));
    a.w = w;
    a.ids = s->eids;
    a.n_slot = rows;
    a.x_group = 1;
    a.x = x;
    a.x_stride = w->ne0;
    a.y = y;
    a.y_stride = w->ne1;
    return strata_k_matvec(&s->ctx, &a, err);
}

/* RMSNorm of n rows of x into s->xn, and into s->xq as 8-bit rows when q8 (for the
 * mat-vec products that read them); the float rows are the same either way. */
static int norm_rows(struct gpu_state *s, const float *x, const float *w, int n, int q8,
                     struct strata_err *err)
{
    if (q8)
        return strata_k_quantize_q8(&s->ctx, x, s->n_embd, s->n_embd, n, 1, w, s->eps, s->xn,
                                    s->xq, err);
    return strata_k_rms_norm(&s->ctx, x, w, s->xn, s->n_embd, n, s->eps, err);
}

/* proj on the normed rows: from s->xq when w takes 8-bit activations (and norm_rows
 * wrote them), else from s->xn.  nn (or NULL): the rows are x_in, normed by this launch
 * (strata_k_mvq_args.in_norm; w must take 8-bit activations), which also leaves them in
 * s->xn and s->xq. */
/* What a q/k/v product may do besides its rows (proj_nn; strata_k_mvq_args.post, .w2
 * and .y16): post_done, w2_done and v_done say what it did. */
struct proj_qkv {
    const struct strata_k_qkv_args *post; /* the q/k/v post of its heads, or NULL */
    int post_done;
    const struct strata_k_weight *w2; /* v of another type, its rows after w's, or NULL */
    int w2_done;
    __half *v_cache; /* its rows are v rows: stored into the v cache too, or NULL */
    int v_done;
    /* the output projection's argmax key (strata_k_mvq_args.argmax_key), or NULL */
    unsigned long long *argmax_key;
    int argmax_done;
    /* its row written to mapped host memory too (strata_k_mvq_args.y_host), or NULL */
    float *y_host;
    int y_host_done;
};

static int proj_nn(struct gpu_state *s, const struct strata_k_weight *w, int n, float *y,
                   int64_t y_stride, const float *add, const float *x_in, const float *nw,
                   struct proj_qkv *pq, struct strata_err *err)
{
    if (pq)
        pq->post_done = pq->w2_done = pq->v_done = pq->argmax_done = pq->y_host_done = 0;
    if (!mvq_ok(s, w, n)) {
        int rc = nw ? norm_rows(s, x_in, nw, n, 0, err) : 0;
        return rc ? rc : proj(s, w, s->xn, s->n_embd, n, y, y_stride, add, err);
    }
    struct strata_k_mvq_args a;
    struct strata_k_norm_q8 nn = {nw, s->eps, s->xn, s->xq};
    memset(&a, 0, sizeof(a));
    if (nw) {
        a.x_in = x_in;
        a.in_norm = &nn;
    }
    if (pq && pq->post) {
        a.post = pq->post;
        a.post_counters = s->post_cnt;
        a.post_done = &pq->post_done;
    }
    if (pq && pq->w2 && nw) {
        a.w2 = pq->w2;
        a.w2_done = &pq->w2_done;
    }
    if (pq && pq->argmax_key) {
        a.argmax_key = pq->argmax_key;
        a.argmax_done = &pq->argmax_done;
    }
    if (pq && pq->y_host) {
        a.y_host = pq->y_host;
        a.y_host_done = &pq->y_host_done;
    }
    if (pq && pq->v_cache) {
        a.y16 = pq->v_cache;
        a.y16_pos = s->pos0;
        a.y16_stride = (int64_t)s->n_head_kv * s->hd;
        pq->v_done = 1;
    }
    a.w = w;
    a.mode = STRATA_K_MVQ_PLAIN;
    a.n_slot = n;
    a.x_group = 1;
    a.xq = s->xq;
    a.y = y;
    a.y_stride = y_stride;
    a.add = add;
    return strata_k_matvec_q8(&s->ctx, &a, err);
}

static int proj_n(struct gpu_state *s, const struct strata_k_weight *w, int n, float *y,
                  int64_t y_stride, const float *add, struct strata_err *err)
{
    return proj_nn(s, w, n, y, y_stride, add, NULL, NULL, NULL, err);
}

/* Fuse the RMSNorm (weight nw) of the rows a mat-vec adds into s->x: the last block of
 * each token writes s->xn and s->xq, so that no norm launch follows. */
static void fuse_norm(struct gpu_state *s, struct strata_k_mvq_args *a, const float *nw)
{
    a->nw = nw;
    a->eps = s->eps;
    a->ny = s->xn;
    a->nyq = s->xq;
    a->counter = s->norm_cnt;
}

/* The most bytes of one weight a down launch asks L2 for (ffn_q8's next): the output
 * projection's first chunks; a q/k/v weight is smaller */
#define NEXT_L2_MAX ((size_t)16 << 20)

/* Whether ffn_q8 runs the FFN of gate g and down d for n tokens */
static int ffn_q8_ok(struct gpu_state *s, const struct strata_k_weight *g,
                     const struct strata_k_weight *d, int n)
{
    return mvq_ok(s, g, n) && mvq_ok(s, d, n) && g->ne1 % 32 == 0 && g->ne1 == d->ne0;
}

/* The FFN of a mat-vec batch on 8-bit activations where its weights allow: gate and up
 * (SwiGLU) from s->xq, written as 8-bit rows; then the down projection added to s->x,
 * for routed experts (ids, weights in s->eids, s->ew) with the weighted sum of the k
 * experts in the same launch, and with the next RMSNorm (weight next_nw) fused when
 * fuse_next.  Returns 1 (nothing launched) when the weights do not take this path.
 * route_logits (or NULL): one token's router logits, routed by the gate/up launch itself
 * (strata_k_mvq_args.route_logits), its ids and weights left in ids and s->ew.  next[2]
 * (entries may be NULL): the weights read next - the next layer's q/k/v, or the output
 * projection - that the down launch asks L2 for before its wait, at most NEXT_L2_MAX
 * bytes of each (strata_k_mvq_args.next_l2) */
static int ffn_q8(struct gpu_state *s, const struct strata_k_weight *g,
                  const struct strata_k_weight *u, const struct strata_k_weight *d, int n,
                  int k, const int32_t *ids, const void *const *etab, int etab_slot,
                  int fuse_next, const float *next_nw, const float *route_logits,
                  const struct strata_k_weight *const *next, int *rc, struct strata_err *err)
{
    if (!ffn_q8_ok(s, g, d, n))
        return 1;
    struct strata_k_mvq_args a;
    memset(&a, 0, sizeof(a));
    a.w = g;
    a.up = u;
    a.mode = STRATA_K_MVQ_GLU;
    a.ids = ids;
    a.etab = etab;
    a.etab_slot = etab_slot;
    a.n_slot = n * k;
    a.x_group = k;
    a.xq = s->xq;
    a.yq = s->actq;
    if (route_logits) {
        const struct strata_hparams *hp = &s->m->hp;
        a.route_logits = route_logits;
        a.route_n_expert = s->n_expert;
        a.route_norm = hp->expert_weights_norm;
        a.route_scale = expert_wscale(hp);
        a.route_w = s->ew;
    }
    prof_mark(s, ids ? "moe_gate_up" : "ffn_gate_up");
    if ((*rc = strata_k_matvec_q8(&s->ctx, &a, err)))
        return 0;
    memset(&a, 0, sizeof(a));
    a.w = d;
    a.mode = ids ? STRATA_K_MVQ_COMBINE : STRATA_K_MVQ_PLAIN;
    a.ids = ids;
    a.etab = etab;
    a.etab_slot = etab_slot;
    a.n_slot = n;
    a.x_group = 1;
    a.k = k;
    a.cw = s->ew;
    a.xq = s->actq;
    a.y = s->x;
    a.y_stride = s->n_embd;
    a.add = s->x;
    if (fuse_next)
        fuse_norm(s, &a, next_nw);
    for (int i = 0; i < 2 && s->next_l2; i++)
        if (next[i]) {
            const size_t b = (size_t)next[i]->ne1 * next[i]->nb1;
            a.next_l2[i] = next[i]->data;
            a.next_l2_bytes[i] = b < NEXT_L2_MAX ? b : NEXT_L2_MAX;
        }
    prof_mark(s, ids ? "moe_down_combine" : "ffn_down");
    *rc = strata_k_matvec_q8(&s->ctx, &a, err);
    return 0;
}

/* Launch the whole forward pass of n tokens on the stream (no synchronisation): token
 * ids in s->ids (or embeddings already in s->x), the first position in s->pos0.
 * Logits of the last token (all = 0) or of every token (all = 1) go to s->logits;
 * want_logits = 0 skips the output layer. */
static int launch_forward(struct gpu_state *s, int n, int have_embd, int want_logits, int all,
                          int for_host, int max_kv, struct strata_err *err)
{
    int rc = 0, normed = 0; /* normed: s->xn, s->xq hold the next norm (fused) */
    const int E = s->n_embd;
#define OP(name, call) (prof_mark(s, name), (rc = (call)))
    /* one row of logits reduced on the device: its argmax key too, for greedy steps
     * (s->key_ok; a row for the host needs none, nor the memset) */
    const int key = want_logits && (!all || n == 1) && s->fused_argmax && !for_host;
    /* and, where the host takes the row (for_host), the row itself written to s->h_row
     * by the launch (s->row_ok) */
    const int hrow = for_host && want_logits && (!all || n == 1) && s->d_row;
    s->key_ok = s->row_ok = 0;
    if (key && OP("argmax_key", gpu_call(s, cudaMemsetAsync(s->d_key, 0, sizeof(*s->d_key),
                                                            s->ctx.stream),
                                         "cudaMemsetAsync (argmax key)", err)))
        return rc;
    if (!have_embd && OP("get_rows", strata_k_get_rows(&s->ctx, &s->tok_embd, s->ids, n, s->x, err)))
        return strata_err_wrap(err, "token_embd: ");
    int il0 = 0; /* the first layer the separate launches run */
    if (n == 1 && s->step_blocks > 0 && max_kv == s->n_ctx) {
        if (!OP("decode_step", strata_k_decode_step(&s->ctx, &s->step, s->step_blocks, err))) {
            il0 = (int)s->m->hp.n_layer;
        } else if (rc == STRATA_E_UNSUPPORTED) {
            /* the launch was refused (a grid too large for what else runs on the device):
             * the separate launches from now on; a device fault stays an error */
            strata_log_warn("%s; decode runs the separate launches from now on", err->msg);
            s->step_blocks = 0;
            rc = 0;
            err->code = 0;
            err->msg[0] = '\0';
        } else {
            goto fail;
        }
    }
    for (int il = il0; il < (int)s->m->hp.n_layer; il++) {
        struct dev_layer *D = &s->layers[il];
        struct strata_k_qkv_args qa;
        struct strata_k_attn_args aa;
        /* q, k, v of token t: row t of [n, n_q + 2 n_kv] */
        const int qs = s->n_q + 2 * s->n_kv;
        float *q = s->q, *k = s->q + s->n_q, *v = k + s->n_kv;
        /* the attn_norm inside the first q8 product's launch (it leaves s->xn and s->xq
         * for the products after it) */
        const struct strata_k_weight *w1 = D->n_qkv ? &D->wqkv : &D->wq;
        const float *an = !normed && s->norm_mv && mvq_ok(s, w1, n) ? D->attn_norm : NULL;
        if (!normed && !an && OP("attn_norm", norm_rows(s, s->x, D->attn_norm, n,
                                                 mvq_ok(s, w1, n) || mvq_ok(s, &D->wk, n) ||
                                                     mvq_ok(s, &D->wv, n),
                                                 err)))
            goto fail;
        normed = 0;
        layer_attn_args(s, D, n, max_kv, &qa, &aa);
        /* the q/k/v post inside the merged product (q and k heads, and v's with it), a
         * separate v product's rows into the v cache: decode steps and verify windows */
        struct proj_qkv pq = {}, pv = {};
        if (n <= MATVEC_MAX && D->n_qkv >= 2) {
            pq.post = s->qkv_post_fuse ? &qa : NULL;
            pq.w2 = s->v_fold && D->n_qkv == 2 && mvq_ok(s, &D->wv, n) ? &D->wv : NULL;
            pv.v_cache = D->v_cache;
        }
        if (D->n_qkv) {
            if (OP(an ? "attn_norm_qkv" : "attn_qkv",
                   proj_nn(s, &D->wqkv, n, q, qs, NULL, s->x, an, &pq, err)))
                goto fail;
        } else if (OP(an ? "attn_norm_q" : "attn_q",
                      proj_nn(s, &D->wq, n, q, qs, NULL, s->x, an, NULL, err)) ||
                   OP("attn_k", proj_n(s, &D->wk, n, k, qs, NULL, err)))
            goto fail;
        if (D->n_qkv < 3 && !pq.w2_done &&
            OP("attn_v", proj_nn(s, &D->wv, n, v, qs, NULL, NULL, NULL,
                                 pq.post_done ? &pv : NULL, err)))
            goto fail;
        /* what the products did not do: every head, or the v heads */
        const int heads = s->n_head + 2 * s->n_head_kv;
        const int h0 = !pq.post_done                                 ? 0
                       : D->n_qkv == 3 || pq.w2_done || pv.v_done ? heads
                                                                     : s->n_head + s->n_head_kv;
        if (h0 < heads &&
            OP("qk_norm_rope_kv", strata_k_qkv_post_heads(&s->ctx, &qa, h0, heads, err)))
            goto fail;
        const int wo_q8 = mvq_ok(s, &D->wo, n);
        if (OP("attention", strata_k_attention(&s->ctx, &aa, err)))
            goto fail;
        if (wo_q8) {
            struct strata_k_mvq_args oa;
            memset(&oa, 0, sizeof(oa));
            oa.w = &D->wo;
            oa.n_slot = n;
            oa.x_group = 1;
            oa.xq = s->attq;
            oa.y = s->x;
            oa.y_stride = E;
            oa.add = s->x;
            if (s->fuse && mvq_ok(s, D->is_moe ? &D->gate_exps : &D->gate, n) && E % 32 == 0) {
                fuse_norm(s, &oa, D->ffn_norm);
                normed = 1;
            }
            if ((!aa.out_q8 &&
                 OP("attn_out_q8", strata_k_quantize_q8(&s->ctx, s->att, s->n_q, s->n_q, n, 0,
                                                        NULL, 0.0f, NULL, s->attq, err))) ||
                OP("attn_output", strata_k_matvec_q8(&s->ctx, &oa, err)))
                goto fail;
        } else if (OP("attn_output", proj(s, &D->wo, s->att, s->n_q, n, s->x, E, s->x, err)))
            goto fail;
        const int route1 = D->is_moe && s->fuse_route && n <= MATVEC_MAX &&
                           D->gate_inp.type == STRATA_TYPE_F32 && E % 4 == 0;
        const int fq8 = mvq_ok(s, D->is_moe ? &D->gate_exps : &D->gate, n);
        /* the ffn_norm inside the router's launch (moe_router_topk) */
        struct strata_k_norm_q8 rnorm = {D->ffn_norm, s->eps, s->xn, fq8 ? s->xq : NULL};
        const int norm_in_router = route1 && !normed && s->norm_route && E % 32 == 0 &&
                                   !((uintptr_t)D->ffn_norm & 15);
        if (!normed && !norm_in_router &&
            OP("ffn_norm", norm_rows(s, s->x, D->ffn_norm, n, fq8, err)))
            goto fail;
        normed = 0;
        /* the next norm fused into the down projection: the next layer's attn_norm, or
         * output_norm when every row goes to the output; and what the launches after the
         * FFN read first, the next layer's q/k/v or the output projection (ffn_q8's next) */
        int fuse_next = 0;
        const float *next_nw = NULL;
        const struct strata_k_weight *next_w[2] = {NULL, NULL};
        if (il + 1 < (int)s->m->hp.n_layer) {
            const struct dev_layer *N = &s->layers[il + 1];
            next_w[0] = N->n_qkv ? &N->wqkv : &N->wq;
            next_w[1] = N->n_qkv == 3 ? NULL : &N->wv;
            fuse_next = mvq_ok(s, next_w[0], n);
            next_nw = N->attn_norm;
        } else if (want_logits) {
            next_w[0] = &s->output;
            if (all || n == 1) {
                fuse_next = mvq_ok(s, &s->output, n);
                next_nw = s->output_norm;
            }
        }
        fuse_next = fuse_next && s->fuse && E % 32 == 0;
        if (D->is_moe) {
            const struct strata_hparams *hp = &s->m->hp;
            int k = s->n_used, rows = n * k;
            const float wscale = expert_wscale(hp);
            /* a host-planned one-token layer: the router leaves the ids and the experts'
             * input in host memory too (strata_gpu_ec_host_route) */
            const struct strata_k_host_route *hr =
                route1 && s->xc && n == 1 && !s->tab_now ? strata_gpu_ec_host_route(s->xc)
                                                         : NULL;
            /* a one-token layer all in VRAM: the routing inside the gate/up launch */
            const int rglu = route1 && s->route_glu && n == 1 && !s->xc && !hr &&
                             ffn_q8_ok(s, &D->gate_exps, &D->down_exps, n);
            if (route1) {
                if (OP(norm_in_router ? "ffn_norm_router_topk" : "moe_router_topk",
                       strata_k_moe_router_topk(&s->ctx, &D->gate_inp,
                                                norm_in_router ? s->x : s->xn, n, s->router,
                                                rglu ? NULL : s->norm_cnt + MATVEC_MAX, k,
                                                hp->expert_weights_norm, wscale, s->eids, s->ew,
                                                norm_in_router ? &rnorm : NULL, hr, err)))
                    goto fail;
            } else if (OP("moe_router", proj(s, &D->gate_inp, s->xn, E, n, s->router, s->n_expert, NULL, err)) ||
                OP("moe_route_topk", strata_k_moe_route(&s->ctx, s->router, n, s->n_expert, k,
                                         hp->expert_weights_norm, wscale, s->eids, s->ew,
                                         err)))
                goto fail;
            int done = 0;
            const void *const *etab = NULL;
            int etab_slot = 0;
            if (s->xc && n == 1 && s->tab_now) {
                /* the step reads the experts through the table (missed ones staged by
                 * a kernel first); the ids go back after */
                if (OP("moe_prefetch", strata_gpu_ec_graph_prefetch(s->xc, il, s->xn, err)) ||
                    OP("moe_ids", strata_gpu_ec_graph_ids(s->xc, il, s->eids, err)) ||
                    OP("moe_resolve", strata_gpu_ec_graph_resolve(s->xc, il, s->eids, &etab,
                                                                  &etab_slot, err)))
                    goto fail;
            } else if (s->xc) {
                /* offloaded experts: hits and copies on the GPU, misses maybe on the CPU;
                 * a mat-vec batch all on the GPU comes back as remapped ids in s->eids
                 * for the kernels below (done = 0) */
                struct strata_gpu_ec_io io = {s->xn, s->eids, s->act, s->eout, s->perm, s->tiles,
                                              s->n_tiles, s->xq, s->actq, s->mmh,
                                              s->mmh_cap, hr};
                if (OP("moe_experts", strata_gpu_ec_moe(s->xc, il, n, &io, &done, err)))
                    goto fail;
            }
            if (n > MATVEC_MAX && !s->xc &&
                OP("moe_plan", strata_k_moe_plan(&s->ctx, s->eids, rows, s->n_expert, s->perm, s->tiles,
                                        s->n_tiles, err)))
                goto fail;
            if (done) {
                if (OP("moe_combine", strata_k_moe_combine(&s->ctx, s->eout, s->ew, n, k, E, s->x,
                                                           s->x, err)))
                    goto fail;
            } else if (!ffn_q8(s, &D->gate_exps, &D->up_exps, &D->down_exps, n, k, s->eids,
                               etab, etab_slot, fuse_next, next_nw,
                               rglu ? s->router : NULL, next_w, &rc, err)) {
                if (rc)
                    goto fail;
                normed = fuse_next;
            } else if (etab) {
                /* the table holds expert ids' pointers only the 8-bit kernels take */
                rc = strata_k_err(err, STRATA_E_INTERNAL, "layer %d: a graph step's experts "
                                  "without their 8-bit kernels", il);
                goto fail;
            } else if (OP("moe_gate_up", glu(s, &D->gate_exps, &D->up_exps, s->xn, n, k, s->eids, s->act, err)) ||
                OP("moe_down", down_exps(s, &D->down_exps, s->act, n, rows, s->eout, err)) ||
                OP("moe_combine", strata_k_moe_combine(&s->ctx, s->eout, s->ew, n, k, E, s->x, s->x, err)))
                goto fail;
        } else if (!ffn_q8(s, &D->gate, &D->up, &D->down, n, 1, NULL, NULL, 0, fuse_next,
                           next_nw, NULL, next_w, &rc, err)) {
            if (rc)
                goto fail;
            normed = fuse_next;
        } else {
            if (OP("ffn_gate_up", glu(s, &D->gate, &D->up, s->xn, n, 1, NULL, s->act, err)) ||
                OP("ffn_down", proj(s, &D->down, s->act, s->n_ff, n, s->x, E, s->x, err)))
                goto fail;
        }
    }
    if (s->xc && n == 1 && s->tab_now && (rc = strata_gpu_ec_graph_join(s->xc, err)))
        goto fail;
    if (want_logits) {
        int first = all ? 0 : n - 1, cnt = all ? n : 1;
        const float *xr = s->x + (int64_t)first * E;
        const float *on =
            !normed && s->norm_mv && mvq_ok(s, &s->output, cnt) ? s->output_norm : NULL;
        /* one row: its argmax folded into the launch (zeroed at the pass's start) */
        struct proj_qkv po = {};
        po.argmax_key = key ? s->d_key : NULL;
        po.y_host = hrow ? s->d_row : NULL;
        if ((!normed && !on &&
             OP("output_norm", norm_rows(s, xr, s->output_norm, cnt,
                                         mvq_ok(s, &s->output, cnt), err))) ||
            OP(on ? "output_norm_output" : "output",
               proj_nn(s, &s->output, cnt, s->logits, s->n_vocab, NULL, xr, on,
                       key || hrow ? &po : NULL, err)))
            return strata_err_wrap(err, "output: ");
        s->key_ok = key && po.argmax_done;
        s->row_ok = hrow && po.y_host_done;
    }
    prof_mark(s, "end");
    return 0;
fail:
    return rc;
#undef OP
}

/* Capture the forward pass of n token ids (variant v: GRAPH_*) into
 * s->graph_exec[n][v].  Positions and ids are read from device memory, so one graph
 * serves every position.  On failure nothing is kept and the stream is out of capture
 * mode; a device fault is left for the direct launch to report. */
static int capture(struct gpu_state *s, int n, int v, struct strata_err *err)
{
    const int all = v == GRAPH_ALL;
    cudaStream_t st = s->ctx.stream;
    cudaGraph_t g = NULL;
    const int had_step = n == 1 && s->step_blocks > 0;
    int rc = gpu_call(s, cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed),
                      "cudaStreamBeginCapture", err);
    if (rc)
        goto out;
    rc = launch_forward(s, n, 0, 1, all, v == GRAPH_HOST, s->n_ctx, err);
    {
        cudaError_t e = cudaStreamEndCapture(st, &g);
        if (!rc)
            rc = gpu_call(s, e, "cudaStreamEndCapture", err);
    }
    if (!rc)
        rc = gpu_call(s, cudaGraphInstantiate(&s->graph_exec[n][v], g,
                                              cudaGraphInstantiateFlagUseNodePriority),
                      "cudaGraphInstantiate", err);
    s->graph_key[n][v] = !rc && s->key_ok;
    s->graph_row[n][v] = !rc && s->row_ok;
out:
    if (g)
        (void)cudaGraphDestroy(g); /* the executable graph does not need it */
    if (rc) {
        s->graph_exec[n][v] = NULL;
        (void)cudaGetLastError();
        if (had_step) {
            /* a runtime that cannot capture the step's cooperative launch: the separate
             * launches, captured as before */
            strata_log_warn("capturing the fused decode step: %s; decode runs the separate "
                            "launches from now on", err->msg);
            s->step_blocks = 0;
            err->code = 0;
            err->msg[0] = '\0';
            return capture(s, n, v, err);
        }
        strata_err_wrap(err, "capturing the graph of a %d-token batch: ", n);
    }
    return rc;
}

#if defined(STRATA_TIMELINE) && defined(STRATA_GPU_CUDA)
#define TL_HOST(i) (n == 1 ? strata_tl_host_mark(i) : (void)0)
#else
#define TL_HOST(i) ((void)0)
#endif

static int gpu_forward(void *state, const struct strata_batch *b, float *logits,
                       struct strata_err *err)
{
    struct gpu_state *s = (struct gpu_state *)state;
    int n = b->n_tok, rc = 0;
    TL_HOST(0);
    int want = b->logits != STRATA_LOGITS_NONE, all = b->logits == STRATA_LOGITS_ALL;
    if (n <= 0 || n > s->n_ub || b->pos0 < 0 || b->pos0 + n > s->n_ctx)
        return strata_k_err(err, STRATA_E_INVALID, "gpu forward: bad batch n_tok=%d pos0=%d "
                            "(ubatch %d, ctx %d)", n, b->pos0, s->n_ub, s->n_ctx);
    if (b->logits == STRATA_LOGITS_TOPK &&
        (b->top_k < 1 || b->top_k > STRATA_K_TOPK_MAX || b->top_k > s->n_vocab ||
         strata_k_topk_scratch(s->n_vocab, 1, b->top_k) > TOPK_BYTES - TOPK_SCRATCH))
        return strata_k_err(err, STRATA_E_INVALID, "gpu forward: top_k %d outside 1..%d",
                            b->top_k, STRATA_K_TOPK_MAX);
    cudaStream_t st = s->ctx.stream;
    int32_t p0 = b->pos0;
    /* the host copies of pos0 and the ids must stay alive until the copies ran: they
     * are synchronised below before returning */
    if (s->pin_in && !b->embd) {
        s->h_in[0] = p0;
        memcpy(s->h_in + 1, b->ids, 4 * (size_t)n);
        rc = gpu_call(s, cudaMemcpyAsync(s->pos0, s->h_in, 4 * (size_t)(n + 1),
                                         cudaMemcpyHostToDevice, st),
                      "copy of the batch position and token ids", err);
    } else if ((rc = gpu_call(s, cudaMemcpyAsync(s->pos0, &p0, 4, cudaMemcpyHostToDevice, st),
                              "copy of the batch position", err)))
        return rc;
    else if (b->embd) {
        rc = gpu_call(s, cudaMemcpyAsync(s->x, b->embd, 4 * (size_t)n * s->n_embd,
                                         cudaMemcpyHostToDevice, st),
                      "copy of the input embeddings", err);
    } else {
        rc = gpu_call(s, cudaMemcpyAsync(s->ids, b->ids, 4 * (size_t)n, cudaMemcpyHostToDevice, st),
                      "copy of the token ids", err);
    }
    if (rc)
        return rc;
    s->cur_tokens = n;
    s->n_ev = 0;
    /* one row of logits: ALL of one token is the same launches as LAST */
    int rows_all = all && n > 1;
    /* the row for the host (LAST, or ALL of one token), or reduced on the device */
    const int for_host = want && !rows_all && b->logits != STRATA_LOGITS_ARGMAX &&
                         b->logits != STRATA_LOGITS_TOPK;
    const int gv = rows_all ? GRAPH_ALL : for_host ? GRAPH_HOST : GRAPH_ROW1;
    /* offloaded experts: only one-token steps through the expert table */
    const int dec_step = s->xc && s->ec_graph && n == 1;
    const int tab_step = dec_step && strata_gpu_ec_decode_graph(s->xc);
    s->tab_now = tab_step;
    struct timespec ts0;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    if (tab_step && (rc = strata_gpu_ec_graph_begin(s->xc, err))) {
        (void)cudaStreamSynchronize(st); /* h_in must outlive the copies queued above */
        (void)cudaGetLastError();
        return rc;
    }
    int graphable = s->use_graph && n <= MATVEC_MAX && !b->embd && want &&
                    !s->graph_off[n][gv] && (!s->xc || tab_step);
    if (graphable && !s->graph_exec[n][gv] && !s->graph_used[n][gv]) {
        s->graph_used[n][gv] = 1; /* first use: direct launches, no capture */
        graphable = 0;
    }
    if (graphable && !s->graph_exec[n][gv] && capture(s, n, gv, err)) {
        strata_log_warn("%s; batches of %d token%s run without a graph", err->msg, n,
                        n == 1 ? "" : "s");
        s->graph_off[n][gv] = 1;
        graphable = 0;
    }
    TL_HOST(1);
    if (graphable) {
        s->key_ok = s->graph_key[n][gv];
        s->row_ok = s->graph_row[n][gv];
    }
    if (graphable)
        rc = gpu_call(s, cudaGraphLaunch(s->graph_exec[n][gv], st),
                      n == 1 ? "cudaGraphLaunch (decode step)" : "cudaGraphLaunch (verify window)",
                      err);
    else
        rc = launch_forward(s, n, b->embd != NULL, want, all, for_host, s->n_ctx, err);
    if (!rc && tab_step)
        rc = strata_gpu_ec_graph_end(s->xc, err);
    if (rc) {
        (void)cudaStreamSynchronize(st);
        (void)cudaGetLastError();
        return rc;
    }
    TL_HOST(2);
    size_t rows = all ? (size_t)n : 1;
    const int amax = b->logits == STRATA_LOGITS_ARGMAX, topk = b->logits == STRATA_LOGITS_TOPK;
    const int k = topk ? b->top_k : 0;
    if (topk) {
        /* top-k sampling: the k largest found on the device, 8 k bytes back (k checked
         * above, before anything was queued) */
        if ((rc = strata_k_topk_lse(&s->ctx, s->logits, s->n_vocab, 1, k,
                                    (char *)s->d_topk + TOPK_SCRATCH, s->d_topk,
                                    (float *)s->d_topk + k,
                                    b->lse ? (double *)(s->d_topk + 2 * k) : NULL, err)) ||
            (rc = gpu_call(s, cudaMemcpyAsync(s->h_logits, s->d_topk,
                                              8 * (size_t)k + (b->lse ? 8 : 0),
                                              cudaMemcpyDeviceToHost, st),
                           "copy of the top-k logits", err)))
            return rc;
    } else if (amax && s->key_ok) {
        /* greedy: the key the output projection folded its rows into, 8 bytes back */
        if ((rc = gpu_call(s, cudaMemcpyAsync(s->h_logits, s->d_key, 8, cudaMemcpyDeviceToHost,
                                              st), "copy of the argmax key", err)))
            return rc;
    } else if (amax) {
        /* greedy: the id found on the device, 4 bytes back instead of the row */
        if ((rc = strata_k_argmax(&s->ctx, s->logits, s->n_vocab, 1, s->d_amax, err)) ||
            (rc = gpu_call(s, cudaMemcpyAsync(s->h_logits, s->d_amax, 4, cudaMemcpyDeviceToHost,
                                              st), "copy of the argmax id", err)))
            return rc;
    } else if (want && !(rows == 1 && s->row_ok) &&
               (rc = gpu_call(s, cudaMemcpyAsync(rows == 1 ? s->h_row : logits, s->logits,
                                                 4 * rows * s->n_vocab, cudaMemcpyDeviceToHost,
                                                 st),
                              "copy of the logits", err)))
        return rc;
    TL_HOST(3);
    if ((rc = gpu_call(s, cudaStreamSynchronize(st), "forward pass (asynchronous error; run with "
                                                     "STRATA_SYNC_DEBUG=1 to find the kernel)",
                       err)))
        return rc;
    TL_HOST(4);
    if (amax && s->key_ok) {
        /* key = order bits << 32 | ~id; 0: every logit NaN */
        unsigned long long key;
        memcpy(&key, s->h_logits, 8);
        const int32_t id = key ? (int32_t)~(uint32_t)key : -1;
        memcpy(s->h_logits, &id, 4);
    }
    if (amax) {
        int32_t id;
        memcpy(&id, s->h_logits, 4);
        if (id < 0 || id >= s->n_vocab) /* the kernel's -1: no logit won */
            return strata_k_err(err, STRATA_E_GPU, "greedy step at position %d: no logit is "
                                "a number (every one NaN)", b->pos0 + n - 1);
        memcpy(logits, &id, 4);
    } else if (topk) {
        int32_t id;
        memcpy(&id, s->h_logits, 4);
        if (id < 0 || id >= s->n_vocab) /* -1: no logit is a number */
            return strata_k_err(err, STRATA_E_GPU, "sampling step at position %d: no logit is "
                                "a number (every one NaN)", b->pos0 + n - 1);
        memcpy(logits, s->h_logits, 8 * (size_t)k + (b->lse ? 8 : 0));
    } else if (want && rows == 1 && logits != s->h_row) {
        /* the caller's buffer; the engine's row (gpu_host_row) is h_row itself */
        memcpy(logits, s->h_row, 4 * (size_t)s->n_vocab);
    }
    TL_HOST(5);
    if (s->prof)
        prof_collect(s);
    if (n == 1 && s->step_blocks > 0 && s->step.trace) {
        unsigned long long *t = s->step_trace_host;
        const int nl = s->step.n_layer;
        if (cudaMemcpy(t, s->step.trace, sizeof(t[0]) * (21 * nl + 1),
                       cudaMemcpyDeviceToHost) == cudaSuccess) {
            for (int i = 0; i < 7 * nl; i++) {
                const unsigned long long mid = t[14 * nl + 1 + i];
                s->step_work_ns[i % 7] += (double)(t[2 * i + 1] - t[2 * i]);
                s->step_wait_ns[i % 7] += (double)(t[2 * i + 2] - t[2 * i + 1]);
                if (mid > t[2 * i] && mid <= t[2 * i + 1])
                    s->step_mid_ns[i % 7] += (double)(mid - t[2 * i]);
            }
            s->step_traced++;
        }
        (void)cudaGetLastError();
    }
    if (dec_step) {
        struct timespec ts1;
        clock_gettime(CLOCK_MONOTONIC, &ts1);
        strata_gpu_ec_decode_done(s->xc, tab_step, (double)(ts1.tv_sec - ts0.tv_sec) +
                                                      (ts1.tv_nsec - ts0.tv_nsec) * 1e-9);
    }
    return 0;
}

static int gpu_kv_rollback(void *state, int32_t n_past, struct strata_err *err)
{
    /* the cache is overwritten in place from n_past on */
    (void)state;
    (void)n_past;
    (void)err;
    return 0;
}

static int gpu_n_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it: a later call must not see it */
        return 0;
    }
    return n;
}

static int gpu_expert_stats(void *state, int reset, struct strata_expert_cache **ec,
                            struct strata_ec_times *t)
{
    struct gpu_state *s = (struct gpu_state *)state;
    if (!s->xc)
        return 0;
    if (reset) {
        strata_ec_stats_reset(strata_gpu_ec_cache(s->xc));
        strata_gpu_ec_times(s->xc, 1, NULL);
        return 1;
    }
    *ec = strata_gpu_ec_cache(s->xc);
    strata_gpu_ec_times(s->xc, 0, t);
    return 1;
}

static float *gpu_host_row(void *state)
{
    return ((struct gpu_state *)state)->h_row;
}

extern "C" const struct strata_backend_ops strata_backend_gpu_ops = {
    STRATA_GPU_RUNTIME_NAME, gpu_init, gpu_free, gpu_forward, gpu_kv_rollback, gpu_n_devices,
    gpu_expert_stats, 1, STRATA_K_TOPK_MAX, gpu_host_row,
};

#endif /* STRATA_GPU_HOST_PASS */
