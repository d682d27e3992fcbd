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

/* The warp's largest (*bv, *bi), the lowest *bi of equal *bv, in every lane.  A lane's
 * *bv is a softmax value (>= 0, never NaN) or -1 (none left): as int32 bits these order
 * as the floats do, so on sm_80+ two warp reductions (redux.sync: the largest bits,
 * then the lowest index among the lanes that hold them) give what the shuffle tree
 * gives elsewhere - the same choice, in 2 instructions instead of 5 dependent steps. */
static __device__ __forceinline__ void route_warp_argmax(float *bv, int *bi)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int kb = __float_as_int(*bv);
    const int mb = __reduce_max_sync(0xffffffffu, kb);
    *bi = __reduce_min_sync(0xffffffffu, kb == mb ? *bi : 0x7fffffff);
    *bv = __int_as_float(mb);
#else
    for (int m = warpSize / 2; m > 0; m >>= 1) {
        const float ov = STRATA_SHFL_XOR(*bv, m);
        const int oi = STRATA_SHFL_XOR(*bi, m);
        if (ov > *bv || (ov == *bv && oi < *bi)) {
            *bv = ov;
            *bi = oi;
        }
    }
#endif
}

/* The largest of the warp's floats (none NaN), in every lane.  On sm_80+ one warp
 * reduction of int32 keys that order as the floats do (negative floats' magnitude bits
 * flipped; the map is its own inverse); the max is exact either way, and a +0 / -0 that
 * comes out the other way changes no exp(v - max). */
static __device__ __forceinline__ float route_warp_max(float v)
{
#if defined(STRATA_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int b = __float_as_int(v);
    const int m = __reduce_max_sync(0xffffffffu, b ^ ((b >> 31) & 0x7fffffff));
    return __int_as_float(m ^ ((m >> 31) & 0x7fffffff));
#else
    return strata_warp_max(v);
#endif
}

/* route_warp for n_expert <= NS * warpSize, with lane l's logits (experts l, l +
 * warpSize, ...) in registers instead of shared memory.  The softmax sums in
 * route_warp's order; then each lane sorts its NS values once (larger first, equal ones
 * the lower id first), so that a round of the top-k compares only the lanes' heads - the
 * largest value left, the lowest id of equal ones, as a scan of every value would give -
 * and the winner drops its head.  The same ids and weights as route_warp. */
template <int NS>
static __device__ void route_warp_reg(const float *p, int n_expert, int k, int norm,
                                      float scale, int32_t *__restrict__ ids,
                                      float *__restrict__ w)
{
    const int lane = threadIdx.x % warpSize;
    float v[NS], mx = -INFINITY;
    int id[NS];
#pragma unroll
    for (int i = 0; i < NS; i++) {
        const int e = lane + i * warpSize;
        v[i] = e < n_expert ? p[e] : -INFINITY;
        if (v[i] != v[i]) /* NaN: never chosen (route_warp) */
            v[i] = -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = route_warp_max(mx);
    if (mx == -INFINITY)
        mx = 0.0f;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NS; i++) {
        const int e = lane + i * warpSize;
        if (e < n_expert) {
            v[i] = expf(v[i] - mx);
            s += v[i];
            id[i] = e;
        } else { /* no expert: after every real one, as a lane with none left */
            v[i] = -1.0f;
            id[i] = 0x7fffffff;
        }
    }
    s = strata_warp_sum(s);
    /* odd-even transposition sort of the lane's NS (value, id) pairs */
#pragma unroll
    for (int r = 0; r < NS; r++)
#pragma unroll
        for (int i = r % 2; i + 1 < NS; i += 2) {
            const bool sw = v[i + 1] > v[i] || (v[i + 1] == v[i] && id[i + 1] < id[i]);
            const float tv = v[i];
            const int ti = id[i];
            v[i] = sw ? v[i + 1] : v[i];
            id[i] = sw ? id[i + 1] : id[i];
            v[i + 1] = sw ? tv : v[i + 1];
            id[i + 1] = sw ? ti : id[i + 1];
        }
    float sel = 0.0f, wmine = 0.0f;
    int imine = 0;
    for (int j = 0; j < k; j++) {
        float bv = v[0];
        int bi = id[0];
        route_warp_argmax(&bv, &bi);
        if (id[0] == bi) { /* this lane's head was taken (ids are unique) */
#pragma unroll
            for (int i = 0; i + 1 < NS; i++) {
                v[i] = v[i + 1];
                id[i] = id[i + 1];
            }
            v[NS - 1] = -1.0f;
            id[NS - 1] = 0x7fffffff;
        }
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
    if (n_expert <= 4 * warpSize) {
        route_warp_reg<4>(p, n_expert, k, norm, scale, ids, w);
        return;
    }
    if (n_expert <= ROUTE_REG * warpSize) {
        route_warp_reg<ROUTE_REG>(p, n_expert, k, norm, scale, ids, w);
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
        route_warp_argmax(&bv, &bi);
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
