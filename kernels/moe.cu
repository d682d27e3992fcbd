/* moe.cu - MoE routing (softmax, top-k), the per-expert plan of a batch, and the
 * weighted combine of the expert outputs. */
#include "moe.cuh"
#include "mvq.cuh"

#include <math.h>

/* One warp per token. */
__global__ void moe_route_kernel(const float *__restrict__ logits, int n_tok, int n_expert, int k,
                                 int norm, float scale, int32_t *__restrict__ ids,
                                 float *__restrict__ w)
{
    __shared__ float pbuf[ROUTE_WARPS][ROUTE_MAX_EXPERT];
    int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    int t = blockIdx.x * (blockDim.x / warpSize) + wid;
    if (t >= n_tok)
        return;
    float *p = pbuf[wid];
    const float *lr = logits + (int64_t)t * n_expert;
    for (int e = lane; e < n_expert; e += warpSize)
        p[e] = lr[e];
    route_warp(p, n_expert, k, norm, scale, ids + (int64_t)t * k, w + (int64_t)t * k);
}

/* the block size of quantize_q8_kernel: the fused RMSNorm sums in its order */
#define ROUTER_THREADS STRATA_GPU_BLOCK
#define ROUTER_PRE 4       /* float4s of its router row a thread loads before the PDL wait */
#define ROUTER_MAX_TOK 64  /* tokens of one moe_router_topk launch */
#define ROUTER_WARPS 4     /* warps of the last block that route, one token each */

/* Router and routing in one launch (decode-sized batches).  Block e owns expert e:
 * its threads load their part of the router row (float4 i = thread + j * blockDim.x)
 * before waiting for the kernel that wrote x, so that the weights' memory latency
 * overlaps that kernel; then, per token, the thread's products in the order of i and the
 * block tree (strata_block_sum): the order depends on n and the warp size only, never
 * on n_tok.  The last block done routes every token as moe_route_kernel does (a warp
 * per token) and resets the counter.
 *
 * NORM: x is the residual row, and the block first normalises it (ffn_norm) as
 * quantize_q8_kernel would: the same scale (row_sumsq_part and the block tree, same
 * block size), the same products x * scale * w, so the logits are those of the
 * two-launch path bitwise.  The eight lanes that hold a 32-value block of the normed row
 * (float4s 8m .. 8m + 7) also write it as floats (rn.y) and q8 (rn.yq, rows of
 * mvq_q8_row(n) bytes) in the one block that owns it (block m mod the grid), for the
 * experts' products that follow: one launch fewer per layer.
 *
 * hr.ids (one token): the owning blocks also store their blocks of the experts' input
 * row (normed or not) to hr.xn in host memory and fence them to system scope before the
 * count; the last block stores the ids to hr.ids, fences, and thread 0 writes hr.seq to
 * hr.flag: a host that sees the flag sees both. */

/* One float4 i (of n4) of a token's row: s + the router row's wv . xv (xv normed first
 * when NORM: scale sc, norm weights g; its q8 block written by the block that owns it).
 * Called by every lane of the warp (the q8 shuffles); i >= n4 adds nothing. */
template <bool NORM>
static __device__ __forceinline__ float router_step(int i, int n4, float4 xv, float4 wv,
                                                    float4 g, float sc, int gl, int n, int e,
                                                    float *yt, uint8_t *qt, float *hx, float s)
{
    const int act = i < n4;
    const int own = act && (i / 8) % (int)gridDim.x == e;
    if (NORM) {
        float v[4] = {xv.x * sc * g.x, xv.y * sc * g.y, xv.z * sc * g.z, xv.w * sc * g.w};
        if (qt)
            q8_store4(v, own, gl, i / 8, n, yt, qt);
        else if (yt && own)
            *(float4 *)(yt + 4 * i) = make_float4(v[0], v[1], v[2], v[3]);
        xv = make_float4(v[0], v[1], v[2], v[3]);
    }
    if (hx && own) /* the host's copy of the experts' input */
        *(float4 *)(hx + 4 * i) = xv;
    return act ? fma4(wv, xv, s) : s;
}

template <bool NORM>
__global__ void __launch_bounds__(ROUTER_THREADS)
    moe_router_topk_kernel(const float *__restrict__ rw, const float *__restrict__ x, int n,
                           int n_tok, int n_expert, float *logits, int *counter, int k,
                           int norm, float scale, int32_t *__restrict__ ids,
                           float *__restrict__ w, struct strata_k_norm_q8 rn,
                           struct strata_k_host_route hr)
{
    /* per token and warp: the warp's part of the sum of squares, then of the logit; the
     * block tree of strata_block_sum taken for every token at once (one barrier per
     * phase instead of two per token) */
    __shared__ float red[2][ROUTER_MAX_TOK][ROUTER_THREADS / 32];
    __shared__ float p[ROUTER_WARPS][ROUTE_MAX_EXPERT];
    __shared__ int last;
    const int e = blockIdx.x, n4 = n / 4;
    const int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    const int nwarp = blockDim.x / warpSize;
    const float4 *wr = (const float4 *)(rw + (int64_t)e * n);
    const float4 *gw = (const float4 *)rn.w;
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 pre[ROUTER_PRE], gpre[NORM ? ROUTER_PRE : 1];
#pragma unroll
    for (int j = 0; j < ROUTER_PRE; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        pre[j] = i < n4 ? wr[i] : z;
        if (NORM)
            gpre[j] = i < n4 ? gw[i] : z;
    }
    strata_pdl_wait();
    strata_pdl_trigger();
    /* token 0's float4s in the same round trip as the norm's loads (a decode step) */
    float4 x0[ROUTER_PRE];
#pragma unroll
    for (int j = 0; j < ROUTER_PRE; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        x0[j] = i < n4 ? ((const float4 *)x)[i] : z;
    }
    if (NORM) {
        for (int t = 0; t < n_tok; t++) {
            const float v = strata_warp_sum(row_sumsq_part<false>(x + (int64_t)t * n, n, NULL));
            if (lane == 0)
                red[0][t][wid] = v;
        }
        __syncthreads();
    }
    strata_tl_mark(0, blockIdx.x == 0);
    const int gl = threadIdx.x % 8;
    /* warp-uniform bounds: the q8 blocks' shuffles need every lane */
    const int lane0 = threadIdx.x - lane;
    for (int t = 0; t < n_tok; t++) {
        const float4 *xr = (const float4 *)(x + (int64_t)t * n);
        float sc = 1.0f;
        if (NORM) {
            float ss = 0.0f;
            for (int i = 0; i < nwarp; i++)
                ss += red[0][t][i];
            sc = rms_scale_of(ss, n, rn.eps);
        }
        float *yt = NORM && rn.y ? rn.y + (int64_t)t * n : NULL;
        float *hx = hr.ids ? hr.xn : NULL; /* n_tok 1 */
        uint8_t *qt = NORM && rn.yq ? (uint8_t *)rn.yq + (size_t)t * mvq_q8_row(n) : NULL;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < ROUTER_PRE; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (lane0 + j * (int)blockDim.x < n4)
                s = router_step<NORM>(i, n4, t == 0 ? x0[j] : i < n4 ? xr[i] : z, pre[j],
                                      gpre[NORM ? j : 0], sc, gl, n, e, yt, qt, hx, s);
        }
        for (int j = ROUTER_PRE; lane0 + j * (int)blockDim.x < n4; j++) {
            const int i = threadIdx.x + j * blockDim.x, act = i < n4;
            s = router_step<NORM>(i, n4, act ? xr[i] : z, act ? wr[i] : z,
                                  NORM && act ? gw[i] : z, sc, gl, n, e, yt, qt, hx, s);
        }
        strata_tl_mark(19, blockIdx.x == 0 && t == 0);
        s = strata_warp_sum(s);
        if (lane == 0)
            red[1][t][wid] = s;
    }
    __syncthreads();
    strata_tl_mark(1, blockIdx.x == 0);
    if ((int)threadIdx.x < n_tok) {
        float s = 0.0f;
        for (int i = 0; i < nwarp; i++)
            s += red[1][threadIdx.x][i];
        logits[(int64_t)threadIdx.x * n_expert + e] = s;
    }
    strata_tl_mark(7, blockIdx.x == 0);
    if (!counter) /* logits only: the launch's end makes them visible */
        return;
    __threadfence();
    if (hr.ids)
        __threadfence_system(); /* this block's part of xn before the count */
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    __syncthreads();
    strata_tl_mark(2, blockIdx.x == 0);
    strata_tl_mark(3, last);
    strata_tl_mark(6, true);
    if (!last)
        return;
    __threadfence();
    const int nw = min(nwarp, ROUTER_WARPS);
    for (int t = wid; wid < nw && t < n_tok; t += nw) {
        route_load_warp(logits + (int64_t)t * n_expert, n_expert, p[wid]);
        route_warp(p[wid], n_expert, k, norm, scale, ids + (int64_t)t * k, w + (int64_t)t * k);
    }
    strata_tl_mark(4, true);
    if (hr.ids) {
        /* the ids, then (every block's xn before its count, these before the barrier) the
         * flag */
        if (wid == 0 && lane < k)
            hr.ids[lane] = ids[lane];
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            *(volatile unsigned *)hr.flag = hr.seq;
        }
    }
    if (threadIdx.x == 0)
        *counter = 0;
    strata_tl_mark(5, true);
}

int strata_k_moe_router_topk(struct strata_gpu_ctx *ctx, const struct strata_k_weight *rw,
                             const float *x, int n_tok, float *logits, int *counter, int k,
                             int norm, float scale, int32_t *ids, float *w,
                             const struct strata_k_norm_q8 *fn,
                             const struct strata_k_host_route *hr, struct strata_err *err)
{
    int n = (int)rw->ne0, n_expert = (int)rw->ne1;
    if (rw->type != 0 /* F32 */ || rw->ne0 % 4 || rw->ne0 > INT32_MAX ||
        rw->nb1 != 4 * (size_t)rw->ne0 || n_tok <= 0 || n_tok > ROUTER_MAX_TOK ||
        n_expert <= 0 || n_expert > ROUTE_MAX_EXPERT || k <= 0 || k > n_expert || k > 32 ||
        (!counter && hr) || ((uintptr_t)x & 15) || ((uintptr_t)rw->data & 15))
        return strata_k_err(err, STRATA_E_INVALID,
                            "moe_router_topk: bad shape type=%u n=%d n_expert=%d n_tok=%d k=%d "
                            "(F32 router, n %% 4 == 0, n_expert <= %d, n_tok <= %d, k <= 32; "
                            "results for the host need the routing's counter)",
                            rw->type, n, n_expert, n_tok, k, ROUTE_MAX_EXPERT, ROUTER_MAX_TOK);
    const struct strata_k_norm_q8 none = {NULL, 0.0f, NULL, NULL};
    if (fn) {
        if (n % 32 || !fn->w || ((uintptr_t)fn->w & 15) || ((uintptr_t)fn->y & 15) ||
            ((uintptr_t)fn->yq & 15) || fn->y == x || (const void *)fn->yq == (const void *)x)
            return strata_k_err(err, STRATA_E_INVALID,
                                "moe_router_topk: the fused RMSNorm needs n %% 32 == 0 (n=%d), "
                                "16-byte aligned weights and rows, and outputs apart from x", n);
    }
    const struct strata_k_host_route no_host = {NULL, NULL, NULL, 0};
    if (hr && (n_tok != 1 || !hr->ids || !hr->flag || ((uintptr_t)hr->xn & 15)))
        return strata_k_err(err, STRATA_E_INVALID,
                            "moe_router_topk: results for the host need one token, ids, a flag "
                            "and a 16-byte aligned row (n_tok=%d)", n_tok);
    dim3 grid((unsigned)n_expert), block(ROUTER_THREADS);
    if (fn)
        strata_k_launch(ctx, moe_router_topk_kernel<true>, grid, block, (const float *)rw->data,
                        x, n, n_tok, n_expert, logits, counter, k, norm, scale, ids, w, *fn,
                        hr ? *hr : no_host);
    else
        strata_k_launch(ctx, moe_router_topk_kernel<false>, grid, block, (const float *)rw->data,
                        x, n, n_tok, n_expert, logits, counter, k, norm, scale, ids, w, none,
                        hr ? *hr : no_host);
    return strata_k_check(ctx, "moe_router_topk_kernel", grid, block, err,
                          "n=%d n_expert=%d n_tok=%d k=%d norm=%d", n, n_expert, n_tok, k,
                          fn != NULL);
}

int strata_k_moe_route(struct strata_gpu_ctx *ctx, const float *logits, int n_tok,
                       int n_expert, int k, int norm, float scale, int32_t *ids, float *w,
                       struct strata_err *err)
{
    if (n_tok <= 0 || n_expert <= 0 || n_expert > ROUTE_MAX_EXPERT || k <= 0 || k > n_expert ||
        k > 32)
        return strata_k_err(err, STRATA_E_INVALID,
                            "moe_route: bad shape n_tok=%d n_expert=%d k=%d (n_expert <= %d, "
                            "k <= 32)", n_tok, n_expert, k, ROUTE_MAX_EXPERT);
    int per = STRATA_GPU_BLOCK / ctx->info.warp_size;
    dim3 grid((unsigned)((n_tok + per - 1) / per)), block(STRATA_GPU_BLOCK);
    moe_route_kernel<<<grid, block, 0, ctx->stream>>>(logits, n_tok, n_expert, k, norm, scale,
                                                      ids, w);
    return strata_k_check(ctx, "moe_route_kernel", grid, block, err, "n_tok=%d n_expert=%d k=%d",
                          n_tok, n_expert, k);
}

__global__ void moe_combine_kernel(const float *__restrict__ y, const float *__restrict__ w,
                                   int k, int n, const float *add, float *out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= n)
        return;
    float acc = add ? add[(int64_t)t * n + i] : 0.0f;
    float s = 0.0f;
    for (int j = 0; j < k; j++)
        s = fmaf(w[t * k + j], y[((int64_t)t * k + j) * n + i], s);
    out[(int64_t)t * n + i] = acc + s;
}

int strata_k_moe_combine(struct strata_gpu_ctx *ctx, const float *y, const float *w, int n_tok,
                         int k, int n, const float *add, float *out, struct strata_err *err)
{
    if (n_tok <= 0 || k <= 0 || n <= 0 || n_tok > 65535)
        return strata_k_err(err, STRATA_E_INVALID, "moe_combine: bad shape n_tok=%d k=%d n=%d",
                            n_tok, k, n);
    dim3 grid((unsigned)((n + STRATA_GPU_BLOCK - 1) / STRATA_GPU_BLOCK), (unsigned)n_tok),
        block(STRATA_GPU_BLOCK);
    moe_combine_kernel<<<grid, block, 0, ctx->stream>>>(y, w, k, n, add, out);
    return strata_k_check(ctx, "moe_combine_kernel", grid, block, err, "n_tok=%d k=%d n=%d",
                          n_tok, k, n);
}

int strata_k_moe_max_tiles(int n_asg, int n_expert)
{
    return n_asg / STRATA_K_MM_BN + (n_expert < n_asg ? n_expert : n_asg);
}

/* One block: count the assignments per expert, lay the experts out in order, cut
 * each expert's run into tiles (expert, start, end), and scatter the assignment ids.
 * The order inside an expert's run does not matter: every output element of the
 * grouped product is computed on its own with a fixed summation order. */
__global__ void moe_plan_kernel(const int32_t *__restrict__ ids, int n_asg, int n_expert,
                                int32_t *__restrict__ perm, int32_t *__restrict__ tiles,
                                int32_t *__restrict__ n_tiles)
{
    __shared__ int count[ROUTE_MAX_EXPERT], off[ROUTE_MAX_EXPERT];
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x)
        count[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_asg; i += blockDim.x)
        atomicAdd(&count[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, nt = 0;
        for (int e = 0; e < n_expert; e++) {
            off[e] = o;
            for (int s = 0; s < count[e]; s += STRATA_K_MM_BN) {
                tiles[3 * nt] = e;
                tiles[3 * nt + 1] = o + s;
                tiles[3 * nt + 2] = o + min(count[e], s + STRATA_K_MM_BN);
                nt++;
            }
            o += count[e];
            count[e] = 0;
        }
        *n_tiles = nt;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_asg; i += blockDim.x) {
        int e = ids[i];
        perm[off[e] + atomicAdd(&count[e], 1)] = i;
    }
}

int strata_k_moe_plan(struct strata_gpu_ctx *ctx, const int32_t *ids, int n_asg,
                      int n_expert, int32_t *perm, int32_t *tiles, int32_t *n_tiles,
                      struct strata_err *err)
{
    if (n_asg <= 0 || n_expert <= 0 || n_expert > ROUTE_MAX_EXPERT)
        return strata_k_err(err, STRATA_E_INVALID, "moe_plan: bad shape n_asg=%d n_expert=%d",
                            n_asg, n_expert);
    dim3 grid(1), block(1024);
    moe_plan_kernel<<<grid, block, 0, ctx->stream>>>(ids, n_asg, n_expert, perm, tiles, n_tiles);
    return strata_k_check(ctx, "moe_plan_kernel", grid, block, err, "n_asg=%d n_expert=%d", n_asg,
                          n_expert);
}
