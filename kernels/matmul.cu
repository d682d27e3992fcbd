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

/* The rows of the block's tile: xrow[i] (row of x, -1: none) and yrow[i] (row of y) for
 * i < BN, from the MoE plan (tiles) or the dense token range.  Returns the expert, or -1
 * when the plan has fewer tiles than the grid (the block has nothing to do). */
static __device__ __forceinline__ int mm_tile(const struct mm_params &p, int *xrow, int *yrow)
{
    if (p.tiles) {
        if ((int)blockIdx.y >= *p.n_tiles)
            return -1;
        const int32_t *tl = p.tiles + 3 * blockIdx.y;
        for (int i = threadIdx.x; i < BN; i += MM_THREADS) {
            int a = tl[1] + i < tl[2] ? p.perm[tl[1] + i] : -1;
            xrow[i] = a < 0 ? -1 : a / p.x_div;
            yrow[i] = a;
        }
        return tl[0];
    }
    for (int i = threadIdx.x; i < BN; i += MM_THREADS) {
        int t = blockIdx.y * BN + i;
        xrow[i] = t < p.n_tok ? t : -1;
        yrow[i] = xrow[i];
    }
    return 0;
}

#ifdef STRATA_GPU_MMA_F16
template <bool GLU>
static __device__ __forceinline__ void mm_zero(float (&acc)[2][4][4],
                                               float (&accu)[GLU ? 2 : 1][GLU ? 4 : 1][4])
{
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
}

/* One k16 step of a warp's 32 x 32 tile (and of the up matrix's, GLU). */
template <bool GLU>
static __device__ __forceinline__ void mm_mma(float (&acc)[2][4][4],
                                              float (&accu)[GLU ? 2 : 1][GLU ? 4 : 1][4],
                                              const uint32_t (&af)[2][4],
                                              const uint32_t (&uf)[2][4],
                                              const uint32_t (&bf)[4][2])
{
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            mma16816(acc[mi][ni], af[mi], bf[ni]);
            if (GLU)
                mma16816(accu[GLU ? mi : 0][GLU ? ni : 0], uf[mi], bf[ni]);
        }
}

/* The accumulator fragments of warp (wm, wn) to y: SwiGLU of gate and up (GLU), or plus
 * add; rows past ne1 and empty tile rows are skipped. */
template <bool GLU>
static __device__ __forceinline__ void mm_store(const struct mm_params &p, int r0, int wm, int wn,
                                                int g, int c, const int *yrow,
                                                const float (&acc)[2][4][4],
                                                const float (&accu)[GLU ? 2 : 1][GLU ? 4 : 1][4])
{
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
}
#endif

template <int T, bool GLU>
__global__ void __launch_bounds__(MM_THREADS) mm_kernel(struct mm_params p)
{
    __shared__ __align__(16) __half as[BM][LDS];
    __shared__ __align__(16) __half us[GLU ? BM : 1][LDS];
    __shared__ __align__(16) __half bs[BN][LDS];
    __shared__ int xrow[BN], yrow[BN];
    const int tid = threadIdx.x, r0 = blockIdx.x * BM;
    const int e = mm_tile(p, xrow, yrow);
    if (e < 0)
        return;
    const uint8_t *w = p.w + (size_t)e * p.nb2;
    const uint8_t *u = GLU ? p.u + (size_t)e * p.nb2 : NULL;

#ifdef STRATA_GPU_MMA_F16
    const int warp = tid / 32, lane = tid % 32, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, c = lane & 3;
    float acc[2][4][4], accu[GLU ? 2 : 1][GLU ? 4 : 1][4];
    mm_zero<GLU>(acc, accu);
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
            mm_mma<GLU>(acc, accu, af, uf, bf);
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
    mm_store<GLU>(p, r0, wm, wn, g, c, yrow, acc, accu);
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

/* ---- the pipelined kernel (NVIDIA sm_80+) ----
 *
 * The same tiles, warps and mma order as mm_kernel, so every output is bitwise the
 * same; what changes is how the operands reach shared memory:
 *  - the activations come as f16 rows (converted once per product by to_f16 instead
 *    of once per weight tile) and are copied by cp.async into a second buffer while
 *    the current step multiplies;
 *  - for Q4_K (the experts' gate/up/down of the K-quant mixes) each thread loads the
 *    raw bytes of its next step into registers before the current step's products, and
 *    decodes 32 values per sub-block scale: two threads a row, each 16 quant bytes =
 *    16 values of each of the step's two sub-blocks (ggml's block_q4_K: d, dmin,
 *    12 bytes of 6-bit scales and mins, 128 bytes of nibbles; a 64-value step is one
 *    32-byte group, low nibbles sub-block 2g, high nibbles 2g + 1), with the nibble
 *    turned into a float by an exponent splice instead of an integer conversion;
 *  - the mma fragments are read with ldmatrix (the same elements as the 32-bit loads).
 * Other types decode through strata_dq<T> as in mm_kernel. */
#ifdef STRATA_GPU_MMA_F16
static __device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* The raw bytes of one thread's share of a Q4_K step: 16 quant bytes, d and dmin,
 * the 12 scale bytes. */
struct q4k_raw {
    uint4 q;
    uint32_t dm, s0, s1, s2;
};

static __device__ __forceinline__ void q4k_fetch(struct q4k_raw &r, const uint8_t *row, int k0,
                                                 int h, bool ok)
{
    if (!ok) {
        r.q = make_uint4(0, 0, 0, 0);
        r.dm = r.s0 = r.s1 = r.s2 = 0;
        return;
    }
    const uint8_t *b = row + (k0 >> 8) * 144;
    r.q = *(const uint4 *)(b + 16 + 32 * ((k0 >> 6) & 3) + 16 * h);
    r.dm = *(const uint32_t *)b;
    r.s0 = *(const uint32_t *)(b + 4);
    r.s1 = *(const uint32_t *)(b + 8);
    r.s2 = *(const uint32_t *)(b + 12);
}

static __device__ __forceinline__ uint32_t q4k_sbyte(const struct q4k_raw &r, int i)
{
    uint32_t w = i < 4 ? r.s0 : i < 8 ? r.s1 : r.s2;
    return (w >> (8 * (i & 3))) & 0xFF;
}

/* ggml's get_scale_min_k4 on the scale bytes held in r */
static __device__ __forceinline__ void q4k_scale_min(const struct q4k_raw &r, int j, float *sc,
                                                     float *m)
{
    int a, b;
    if (j < 4) {
        a = q4k_sbyte(r, j) & 63;
        b = q4k_sbyte(r, j + 4) & 63;
    } else {
        uint32_t hi = q4k_sbyte(r, j + 4);
        a = (int)((hi & 0xF) | ((q4k_sbyte(r, j - 4) >> 6) << 4));
        b = (int)((hi >> 4) | ((q4k_sbyte(r, j) >> 6) << 4));
    }
    *sc = (float)a;
    *m = (float)b;
}

/* nibble byte i (0..3) of w as a float: 2^23 + q spliced, then 2^23 taken off (exact) */
static __device__ __forceinline__ float q4k_nib(uint32_t w, int i)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 + i)) - 8388608.0f;
}

/* Decode r (step k0, half h of the row) into dst[row][...] as mm_kernel's load_w does:
 * v = (d * sc) * q - dmin * m, rounded to f16. */
static __device__ __forceinline__ void q4k_store(__half (*dst)[LDS], const struct q4k_raw &r,
                                                 int row, int k0, int h)
{
    const int g = (k0 >> 6) & 3;
    float d = __half2float(__ushort_as_half((unsigned short)(r.dm & 0xFFFF)));
    float dmin = __half2float(__ushort_as_half((unsigned short)(r.dm >> 16)));
    float sc0, m0, sc1, m1;
    q4k_scale_min(r, 2 * g, &sc0, &m0);
    q4k_scale_min(r, 2 * g + 1, &sc1, &m1);
    const float d0 = d * sc0, mn0 = dmin * m0, d1 = d * sc1, mn1 = dmin * m1;
    const uint32_t qw[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
    /* low nibbles (sub-block 2g at k 16h..16h+15), then high (2g + 1, 32 + 16h..) */
#pragma unroll
    for (int part = 0; part < 2; part++) {
        const float dd = part ? d1 : d0, mm = part ? mn1 : mn0;
        __half2 v[8];
#pragma unroll
        for (int wi = 0; wi < 4; wi++) {
            uint32_t n = (qw[wi] >> (4 * part)) & 0x0F0F0F0Fu;
            v[2 * wi] = __floats2half2_rn(fmaf(dd, q4k_nib(n, 0), -mm),
                                          fmaf(dd, q4k_nib(n, 1), -mm));
            v[2 * wi + 1] = __floats2half2_rn(fmaf(dd, q4k_nib(n, 2), -mm),
                                              fmaf(dd, q4k_nib(n, 3), -mm));
        }
        uint4 *pd = (uint4 *)&dst[row][32 * part + 16 * h];
        pd[0] = *(const uint4 *)&v[0];
        pd[1] = *(const uint4 *)&v[4];
    }
}
#endif

template <int T, bool GLU, bool FAST>
__global__ void __launch_bounds__(MM_THREADS, 4) mm2_kernel(struct mm_params p, const __half *xh)
{
#ifdef STRATA_GPU_MMA_F16
    __shared__ __align__(16) __half as[BM][LDS];
    __shared__ __align__(16) __half us[GLU ? BM : 1][LDS];
    __shared__ __align__(16) __half bs[2][BN][LDS];
    __shared__ int xrow[BN], yrow[BN];
    const int tid = threadIdx.x, r0 = blockIdx.x * BM;
    const int e = mm_tile(p, xrow, yrow);
    if (e < 0)
        return;
    const uint8_t *w = p.w + (size_t)e * p.nb2;
    const uint8_t *u = GLU ? p.u + (size_t)e * p.nb2 : NULL;
    const int warp = tid / 32, lane = tid % 32, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, c = lane & 3;
    float acc[2][4][4], accu[GLU ? 2 : 1][GLU ? 4 : 1][4];
    mm_zero<GLU>(acc, accu);
    /* this thread's weight row and half (FAST) */
    const int frow = tid >> 1, fh = tid & 1;
    const bool frow_ok = r0 + frow < p.ne1;
    const uint8_t *wrow = w + (size_t)(frow_ok ? r0 + frow : 0) * p.nb1;
    const uint8_t *urow = GLU ? u + (size_t)(frow_ok ? r0 + frow : 0) * p.nb1 : NULL;
    struct q4k_raw rw, ru;
    __syncthreads(); /* xrow */
    /* the activation rows of step k0 into buffer b: 64 rows x 8 chunks of 16 bytes */
    auto stage_x = [&](int b, int k0) {
#pragma unroll
        for (int i = 0; i < BN * (BK / 8) / MM_THREADS; i++) {
            int q = tid + i * MM_THREADS, n = q / (BK / 8), kc = q % (BK / 8), xr = xrow[n];
            const __half *src = xh + (xr < 0 ? 0 : (int64_t)xr * p.ne0 + k0 + kc * 8);
            strata_cp_async16(&bs[b][n][kc * 8], src, xr >= 0 ? 16 : 0);
        }
        strata_cp_async_commit();
    };
    if (FAST) {
        q4k_fetch(rw, wrow, 0, fh, frow_ok);
        if (GLU)
            q4k_fetch(ru, urow, 0, fh, frow_ok);
    }
    stage_x(0, 0);
    for (int k0 = 0, st = 0; k0 < p.ne0; k0 += BK, st ^= 1) {
        if (FAST) {
            q4k_store(as, rw, frow, k0, fh);
            if (GLU)
                q4k_store(us, ru, frow, k0, fh);
        } else {
            load_w<T>(as, w, p.nb1, r0, p.ne1, k0, p.ne0);
            if (GLU)
                load_w<T>(us, u, p.nb1, r0, p.ne1, k0, p.ne0);
        }
        if (k0 + BK < p.ne0) {
            if (FAST) {
                q4k_fetch(rw, wrow, k0 + BK, fh, frow_ok);
                if (GLU)
                    q4k_fetch(ru, urow, k0 + BK, fh, frow_ok);
            }
            stage_x(st ^ 1, k0 + BK);
            strata_cp_async_wait<1>();
        } else {
            strata_cp_async_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[2][4], uf[2][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                /* lanes 0-7: rows 0-7, k 0-7; 8-15: rows 8-15; 16-31: k 8-15 */
                int ra = wm * 32 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                int ka = kk + (lane >> 4) * 8;
                ldsm_x4(af[mi], &as[ra][ka]);
                if (GLU)
                    ldsm_x4(uf[mi], &us[ra][ka]);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni += 2) {
                /* matrices: (ni, k 0-7), (ni, k 8-15), (ni + 1, k 0-7), (ni + 1, k 8-15) */
                int m = lane >> 3;
                int nb = wn * 32 + (ni + (m >> 1)) * 8 + (lane & 7);
                uint32_t r4[4];
                ldsm_x4(r4, &bs[st][nb][kk + (m & 1) * 8]);
                bf[ni][0] = r4[0];
                bf[ni][1] = r4[1];
                bf[ni + 1][0] = r4[2];
                bf[ni + 1][1] = r4[3];
            }
            mm_mma<GLU>(acc, accu, af, uf, bf);
        }
        __syncthreads();
    }
    mm_store<GLU>(p, r0, wm, wn, g, c, yrow, acc, accu);
#else
    (void)p;
    (void)xh;
#endif
}

/* 1 if the loaded code of the pipelined kernel was built for sm_80 or newer (its body is
 * empty below); read once */
static int mm2_image_ok(void)
{
    static int ok = -1;
    if (ok < 0)
        ok = strata_k_code_arch(reinterpret_cast<const void *>(mm2_kernel<KT_Q4_K, true, true>)) >=
             80;
    return ok;
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
    const int n_x = a->n_x > 0 ? a->n_x : (a->n_tok + p.x_div - 1) / p.x_div;
    /* the pipelined kernel where the loaded image has its matrix-unit body (a build
     * whose newest code is below sm_80, JIT-compiled for a newer device, has not) and
     * the f16 rows fit the conversion's grid */
    if (a->xh && ctx->info.has_mma_f16 && n_x <= 65535 && ((uintptr_t)a->xh & 15) == 0 &&
        mm2_image_ok()) {
        int rc = strata_k_to_f16(ctx, a->x, a->x_stride, n_x, p.ne0, a->xh, err);
        if (rc)
            return strata_err_wrap(err, "matmul: ");
        const bool fast = w->type == KT_Q4_K && ((uintptr_t)w->data & 15) == 0 &&
                          w->nb1 % 16 == 0 && w->nb2 % 16 == 0 &&
                          (!a->glu || (((uintptr_t)a->up->data & 15) == 0));
        if (fast && a->glu)
            mm2_kernel<KT_Q4_K, true, true><<<grid, block, 0, ctx->stream>>>(p, a->xh);
        else if (fast)
            mm2_kernel<KT_Q4_K, false, true><<<grid, block, 0, ctx->stream>>>(p, a->xh);
        else
            switch (w->type) {
#define CASE(T)                                                                               \
    case T:                                                                                   \
        if (a->glu)                                                                           \
            mm2_kernel<T, true, false><<<grid, block, 0, ctx->stream>>>(p, a->xh);            \
        else                                                                                  \
            mm2_kernel<T, false, false><<<grid, block, 0, ctx->stream>>>(p, a->xh);           \
        break;
                STRATA_FOR_EACH_KTYPE(CASE)
#undef CASE
            }
        return strata_k_check(ctx, a->glu ? "mm2_kernel<glu>" : "mm2_kernel", grid, block, err,
                              "type %u ne0=%lld ne1=%lld n_tok=%d n_x=%d %s%s", w->type,
                              (long long)w->ne0, (long long)w->ne1, a->n_tok, n_x,
                              a->tiles ? "grouped" : "dense", fast ? " q4_k-staged" : "");
    }
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
