/* matvec.cu - dequantising matrix-vector products (decode), plain and SwiGLU-fused,
 * batched over slots (tokens or routed experts) with per-slot expert ids. */
#include "kernels.h"

#include "dequant.cuh"

/* Load x[8c, 8c + 8), zero past n. */
static __device__ __forceinline__ void load_x8(const float *x, int c, int n, float *xv)
{
    if (8 * c + 8 <= n) {
        float4 a = *(const float4 *)(x + 8 * c), b = *(const float4 *)(x + 8 * c + 4);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            xv[j] = 8 * c + j < n ? x[8 * c + j] : 0.0f;
    }
}

/* A warp computes MV_RPW output rows together: their independent loads are in flight
 * at once and each input chunk is read once for all of them.  Lane l sums chunks l,
 * l + warpSize, ... of a row in order, then the warp reduces with a fixed tree: the
 * order depends on ne0 and warpSize only, not on n_slot or the rows computed along. */
#define MV_RPW 2

template <int T, bool GLU>
__global__ void matvec_kernel(const uint8_t *__restrict__ w, const uint8_t *__restrict__ u,
                              size_t nb1, size_t nb2, int ne0, int ne1,
                              const int32_t *__restrict__ ids, int x_group,
                              const float *__restrict__ x, int64_t x_stride, float *y,
                              int64_t y_stride, const float *add)
{
    strata_pdl_wait();
    strata_pdl_trigger();
    int lane = threadIdx.x % warpSize;
    int r0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * MV_RPW;
    int s = blockIdx.y;
    if (r0 >= ne1)
        return;
    size_t base = (size_t)(ids ? ids[s] : 0) * nb2;
    const float *xs = x + (int64_t)(s / x_group) * x_stride;
    int nch = (ne0 + 7) / 8;
    float acc[MV_RPW], acc2[MV_RPW];
#pragma unroll
    for (int k = 0; k < MV_RPW; k++)
        acc[k] = acc2[k] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < nch; c += warpSize) {
        float xv[8];
        load_x8(xs, c, ne0, xv);
#pragma unroll
        for (int k = 0; k < MV_RPW; k++) {
            /* a missing last row re-reads row r0: in bounds, result dropped */
            size_t off = base + (size_t)(r0 + k < ne1 ? r0 + k : r0) * nb1;
            float v[8];
            strata_dq<T>::chunk(w + off, c, v, ne0);
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[k] = fmaf(v[j], xv[j], acc[k]);
            if (GLU) {
                strata_dq<T>::chunk(u + off, c, v, ne0);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc2[k] = fmaf(v[j], xv[j], acc2[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MV_RPW; k++) {
        float a = strata_warp_sum(acc[k]);
        float b = GLU ? strata_warp_sum(acc2[k]) : 0.0f;
        if (lane == 0 && r0 + k < ne1) {
            int64_t o = (int64_t)s * y_stride + r0 + k;
            if (GLU)
                y[o] = a / (1.0f + expf(-a)) * b;
            else
                y[o] = (add ? add[o] : 0.0f) + a;
        }
    }
}

int strata_k_matvec(struct strata_gpu_ctx *ctx, const struct strata_k_mv_args *a,
                    struct strata_err *err)
{
    const struct strata_k_weight *w = a->w;
    int qk = strata_k_blck(w->type);
    if (!qk)
        return strata_k_err(err, STRATA_E_UNSUPPORTED, "matvec: weight type %u has no GPU kernel",
                            w->type);
    if (w->ne0 % qk || w->ne0 <= 0 || w->ne1 <= 0 || w->ne0 > INT32_MAX || w->ne1 > INT32_MAX ||
        a->n_slot <= 0 || a->n_slot > 65535 || a->x_group <= 0)
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec: bad shape ne0=%lld ne1=%lld (block %d) n_slot=%d x_group=%d",
                            (long long)w->ne0, (long long)w->ne1, qk, a->n_slot, a->x_group);
    if (((uintptr_t)a->x & 15) || (a->x_stride & 3))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec: input rows must be 16-byte aligned (x_stride=%lld)",
                            (long long)a->x_stride);
    if (a->glu && (!a->up || a->up->type != w->type || a->up->ne0 != w->ne0 ||
                   a->up->ne1 != w->ne1 || a->up->nb1 != w->nb1 || a->up->nb2 != w->nb2))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec: gate and up weights differ in type or shape");
    int rows = STRATA_GPU_BLOCK / ctx->info.warp_size * MV_RPW;
    dim3 grid((unsigned)((w->ne1 + rows - 1) / rows), (unsigned)a->n_slot), block(STRATA_GPU_BLOCK);
    const uint8_t *wp = (const uint8_t *)w->data;
    const uint8_t *up = a->glu ? (const uint8_t *)a->up->data : NULL;
    switch (w->type) {
#define CASE(T)                                                                               \
    case T:                                                                                   \
        if (a->glu)                                                                           \
            strata_k_launch(ctx, matvec_kernel<T, true>, grid, block,                        \
                wp, up, w->nb1, w->nb2, (int)w->ne0, (int)w->ne1, a->ids, a->x_group, a->x,   \
                a->x_stride, a->y, a->y_stride, a->add);                                      \
        else                                                                                  \
            strata_k_launch(ctx, matvec_kernel<T, false>, grid, block,                       \
                wp, up, w->nb1, w->nb2, (int)w->ne0, (int)w->ne1, a->ids, a->x_group, a->x,   \
                a->x_stride, a->y, a->y_stride, a->add);                                      \
        break;
        STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
    }
    return strata_k_check(ctx, a->glu ? "matvec_kernel<glu>" : "matvec_kernel", grid, block, err,
                          "type %u ne0=%lld ne1=%lld n_slot=%d x_group=%d", w->type,
                          (long long)w->ne0, (long long)w->ne1, a->n_slot, a->x_group);
}
