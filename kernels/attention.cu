/* attention.cu - causal GQA attention over the f16 kv cache, for decode (split-K over
 * the kv positions, merged by a second kernel) and prefill (tiles of query rows).
 *
 * A block takes 32 query rows of one kv head: (token, query head) pairs of the heads
 * that share the kv head, so GQA reads each key and value once per tile.  Keys and
 * values stream through shared memory 32 positions at a time with an online softmax
 * (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022).  Eight threads own a
 * row: each scores 4 keys of a tile and accumulates hd / 8 output dimensions. */
#include "kernels.h"

#include <math.h>

#define ATT_ROWS 32
#define ATT_KEYS 32
#define ATT_HD 128
#define ATT_THREADS (ATT_ROWS * 8)

__global__ void __launch_bounds__(ATT_THREADS)
attn_kernel(struct strata_k_attn_args a)
{
    __shared__ float qs[ATT_ROWS][ATT_HD + 2];
    __shared__ __half ks[ATT_KEYS][ATT_HD + 2];
    __shared__ __half vs[ATT_KEYS][ATT_HD + 2];
    __shared__ float ps[ATT_ROWS][ATT_KEYS + 1];

    const int hd = a.hd, n_gqa = a.n_head / a.n_head_kv, g = blockIdx.y;
    const int n_rows = a.n_tok * n_gqa, row0 = blockIdx.x * ATT_ROWS;
    const int tid = threadIdx.x, r = tid / 8, c8 = tid % 8;
    const int p0 = *a.pos0;
    const int row = row0 + r, valid = row < n_rows;
    const int t = valid ? row / n_gqa : 0, h = g * n_gqa + (valid ? row % n_gqa : 0);
    const int qpos = p0 + t;
    int t_last = (min(row0 + ATT_ROWS, n_rows) - 1) / n_gqa;
    int kv_hi = p0 + t_last + 1;
    int chunk = ((kv_hi + a.n_split - 1) / a.n_split + ATT_KEYS - 1) / ATT_KEYS * ATT_KEYS;
    int lo = blockIdx.z * chunk, hi = min(kv_hi, lo + chunk);
    const int64_t kv_row = (int64_t)a.n_head_kv * hd;

    for (int i = tid; i < ATT_ROWS * hd; i += ATT_THREADS) {
        int rr = i / hd, d = i % hd, ro = row0 + rr;
        float v = 0.0f;
        if (ro < n_rows) {
            int tt = ro / n_gqa, hh = g * n_gqa + ro % n_gqa;
            v = a.q[tt * a.q_stride + (int64_t)hh * hd + d] * a.scale;
        }
        qs[rr][d] = v;
    }

    float m = -INFINITY, l = 0.0f, o[ATT_HD / 8];
#pragma unroll
    for (int j = 0; j < ATT_HD / 8; j++)
        o[j] = 0.0f;

    for (int j0 = lo; j0 < hi; j0 += ATT_KEYS) {
        __syncthreads();
        for (int i = tid; i < ATT_KEYS * hd; i += ATT_THREADS) {
            int j = i / hd, d = i % hd;
            __half kv = __float2half(0.0f), vv = kv;
            if (j0 + j < hi) {
                kv = a.k_cache[(j0 + j) * kv_row + (int64_t)g * hd + d];
                vv = a.v_cache[(j0 + j) * kv_row + (int64_t)g * hd + d];
            }
            ks[j][d] = kv;
            vs[j][d] = vv;
        }
        __syncthreads();
        float s[4], mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            int j = c8 + 8 * jj, kp = j0 + j;
            float acc = 0.0f;
            for (int d = 0; d < hd; d++)
                acc = fmaf(qs[r][d], __half2float(ks[j][d]), acc);
            s[jj] = (valid && kp < hi && kp <= qpos) ? acc : -INFINITY;
            mt = fmaxf(mt, s[jj]);
        }
        /* the 8 threads of a row are 8 aligned lanes of one warp/wavefront */
        mt = fmaxf(mt, STRATA_SHFL_XOR(mt, 1));
        mt = fmaxf(mt, STRATA_SHFL_XOR(mt, 2));
        mt = fmaxf(mt, STRATA_SHFL_XOR(mt, 4));
        float mn = fmaxf(m, mt);
        float corr = mn == -INFINITY ? 1.0f : __expf(m - mn);
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
        __syncthreads();
#pragma unroll
        for (int jd = 0; jd < ATT_HD / 8; jd++)
            o[jd] *= corr;
        for (int j = 0; j < ATT_KEYS; j++) {
            float p = ps[r][j];
#pragma unroll
            for (int jd = 0; jd < ATT_HD / 8; jd++) {
                int d = c8 + 8 * jd;
                if (d < hd)
                    o[jd] = fmaf(p, __half2float(vs[j][d]), o[jd]);
            }
        }
    }
    if (!valid)
        return;
    int64_t orow = (int64_t)t * a.n_head + h;
    if (a.n_split == 1) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int jd = 0; jd < ATT_HD / 8; jd++) {
            int d = c8 + 8 * jd;
            if (d < hd)
                a.out[orow * hd + d] = o[jd] * inv;
        }
        return;
    }
    /* partial result of this split: [n_split][n_tok * n_head][hd + 2] */
    float *sp = a.scratch + ((int64_t)blockIdx.z * a.n_tok * a.n_head + orow) * (hd + 2);
#pragma unroll
    for (int jd = 0; jd < ATT_HD / 8; jd++) {
        int d = c8 + 8 * jd;
        if (d < hd)
            sp[d] = o[jd];
    }
    if (c8 == 0) {
        sp[hd] = m;
        sp[hd + 1] = l;
    }
}

/* Merge the splits of one output row (fixed order over splits). */
__global__ void attn_merge_kernel(const float *__restrict__ scratch, float *__restrict__ out,
                                  int n_rows, int hd, int n_split)
{
    int orow = blockIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++)
        mx = fmaxf(mx, scratch[((int64_t)s * n_rows + orow) * (hd + 2) + hd]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float *sp = scratch + ((int64_t)s * n_rows + orow) * (hd + 2);
        if (sp[hd] != -INFINITY)
            L += sp[hd + 1] * __expf(sp[hd] - mx);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float *sp = scratch + ((int64_t)s * n_rows + orow) * (hd + 2);
            if (sp[hd] != -INFINITY)
                acc += sp[d] * __expf(sp[hd] - mx);
        }
        out[(int64_t)orow * hd + d] = L > 0.0f ? acc / L : 0.0f;
    }
}

size_t strata_k_attn_scratch_bytes(int n_tok, int n_head, int hd, int n_split)
{
    return n_split > 1 ? sizeof(float) * (size_t)n_split * n_tok * n_head * (hd + 2) : 0;
}

int strata_k_attention(struct strata_gpu_ctx *ctx, const struct strata_k_attn_args *a,
                       struct strata_err *err)
{
    if (a->n_tok <= 0 || a->n_head <= 0 || a->n_head_kv <= 0 || a->n_head % a->n_head_kv ||
        a->hd <= 0 || a->hd > ATT_HD || a->n_split < 1 || a->max_kv < a->n_tok ||
        (a->n_split > 1 && !a->scratch))
        return strata_k_err(err, STRATA_E_INVALID,
                            "attention: bad shape n_tok=%d n_head=%d n_head_kv=%d hd=%d "
                            "n_split=%d max_kv=%d (hd <= %d)",
                            a->n_tok, a->n_head, a->n_head_kv, a->hd, a->n_split, a->max_kv,
                            ATT_HD);
    int n_rows = a->n_tok * (a->n_head / a->n_head_kv);
    dim3 grid((unsigned)((n_rows + ATT_ROWS - 1) / ATT_ROWS), (unsigned)a->n_head_kv,
              (unsigned)a->n_split),
        block(ATT_THREADS);
    attn_kernel<<<grid, block, 0, ctx->stream>>>(*a);
    int rc = strata_k_check(ctx, "attn_kernel", grid, block, err,
                            "n_tok=%d n_head=%d n_head_kv=%d hd=%d n_split=%d max_kv=%d",
                            a->n_tok, a->n_head, a->n_head_kv, a->hd, a->n_split, a->max_kv);
    if (rc || a->n_split == 1)
        return rc;
    dim3 g2((unsigned)(a->n_tok * a->n_head)), b2(128);
    attn_merge_kernel<<<g2, b2, 0, ctx->stream>>>(a->scratch, a->out, a->n_tok * a->n_head,
                                                  a->hd, a->n_split);
    return strata_k_check(ctx, "attn_merge_kernel", g2, b2, err, "rows=%d hd=%d n_split=%d",
                          a->n_tok * a->n_head, a->hd, a->n_split);
}
