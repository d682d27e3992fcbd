/* rope.cuh - per-head q/k RMSNorm, rotary position embedding and the kv cache store of
 * one head, shared by rope.cu's qkv_post_kernel and the fused decode step
 * (decode_step.cu). */
#ifndef STRATA_KERNELS_ROPE_CUH
#define STRATA_KERNELS_ROPE_CUH

#include "kernels.h"

/* One (head of q, k or v; token) by a group of threads: thread p (of hd / 2 rounded
 * up to 64) owns the pair of values that RoPE rotates together (both halves of a neox
 * pair, or 2p and 2p + 1).  In two parts: qkv_post_prep reads nothing the kernel before
 * writes (the position, copied before the step's first kernel, the norm weights) and
 * computes the pair's indices, weights and rotation, so a launch can run it before its
 * programmatic-dependent-launch wait; qkv_post_apply loads the pair, norms, rotates and
 * stores it.  sum(v): the group's sum of v, called by every thread of the group whatever
 * the head, and also when qkv_post_head's active is 0 (a group with no head: it only
 * takes part in the sum), since the fused decode step runs several groups in a block.
 * q, k and v are read through L2: in the fused decode step other blocks wrote them.
 * Every product and sum is written out (fmaf where one is fused), so that each kernel
 * this is inlined into gets the same bits whatever the compiler contracts around it. */
struct qkv_post_pair {
    float *src;     /* the head's row of q, k or v */
    __half *dst;    /* k or v: the head's row of the kv cache; q: NULL */
    int i0, i1;     /* the pair's indices in the row */
    int have;       /* 2p < hd: the thread owns a pair */
    int norm, rot;  /* q/k norm; RoPE (q and k, pairs under n_rot) */
    float w0, w1;   /* the norm weights of i0, i1 (0 where past the row) */
    float c, s;     /* cos and sin of the pair's angle, times the attention factor */
};

static __device__ __forceinline__ struct qkv_post_pair qkv_post_prep(
    const struct strata_k_qkv_args &a, const struct strata_k_rope &rp, int hidx, int t, int p)
{
    struct qkv_post_pair q;
    const int hd = a.hd, pos = *a.pos0 + t;
    const float *nw;
    int kv_head = -1, is_v = 0;
    if (hidx < a.n_head) {
        q.src = a.q + t * a.q_stride + (int64_t)hidx * hd;
        nw = a.q_norm;
    } else if (hidx < a.n_head + a.n_head_kv) {
        kv_head = hidx - a.n_head;
        q.src = a.k + t * a.k_stride + (int64_t)kv_head * hd;
        nw = a.k_norm;
    } else {
        kv_head = hidx - a.n_head - a.n_head_kv;
        q.src = a.v + t * a.v_stride + (int64_t)kv_head * hd;
        nw = NULL;
        is_v = 1;
    }
    const int half_rot = rp.n_rot / 2;
    /* element indices of this thread's pair; past n_rot unrotated pairs */
    if (p < half_rot) {
        q.i0 = rp.mode == 2 ? p : 2 * p;
        q.i1 = rp.mode == 2 ? p + half_rot : 2 * p + 1;
    } else {
        q.i0 = 2 * p;
        q.i1 = 2 * p + 1;
    }
    q.have = 2 * p < hd;
    q.norm = nw != NULL;
    q.w0 = nw && q.have ? nw[q.i0] : 0.0f;
    q.w1 = nw && q.have && q.i1 < hd ? nw[q.i1] : 0.0f;
    q.rot = !is_v && p < half_rot;
    q.c = q.s = 0.0f;
    if (q.have && q.rot) {
        /* ggml's rope_yarn */
        const float theta_extrap =
            (float)pos * powf(rp.freq_base, -2.0f * (float)p / (float)rp.n_rot);
        const float theta_interp = rp.freq_scale * theta_extrap;
        float theta = theta_interp, mscale = rp.attn_factor;
        if (rp.ext_factor != 0.0f) {
            const float y = ((float)p - rp.corr_dims[0]) /
                            fmaxf(0.001f, rp.corr_dims[1] - rp.corr_dims[0]);
            const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * rp.ext_factor;
            theta = fmaf(theta_extrap, ramp, theta_interp * (1.0f - ramp));
            mscale *= fmaf(0.1f, logf(1.0f / rp.freq_scale), 1.0f);
        }
        q.c = cosf(theta) * mscale;
        q.s = sinf(theta) * mscale;
    }
    q.dst = kv_head < 0 ? NULL
                        : (is_v ? a.v_cache : a.k_cache) +
                              ((int64_t)pos * a.n_head_kv + kv_head) * hd;
    return q;
}

template <class SUM>
static __device__ __forceinline__ void qkv_post_apply(const struct strata_k_qkv_args &a,
                                                      const struct qkv_post_pair &q, SUM sum)
{
    const int hd = a.hd;
    float x0 = q.have ? strata_ldcg_f(q.src + q.i0) : 0.0f;
    float x1 = q.have && q.i1 < hd ? strata_ldcg_f(q.src + q.i1) : 0.0f;
    const float s2 = sum(fmaf(x0, x0, x1 * x1));
    if (q.norm) {
        const float sc = rsqrtf(s2 / (float)hd + a.eps);
        x0 = x0 * sc * q.w0;
        x1 = x1 * sc * q.w1;
    }
    if (!q.have)
        return;
    if (q.rot) {
        const float r0 = fmaf(x0, q.c, -(x1 * q.s)), r1 = fmaf(x0, q.s, x1 * q.c);
        x0 = r0;
        x1 = r1;
    }
    if (!q.dst) {
        q.src[q.i0] = x0;
        if (q.i1 < hd)
            q.src[q.i1] = x1;
        return;
    }
    q.dst[q.i0] = __float2half(x0);
    if (q.i1 < hd)
        q.dst[q.i1] = __float2half(x1);
}

/* Both parts at once (see qkv_post_prep). */
template <class SUM>
static __device__ void qkv_post_head(const struct strata_k_qkv_args &a,
                                     const struct strata_k_rope &rp, int hidx, int t, int p,
                                     int active, SUM sum)
{
    if (!active) {
        (void)sum(0.0f);
        return;
    }
    qkv_post_apply(a, qkv_post_prep(a, rp, hidx, t, p), sum);
}

/* Threads of qkv_post_head's group for head dim hd. */
static __host__ __device__ inline int qkv_post_threads(int hd)
{
    return (hd / 2 + 63) / 64 * 64;
}

/* qkv_post_head's sum for groups of gthr threads (a multiple of the warp size) side by
 * side in a block: strata_block_sum's order over the group's warps, so a group gets the
 * bits qkv_post_kernel's block of gthr threads gets.  Every thread of the block calls
 * it (barriers); scratch: blockDim.x / warpSize floats of shared memory. */
static __device__ __forceinline__ float qkv_group_sum(float v, float *scratch, int gthr)
{
    const int nw = gthr / warpSize, grp = threadIdx.x / gthr;
    v = strata_warp_sum(v);
    __syncthreads();
    if (threadIdx.x % warpSize == 0)
        scratch[threadIdx.x / warpSize] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++)
        s += scratch[grp * nw + i];
    return s;
}

#endif
