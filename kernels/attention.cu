/* attention.cu - causal GQA attention over the f16 kv cache, for decode (split-K over
 * the kv positions, merged by a second kernel) and prefill (tiles of query rows).
 *
 * A block takes 32 query rows of one kv head: (token, query head) pairs of the heads
 * that share the kv head, so GQA reads each key and value once per tile.  Keys and
 * values stream through shared memory 32 positions at a time with an online softmax
 * (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022).  Eight threads own a
 * row: each scores 4 keys of a tile and accumulates hd / 8 output dimensions. */
#include "attention.cuh"

#include <math.h>

/* DPT = hd / 8: the output dimensions a thread owns (contiguous, so that value rows
 * are read as half2 pairs). */
template <int DPT>
__global__ void __launch_bounds__(ATT_THREADS) attn_kernel(struct strata_k_attn_args a)
{
    __shared__ struct att_smem sm;
    strata_pdl_wait();
    strata_pdl_trigger();
    attn_tile<DPT>(a, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, &sm);
}

/* Merge the splits of one output row (token orow / n_head) in split order. */
__global__ void attn_merge_kernel(const float *__restrict__ scratch, float *__restrict__ out,
                                  int n_rows, int hd, int n_split, const int32_t *pos0,
                                  int n_head, int split_keys)
{
    strata_pdl_wait();
    strata_pdl_trigger();
    int orow = blockIdx.x;
    int n_used = splits_used(*pos0 + orow / n_head + 1, n_split, split_keys);
    if (n_used == 1)
        return; /* the attention kernel wrote the result */
    float mx = -INFINITY;
    for (int s = 0; s < n_used; s++)
        mx = fmaxf(mx, scratch[((int64_t)s * n_rows + orow) * (hd + 2) + hd]);
    float L = 0.0f;
    for (int s = 0; s < n_used; s++) {
        const float *sp = scratch + ((int64_t)s * n_rows + orow) * (hd + 2);
        if (sp[hd] != -INFINITY)
            L += sp[hd + 1] * __expf(sp[hd] - mx);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_used; s++) {
            const float *sp = scratch + ((int64_t)s * n_rows + orow) * (hd + 2);
            if (sp[hd] != -INFINITY)
                acc += sp[d] * __expf(sp[hd] - mx);
        }
        out[(int64_t)orow * hd + d] = L > 0.0f ? acc / L : 0.0f;
    }
}

/* ---- decode: a 32-lane group a query row ----
 *
 * A one-token decode gives a tile n_gqa rows (8 for most GQA models), so attn_kernel's
 * 8 threads a row leave 3/4 of its block idle and each thread's chain long: 4 keys of
 * hd products and hd / 8 output dimensions a tile.  Here a block takes ATT_ROWS_W rows
 * of one kv head with 32 lanes each: lane c scores key c of a tile and accumulates
 * output dimensions hd / 32 * c .. +hd / 32.  Every sum is attn_tile's, in attn_tile's
 * order, so the results are the same bits (a decode here and the same position in a
 * verify window on attn_kernel agree):
 *  - key c's score: its own fmaf chain over d = 0 .. hd - 1, as attn_tile's thread;
 *  - the tile's maximum: a maximum (exact in any order);
 *  - the tile's weight sum: attn_tile's thread c8 added keys c8, c8 + 8, c8 + 16, c8 +
 *    24 in order, then the 8 threads by the shuffle tree 1, 2, 4: lanes 0..7 do the
 *    same with the other three keys fetched by shuffles;
 *  - each output dimension: its fmaf chain over the tile's keys in order;
 *  - the splits' merge and the 8-bit output: lanes 0..7 take the parts of attn_tile's 8
 *    threads.
 * Needs hd % 32 == 0 (DW = hd / 32) and at most ATT_ROWS_W rows a kv head. */
#define ATT_ROWS_W (ATT_THREADS / 32)

struct att_smem_w {
    __align__(16) float qs[ATT_ROWS_W][ATT_HD + 4];
    /* keys: rows of an odd number of words, so that the 32 lanes' reads of their own
     * key's words fall in 32 different banks */
    __align__(16) __half ks[ATT_KEYS][ATT_HD + 2];
    __align__(16) __half vs[ATT_KEYS][ATT_HD + 8];
    float ps[ATT_ROWS_W][ATT_KEYS];
    int blk_lo, blk_hi, last;
};

/* v summed over lanes c, c + 8, c + 16, c + 24 (in that order) and then by the shuffle
 * tree 1, 2, 4 over lanes 0..7 of the row's 32: attn_tile's sum of a row's 8 threads
 * when its thread c8 held the values of keys c8 + 8 j.  Every lane gets it. */
static __device__ __forceinline__ float att_sum8x4(float v)
{
    const int base = threadIdx.x & ~31 & (warpSize - 1), c = threadIdx.x % 32;
    const float v8 = STRATA_SHFL(v, base + ((c + 8) & 31));
    const float v16 = STRATA_SHFL(v, base + ((c + 16) & 31));
    const float v24 = STRATA_SHFL(v, base + ((c + 24) & 31));
    float s = ((v + v8) + v16) + v24;
    s += STRATA_SHFL_XOR(s, 1);
    s += STRATA_SHFL_XOR(s, 2);
    s += STRATA_SHFL_XOR(s, 4);
    return STRATA_SHFL(s, base);
}

template <int DW>
__global__ void __launch_bounds__(ATT_THREADS) attn_row_kernel(struct strata_k_attn_args a)
{
    __shared__ struct att_smem_w sm;
    constexpr int hd = 32 * DW;
    const int n_gqa = a.n_head / a.n_head_kv, g = blockIdx.y, bz = blockIdx.z;
    const int64_t kv_row = (int64_t)a.n_head_kv * hd;
    /* *pos0 does not depend on the kernel before (it is copied before the step's first
     * kernel), so neither do the splits' and rows' key ranges: all of it before the PDL
     * wait, so that after it the first loads are q's and the first tile's. */
    const int p0 = *a.pos0;
    const int n_rows = a.n_tok * n_gqa, row0 = blockIdx.x * ATT_ROWS_W;
    const int tid = threadIdx.x, r = tid / 32, c = tid % 32;
    const int row = row0 + r, valid = row < n_rows;
    const int t = valid ? row / n_gqa : 0, h = g * n_gqa + (valid ? row % n_gqa : 0);
    const int qpos = p0 + t;
    const int b_used = splits_used(p0 + a.n_tok, a.n_split, a.split_keys);
    if (bz < b_used) {
        /* The kv rows before this batch's own do not depend on the kernel before (it
         * stores the batch's rows): this split's rows, as its last query sees them, on
         * their way to L2 meanwhile. */
        const int kv_end = p0 + a.n_tok;
        const int w = split_width(kv_end, b_used), lo = bz * w, hi = min(p0, lo + w);
        constexpr int lpr = (2 * hd + 127) / 128; /* lines of a head's row */
        for (int i = threadIdx.x; i < (hi - lo) * lpr; i += ATT_THREADS) {
            const int64_t o = (lo + i / lpr) * kv_row + (int64_t)g * hd + 64 * (i % lpr);
            strata_prefetch_l2(a.k_cache + o);
            strata_prefetch_l2(a.v_cache + o);
        }
    }
    const int r_used = splits_used(qpos + 1, a.n_split, a.split_keys);
    const int r_lo = bz * split_width(qpos + 1, r_used);
    const int r_hi = valid && bz < r_used
                         ? min(qpos + 1, r_lo + split_width(qpos + 1, r_used))
                         : r_lo;
    if (tid == 0) {
        sm.blk_lo = 0x7fffffff;
        sm.blk_hi = 0;
    }
    __syncthreads();
    if (c == 0 && r_hi > r_lo) {
        atomicMin(&sm.blk_lo, r_lo);
        atomicMax(&sm.blk_hi, r_hi);
    }
    __syncthreads();
    const int lo = sm.blk_lo, hi = sm.blk_hi;
    strata_pdl_wait();
    strata_pdl_trigger();
    if (bz >= b_used)
        return;
    /* warp-uniform (a 64-lane wavefront holds two rows): the shuffles below need every
     * lane of a warp; a row past the last scores masked keys only */
    const int wlive = row0 + (int)(tid - tid % warpSize) / 32 < n_rows;
    const int d0 = c * DW;
    float m = -INFINITY, l = 0.0f, o[DW];
#pragma unroll
    for (int j = 0; j < DW; j++)
        o[j] = 0.0f;
    /* q's rows, then the first tile's keys (the first tile needs no barrier before its
     * stores: nothing has read the tile buffers yet) */
    constexpr int NQ = (ATT_ROWS_W * (hd / 4) + ATT_THREADS - 1) / ATT_THREADS;
    constexpr int NK = (ATT_KEYS * (hd / 8) + ATT_THREADS - 1) / ATT_THREADS;
    {
        float4 qv[NQ];
#pragma unroll
        for (int u = 0; u < NQ; u++) {
            const int i = tid + u * ATT_THREADS, rr = i / (hd / 4), d = 4 * (i % (hd / 4));
            if (i < ATT_ROWS_W * (hd / 4))
                qv[u] = att_q4(a, row0 + rr, n_rows, n_gqa, g, hd, d);
        }
#pragma unroll
        for (int u = 0; u < NQ; u++) {
            const int i = tid + u * ATT_THREADS, rr = i / (hd / 4), d = 4 * (i % (hd / 4));
            if (i < ATT_ROWS_W * (hd / 4))
                *(float4 *)&sm.qs[rr][d] = qv[u];
        }
    }
    for (int j0 = lo; j0 < hi; j0 += ATT_KEYS) {
        if (j0 > lo)
            __syncthreads();
        uint4 kv[NK], vv[NK];
#pragma unroll
        for (int u = 0; u < NK; u++) {
            const int i = tid + u * ATT_THREADS, j = i / (hd / 8), d = 8 * (i % (hd / 8));
            kv[u] = make_uint4(0, 0, 0, 0);
            vv[u] = kv[u];
            if (i < ATT_KEYS * (hd / 8) && j0 + j < hi) {
                kv[u] = *(const uint4 *)(a.k_cache + (j0 + j) * kv_row + (int64_t)g * hd + d);
                vv[u] = *(const uint4 *)(a.v_cache + (j0 + j) * kv_row + (int64_t)g * hd + d);
            }
        }
#pragma unroll
        for (int u = 0; u < NK; u++) {
            const int i = tid + u * ATT_THREADS, j = i / (hd / 8), d = 8 * (i % (hd / 8));
            if (i < ATT_KEYS * (hd / 8)) {
                uint32_t *kd = (uint32_t *)&sm.ks[j][d];
                kd[0] = kv[u].x;
                kd[1] = kv[u].y;
                kd[2] = kv[u].z;
                kd[3] = kv[u].w;
                *(uint4 *)&sm.vs[j][d] = vv[u];
            }
        }
        __syncthreads();
        float corr = 1.0f;
        if (wlive) {
            float sc = 0.0f;
#pragma unroll 8
            for (int d = 0; d < hd; d += 4) {
                const float4 q4 = *(const float4 *)&sm.qs[r][d];
                const float2 k01 = __half22float2(*(const __half2 *)&sm.ks[c][d]);
                const float2 k23 = __half22float2(*(const __half2 *)&sm.ks[c][d + 2]);
                sc = fmaf(q4.x, k01.x, sc);
                sc = fmaf(q4.y, k01.y, sc);
                sc = fmaf(q4.z, k23.x, sc);
                sc = fmaf(q4.w, k23.y, sc);
            }
            const int kp = j0 + c;
            sc = kp >= r_lo && kp < r_hi ? sc : -INFINITY;
            float mt = sc;
#pragma unroll
            for (int s = 16; s > 0; s >>= 1)
                mt = fmaxf(mt, STRATA_SHFL_XOR(mt, s));
            const float mn = fmaxf(m, mt);
            corr = mn == -INFINITY ? 1.0f : __expf(m - mn);
            const float p = sc == -INFINITY ? 0.0f : __expf(sc - mn);
            sm.ps[r][c] = p;
            l = l * corr + att_sum8x4(p);
            m = mn;
        }
        __syncthreads(); /* a row's weights, from all its lanes */
        if (!wlive)
            continue;
#pragma unroll
        for (int jd = 0; jd < DW; jd++)
            o[jd] *= corr;
        for (int j = 0; j < ATT_KEYS; j++) {
            const float pj = sm.ps[r][j];
            if (DW % 2 == 0) {
#pragma unroll
                for (int jd = 0; jd < DW; jd += 2) {
                    const float2 v2 = __half22float2(*(const __half2 *)&sm.vs[j][d0 + jd]);
                    o[jd] = fmaf(pj, v2.x, o[jd]);
                    o[jd + 1 < DW ? jd + 1 : jd] = fmaf(pj, v2.y, o[jd + 1 < DW ? jd + 1 : jd]);
                }
            } else {
#pragma unroll
                for (int jd = 0; jd < DW; jd++)
                    o[jd] = fmaf(pj, __half2float(sm.vs[j][d0 + jd]), o[jd]);
            }
        }
    }
    __syncthreads(); /* qs is free: it holds the finished rows for the 8-bit output */
    const int64_t orow = (int64_t)t * a.n_head + h;
    int fin = 0;
    if (valid && r_used == 1) {
        if (bz == 0) {
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
            for (int jd = 0; jd < DW; jd++) {
                const float v = o[jd] * inv;
                a.out[orow * hd + d0 + jd] = v;
                sm.qs[r][d0 + jd] = v;
            }
            fin = 1;
        }
    } else if (valid && bz < r_used) {
        float *sp = a.scratch + ((int64_t)bz * a.n_tok * a.n_head + orow) * (hd + 2);
#pragma unroll
        for (int jd = 0; jd < DW; jd++)
            sp[d0 + jd] = o[jd];
        if (c == 0) {
            sp[hd] = m;
            sp[hd + 1] = l;
        }
    }
    const int nz = splits_used(p0 + a.n_tok, a.n_split, a.split_keys);
    if (a.counters && nz > 1) {
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int *cnt = a.counters + blockIdx.y * gridDim.x + blockIdx.x;
            sm.last = atomicAdd(cnt, 1) == nz - 1;
            if (sm.last)
                *cnt = 0;
        }
        __syncthreads();
        if (sm.last) {
            /* attn_tile's merge: lanes 0..7 read the maxima and weight sums of splits c,
             * c + 8, ... (the other lanes none) and combine them by the same tree */
            __threadfence();
            const int64_t n_rows_out = (int64_t)a.n_tok * a.n_head;
            const int merge = valid && r_used > 1, nzr = merge ? r_used : 0;
            const int nzc = c < 8 ? nzr : 0;
            float mz[ATT_MAX_SPLIT / 8], lz[ATT_MAX_SPLIT / 8], mx = -INFINITY, L = 0.0f;
#pragma unroll
            for (int i = 0; i < ATT_MAX_SPLIT / 8; i++) {
                const int z = c + 8 * i;
                const float *sp = a.scratch + ((int64_t)z * n_rows_out + orow) * (hd + 2);
                mz[i] = z < nzc ? att_ld(sp + hd) : -INFINITY;
                lz[i] = z < nzc ? att_ld(sp + hd + 1) : 0.0f;
                mx = fmaxf(mx, mz[i]);
            }
            mx = fmaxf(mx, STRATA_SHFL_XOR(mx, 1));
            mx = fmaxf(mx, STRATA_SHFL_XOR(mx, 2));
            mx = fmaxf(mx, STRATA_SHFL_XOR(mx, 4));
#pragma unroll
            for (int i = 0; i < ATT_MAX_SPLIT / 8; i++) {
                const float f = mz[i] == -INFINITY ? 0.0f : __expf(mz[i] - mx);
                L += lz[i] * f;
                if (c < 8)
                    sm.ps[r][c + 8 * i] = f;
            }
            L += STRATA_SHFL_XOR(L, 1);
            L += STRATA_SHFL_XOR(L, 2);
            L += STRATA_SHFL_XOR(L, 4);
            L = STRATA_SHFL(L, tid & ~31 & (warpSize - 1));
            __syncthreads();
            float acc[DW];
#pragma unroll
            for (int jd = 0; jd < DW; jd++)
                acc[jd] = 0.0f;
            att_merge_values<DW>(a.scratch + orow * (hd + 2) + d0, n_rows_out * (hd + 2), nzr,
                                 sm.ps[r], acc);
            if (merge) {
#pragma unroll
                for (int jd = 0; jd < DW; jd++) {
                    const float v = L > 0.0f ? acc[jd] / L : 0.0f;
                    a.out[orow * hd + d0 + jd] = v;
                    sm.qs[r][d0 + jd] = v;
                }
                fin = 1;
            }
        }
    }
    if (a.out_q8) {
        /* attn_tile's 8-bit output: lane c < hd / 16 takes 16 values (half a block) */
        __syncthreads();
        uint8_t *yq = (uint8_t *)a.out_q8 + (int64_t)t * a.out_q8_row;
        const int64_t nq = (int64_t)a.n_head * hd;
        const int act = fin && c < hd / 16;
        const float *v = &sm.qs[r][act ? 16 * c : 0];
        float amax = 0.0f;
        if (act)
            for (int j = 0; j < 16; j++)
                amax = fmaxf(amax, fabsf(v[j]));
        amax = fmaxf(amax, STRATA_SHFL_XOR(amax, 1));
        const float d = amax / 127.0f;
        if (act) {
            const int64_t i0 = (int64_t)h * hd + 16 * c;
            for (int j = 0; j < 16; j += 4) {
                uint32_t pk = 0;
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
                    pk |= (uint32_t)(uint8_t)(int8_t)(d > 0.0f ? __float2int_rn(v[j + jj] / d) : 0)
                          << (8 * jj);
                *(uint32_t *)(yq + i0 + j) = pk;
            }
            if (c % 2 == 0)
                ((float *)(yq + nq))[i0 / 32] = d;
        }
    }
}

/* STRATA_NO_ATT_ROW=1: decodes on attn_kernel's tiles too */
STRATA_K_SWITCH_ON(att_row_on, "STRATA_NO_ATT_ROW")

/* ---- prefill on the matrix units (NVIDIA sm_80+) ----
 *
 * FlashAttention-2's loop (Dao 2023) on mma.sync m16n8k16: a block takes 64 query rows
 * of one kv head (the (token, head) rows of the GQA group, as attn_kernel), 16 per
 * warp; keys and values stream through shared memory 64 positions at a time
 * (cp.async); S = Q K^T and O += P V accumulate in f32 and the online softmax runs on
 * the accumulator fragments (a row's values sit in the 4 lanes of a quad).  The f32
 * operands q (scaled) and P are each split into two f16 parts, hi = f16(x) and lo =
 * f16(x - hi), and multiplied as hi + lo (keys and values are f16 already), so the
 * products keep about 22 bits of the operands, as the FMA kernel's f32 arithmetic does,
 * not the 11 of one f16 rounding: the same attention output to ~1e-6 instead of ~1e-3,
 * so that prefill on either kernel leads the model down the same path.  Selected by
 * strata_k_attn_args.mma for batches without splits. */
#define AMMA_ROWS 64
#define AMMA_KEYS 64
#define AMMA_THREADS 128
#define AMMA_PS 1024.0f

#ifdef STRATA_GPU_MMA_F16
static __device__ __forceinline__ uint32_t amma_smem(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void amma_ldsm_x4(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(amma_smem(p)));
}

static __device__ __forceinline__ void amma_ldsm_x4_t(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(amma_smem(p)));
}

static __device__ __forceinline__ void amma_mma(float *d, const uint32_t *a, uint32_t b0,
                                                uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* x, y as f16 pairs hi = f16(v) and lo = f16(v - hi) */
static __device__ __forceinline__ void amma_split(float x, float y, uint32_t *hi, uint32_t *lo)
{
    __half2 h = __floats2half2_rn(x, y);
    float2 hf = __half22float2(h);
    __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    *hi = *(const uint32_t *)&h;
    *lo = *(const uint32_t *)&l;
}
#endif

template <int HD>
__global__ void __launch_bounds__(AMMA_THREADS) attn_mma_kernel(struct strata_k_attn_args a)
{
#ifdef STRATA_GPU_MMA_F16
    constexpr int LD = HD + 8, KS = HD / 16, DT = HD / 8;
    __shared__ __align__(16) __half ks[AMMA_KEYS][LD];
    __shared__ __align__(16) __half vs[AMMA_KEYS][LD];
    strata_pdl_wait();
    strata_pdl_trigger();
    const int n_gqa = a.n_head / a.n_head_kv, g = blockIdx.y;
    const int n_rows = a.n_tok * n_gqa, row0 = blockIdx.x * AMMA_ROWS;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, qg = lane >> 2, qc = lane & 3;
    const int p0 = *a.pos0;
    const int64_t kv_row = (int64_t)a.n_head_kv * HD;
    /* the query tile, scaled, as f16 hi parts in ks and lo parts in vs (staging only) */
    for (int i = tid; i < AMMA_ROWS * (HD / 4); i += AMMA_THREADS) {
        int rr = i / (HD / 4), d = 4 * (i % (HD / 4));
        float4 v = att_q4(a, row0 + rr, n_rows, n_gqa, g, HD, d);
        float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            __half h = __float2half_rn(f[j]);
            ks[rr][d + j] = h;
            vs[rr][d + j] = __float2half_rn(f[j] - __half2float(h));
        }
    }
    __syncthreads();
    uint32_t qf[KS][4], ql[KS][4];
#pragma unroll
    for (int k = 0; k < KS; k++) {
        const int qr = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, qk = 16 * k + (lane >> 4) * 8;
        amma_ldsm_x4(qf[k], &ks[qr][qk]);
        amma_ldsm_x4(ql[k], &vs[qr][qk]);
    }
    /* this thread's two rows (qg, qg + 8 of the warp's 16) and their positions */
    int qpos[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int ro = row0 + warp * 16 + qg + 8 * h;
        qpos[h] = p0 + (ro < n_rows ? ro : n_rows - 1) / n_gqa;
    }
    const int last = min(row0 + AMMA_ROWS, n_rows) - 1;
    const int kv_hi = p0 + last / n_gqa + 1; /* keys [0, kv_hi) serve some row */
    const int warp_last = min(row0 + warp * 16 + 15, n_rows - 1);
    const int warp_hi = p0 + warp_last / n_gqa + 1;
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int q = 0; q < 4; q++)
            o[j][q] = 0.0f;
    for (int j0 = 0; j0 < kv_hi; j0 += AMMA_KEYS) {
        __syncthreads(); /* the previous tile (or the query staging) is read */
        for (int i = tid; i < AMMA_KEYS * (HD / 8); i += AMMA_THREADS) {
            int j = i / (HD / 8), d = 8 * (i % (HD / 8));
            bool in = j0 + j < kv_hi;
            int64_t off = in ? (j0 + j) * kv_row + (int64_t)g * HD + d : 0;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(amma_smem(&ks[j][d])),
                         "l"(a.k_cache + off), "r"(in ? 16 : 0));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(amma_smem(&vs[j][d])),
                         "l"(a.v_cache + off), "r"(in ? 16 : 0));
        }
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        if (j0 >= warp_hi)
            continue; /* every key of this tile is past the warp's rows */
        float sc[AMMA_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < AMMA_KEYS / 8; n++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                sc[n][q] = 0.0f;
#pragma unroll
        for (int k = 0; k < KS; k++)
#pragma unroll
            for (int n = 0; n < AMMA_KEYS / 8; n += 2) {
                /* (keys n, dims lo), (n, hi), (n + 1, lo), (n + 1, hi) */
                int mt = lane >> 3;
                uint32_t b[4];
                amma_ldsm_x4(b, &ks[(n + (mt >> 1)) * 8 + (lane & 7)][16 * k + (mt & 1) * 8]);
                amma_mma(sc[n], ql[k], b[0], b[1]);
                amma_mma(sc[n + 1], ql[k], b[2], b[3]);
                amma_mma(sc[n], qf[k], b[0], b[1]);
                amma_mma(sc[n + 1], qf[k], b[2], b[3]);
            }
        /* causal mask and the online softmax, rows qg (q 0, 1) and qg + 8 (q 2, 3) */
        float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < AMMA_KEYS / 8; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int kp = j0 + 8 * n + 2 * qc + (q & 1);
                if (kp > qpos[q >> 1])
                    sc[n][q] = -INFINITY;
                mt[q >> 1] = fmaxf(mt[q >> 1], sc[n][q]);
            }
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
            float mn = fmaxf(m[h], mt[h]);
            corr[h] = mn == -INFINITY ? 1.0f : __expf(m[h] - mn);
            m[h] = mn;
            l[h] *= corr[h];
        }
#pragma unroll
        for (int n = 0; n < AMMA_KEYS / 8; n++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float pv = sc[n][q] == -INFINITY ? 0.0f : __expf(sc[n][q] - m[q >> 1]);
                sc[n][q] = pv;
                l[q >> 1] += pv;
            }
#pragma unroll
        for (int j = 0; j < DT; j++) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        /* O += P V: P's accumulator fragments are the A fragments of 16-key chunks */
#pragma unroll
        for (int kc = 0; kc < AMMA_KEYS / 16; kc++) {
            /* P times 2^10 (exact; taken off at the end), so that the lo parts of small
             * weights stay clear of f16's subnormal range */
            uint32_t pa[4], pl[4];
            amma_split(AMMA_PS * sc[2 * kc][0], AMMA_PS * sc[2 * kc][1], &pa[0], &pl[0]);
            amma_split(AMMA_PS * sc[2 * kc][2], AMMA_PS * sc[2 * kc][3], &pa[1], &pl[1]);
            amma_split(AMMA_PS * sc[2 * kc + 1][0], AMMA_PS * sc[2 * kc + 1][1], &pa[2], &pl[2]);
            amma_split(AMMA_PS * sc[2 * kc + 1][2], AMMA_PS * sc[2 * kc + 1][3], &pa[3], &pl[3]);
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                /* (keys lo, dims j), (keys hi, dims j), (lo, j + 1), (hi, j + 1), transposed */
                int mt4 = lane >> 3;
                uint32_t b[4];
                amma_ldsm_x4_t(b, &vs[16 * kc + (mt4 & 1) * 8 + (lane & 7)][8 * (j + (mt4 >> 1))]);
                amma_mma(o[j], pl, b[0], b[1]);
                amma_mma(o[j + 1], pl, b[2], b[3]);
                amma_mma(o[j], pa, b[0], b[1]);
                amma_mma(o[j + 1], pa, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int ro = row0 + warp * 16 + qg + 8 * h;
        if (ro >= n_rows)
            continue;
        int tt = ro / n_gqa, hh = g * n_gqa + ro % n_gqa;
        float inv = l[h] > 0.0f ? 1.0f / (AMMA_PS * l[h]) : 0.0f;
        float *out = a.out + ((int64_t)tt * a.n_head + hh) * HD;
#pragma unroll
        for (int j = 0; j < DT; j++)
            *(float2 *)(out + 8 * j + 2 * qc) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
#else
    (void)a;
#endif
}

/* 1 if the loaded code of the matrix-unit kernel was built for sm_80 or newer (its body
 * is empty below); read once */
static int amma_image_ok(void)
{
    static int ok = -1;
    if (ok < 0)
        ok = strata_k_code_arch(reinterpret_cast<const void *>(attn_mma_kernel<128>)) >= 80;
    return ok;
}

size_t strata_k_attn_counters(int n_tok, int n_head, int n_head_kv)
{
    int n_rows = n_tok * (n_head / n_head_kv);
    return (size_t)((n_rows + ATT_ROWS - 1) / ATT_ROWS) * (size_t)n_head_kv;
}

size_t strata_k_attn_scratch_bytes(int n_tok, int n_head, int hd, int n_split)
{
    return n_split > 1 ? sizeof(float) * (size_t)n_split * n_tok * n_head * (hd + 2) : 0;
}

/* The splits' merge as its own launch (no counters) */
static int attn_merge_launch(struct strata_gpu_ctx *ctx, const struct strata_k_attn_args *a,
                             struct strata_err *err)
{
    dim3 g2((unsigned)(a->n_tok * a->n_head)), b2(128);
    strata_k_launch(ctx, attn_merge_kernel, g2, b2, (const float *)a->scratch, a->out,
                    a->n_tok * a->n_head, a->hd, a->n_split, a->pos0, a->n_head, a->split_keys);
    return strata_k_check(ctx, "attn_merge_kernel", g2, b2, err, "rows=%d hd=%d n_split=%d",
                          a->n_tok * a->n_head, a->hd, a->n_split);
}

int strata_k_attention(struct strata_gpu_ctx *ctx, const struct strata_k_attn_args *a,
                       struct strata_err *err)
{
    if (a->n_tok <= 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv ||
        a->hd <= 0 || a->hd > ATT_HD || a->hd % 8 || a->n_split < 1 ||
        a->n_split > ATT_MAX_SPLIT || a->max_kv < a->n_tok ||
        a->split_keys < 0 || a->split_keys % ATT_KEYS ||
        (a->n_split > 1 && !a->scratch) ||
        (a->out_q8 && (a->hd % 32 || (a->n_split > 1 && !a->counters) ||
                       a->out_q8_row < (int64_t)strata_k_q8_row_bytes((int64_t)a->n_head * a->hd) ||
                       (uintptr_t)a->out_q8 % 16 || a->out_q8_row % 16)))
        return strata_k_err(err, STRATA_E_INVALID,
                            "attention: bad shape n_tok=%d n_head=%d n_head_kv=%d hd=%d "
                            "n_split=%d max_kv=%d out_q8_row=%lld (hd a multiple of 8, <= %d; "
                            "n_split <= 32; "
                            "8-bit output: hd a multiple of 32, counters when split; split_keys a multiple "
                            "of 32)",
                            a->n_tok, a->n_head, a->n_head_kv, a->hd, a->n_split, a->max_kv,
                            (long long)a->out_q8_row, ATT_HD);
    int n_rows = a->n_tok * (a->n_head / a->n_head_kv);
    if (a->mma && ctx->info.has_mma_f16 && a->n_split == 1 && !a->counters && !a->out_q8 &&
        (a->hd == 32 || a->hd == 64 || a->hd == 128) && a->q_stride % 4 == 0 &&
        ((uintptr_t)a->q & 15) == 0 && amma_image_ok()) {
        dim3 gm((unsigned)((n_rows + AMMA_ROWS - 1) / AMMA_ROWS), (unsigned)a->n_head_kv),
            bm(AMMA_THREADS);
        if (a->hd == 128)
            strata_k_launch(ctx, attn_mma_kernel<128>, gm, bm, *a);
        else if (a->hd == 64)
            strata_k_launch(ctx, attn_mma_kernel<64>, gm, bm, *a);
        else
            strata_k_launch(ctx, attn_mma_kernel<32>, gm, bm, *a);
        return strata_k_check(ctx, "attn_mma_kernel", gm, bm, err,
                              "n_tok=%d n_head=%d n_head_kv=%d hd=%d max_kv=%d", a->n_tok,
                              a->n_head, a->n_head_kv, a->hd, a->max_kv);
    }
    if (n_rows <= ATT_ROWS_W && a->hd % 32 == 0 && !a->tiles && att_row_on()) {
        /* decode-sized: a 32-lane group a row (the same bits as attn_kernel) */
        dim3 gw(1, (unsigned)a->n_head_kv, (unsigned)a->n_split), bw(ATT_THREADS);
        switch (a->hd / 32) {
        case 1: strata_k_launch(ctx, attn_row_kernel<1>, gw, bw, *a); break;
        case 2: strata_k_launch(ctx, attn_row_kernel<2>, gw, bw, *a); break;
        case 3: strata_k_launch(ctx, attn_row_kernel<3>, gw, bw, *a); break;
        default: strata_k_launch(ctx, attn_row_kernel<4>, gw, bw, *a); break;
        }
        int rc = strata_k_check(ctx, "attn_row_kernel", gw, bw, err,
                                "n_tok=%d n_head=%d n_head_kv=%d hd=%d n_split=%d max_kv=%d",
                                a->n_tok, a->n_head, a->n_head_kv, a->hd, a->n_split,
                                a->max_kv);
        if (rc || a->n_split == 1 || a->counters)
            return rc;
        return attn_merge_launch(ctx, a, err);
    }
    dim3 grid((unsigned)((n_rows + ATT_ROWS - 1) / ATT_ROWS), (unsigned)a->n_head_kv,
              (unsigned)a->n_split),
        block(ATT_THREADS);
    switch (a->hd / 8) {
    case 1: strata_k_launch(ctx, attn_kernel<1>, grid, block, *a); break;
    case 2: strata_k_launch(ctx, attn_kernel<2>, grid, block, *a); break;
    case 3: strata_k_launch(ctx, attn_kernel<3>, grid, block, *a); break;
    case 4: strata_k_launch(ctx, attn_kernel<4>, grid, block, *a); break;
    case 5: strata_k_launch(ctx, attn_kernel<5>, grid, block, *a); break;
    case 6: strata_k_launch(ctx, attn_kernel<6>, grid, block, *a); break;
    case 7: strata_k_launch(ctx, attn_kernel<7>, grid, block, *a); break;
    case 8: strata_k_launch(ctx, attn_kernel<8>, grid, block, *a); break;
    case 10: strata_k_launch(ctx, attn_kernel<10>, grid, block, *a); break;
    case 12: strata_k_launch(ctx, attn_kernel<12>, grid, block, *a); break;
    case 16: strata_k_launch(ctx, attn_kernel<16>, grid, block, *a); break;
    default:
        return strata_k_err(err, STRATA_E_UNSUPPORTED, "attention: head dim %d not built", a->hd);
    }
    int rc = strata_k_check(ctx, "attn_kernel", grid, block, err,
                            "n_tok=%d n_head=%d n_head_kv=%d hd=%d n_split=%d max_kv=%d",
                            a->n_tok, a->n_head, a->n_head_kv, a->hd, a->n_split, a->max_kv);
    if (rc || a->n_split == 1 || a->counters)
        return rc;
    return attn_merge_launch(ctx, a, err);
}
