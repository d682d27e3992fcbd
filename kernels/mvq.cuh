/* mvq.cuh - the pieces of the 8-bit-activation mat-vec products (matvec_q8.cu) that
 * the fused decode step (decode_step.cu) runs too: the RMSNorm + q8 quantisation of a
 * row and the per-type dot products of a 32-value unit.  Both kernels use these same
 * functions in the same order, so a row's result is the same bits in either. */
#ifndef STRATA_KERNELS_MVQ_CUH
#define STRATA_KERNELS_MVQ_CUH

#include "dequant.cuh"

/* Quantise v (one value per lane, lanes of a 32-aligned group hold one q8 block):
 * every lane gets its quant, and *d the block's scale. */
static __device__ __forceinline__ int q8_quant(float v, float *d)
{
    float amax = fabsf(v);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        amax = fmaxf(amax, STRATA_SHFL_XOR(amax, m));
    *d = amax / 127.0f;
    return *d > 0.0f ? __float2int_rn(v / *d) : 0;
}

/* x[i]; VOL: for rows other blocks of the same launch wrote, a read that bypasses the
 * multiprocessor's L1 (strata_ldcg_f) */
template <bool VOL> static __device__ __forceinline__ float ldx(const float *x, int i)
{
    return VOL ? strata_ldcg_f(x + i) : x[i];
}

/* This thread's part of the sum of squares of an n-value row: x[i], x[i + blockDim.x],
 * ... added in order.  STAGED: x is also copied to y (shared memory).  The loads of eight
 * values are issued before their sums (a guarded load is predicated, not a branch the
 * next load waits behind), so a 2,048-value row of a 256-thread block costs one round
 * trip; the sum's order is i's either way. */
template <bool VOL, bool STAGED = false>
static __device__ __forceinline__ float row_sumsq_part(const float *x, int n, float *y)
{
    constexpr int B = 8;
    float s = 0.0f;
    for (int i0 = threadIdx.x; i0 < n; i0 += B * (int)blockDim.x) {
        float v[B];
#pragma unroll
        for (int j = 0; j < B; j++) {
            const int i = i0 + j * (int)blockDim.x;
            v[j] = i < n ? ldx<VOL>(x, i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < B; j++) {
            const int i = i0 + j * (int)blockDim.x;
            if (i < n) {
                if (STAGED)
                    y[i] = v[j];
                s = fmaf(v[j], v[j], s);
            }
        }
    }
    return s;
}

/* The RMSNorm scale of a row from its sum of squares s. */
static __device__ __forceinline__ float rms_scale_of(float s, int n, float eps)
{
    return rsqrtf(s / (float)n + eps);
}

/* rsqrt(mean(x^2) + eps) of one n-value row by the whole block: the threads' parts
 * (row_sumsq_part), then the block tree (strata_block_sum).  Every kernel that
 * normalises a decode row sums in this order (moe_router_topk_kernel takes the same
 * tree for all its tokens at once), so the normed values are the same bits whichever
 * kernel made them. */
template <bool VOL, bool STAGED = false>
static __device__ __forceinline__ float row_rms_scale(const float *x, int n, float eps, float *y,
                                                      float *scratch)
{
    const float s = strata_block_sum(row_sumsq_part<VOL, STAGED>(x, n, y), scratch);
    return rms_scale_of(s, n, eps);
}

/* Values 32 b + 4 gl .. + 3 (v) of an n-value row as 8-bit quants: eight lanes (gl =
 * lane % 8) own a 32-value block, whose scale max|v| / 127 needs three shuffles.  Every
 * lane of the warp calls it (act = 0: takes part in the shuffles only, writes nothing);
 * y (float copy of v) may be NULL; yq: the q8 row (n quants, then n / 32 scales). */
static __device__ __forceinline__ void q8_store4(const float *v, int act, int gl, int b, int n,
                                                 float *y, uint8_t *yq)
{
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++)
        amax = fmaxf(amax, fabsf(v[j]));
    amax = fmaxf(amax, STRATA_SHFL_XOR(amax, 1));
    amax = fmaxf(amax, STRATA_SHFL_XOR(amax, 2));
    amax = fmaxf(amax, STRATA_SHFL_XOR(amax, 4));
    float d = amax / 127.0f;
    if (!act)
        return;
    const int i0 = 32 * b + 4 * gl;
    if (y)
        *(float4 *)(y + i0) = make_float4(v[0], v[1], v[2], v[3]);
    uint32_t pk = 0;
#pragma unroll
    for (int j = 0; j < 4; j++)
        pk |= (uint32_t)(uint8_t)(int8_t)(d > 0.0f ? __float2int_rn(v[j] / d) : 0) << (8 * j);
    *(uint32_t *)(yq + i0) = pk;
    if (gl == 0)
        ((float *)(yq + n))[b] = d;
}

/* The norm weights norm_q8_row's thread multiplies by in its first NP passes (values
 * 32 b + 4 gl .. + 3 of its blocks b), loaded into registers ahead of their use - before
 * a PDL wait, since weights never depend on the kernel before - so that the norm's
 * second pass has no round trip to L2 for them; the weights of later passes are asked
 * for in L2.  w NULL or not 16-byte aligned: none kept (norm_q8_row then reads w
 * itself). */
template <int NP> struct norm_wpre {
    float4 v[NP];
    bool ok;
};

template <int NP>
static __device__ __forceinline__ void norm_w_preload(const float *w, int n, norm_wpre<NP> *pre)
{
    const int nb = n / 32, gl = threadIdx.x % 8, ng = blockDim.x / 8;
    pre->ok = w && !((uintptr_t)w & 15);
#pragma unroll
    for (int it = 0; it < NP; it++) {
        const int b = threadIdx.x / 8 + it * ng;
        pre->v[it] = pre->ok && b < nb ? *(const float4 *)(w + 32 * b + 4 * gl)
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (w) /* the passes after the first NP: NP * ng blocks of 32 */
        for (int i = 32 * (NP * ng + (int)threadIdx.x); i < n; i += 32 * (int)blockDim.x)
            strata_prefetch_l2(w + i);
}

/* One row by the whole block: v = norm ? x * rsqrt(mean(x^2) + eps) * w : x, written
 * as float32 to y (if not NULL) and as a q8 row to yq.  n % 32 == 0, blockDim.x % 32 ==
 * 0.  Eight lanes own a 32-value block (four values each), so that the scale needs only
 * three shuffles; loops run warp-uniformly (every lane of a warp reaches every
 * shuffle).  STAGED (y in shared memory, norm on): the first pass keeps x in y, so that
 * the second reads it there instead of from global memory again; the same values.
 * pre (NP > 0, or NULL): the weights of the first NP passes, loaded before
 * (norm_w_preload): the same values, read from registers. */
template <bool VOL, bool STAGED = false, int NP = 0>
static __device__ void norm_q8_row(const float *x, int n, int norm, const float *w, float eps,
                                   float *y, uint8_t *yq, float *scratch,
                                   const norm_wpre<NP ? NP : 1> *pre = NULL)
{
    const float sc = norm ? row_rms_scale<VOL, STAGED>(x, n, eps, y, scratch) : 1.0f;
    const int nb = n / 32, gl = threadIdx.x % 8, ng = blockDim.x / 8;
    const int wb = (int)(threadIdx.x % 32) / 8; /* this group's place in its warp */
    int it = 0;
    for (int b = threadIdx.x / 8; b - wb < nb; b += ng, it++) {
        const int act = b < nb, i0 = 32 * b + 4 * gl;
        float wv[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        bool have = false;
        if (NP && pre && pre->ok) {
#pragma unroll
            for (int q = 0; q < (NP ? NP : 1); q++)
                if (q == it) {
                    wv[0] = pre->v[q].x;
                    wv[1] = pre->v[q].y;
                    wv[2] = pre->v[q].z;
                    wv[3] = pre->v[q].w;
                    have = true;
                }
        }
        if (!have && w) {
#pragma unroll
            for (int j = 0; j < 4; j++)
                wv[j] = w[act ? i0 + j : 0];
        }
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float xv = !act ? 0.0f : STAGED && norm ? y[i0 + j] : ldx<VOL>(x, i0 + j);
            v[j] = norm ? xv * sc * wv[j] : xv;
        }
        q8_store4(v, act, gl, b, n, y, yq);
    }
}

/* ---- per-type dot products of one 32-value unit ----
 * A row is cut into units of 32 values (each type's mvq<T> says which values: not always
 * 32 consecutive ones); mvq<T>::xu and mvq<T>::dot below give the sum over unit u of a
 * row's quantised weights times the q8 activations. */

/* n words from a 2-byte aligned address p, read as n + 1 aligned words joined by funnel
 * shifts: no word past the one that holds byte 4 n - 1 + 2 */
template <int N>
static __device__ __forceinline__ void ld_words_a2(const uint8_t *p, uint32_t *w)
{
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uintptr_t)p & 2) * 8;
    uint32_t lo = a[0];
#pragma unroll
    for (int k = 0; k < N; k++) {
        const uint32_t hi = sh || k + 1 < N ? a[k + 1] : 0;
        w[k] = __funnelshift_r(lo, hi, sh);
        lo = hi;
    }
}

/* The sum of 16 int8 values (four words) */
static __device__ __forceinline__ int i8_sum16(int4 v)
{
    const int one = 0x01010101;
    return strata_dp4a(one, v.w, strata_dp4a(one, v.z, strata_dp4a(one, v.y,
                                                                     strata_dp4a(one, v.x, 0))));
}

/* The activation part of a Q6_K unit (mvq<KT_Q6_K>::xu): the 16 activations of each of
 * its two halves, -32 times their sums (the quants enter as 0..63: sum (q - 32) x = sum
 * q x - 32 sum x, the same integer) and their q8 block scales. */
struct mvq_q6k_x {
    int4 xl, xh;
    int sl, sh;
    float dl, dh;
};

/* The sum of one Q6_K unit (mvq<KT_Q6_K> says which values) from its 16 ql bytes q[4]
 * and 16 qh bytes hb[4] as little-endian words, its slice pair p, its two 6-bit-quant
 * scales scl, sch and the block's d: d * (xd_l scl dot_l + xd_h sch dot_h).  The low half
 * takes the low nibbles and qh bits 2p, 2p + 1; the high half the high nibbles and bits
 * 2p + 4, 2p + 5 (ggml's dequantize_row_q6_K).  Every kernel sums a Q6_K unit here. */
static __device__ __forceinline__ float q6k_unit(const uint32_t *q, const uint32_t *hb, int p,
                                                 int scl, int sch, float d,
                                                 const struct mvq_q6k_x &x)
{
    const uint32_t k4 = 0x0F0F0F0F, k2 = 0x30303030;
    const int lsh = 4 - 2 * p, rsh = 2 * p; /* qh's bits of each half to bits 4-5 */
    int dl = x.sl, dh = x.sh;
#define Q6_STEP(k, c)                                                                          \
    dl = strata_dp4a((int)((q[k] & k4) | ((hb[k] << lsh) & k2)), x.xl.c, dl);                  \
    dh = strata_dp4a((int)(((q[k] >> 4) & k4) | ((hb[k] >> rsh) & k2)), x.xh.c, dh);
    Q6_STEP(0, x) Q6_STEP(1, y) Q6_STEP(2, z) Q6_STEP(3, w)
#undef Q6_STEP
    const float a = x.dl * (float)(scl * dl);
    return d * fmaf(x.dh, (float)(sch * dh), a);
}

/* The 6-bit scales and mins of sub-blocks 2g and 2g + 1 of a Q4_K/Q5_K super-block
 * (ggml's get_scale_min_k4, both at once, without branches): w0, w1, w2 are the
 * block's 12 scale bytes as little-endian words.  Pairs are (sub-block 2g) | (2g + 1)
 * << 8. */
static __device__ __forceinline__ void scale_min_pair_k4(int g, uint32_t w0, uint32_t w1,
                                                         uint32_t w2, uint32_t *sc, uint32_t *m)
{
    const int h = 16 * (g & 1);
    const uint32_t a = w0 >> h, b = w1 >> h, c = w2 >> h;
    /* j < 4: bytes j and j + 4, low 6 bits; j >= 4: the low (scale) or high (min)
     * nibble of byte j + 4, bits 4-5 from the top two bits of byte j - 4 (or j) */
    *sc = g < 2 ? a & 0x3F3F : (c & 0x0F0F) | ((a >> 2) & 0x3030);
    *m = g < 2 ? b & 0x3F3F : ((c >> 4) & 0x0F0F) | ((b >> 2) & 0x3030);
}

/* The activation part of a Q4_K/Q5_K unit (mvq<T>::xu below). */
struct mvq_k4_x {
    int4 xl, xh;  /* the 16 activations of each sub-block's half */
    int sl, sh;   /* their sums (the mins' terms) */
    float d0, d1; /* their q8 block scales */
};
/* A Q4_K/Q5_K unit's sum from its integer dot products dl, dh (the two sub-blocks'
 * halves) and the activations' sums: d * (scales) - dmin * (mins); dm the block's d and
 * dmin (an f16 pair), scp and mp scale_min_pair_k4's pairs. */
static __device__ __forceinline__ float k4_unit_sum(uint32_t dm, uint32_t scp, uint32_t mp,
                                                    int dl, int dh, const struct mvq_k4_x &x)
{
    const float2 d = make_float2(strata_h2f((uint16_t)dm), strata_h2f((uint16_t)(dm >> 16)));
    const int sc0 = (int)(scp & 0xFF), sc1 = (int)(scp >> 8);
    const int m0 = (int)(mp & 0xFF), m1 = (int)(mp >> 8);
    return d.x * (x.d0 * (float)(sc0 * dl) + x.d1 * (float)(sc1 * dh)) -
           d.y * (x.d0 * (float)(m0 * x.sl) + x.d1 * (float)(m1 * x.sh));
}

/* Each type's product of one 32-value unit u, in two parts: xu(u, xq, xd) loads what
 * depends on the activations only (their quants, sums and scales), once per unit for
 * every row a lane does; dot(row, u, x) adds the row's weights against it.  The
 * integers and the float operations are the same, in the same order, whichever rows
 * share an xu. */
template <int T> struct mvq;

template <> struct mvq<KT_Q4_K> {
    /* unit u: super-block u / 8, 64-value group g, half h: 16 low nibbles (sub-block
     * 2g) and 16 high nibbles (sub-block 2g + 1) of one 16-byte load */
    typedef struct mvq_k4_x x_t;
    static __device__ __forceinline__ x_t xu(int u, const int8_t *xq, const float *xd)
    {
        x_t x;
        const int g = (u >> 1) & 3, h = u & 1;
        const int8_t *xb = xq + (u >> 3) * 256 + 64 * g + 16 * h;
        x.xl = *(const int4 *)xb;
        x.xh = *(const int4 *)(xb + 32);
        x.sl = i8_sum16(x.xl);
        x.sh = i8_sum16(x.xh);
        const int bi = (u >> 3) * 8 + 2 * g;
        x.d0 = xd[bi];
        x.d1 = xd[bi + 1];
        return x;
    }
    static __device__ __forceinline__ float dot(const uint8_t *row, int u, const x_t &x)
    {
        const uint8_t *b = row + (u >> 3) * 144;
        const int g = (u >> 1) & 3, h = u & 1;
        /* d, dmin and the 12 scale bytes in one load; the 16 quant bytes in another */
        const uint4 hd = *(const uint4 *)b;
        const uint4 q = *(const uint4 *)(b + 16 + 32 * g + 16 * h);
        uint32_t scp, mp;
        scale_min_pair_k4(g, hd.y, hd.z, hd.w, &scp, &mp);
        const int k4 = 0x0F0F0F0F;
        int dl = 0, dh = 0;
        dl = strata_dp4a((int)(q.x & k4), x.xl.x, dl);
        dl = strata_dp4a((int)(q.y & k4), x.xl.y, dl);
        dl = strata_dp4a((int)(q.z & k4), x.xl.z, dl);
        dl = strata_dp4a((int)(q.w & k4), x.xl.w, dl);
        dh = strata_dp4a((int)((q.x >> 4) & k4), x.xh.x, dh);
        dh = strata_dp4a((int)((q.y >> 4) & k4), x.xh.y, dh);
        dh = strata_dp4a((int)((q.z >> 4) & k4), x.xh.z, dh);
        dh = strata_dp4a((int)((q.w >> 4) & k4), x.xh.w, dh);
        return k4_unit_sum(hd.x, scp, mp, dl, dh, x);
    }
};

template <> struct mvq<KT_Q5_K> {
    /* as Q4_K, with the fifth bits of the 16 low and 16 high values from qh */
    typedef mvq<KT_Q4_K>::x_t x_t;
    static __device__ __forceinline__ x_t xu(int u, const int8_t *xq, const float *xd)
    {
        return mvq<KT_Q4_K>::xu(u, xq, xd);
    }
    static __device__ __forceinline__ float dot(const uint8_t *row, int u, const x_t &x)
    {
        const uint8_t *b = row + (u >> 3) * 176;
        const int g = (u >> 1) & 3, h = u & 1;
        const uint4 hd = *(const uint4 *)b;
        const uint4 q = *(const uint4 *)(b + 48 + 32 * g + 16 * h);
        const uint4 qh = *(const uint4 *)(b + 16 + 16 * h);
        uint32_t scp, mp;
        scale_min_pair_k4(g, hd.y, hd.z, hd.w, &scp, &mp);
        const uint32_t k4 = 0x0F0F0F0F, k1 = 0x01010101;
        const int s0 = 2 * g, s1 = 2 * g + 1;
        int dl = 0, dh = 0;
#define Q5_STEP(c)                                                                        \
    dl = strata_dp4a((int)((q.c & k4) | (((qh.c >> s0) & k1) << 4)), x.xl.c, dl);          \
    dh = strata_dp4a((int)(((q.c >> 4) & k4) | (((qh.c >> s1) & k1) << 4)), x.xh.c, dh);
        Q5_STEP(x) Q5_STEP(y) Q5_STEP(z) Q5_STEP(w)
#undef Q5_STEP
        return k4_unit_sum(hd.x, scp, mp, dl, dh, x);
    }
};

template <> struct mvq<KT_Q6_K> {
    /* unit u: super-block u / 8 and b = u % 8 in it: half ip = b / 4, slice pair p = (b /
     * 2) % 2, l-half lh = b % 2.  Its 32 values are 128 ip + 32 p + 16 lh + j and 64
     * further (j = 0..15): the low and the high nibbles of ql[64 ip + 32 p + 16 lh + j]
     * (the 16 bytes at 16 b), bits 2p and 2p + 4 of qh[32 ip + 16 lh + j], scales
     * sc[8 ip + 2 p + lh] and sc[8 ip + 2 p + lh + 4] (ggml's dequantize_row_q6_K).  Each
     * half lies in one q8 block of the activations (4 ip + p, 4 ip + p + 2), and a lane
     * whose units are 8 apart keeps b.  Blocks are 210 bytes: 2-byte aligned only. */
    typedef struct mvq_q6k_x x_t;
    static __device__ __forceinline__ x_t xu(int u, const int8_t *xq, const float *xd)
    {
        x_t x;
        const int b = u & 7, ip = b >> 2, p = (b >> 1) & 1, lh = b & 1;
        const int8_t *xb = xq + (u >> 3) * 256 + 128 * ip + 32 * p + 16 * lh;
        x.xl = *(const int4 *)xb;
        x.xh = *(const int4 *)(xb + 64);
        x.sl = -32 * i8_sum16(x.xl);
        x.sh = -32 * i8_sum16(x.xh);
        const int bi = (u >> 3) * 8 + 4 * ip + p;
        x.dl = xd[bi];
        x.dh = xd[bi + 2];
        return x;
    }
    static __device__ __forceinline__ float dot(const uint8_t *row, int u, const x_t &x)
    {
        const uint8_t *blk = row + (u >> 3) * 210;
        const int b = u & 7, ip = b >> 2, p = (b >> 1) & 1, lh = b & 1;
        uint32_t q[4], hb[4];
        ld_words_a2<4>(blk + 16 * b, q);
        ld_words_a2<4>(blk + 128 + 32 * ip + 16 * lh, hb);
        const uint8_t *sc = blk + 192 + 8 * ip + 2 * p + lh;
        return q6k_unit(q, hb, p, (int)(int8_t)sc[0], (int)(int8_t)sc[4], ldh(blk + 208), x);
    }
};

template <> struct mvq<KT_Q8_0> {
    /* unit u: block u (34 bytes, 2-byte aligned) */
    struct x_t {
        int4 x0, x1;
        float d;
    };
    static __device__ __forceinline__ x_t xu(int u, const int8_t *xq, const float *xd)
    {
        const int4 *xv = (const int4 *)(xq + 32 * u);
        return x_t{xv[0], xv[1], xd[u]};
    }
    static __device__ __forceinline__ float dot(const uint8_t *row, int u, const x_t &x)
    {
        const uint8_t *b = row + u * 34;
        int dt = 0;
        dt = strata_dp4a((int)ld32_a2(b + 2), x.x0.x, dt);
        dt = strata_dp4a((int)ld32_a2(b + 6), x.x0.y, dt);
        dt = strata_dp4a((int)ld32_a2(b + 10), x.x0.z, dt);
        dt = strata_dp4a((int)ld32_a2(b + 14), x.x0.w, dt);
        dt = strata_dp4a((int)ld32_a2(b + 18), x.x1.x, dt);
        dt = strata_dp4a((int)ld32_a2(b + 22), x.x1.y, dt);
        dt = strata_dp4a((int)ld32_a2(b + 26), x.x1.z, dt);
        dt = strata_dp4a((int)ld32_a2(b + 30), x.x1.w, dt);
        return ldh(b) * x.d * (float)dt;
    }
};

/* ---- a lane's part of a row group's sums (mvq_kernel and the fused decode step) ----
 * A row group of tpr lanes owns R rows (row r at byte offset roff[r]); lane gl adds its
 * units gl, gl + tpr, ... in order, then mvq_group_sum adds the lanes by a fixed
 * shuffle tree, so a row's sum depends on tpr only. */

/* A lane's units (or COMBINE's items) come in batches of U: the batch's loads are
 * issued before its sums, which a loop with a run-time bound does not do by itself (each
 * unrolled step waits behind the branch that ends the loop).  A step past the end
 * repeats the batch's first unit, which is in range, and adds nothing, so the sums are
 * those of one unit at a time, in the same order. */
template <int R, bool GLU> static __host__ __device__ constexpr int mvq_batch()
{
    /* GLU: its two 512-thread blocks a multiprocessor leave 64 registers a thread, and a
     * batch of two units decoded slower there (docs/performance.md) */
    return GLU ? 1 : R == 1 ? 4 : 2;
}

/* PLAIN and GLU: rows of w (and of u into acc2 with GLU) against the q8 row xr of nu
 * units (its quants, then its block scales 32 nu bytes in). */
template <int T, int R, bool GLU>
static __device__ __forceinline__ void mvq_lane_sums(const uint8_t *w, const uint8_t *u,
                                                     const size_t *roff, int gl, int tpr,
                                                     int nu, const uint8_t *xr, float *acc,
                                                     float *acc2)
{
    const int8_t *xq = (const int8_t *)xr;
    const float *xd = (const float *)(xr + 32 * nu);
    constexpr int U = mvq_batch<R, GLU>();
    for (int i0 = gl; i0 < nu; i0 += U * tpr) {
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int i = i0 + v * tpr, in = i < nu, iu = in ? i : i0;
            const typename mvq<T>::x_t xv = mvq<T>::xu(iu, xq, xd);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float d = mvq<T>::dot(w + roff[r], iu, xv);
                const float d2 = GLU ? mvq<T>::dot(u + roff[r], iu, xv) : 0.0f;
                if (in) {
                    acc[r] += d;
                    if (GLU)
                        acc2[r] += d2;
                }
            }
        }
    }
}

/* COMBINE: the k experts' rows, each dot weighted by its router weight; part(j, &w, &xr,
 * &cw) gives expert j's matrix, q8 activation row and weight.  Items in batches of U:
 * first every item's part (the experts' ids and weights: loads that the matrices'
 * addresses wait for), then their units, so that a batch of items costs two round
 * trips, not two an item.  (Three items a batch measured the same and took 128
 * registers a thread.) */
template <int T, int R, class PART>
static __device__ __forceinline__ void mvq_lane_sums_k(const size_t *roff, int gl, int tpr,
                                                       int nu, int k, PART part, float *acc)
{
    const int items = k * nu;
    constexpr int U = 2;
    for (int i0 = gl; i0 < items; i0 += U * tpr) {
        const uint8_t *wb[U], *xr[U];
        float cw[U];
        int uu[U];
#pragma unroll
        for (int v = 0; v < U; v++) {
            const int i = i0 + v * tpr, ii = i < items ? i : i0, j = ii / nu;
            uu[v] = ii - j * nu;
            part(j, &wb[v], &xr[v], &cw[v]);
        }
#pragma unroll
        for (int v = 0; v < U; v++) {
            const typename mvq<T>::x_t xv =
                mvq<T>::xu(uu[v], (const int8_t *)xr[v], (const float *)(xr[v] + 32 * nu));
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float d = mvq<T>::dot(wb[v] + roff[r], uu[v], xv);
                if (i0 + v * tpr < items)
                    acc[r] = fmaf(cw[v], d, acc[r]);
            }
        }
    }
}

/* The row's sum: a over the group's tpr lanes, by the fixed shuffle tree. */
static __device__ __forceinline__ float mvq_group_sum(float a, int tpr)
{
    for (int m = tpr / 2; m > 0; m >>= 1)
        a += STRATA_SHFL_XOR(a, m);
    return a;
}

/* mvq_group_sum of two rows at once: lane gl of a tpr-lane group (tpr >= 2) gets row
 * 0's sum (a0 of every lane) when gl < tpr / 2 (hi 0), row 1's (a1) otherwise (hi 1).
 * The tree's first step adds lanes gl and gl ^ tpr / 2, which then hold the same sum of
 * one row, so each half of the group finishes one row: the bits mvq_group_sum gives
 * each row, for half the shuffles. */
static __device__ __forceinline__ float mvq_group_sum2(float a0, float a1, int tpr, int hi)
{
    const int m = tpr / 2;
    float a = (hi ? a1 : a0) + STRATA_SHFL_XOR(hi ? a0 : a1, m);
    for (int k = m / 2; k > 0; k >>= 1)
        a += STRATA_SHFL_XOR(a, k);
    return a;
}

/* Bytes of a q8 row of n values: n int8 quants and n / 32 float scales, padded to 16
 * (strata_k_q8_row_bytes). */
static __host__ __device__ inline size_t mvq_q8_row(int64_t n)
{
    return ((size_t)n + (size_t)n / 8 + 15) & ~(size_t)15;
}

#endif
