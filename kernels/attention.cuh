/* attention.cuh - the decode attention tile (split-K over the kv cache, the splits
 * merged by the last block of each tile), shared by attention.cu's attn_kernel and the
 * fused decode step (decode_step.cu).  See attention.cu for the scheme. */
#ifndef STRATA_KERNELS_ATTENTION_CUH
#define STRATA_KERNELS_ATTENTION_CUH

#include "kernels.h"

#define ATT_ROWS 32
#define ATT_KEYS 32
#define ATT_HD 128
#define ATT_THREADS (ATT_ROWS * 8)
#define ATT_MIN_SPLIT_KEYS 128 /* fewer keys than this per split do not pay for a split */
#define ATT_MAX_SPLIT 32       /* splits of the kv range at most (the merge's registers) */

/* The split-K layout of a query row is a function of its own kv length kv_end (its
 * position + 1), never of the batch it came in: the splits it uses, and split z covers
 * kv positions [z * w, min(kv_end, (z + 1) * w)) with w = split_width.  A one-token
 * decode and the same position inside a verify window so sum the same keys in the
 * same tiles in the same order, bitwise. */
static __device__ __forceinline__ int splits_used(int kv_end, int n_split, int split_keys)
{
    const int mk = split_keys > 0 ? split_keys : ATT_MIN_SPLIT_KEYS;
    int s = (kv_end + mk - 1) / mk;
    return s < 1 ? 1 : s > n_split ? n_split : s;
}

/* Width of each split (a multiple of ATT_KEYS, so every split starts on a tile). */
static __device__ __forceinline__ int split_width(int kv_end, int n_used)
{
    return ((kv_end + n_used - 1) / n_used + ATT_KEYS - 1) / ATT_KEYS * ATT_KEYS;
}

/* A value other blocks of the same launch wrote: read through L2 */
static __device__ __forceinline__ float att_ld(const float *p)
{
    return strata_ldcg_f(p);
}

/* The split merge's sums: acc[j] += the value j of split z (base + z * zstride + j) times
 * ps[z], for z = 0 .. nz - 1 in order, with the loads of a batch of splits (at most 32
 * values) issued before their sums (one round trip to L2 a batch, not one every few
 * splits); the same sums in the same order as one split at a time. */
template <int N>
static __device__ __forceinline__ void att_merge_values(const float *base, int64_t zstride,
                                                        int nz, const float *ps, float *acc)
{
    constexpr int B = N <= 4 ? 8 : N <= 8 ? 4 : N <= 16 ? 2 : 1; /* B * N <= 32 registers */
    for (int z0 = 0; z0 < nz; z0 += B) {
        float t[B][N];
#pragma unroll
        for (int u = 0; u < B; u++)
#pragma unroll
            for (int j = 0; j < N; j++)
                t[u][j] = z0 + u < nz ? att_ld(base + (z0 + u) * zstride + j) : 0.0f;
#pragma unroll
        for (int u = 0; u < B; u++)
            if (z0 + u < nz) {
                const float f = ps[z0 + u];
#pragma unroll
                for (int j = 0; j < N; j++)
                    acc[j] += t[u][j] * f;
            }
    }
}

/* Query values d .. d + 3 of the block's row ro (row ro of kv head g is token ro / n_gqa,
 * head g * n_gqa + ro % n_gqa), times a.scale; zeros past the last row. */
static __device__ __forceinline__ float4 att_q4(const struct strata_k_attn_args &a, int ro,
                                                int n_rows, int n_gqa, int g, int hd, int d)
{
    if (ro >= n_rows)
        return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int tt = ro / n_gqa, hh = g * n_gqa + ro % n_gqa;
    /* through L2: in the fused decode step other blocks wrote q moments ago */
    float4 v = strata_ldcg_f4((const float4 *)(a.q + tt * a.q_stride + (int64_t)hh * hd + d));
    return make_float4(v.x * a.scale, v.y * a.scale, v.z * a.scale, v.w * a.scale);
}

/* The shared memory of one attn_tile. */
struct att_smem {
    __align__(16) float qs[ATT_ROWS][ATT_HD + 4];
    __align__(16) __half ks[ATT_KEYS][ATT_HD + 8];
    __align__(16) __half vs[ATT_KEYS][ATT_HD + 8];
    float ps[ATT_ROWS][ATT_KEYS + 1];
    int blk_lo, blk_hi, last;
};

/* One tile of decode attention: block (bx, by, bz) of attn_kernel's grid (row tile,
 * kv head, split), gdx its grid's x size; ATT_THREADS threads, block-uniform control
 * flow (every thread returns or reaches every barrier together).  DPT = hd / 8: the
 * output dimensions a thread owns (contiguous, so that value rows are read as half2
 * pairs).  The fused decode step runs the same tiles inside its persistent blocks. */
template <int DPT>
static __device__ void attn_tile(const struct strata_k_attn_args &a, int bx, int by, int bz,
                                 int gdx, struct att_smem *sm)
{
    float(*qs)[ATT_HD + 4] = sm->qs;
    __half(*ks)[ATT_HD + 8] = sm->ks;
    __half(*vs)[ATT_HD + 8] = sm->vs;
    float(*ps)[ATT_KEYS + 1] = sm->ps;
    const int hd = 8 * DPT, n_gqa = a.n_head / a.n_head_kv, g = by;
    const int n_rows = a.n_tok * n_gqa, row0 = bx * ATT_ROWS;
    const int tid = threadIdx.x, r = tid / 8, c8 = tid % 8;
    const int p0 = *a.pos0;
    const int row = row0 + r, valid = row < n_rows;
    const int t = valid ? row / n_gqa : 0, h = g * n_gqa + (valid ? row % n_gqa : 0);
    const int qpos = p0 + t;
    /* the last query uses the most splits */
    if (bz >= splits_used(p0 + a.n_tok, a.n_split, a.split_keys))
        return;
    /* this row's keys in split z: [r_lo, r_hi) (empty when it uses fewer splits); the
     * block walks the tiles of the union of its rows' ranges and masks the others */
    const int r_used = splits_used(qpos + 1, a.n_split, a.split_keys);
    const int r_lo = bz * split_width(qpos + 1, r_used);
    const int r_hi = valid && bz < r_used
                         ? min(qpos + 1, r_lo + split_width(qpos + 1, r_used))
                         : r_lo;
    if (tid == 0) {
        sm->blk_lo = 0x7fffffff;
        sm->blk_hi = 0;
    }
    __syncthreads();
    if (c8 == 0 && r_hi > r_lo) {
        atomicMin(&sm->blk_lo, r_lo);
        atomicMax(&sm->blk_hi, r_hi);
    }
    __syncthreads();
    const int lo = sm->blk_lo, hi = sm->blk_hi;
    const int64_t kv_row = (int64_t)a.n_head_kv * hd;

    for (int i = tid; i < ATT_ROWS * (hd / 4); i += ATT_THREADS) {
        int rr = i / (hd / 4), d = 4 * (i % (hd / 4));
        *(float4 *)&qs[rr][d] = att_q4(a, row0 + rr, n_rows, n_gqa, g, hd, d);
    }

    float m = -INFINITY, l = 0.0f, o[DPT];
#pragma unroll
    for (int j = 0; j < DPT; j++)
        o[j] = 0.0f;
    /* a warp/wavefront whose rows are all past the last (a one-token decode fills 8 of
     * the tile's 32 rows) skips the products: its rows' results are never used, and the
     * warps that have rows get the issue slots.  Warp-uniform (the row shuffles below
     * stay within a row's 8 lanes); every thread still reaches every barrier. */
    const int wlive = row0 + (int)(tid - tid % warpSize) / 8 < n_rows;

    for (int j0 = lo; j0 < hi; j0 += ATT_KEYS) {
        __syncthreads();
        /* plain loads of the kv cache: in the fused decode step another block wrote the
         * newest row in this launch, but no multiprocessor read that row before (it is
         * new), so no stale L1 line of it can exist, and the grid barrier between the two
         * orders the write before this read */
        for (int i = tid; i < ATT_KEYS * DPT; i += ATT_THREADS) {
            int j = i / DPT, d = 8 * (i % DPT);
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (j0 + j < hi) {
                kv = *(const uint4 *)(a.k_cache + (j0 + j) * kv_row + (int64_t)g * hd + d);
                vv = *(const uint4 *)(a.v_cache + (j0 + j) * kv_row + (int64_t)g * hd + d);
            }
            *(uint4 *)&ks[j][d] = kv;
            *(uint4 *)&vs[j][d] = vv;
        }
        __syncthreads();
        float corr = 1.0f;
        if (wlive) {
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, mt = -INFINITY;
            /* each query value read once for the thread's 4 keys */
#pragma unroll 4
            for (int d = 0; d < hd; d += 4) {
                float4 q4 = *(const float4 *)&qs[r][d];
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    int j = c8 + 8 * jj;
                    float2 k01 = __half22float2(*(const __half2 *)&ks[j][d]);
                    float2 k23 = __half22float2(*(const __half2 *)&ks[j][d + 2]);
                    s[jj] = fmaf(q4.x, k01.x, s[jj]);
                    s[jj] = fmaf(q4.y, k01.y, s[jj]);
                    s[jj] = fmaf(q4.z, k23.x, s[jj]);
                    s[jj] = fmaf(q4.w, k23.y, s[jj]);
                }
            }
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                int kp = j0 + c8 + 8 * jj;
                s[jj] = (kp >= r_lo && kp < r_hi) ? s[jj] : -INFINITY;
                mt = fmaxf(mt, s[jj]);
            }
            /* the 8 threads of a row are 8 aligned lanes of one warp/wavefront */
            mt = fmaxf(mt, STRATA_SHFL_XOR(mt, 1));
            mt = fmaxf(mt, STRATA_SHFL_XOR(mt, 2));
            mt = fmaxf(mt, STRATA_SHFL_XOR(mt, 4));
            float mn = fmaxf(m, mt);
            corr = mn == -INFINITY ? 1.0f : __expf(m - mn);
            float psum = 0.0f;
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                float p = s[jj] == -INFINITY ? 0.0f : __expf(s[jj] - mn);
                ps[r][c8 + 8 * jj] = p;
                psum += p;
            }
            psum += STRATA_SHFL_XOR(psum, 1);
            psum += STRATA_SHFL_XOR(psum, 2);
            psum += STRATA_SHFL_XOR(psum, 4);
            l = l * corr + psum;
            m = mn;
        }
        __syncthreads();
        if (!wlive)
            continue;
#pragma unroll
        for (int jd = 0; jd < DPT; jd++)
            o[jd] *= corr;
        const int d0 = c8 * DPT;
        for (int j = 0; j < ATT_KEYS; j++) {
            float p = ps[r][j];
            if (DPT % 2 == 0) {
#pragma unroll
                for (int jd = 0; jd < DPT; jd += 2) {
                    float2 v2 = __half22float2(*(const __half2 *)&vs[j][d0 + jd]);
                    o[jd] = fmaf(p, v2.x, o[jd]);
                    o[jd + 1 < DPT ? jd + 1 : jd] =
                        fmaf(p, v2.y, o[jd + 1 < DPT ? jd + 1 : jd]);
                }
            } else {
#pragma unroll
                for (int jd = 0; jd < DPT; jd++)
                    o[jd] = fmaf(p, __half2float(vs[j][d0 + jd]), o[jd]);
            }
        }
    }
    /* qs is free from here on: it holds the finished rows for the 8-bit output */
    __syncthreads();
    const int64_t orow = (int64_t)t * a.n_head + h;
    const int d0 = c8 * DPT;
    int fin = 0; /* this row's result is final in this block (and stashed in qs[r]) */
    if (valid && r_used == 1) {
        if (bz == 0) {
            float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
            for (int jd = 0; jd < DPT; jd++) {
                float v = o[jd] * inv;
                a.out[orow * hd + d0 + jd] = v;
                qs[r][d0 + jd] = v;
            }
            fin = 1;
        }
    } else if (valid && bz < r_used) {
        /* partial result of this split: [n_split][n_tok * n_head][hd + 2]; an empty one
         * of the row's own splits is written too (m = -inf: the merge skips it) */
        float *sp = a.scratch + ((int64_t)bz * a.n_tok * a.n_head + orow) * (hd + 2);
#pragma unroll
        for (int jd = 0; jd < DPT; jd++)
            sp[d0 + jd] = o[jd];
        if (c8 == 0) {
            sp[hd] = m;
            sp[hd + 1] = l;
        }
    }
    const int nz = splits_used(p0 + a.n_tok, a.n_split, a.split_keys); /* blocks of this tile that run */
    if (a.counters && nz > 1) {
        /* the last block of the tile to finish merges its split rows (threadFenceReduction
         * pattern), in an order of its own: not attn_merge_kernel's, so the two differ in
         * the last bits; decodes and verify windows both merge here */
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int *cnt = a.counters + by * gdx + bx;
            sm->last = atomicAdd(cnt, 1) == nz - 1;
            if (sm->last)
                *cnt = 0; /* every block of the tile has counted: ready for the next launch */
        }
        __syncthreads();
        if (sm->last) {
            /* every thread takes part (the shuffles need whole warps); the rows with a
             * split to merge (valid, r_used > 1) use it.  The row's 8 threads read the
             * maxima and weight sums of splits c8, c8 + 8, ... at once and combine them by
             * a fixed shuffle tree; the factors go through ps so that each thread then
             * sums its dimensions over the splits in order, the loads of four splits in
             * flight together (no split is waited for one after the other). */
            __threadfence();
            const int64_t n_rows_out = (int64_t)a.n_tok * a.n_head;
            const int merge = valid && r_used > 1, nzr = merge ? r_used : 0;
            float mz[ATT_MAX_SPLIT / 8], lz[ATT_MAX_SPLIT / 8], mx = -INFINITY, L = 0.0f;
#pragma unroll
            for (int i = 0; i < ATT_MAX_SPLIT / 8; i++) {
                const int z = c8 + 8 * i;
                const float *sp = a.scratch + ((int64_t)z * n_rows_out + orow) * (hd + 2);
                mz[i] = z < nzr ? att_ld(sp + hd) : -INFINITY;
                lz[i] = z < nzr ? att_ld(sp + hd + 1) : 0.0f;
                mx = fmaxf(mx, mz[i]);
            }
            mx = fmaxf(mx, STRATA_SHFL_XOR(mx, 1));
            mx = fmaxf(mx, STRATA_SHFL_XOR(mx, 2));
            mx = fmaxf(mx, STRATA_SHFL_XOR(mx, 4));
#pragma unroll
            for (int i = 0; i < ATT_MAX_SPLIT / 8; i++) {
                const float f = mz[i] == -INFINITY ? 0.0f : __expf(mz[i] - mx);
                L += lz[i] * f;
                ps[r][c8 + 8 * i] = f;
            }
            L += STRATA_SHFL_XOR(L, 1);
            L += STRATA_SHFL_XOR(L, 2);
            L += STRATA_SHFL_XOR(L, 4);
            __syncthreads();
            float acc[DPT];
#pragma unroll
            for (int jd = 0; jd < DPT; jd++)
                acc[jd] = 0.0f;
            att_merge_values<DPT>(a.scratch + orow * (hd + 2) + d0, n_rows_out * (hd + 2), nzr,
                                  ps[r], acc);
            if (merge) {
#pragma unroll
                for (int jd = 0; jd < DPT; jd++) {
                    float v = L > 0.0f ? acc[jd] / L : 0.0f;
                    a.out[orow * hd + d0 + jd] = v;
                    qs[r][d0 + jd] = v;
                }
                fin = 1;
            }
        }
    }
    if (a.out_q8) {
        /* the finished rows as 8-bit blocks of 32 (hd % 32 == 0: a block never spans two
         * heads), with strata_k_quantize_q8's formula: the same bytes.  Each of a row's 8
         * threads takes 16 values (half a block; the two halves' maxima meet by one
         * shuffle), so every lane runs the same rounds and reaches every shuffle. */
        __syncthreads();
        uint8_t *yq = (uint8_t *)a.out_q8 + (int64_t)t * a.out_q8_row;
        const int64_t nq = (int64_t)a.n_head * hd;
        const int halves = hd / 16;
        for (int i = 0; i < (halves + 7) / 8; i++) {
            const int hb = c8 + 8 * i, act = fin && hb < halves;
            const float *v = &qs[r][act ? 16 * hb : 0];
            float amax = 0.0f;
            if (act)
                for (int j = 0; j < 16; j++)
                    amax = fmaxf(amax, fabsf(v[j]));
            amax = fmaxf(amax, STRATA_SHFL_XOR(amax, 1));
            const float d = amax / 127.0f;
            if (!act)
                continue;
            const int64_t i0 = (int64_t)h * hd + 16 * hb;
            for (int j = 0; j < 16; j += 4) {
                uint32_t pk = 0;
#pragma unroll
                for (int jj = 0; jj < 4; jj++)
                    pk |= (uint32_t)(uint8_t)(int8_t)(d > 0.0f ? __float2int_rn(v[j + jj] / d) : 0)
                          << (8 * jj);
                *(uint32_t *)(yq + i0 + j) = pk;
            }
            if (hb % 2 == 0)
                ((float *)(yq + nq))[i0 / 32] = d;
        }
    }
}

#endif
