/* backend_experts.cu - routed experts larger than VRAM for the GPU backend: the slot
 * pool, PCIe copies, CPU experts and the MoE of one layer on remapped ids
 * (backend_experts.h).
 *
 * Ordering (one compute stream, one copy stream):
 *   - every batch of copies ends with ev_copy recorded on the copy stream, and the
 *     compute stream waits on it before the layer's expert kernels, so a hit on a slot
 *     whose copy is still in flight (a prefetch, a re-balance) is safe;
 *   - a slot is overwritten only when it is unpinned: the lookup of a layer happens
 *     after the compute stream synchronised at that layer's routing, or after that
 *     layer's router wrote its flag for the host (strata_gpu_ec_host_route: the router
 *     writes it after its programmatic-dependent-launch wait, so every operation queued
 *     before it has finished), so every earlier layer's kernels are done, and the
 *     current layer's slots are pinned until its plan is released (after the prefetch
 *     of the next layer was issued);
 *   - for the same reason the pinned buffers the host plans in (h_ids, h_xn, the arena
 *     the uploads read from, h_cpu) are written again only after the operations that
 *     read them;
 *   - staging buffers are reused inside a batch only after the compute stream passed
 *     the kernels that read them (ev_round, waited on by the copy stream).  With two
 *     halves of staging (stage_db), round r + 1 copies into one half while round r
 *     computes from the other: its copies wait for round r - 1's kernels (ev_round[]),
 *     round r's kernels for its own copies (ev_copy recorded before round r + 1's).
 */
#include "backend_experts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern "C" {
#include "expert_cpu.h"
#include "ggml_types.h"
#include "log.h"
#include "matmul.h"
#include "model.h"
#include "pack.h"
#include "pool.h"
#include "probe.h"
}

/* y[i, :] = x[idx[i] / div, :] (gather, n columns) */
__global__ void ec_gather_kernel(const float *__restrict__ x, const int32_t *__restrict__ idx,
                                 int div, int n, float *__restrict__ y)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (c < n)
        y[(int64_t)i * n + c] = x[(int64_t)(idx[i] / div) * n + c];
}

/* y[idx[i], :] = x[i, :] (scatter, n columns) */
__global__ void ec_scatter_kernel(const float *__restrict__ x, const int32_t *__restrict__ idx,
                                  int n, float *__restrict__ y)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (c < n)
        y[(int64_t)idx[i] * n + c] = x[(int64_t)i * n + c];
}

#define RESOLVE_SEGS 96 /* 3 parts of up to 32 routed experts */
#define RESOLVE_UNROLL 8

/* Copy total 16-byte units with every thread of the grid, RESOLVE_UNROLL loads in
 * flight per thread (the units' loads are issued before their stores); at(i, &src,
 * &dst) gives unit i's addresses. */
template <typename At>
static __device__ __forceinline__ void copy_units(size_t total, At at)
{
    const size_t gs = (size_t)gridDim.x * blockDim.x;
    for (size_t base = (size_t)blockIdx.x * blockDim.x + threadIdx.x; base < total;
         base += RESOLVE_UNROLL * gs) {
        uint4 v[RESOLVE_UNROLL];
        uint4 *d[RESOLVE_UNROLL];
#pragma unroll
        for (int j = 0; j < RESOLVE_UNROLL; j++) {
            const size_t i = base + j * gs;
            d[j] = NULL;
            if (i < total) {
                const uint4 *src;
                at(i, &src, &d[j]);
                v[j] = *src;
            }
        }
#pragma unroll
        for (int j = 0; j < RESOLVE_UNROLL; j++)
            if (d[j])
                *d[j] = v[j];
    }
}

/* A graph decode step's routed experts of one layer, before its expert kernels:
 * sptr[3 s + p] = part p (gate, up, down) of the expert of slot s (ids[s], s < k): the
 * table's pointer when it lies in VRAM ([lo, hi)), else staging record s, into which
 * every block copies the expert's host bytes with 16-byte reads, RESOLVE_UNROLL of them
 * in flight per thread (the kernels that follow then read VRAM, not PCIe a few bytes at
 * a time).  len[p] % 16 == 0, 16-byte aligned parts. */
__global__ void ec_resolve_kernel(const uint8_t *const *__restrict__ tab,
                                  const int32_t *__restrict__ ids, int k, uintptr_t lo,
                                  uintptr_t hi, uint8_t *stage, size_t rec, size_t off_up,
                                  size_t off_down, size_t len0, size_t len1, size_t len2,
                                  const int32_t *__restrict__ pf_use,
                                  const uint8_t *__restrict__ pf_base, const uint8_t **sptr)
{
    __shared__ const uint4 *seg_src[RESOLVE_SEGS];
    __shared__ uint4 *seg_dst[RESOLVE_SEGS];
    __shared__ size_t seg_end[RESOLVE_SEGS];
    __shared__ unsigned char host[RESOLVE_SEGS];
    __shared__ int n_seg;
    strata_pdl_wait();
    strata_pdl_trigger();
    const int t = threadIdx.x;
    if (t < 3 * k) {
        const int sl = t / 3, p = t % 3;
        const size_t off = p == 0 ? 0 : p == 1 ? off_up : off_down;
        const uint8_t *src = tab[3 * (size_t)ids[sl] + p];
        uint8_t *dst = stage + (size_t)sl * rec + off;
        int in_vram = (uintptr_t)src >= lo && (uintptr_t)src < hi;
        if (!in_vram && pf_use && pf_use[sl] >= 0) {
            src = pf_base + (size_t)pf_use[sl] * rec + off; /* prefetched: in VRAM */
            in_vram = 1;
        }
        host[t] = !in_vram;
        seg_src[t] = (const uint4 *)src;
        seg_dst[t] = (uint4 *)dst;
        if (blockIdx.x == 0)
            sptr[t] = in_vram ? src : dst;
    }
    __syncthreads();
    if (t == 0) {
        /* the host parts, compacted, with their running end in 16-byte units */
        int m = 0;
        size_t end = 0;
        for (int i = 0; i < 3 * k; i++)
            if (host[i]) {
                end += (i % 3 == 0 ? len0 : i % 3 == 1 ? len1 : len2) / 16;
                seg_src[m] = seg_src[i];
                seg_dst[m] = seg_dst[i];
                seg_end[m] = end;
                m++;
            }
        n_seg = m;
    }
    __syncthreads();
    const int ns = n_seg;
    if (!ns)
        return;
    copy_units(seg_end[ns - 1], [&](size_t i, const uint4 **src, uint4 **dst) {
        int g = 0;
        while (seg_end[g] <= i)
            g++;
        const size_t o = i - (g ? seg_end[g - 1] : 0);
        *src = seg_src[g] + o;
        *dst = seg_dst[g] + o;
    });
}

/* A graph step's prefetch of the next MoE layer's experts (side stream): of the k
 * predicted ids (best first), the first pf_max whose gate part lies outside VRAM are
 * copied, whole records, into records 0.. of pf_rec; when every block is done the last
 * one tags them (tags[m] = tag0 + expert, the layer's tag0 = layer * n_expert + 1) -
 * a tagged record is complete - and adds their number to counter[1].  The tags were
 * zeroed before the launch.  counter[0]: zero before and after. */
__global__ void ec_prefetch_kernel(const uint8_t *const *__restrict__ tab,
                                   const int32_t *__restrict__ pids, int k, int pf_max,
                                   uintptr_t lo, uintptr_t hi, uint8_t *pf_rec, size_t rec,
                                   size_t off_up, size_t off_down, size_t len0, size_t len1,
                                   size_t len2, int32_t *tags, int32_t *req, int tag0,
                                   int *counter)
{
    __shared__ int sel[32], n_sel;
    const int t = threadIdx.x;
    if (t == 0) {
        int m = 0;
        for (int j = 0; j < k && m < pf_max && m < 32; j++) {
            const uintptr_t g = (uintptr_t)tab[3 * (size_t)pids[j]];
            if (g < lo || g >= hi)
                sel[m++] = pids[j];
        }
        n_sel = m;
        if (blockIdx.x == 0) /* what was asked for, complete or not (statistics) */
            for (int j = 0; j < pf_max; j++)
                ((volatile int32_t *)req)[j] = j < m ? tag0 + sel[j] : 0;
    }
    __syncthreads();
    const int ns = n_sel;
    const size_t l0 = len0 / 16, l1 = len1 / 16, l2 = len2 / 16, per = l0 + l1 + l2;
    copy_units(per * (size_t)ns, [&](size_t i, const uint4 **src, uint4 **dst) {
        const size_t m = i / per, r = i % per;
        const int p = r < l0 ? 0 : r < l0 + l1 ? 1 : 2;
        const size_t o = r - (p == 0 ? 0 : p == 1 ? l0 : l0 + l1);
        const size_t off = p == 0 ? 0 : p == 1 ? off_up : off_down;
        *src = (const uint4 *)tab[3 * (size_t)sel[m] + p] + o;
        *dst = (uint4 *)(pf_rec + m * rec + off) + o;
    });
    __syncthreads();
    if (t == 0) {
        __threadfence();
        if (atomicAdd(counter, 1) == (int)gridDim.x - 1) {
            __threadfence();
            for (int m = 0; m < ns; m++)
                ((volatile int32_t *)tags)[m] = tag0 + sel[m];
            __threadfence();
            *counter = 0;
            counter[1] += ns; /* experts prefetched (statistics) */
        }
    }
}

/* A graph step's routed ids of one layer (k) into hist, and per routed slot the
 * complete prefetch record holding its expert (tags [n_tag], this layer's tag0), or
 * -1, into pf_use: read once here, so that every block of ec_resolve_kernel takes the
 * same. */
__global__ void ec_ids_kernel(const int32_t *__restrict__ eids, int k, int32_t *hist,
                              const int32_t *tags, const int32_t *req, int n_tag, int tag0,
                              int32_t *pf_use, int *n_used)
{
    strata_pdl_wait();
    strata_pdl_trigger();
    const int t = threadIdx.x;
    if (t >= k)
        return;
    const int32_t e = eids[t];
    hist[t] = e;
    int use = -1, asked = 0;
    for (int r = 0; r < n_tag; r++) {
        if (((const volatile int32_t *)tags)[r] == tag0 + e)
            use = r;
        asked |= ((const volatile int32_t *)req)[r] == tag0 + e;
    }
    pf_use[t] = use;
    /* statistics: prefetched experts used, and routed experts a prefetch was asked for
     * (used or not yet complete) */
    if (use >= 0)
        atomicAdd(n_used, 1);
    if (asked)
        atomicAdd(n_used + 1, 1);
}

#ifdef STRATA_GPU_HOST_PASS

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define PF_BLOCKS 16 /* blocks of a prefetch copy: enough loads in flight for PCIe,
                        few multiprocessors taken from the step's kernels */
#define MAX_REG 512
#define N_BOUNCE 4
#define GFILL_RING 8 /* batches of cache fills of graph decode steps in flight */
/* STRATA_EC_DECODE=auto: decode steps alternate between the two ways in blocks of
 * PROBE_W steps (PROBE_SKIP of each not timed: the switch, a graph's capture), over
 * PROBE_BLOCKS blocks, then take the faster; again every PROBE_EVERY steps */
#define PROBE_W 8
#define PROBE_SKIP 2
#define PROBE_BLOCKS 4
#define PROBE_EVERY 128

struct host_range {
    uintptr_t lo, hi;
};

/* phases of a host-planned decode step's MoE layer (STRATA_EC_TRACE=1) */
enum {
    TR_CALLER,  /* from the layer before's return: the caller's launches */
    TR_ENQUEUE, /* the prefetch router and the copies of ids and inputs */
    TR_SYNC,    /* waiting for the forward pass up to the routed ids */
    TR_PLAN,    /* lookup, dispatch of copies, the compute stream's wait */
    TR_LAUNCH,  /* the GPU experts' uploads and launches, the prefetch's copies */
    TR_CPU,     /* the CPU experts */
    TR_UPLOAD,  /* their results to the device */
    TR_N
};
static const char *const tr_name[TR_N] = {"caller's launches", "enqueue", "wait for ids",
                                          "plan", "GPU launches", "CPU experts",
                                          "CPU results up"};

struct strata_gpu_ec {
    struct strata_gpu_ctx *ctx;
    const struct strata_model *m;
    struct strata_ec_cfg cfg;
    struct strata_pool *pool, *own_pool;
    struct strata_expert_cache *ec;
    int L, X, K, E, n_ff, n_ub, mv_max, first_moe, use_q8;
    uint8_t *q8_ffn;             /* [L] mat-vec batches run the 8-bit kernels */
    int *next_moe;               /* [L] the next MoE layer, or -1 */
    struct strata_k_weight *gate_inp; /* [L] device routers */
    /* the slot pool: n_slots + n_staging records of rec bytes; a batch streams its
     * misses in rounds of `round` records (n_staging, or half of it with stage_db) */
    int n_slots, n_staging, round, stage_db;
    size_t rec, off_up, off_down;
    char *pool_dev;
    struct strata_k_weight *vg, *vu, *vd; /* [L] views of the pool per layer */
    size_t *bg, *bu, *bd;                 /* [L] bytes of one expert's matrices */
    /* host side of the experts */
    struct host_range reg[MAX_REG];
    int n_reg, registered;
    char *bounce[N_BOUNCE];
    cudaEvent_t bounce_ev[N_BOUNCE];
    int bounce_next;
    /* streams and events */
    cudaStream_t copy;
    cudaEvent_t ev_copy, ev_round[2], ev_w0, ev_w1;
    int wait_pending;
    int unwaited;               /* copies issued since the compute stream last waited */
    int32_t *pending;           /* slots FILLING until ev_copy completes */
    int n_pending;
    /* CPU experts */
    int cpu_possible;           /* pcie_frac < 1 (or auto) */
    int route_uniform;          /* STRATA_EC_ROUTE=uniform (benchmarks) */
    uint64_t rng;
    int frac_auto;
    double frac_decode;
    /* admission of demand misses: admit0 (the cache's own rule) for mat-vec batches
     * and for prefill chunks of at most n_slots assignments; larger chunks admit none
     * (and their hottest experts enter by the next mat-vec batch's re-balance): such a
     * chunk demands more experts than there are slots, and admitting them evicted the
     * slots the next layers hit (25% of the experts in VRAM: 5% of a 2,048-token
     * chunk's experts hit).  STRATA_EC_PREFILL_ADMIT=1 admits in every chunk, =0 in
     * none (prefill_admit 1 / 0; -1 the rule) */
    int admit0, prefill_admit;
    int boost; /* a chunk admitted nothing since the last mat-vec batch's re-balance */
    /* host buffers (pinned) */
    int32_t *h_ids, *h_arena;
    /* the router's results for the host (strata_gpu_ec_host_route): hr's device addresses
     * of h_ids, h_xn and h_flag; hr_on: allowed */
    struct strata_k_host_route hr;
    unsigned *h_flag;
    int hr_on;
    size_t arena_cap, arena_used;
    float *h_xn, *h_cpu, *h_rnext;
    float *cx;                  /* CPU scratch: [n_ub, E] gathered inputs */
    void *cwork;                /* strata_xcpu_ffn_work_bytes(E, n_ff, n_ub) */
    struct strata_xcpu_expert *cex; /* [X] one layer's CPU experts */
    int cpu_tok;                /* rows of cx: the tokens of a mat-vec batch at most */
    int32_t *list, *bufs;       /* [A] a round's assignments and their pool records */
    int32_t *cnt;               /* [n_slots + n_staging + 1] counting sort by record */
    int32_t *buf_of, *round_of; /* [X] */
    /* device scratch */
    int32_t *d_rids, *d_idx, *d_rc, *d_cidx;
    float *d_xg, *d_eoc, *d_cpu, *d_rnext;
    void *d_xgq;                /* q8 rows of d_xg (8-bit mat-vec rounds) */
    int rows_c;                 /* rows of d_xg / d_eoc */
    /* decode steps as one graph (graph_mode, STRATA_EC_DECODE=graph): the expert kernels
     * read expert e of layer il through d_tab[(il * X + e) * 3 + part]: its VRAM slot
     * when RESIDENT, else its host bytes, mapped (tab_host) and read over PCIe by the
     * kernels themselves; no host work inside the step.  The routed ids of every layer
     * come back after the step (d_hist -> h_hist), and before the next one the cache
     * sees them (lookups, fills, re-balance), so the table follows the cache */
    int graph_mode, hist_valid;
    int auto_mode;                       /* choose per measured step time */
    int probe_blocks, probe_cur, probe_left, chosen, n_choices;
    long since;
    double probe_t[2];
    int probe_n[2];
    uintptr_t reg_dev[MAX_REG];          /* device address of reg[i].lo */
    const void **tab_host, **tab_new;    /* [L * X * 3] */
    const void **h_tab;                  /* [L * X * 3] pinned copy of d_tab */
    void **d_tab;
    int32_t *d_hist, *h_hist;            /* [L * K] */
    /* stage_misses: a graph step copies the layer's missed experts into staging records
     * first (ec_resolve_kernel), its expert kernels read d_sptr [3 K] */
    int stage_misses;
    const uint8_t **d_sptr;
    /* graph steps' prefetch (pf_max > 0; STRATA_EC_GRAPH_PREFETCH=N experts a layer,
     * default 2, 0 off): after a layer's routing a side stream predicts the next MoE
     * layer's experts (its router on this layer's FFN input) and copies the first
     * pf_max of them that are not in VRAM into prefetch records (staging records K..,
     * one set of pf_max per parity of the MoE layer's index), tagging each when
     * complete (ec_prefetch_kernel); the next layer's ids kernel points its misses at
     * tagged records, which ec_resolve_kernel then does not copy.  The tags are zeroed
     * before each step; the side stream joins the compute stream at the step's end. */
    int pf_max, pf_forked, pf_prio;
    int *moe_idx;                        /* [L] index among the MoE layers */
    cudaStream_t pf_stream;
    cudaEvent_t pf_fork, pf_join;
    int32_t *d_pf_ids, *d_pf_use;        /* [K], [K] */
    int32_t *d_pf_tag; /* [2 pf_max] tags of complete records, [2 pf_max] of asked ones */
    float *d_pf_w, *d_pf_logits;             /* [K], [X] */
    /* [5]: the router's counter, the prefetch kernel's, experts prefetched, prefetched
     * experts a layer then used, routed experts a prefetch was asked for (statistics) */
    int *d_pf_cnt;
    struct {
        cudaEvent_t ev;
        int32_t *slots;
        int n;
    } gfill[GFILL_RING];
    int gfill_head, gfill_count;
    int32_t *gslots;                     /* [L * K + 64] one step's fills */
    /* slot_epoch counts the events that can change what a slot holds or whether it is
     * RESIDENT (a copy into it, a finished fill); the table is rebuilt only when it
     * moved since tab_epoch */
    uint64_t slot_epoch, tab_epoch;
    int tab_built;
    uint64_t zc_bytes, graph_steps;
    /* statistics */
    double t_fwd_sync, t_cpu, t_copy_wait, t_moe;
    /* STRATA_EC_TRACE=1: where a host-planned decode step's MoE layer spends its time
     * on the host, summed over such layers (TR_* phases, seconds; printed at close) */
    int trace;
    double tr[TR_N], tr_exit;
    uint64_t tr_layers, tr_cpu_layers, tr_copy_layers;
    uint64_t tr_caller_n; /* layers with a TR_CALLER phase: those after another MoE layer */
    uint64_t bytes_copied, n_copies, n_cpu_experts, n_batches;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int call(struct strata_gpu_ec *gx, cudaError_t e, const char *what, struct strata_err *err)
{
    if (e == cudaSuccess)
        return 0;
    return strata_k_err(err, STRATA_E_GPU, "%s on %s device %d (%s): %s: %s", what,
                        STRATA_GPU_RUNTIME_NAME, gx->ctx->info.device, gx->ctx->info.name,
                        cudaGetErrorName(e), cudaGetErrorString(e));
}

static int dev_alloc(struct strata_gpu_ec *gx, void **p, size_t bytes, const char *what,
                     struct strata_err *err)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        return strata_k_err(err, STRATA_E_NOMEM,
                            "cannot allocate %.1f MiB of VRAM for %s on device %d (%s): %s",
                            bytes / 1048576.0, what, gx->ctx->info.device, gx->ctx->info.name,
                            cudaGetErrorString(e));
    }
    return 0;
}

static int host_alloc(void **p, size_t bytes, const char *what,
                      struct strata_err *err)
{
    cudaError_t e = cudaMallocHost(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        return strata_k_err(err, STRATA_E_NOMEM, "cannot allocate %.1f MiB of pinned host "
                            "memory for %s: %s", bytes / 1048576.0, what, cudaGetErrorString(e));
    }
    return 0;
}

/* Log each line of text (a memory plan, statistics) at info level. */
static void log_lines(char *text)
{
    for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        strata_log_info("%s", line);
    }
}

static size_t mat_bytes(const struct strata_weight *w)
{
    return w->nb1 * (size_t)(w->ne[1] > 0 ? w->ne[1] : 1);
}

static const void *host_part(const struct strata_gpu_ec *gx, int il, int ie, int part)
{
    const struct strata_layer *L = &gx->m->layers[il];
    const struct strata_weight *w = part == 0 ? &L->ffn_gate_exps
                                              : part == 1 ? &L->ffn_up_exps : &L->ffn_down_exps;
    return (const char *)w->data + (size_t)ie * w->nb2;
}

/* ---- host memory: register the experts in place, else bounce buffers ---- */

static int cmp_range(const void *a, const void *b)
{
    const struct host_range *x = (const struct host_range *)a, *y = (const struct host_range *)b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void unregister_all(struct strata_gpu_ec *gx)
{
    for (int i = 0; i < gx->n_reg; i++)
        (void)cudaHostUnregister((void *)gx->reg[i].lo);
    (void)cudaGetLastError();
    gx->n_reg = 0;
    gx->registered = 0;
}

/* Page ranges of every MoE layer's three expert tensors, merged, registered
 * read-only.  Returns the registered bytes, or 0 (with a warning and bounce
 * buffers) when registration fails. */
static int pin_experts(struct strata_gpu_ec *gx, uint64_t *bytes, struct strata_err *err)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct host_range *r = (struct host_range *)malloc(sizeof *r * 3 * (size_t)gx->L);
    int n = 0;
    *bytes = 0;
    if (!r)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    for (int il = 0; il < gx->L; il++) {
        const struct strata_layer *L = &gx->m->layers[il];
        if (!L->is_moe)
            continue;
        const struct strata_weight *w[3] = {&L->ffn_gate_exps, &L->ffn_up_exps,
                                            &L->ffn_down_exps};
        for (int p = 0; p < 3; p++) {
            uintptr_t lo = (uintptr_t)w[p]->data;
            uintptr_t hi = lo + (size_t)(gx->X - 1) * w[p]->nb2 + mat_bytes(w[p]);
            r[n].lo = lo / pg * pg;
            r[n].hi = ALIGN_UP(hi, pg);
            n++;
        }
    }
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi) {
            if (r[i].hi > r[m - 1].hi)
                r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    const char *off = getenv("STRATA_NO_HOST_REGISTER");
    const char *why = NULL;
    cudaError_t e = cudaSuccess;
    if (off && *off && strcmp(off, "0") != 0)
        why = "STRATA_NO_HOST_REGISTER is set";
    else if (m > MAX_REG)
        why = "too many separate ranges";
    for (int i = 0; !why && i < m; i++) {
        e = cudaHostRegister((void *)r[i].lo, r[i].hi - r[i].lo,
                             STRATA_GPU_HOST_REGISTER_READ_ONLY | cudaHostRegisterMapped);
        if (e != cudaSuccess) {
            why = cudaGetErrorString(e);
            (void)cudaGetLastError();
            break;
        }
        /* where the kernels see it (graph decode steps read misses in place) */
        void *dp = NULL;
        if (cudaHostGetDevicePointer(&dp, (void *)r[i].lo, 0) != cudaSuccess) {
            (void)cudaGetLastError();
            dp = NULL;
        }
        gx->reg_dev[gx->n_reg] = (uintptr_t)dp;
        gx->reg[gx->n_reg++] = r[i];
        *bytes += r[i].hi - r[i].lo;
    }
    uint64_t want = 0;
    for (int i = 0; i < m; i++)
        want += r[i].hi - r[i].lo;
    free(r);
    if (!why) {
        gx->registered = 1;
        return 0;
    }
    unregister_all(gx);
    *bytes = 0;
    strata_log_warn("cannot pin the routed experts in host memory (%.2f GiB) for DMA: %s; "
                    "expert copies go through %d pinned bounce buffers of %.1f MiB (slower)",
                    want / 1073741824.0, why, N_BOUNCE, gx->rec / 1048576.0);
    for (int i = 0; i < N_BOUNCE; i++) {
        int rc = host_alloc((void **)&gx->bounce[i], gx->rec, "expert bounce buffers", err);
        if (!rc)
            rc = call(gx, cudaEventCreateWithFlags(&gx->bounce_ev[i], cudaEventDisableTiming),
                      "cudaEventCreate", err);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- copies ---- */

/* Start the copy of expert (il, ie) into pool record b on the copy stream. */
static int copy_expert(struct strata_gpu_ec *gx, int il, int ie, int b, struct strata_err *err)
{
    char *dst = gx->pool_dev + (size_t)b * gx->rec;
    const size_t off[3] = {0, gx->off_up, gx->off_down};
    const size_t len[3] = {gx->bg[il], gx->bu[il], gx->bd[il]};
    int rc = 0;
    if (gx->registered) {
        for (int p = 0; p < 3 && !rc; p++)
            rc = call(gx, cudaMemcpyAsync(dst + off[p], host_part(gx, il, ie, p), len[p],
                                          cudaMemcpyHostToDevice, gx->copy),
                      "copy of an expert to VRAM", err);
    } else {
        int j = gx->bounce_next;
        gx->bounce_next = (j + 1) % N_BOUNCE;
        rc = call(gx, cudaEventSynchronize(gx->bounce_ev[j]), "expert bounce buffer", err);
        for (int p = 0; p < 3 && !rc; p++)
            memcpy(gx->bounce[j] + off[p], host_part(gx, il, ie, p), len[p]);
        if (!rc)
            rc = call(gx, cudaMemcpyAsync(dst, gx->bounce[j], gx->off_down + len[2],
                                          cudaMemcpyHostToDevice, gx->copy),
                      "copy of an expert to VRAM", err);
        if (!rc)
            rc = call(gx, cudaEventRecord(gx->bounce_ev[j], gx->copy), "cudaEventRecord", err);
    }
    gx->bytes_copied += len[0] + len[1] + len[2];
    gx->n_copies++;
    gx->unwaited++;
    gx->slot_epoch++;
    return rc;
}

/* A copy into cache slot `slot`: FILLING until the copy stream passed it. */
static int fill_slot(struct strata_gpu_ec *gx, int il, int ie, int slot, struct strata_err *err)
{
    int rc = copy_expert(gx, il, ie, slot, err);
    if (!rc)
        gx->pending[gx->n_pending++] = slot;
    return rc;
}

/* Mark the slots whose copies completed (all of them once ev_copy passed). */
static int poll_fills(struct strata_gpu_ec *gx, int wait, struct strata_err *err)
{
    if (!gx->n_pending)
        return 0;
    cudaError_t e = wait ? cudaEventSynchronize(gx->ev_copy) : cudaEventQuery(gx->ev_copy);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    int rc = call(gx, e, "expert copies (asynchronous error)", err);
    for (int i = 0; i < gx->n_pending && !rc; i++)
        rc = strata_ec_fill_done(gx->ec, gx->pending[i], err);
    gx->slot_epoch++;
    gx->n_pending = 0;
    return rc;
}

/* End a batch of copies: the compute stream waits for them (timed by ev_w0/ev_w1). */
static int copies_then_compute(struct strata_gpu_ec *gx, struct strata_err *err)
{
    /* nothing in flight the compute stream has not waited for (a decode step whose
     * experts all hit, with no prefetch since): no event, no wait */
    if (!gx->unwaited)
        return 0;
    gx->unwaited = 0;
    int rc = call(gx, cudaEventRecord(gx->ev_copy, gx->copy), "cudaEventRecord", err);
    if (!rc && !gx->wait_pending)
        rc = call(gx, cudaEventRecord(gx->ev_w0, gx->ctx->stream), "cudaEventRecord", err);
    if (!rc)
        rc = call(gx, cudaStreamWaitEvent(gx->ctx->stream, gx->ev_copy, 0), "cudaStreamWaitEvent",
                  err);
    if (!rc && !gx->wait_pending) {
        rc = call(gx, cudaEventRecord(gx->ev_w1, gx->ctx->stream), "cudaEventRecord", err);
        gx->wait_pending = !rc;
    }
    return rc;
}

static void collect_wait(struct strata_gpu_ec *gx)
{
    float ms = 0;
    if (!gx->wait_pending)
        return;
    if (cudaEventElapsedTime(&ms, gx->ev_w0, gx->ev_w1) == cudaSuccess)
        gx->t_copy_wait += ms * 1e-3;
    (void)cudaGetLastError();
    gx->wait_pending = 0;
}

/* ---- PCIe probe ---- */

/* GB/s host to device of copies as copy_expert makes them: one expert's gate, up
 * and down matrices (the first MoE layer's sizes) as three copies (one, through a
 * bounce buffer, when the experts could not be pinned), PROBE_COPIES experts after a
 * warm one, from pinned memory.  An expert of the 12-layer synthetic
 * Qwen3-30B-A3B Q4_K_M copies as three parts of 0.8-1.1 MB: 42-46 GB/s on the H200,
 * against 53-55 for the 64 MB copies this probe made before, so the split of the
 * misses follows the rate they get. */
#define PROBE_COPIES 16
static double probe_h2d(struct strata_gpu_ec *gx)
{
    const int il = gx->first_moe >= 0 ? gx->first_moe : 0;
    const size_t n = gx->bg[il] + gx->bu[il] + gx->bd[il];
    const size_t len[3] = {gx->registered ? gx->bg[il] : n, gx->registered ? gx->bu[il] : 0,
                           gx->registered ? gx->bd[il] : 0};
    void *h = NULL, *d = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double gbs = -1;
    float ms = 0;
    if (!n || cudaMallocHost(&h, n) != cudaSuccess || cudaMalloc(&d, n) != cudaSuccess ||
        cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess)
        goto out;
    memset(h, 1, n);
    for (int i = 0; i <= PROBE_COPIES; i++) {
        if (i == 1 && cudaEventRecord(a, gx->copy) != cudaSuccess)
            goto out;
        for (size_t p = 0, off = 0; p < 3; off += len[p++])
            if (len[p] &&
                cudaMemcpyAsync((char *)d + off, (char *)h + off, len[p],
                                cudaMemcpyHostToDevice, gx->copy) != cudaSuccess)
                goto out;
    }
    if (cudaEventRecord(b, gx->copy) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess ||
        cudaEventElapsedTime(&ms, a, b) != cudaSuccess || ms <= 0)
        goto out;
    gbs = (double)PROBE_COPIES * n / (ms * 1e-3) / 1e9;
out:
    if (a)
        (void)cudaEventDestroy(a);
    if (b)
        (void)cudaEventDestroy(b);
    if (d)
        (void)cudaFree(d);
    if (h)
        (void)cudaFreeHost(h);
    (void)cudaGetLastError();
    return gbs;
}

/* Whether the warm CPU probe takes a run after r runs: 4 (the first warms up), and more,
 * 32 in all at most, while the best so far (best_s seconds for bytes) is under half the
 * memory probe's mem_gbs.  On the H200's host the warm runs measured 44-90 GB/s against
 * memory reads of 39-76, and twice far below: 0.5 GB/s (mem 64.5) and 6.2 GB/s (mem
 * 39.3) - pcie_frac 0.99 and 0.87, nearly every miss over PCIe; the second decoded
 * 176-180 tok/s where the run's other processes decoded 217-273 (uniform routing, 25% of
 * the experts in VRAM).  A re-run costs about 50 us. */
static int warm_more(int r, double best_s, double bytes, double mem_gbs)
{
    if (r < 4)
        return 1;
    if (r >= 32 || mem_gbs <= 0)
        return 0;
    return !(best_s > 0 && bytes / best_s / 1e9 >= mem_gbs / 2);
}

/* GB/s of expert weights one decode token's CPU expert goes through (the first MoE
 * layer's expert 0, the best of the warm runs after the first, see warm_more; mem_gbs: the
 * memory probe's figure, <= 0 if none); -1 when it cannot run.
 * cold (STRATA_EC_CPU_PROBE=cold, a measurement switch): the mean over experts 1 ..
 * min(n_expert, PROBE_CPU_EXPERTS) - 1 of that layer, each run once after expert 0, so
 * each is read from memory as in decode (expert 0 alone when the layer has one). */
#define PROBE_CPU_EXPERTS 24
static double cpu_expert_rate(struct strata_gpu_ec *gx, int cold, double mem_gbs)
{
    const struct strata_layer *L = NULL;
    int il = gx->first_moe;
    if (il < 0)
        return -1;
    L = &gx->m->layers[il];
    struct strata_mat wg = {L->ffn_gate_exps.type, L->ffn_gate_exps.ne[0], L->ffn_gate_exps.ne[1],
                            L->ffn_gate_exps.nb1, host_part(gx, il, 0, 0)};
    struct strata_mat wu = {L->ffn_up_exps.type, L->ffn_up_exps.ne[0], L->ffn_up_exps.ne[1],
                            L->ffn_up_exps.nb1, host_part(gx, il, 0, 1)};
    struct strata_mat wd = {L->ffn_down_exps.type, L->ffn_down_exps.ne[0],
                            L->ffn_down_exps.ne[1], L->ffn_down_exps.nb1,
                            host_part(gx, il, 0, 2)};
    size_t wb = strata_xcpu_ffn_work_bytes(gx->E, wg.ne1, 1);
    float *x = (float *)calloc((size_t)gx->E, sizeof(float));
    float *y = (float *)malloc(sizeof(float) * (size_t)gx->E);
    void *work = aligned_alloc(64, (wb + 63) / 64 * 64);
    double best = -1;
    struct strata_err err = {0, ""};
    for (int i = 0; x && y && work && i < gx->E; i++)
        x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    const int ne = gx->X < PROBE_CPU_EXPERTS ? gx->X : PROBE_CPU_EXPERTS;
    double t1 = 0;
    const double bytes = (double)(gx->bg[il] + gx->bu[il] + gx->bd[il]);
    for (int r = 0; x && y && work && (cold ? r < ne : warm_more(r, best, bytes, mem_gbs));
         r++) {
        if (cold) {
            wg.data = host_part(gx, il, r, 0);
            wu.data = host_part(gx, il, r, 1);
            wd.data = host_part(gx, il, r, 2);
            if (r == (ne > 1 ? 1 : 0))
                t1 = now_s();
        }
        double t0 = now_s();
        if (strata_xcpu_ffn(gx->pool, &wg, &wu, &wd, 1, gx->q8_ffn[il], x, 1, y, work, &err))
            break;
        double dt = now_s() - t0;
        if (cold && r == ne - 1)
            best = (now_s() - t1) / (ne > 1 ? ne - 1 : 1); /* a mean, not a best */
        else if (!cold && r > 0 && (best < 0 || dt < best))
            best = dt;
    }
    free(x);
    free(y);
    free(work);
    return best > 0 ? bytes / best / 1e9 : -1;
}

/* ---- create / free ---- */

/* STRATA_EC_TRACE=1: log the host-planned decode layers' phases since the last
 * flush, and start again. */
static void trace_flush(struct strata_gpu_ec *gx)
{
    char line[512];
    int o;
    if (!gx->trace || !gx->tr_layers)
        return;
    o = snprintf(line, sizeof line, "host-planned decode, per MoE layer (%llu layers; %llu "
                 "with demand copies, %llu with CPU experts; pcie_frac %.2f), us:",
                 (unsigned long long)gx->tr_layers, (unsigned long long)gx->tr_copy_layers,
                 (unsigned long long)gx->tr_cpu_layers, gx->frac_decode);
    for (int i = 0; i < TR_N && o > 0 && (size_t)o < sizeof line; i++)
        o += snprintf(line + o, sizeof line - (size_t)o, "%s %s %.1f", i ? "," : "",
                      tr_name[i],
                      gx->tr[i] * 1e6 /
                          (double)(i != TR_CALLER ? gx->tr_layers
                                                  : gx->tr_caller_n ? gx->tr_caller_n : 1));
    strata_log_info("%s", line);
    memset(gx->tr, 0, sizeof gx->tr);
    gx->tr_layers = gx->tr_copy_layers = gx->tr_cpu_layers = gx->tr_caller_n = 0;
    gx->tr_exit = 0;
}

void strata_gpu_ec_times(struct strata_gpu_ec *gx, int reset, struct strata_ec_times *t)
{
    collect_wait(gx);
    int pf[3] = {0, 0, 0};
    if (gx->pf_max &&
        (cudaStreamSynchronize(gx->pf_stream) != cudaSuccess ||
         cudaMemcpy(pf, gx->d_pf_cnt + 2, sizeof pf, cudaMemcpyDeviceToHost) != cudaSuccess ||
         (reset && cudaMemset(gx->d_pf_cnt + 2, 0, sizeof pf) != cudaSuccess)))
        (void)cudaGetLastError(); /* statistics only */
    trace_flush(gx); /* the trace of what these statistics cover */
    if (reset) {
        gx->t_moe = gx->t_fwd_sync = gx->t_copy_wait = gx->t_cpu = 0;
        gx->bytes_copied = gx->n_copies = gx->n_cpu_experts = 0;
        gx->graph_steps = gx->zc_bytes = 0;
        return;
    }
    t->graph_prefetched = (uint64_t)pf[0];
    t->graph_prefetch_used = (uint64_t)pf[1];
    t->graph_prefetch_asked = (uint64_t)pf[2];
    t->moe_s = gx->t_moe;
    t->gpu_s = gx->t_fwd_sync;
    t->copy_wait_s = gx->t_copy_wait;
    t->cpu_s = gx->t_cpu;
    t->bytes_copied = gx->bytes_copied;
    t->n_copies = gx->n_copies;
    t->n_cpu_experts = gx->n_cpu_experts;
    t->graph_steps = gx->graph_steps;
    t->bytes_in_place = gx->zc_bytes;
}

struct strata_expert_cache *strata_gpu_ec_cache(struct strata_gpu_ec *gx)
{
    return gx ? gx->ec : NULL;
}

void strata_gpu_ec_views(const struct strata_gpu_ec *gx, int il, struct strata_k_weight *gate,
                         struct strata_k_weight *up, struct strata_k_weight *down)
{
    *gate = gx->vg[il];
    *up = gx->vu[il];
    *down = gx->vd[il];
}

static void print_stats(struct strata_gpu_ec *gx)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    strata_ec_stats_print(f, gx->ec);
    const struct strata_ec_layer_stats *st =
        gx->first_moe >= 0 ? strata_ec_stats(gx->ec, gx->first_moe) : NULL;
    double tok = st && st->tokens ? (double)st->tokens : 1;
    fprintf(f, "expert copies: %llu (%.3f MB per token), CPU experts %.3f per token\n",
            (unsigned long long)gx->n_copies, gx->bytes_copied / 1e6 / tok,
            gx->n_cpu_experts / tok);
    fprintf(f, "expert time: MoE layers %.3f s = GPU %.3f s (of which waiting for copies "
            "%.3f s) + CPU experts %.3f s + host %.3f s\n", gx->t_moe, gx->t_fwd_sync,
            gx->t_copy_wait, gx->t_cpu, gx->t_moe - gx->t_fwd_sync - gx->t_cpu);
    if (gx->graph_mode) {
        struct strata_ec_times t;
        memset(&t, 0, sizeof t);
        strata_gpu_ec_times(gx, 0, &t);
        fprintf(f, "graph decode steps: %llu, experts read in place over PCIe %.3f MB per "
                "step; prefetch: %d experts a layer at most, %llu prefetched, %llu used, "
                "%llu asked for\n",
                (unsigned long long)gx->graph_steps,
                gx->graph_steps ? gx->zc_bytes / 1e6 / (double)gx->graph_steps : 0.0,
                gx->pf_max, (unsigned long long)t.graph_prefetched,
                (unsigned long long)t.graph_prefetch_used,
                (unsigned long long)t.graph_prefetch_asked);
    }
    fclose(f);
    log_lines(buf);
    free(buf);
}

void strata_gpu_ec_free(struct strata_gpu_ec *gx)
{
    if (!gx)
        return;
    if (gx->copy)
        (void)cudaStreamSynchronize(gx->copy);
    if (gx->pf_stream)
        (void)cudaStreamSynchronize(gx->pf_stream);
    if (gx->ctx && gx->ctx->stream)
        (void)cudaStreamSynchronize(gx->ctx->stream);
    collect_wait(gx);
    trace_flush(gx);
    if (gx->ec && gx->cfg.stats)
        print_stats(gx);
    unregister_all(gx);
    for (int i = 0; i < N_BOUNCE; i++) {
        if (gx->bounce[i])
            (void)cudaFreeHost(gx->bounce[i]);
        if (gx->bounce_ev[i])
            (void)cudaEventDestroy(gx->bounce_ev[i]);
    }
    cudaEvent_t evs[] = {gx->ev_copy, gx->ev_round[0], gx->ev_round[1], gx->ev_w0, gx->ev_w1};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            (void)cudaEventDestroy(evs[i]);
    for (int i = 0; i < GFILL_RING; i++) {
        if (gx->gfill[i].ev)
            (void)cudaEventDestroy(gx->gfill[i].ev);
        free(gx->gfill[i].slots);
    }
    free(gx->tab_host);
    free(gx->tab_new);
    free(gx->gslots);
    void *hp[] = {gx->h_ids, gx->h_arena, gx->h_xn, gx->h_cpu, gx->h_rnext, gx->h_tab,
                  gx->h_hist, gx->h_flag};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
        if (hp[i])
            (void)cudaFreeHost(hp[i]);
    void *dp[] = {gx->pool_dev, gx->d_rids, gx->d_idx, gx->d_rc, gx->d_cidx,
                  gx->d_xg, gx->d_eoc, gx->d_cpu, gx->d_rnext, gx->d_xgq, gx->d_tab,
                  gx->d_hist, (void *)gx->d_sptr, gx->d_pf_ids, gx->d_pf_tag, gx->d_pf_use,
                  gx->d_pf_w, gx->d_pf_logits, gx->d_pf_cnt};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++)
        if (dp[i])
            (void)cudaFree(dp[i]);
    if (gx->copy)
        (void)cudaStreamDestroy(gx->copy);
    if (gx->pf_stream)
        (void)cudaStreamDestroy(gx->pf_stream);
    if (gx->pf_fork)
        (void)cudaEventDestroy(gx->pf_fork);
    if (gx->pf_join)
        (void)cudaEventDestroy(gx->pf_join);
    free(gx->moe_idx);
    (void)cudaGetLastError();
    strata_pool_free(gx->own_pool);
    strata_ec_free(gx->ec);
    free(gx->next_moe);
    free(gx->gate_inp);
    free(gx->vg);
    free(gx->vu);
    free(gx->vd);
    free(gx->bg);
    free(gx->bu);
    free(gx->bd);
    free(gx->pending);
    free(gx->cx);
    free(gx->cwork);
    free(gx->cex);
    free(gx->q8_ffn);
    free(gx->list);
    free(gx->bufs);
    free(gx->cnt);
    free(gx->buf_of);
    free(gx->round_of);
    free(gx);
}

static int make_view(struct strata_gpu_ec *gx, const struct strata_weight *w, size_t off,
                     struct strata_k_weight *v, struct strata_err *err)
{
    if (!strata_k_type_supported(w->type))
        return strata_k_err(err, STRATA_E_UNSUPPORTED, "tensor '%s': type %s has no GPU kernel",
                            w->name,
                            strata_ggml_type_name(w->type) ? strata_ggml_type_name(w->type) : "?");
    v->type = w->type;
    v->ne0 = w->ne[0];
    v->ne1 = w->ne[1] > 0 ? w->ne[1] : 1;
    v->nb1 = w->nb1;
    v->nb2 = gx->rec;
    v->data = gx->pool_dev + off;
    return 0;
}

/* Size the slot pool from the budget; log the plan.  *n_slots = -1: every expert fits. */
static int plan(struct strata_gpu_ec *gx, const struct strata_gpu_ec_in *in, int n_moe,
                int *n_slots, struct strata_err *err)
{
    struct strata_ec_plan_in pi;
    struct strata_ec_mem_plan p;
    memset(&pi, 0, sizeof pi);
    pi.dense_bytes = in->dense_bytes;
    pi.expert_bytes = gx->rec;
    pi.kv_bytes_per_token = in->n_ctx > 0 ? in->kv_bytes / (uint64_t)in->n_ctx : 0;
    pi.scratch_bytes = in->scratch_bytes + in->kv_bytes - pi.kv_bytes_per_token * in->n_ctx;
    pi.n_ctx = (uint32_t)in->n_ctx;
    pi.n_experts_total = (uint32_t)(n_moe * gx->X);
    pi.n_expert_used = (uint32_t)gx->K;
    pi.vram_free = in->vram_free;
    pi.vram_reserve = (uint64_t)in->cfg->vram_reserve_mib << 20;
    pi.vram_budget = (uint64_t)in->cfg->vram_budget_mib << 20;
    int rc = strata_ec_plan_compute(&pi, &p, err);
    if (rc)
        return rc;
    /* staging: enough records for every expert a mat-vec batch (a verify window) can
     * miss, so it streams them at once into the usual kernels, when that costs little
     * of the budget; else the plan's 2 k records, cycled in rounds */
    int ns = gx->mv_max * gx->K < gx->X ? gx->mv_max * gx->K : gx->X;
    uint64_t room = p.budget / 32 > (64ull << 20) ? p.budget / 32 : (64ull << 20);
    if (ns < 2 * gx->K || (uint64_t)ns * gx->rec > room)
        ns = 2 * gx->K;
    /* two halves of 2 k (STRATA_EC_STAGE_DB=0: one), so that a prefill chunk's copies
     * of round r + 1 overlap round r's kernels, when that costs at most an eighth of
     * the budget (the slots give up the records) */
    const char *dbe = getenv("STRATA_EC_STAGE_DB");
    const int db_ok = !(dbe && strcmp(dbe, "0") == 0);
    int doubled = 0;
    if (in->cfg->staging > 0)
        ns = in->cfg->staging;
    else if (db_ok && ns == 2 * gx->K && 4 * (uint64_t)gx->K * gx->rec <= p.budget / 8)
        ns = 4 * gx->K, doubled = 1;
    gx->n_staging = ns;
    /* halves only where staging was doubled for them (or asked for): staging sized to
     * hold a whole verify window keeps it in one round */
    gx->stage_db = db_ok && (doubled || (in->cfg->staging >= 4 && ns % 2 == 0));
    gx->round = gx->stage_db ? ns / 2 : ns;
    if (p.staging && ns > 2 * gx->K) {
        uint32_t drop = (uint32_t)(ns - 2 * gx->K);
        p.staging = (uint64_t)ns * gx->rec;
        p.n_slots = p.n_slots > drop ? p.n_slots - drop : 0;
        p.cache = (uint64_t)p.n_slots * gx->rec;
    }
    if (in->cfg->slots >= 0) {
        uint32_t want = (uint32_t)in->cfg->slots < pi.n_experts_total ? (uint32_t)in->cfg->slots
                                                                      : pi.n_experts_total;
        if (want > p.n_slots && !in->cfg->vram_budget_mib)
            strata_log_warn("expert slots: %u asked, the VRAM budget holds %u", want, p.n_slots);
        p.n_slots = want;
        p.cache = (uint64_t)want * gx->rec;
        p.staging = (uint64_t)ns * gx->rec;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        strata_ec_plan_print(f, &p);
        fclose(f);
        log_lines(buf);
        free(buf);
    }
    *n_slots = p.n_slots == pi.n_experts_total && in->cfg->slots < 0 ? -1 : (int)p.n_slots;
    return 0;
}

/* Swaps of the re-balance at a batch's first MoE layer: 2 k, or after a prefill chunk
 * that admitted nothing (boost) up to a quarter of the slots, at most 64, so that the
 * prompt's hottest experts enter once, outside any chunk's copies. */
static int boost_max(struct strata_gpu_ec *gx)
{
    int max = 2 * gx->K < 64 ? 2 * gx->K : 64;
    if (gx->boost) {
        int q = gx->n_slots / 4 < 64 ? gx->n_slots / 4 : 64;
        max = q > max ? q : max;
        gx->boost = 0;
    }
    return max;
}

/* ---- decode steps as one graph: experts read through a table ---- */

/* Rebuild the expert table from the cache (RESIDENT slots, the host bytes for every
 * other expert) and upload it on the compute stream when it changed.  Before a step,
 * with the device idle: nothing reads the old table any more. */
static int graph_table(struct strata_gpu_ec *gx, struct strata_err *err)
{
    const size_t nt = (size_t)gx->L * gx->X * 3, bytes = nt * sizeof(void *);
    const size_t off[3] = {0, gx->off_up, gx->off_down};
    if (gx->tab_built && gx->tab_epoch == gx->slot_epoch)
        return 0;
    gx->tab_built = 1;
    gx->tab_epoch = gx->slot_epoch;
    memcpy(gx->tab_new, gx->tab_host, bytes);
    for (int sl = 0; sl < gx->n_slots; sl++) {
        int il, ie, state, pins;
        strata_ec_slot_info(gx->ec, sl, &il, &ie, &state, &pins);
        if (state != STRATA_EC_SLOT_RESIDENT || il < 0 || ie < 0)
            continue;
        for (int p = 0; p < 3; p++)
            gx->tab_new[((size_t)il * gx->X + ie) * 3 + p] =
                gx->pool_dev + (size_t)sl * gx->rec + off[p];
    }
    if (memcmp(gx->tab_new, gx->h_tab, bytes) == 0)
        return 0;
    memcpy(gx->h_tab, gx->tab_new, bytes);
    return call(gx, cudaMemcpyAsync(gx->d_tab, gx->h_tab, bytes, cudaMemcpyHostToDevice,
                                    gx->ctx->stream),
                "upload of the expert table", err);
}

/* Finish the graph steps' fill batches whose copies completed (wait: the oldest one,
 * whatever its state). */
static int gfill_poll(struct strata_gpu_ec *gx, int wait, struct strata_err *err)
{
    int rc = 0;
    while (gx->gfill_count && !rc) {
        const int h = gx->gfill_head;
        cudaError_t e =
            wait ? cudaEventSynchronize(gx->gfill[h].ev) : cudaEventQuery(gx->gfill[h].ev);
        if (e == cudaErrorNotReady) {
            (void)cudaGetLastError();
            break;
        }
        rc = call(gx, e, "expert copies (asynchronous error)", err);
        for (int i = 0; i < gx->gfill[h].n && !rc; i++)
            rc = strata_ec_fill_done(gx->ec, gx->gfill[h].slots[i], err);
        gx->slot_epoch++;
        gx->gfill[h].n = 0;
        gx->gfill_head = (h + 1) % GFILL_RING;
        gx->gfill_count--;
        wait = 0;
    }
    return rc;
}

/* Device address of the host bytes at h (registered, mapped), or 0. */
static uintptr_t mapped(const struct strata_gpu_ec *gx, const void *h)
{
    uintptr_t a = (uintptr_t)h;
    for (int i = 0; i < gx->n_reg; i++)
        if (a >= gx->reg[i].lo && a < gx->reg[i].hi)
            return gx->reg_dev[i] ? gx->reg_dev[i] + (a - gx->reg[i].lo) : 0;
    return 0;
}

/* STRATA_EC_DECODE=graph: the table, its host side and the id history. */
/* The graph steps' prefetch (see pf_max): on when STRATA_EC_GRAPH_PREFETCH is not 0,
 * the staging has room for two sets of records after the K a step stages into, and
 * every router is F32 with rows of a multiple of 4 (strata_k_moe_router_topk). */
static int prefetch_setup(struct strata_gpu_ec *gx, struct strata_err *err)
{
    const char *pe = getenv("STRATA_EC_GRAPH_PREFETCH");
    int pf = pe ? atoi(pe) : 0, rc = 0, n_moe = 0;
    if (pf > gx->K)
        pf = gx->K;
    if (pf > 32)
        pf = 32;
    if (pf <= 0 || gx->n_staging < gx->K + 2 * pf || gx->K > 32 || gx->E % 4)
        return 0;
    gx->moe_idx = (int *)calloc((size_t)gx->L, sizeof(int));
    if (!gx->moe_idx)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    for (int il = 0; il < gx->L; il++) {
        if (!gx->m->layers[il].is_moe)
            continue;
        if (!gx->gate_inp[il].data || gx->gate_inp[il].type != STRATA_TYPE_F32)
            return 0;
        gx->moe_idx[il] = n_moe++;
    }
    /* the side stream's kernels at the highest priority: the step's kernels are
     * programmatic dependent launches, whose blocks take the multiprocessors as soon as
     * the kernel before them starts, so a side kernel of default priority got its blocks
     * only when the step ran dry, after the layer it prefetched for */
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) {
        (void)cudaGetLastError();
        least = greatest = 0;
    }
    gx->pf_prio = greatest;
    if ((rc = call(gx, cudaStreamCreateWithPriority(&gx->pf_stream, cudaStreamNonBlocking,
                                                    greatest),
                   "cudaStreamCreate (prefetch)", err)) ||
        (rc = call(gx, cudaEventCreateWithFlags(&gx->pf_fork, cudaEventDisableTiming),
                   "cudaEventCreate", err)) ||
        (rc = call(gx, cudaEventCreateWithFlags(&gx->pf_join, cudaEventDisableTiming),
                   "cudaEventCreate", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_pf_ids, 4 * (size_t)gx->K, "prefetch", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_pf_use, 4 * (size_t)gx->K, "prefetch", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_pf_tag, 16 * (size_t)pf, "prefetch", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_pf_w, 4 * (size_t)gx->K, "prefetch", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_pf_logits, 4 * (size_t)gx->X, "prefetch", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_pf_cnt, 5 * sizeof(int), "prefetch", err)) ||
        (rc = call(gx, cudaMemset(gx->d_pf_cnt, 0, 5 * sizeof(int)), "cudaMemset", err)) ||
        (rc = call(gx, cudaMemset(gx->d_pf_tag, 0, 16 * (size_t)pf), "cudaMemset", err)))
        return rc;
    gx->pf_max = pf;
    return 0;
}

int strata_gpu_ec_graph_prefetch(struct strata_gpu_ec *gx, int il, const float *xn,
                                 struct strata_err *err)
{
    const int nx = il >= 0 && il < gx->L ? gx->next_moe[il] : -1;
    if (!gx->pf_max || nx < 0)
        return 0;
    struct strata_gpu_ctx side = *gx->ctx;
    side.stream = gx->pf_stream;
    side.pdl = 0;
    side.prio = gx->pf_prio;
    const int par = gx->moe_idx[nx] % 2;
    int32_t *tags = gx->d_pf_tag + (size_t)par * gx->pf_max;
    const uintptr_t lo = (uintptr_t)gx->pool_dev,
                    hi = lo + (uintptr_t)(gx->n_slots + gx->n_staging) * gx->rec;
    uint8_t *pf_rec = (uint8_t *)gx->pool_dev +
                      (size_t)(gx->n_slots + gx->K + par * gx->pf_max) * gx->rec;
    int rc = call(gx, cudaEventRecord(gx->pf_fork, gx->ctx->stream), "cudaEventRecord", err);
    if (!rc)
        rc = call(gx, cudaStreamWaitEvent(gx->pf_stream, gx->pf_fork, 0), "cudaStreamWaitEvent",
                  err);
    gx->pf_forked |= !rc;
    if (!rc)
        rc = call(gx, cudaMemsetAsync(tags, 0, 4 * (size_t)gx->pf_max, gx->pf_stream),
                  "cudaMemsetAsync (prefetch tags)", err);
    if (!rc)
        rc = strata_k_moe_router_topk(&side, &gx->gate_inp[nx], xn, 1, gx->d_pf_logits,
                                      gx->d_pf_cnt, gx->K, 0, 1.0f, gx->d_pf_ids, gx->d_pf_w,
                                      NULL, NULL, err);
    if (rc)
        return rc;
    dim3 grid(PF_BLOCKS), block(256);
    strata_k_launch(&side, ec_prefetch_kernel, grid, block,
                    (const uint8_t *const *)strata_gpu_ec_tab(gx, nx),
                    (const int32_t *)gx->d_pf_ids, gx->K, gx->pf_max, lo, hi, pf_rec, gx->rec,
                    gx->off_up, gx->off_down, gx->bg[nx], gx->bu[nx], gx->bd[nx], tags,
                    tags + 2 * gx->pf_max, nx * gx->X + 1, gx->d_pf_cnt + 1);
    return strata_k_check(&side, "ec_prefetch_kernel", grid, block, err, "layer %d k=%d", nx,
                          gx->pf_max);
}

int strata_gpu_ec_graph_join(struct strata_gpu_ec *gx, struct strata_err *err)
{
    if (!gx->pf_forked)
        return 0;
    gx->pf_forked = 0;
    int rc = call(gx, cudaEventRecord(gx->pf_join, gx->pf_stream), "cudaEventRecord", err);
    if (!rc)
        rc = call(gx, cudaStreamWaitEvent(gx->ctx->stream, gx->pf_join, 0),
                  "cudaStreamWaitEvent", err);
    return rc;
}

static int graph_setup(struct strata_gpu_ec *gx, struct strata_err *err)
{
    /* graph: every decode step; host: none; auto (default): the faster, measured */
    const char *mode = getenv("STRATA_EC_DECODE");
    /* STRATA_EC_ROUTE=uniform replaces the routed ids on the host, which a graph step
     * never sees: host-planned steps only */
    if (gx->route_uniform)
        strata_log_info("STRATA_EC_ROUTE=uniform: host-planned decode steps only");
    if ((mode && strcmp(mode, "host") == 0) || gx->route_uniform)
        return 0;
    gx->auto_mode = !mode || strcmp(mode, "graph") != 0;
    gx->since = PROBE_EVERY;
    const char *why = !gx->registered ? "the experts are not pinned in place" : NULL;
    const size_t nt = (size_t)gx->L * gx->X * 3;
    int rc = 0;
    gx->tab_host = (const void **)calloc(nt, sizeof(void *));
    gx->tab_new = (const void **)calloc(nt, sizeof(void *));
    gx->gslots = (int32_t *)malloc(sizeof(int32_t) * ((size_t)gx->L * gx->K + 64));
    if (!gx->tab_host || !gx->tab_new || !gx->gslots)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    for (int il = 0; il < gx->L && !why; il++) {
        if (!gx->m->layers[il].is_moe)
            continue;
        for (int ie = 0; ie < gx->X && !why; ie++)
            for (int p = 0; p < 3 && !why; p++) {
                uintptr_t d = mapped(gx, host_part(gx, il, ie, p));
                if (!d)
                    why = "the device cannot address the pinned experts";
                gx->tab_host[((size_t)il * gx->X + ie) * 3 + p] = (const void *)d;
            }
    }
    for (size_t i = 0; i < nt && !why; i++)
        if ((uintptr_t)gx->tab_host[i] % 16)
            why = "an expert's host bytes are not 16-byte aligned";
    if (why) {
        if (!gx->auto_mode)
            strata_log_warn("STRATA_EC_DECODE=graph: %s; decode steps stay host-planned",
                            why);
        return 0;
    }
    if ((rc = host_alloc((void **)&gx->h_tab, nt * sizeof(void *), "expert table", err)) ||
        (rc = host_alloc((void **)&gx->h_hist, 4 * (size_t)gx->L * gx->K, "routed ids", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_tab, nt * sizeof(void *), "expert table", err)) ||
        (rc = dev_alloc(gx, (void **)&gx->d_hist, 4 * (size_t)gx->L * gx->K, "routed ids",
                        err)))
        return rc;
    for (int i = 0; i < GFILL_RING && !rc; i++) {
        gx->gfill[i].slots = (int32_t *)malloc(sizeof(int32_t) * ((size_t)gx->L * gx->K + 64));
        if (!gx->gfill[i].slots)
            return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
        rc = call(gx, cudaEventCreateWithFlags(&gx->gfill[i].ev, cudaEventDisableTiming),
                  "cudaEventCreate", err);
    }
    /* misses staged by a kernel (STRATA_EC_STAGE_MISSES=0: read in place): K staging
     * records, 16-byte parts */
    const char *sm = getenv("STRATA_EC_STAGE_MISSES");
    int stage_ok = !(sm && strcmp(sm, "0") == 0) && gx->n_staging >= gx->K &&
                   3 * gx->K <= RESOLVE_SEGS && gx->rec % 16 == 0 && gx->off_up % 16 == 0 &&
                   gx->off_down % 16 == 0;
    for (int il = 0; il < gx->L && stage_ok; il++)
        if (gx->m->layers[il].is_moe)
            stage_ok = gx->bg[il] % 16 == 0 && gx->bu[il] % 16 == 0 && gx->bd[il] % 16 == 0;
    if (!rc && stage_ok)
        rc = dev_alloc(gx, (void **)&gx->d_sptr, sizeof(void *) * 3 * (size_t)gx->K,
                       "expert pointers", err);
    gx->stage_misses = stage_ok;
    if (!rc && stage_ok)
        rc = prefetch_setup(gx, err);
    memset(gx->h_tab, 0, nt * sizeof(void *));
    if (rc || (rc = graph_table(gx, err)) ||
        (rc = call(gx, cudaStreamSynchronize(gx->ctx->stream), "upload of the expert table",
                   err)))
        return rc;
    gx->graph_mode = 1;
    strata_log_info("decode steps: %s; experts not in VRAM are read in place over PCIe by "
                    "the kernels of a graph step, the cache adapts between steps",
                    gx->auto_mode ? "graphs or host-planned, whichever measures faster"
                                  : "one graph each");
    return 0;
}

int strata_gpu_ec_graph_mode(const struct strata_gpu_ec *gx)
{
    return gx && gx->graph_mode;
}

int strata_gpu_ec_decode_graph(struct strata_gpu_ec *gx)
{
    if (!gx || !gx->graph_mode)
        return 0;
    if (!gx->auto_mode)
        return 1;
    if (!gx->probe_blocks && ++gx->since < PROBE_EVERY)
        return gx->chosen;
    if (!gx->probe_blocks) {
        gx->probe_blocks = PROBE_BLOCKS;
        gx->probe_cur = 0;
        gx->probe_left = PROBE_W;
        gx->probe_t[0] = gx->probe_t[1] = 0;
        gx->probe_n[0] = gx->probe_n[1] = 0;
        gx->since = 0;
    }
    return gx->probe_cur;
}

void strata_gpu_ec_decode_done(struct strata_gpu_ec *gx, int graph, double seconds)
{
    if (!gx || !gx->auto_mode || !gx->probe_blocks || graph != gx->probe_cur)
        return;
    if (gx->probe_left <= PROBE_W - PROBE_SKIP) {
        gx->probe_t[graph] += seconds;
        gx->probe_n[graph]++;
    }
    if (--gx->probe_left > 0)
        return;
    gx->probe_left = PROBE_W;
    gx->probe_cur ^= 1;
    if (--gx->probe_blocks > 0)
        return;
    double th = gx->probe_n[0] ? gx->probe_t[0] / gx->probe_n[0] : 0;
    double tg = gx->probe_n[1] ? gx->probe_t[1] / gx->probe_n[1] : 0;
    int c = gx->probe_n[1] && gx->probe_n[0] && tg < th;
    if (gx->n_choices++ == 0 || c != gx->chosen)
        strata_log_info("decode steps: %s (measured %.3f ms a step as graphs, %.3f ms "
                        "host-planned)", c ? "graphs" : "host-planned", tg * 1e3, th * 1e3);
    gx->chosen = c;
}

void strata_gpu_ec_graph_off(struct strata_gpu_ec *gx)
{
    if (gx)
        gx->graph_mode = 0;
}

const void *const *strata_gpu_ec_tab(const struct strata_gpu_ec *gx, int il)
{
    return (const void *const *)(gx->d_tab + (size_t)il * gx->X * 3);
}

int strata_gpu_ec_graph_resolve(struct strata_gpu_ec *gx, int il, const int32_t *eids,
                                const void *const **ptrs, int *by_slot, struct strata_err *err)
{
    *ptrs = strata_gpu_ec_tab(gx, il);
    *by_slot = 0;
    if (!gx->stage_misses)
        return 0;
    const uintptr_t lo = (uintptr_t)gx->pool_dev,
                    hi = lo + (uintptr_t)(gx->n_slots + gx->n_staging) * gx->rec;
    dim3 grid(4 * (unsigned)(gx->ctx->info.n_sm > 0 ? gx->ctx->info.n_sm : 32)), block(256);
    strata_k_launch(gx->ctx, ec_resolve_kernel, grid, block, (const uint8_t *const *)*ptrs,
                    (const int32_t *)eids, gx->K, lo, hi,
                    (uint8_t *)gx->pool_dev + (size_t)gx->n_slots * gx->rec, gx->rec, gx->off_up,
                    gx->off_down, gx->bg[il], gx->bu[il], gx->bd[il],
                    gx->pf_max ? (const int32_t *)gx->d_pf_use : (const int32_t *)NULL,
                    (const uint8_t *)gx->pool_dev + (size_t)(gx->n_slots + gx->K) * gx->rec,
                    gx->d_sptr);
    int rc = strata_k_check(gx->ctx, "ec_resolve_kernel", grid, block, err, "layer %d k=%d", il,
                            gx->K);
    *ptrs = (const void *const *)gx->d_sptr;
    *by_slot = 1;
    return rc;
}

int strata_gpu_ec_graph_ids(struct strata_gpu_ec *gx, int il, const int32_t *eids,
                            struct strata_err *err)
{
    if (gx->pf_max) {
        dim3 grid(1), block(32);
        strata_k_launch(gx->ctx, ec_ids_kernel, grid, block, eids, gx->K,
                        gx->d_hist + (size_t)il * gx->K, (const int32_t *)gx->d_pf_tag,
                        (const int32_t *)gx->d_pf_tag + 2 * gx->pf_max, 2 * gx->pf_max,
                        il * gx->X + 1, gx->d_pf_use, gx->d_pf_cnt + 3);
        return strata_k_check(gx->ctx, "ec_ids_kernel", grid, block, err, "layer %d k=%d", il,
                              gx->K);
    }
    return call(gx, cudaMemcpyAsync(gx->d_hist + (size_t)il * gx->K, eids, 4 * (size_t)gx->K,
                                    cudaMemcpyDeviceToDevice, gx->ctx->stream),
                "copy of the routed ids", err);
}

int strata_gpu_ec_graph_end(struct strata_gpu_ec *gx, struct strata_err *err)
{
    int rc = call(gx, cudaMemcpyAsync(gx->h_hist, gx->d_hist, 4 * (size_t)gx->L * gx->K,
                                      cudaMemcpyDeviceToHost, gx->ctx->stream),
                  "copy of the routed ids", err);
    gx->hist_valid = !rc;
    return rc;
}

int strata_gpu_ec_graph_begin(struct strata_gpu_ec *gx, struct strata_err *err)
{
    int rc = poll_fills(gx, 0, err), ng = 0;
    if (!rc && gx->hist_valid) {
        /* the last step's routing, as the cache would have planned it: hits, fills
         * (copied now into their slots, RESIDENT once done) and misses, which the step
         * read in place */
        const int K = gx->K;
        gx->hist_valid = 0;
        gx->graph_steps++;
        strata_ec_set_pcie_frac(gx->ec, 1.0);
        strata_ec_set_admit(gx->ec, gx->admit0);
        for (int il = 0; il < gx->L && !rc; il++) {
            if (!gx->m->layers[il].is_moe)
                continue;
            struct strata_ec_plan p;
            memset(&p, 0, sizeof p);
            if ((rc = strata_ec_lookup(gx->ec, il, 1, gx->h_hist + (size_t)il * K, &p, err)))
                break;
            for (int i = 0; i < p.n_items && !rc; i++) {
                const struct strata_ec_item *m = &p.items[i];
                if (m->where == STRATA_EC_HIT)
                    continue;
                gx->zc_bytes += gx->bg[il] + gx->bu[il] + gx->bd[il];
                if (m->where == STRATA_EC_FILL) {
                    rc = copy_expert(gx, il, m->expert, m->slot, err);
                    gx->gslots[ng++] = m->slot;
                }
            }
            strata_ec_release(gx->ec, &p);
            if (!rc && il == gx->first_moe) {
                int32_t t[3 * 64];
                int max = boost_max(gx);
                int nr = strata_ec_rebalance(gx->ec, max, t, t + max, t + 2 * max);
                for (int i = 0; i < nr && !rc; i++) {
                    rc = copy_expert(gx, t[i], t[max + i], t[2 * max + i], err);
                    gx->gslots[ng++] = t[2 * max + i];
                }
            }
        }
    }
    if (!rc)
        rc = gfill_poll(gx, 0, err);
    if (!rc && ng) {
        if (gx->gfill_count == GFILL_RING)
            rc = gfill_poll(gx, 1, err);
        int b = (gx->gfill_head + gx->gfill_count) % GFILL_RING;
        if (!rc)
            rc = call(gx, cudaEventRecord(gx->gfill[b].ev, gx->copy), "cudaEventRecord", err);
        if (!rc) {
            memcpy(gx->gfill[b].slots, gx->gslots, sizeof(int32_t) * (size_t)ng);
            gx->gfill[b].n = ng;
            gx->gfill_count++;
        }
    }
    if (!rc)
        rc = graph_table(gx, err);
    /* no tag of the last step stays valid into this one (its records are overwritten
     * while this step's layers may read them) */
    if (!rc && gx->pf_max)
        rc = call(gx, cudaMemsetAsync(gx->d_pf_tag, 0, 16 * (size_t)gx->pf_max,
                                      gx->ctx->stream),
                  "cudaMemsetAsync (prefetch tags)", err);
    return rc;
}

int strata_gpu_ec_create(struct strata_gpu_ec **out, const struct strata_gpu_ec_in *in,
                         struct strata_err *err)
{
    const struct strata_hparams *hp = &in->m->hp;
    struct strata_gpu_ec *gx = NULL;
    struct strata_ec_profile prof;
    int rc = 0, n_moe = 0, found = 0;
    memset(&prof, 0, sizeof prof);
    *out = NULL;
    if (!hp->n_expert || !in->cfg)
        return 0;
    gx = (struct strata_gpu_ec *)calloc(1, sizeof *gx);
    if (!gx)
        return strata_k_err(err, STRATA_E_NOMEM, "out of memory");
    gx->ctx = in->ctx;
    gx->m = in->m;
    gx->cfg = *in->cfg;
    gx->pool = in->pool;
    gx->L = (int)hp->n_layer;
    gx->X = (int)hp->n_expert;
    gx->K = (int)hp->n_expert_used;
    gx->E = (int)hp->n_embd;
    gx->n_ub = in->n_ub;
    gx->mv_max = in->mv_max;
    gx->use_q8 = in->use_q8;
    {
        const char *rt = getenv("STRATA_EC_ROUTE");
        gx->route_uniform = rt && !strcmp(rt, "uniform");
        gx->rng = 0x9e3779b97f4a7c15ull;
        if (gx->route_uniform)
            strata_log_warn("STRATA_EC_ROUTE=uniform: routed experts are drawn at random "
                            "(a benchmark of the cache's worst case; the output is meaningless)");
    }
    gx->first_moe = -1;
    gx->q8_ffn = (uint8_t *)calloc((size_t)gx->L, 1);
    gx->next_moe = (int *)calloc((size_t)gx->L, sizeof(int));
    gx->gate_inp = (struct strata_k_weight *)calloc((size_t)gx->L, sizeof *gx->gate_inp);
    gx->vg = (struct strata_k_weight *)calloc((size_t)gx->L, sizeof *gx->vg);
    gx->vu = (struct strata_k_weight *)calloc((size_t)gx->L, sizeof *gx->vu);
    gx->vd = (struct strata_k_weight *)calloc((size_t)gx->L, sizeof *gx->vd);
    gx->bg = (size_t *)calloc((size_t)gx->L, sizeof(size_t));
    gx->bu = (size_t *)calloc((size_t)gx->L, sizeof(size_t));
    gx->bd = (size_t *)calloc((size_t)gx->L, sizeof(size_t));
    uint8_t *is_moe = (uint8_t *)calloc((size_t)gx->L, 1);
    if (!gx->next_moe || !gx->gate_inp || !gx->vg || !gx->vu || !gx->vd || !gx->bg || !gx->bu ||
        !gx->bd || !is_moe || !gx->q8_ffn) {
        rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory");
        goto out;
    }
    {
        size_t mg = 0, mu = 0, md = 0;
        for (int il = 0; il < gx->L; il++) {
            const struct strata_layer *L = &in->m->layers[il];
            gx->next_moe[il] = -1;
            if (!L->is_moe)
                continue;
            is_moe[il] = 1;
            n_moe++;
            if (gx->first_moe < 0)
                gx->first_moe = il;
            gx->gate_inp[il] = in->gate_inp[il];
            gx->bg[il] = mat_bytes(&L->ffn_gate_exps);
            gx->bu[il] = mat_bytes(&L->ffn_up_exps);
            gx->bd[il] = mat_bytes(&L->ffn_down_exps);
            mg = gx->bg[il] > mg ? gx->bg[il] : mg;
            mu = gx->bu[il] > mu ? gx->bu[il] : mu;
            md = gx->bd[il] > md ? gx->bd[il] : md;
            if ((int)L->ffn_gate_exps.ne[1] > gx->n_ff)
                gx->n_ff = (int)L->ffn_gate_exps.ne[1];
        }
        if (gx->L > 0)
            gx->next_moe[gx->L - 1] = -1; /* the last layer has none; the loop starts below */
        for (int il = gx->L - 2, nx = -1; il >= -1; il--) {
            if (il + 1 < gx->L && is_moe[il + 1])
                nx = il + 1;
            if (il >= 0)
                gx->next_moe[il] = nx;
        }
        gx->off_up = ALIGN_UP(mg, 256);
        gx->off_down = gx->off_up + ALIGN_UP(mu, 256);
        gx->rec = gx->off_down + ALIGN_UP(md, 256);
    }
    if (!n_moe)
        goto out;
    if ((rc = plan(gx, in, n_moe, &gx->n_slots, err)))
        goto out;
    if (gx->n_slots < 0) {
        strata_log_info("memory plan: every routed expert fits in VRAM");
        goto out;
    }
    if ((rc = dev_alloc(gx, (void **)&gx->pool_dev,
                        (size_t)(gx->n_slots + gx->n_staging) * gx->rec, "the expert slots",
                        err)))
        goto out;
    for (int il = 0; il < gx->L && !rc; il++) {
        const struct strata_layer *L = &in->m->layers[il];
        if (!is_moe[il])
            continue;
        if ((rc = make_view(gx, &L->ffn_gate_exps, 0, &gx->vg[il], err)) ||
            (rc = make_view(gx, &L->ffn_up_exps, gx->off_up, &gx->vu[il], err)) ||
            (rc = make_view(gx, &L->ffn_down_exps, gx->off_down, &gx->vd[il], err)))
            goto out;
        /* the backend's ffn_q8 condition: the CPU experts follow the same choice */
        const struct strata_k_weight *g = &gx->vg[il], *d = &gx->vd[il];
        gx->q8_ffn[il] = gx->use_q8 && strata_k_matvec_q8_supported(g->type) &&
                         strata_k_matvec_q8_supported(d->type) && g->ne1 % 32 == 0 &&
                         g->ne1 == d->ne0;
    }
    if ((rc = call(gx, cudaStreamCreateWithFlags(&gx->copy, cudaStreamNonBlocking),
                   "cudaStreamCreate (expert copies)", err)) ||
        (rc = call(gx, cudaEventCreateWithFlags(&gx->ev_copy, cudaEventDisableTiming),
                   "cudaEventCreate", err)) ||
        (rc = call(gx, cudaEventCreateWithFlags(&gx->ev_round[0], cudaEventDisableTiming),
                   "cudaEventCreate", err)) ||
        (rc = call(gx, cudaEventCreateWithFlags(&gx->ev_round[1], cudaEventDisableTiming),
                   "cudaEventCreate", err)) ||
        (rc = call(gx, cudaEventCreate(&gx->ev_w0), "cudaEventCreate", err)) ||
        (rc = call(gx, cudaEventCreate(&gx->ev_w1), "cudaEventCreate", err)))
        goto out;
    gx->trace = strata_k_env_on("STRATA_EC_TRACE");
    {
        uint64_t pinned = 0;
        double t0 = now_s();
        char line[160];
        if ((rc = pin_experts(gx, &pinned, err)))
            goto out;
        if (pinned) {
            strata_ec_fmt_loaded(line, sizeof line, pinned, now_s() - t0);
            strata_log_info("%s (pinned in place)", line);
        }
    }
    if (gx->cfg.pool_workers > 0 &&
        (!gx->pool || strata_pool_n_threads(gx->pool) != gx->cfg.pool_workers) &&
        (rc = strata_pool_create(&gx->own_pool, gx->cfg.pool_workers, err)))
        goto out;
    if (gx->own_pool)
        gx->pool = gx->own_pool;
    {
        double frac = gx->cfg.pcie_frac;
        char line[160];
        if (frac < 0) {
            double pcie = probe_h2d(gx);
            double mem = strata_probe_mem_read_gbs(64u << 20, strata_pool_n_threads(gx->pool));
            /* the CPU's share follows what its expert code achieves, not only what its
             * memory could deliver */
            const char *cp = getenv("STRATA_EC_CPU_PROBE");
            const int cold = cp && !strcmp(cp, "cold");
            double xr = cpu_expert_rate(gx, cold, mem);
            /* cold: the experts' own rate from memory; the memory probe (which moved
             * between 40 and 93 GB/s from one start to the next on the H200's host while
             * the CPU experts ran at 44-76 GB/s in decode) is still logged, not used */
            double cpu = xr > 0 && (cold || mem <= 0 || xr < mem) ? xr : mem;
            frac = strata_probe_pcie_frac(pcie, cpu);
            if (frac < 0)
                frac = 1;
            gx->frac_auto = 1;
            strata_ec_fmt_probe(line, sizeof line, pcie, frac);
            strata_log_info("%s (CPU experts: %d threads, %.1f GB/s of expert weights; "
                            "memory reads %.1f GB/s)", line, strata_pool_n_threads(gx->pool),
                            xr, mem);
        }
        gx->frac_decode = frac;
        gx->cpu_possible = frac < 1;
    }
    {
        struct strata_ec_opts eo;
        strata_ec_opts_init(&eo);
        eo.n_layer = gx->L;
        eo.n_expert = gx->X;
        eo.n_expert_used = gx->K;
        eo.is_moe = is_moe;
        eo.n_slots = gx->n_slots;
        eo.expert_bytes = gx->rec;
        eo.adapt_every = gx->cfg.adapt_every;
        eo.pcie_frac = gx->frac_decode;
        /* STRATA_EC_PREFETCH=1: host-planned decode steps prefetch (strata_ec_cfg
         * prefetch); STRATA_EC_NO_PREFETCH_EVICT=1: prefetches take free slots only */
        if (strata_k_env_on("STRATA_EC_NO_PREFETCH_EVICT"))
            eo.prefetch_evict = 0;
        if (getenv("STRATA_EC_PREFETCH"))
            gx->cfg.prefetch = strata_k_env_on("STRATA_EC_PREFETCH");
        if (gx->route_uniform && gx->cfg.prefetch) {
            /* it predicts the router's choice, not the random one */
            gx->cfg.prefetch = 0;
            strata_log_info("STRATA_EC_ROUTE=uniform: no prefetch");
        }
        if (in->pack && strata_pack_dir(in->pack)) {
            if ((rc = strata_ec_profile_find(&prof, strata_pack_dir(in->pack), gx->L, gx->X,
                                             &found, err)))
                goto out;
            if (found) {
                eo.profile = prof.counts;
                strata_log_info("expert cache: initial fill from the pack's routing profile "
                                "(%llu tokens)", (unsigned long long)prof.tokens);
            }
        }
        if ((rc = strata_ec_create(&gx->ec, &eo, err)))
            goto out;
    }
    {
        const size_t T = (size_t)gx->n_ub, A = T * gx->K;
        int mm_ok = 1;
        for (int il = 0; il < gx->L; il++)
            if (is_moe[il] && (gx->vg[il].ne0 % 64 || gx->vd[il].ne0 % 64))
                mm_ok = 0;
        gx->rows_c = mm_ok && (size_t)gx->mv_max * gx->K < A ? gx->mv_max * gx->K : (int)A;
        /* what one batch uploads from the arena: perm (A), tiles (3 per tile, at most
         * A / BN + one per expert and round, + n_tiles), remapped ids (A), compacted
         * rows (2 A) and the CPU rows' assignments (A) */
        gx->arena_cap = 6 * A + 4 * (A / STRATA_K_MM_BN + 2 * (size_t)gx->X + 64);
        gx->pending = (int32_t *)malloc(sizeof(int32_t) * (size_t)(gx->n_slots + 1));
        gx->list = (int32_t *)malloc(sizeof(int32_t) * A);
        gx->bufs = (int32_t *)malloc(sizeof(int32_t) * A);
        gx->cnt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(gx->n_slots + gx->n_staging + 1));
        gx->buf_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)gx->X);
        gx->round_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)gx->X);
        if (!gx->pending || !gx->list || !gx->bufs || !gx->cnt || !gx->buf_of ||
            !gx->round_of) {
            rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        if ((rc = host_alloc((void **)&gx->h_ids, 4 * A, "routed ids", err)) ||
            (rc = host_alloc((void **)&gx->h_arena, 4 * gx->arena_cap, "expert plans",
                             err)) ||
            (rc = host_alloc((void **)&gx->h_rnext, 4 * (size_t)gx->X, "router", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_rids, 4 * A, "expert ids", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_idx, 4 * A, "expert ids", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_rc, 4 * A, "expert ids", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_cidx, 4 * A, "expert ids", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_rnext, 4 * (size_t)gx->X, "router", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_xg, 4 * (size_t)gx->rows_c * gx->E,
                            "expert inputs", err)) ||
            (rc = dev_alloc(gx, (void **)&gx->d_eoc, 4 * (size_t)gx->rows_c * gx->E,
                            "expert outputs", err)))
            goto out;
        if (gx->use_q8) {
            size_t rq = (size_t)gx->mv_max * gx->K < (size_t)gx->rows_c
                            ? (size_t)gx->mv_max * gx->K : (size_t)gx->rows_c;
            if ((rc = dev_alloc(gx, &gx->d_xgq, rq * strata_k_q8_row_bytes(gx->E),
                                "8-bit expert inputs", err)))
                goto out;
        }
        if (gx->cpu_possible) {
            /* CPU experts serve mat-vec batches only: mv_max tokens at most */
            const size_t Tc = (size_t)gx->mv_max < T ? (size_t)gx->mv_max : T, Ac = Tc * gx->K;
            gx->cpu_tok = (int)Tc;
            gx->cx = (float *)malloc(4 * Tc * gx->E);
            gx->cwork = aligned_alloc(64, (strata_xcpu_ffn_work_bytes(gx->E, gx->n_ff, (int)Tc) +
                                           63) / 64 * 64);
            gx->cex = (struct strata_xcpu_expert *)malloc(sizeof *gx->cex * (size_t)gx->X);
            if (!gx->cx || !gx->cwork || !gx->cex) {
                rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory");
                goto out;
            }
            if ((rc = host_alloc((void **)&gx->h_xn, 4 * Tc * gx->E, "expert inputs", err)) ||
                (rc = host_alloc((void **)&gx->h_cpu, 4 * Ac * gx->E, "CPU expert outputs",
                                 err)) ||
                (rc = dev_alloc(gx, (void **)&gx->d_cpu, 4 * Ac * gx->E, "CPU expert outputs",
                                err)))
                goto out;
        }
#ifdef STRATA_GPU_CUDA
        {
            /* the router's results for the host (strata_gpu_ec_host_route) */
            const char *hv = getenv("STRATA_EC_HOST_ROUTE");
            void *di = NULL, *dx = NULL, *df = NULL;
            if (!(hv && !strcmp(hv, "0"))) {
                if ((rc = host_alloc((void **)&gx->h_flag, 64, "the router's flag", err)))
                    goto out;
                *gx->h_flag = 0;
                gx->hr_on = cudaHostGetDevicePointer(&di, gx->h_ids, 0) == cudaSuccess &&
                            cudaHostGetDevicePointer(&df, gx->h_flag, 0) == cudaSuccess &&
                            (!gx->h_xn ||
                             cudaHostGetDevicePointer(&dx, gx->h_xn, 0) == cudaSuccess);
                (void)cudaGetLastError();
                gx->hr.ids = (int32_t *)di;
                gx->hr.xn = (float *)dx;
                gx->hr.flag = (unsigned *)df;
            }
        }
#endif
    }
    {
        const int ns = gx->n_slots;
        int32_t *fl = (int32_t *)malloc(sizeof(int32_t) * 3 * (size_t)(ns + 1));
        if (!fl) {
            rc = strata_k_err(err, STRATA_E_NOMEM, "out of memory");
            goto out;
        }
        int n = strata_ec_initial_fill(gx->ec, ns, fl, fl + ns, fl + 2 * ns);
        char line[160];
        strata_ec_fmt_filling(line, sizeof line, (uint32_t)n, (uint64_t)n * gx->rec);
        strata_log_info("%s", line);
        double t0 = now_s();
        for (int i = 0; i < n && !rc; i++)
            rc = fill_slot(gx, fl[i], fl[ns + i], fl[2 * ns + i], err);
        if (!rc)
            rc = call(gx, cudaEventRecord(gx->ev_copy, gx->copy), "cudaEventRecord", err);
        if (!rc)
            rc = poll_fills(gx, 1, err);
        free(fl);
        if (rc)
            goto out;
        double dt = now_s() - t0;
        strata_log_info("expert cache filled: %d experts, %.2f GiB in %.2f s (%.1f GB/s)", n,
                        (double)n * gx->rec / 1073741824.0, dt,
                        dt > 0 ? (double)n * gx->rec / dt / 1e9 : 0.0);
        gx->bytes_copied = 0;
        gx->n_copies = 0;
        if ((rc = graph_setup(gx, err)))
            goto out;
        const char *pa = getenv("STRATA_EC_PREFILL_ADMIT");
        gx->prefill_admit = pa && *pa ? strcmp(pa, "0") != 0 : -1;
        gx->admit0 = strata_ec_get_admit(gx->ec);
    }
    *out = gx;
    gx = NULL;
out:
    free(is_moe);
    strata_ec_profile_free(&prof);
    strata_gpu_ec_free(gx);
    return rc;
}

/* ---- the MoE of one layer ---- */

static int32_t *arena(struct strata_gpu_ec *gx, size_t n)
{
    if (gx->arena_used + n > gx->arena_cap)
        return NULL;
    int32_t *p = gx->h_arena + gx->arena_used;
    gx->arena_used += n;
    return p;
}

static int up(struct strata_gpu_ec *gx, void *dst, const void *src, size_t bytes,
              struct strata_err *err)
{
    return call(gx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, gx->ctx->stream),
                "upload of an expert plan", err);
}

static int launch_rows(struct strata_gpu_ec *gx, const float *x, const int32_t *idx, int div,
                       int m, float *y, int scatter, struct strata_err *err)
{
    dim3 grid((unsigned)((gx->E + STRATA_GPU_BLOCK - 1) / STRATA_GPU_BLOCK), (unsigned)m),
        block(STRATA_GPU_BLOCK);
    if (scatter)
        ec_scatter_kernel<<<grid, block, 0, gx->ctx->stream>>>(x, idx, gx->E, y);
    else
        ec_gather_kernel<<<grid, block, 0, gx->ctx->stream>>>(x, idx, div, gx->E, y);
    return strata_k_check(gx->ctx, scatter ? "ec_scatter_kernel" : "ec_gather_kernel", grid,
                          block, err, "rows=%d n=%d", m, gx->E);
}

/* SwiGLU of the gate and up records ids[0..rows) on q8 input rows xq (row s / x_group),
 * written as q8 rows to io->actq, then the down projections into y (row s): the 8-bit
 * kernels of the backend's decode, so the same numerics as with every expert in VRAM. */
static int mvq_rows(struct strata_gpu_ec *gx, int il, const struct strata_gpu_ec_io *io,
                    const int32_t *ids, int rows, const void *xq, int x_group, float *y,
                    struct strata_err *err)
{
    struct strata_k_mvq_args a;
    memset(&a, 0, sizeof a);
    a.w = &gx->vg[il];
    a.up = &gx->vu[il];
    a.mode = STRATA_K_MVQ_GLU;
    a.ids = ids;
    a.n_slot = rows;
    a.x_group = x_group;
    a.xq = xq;
    a.yq = io->actq;
    int rc = strata_k_matvec_q8(gx->ctx, &a, err);
    if (rc)
        return rc;
    memset(&a, 0, sizeof a);
    a.w = &gx->vd[il];
    a.mode = STRATA_K_MVQ_PLAIN;
    a.ids = ids;
    a.n_slot = rows;
    a.x_group = 1;
    a.xq = io->actq;
    a.y = y;
    a.y_stride = gx->E;
    return strata_k_matvec_q8(gx->ctx, &a, err);
}

/* A mat-vec round on the 8-bit kernels.  all = 1: every assignment not in list is a
 * CPU one whose row the CPU result overwrites later, so the whole batch runs in the
 * routed layout (those rows on any record), with no gather; else the round's rows are
 * gathered, quantised (the same q8 rows: quantising the normed floats again gives the
 * same blocks), computed and scattered. */
static int run_round_q8(struct strata_gpu_ec *gx, int il, int n,
                        const struct strata_gpu_ec_io *io, const int32_t *list,
                        const int32_t *bufs, int m, int all, struct strata_err *err)
{
    const int A = n * gx->K, E = gx->E;
    int rc;
    if (all) {
        int32_t *rid = arena(gx, (size_t)A);
        if (!rid)
            return strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
        for (int i = 0; i < A; i++)
            rid[i] = bufs[0];
        for (int i = 0; i < m; i++)
            rid[list[i]] = bufs[i];
        if ((rc = up(gx, gx->d_rids, rid, 4 * (size_t)A, err)))
            return rc;
        return mvq_rows(gx, il, io, gx->d_rids, A, io->xq, gx->K, io->eout, err);
    }
    const int rows_q = gx->mv_max * gx->K < gx->rows_c ? gx->mv_max * gx->K : gx->rows_c;
    for (int i0 = 0; i0 < m; i0 += rows_q) {
        int mc = m - i0 < rows_q ? m - i0 : rows_q;
        int32_t *hi = arena(gx, (size_t)mc), *hb = arena(gx, (size_t)mc);
        if (!hi || !hb)
            return strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
        memcpy(hi, list + i0, 4 * (size_t)mc);
        memcpy(hb, bufs + i0, 4 * (size_t)mc);
        if ((rc = up(gx, gx->d_idx, hi, 4 * (size_t)mc, err)) ||
            (rc = up(gx, gx->d_rc, hb, 4 * (size_t)mc, err)) ||
            (rc = launch_rows(gx, io->xn, gx->d_idx, gx->K, mc, gx->d_xg, 0, err)) ||
            (rc = strata_k_quantize_q8(gx->ctx, gx->d_xg, E, E, mc, 0, NULL, 0.0f, NULL,
                                       gx->d_xgq, err)) ||
            (rc = mvq_rows(gx, il, io, gx->d_rc, mc, gx->d_xgq, 1, gx->d_eoc, err)) ||
            (rc = launch_rows(gx, gx->d_eoc, gx->d_idx, 1, mc, io->eout, 1, err)))
            return rc;
    }
    return 0;
}

/* The GPU experts of one round: assignments list[0..m) (t * k + j), each computed
 * from pool record bufs[i]; all as run_round_q8. */
static int run_round(struct strata_gpu_ec *gx, int il, int n, const struct strata_gpu_ec_io *io,
                     const int32_t *list, const int32_t *bufs, int m, int all,
                     struct strata_err *err)
{
    const int A = n * gx->K, E = gx->E;
    const struct strata_k_weight *g = &gx->vg[il], *u = &gx->vu[il], *d = &gx->vd[il];
    int rc;
    if (m <= 0)
        return 0;
    if (n > gx->mv_max && g->ne0 % 64 == 0 && d->ne0 % 64 == 0) {
        /* grouped mat-mat: perm grouped by record, tiles of <= STRATA_K_MM_BN rows */
        int nb = gx->n_slots + gx->n_staging;
        int32_t *perm = arena(gx, (size_t)m), *cnt = gx->cnt;
        if (!perm)
            return strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
        memset(cnt, 0, sizeof(int32_t) * ((size_t)nb + 1));
        for (int i = 0; i < m; i++)
            cnt[bufs[i] + 1]++;
        int nt = 0;
        for (int b = 0; b < nb; b++) {
            nt += (cnt[b + 1] + STRATA_K_MM_BN - 1) / STRATA_K_MM_BN;
            cnt[b + 1] += cnt[b];
        }
        int32_t *tiles = arena(gx, 3 * (size_t)nt + 1);
        if (!tiles)
            return strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
        for (int b = 0, t = 0; b < nb; b++)
            for (int s = cnt[b]; s < cnt[b + 1]; s += STRATA_K_MM_BN) {
                tiles[3 * t] = b;
                tiles[3 * t + 1] = s;
                tiles[3 * t + 2] = s + STRATA_K_MM_BN < cnt[b + 1] ? s + STRATA_K_MM_BN
                                                                    : cnt[b + 1];
                t++;
            }
        for (int i = 0; i < m; i++)
            perm[cnt[bufs[i]]++] = list[i];
        tiles[3 * nt] = nt;
        if ((rc = up(gx, io->perm, perm, 4 * (size_t)m, err)) ||
            (rc = up(gx, io->tiles, tiles, 12 * (size_t)nt, err)) ||
            (rc = up(gx, io->n_tiles, tiles + 3 * nt, 4, err)))
            return rc;
        struct strata_k_mm_args a;
        memset(&a, 0, sizeof a);
        a.w = g;
        a.up = u;
        a.glu = 1;
        a.n_tok = A;
        a.perm = io->perm;
        a.tiles = io->tiles;
        a.n_tiles = io->n_tiles;
        a.max_tiles = nt;
        a.x_div = gx->K;
        a.x = io->xn;
        a.x_stride = E;
        a.y = io->act;
        a.y_stride = g->ne1;
        a.xh = io->xh && (size_t)n * E <= io->xh_cap ? io->xh : NULL;
        if ((rc = strata_k_matmul(gx->ctx, &a, err)))
            return rc;
        a.w = d;
        a.up = NULL;
        a.glu = 0;
        a.x_div = 1;
        a.x = io->act;
        a.x_stride = d->ne0;
        a.y = io->eout;
        a.y_stride = E;
        a.xh = io->xh && (size_t)A * d->ne0 <= io->xh_cap ? io->xh : NULL;
        return strata_k_matmul(gx->ctx, &a, err);
    }
    if (n <= gx->mv_max && gx->q8_ffn[il] && io->xq && io->actq && gx->d_xgq)
        return run_round_q8(gx, il, n, io, list, bufs, m, all, err);
    struct strata_k_mv_args a;
    memset(&a, 0, sizeof a);
    a.w = g;
    a.up = u;
    a.glu = 1;
    if (m == A) {
        /* every assignment, in order: the routed layout with remapped ids */
        int32_t *rid = arena(gx, (size_t)A);
        if (!rid)
            return strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
        for (int i = 0; i < A; i++)
            rid[list[i]] = bufs[i];
        if ((rc = up(gx, gx->d_rids, rid, 4 * (size_t)A, err)))
            return rc;
        a.ids = gx->d_rids;
        a.n_slot = A;
        a.x_group = gx->K;
        a.x = io->xn;
        a.x_stride = E;
        a.y = io->act;
        a.y_stride = g->ne1;
        if ((rc = strata_k_matvec(gx->ctx, &a, err)))
            return rc;
        a.w = d;
        a.up = NULL;
        a.glu = 0;
        a.x_group = 1;
        a.x = io->act;
        a.x_stride = d->ne0;
        a.y = io->eout;
        a.y_stride = E;
        return strata_k_matvec(gx->ctx, &a, err);
    }
    /* a subset: gather its input rows, compute compactly, scatter the outputs */
    for (int i0 = 0; i0 < m; i0 += gx->rows_c) {
        int mc = m - i0 < gx->rows_c ? m - i0 : gx->rows_c;
        int32_t *hi = arena(gx, (size_t)mc), *hb = arena(gx, (size_t)mc);
        if (!hi || !hb)
            return strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
        memcpy(hi, list + i0, 4 * (size_t)mc);
        memcpy(hb, bufs + i0, 4 * (size_t)mc);
        if ((rc = up(gx, gx->d_idx, hi, 4 * (size_t)mc, err)) ||
            (rc = up(gx, gx->d_rc, hb, 4 * (size_t)mc, err)) ||
            (rc = launch_rows(gx, io->xn, gx->d_idx, gx->K, mc, gx->d_xg, 0, err)))
            return rc;
        a.w = g;
        a.up = u;
        a.glu = 1;
        a.ids = gx->d_rc;
        a.n_slot = mc;
        a.x_group = 1;
        a.x = gx->d_xg;
        a.x_stride = E;
        a.y = io->act;
        a.y_stride = g->ne1;
        if ((rc = strata_k_matvec(gx->ctx, &a, err)))
            return rc;
        a.w = d;
        a.up = NULL;
        a.glu = 0;
        a.x = io->act;
        a.x_stride = d->ne0;
        a.y = gx->d_eoc;
        a.y_stride = E;
        if ((rc = strata_k_matvec(gx->ctx, &a, err)) ||
            (rc = launch_rows(gx, gx->d_eoc, gx->d_idx, 1, mc, io->eout, 1, err)))
            return rc;
    }
    return 0;
}

/* The CPU experts of a plan, one after the other, each matrix spread over the pool:
 * rows of h_cpu in plan order, their assignments in idx.  Each expert follows the
 * numerics of the GPU kernels this batch would have run (lib/expert_cpu.h): 8-bit
 * activations in blocks of 32 for a mat-vec batch on the 8-bit kernels, float for
 * other mat-vec batches, f16 operands for mat-mat batches. */
static int cpu_experts(struct strata_gpu_ec *gx, int il, int n, const struct strata_ec_plan *p,
                       int32_t *idx, int *rows, struct strata_err *err)
{
    const struct strata_layer *L = &gx->m->layers[il];
    const int A = n * gx->K, E = gx->E;
    struct strata_xcpu_expert *ex = gx->cex;
    int r = 0, rc = 0, n_ex = 0, gr = 0;
    /* experts in groups of at most cpu_tok gathered rows, each group in two pool runs */
    for (int it = 0; it <= p->n_items && !rc; it++) {
        const struct strata_ec_item *m = it < p->n_items ? &p->items[it] : NULL;
        if (m && m->where != STRATA_EC_CPU)
            continue;
        int cnt = 0;
        for (int a = 0; m && a < A; a++)
            cnt += gx->h_ids[a] == m->expert;
        if (n_ex && (!m || gr + cnt > gx->cpu_tok)) {
            rc = strata_xcpu_ffn_batch(gx->pool, ex, n_ex, n <= gx->mv_max, gx->q8_ffn[il],
                                       gx->cwork, err);
            n_ex = 0;
            gr = 0;
        }
        if (!m || rc)
            break;
        struct strata_xcpu_expert *e = &ex[n_ex++];
        e->gate = (struct strata_mat){L->ffn_gate_exps.type, L->ffn_gate_exps.ne[0],
                                      L->ffn_gate_exps.ne[1], L->ffn_gate_exps.nb1,
                                      host_part(gx, il, m->expert, 0)};
        e->up = (struct strata_mat){L->ffn_up_exps.type, L->ffn_up_exps.ne[0],
                                    L->ffn_up_exps.ne[1], L->ffn_up_exps.nb1,
                                    host_part(gx, il, m->expert, 1)};
        e->down = (struct strata_mat){L->ffn_down_exps.type, L->ffn_down_exps.ne[0],
                                      L->ffn_down_exps.ne[1], L->ffn_down_exps.nb1,
                                      host_part(gx, il, m->expert, 2)};
        e->x = gx->cx + (size_t)gr * E;
        e->y = gx->h_cpu + (size_t)r * E;
        e->n_tok = cnt;
        for (int a = 0, c = 0; a < A; a++)
            if (gx->h_ids[a] == m->expert) {
                idx[r + c] = a;
                memcpy(gx->cx + (size_t)(gr + c) * E, gx->h_xn + (size_t)(a / gx->K) * E,
                       sizeof(float) * (size_t)E);
                c++;
            }
        gr += cnt;
        r += cnt;
        gx->n_cpu_experts++;
    }
    if (rc)
        strata_err_wrap(err, "CPU experts of layer %d: ", il);
    *rows = r;
    return rc;
}

/* Replace each token's routed experts by k distinct uniformly random ones. */
static void random_route(struct strata_gpu_ec *gx, int n)
{
    for (int t = 0; t < n; t++) {
        int32_t *s = gx->h_ids + (size_t)t * gx->K;
        for (int j = 0; j < gx->K; j++) {
            int e, dup;
            do {
                gx->rng ^= gx->rng << 13;
                gx->rng ^= gx->rng >> 7;
                gx->rng ^= gx->rng << 17;
                e = (int)(((gx->rng >> 32) * (uint64_t)gx->X) >> 32);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= s[i] == e;
            } while (dup);
            s[j] = e;
        }
    }
}

static int op_copy(void *ctx, int il, int ie, int slot, int staging, struct strata_err *err)
{
    struct strata_gpu_ec *gx = (struct strata_gpu_ec *)ctx;
    if (!staging)
        return fill_slot(gx, il, ie, slot, err);
    if (slot >= gx->round)
        return 0; /* a later round of this batch */
    return copy_expert(gx, il, ie, gx->n_slots + slot, err);
}

static int op_cpu(void *ctx, int il, int ie, int n_tok, struct strata_err *err)
{
    /* computed after the GPU work was launched, so both run together */
    (void)ctx;
    (void)il;
    (void)ie;
    (void)n_tok;
    (void)err;
    return 0;
}

const struct strata_k_host_route *strata_gpu_ec_host_route(struct strata_gpu_ec *gx)
{
    if (!gx || !gx->hr_on || gx->cfg.prefetch)
        return NULL;
    if (!++gx->hr.seq) /* never 0, the flag's first value */
        gx->hr.seq = 1;
    return &gx->hr;
}

/* Until this layer's router wrote the flag (strata_gpu_ec_host_route): its ids and the
 * experts' input row are then in host memory.  Every 256 polls asks the stream: a fault
 * is an error, and so is a stream that went idle without the flag. */
static int wait_host_route(struct strata_gpu_ec *gx, struct strata_err *err)
{
    const unsigned seq = gx->hr.seq;
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(gx->h_flag, __ATOMIC_ACQUIRE) == seq)
            return 0;
        if (i % 256)
            continue;
        cudaError_t e = cudaStreamQuery(gx->ctx->stream);
        if (e == cudaErrorNotReady) {
            (void)cudaGetLastError();
            continue;
        }
        if (e != cudaSuccess)
            return call(gx, e, "forward pass before the routed experts (asynchronous error)",
                        err);
        if (__atomic_load_n(gx->h_flag, __ATOMIC_ACQUIRE) == seq)
            return 0;
        return strata_k_err(err, STRATA_E_INTERNAL, "the router's launch ended without "
                            "leaving the routed ids for the host");
    }
}

/* Copies of MoE layer nx's likely experts (the router's logits in h_rnext) into the
 * slots strata_ec_prefetch picks. */
static int prefetch_next(struct strata_gpu_ec *gx, int nx, struct strata_err *err)
{
    int32_t cand[64], ie[64], slot[64];
    int rc = 0;
    int nc = strata_ec_predict(gx->h_rnext, gx->X, gx->K < 64 ? gx->K : 64, cand);
    int np = strata_ec_prefetch(gx->ec, nx, cand, nc, ie, slot);
    for (int i = 0; i < np && !rc; i++)
        rc = fill_slot(gx, nx, ie[i], slot[i], err);
    if (!rc && np)
        rc = call(gx, cudaEventRecord(gx->ev_copy, gx->copy), "cudaEventRecord", err);
    return rc;
}

/* The routed ids (and the CPU experts' inputs) to the host, on the compute stream. */
static int ids_back(struct strata_gpu_ec *gx, const struct strata_gpu_ec_io *io, int n,
                    struct strata_err *err)
{
    cudaStream_t st = gx->ctx->stream;
    int rc;
    if ((rc = call(gx, cudaMemcpyAsync(gx->h_ids, io->eids, 4 * (size_t)n * gx->K,
                                       cudaMemcpyDeviceToHost, st), "copy of the routed ids",
                   err)))
        return rc;
    if (gx->cpu_possible && n <= gx->mv_max &&
        (rc = call(gx, cudaMemcpyAsync(gx->h_xn, io->xn, 4 * (size_t)n * gx->E,
                                       cudaMemcpyDeviceToHost, st),
                   "copy of the expert inputs", err)))
        return rc;
    return 0;
}

int strata_gpu_ec_moe(struct strata_gpu_ec *gx, int il, int n, const struct strata_gpu_ec_io *io,
                      int *done, struct strata_err *err)
{
    const int A = n * gx->K;
    cudaStream_t st = gx->ctx->stream;
    struct strata_ec_plan p;
    int rc = 0, nx = gx->next_moe[il], rows_cpu = 0, n_rounds = 1;
    int prefetch = gx->cfg.prefetch && n == 1 && nx >= 0 && gx->n_slots > 0 &&
                   gx->gate_inp[nx].data;
    double t_in = now_s();
    /* a chunk that admits none (see admit0) */
    const int no_admit = n > gx->mv_max &&
                         (gx->prefill_admit == 0 ||
                          (gx->prefill_admit < 0 && (int64_t)A > (int64_t)gx->n_slots));
    memset(&p, 0, sizeof p);
    p.released = 1;
    *done = 1;
    gx->hist_valid = 0; /* a graph step's routing is seen before the next graph step only */
    gx->arena_used = 0;
    gx->n_batches++;
    const int tr = gx->trace && n == 1;
    double tt[TR_N + 1] = {0};     /* phase i runs from tt[i] to tt[i + 1] */
    int tr_copied = 0, tr_cpu = 0; /* this layer's demand misses went over PCIe, to the CPU */
    const int tr_caller = tr && gx->tr_exit > 0 && il != gx->first_moe;
    tt[TR_ENQUEUE] = t_in;
    if (prefetch) {
        /* the next layer's router on this layer's input: its likely experts */
        struct strata_k_mv_args a;
        memset(&a, 0, sizeof a);
        a.w = &gx->gate_inp[nx];
        a.n_slot = 1;
        a.x_group = 1;
        a.x = io->xn;
        a.x_stride = gx->E;
        a.y = gx->d_rnext;
        a.y_stride = gx->X;
        if ((rc = strata_k_matvec(gx->ctx, &a, err)) ||
            (rc = call(gx, cudaMemcpyAsync(gx->h_rnext, gx->d_rnext, 4 * (size_t)gx->X,
                                           cudaMemcpyDeviceToHost, st), "copy of the router",
                       err)))
            return rc;
    }
    /* the router left the ids and the experts' input for the host (n == 1), or they come
     * back by copies */
    const int armed = io->hr != NULL;
    if (armed && (io->hr != &gx->hr || n != 1 || prefetch))
        return strata_k_err(err, STRATA_E_INTERNAL, "expert cache: a router's results for the "
                            "host that are not this cache's, or in a batch of %d tokens", n);
    if (!armed && (rc = ids_back(gx, io, n, err)))
        return rc;
    double t0 = now_s();
    if ((rc = armed ? wait_host_route(gx, err)
                    : call(gx, cudaStreamSynchronize(st), "forward pass before the routed "
                                                          "experts (asynchronous error)", err)))
        return rc;
    gx->t_fwd_sync += now_s() - t0;
    if (tr) {
        tt[TR_ENQUEUE + 1] = t0;
        tt[TR_SYNC + 1] = now_s();
    }
    collect_wait(gx);
    if ((rc = poll_fills(gx, 0, err)) || (gx->gfill_count && (rc = gfill_poll(gx, 0, err))))
        return rc;
    if (gx->route_uniform)
        random_route(gx, n);
    if (il == gx->first_moe && !no_admit) {
        int32_t t[3 * 64];
        int max = boost_max(gx);
        int nr = strata_ec_rebalance(gx->ec, max, t, t + max, t + 2 * max);
        for (int i = 0; i < nr && !rc; i++)
            rc = fill_slot(gx, t[i], t[max + i], t[2 * max + i], err);
        if (rc)
            return rc;
    }
    /* mat-mat batches (prefill chunks) copy every miss: one copy serves all of an
     * expert's tokens, and the GPU's f16 tensor-core sums cannot be reproduced on the
     * CPU bit for bit - followed by 8-bit decode steps, whose quantisation turns last-bit
     * differences into whole quanta, CPU experts in prefill moved tinycoder Q4_K_M's
     * logits by up to 0.19; the CPU pool serves mat-vec batches, where its integer dots
     * are the GPU's */
    if (gx->cpu_possible)
        strata_ec_set_pcie_frac(gx->ec, n > gx->mv_max ? 1.0 : gx->frac_decode);
    strata_ec_set_admit(gx->ec, no_admit ? STRATA_EC_ADMIT_NONE : gx->admit0);
    if ((rc = strata_ec_lookup(gx->ec, il, n, gx->h_ids, &p, err)))
        return rc;
    struct strata_ec_ops ops = {op_copy, op_cpu};
    if ((rc = strata_ec_dispatch(gx->ec, &p, &ops, gx, err)) ||
        (rc = copies_then_compute(gx, err)))
        goto out;
    if (tr) {
        for (int i = 0; i < p.n_items; i++)
            tr_copied |= p.items[i].where == STRATA_EC_FILL ||
                         p.items[i].where == STRATA_EC_STREAM;
        tt[TR_PLAN + 1] = now_s();
    }
    for (int i = 0; i < p.n_items; i++) {
        const struct strata_ec_item *m = &p.items[i];
        gx->buf_of[m->expert] = -1;
        gx->round_of[m->expert] = -1;
        if (m->where == STRATA_EC_HIT || m->where == STRATA_EC_FILL) {
            gx->buf_of[m->expert] = m->slot;
            gx->round_of[m->expert] = 0;
        } else if (m->where == STRATA_EC_STREAM) {
            gx->buf_of[m->expert] = gx->n_slots + m->slot % gx->n_staging;
            gx->round_of[m->expert] = m->slot / gx->round;
            if (gx->round_of[m->expert] + 1 > n_rounds)
                n_rounds = gx->round_of[m->expert] + 1;
        }
    }
    if (n <= gx->mv_max && n_rounds == 1 && !p.n_cpu) {
        /* the caller's own kernels on remapped ids */
        int32_t *rid = arena(gx, (size_t)A);
        if (!rid) {
            rc = strata_k_err(err, STRATA_E_INTERNAL, "expert plan arena too small");
            goto out;
        }
        for (int a = 0; a < A; a++)
            rid[a] = gx->buf_of[gx->h_ids[a]];
        if ((rc = up(gx, io->eids, rid, 4 * (size_t)A, err)))
            goto out;
        *done = 0;
        n_rounds = 0;
    }
    for (int r = 0; r < n_rounds && !rc; r++) {
        /* the copies of round c: into staging records the kernels of round c - 2
         * (two halves) or c - 1 (one) read, so after those */
        const int c = gx->stage_db ? r + 1 : r, lag = gx->stage_db ? 2 : 1;
        if (r > 0 && gx->stage_db)
            rc = copies_then_compute(gx, err); /* round r's, issued one round ago */
        if (!rc && c > 0 && c < n_rounds) {
            if (c - lag >= 0)
                rc = call(gx, cudaStreamWaitEvent(gx->copy, gx->ev_round[(c - lag) % 2], 0),
                          "cudaStreamWaitEvent", err);
            for (int i = 0; i < p.n_items && !rc; i++) {
                const struct strata_ec_item *m = &p.items[i];
                if (m->where == STRATA_EC_STREAM && m->slot / gx->round == c)
                    rc = copy_expert(gx, il, m->expert, gx->buf_of[m->expert], err);
            }
            if (!rc && !gx->stage_db)
                rc = copies_then_compute(gx, err);
        }
        if (rc)
            break;
        int32_t *list = gx->list, *bufs = gx->bufs;
        int m = 0;
        for (int a = 0; a < A; a++) {
            int e = gx->h_ids[a];
            if (gx->round_of[e] == r && gx->buf_of[e] >= 0) {
                list[m] = a;
                bufs[m] = gx->buf_of[e];
                m++;
            }
        }
        rc = run_round(gx, il, n, io, list, bufs, m, n_rounds == 1, err);
        /* the staging records of this round are free once its kernels ran */
        if (!rc && r + lag < n_rounds)
            rc = call(gx, cudaEventRecord(gx->ev_round[r % 2], st), "cudaEventRecord", err);
    }
    if (rc)
        goto out;
    if (prefetch && (rc = prefetch_next(gx, nx, err)))
        goto out;
    if (no_admit)
        gx->boost = 1; /* the next mat-vec batch's re-balance takes the chunk's experts */
    if (tr)
        tt[TR_LAUNCH + 1] = tt[TR_CPU + 1] = now_s();
    if (p.n_cpu) {
        int32_t *idx = arena(gx, (size_t)A);
        double tc = now_s();
        if (!idx || n > gx->cpu_tok || !gx->cx) {
            rc = strata_k_err(err, STRATA_E_INTERNAL, "CPU experts for a batch of %d tokens "
                              "(%d at most)%s", n, gx->cpu_tok, idx ? "" : ", arena too small");
            goto out;
        }
        if ((rc = cpu_experts(gx, il, n, &p, idx, &rows_cpu, err)))
            goto out;
        gx->t_cpu += now_s() - tc;
        if (tr) {
            tt[TR_CPU + 1] = now_s();
            tr_cpu = 1;
        }
        if (rows_cpu &&
            ((rc = up(gx, gx->d_cpu, gx->h_cpu, 4 * (size_t)rows_cpu * gx->E, err)) ||
             (rc = up(gx, gx->d_cidx, idx, 4 * (size_t)rows_cpu, err)) ||
             (rc = launch_rows(gx, gx->d_cpu, gx->d_cidx, 1, rows_cpu, io->eout, 1, err))))
            goto out;
    }
    if (tr) {
        tt[TR_UPLOAD + 1] = now_s();
        for (int i = TR_ENQUEUE; i < TR_N; i++)
            gx->tr[i] += tt[i + 1] - tt[i];
        if (tr_caller) {
            gx->tr[TR_CALLER] += t_in - gx->tr_exit;
            gx->tr_caller_n++;
        }
        gx->tr_layers++;
        gx->tr_copy_layers += tr_copied;
        gx->tr_cpu_layers += tr_cpu;
        gx->tr_exit = tt[TR_UPLOAD + 1];
    }
out:
    strata_ec_release(gx->ec, &p);
    gx->t_moe += now_s() - t_in;
    if (rc)
        strata_err_wrap(err, "routed experts of layer %d: ", il);
    return rc;
}

#endif /* STRATA_GPU_HOST_PASS */
