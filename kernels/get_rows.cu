/* get_rows.cu - dequantise selected rows (token embeddings) or whole matrices. */
#include "kernels.h"

#include "dequant.cuh"

/* One thread per chunk of 8 values of one row. */
template <int T>
__global__ void get_rows_kernel(const uint8_t *__restrict__ w, size_t nb1, int ne0,
                                const int32_t *__restrict__ rows, float *__restrict__ dst)
{
    int i = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (8 * c >= ne0)
        return;
    int r = rows ? rows[i] : i;
    float v[8];
    strata_dq<T>::chunk(w + (size_t)r * nb1, c, v, ne0);
    float *d = dst + (int64_t)i * ne0 + 8 * c;
    for (int j = 0; j < 8 && 8 * c + j < ne0; j++)
        d[j] = v[j];
}

template <int T>
__global__ void dequant_f16_kernel(const uint8_t *__restrict__ w, size_t nb1, int ne0, int ne1,
                                   __half *__restrict__ dst)
{
    int64_t nch = (int64_t)(ne0 + 7) / 8;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nch * ne1)
        return;
    int r = (int)(i / nch), c = (int)(i % nch);
    float v[8];
    strata_dq<T>::chunk(w + (size_t)r * nb1, c, v, ne0);
    __half *d = dst + (int64_t)r * ne0 + 8 * c;
    for (int j = 0; j < 8 && 8 * c + j < ne0; j++)
        d[j] = __float2half(v[j]);
}

static int check_w(const struct strata_k_weight *w, const char *what, struct strata_err *err)
{
    int qk = strata_k_blck(w->type);
    if (!qk)
        return strata_k_err(err, STRATA_E_UNSUPPORTED, "%s: weight type %u has no GPU kernel",
                            what, w->type);
    if (w->ne0 <= 0 || w->ne0 % qk || w->ne0 > INT32_MAX || w->ne1 <= 0 || w->ne1 > INT32_MAX)
        return strata_k_err(err, STRATA_E_INVALID, "%s: bad shape ne0=%lld ne1=%lld (block %d)",
                            what, (long long)w->ne0, (long long)w->ne1, qk);
    return 0;
}

int strata_k_get_rows(struct strata_gpu_ctx *ctx, const struct strata_k_weight *w,
                      const int32_t *rows, int n_rows, float *dst, struct strata_err *err)
{
    int rc = check_w(w, "get_rows", err);
    if (rc)
        return rc;
    if (n_rows <= 0 || n_rows > 65535)
        return strata_k_err(err, STRATA_E_INVALID, "get_rows: bad row count %d", n_rows);
    int nch = (int)((w->ne0 + 7) / 8);
    dim3 block(128), grid((unsigned)((nch + 127) / 128), (unsigned)n_rows);
    const uint8_t *wp = (const uint8_t *)w->data;
    switch (w->type) {
#define CASE(T)                                                                               \
    case T:                                                                                   \
        get_rows_kernel<T><<<grid, block, 0, ctx->stream>>>(wp, w->nb1, (int)w->ne0, rows,    \
                                                            dst);                             \
        break;
        STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
    }
    return strata_k_check(ctx, "get_rows_kernel", grid, block, err,
                          "type %u ne0=%lld ne1=%lld n_rows=%d", w->type, (long long)w->ne0,
                          (long long)w->ne1, n_rows);
}

int strata_k_dequant_f16(struct strata_gpu_ctx *ctx, const struct strata_k_weight *w,
                         int expert, __half *dst, struct strata_err *err)
{
    int rc = check_w(w, "dequant_f16", err);
    if (rc)
        return rc;
    int64_t n = (w->ne0 + 7) / 8 * w->ne1;
    dim3 block(256), grid((unsigned)((n + 255) / 256));
    const uint8_t *wp = (const uint8_t *)w->data + (size_t)expert * w->nb2;
    switch (w->type) {
#define CASE(T)                                                                               \
    case T:                                                                                   \
        dequant_f16_kernel<T><<<grid, block, 0, ctx->stream>>>(wp, w->nb1, (int)w->ne0,       \
                                                               (int)w->ne1, dst);             \
        break;
        STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
    }
    return strata_k_check(ctx, "dequant_f16_kernel", grid, block, err,
                          "type %u ne0=%lld ne1=%lld expert=%d", w->type, (long long)w->ne0,
                          (long long)w->ne1, expert);
}

__global__ void to_f16_kernel(const float *__restrict__ x, int64_t x_stride, int n_cols,
                              __half *__restrict__ dst)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i < n_cols)
        dst[(int64_t)t * n_cols + i] = __float2half(x[t * x_stride + i]);
}

int strata_k_to_f16(struct strata_gpu_ctx *ctx, const float *x, int64_t x_stride, int n_rows,
                    int n_cols, __half *dst, struct strata_err *err)
{
    if (n_rows <= 0 || n_rows > 65535 || n_cols <= 0)
        return strata_k_err(err, STRATA_E_INVALID, "to_f16: bad shape n_rows=%d n_cols=%d",
                            n_rows, n_cols);
    dim3 block(256), grid((unsigned)((n_cols + 255) / 256), (unsigned)n_rows);
    to_f16_kernel<<<grid, block, 0, ctx->stream>>>(x, x_stride, n_cols, dst);
    return strata_k_check(ctx, "to_f16_kernel", grid, block, err, "n_rows=%d n_cols=%d", n_rows,
                          n_cols);
}
