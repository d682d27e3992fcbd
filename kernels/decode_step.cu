/* decode_step.cu - a one-token decode step through every layer of a MoE model as one
 * persistent kernel.
 *
 * Decoding one token is a chain of small dependent operations: per layer the
 * attn_norm, the q/k/v product, q/k norms and RoPE, attention, attn_output, ffn_norm,
 * the router and top-k, the experts' gate/up and down, 5-13 µs each as separate
 * launches on an H200 for a few µs of data.  Here one grid of co-resident blocks (a
 * cooperative launch) runs them as stages separated by grid-wide barriers, and each
 * stage asks for the next stage's weights in L2 before it starts its own work (the
 * weights never depend on the token).  Persistent "megakernels" for decoding are
 * described in Hazy Research's "Look Ma, No Bubbles!" (2025) and Mirage's MPK (2025).
 *
 * Measured on the H200 it is slower than the separate launches (docs/performance.md):
 * a barrier costs about 1.3 µs, but each stage's own chain of dependent memory round
 * trips, run by few warps, costs as much as the separate kernel did with its launch.
 * So it is off unless STRATA_FUSED_STEP=1; STRATA_STEP_TRACE=1 times its stages.
 *
 * The numbers are those of the separate kernels, bit for bit: every stage calls the
 * same device functions (mvq.cuh, attention.cuh, rope.cuh, moe.cuh) with the same lanes
 * per row, the same block size where a block-wide sum is involved (STEP_THREADS is
 * the norm, router and attention kernels' block size), and the same order of sums.  So
 * a decode step and a verify window (which runs the separate kernels) still give the
 * same logits.  Data that other blocks wrote during this launch is read through L2
 * (strata_ldcg_*), not through a multiprocessor's L1, which is not coherent (the kv
 * cache's newest row is the one exception; attention.cuh says why it is safe).
 *
 * Stages of layer l (a barrier after each):
 *   1. attn_norm (every block, into shared memory) and the q/k/v product
 *   2. q/k norms, RoPE, kv cache store (a group of threads per head)
 *   3. attention tiles (split-K, merged by the last block of each tile, 8-bit output)
 *   4. attn_output + residual
 *   5. ffn_norm (every block) and the router's logits (a block per expert)
 *   6. top-k (every block, one warp), the experts' gate/up + SwiGLU as 8-bit rows
 *   7. the experts' down products, weighted sum and residual */
#include "attention.cuh"
#include "moe.cuh"
#include "mvq.cuh"
#include "rope.cuh"

#include <stdlib.h>
#include <string.h>

#define STEP_THREADS 256
static_assert(STEP_THREADS == ATT_THREADS && STEP_THREADS == STRATA_GPU_BLOCK,
              "the step's block sums and attention tiles are those of the separate kernels");
/* a barrier that waits this many clock cycles (seconds on any GPU) has lost a block:
 * the kernel traps, and the launch reports an error instead of hanging */
#define STEP_SPIN_LIMIT (1ll << 34)

/* Grid-wide barrier on one 64-bit counter that only grows: every block adds one when
 * it arrives (its writes fenced first; the add returns nothing, so nobody waits for
 * it) and waits until the counter reaches the arrivals of this barrier.  *want: this
 * block's count of arrivals so far, in shared memory (the counter at the launch's start
 * is a multiple of the grid, since every earlier barrier completed).  trace: where
 * block 0 notes the clock once the barrier is passed (NULL: nowhere). */
static __device__ void step_sync(unsigned long long *bar, unsigned long long *want,
                                 unsigned long long *trace)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned long long w = *want + gridDim.x;
        if (trace && blockIdx.x == 0)
            trace[-1] = strata_dev_clock();
        __threadfence();
        atomicAdd(bar, 1ull);
        const long long t0 = clock64();
        while (*(volatile unsigned long long *)bar < w)
            if (clock64() - t0 > STEP_SPIN_LIMIT)
                strata_dev_trap();
        __threadfence();
        *want = w;
        if (trace && blockIdx.x == 0)
            *trace = strata_dev_clock();
    }
    __syncthreads();
}

/* Ask for bytes [p, p + n) in L2, the lines spread over every thread of the grid. */
static __device__ void step_prefetch(const void *p, size_t n)
{
    if (p)
        strata_prefetch_l2_bytes(p, n, (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                                 (size_t)gridDim.x * blockDim.x);
}

/* n bytes (a multiple of 16) from global memory other blocks wrote into shared dst. */
static __device__ void step_stage(uint8_t *dst, const void *src, size_t n)
{
    for (size_t i = threadIdx.x; i < n / 16; i += blockDim.x)
        ((uint4 *)dst)[i] = strata_ldcg_u4((const uint4 *)src + i);
}

/* Rows of a PLAIN (COMB false) or COMBINE product of one token, spread over the grid's
 * groups of m.tpr lanes, R rows a group, with mvq_kernel's sums in mvq_kernel's order:
 * lane l of a row's group adds units l, l + tpr, ... (COMBINE: items of the k experts,
 * each fmaf'd with its router weight), then the group's shuffle tree.  xs: the q8
 * activation row(s) in shared memory (COMBINE: k rows of xs_row bytes, one per expert).
 * y[row] = add[row] + sum (add read through L2), or 0.0f + sum without add. */
template <int T, int R, bool COMB>
static __device__ void step_mv(const struct strata_k_step_mv &m, const uint8_t *xs, size_t xs_row,
                               const int32_t *ids, const float *cw, int k, float *y,
                               const float *add)
{
    const int tpr = m.tpr, ne1 = m.ne1, nu = m.nu;
    const int gt = blockIdx.x * blockDim.x + threadIdx.x, gl = gt % tpr;
    const int gpp = gridDim.x * blockDim.x / tpr;              /* groups per pass */
    const int rg = (ne1 + R - 1) / R;                          /* row groups */
    const int wg = (gt - (int)(threadIdx.x % warpSize)) / tpr; /* the warp's first group */
    for (int g = gt / tpr, g0 = wg; g0 < rg; g += gpp, g0 += gpp) {
        /* groups past the last re-read the last rows (in bounds) and write nothing:
         * every lane of the warp must reach the shuffles */
        const int r0 = (g < rg ? g : rg - 1) * R;
        size_t roff[R];
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            roff[r] = (size_t)min(r0 + r, ne1 - 1) * m.nb1;
            acc[r] = 0.0f;
        }
        if (COMB)
            mvq_lane_sums_k<T, R>(
                roff, gl, tpr, nu, k,
                [&](int j, const uint8_t **wb, const uint8_t **xr, float *c) {
                    *wb = m.w + (size_t)ids[j] * m.nb2;
                    *xr = xs + (size_t)j * xs_row;
                    *c = cw[j];
                },
                acc);
        else
            mvq_lane_sums<T, R, false>(m.w, NULL, roff, gl, tpr, nu, xs, acc, NULL);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float a = mvq_group_sum(acc[r], tpr);
            const int row = r0 + r;
            if (gl == 0 && g < rg && row < ne1)
                y[row] = (add ? strata_ldcg_f(add + row) : 0.0f) + a;
        }
    }
}

/* The experts' gate/up + SwiGLU of one token as q8 rows (mvq_kernel's GLU mode): units
 * of 32 output rows of one expert, a unit per block at a time, 256 / tpr groups of R =
 * max(1, tpr / 8) rows each (with tpr 4 only the first 32 groups' rows are kept).  xs: the normed
 * q8 row in shared memory; ids [k] the experts; yq: k q8 rows of yq_row bytes; vb: 32 floats of
 * shared memory. */
template <int T, int R>
static __device__ void step_glu(const struct strata_k_step_mv &m, const uint8_t *xs,
                                const int32_t *ids, int k, uint8_t *yq, size_t yq_row, float *vb)
{
    const int tpr = m.tpr, gl = threadIdx.x % tpr, grp = threadIdx.x / tpr;
    const int upe = m.ne1 / 32, units = upe * k;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int j = u / upe, rb = (u - j * upe) * 32;
        const size_t base = (size_t)ids[j] * m.nb2;
        size_t roff[R];
        float acc[R], acc2[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            /* groups past the unit's 32 rows (tpr 4) re-read its last row */
            roff[r] = (size_t)(rb + min(grp * R + r, 31)) * m.nb1;
            acc[r] = acc2[r] = 0.0f;
        }
        mvq_lane_sums<T, R, true>(m.w + base, m.u + base, roff, gl, tpr, m.nu, xs, acc, acc2);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float a = mvq_group_sum(acc[r], tpr), b = mvq_group_sum(acc2[r], tpr);
            if (gl == 0 && grp * R + r < 32)
                vb[grp * R + r] = a / (1.0f + expf(-a)) * b;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            float d;
            const int q = q8_quant(vb[threadIdx.x], &d);
            uint8_t *yr = yq + (size_t)j * yq_row;
            ((int8_t *)yr)[rb + threadIdx.x] = (int8_t)q;
            if (threadIdx.x == 0)
                ((float *)(yr + m.ne1))[rb / 32] = d;
        }
        __syncthreads();
    }
}

/* Dispatch on the weight type and R (the host checked both). */
template <bool COMB>
static __device__ void step_mv_any(const struct strata_k_step_mv &m, const uint8_t *xs,
                                   size_t xs_row, const int32_t *ids, const float *cw, int k,
                                   float *y, const float *add)
{
#define STEP_MV(T)                                                                                 \
    case T:                                                                                        \
        if (m.R == 4)                                                                              \
            step_mv<T, 4, COMB>(m, xs, xs_row, ids, cw, k, y, add);                                \
        else if (m.R == 2)                                                                         \
            step_mv<T, 2, COMB>(m, xs, xs_row, ids, cw, k, y, add);                                \
        else                                                                                       \
            step_mv<T, 1, COMB>(m, xs, xs_row, ids, cw, k, y, add);                                \
        break;
    switch (m.type) {
        STEP_MV(KT_Q4_K)
        STEP_MV(KT_Q5_K)
        STEP_MV(KT_Q6_K)
        STEP_MV(KT_Q8_0)
    }
#undef STEP_MV
}

static __device__ void step_glu_any(const struct strata_k_step_mv &m, const uint8_t *xs,
                                    const int32_t *ids, int k, uint8_t *yq, size_t yq_row,
                                    float *vb)
{
#define STEP_GLU(T)                                                                                \
    case T:                                                                                        \
        if (m.R == 4)                                                                              \
            step_glu<T, 4>(m, xs, ids, k, yq, yq_row, vb);                                         \
        else if (m.R == 2)                                                                         \
            step_glu<T, 2>(m, xs, ids, k, yq, yq_row, vb);                                         \
        else                                                                                       \
            step_glu<T, 1>(m, xs, ids, k, yq, yq_row, vb);                                         \
        break;
    switch (m.type) {
        STEP_GLU(KT_Q4_K)
        STEP_GLU(KT_Q5_K)
        STEP_GLU(KT_Q6_K)
        STEP_GLU(KT_Q8_0)
    }
#undef STEP_GLU
}

/* The shared memory of a step block: one region the stages take in turn (the attention
 * tile, or the normed row as floats and q8, or staged q8 rows), then the routing. */
struct step_smem_layout {
    size_t region, logits, ids, cw, vb, scratch, gen, total;
};

static __host__ __device__ inline struct step_smem_layout
step_layout(int n_embd, int n_q, int n_expert, int k, int n_ff_exp)
{
    struct step_smem_layout L;
    size_t norm = 4 * (size_t)n_embd + mvq_q8_row(n_embd);
    size_t reg = sizeof(struct att_smem);
    reg = reg > norm ? reg : norm;
    reg = reg > mvq_q8_row(n_q) ? reg : mvq_q8_row(n_q);
    reg = reg > (size_t)k * mvq_q8_row(n_ff_exp) ? reg : (size_t)k * mvq_q8_row(n_ff_exp);
    L.region = 0;
    L.logits = (reg + 15) & ~(size_t)15;
    L.ids = L.logits + 4 * (((size_t)n_expert + 3) & ~(size_t)3);
    L.cw = L.ids + 4 * 32;
    L.vb = L.cw + 4 * 32;
    L.scratch = L.vb + 4 * 32;
    L.gen = L.scratch + 4 * STRATA_GPU_MAX_WARP;
    L.total = L.gen + 16;
    return L;
}

#define STEP_PREFETCH(p, n) step_prefetch((p), (n))
/* the trace's mid-stage reading of block 0 (the stage's first part done) */
#define STEP_MID(st)                                                                               \
    do {                                                                                           \
        if (a.trace && blockIdx.x == 0 && tid == 0)                                                \
            a.trace[14 * a.n_layer + 1 + 7 * il + (st)-1] = strata_dev_clock();                    \
    } while (0)

template <int DPT>
__global__ void __launch_bounds__(STEP_THREADS) decode_step_kernel(struct strata_k_step_args a)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const struct step_smem_layout L = step_layout(a.n_embd, a.n_q, a.n_expert, a.k, a.n_ff_exp);
    uint8_t *region = smem + L.region;
    float *p_logits = (float *)(smem + L.logits);
    int32_t *ids = (int32_t *)(smem + L.ids);
    float *cw = (float *)(smem + L.cw), *vb = (float *)(smem + L.vb);
    float *scratch = (float *)(smem + L.scratch);
    unsigned long long *want = (unsigned long long *)(smem + L.gen);
    const int E = a.n_embd;
    float *xn = (float *)region;          /* stages 1, 5, 6: normed row */
    uint8_t *xq = region + 4 * (size_t)E; /* and as q8 */
    const size_t act_row = mvq_q8_row(a.n_ff_exp);
    const int tid = threadIdx.x;
    int ts = 0; /* stages passed, for the trace */
    if (tid == 0) {
        /* before this block's first arrival the counter is at most G - 1 past the
         * launch's start, a multiple of G */
        *want = *(volatile unsigned long long *)a.bar / gridDim.x * gridDim.x;
        if (a.trace && blockIdx.x == 0)
            a.trace[0] = strata_dev_clock();
    }
    __syncthreads();
    if (a.n_layer > 0)
        for (int i = 0; i < a.layers[0].n_qkv; i++)
            STEP_PREFETCH(a.layers[0].qkv[i].w,
                          (size_t)a.layers[0].qkv[i].ne1 * a.layers[0].qkv[i].nb1);
    for (int il = 0; il < a.n_layer; il++) {
        const struct strata_k_step_layer &Ly = a.layers[il];
        if (!a.dry) {
            /* 1. attn_norm (quantize_q8_kernel's arithmetic in a block of the same size)
             *    and the q/k/v rows */
            STEP_PREFETCH(Ly.wo.w, (size_t)Ly.wo.ne1 * Ly.wo.nb1);
            STEP_PREFETCH(Ly.router, 4 * (size_t)a.n_expert * E);
            norm_q8_row<true, true>(a.x, E, 1, Ly.attn_norm, a.eps, xn, xq, scratch);
            __syncthreads();
            STEP_MID(1);
            for (int i = 0; i < Ly.n_qkv; i++)
                step_mv_any<false>(Ly.qkv[i], xq, 0, NULL, NULL, 1, Ly.qa.q + Ly.qkv_col[i], NULL);
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
        if (!a.dry) {
            /* 2. q/k norms, RoPE, kv store: groups of qkv_post_threads(hd) threads */
            {
                const int gthr = qkv_post_threads(a.hd), gpb = STEP_THREADS / gthr;
                const int grp = tid / gthr;
                const int heads = Ly.qa.n_head + 2 * Ly.qa.n_head_kv;
                for (int h0 = blockIdx.x * gpb; h0 < heads; h0 += gridDim.x * gpb) {
                    const int h = h0 + grp;
                    qkv_post_head(Ly.qa, a.rope, h, 0, tid % gthr, h < heads,
                                  [&](float v) { return qkv_group_sum(v, scratch, gthr); });
                }
            }
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
        if (!a.dry) {
            /* 3. attention tiles */
            {
                const struct strata_k_attn_args &aa = Ly.aa;
                const int n_rows = aa.n_head / aa.n_head_kv;
                const int gdx = (n_rows + ATT_ROWS - 1) / ATT_ROWS;
                const int tiles = gdx * aa.n_head_kv * aa.n_split;
                for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                    const int bx = t % gdx, by = (t / gdx) % aa.n_head_kv,
                              bz = t / (gdx * aa.n_head_kv);
                    attn_tile<DPT>(aa, bx, by, bz, gdx, (struct att_smem *)region);
                    __syncthreads();
                }
            }
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
        if (!a.dry) {
            /* 4. attn_output + residual */
            step_stage(region, a.attq, mvq_q8_row(a.n_q));
            __syncthreads();
            STEP_MID(4);
            step_mv_any<false>(Ly.wo, region, 0, NULL, NULL, 1, a.x, a.x);
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
        if (!a.dry) {
            /* 5. ffn_norm and the router (moe_router_topk_kernel's sums: the thread's
             *    products in order, then the block tree) */
            norm_q8_row<true, true>(a.x, E, 1, Ly.ffn_norm, a.eps, xn, xq, scratch);
            __syncthreads();
            STEP_MID(5);
            for (int e = blockIdx.x; e < a.n_expert; e += gridDim.x) {
                const float4 *wr = (const float4 *)(Ly.router + (size_t)e * E);
                const float4 *xr = (const float4 *)xn;
                float s = 0.0f;
                for (int i = tid; i < E / 4; i += STEP_THREADS)
                    s = fma4(wr[i], xr[i], s);
                s = strata_block_sum(s, scratch);
                if (tid == 0)
                    a.logits[e] = s;
            }
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
        if (!a.dry) {
            /* 6. top-k in every block, then the experts' gate/up */
            if (tid < warpSize) {
                for (int e = tid; e < a.n_expert; e += warpSize)
                    p_logits[e] = strata_ldcg_f(a.logits + e);
                route_warp(p_logits, a.n_expert, a.k, a.norm_topk, a.wscale, ids, cw);
            }
            __syncthreads();
            STEP_MID(6);
            if (blockIdx.x == 0 && tid < a.k) {
                a.eids[tid] = ids[tid];
                a.ew[tid] = cw[tid];
            }
            for (int j = 0; j < a.k; j++)
                STEP_PREFETCH(Ly.down.w + (size_t)ids[j] * Ly.down.nb2, Ly.down.nb2);
            step_glu_any(Ly.gate_up, xq, ids, a.k, (uint8_t *)a.actq, act_row, vb);
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
        if (!a.dry) {
            /* 7. the experts' down products, weighted sum and residual */
            if (il + 1 < a.n_layer) {
                const struct strata_k_step_layer &N = a.layers[il + 1];
                for (int i = 0; i < N.n_qkv; i++)
                    STEP_PREFETCH(N.qkv[i].w, (size_t)N.qkv[i].ne1 * N.qkv[i].nb1);
            }
            step_stage(region, a.actq, (size_t)a.k * act_row);
            __syncthreads();
            STEP_MID(7);
            step_mv_any<true>(Ly.down, region, act_row, ids, cw, a.k, a.x, a.x);
        }
        step_sync(a.bar, want, a.trace ? a.trace + 2 * (++ts) : NULL);
    }
}

int strata_k_decode_step_supported(int n_embd, int hd, int n_ff_exp, int n_expert, int k)
{
    return (hd == 32 || hd == 64 || hd == 128) && n_embd > 0 && n_embd % 32 == 0 && n_ff_exp > 0 &&
           n_ff_exp % 32 == 0 && n_expert > 0 && n_expert <= ROUTE_MAX_EXPERT && k > 0 && k <= 32 &&
           k <= n_expert;
}

typedef void (*step_fn)(struct strata_k_step_args);

static step_fn step_kernel_for(int hd)
{
    return hd == 128  ? decode_step_kernel<16>
           : hd == 64 ? decode_step_kernel<8>
                      : decode_step_kernel<4>;
}

int strata_k_decode_step_blocks(const struct strata_gpu_ctx *ctx,
                                const struct strata_k_step_args *a, int blocks_per_sm)
{
    const struct step_smem_layout L =
        step_layout(a->n_embd, a->n_q, a->n_expert, a->k, a->n_ff_exp);
    step_fn k = step_kernel_for(a->hd);
    if (L.total > 48 * 1024 && cudaFuncSetAttribute(reinterpret_cast<const void *>(k),
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)L.total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int per = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, reinterpret_cast<const void *>(k),
                                                      STEP_THREADS, L.total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (blocks_per_sm > 0 && per > blocks_per_sm)
        per = blocks_per_sm;
    return per * ctx->info.n_sm;
}

int strata_k_decode_step(struct strata_gpu_ctx *ctx, const struct strata_k_step_args *a,
                         int n_blocks, struct strata_err *err)
{
    if (!strata_k_decode_step_supported(a->n_embd, a->hd, a->n_ff_exp, a->n_expert, a->k) ||
        a->n_layer <= 0 || n_blocks <= 0 || !a->layers || !a->bar)
        return strata_k_err(err, STRATA_E_INVALID,
                            "decode_step: bad shape n_embd=%d hd=%d n_ff_exp=%d n_expert=%d k=%d "
                            "n_layer=%d blocks=%d",
                            a->n_embd, a->hd, a->n_ff_exp, a->n_expert, a->k, a->n_layer, n_blocks);
    const struct step_smem_layout L =
        step_layout(a->n_embd, a->n_q, a->n_expert, a->k, a->n_ff_exp);
    dim3 grid((unsigned)n_blocks), block(STEP_THREADS);
    struct strata_k_step_args args = *a;
    void *params[] = {&args};
    cudaError_t e = strata_k_launch_coop(
        ctx, reinterpret_cast<const void *>(step_kernel_for(a->hd)), grid, block, params,
        L.total);
    if (e != cudaSuccess) {
        /* a refused launch (too large a grid for what else runs, no cooperative launch)
         * leaves the context usable: STRATA_E_UNSUPPORTED, and the caller may fall back */
        (void)cudaGetLastError();
        return strata_k_err(err,
                            cudaPeekAtLastError() == cudaSuccess ? STRATA_E_UNSUPPORTED
                                                                 : STRATA_E_GPU,
                            "decode_step_kernel: cooperative launch of %d blocks (%zu bytes "
                            "of shared memory each) failed on device %d: %s",
                            n_blocks, L.total, ctx->info.device, cudaGetErrorString(e));
    }
    return strata_k_check(ctx, "decode_step_kernel", grid, block, err,
                          "n_layer=%d n_embd=%d hd=%d n_expert=%d k=%d", a->n_layer, a->n_embd,
                          a->hd, a->n_expert, a->k);
}
