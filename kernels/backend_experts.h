/* backend_experts.h - the GPU backend's routed experts when they do not all fit in
 * VRAM: the memory plan, a VRAM slot pool run by the expert cache (lib/expert_cache.h),
 * copies over PCIe on a copy stream of their own, experts computed by the CPU worker
 * pool, and the MoE of one layer on remapped expert ids.  C++ (nvcc / hipcc); host code.
 *
 * The slot pool is one device buffer of n_slots + n_staging records; record b holds
 * the gate, up and down matrices of one (layer, expert) at fixed offsets, so a layer's
 * experts in the pool are three strata_k_weight stacks whose nb2 is the record stride:
 * the MoE kernels address record b as data + b * nb2, exactly as they address expert e
 * of a stack in VRAM.  Remapping the routed ids (expert -> record) is all it takes.
 * The routed experts' host bytes (the GGUF mapping, or a pack's experts.bin) are
 * registered for DMA in place, read-only; when that fails, copies go through pinned
 * bounce buffers.
 */
#ifndef STRATA_KERNELS_BACKEND_EXPERTS_H
#define STRATA_KERNELS_BACKEND_EXPERTS_H

#include "kernels.h"

extern "C" {
#include "expert_cache.h"
}

struct strata_model;
struct strata_pack;
struct strata_pool;
struct strata_gpu_ec;

struct strata_gpu_ec_in {
    struct strata_gpu_ctx *ctx;        /* the backend's device and compute stream */
    const struct strata_model *m;      /* host weights: the routed experts stay there */
    const struct strata_ec_cfg *cfg;   /* budget, adapt_every, pcie_frac, pool_workers */
    struct strata_pool *pool;          /* the engine's pool (CPU experts) */
    const struct strata_pack *pack;    /* its routing profile fills the cache; may be NULL */
    const struct strata_k_weight *gate_inp; /* [n_layer] routers in VRAM (prefetch) */
    int n_ub;                          /* tokens per forward call at most */
    int n_ctx;
    int mv_max;                        /* batches up to this use the mat-vec kernels */
    int use_q8;                        /* the backend's mat-vec batches take 8-bit
                                          activations where the weights allow
                                          (strata_k_matvec_q8), so do the CPU experts */
    uint64_t vram_free;                /* free VRAM before the backend allocated, bytes */
    uint64_t dense_bytes, kv_bytes, scratch_bytes; /* what the backend holds in VRAM */
};

/* Plan the memory and, when the routed experts do not all fit (or cfg->slots >= 0),
 * set up the offload: slot pool, staging, host registration, PCIe probe, initial
 * fill.  Logs the memory plan and the progress lines.  *out = NULL (and 0 returned)
 * when every expert fits: the caller uploads them as usual.  Errors: STRATA_E_LIMIT
 * (the budget cannot hold the dense part), STRATA_E_NOMEM, STRATA_E_GPU,
 * STRATA_E_UNSUPPORTED (an expert type without a GPU kernel; named). */
int strata_gpu_ec_create(struct strata_gpu_ec **out, const struct strata_gpu_ec_in *in,
                         struct strata_err *err);
/* Waits for its copies, prints the statistics when cfg->stats; NULL is accepted. */
void strata_gpu_ec_free(struct strata_gpu_ec *gx);

/* Device buffers of the backend that the MoE of a layer reads and writes. */
struct strata_gpu_ec_io {
    const float *xn;      /* [n, n_embd] the ffn_norm output */
    int32_t *eids;        /* [n, k] routed expert ids (moe_route); remapped to pool
                             records when *done = 0 */
    float *act;           /* [n * k, n_ff_exp] scratch */
    float *eout;          /* [n * k, n_embd] expert outputs, combined by the caller */
    int32_t *perm, *tiles, *n_tiles; /* grouped mat-mat plan scratch (max_tiles) */
    const void *xq;       /* [n] q8 rows of xn (mat-vec batches with use_q8), or NULL */
    void *actq;           /* [n * k] q8 rows of the SwiGLU outputs (scratch), or NULL */
    __half *xh;           /* f16 scratch of xh_cap halves for the mat-mat products
                             (strata_k_mm_args.xh), or NULL */
    size_t xh_cap;
    /* the router of this batch (one token) was launched with strata_gpu_ec_host_route's
     * result, which this is, and left its routing in host memory; or NULL */
    const struct strata_k_host_route *hr;
};

/* Where the router of a one-token host-planned layer (n == 1, not a graph step) leaves
 * the ids and the experts' input row for the host (strata_k_moe_router_topk's hr), with
 * a new sequence number for its flag; the caller passes the same pointer in
 * strata_gpu_ec_io.hr of that layer, whose strata_gpu_ec_moe then waits for the flag
 * instead of copying them back and synchronising the stream.  NULL when the backend is
 * not CUDA, when the pinned buffers have no device address, when host-planned steps
 * prefetch (their router's logits come back by a copy), or with STRATA_EC_HOST_ROUTE=0.
 * Owned by gx. */
const struct strata_k_host_route *strata_gpu_ec_host_route(struct strata_gpu_ec *gx);

/* The routed experts of layer il for a batch of n tokens: downloads the routed ids
 * (one small copy and a synchronisation of the compute stream, or the router's own
 * writes to host memory: strata_gpu_ec_host_route), looks them up in the
 * cache and copies misses on the copy stream; the compute stream waits for them on an
 * event.  Then either
 *   *done = 0: a mat-vec batch (n <= mv_max) whose experts are all on the GPU at once:
 *      io->eids now holds pool records instead of expert ids, and the caller runs its
 *      usual expert kernels on the views of strata_gpu_ec_views (the same kernels, so
 *      the same results, as with every expert in VRAM), then combines;
 *   *done = 1: every row of io->eout is written (GPU rows per round of staging
 *      buffers, CPU rows from the pool, computed meanwhile and uploaded); the caller
 *      combines them.
 * Errors: STRATA_E_GPU (names the call or kernel), those of the expert cache. */
int strata_gpu_ec_moe(struct strata_gpu_ec *gx, int il, int n, const struct strata_gpu_ec_io *io,
                      int *done, struct strata_err *err);

/* Decode steps as one graph (the experts pinned in place and mapped; STRATA_EC_DECODE
 * = auto (default), graph or host): a one-token batch needs no host work inside the
 * step.  The caller's expert
 * kernels take the routed ids as they are and read expert e of layer il through
 * strata_gpu_ec_tab(gx, il) (strata_k_mvq_args.etab): the expert's VRAM slot when it
 * is resident, else its host bytes, read over PCIe by the kernels.  Per step:
 *   strata_gpu_ec_graph_begin   before the step, device idle: the cache sees the
 *                               last step's routing (hits, misses, fills and
 *                               re-balance copies on the copy stream), finished
 *                               fills enter the table, the table is uploaded on the
 *                               compute stream if it changed
 *   strata_gpu_ec_graph_ids     inside the step, per MoE layer (capturable): keeps
 *                               the layer's routed ids
 *   strata_gpu_ec_graph_end     after the step: the ids come back with the logits
 * The products are the same kernels on the same bytes, so the logits are bitwise
 * those of the all-in-VRAM run.  Errors: STRATA_E_GPU, those of the expert cache. */
int strata_gpu_ec_graph_mode(const struct strata_gpu_ec *gx);
/* Whether this one-token step goes through the table (1) or is host-planned (0):
 * always 1 with STRATA_EC_DECODE=graph; by default (auto) the faster way by measured
 * step time (strata_gpu_ec_decode_done reports each step's wall time, seconds). */
int strata_gpu_ec_decode_graph(struct strata_gpu_ec *gx);
void strata_gpu_ec_decode_done(struct strata_gpu_ec *gx, int graph, double seconds);
void strata_gpu_ec_graph_off(struct strata_gpu_ec *gx);
const void *const *strata_gpu_ec_tab(const struct strata_gpu_ec *gx, int il);
int strata_gpu_ec_graph_begin(struct strata_gpu_ec *gx, struct strata_err *err);
int strata_gpu_ec_graph_ids(struct strata_gpu_ec *gx, int il, const int32_t *eids,
                            struct strata_err *err);
int strata_gpu_ec_graph_end(struct strata_gpu_ec *gx, struct strata_err *err);
/* Inside a graph step, after layer il's routing (capturable): the next MoE layer's
 * likely experts - its router on xn [E], this layer's FFN input - are copied on a side
 * stream into prefetch records, up to STRATA_EC_GRAPH_PREFETCH (default 2) of them that
 * are not in VRAM, while this layer's experts and the next attention run; the next
 * layer's strata_gpu_ec_graph_ids and _resolve take a complete one instead of staging
 * the expert.  A no-op when the prefetch is off (no room in the staging, a router that
 * is not F32) or il is the last MoE layer.  strata_gpu_ec_graph_join, after the last
 * layer, joins the side stream to the compute stream (a captured step must end
 * joined).  Errors: STRATA_E_GPU. */
int strata_gpu_ec_graph_prefetch(struct strata_gpu_ec *gx, int il, const float *xn,
                                 struct strata_err *err);
int strata_gpu_ec_graph_join(struct strata_gpu_ec *gx, struct strata_err *err);
/* Inside a graph step, after the layer's routing into eids [K] (capturable): the
 * pointers its expert kernels take (strata_k_mvq_args.etab) into *ptrs, and into
 * *by_slot whether they are per slot (etab_slot) - the layer's missed experts first
 * copied into staging records by a kernel (16-byte reads over PCIe), unless
 * STRATA_EC_STAGE_MISSES=0 or the parts are not 16-byte sized and aligned, in which
 * case the table itself (per expert), read in place. */
int strata_gpu_ec_graph_resolve(struct strata_gpu_ec *gx, int il, const int32_t *eids,
                                const void *const **ptrs, int *by_slot, struct strata_err *err);
/* Layer il's expert stacks in the slot pool: record b of each at data + b * nb2. */
void strata_gpu_ec_views(const struct strata_gpu_ec *gx, int il, struct strata_k_weight *gate,
                         struct strata_k_weight *up, struct strata_k_weight *down);

/* The time split and traffic so far into *t (the cache's own per-layer statistics come
 * from strata_gpu_ec_cache); reset = 1 instead zeroes them (t may be NULL). */
void strata_gpu_ec_times(struct strata_gpu_ec *gx, int reset, struct strata_ec_times *t);

/* The expert cache (statistics, tests). */
struct strata_expert_cache *strata_gpu_ec_cache(struct strata_gpu_ec *gx);

#endif
