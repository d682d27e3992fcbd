/* matmul.cu - dequantising matrix-matrix products for prefill and verify batches,
 * dense or grouped by expert (MoE).
 *
 * A block computes a 64 x 64 tile of (weight rows x tokens).  Each step dequantises a
 * 64 x 64 slice of the weights to f16 in shared memory (the decoders of dequant.cuh)
 * and converts the matching 64 x 64 slice of the activations to f16; the product is
 * accumulated in f32, on the matrix units (mma.sync m16n8k16, four warps of 32 x 32)
 * where STRATA_GPU_MMA_F16, else by an FMA loop.  Rows of shared memory are padded by
 * 16 bytes so that the fragment loads hit distinct banks. */
#include "kernels.h"

#include "dequant.cuh"

#define BM STRATA_K_MM_BM
#define BN STRATA_K_MM_BN
#define BK 64
#define LDS (BK + 8)
#define MM_THREADS 128

struct mm_params {
    const uint8_t *w, *u;
    size_t nb1, nb2;
    int ne0, ne1, n_tok, x_div;
    const int32_t *perm, *tiles, *n_tiles;
    const float *x;
    int64_t x_stride;
    float *y;
    int64_t y_stride;
    const float *add;
};

template <int T>
static __device__ __forceinline__ void load_w(__half (*dst)[LDS], const uint8_t *w, size_t nb1,
                                              int r0, int ne1, int k0, int ne0)
{
    for (int q = threadIdx.x; q < BM * (BK / 8); q += MM_THREADS) {
        int row = q / (BK / 8), kc = q % (BK / 8);
        float v[8];
        if (r0 + row < ne1) {
            strata_dq<T>::chunk(w + (size_t)(r0 + row) * nb1, k0 / 8 + kc, v, ne0);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = 0.0f;
        }
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        *(uint4 *)&dst[row][kc * 8] = *(const uint4 *)h;
    }
}

#ifdef STRATA_GPU_MMA_F16
static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, const uint32_t *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#define LD32(p) (*(const uint32_t *)(p))
#endif

template <int T, bool GLU>
__global__ void __launch_bounds__(MM_THREADS) mm_kernel(struct mm_params p)
{
    __shared__ __align__(16) __half as[BM][LDS];
    __shared__ __align__(16) __half us[GLU ? BM : 1][LDS];
    __shared__ __align__(16) __half bs[BN][LDS];
    __shared__ int xrow[BN], yrow[BN];
    const int tid = threadIdx.x, r0 = blockIdx.x * BM;
    int e = 0;
    if (p.tiles) {
        if ((int)blockIdx.y >= *p.n_tiles)
            return;
        const int32_t *tl = p.tiles + 3 * blockIdx.y;
        e = tl[0];
        for (int i = tid; i < BN; i += MM_THREADS) {
            int a = tl[1] + i < tl[2] ? p.perm[tl[1] + i] : -1;
            xrow[i] = a < 0 ? -1 : a / p.x_div;
            yrow[i] = a;
        }
    } else {
        for (int i = tid; i < BN; i += MM_THREADS) {
            int t = blockIdx.y * BN + i;
            xrow[i] = t < p.n_tok ? t : -1;
            yrow[i] = xrow[i];
        }
    }
    const uint8_t *w = p.w + (size_t)e * p.nb2;
    const uint8_t *u = GLU ? p.u + (size_t)e * p.nb2 : NULL;

#ifdef STRATA_GPU_MMA_F16
    const int warp = tid / 32, lane = tid % 32, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, c = lane & 3;
    float acc[2][4][4], accu[GLU ? 2 : 1][GLU ? 4 : 1][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                acc[i][j][q] = 0.0f;
                if (GLU)
                    accu[GLU ? i : 0][GLU ? j : 0][q] = 0.0f;
            }
#else
    const int frow = tid % BM, fng = tid / BM; /* row and half of the tokens */
    float acc[BN / 2], accu[GLU ? BN / 2 : 1];
#pragma unroll
    for (int j = 0; j < BN / 2; j++) {
        acc[j] = 0.0f;
        if (GLU)
            accu[GLU ? j : 0] = 0.0f;
    }
#endif

    for (int k0 = 0; k0 < p.ne0; k0 += BK) {
        __syncthreads();
        load_w<T>(as, w, p.nb1, r0, p.ne1, k0, p.ne0);
        if (GLU)
            load_w<T>(us, u, p.nb1, r0, p.ne1, k0, p.ne0);
        for (int q = tid; q < BN * (BK / 8); q += MM_THREADS) {
            int n = q / (BK / 8), kc = q % (BK / 8), xr = xrow[n];
            __half2 h[4];
            if (xr >= 0) {
                const float *xp = p.x + (int64_t)xr * p.x_stride + k0 + kc * 8;
                float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
                h[0] = __floats2half2_rn(a.x, a.y);
                h[1] = __floats2half2_rn(a.z, a.w);
                h[2] = __floats2half2_rn(b.x, b.y);
                h[3] = __floats2half2_rn(b.z, b.w);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    h[j] = __floats2half2_rn(0.0f, 0.0f);
            }
            *(uint4 *)&bs[n][kc * 8] = *(const uint4 *)h;
        }
        __syncthreads();
#ifdef STRATA_GPU_MMA_F16
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[2][4], uf[2][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                int ra = wm * 32 + mi * 16 + g;
                af[mi][0] = LD32(&as[ra][kk + 2 * c]);
                af[mi][1] = LD32(&as[ra + 8][kk + 2 * c]);
                af[mi][2] = LD32(&as[ra][kk + 2 * c + 8]);
                af[mi][3] = LD32(&as[ra + 8][kk + 2 * c + 8]);
                if (GLU) {
                    uf[mi][0] = LD32(&us[ra][kk + 2 * c]);
                    uf[mi][1] = LD32(&us[ra + 8][kk + 2 * c]);
                    uf[mi][2] = LD32(&us[ra][kk + 2 * c + 8]);
                    uf[mi][3] = LD32(&us[ra + 8][kk + 2 * c + 8]);
                }
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int nb = wn * 32 + ni * 8 + g;
                bf[ni][0] = LD32(&bs[nb][kk + 2 * c]);
                bf[ni][1] = LD32(&bs[nb][kk + 2 * c + 8]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    mma16816(acc[mi][ni], af[mi], bf[ni]);
                    if (GLU)
                        mma16816(accu[GLU ? mi : 0][GLU ? ni : 0], uf[mi], bf[ni]);
                }
        }
#else
        for (int k = 0; k < BK; k++) {
            float a = __half2float(as[frow][k]);
            float b = GLU ? __half2float(us[GLU ? frow : 0][k]) : 0.0f;
#pragma unroll
            for (int j = 0; j < BN / 2; j++) {
                float xv = __half2float(bs[fng * (BN / 2) + j][k]);
                acc[j] = fmaf(a, xv, acc[j]);
                if (GLU)
                    accu[GLU ? j : 0] = fmaf(b, xv, accu[GLU ? j : 0]);
            }
        }
#endif
    }

#ifdef STRATA_GPU_MMA_F16
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int row = r0 + wm * 32 + mi * 16 + g + 8 * (q >> 1);
                int n = wn * 32 + ni * 8 + 2 * c + (q & 1);
                int yr = yrow[n];
                if (row >= p.ne1 || yr < 0)
                    continue;
                int64_t o = (int64_t)yr * p.y_stride + row;
                float v = acc[mi][ni][q];
                if (GLU)
                    v = v / (1.0f + expf(-v)) * accu[GLU ? mi : 0][GLU ? ni : 0][q];
                else if (p.add)
                    v += p.add[o];
                p.y[o] = v;
            }
#else
#pragma unroll
    for (int j = 0; j < BN / 2; j++) {
        int row = r0 + frow, yr = yrow[fng * (BN / 2) + j];
        if (row >= p.ne1 || yr < 0)
            continue;
        int64_t o = (int64_t)yr * p.y_stride + row;
        float v = acc[j];
        if (GLU)
            v = v / (1.0f + expf(-v)) * accu[GLU ? j : 0];
        else if (p.add)
            v += p.add[o];
        p.y[o] = v;
    }
#endif
}

int strata_k_matmul(struct strata_gpu_ctx *ctx, const struct strata_k_mm_args *a,
                    struct strata_err *err)
{
    const struct strata_k_weight *w = a->w;
    if (!strata_k_blck(w->type))
        return strata_k_err(err, STRATA_E_UNSUPPORTED, "matmul: weight type %u has no GPU kernel",
                            w->type);
    if (w->ne0 <= 0 || w->ne0 % BK || w->ne1 <= 0 || w->ne0 > INT32_MAX || w->ne1 > INT32_MAX ||
        a->n_tok <= 0 || (a->tiles && (a->max_tiles <= 0 || !a->perm || !a->n_tiles ||
                                       a->x_div <= 0)))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matmul: bad shape ne0=%lld (multiple of %d) ne1=%lld n_tok=%d "
                            "max_tiles=%d",
                            (long long)w->ne0, BK, (long long)w->ne1, a->n_tok, a->max_tiles);
    if (((uintptr_t)a->x & 15) || (a->x_stride & 3))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matmul: input rows must be 16-byte aligned (x_stride=%lld)",
                            (long long)a->x_stride);
    if (a->glu && (!a->up || a->up->type != w->type || a->up->ne0 != w->ne0 ||
                   a->up->ne1 != w->ne1 || a->up->nb1 != w->nb1 || a->up->nb2 != w->nb2))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matmul: gate and up weights differ in type or shape");
    struct mm_params p;
    p.w = (const uint8_t *)w->data;
    p.u = a->glu ? (const uint8_t *)a->up->data : NULL;
    p.nb1 = w->nb1;
    p.nb2 = w->nb2;
    p.ne0 = (int)w->ne0;
    p.ne1 = (int)w->ne1;
    p.n_tok = a->n_tok;
    p.x_div = a->tiles ? a->x_div : 1;
    p.perm = a->perm;
    p.tiles = a->tiles;
    p.n_tiles = a->n_tiles;
    p.x = a->x;
    p.x_stride = a->x_stride;
    p.y = a->y;
    p.y_stride = a->y_stride;
    p.add = a->add;
    unsigned gy = a->tiles ? (unsigned)a->max_tiles : (unsigned)((a->n_tok + BN - 1) / BN);
    dim3 grid((unsigned)((w->ne1 + BM - 1) / BM), gy), block(MM_THREADS);
    switch (w->type) {
#define CASE(T)                                                                               \
    case T:                                                                                   \
        if (a->glu)                                                                           \
            mm_kernel<T, true><<<grid, block, 0, ctx->stream>>>(p);                           \
        else                                                                                  \
            mm_kernel<T, false><<<grid, block, 0, ctx->stream>>>(p);                          \
        break;
        STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
    }
    return strata_k_check(ctx, a->glu ? "mm_kernel<glu>" : "mm_kernel", grid, block, err,
                          "type %u ne0=%lld ne1=%lld n_tok=%d %s", w->type, (long long)w->ne0,
                          (long long)w->ne1, a->n_tok, a->tiles ? "grouped" : "dense");
}
