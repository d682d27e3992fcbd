/* moe.cuh - the routing of one token by one warp (softmax, top-k), shared by moe.cu's
 * routing kernels and the fused decode step (decode_step.cu). */
#ifndef STRATA_KERNELS_MOE_CUH
#define STRATA_KERNELS_MOE_CUH

#include "kernels.h"

#include <math.h>

#define ROUTE_MAX_EXPERT 1024
#define ROUTE_WARPS (STRATA_GPU_BLOCK / 32) /* the most warps a block can hold */

/* s + a . b, the four products added in order (x, y, z, w): the router's sum of a
 * thread's part of a row, the same in every kernel that computes router logits. */
static __device__ __forceinline__ float fma4(float4 a, float4 b, float s)
{
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
    s = fmaf(a.z, b.z, s);
    return fmaf(a.w, b.w, s);
}

#define ROUTE_REG 8 /* logits a lane keeps in registers: n_expert <= 8 * warpSize */

/* route_warp for n_expert <= ROUTE_REG * warpSize, with lane l's logits (experts l, l +
 * warpSize, ...) in registers instead of shared memory: the same comparisons and sums
 * in the same order, so the same ids and weights. */
static __device__ void route_warp_reg(const float *p, int n_expert, int k, int norm,
                                      float scale, int32_t *__restrict__ ids,
                                      float *__restrict__ w)
{
    const int lane = threadIdx.x % warpSize;
    float v[ROUTE_REG], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_REG; i++) {
        const int e = lane + i * warpSize;
        v[i] = e < n_expert ? p[e] : -INFINITY;
        if (v[i] != v[i]) /* NaN: never chosen (route_warp) */
            v[i] = -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = strata_warp_max(mx);
    if (mx == -INFINITY)
        mx = 0.0f;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_REG; i++)
        if (lane + i * warpSize < n_expert) {
            v[i] = expf(v[i] - mx);
            s += v[i];
        }
    s = strata_warp_sum(s);
    float sel = 0.0f, wmine = 0.0f;
    int imine = 0;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTE_REG; i++)
            if (lane + i * warpSize < n_expert && v[i] > bv) {
                bv = v[i];
                bi = lane + i * warpSize;
            }
        for (int m = warpSize / 2; m > 0; m >>= 1) {
            float ov = STRATA_SHFL_XOR(bv, m);
            int oi = STRATA_SHFL_XOR(bi, m);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
#pragma unroll
        for (int i = 0; i < ROUTE_REG; i++)
            if (lane + i * warpSize == bi)
                v[i] = -2.0f;
        if (lane == j) {
            wmine = bv / s;
            imine = bi;
        }
        sel += bv / s;
    }
    if (lane < k) {
        ids[lane] = imine;
        w[lane] = (norm ? wmine / sel : wmine) * scale;
    }
}

/* A token's n_expert logits, written by other blocks or the kernel before, copied by one
 * warp from src (read at L2, past this multiprocessor's L1) to dst (shared memory): lane l
 * issues its loads of experts l, l + warpSize, ... together, then stores them, so the
 * copy costs one round trip to L2 rather than one per expert a lane holds.  Lane l
 * stores exactly the experts route_warp_reg's lane l reads back. */
static __device__ __forceinline__ void route_load_warp(const float *src, int n_expert, float *dst)
{
    const int lane = threadIdx.x % warpSize;
    if (n_expert <= ROUTE_REG * warpSize) {
        float v[ROUTE_REG];
#pragma unroll
        for (int i = 0; i < ROUTE_REG; i++) {
            const int e = lane + i * warpSize;
            v[i] = e < n_expert ? strata_ldcg_f(src + e) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < ROUTE_REG; i++)
            if (lane + i * warpSize < n_expert)
                dst[lane + i * warpSize] = v[i];
        return;
    }
    for (int e = lane; e < n_expert; e += warpSize)
        dst[e] = strata_ldcg_f(src + e);
}

/* The routing of one token by one warp: p (shared memory) holds its n_expert logits;
 * the softmax and k rounds of a warp argmax, shuffles only; ids [k] and w [k] out.  p
 * may be overwritten (more than ROUTE_REG * warpSize experts). */
static __device__ void route_warp(float *p, int n_expert, int k, int norm, float scale,
                                  int32_t *__restrict__ ids, float *__restrict__ w)
{
    if (n_expert <= ROUTE_REG * warpSize) {
        route_warp_reg(p, n_expert, k, norm, scale, ids, w);
        return;
    }
    int lane = threadIdx.x % warpSize;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += warpSize) {
        /* a NaN logit (a model whose activations overflowed) is never chosen, and a row
         * of them still yields valid expert ids: the experts' kernels index with them */
        if (p[e] != p[e])
            p[e] = -INFINITY;
        mx = fmaxf(mx, p[e]);
    }
    mx = strata_warp_max(mx);
    if (mx == -INFINITY)
        mx = 0.0f;
    float s = 0.0f;
    for (int e = lane; e < n_expert; e += warpSize) {
        p[e] = expf(p[e] - mx);
        s += p[e];
    }
    s = strata_warp_sum(s);
    /* lane j keeps the j-th choice (k <= 32 <= warpSize) */
    float sel = 0.0f, wmine = 0.0f;
    int imine = 0;
    for (int j = 0; j < k; j++) {
        float bv = -1.0f;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_expert; e += warpSize)
            if (p[e] > bv) {
                bv = p[e];
                bi = e;
            }
        for (int m = warpSize / 2; m > 0; m >>= 1) {
            float ov = STRATA_SHFL_XOR(bv, m);
            int oi = STRATA_SHFL_XOR(bi, m);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi < n_expert && lane == bi % warpSize)
            p[bi] = -2.0f;
        if (lane == j) {
            wmine = bv / s;
            imine = bi;
        }
        sel += bv / s;
    }
    if (lane < k) {
        ids[lane] = imine;
        w[lane] = (norm ? wmine / sel : wmine) * scale;
    }
}

#endif
