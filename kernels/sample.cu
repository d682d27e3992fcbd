/* sample.cu - argmax and top-k of logits rows on the device. */
#include "kernels.h"

#include <math.h>

static __device__ void better(float *v, int *i, float ov, int oi)
{
    if (ov > *v || (ov == *v && oi < *i)) {
        *v = ov;
        *i = oi;
    }
}

static __device__ void block_argmax(float *v, int *i, float *sv, int *si)
{
    for (int m = warpSize / 2; m > 0; m >>= 1)
        better(v, i, STRATA_SHFL_XOR(*v, m), STRATA_SHFL_XOR(*i, m));
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
        better(v, i, sv[w], si[w]);
}

/* NaN logits never win: they compare false. */
__global__ void topk_kernel(const float *__restrict__ logits, int n, int k,
                            int32_t *__restrict__ ids, float *__restrict__ vals)
{
    __shared__ float sv[STRATA_GPU_MAX_WARP];
    __shared__ int si[STRATA_GPU_MAX_WARP];
    const float *lr = logits + (int64_t)blockIdx.x * n;
    float last_v = INFINITY;
    int last_i = -1;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            float x = lr[e];
            /* strictly after (last_v, last_i) in (value desc, index asc) order */
            int after = x < last_v || (x == last_v && e > last_i);
            if (after && (x > bv || (x == bv && e < bi))) {
                bv = x;
                bi = e;
            }
        }
        block_argmax(&bv, &bi, sv, si);
        if (bi == 0x7fffffff)
            bi = -1;
        if (threadIdx.x == 0) {
            if (ids)
                ids[(int64_t)blockIdx.x * k + j] = bi;
            if (vals)
                vals[(int64_t)blockIdx.x * k + j] = bv;
        }
        last_v = bv;
        last_i = bi;
        __syncthreads();
    }
}

int strata_k_topk(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows, int k,
                  int32_t *ids, float *vals, struct strata_err *err)
{
    if (n <= 0 || n_rows <= 0 || k <= 0 || k > 64 || k > n)
        return strata_k_err(err, STRATA_E_INVALID, "topk: bad shape n=%d n_rows=%d k=%d (k <= 64)",
                            n, n_rows, k);
    dim3 grid((unsigned)n_rows), block(1024);
    topk_kernel<<<grid, block, 0, ctx->stream>>>(logits, n, k, ids, vals);
    return strata_k_check(ctx, "topk_kernel", grid, block, err, "n=%d n_rows=%d k=%d", n, n_rows,
                          k);
}

int strata_k_argmax(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                    int32_t *ids, struct strata_err *err)
{
    return strata_k_topk(ctx, logits, n, n_rows, 1, ids, NULL, err);
}
