/* rms_norm.cu - RMSNorm of rows, and the element-wise add. */
#include "kernels.h"

/* One block per row; the sum of squares has a fixed order (thread-strided partial
 * sums, then the block tree). */
__global__ void rms_norm_kernel(const float *x, const float *__restrict__ w, float *y, int n,
                                float eps)
{
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s = fmaf(xr[i], xr[i], s);
    s = strata_block_sum(s, scratch);
    float sc = rsqrtf(s / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = xr[i] * sc * (w ? w[i] : 1.0f);
}

int strata_k_rms_norm(struct strata_gpu_ctx *ctx, const float *x, const float *w, float *y,
                      int n, int n_rows, float eps, struct strata_err *err)
{
    if (n <= 0 || n_rows <= 0)
        return strata_k_err(err, STRATA_E_INVALID, "rms_norm: bad shape n=%d n_rows=%d", n,
                            n_rows);
    dim3 grid((unsigned)n_rows), block(STRATA_GPU_BLOCK);
    rms_norm_kernel<<<grid, block, 0, ctx->stream>>>(x, w, y, n, eps);
    return strata_k_check(ctx, "rms_norm_kernel", grid, block, err, "n=%d n_rows=%d", n, n_rows);
}

__global__ void add_kernel(const float *a, const float *b, float *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a[i] + b[i];
}

int strata_k_add(struct strata_gpu_ctx *ctx, const float *a, const float *b, float *y, int64_t n,
                 struct strata_err *err)
{
    if (n <= 0)
        return strata_k_err(err, STRATA_E_INVALID, "add: bad length %lld", (long long)n);
    dim3 grid((unsigned)((n + STRATA_GPU_BLOCK - 1) / STRATA_GPU_BLOCK)), block(STRATA_GPU_BLOCK);
    add_kernel<<<grid, block, 0, ctx->stream>>>(a, b, y, n);
    return strata_k_check(ctx, "add_kernel", grid, block, err, "n=%lld", (long long)n);
}
