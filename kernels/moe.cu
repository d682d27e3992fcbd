/* moe.cu - MoE routing (softmax, top-k), the per-expert plan of a batch, and the
 * weighted combine of the expert outputs. */
#include "kernels.h"

#include <math.h>

/* Block-wide argmax of (v, i): the largest v, the lowest i among equals.  All
 * threads get the result.  scratch: 2 * STRATA_GPU_MAX_WARP words. */
static __device__ void block_argmax(float *v, int *i, float *sv, int *si)
{
    for (int m = warpSize / 2; m > 0; m >>= 1) {
        float ov = STRATA_SHFL_XOR(*v, m);
        int oi = STRATA_SHFL_XOR(*i, m);
        if (ov > *v || (ov == *v && oi < *i)) {
            *v = ov;
            *i = oi;
        }
    }
    int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    __syncthreads();
    if (lane == 0) {
        sv[wid] = *v;
        si[wid] = *i;
    }
    __syncthreads();
    *v = sv[0];
    *i = si[0];
    for (int w = 1; w < (int)(blockDim.x / warpSize); w++)
        if (sv[w] > *v || (sv[w] == *v && si[w] < *i)) {
            *v = sv[w];
            *i = si[w];
        }
}

#define ROUTE_MAX_EXPERT 1024

__global__ void moe_route_kernel(const float *__restrict__ logits, int n_expert, int k, int norm,
                                 float scale, int32_t *__restrict__ ids, float *__restrict__ w)
{
    __shared__ float p[ROUTE_MAX_EXPERT];
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    __shared__ float sv[STRATA_GPU_MAX_WARP];
    __shared__ int si[STRATA_GPU_MAX_WARP];
    const float *lr = logits + (int64_t)blockIdx.x * n_expert;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        p[e] = lr[e];
        mx = fmaxf(mx, p[e]);
    }
    mx = strata_block_max(mx, scratch);
    float s = 0.0f;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        p[e] = expf(p[e] - mx);
        s += p[e];
    }
    s = strata_block_sum(s, scratch);
    float sel = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = 0x7fffffff;
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x)
            if (p[e] > bv) {
                bv = p[e];
                bi = e;
            }
        block_argmax(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            ids[(int64_t)blockIdx.x * k + j] = bi;
            w[(int64_t)blockIdx.x * k + j] = bv / s;
            p[bi] = -2.0f;
        }
        sel += bv / s;
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int j = 0; j < k; j++) {
            float *wj = &w[(int64_t)blockIdx.x * k + j];
            *wj = (norm ? *wj / sel : *wj) * scale;
        }
}

int strata_k_moe_route(struct strata_gpu_ctx *ctx, const float *logits, int n_tok,
                       int n_expert, int k, int norm, float scale, int32_t *ids, float *w,
                       struct strata_err *err)
{
    if (n_tok <= 0 || n_expert <= 0 || n_expert > ROUTE_MAX_EXPERT || k <= 0 || k > n_expert)
        return strata_k_err(err, STRATA_E_INVALID,
                            "moe_route: bad shape n_tok=%d n_expert=%d k=%d (n_expert <= %d)",
                            n_tok, n_expert, k, ROUTE_MAX_EXPERT);
    dim3 grid((unsigned)n_tok), block(STRATA_GPU_BLOCK);
    moe_route_kernel<<<grid, block, 0, ctx->stream>>>(logits, n_expert, k, norm, scale, ids, w);
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
