/* matvec_q8.cu - decode mat-vec products on 8-bit activations: the activation row is
 * quantised once per token (fused with the RMSNorm that precedes it), and each weight
 * type has its own dot product of a 32-value unit: one wide load of quants, scales
 * decoded once per unit, integer dot products (dp4a) against the int8 activations.
 * The scheme is that of llama.cpp's MMVQ kernels (ggml-cuda/mmvq.cu, vecdotq.cuh);
 * block layouts are those of the GGUF specification (ggml-common.h).
 *
 * A row group of tpr lanes (a power of two <= 32, inside one warp/wavefront) owns R
 * output rows: lane l sums units l, l + tpr, ... in order, then the group reduces with
 * a fixed shuffle tree.  tpr and R follow from ne0, ne1 and k only, so the result of
 * a row never depends on the number of slots in the launch. */
#include "kernels.h"

#include "moe.cuh"
#include "mvq.cuh"
#include "rope.cuh"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MVQ_THREADS 128 /* threads of a PLAIN/COMBINE block */
#define MVQ_QROWS 32    /* rows of a GLU block: one q8 block of the output */
/* shared bytes of a staged PLAIN block (the q8 activation row and the block's weight
 * rows, copied with coalesced 16-byte loads before the dot products read them) */
#define MVQ_STAGE_BYTES 16384

size_t strata_k_q8_row_bytes(int64_t n)
{
    return mvq_q8_row(n);
}

__global__ void quantize_q8_kernel(const float *x, int64_t x_stride, int n, int norm,
                                   const float *__restrict__ w, float eps, float *y,
                                   uint8_t *yq, size_t yq_row)
{
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    /* the norm weights do not depend on the kernel before: on their way meanwhile */
    if (norm && w)
        for (int i = 32 * threadIdx.x; i < n; i += 32 * blockDim.x)
            strata_prefetch_l2(w + i);
    strata_pdl_wait();
    strata_pdl_trigger();
    norm_q8_row<false>(x + (int64_t)blockIdx.x * x_stride, n, norm, w, eps,
                       y ? y + (int64_t)blockIdx.x * n : NULL, yq + blockIdx.x * yq_row, scratch);
}

int strata_k_quantize_q8(struct strata_gpu_ctx *ctx, const float *x, int64_t x_stride, int n,
                         int n_rows, int norm, const float *w, float eps, float *y, void *yq,
                         struct strata_err *err)
{
    if (n <= 0 || n % 32 || n_rows <= 0 || x_stride < n)
        return strata_k_err(err, STRATA_E_INVALID,
                            "quantize_q8: bad shape n=%d n_rows=%d x_stride=%lld (n %% 32 == 0)",
                            n, n_rows, (long long)x_stride);
    if ((uintptr_t)yq & 15 || (uintptr_t)y & 15)
        return strata_k_err(err, STRATA_E_INVALID, "quantize_q8: output not 16-byte aligned");
    dim3 grid((unsigned)n_rows), block(STRATA_GPU_BLOCK);
    strata_k_launch(ctx, quantize_q8_kernel, grid, block, x, x_stride, n, norm, w, eps, y,
                    (uint8_t *)yq, strata_k_q8_row_bytes(n));
    return strata_k_check(ctx, "quantize_q8_kernel", grid, block, err, "n=%d n_rows=%d norm=%d",
                          n, n_rows, norm);
}

struct mvq_params {
    const uint8_t *w, *u;
    size_t nb1, nb2;
    int ne1, nu, tpr;
    const int32_t *ids;
    const uint8_t *const *tab; /* strata_k_mvq_args.etab, or NULL */
    int tab_w;                 /* the part w is: 0 gate (GLU), 2 down (COMBINE) */
    int tab_slot;              /* strata_k_mvq_args.etab_slot */
    int x_group, k;
    const float *cw;
    const uint8_t *xq;
    size_t xq_row; /* bytes between q8 rows; the scales start ne0 bytes into a row */
    float *y;
    int64_t y_stride;
    const float *add;
    uint8_t *yq;
    size_t yq_row;
    /* the RMSNorm of the output rows by the last block of each token (PLAIN, COMBINE) */
    const float *nw;
    float eps;
    float *ny;
    uint8_t *nyq;
    int *counter;
    /* the input RMSNorm of a streamed launch (strata_k_mvq_args.x_in, .in_norm) */
    const float *xin, *inw;
    float ineps;
    float *iny;
    uint8_t *inyq;
    /* ahead != 0: a PLAIN launch without ids asks L2 for its own rows before the PDL
     * wait (a streamed one for its second chunk) */
    int ahead;
    /* strata_k_mvq_args.y16 (NULL: none) */
    __half *y16;
    const int32_t *y16_pos;
    int64_t y16_stride;
    /* strata_k_mvq_args.argmax_key (NULL: none; one slot) */
    unsigned long long *amax;
    /* strata_k_mvq_args.y_host (NULL: none; one slot, streamed launches) */
    float *yh;
    /* a streamed launch's second weight (strata_k_mvq_args.w2): rows after w's */
    const uint8_t *w2;
    size_t nb1_2;
    int ne1_2, w2_type;
    /* a streamed launch's qkv_post (strata_k_mvq_args.post; post_cnt NULL: none) */
    int *post_cnt;
    struct strata_k_qkv_args post;
    struct strata_k_rope rope;
    /* a streamed launch's chunks copied by the bulk copy engine (STRATA_GPU_BULK device
     * passes): every chunk's bytes a multiple of 16 from a 16-byte aligned address */
    int bulk;
    /* GLU: the token's routing in every block (strata_k_mvq_args.route_logits; NULL:
     * none), its ids and weights stored by block 0 to rt_ids and rt_w */
    const float *rt_logits;
    int rt_n, rt_k, rt_norm;
    float rt_scale;
    int32_t *rt_ids;
    float *rt_w;
    /* strata_k_mvq_args.next_l2 (mvq_kernel) */
    const uint8_t *nl2[2];
    size_t nl2_bytes[2];
};

/* Output value v of slot s, row r: y16's copy (mvq_params.y16) */
static __device__ __forceinline__ void mvq_store16(const struct mvq_params &p, int s, int r,
                                                   float v)
{
    if (p.y16)
        p.y16[(int64_t)(*p.y16_pos + s) * p.y16_stride + r] = __float2half(v);
}

/* MODE: STRATA_K_MVQ_*; R rows per row group (GLU blocks of 512 threads: two a
 * multiprocessor, at most 64 registers a thread, or the 8 experts' blocks run in two
 * waves).  STAGE (PLAIN only): the activation row
 * and the block's weight rows are first copied to shared memory with 16-byte loads
 * (rows 16-byte aligned, xq_row + rows * nb1 <= MVQ_STAGE_BYTES), so that the dot
 * products' narrow, 2-byte aligned reads (Q6_K, Q8_0) stay out of the L1/global path;
 * the sums are the same, in the same order. */
template <int T, int MODE, int R, int STAGE = 0>
__global__ void __launch_bounds__(512, MODE == STRATA_K_MVQ_GLU ? 2 : 1)
    mvq_kernel(struct mvq_params p)
{
    const int tpr = p.tpr, gl = threadIdx.x % tpr;
    const int grp = threadIdx.x / tpr, groups = blockDim.x / tpr;
    const int r0 = (blockIdx.x * groups + grp) * R;
    const int s = blockIdx.y;
    /* fixed weights do not depend on the kernel before: this block's rows on their way
     * to L2 meanwhile (once, for every slot) */
    if (MODE == STRATA_K_MVQ_PLAIN && p.ahead && !p.ids && s == 0) {
        const int rb = blockIdx.x * groups * R;
        strata_prefetch_l2_bytes(p.w + (size_t)rb * p.nb1,
                                 (size_t)min(groups * R, p.ne1 - rb) * p.nb1, threadIdx.x,
                                 blockDim.x);
    }
    /* a later launch's weights, spread over the grid's threads (PLAIN and COMBINE: GLU
     * keeps its registers for its own loads) */
    for (int i = 0; i < 2 && MODE != STRATA_K_MVQ_GLU; i++)
        if (p.nl2[i])
            strata_prefetch_l2_bytes(
                p.nl2[i], p.nl2_bytes[i],
                ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x,
                (size_t)gridDim.x * gridDim.y * blockDim.x);
    strata_pdl_wait();
    strata_pdl_trigger();
    const int32_t *ids = p.ids;
    if (MODE == STRATA_K_MVQ_GLU && p.rt_logits) {
        /* the token's routing (one warp), the ids then read from shared memory */
        __shared__ float rt_p[MODE == STRATA_K_MVQ_GLU ? ROUTE_MAX_EXPERT : 1];
        __shared__ int32_t rt_i[32];
        __shared__ float rt_w[32];
        if (threadIdx.x < warpSize) {
            route_load_warp(p.rt_logits, p.rt_n, rt_p);
            strata_tl_mark(18, blockIdx.x == 0);
            route_warp(rt_p, p.rt_n, p.rt_k, p.rt_norm, p.rt_scale, rt_i, rt_w);
            if (blockIdx.x == 0 && blockIdx.y == 0 && (int)threadIdx.x < p.rt_k) {
                p.rt_ids[threadIdx.x] = rt_i[threadIdx.x];
                p.rt_w[threadIdx.x] = rt_w[threadIdx.x];
            }
        }
        __syncthreads();
        strata_tl_mark(17, blockIdx.x == 0);
        ids = rt_i;
    }
    /* the slot's expert (PLAIN and GLU with ids) */
    const int eid = MODE != STRATA_K_MVQ_COMBINE && ids ? ids[s] : 0;
    /* rows past ne1 re-read the last row (in bounds) and are not written: every lane
     * must reach the shuffles */
    size_t roff[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        roff[r] = (size_t)min(r0 + r, p.ne1 - 1) * p.nb1;
    __shared__ __align__(16) uint8_t stage[STAGE ? MVQ_STAGE_BYTES : 16];
    if (STAGE) {
        const int nx = (int)(p.xq_row / 16), nr = (int)(p.nb1 / 16), rows = groups * R;
        const uint4 *gx = (const uint4 *)(p.xq + (size_t)(s / p.x_group) * p.xq_row);
        const size_t base = p.ids ? (size_t)p.ids[s] * p.nb2 : 0;
        const int rb = blockIdx.x * rows;
        uint4 *sh = (uint4 *)stage;
        for (int i = threadIdx.x; i < nx + rows * nr; i += blockDim.x) {
            if (i < nx) {
                sh[i] = gx[i];
            } else {
                int j = i - nx, sr = j / nr;
                const uint4 *gw = (const uint4 *)(p.w + base +
                                                  (size_t)min(rb + sr, p.ne1 - 1) * p.nb1);
                sh[i] = gw[j - sr * nr];
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < R; r++)
            roff[r] = (size_t)(grp * R + r) * p.nb1;
    }
    /* the residual each row adds, asked for before the dot products so that its round
     * trip is not the launch's last one */
    float addv[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        addv[r] = MODE != STRATA_K_MVQ_GLU && p.add && r0 + r < p.ne1
                      ? p.add[(int64_t)s * p.y_stride + r0 + r]
                      : 0.0f;
    float acc[R], acc2[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = acc2[r] = 0.0f;
    if (MODE == STRATA_K_MVQ_COMBINE) {
        mvq_lane_sums_k<T, R>(
            roff, gl, tpr, p.nu, p.k,
            [&](int j, const uint8_t **wb, const uint8_t **xr, float *cw) {
                const int sl = s * p.k + j;
                *wb = p.tab ? p.tab[3 * (size_t)(p.tab_slot ? sl : p.ids[sl]) + 2]
                            : p.w + (size_t)p.ids[sl] * p.nb2;
                *xr = p.xq + (size_t)(sl / p.x_group) * p.xq_row;
                *cw = p.cw[sl];
            },
            acc);
    } else {
        const uint8_t *xr = STAGE ? stage : p.xq + (size_t)(s / p.x_group) * p.xq_row;
        const uint8_t *wr, *ur = NULL;
        if (!STAGE && p.tab) {
            const size_t e3 = 3 * (size_t)(p.tab_slot ? s : eid);
            wr = p.tab[e3 + p.tab_w];
            if (MODE == STRATA_K_MVQ_GLU)
                ur = p.tab[e3 + 1];
        } else {
            const size_t base = STAGE ? 0 : (size_t)eid * p.nb2;
            wr = (STAGE ? stage + p.xq_row : p.w) + base;
            if (MODE == STRATA_K_MVQ_GLU)
                ur = p.u + base;
        }
        mvq_lane_sums<T, R, MODE == STRATA_K_MVQ_GLU>(wr, ur, roff, gl, tpr, p.nu, xr, acc,
                                                        acc2);
    }
    strata_tl_mark(14 + MODE, blockIdx.x == 0);
    /* two sums in one shuffle tree (mvq_group_sum2, the same bits): GLU a row's gate and
     * up sums, which every lane then gets; the others two rows, stored by lanes 0 and
     * tpr / 2 */
    const int hi = gl >= tpr / 2;
    float out[R];
    if (MODE == STRATA_K_MVQ_GLU || R % 2) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            float a, b = 0.0f;
            if (MODE == STRATA_K_MVQ_GLU) {
                const float h = mvq_group_sum2(acc[r], acc2[r], tpr, hi);
                const float o2 = STRATA_SHFL_XOR(h, tpr / 2);
                a = hi ? o2 : h;
                b = hi ? h : o2;
            } else {
                a = mvq_group_sum(acc[r], tpr);
            }
            int64_t o = (int64_t)s * p.y_stride + r0 + r;
            if (MODE == STRATA_K_MVQ_GLU)
                out[r] = a / (1.0f + expf(-a)) * b;
            else
                out[r] = addv[r] + a;
            if (gl == 0 && r0 + r < p.ne1 && p.y) {
                p.y[o] = out[r];
                if (MODE == STRATA_K_MVQ_PLAIN)
                    mvq_store16(p, s, r0 + r, out[r]);
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r += 2) {
            const int rr = r0 + r + hi;
            const float v = (hi ? addv[r + 1] : addv[r]) +
                            mvq_group_sum2(acc[r], acc[r + 1], tpr, hi);
            if (gl == hi * (tpr / 2) && rr < p.ne1 && p.y) {
                p.y[(int64_t)s * p.y_stride + rr] = v;
                if (MODE == STRATA_K_MVQ_PLAIN)
                    mvq_store16(p, s, rr, v);
            }
        }
    }
    if (MODE == STRATA_K_MVQ_GLU && p.yq) {
        /* the block's 32 rows are one q8 block of the slot's output row */
        __shared__ float vb[MVQ_QROWS];
        if (gl == 0) {
#pragma unroll
            for (int r = 0; r < R; r++)
                vb[grp * R + r] = out[r];
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            float d;
            int q = q8_quant(vb[threadIdx.x], &d);
            uint8_t *yr = p.yq + (size_t)s * p.yq_row;
            int rb = blockIdx.x * MVQ_QROWS;
            ((int8_t *)yr)[rb + threadIdx.x] = (int8_t)q;
            if (threadIdx.x == 0)
                ((float *)(yr + p.ne1))[rb / 32] = d;
        }
    }
    if (MODE != STRATA_K_MVQ_GLU && p.counter) {
        /* the last block done with token s normalises its row (threadFenceReduction
         * pattern: each block's writes are fenced before it is counted) */
        __shared__ int last;
        __shared__ float scratch[STRATA_GPU_MAX_WARP];
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            last = atomicAdd(&p.counter[s], 1) == (int)gridDim.x - 1;
        __syncthreads();
        if (last) {
            __threadfence();
            norm_q8_row<true>(p.y + (int64_t)s * p.y_stride, p.ne1, 1, p.nw, p.eps,
                              p.ny ? p.ny + (int64_t)s * p.ne1 : NULL,
                              p.nyq + (size_t)s * p.yq_row, scratch);
            if (threadIdx.x == 0)
                p.counter[s] = 0;
        }
    }
    strata_tl_mark(8 + 2 * MODE, blockIdx.x == 0);
    strata_tl_mark(9 + 2 * MODE, true);
}

/* ---- large PLAIN products (the output projection): weights streamed through shared
 * memory ----
 * A fixed grid (a few blocks per multiprocessor) walks the matrix in chunks of
 * rows = groups * 2 rows: the chunk's bytes (contiguous) are copied to shared memory
 * with 16-byte cp.async while the block computes the chunk before (two buffers), and
 * the first chunk's copy is issued before the PDL wait, since weights do not depend on
 * the kernel before.  Every slot of the launch (a verify window's tokens) is computed
 * from the same copy, so the matrix crosses memory once per launch instead of once per
 * slot.  A row's sum is mvq_kernel's with the same tpr (lane gl adds units gl, gl +
 * tpr, ... in order, then the shuffle tree, then add): the same bits. */
#define MVQ_STREAM_CHUNK_MAX 32768 /* bytes of one chunk buffer */

/* chunk c's bytes [c * ck, min((c + 1) * ck, total)) into dst; total % 2 == 0, ck % 16 ==
 * 0; a last piece under 16 bytes by 2-byte loads */
static __device__ __forceinline__ void mvq_chunk_copy(uint8_t *dst, const uint8_t *w, int c,
                                                      size_t ck, size_t total)
{
    const size_t off = (size_t)c * ck;
    /* a chunk is at most MVQ_STREAM_CHUNK_MAX bytes: 32-bit counts, and each thread's
     * addresses advance by a constant step (the loop's few instructions a piece matter:
     * the output projection is bound by its instruction rate) */
    const unsigned len = (unsigned)min(ck, total - off), n16 = len / 16, step = 16 * blockDim.x;
    const uint8_t *src = w + off + 16 * threadIdx.x;
    uint8_t *d = dst + 16 * threadIdx.x;
    for (unsigned i = threadIdx.x; i < n16; i += blockDim.x, src += step, d += step)
        strata_cp_async16(d, src, 16);
    for (unsigned i = 16 * n16 + 2 * threadIdx.x; i < len; i += 2 * blockDim.x)
        *(uint16_t *)(dst + i) = *(const uint16_t *)(w + off + i);
}

/* Q6_K rows in a stream buffer, 32 lanes a row: mvq<KT_Q6_K>::dot's sums for units u = gl
 * + 32 k, with the row's bytes read as aligned 32-bit words of shared memory.  A lane's
 * units keep their place b in the super-block, and super-block u / 8 advances by 4 (840
 * bytes) a step, so every word a unit needs is at a constant offset from the block's
 * first word and off by the same two bytes (sh) for all of them: one funnel shift a
 * word (and a constant byte of a word for the two scales), no pointer arithmetic.  Same
 * integers, same float operations in the same order as the generic dot (q6k_unit): the
 * same bits.  Reads up to 2 bytes past a row's last block (the buffers are padded). */
template <int R>
static __device__ __forceinline__ void q6k_sums_words(const uint8_t *buf, const size_t *roff,
                                                      int gl, int nu, const uint8_t *xr,
                                                      float *acc)
{
    const int8_t *xq = (const int8_t *)xr;
    const float *xd = (const float *)(xr + 32 * nu);
    const uint32_t *W = (const uint32_t *)buf;
    const int b = gl & 7, ip = b >> 2, p = (b >> 1) & 1, lh = b & 1;
    const int qo = 4 * b, ho = 32 + 8 * ip + 4 * lh; /* words of ql's and qh's 16 bytes */
    int wb[R], sh[R], so[R], sb[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int off = (int)roff[r] + (gl >> 3) * 210;
        /* the first scale's byte past word 48 + 2 ip of the block */
        const int t = (off & 2) + 2 * p + lh;
        wb[r] = off >> 2;
        sh[r] = (off & 2) * 8;
        so[r] = 48 + 2 * ip + (t >> 2);
        sb[r] = 8 * (t & 3);
    }
    for (int u = gl; u < nu; u += 32) {
        const mvq<KT_Q6_K>::x_t x = mvq<KT_Q6_K>::xu(u, xq, xd);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t *w = W + wb[r];
            const int h = sh[r];
            uint32_t q[4], hb[4];
            uint32_t ql = w[qo], hl = w[ho];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t qn = w[qo + k + 1], hn = w[ho + k + 1];
                q[k] = __funnelshift_r(ql, qn, h);
                hb[k] = __funnelshift_r(hl, hn, h);
                ql = qn;
                hl = hn;
            }
            /* the two scales are 4 bytes apart: the same byte of two words */
            const int scl = (int)(int8_t)(w[so[r]] >> sb[r]);
            const int sch = (int)(int8_t)(w[so[r] + 1] >> sb[r]);
            /* d: bytes 208-209 of the block: the low half of word 52, or its high half
             * when the block starts two bytes into a word */
            const uint32_t dw = w[52] >> h;
            const float d = __half2float(__ushort_as_half((unsigned short)(dw & 0xffff)));
            acc[r] += q6k_unit(q, hb, p, scl, sch, d, x);
            wb[r] += 210;
        }
    }
}

/* Heads a streamed chunk's rows may touch, at most (strata_k_mvq_args.post) */
#define MVQ_POST_HEADS 8

/* After a streamed chunk's rows ra .. rb - 1 are stored (every slot): count them towards
 * their heads (mvq_params.post_cnt), and the block that completes a head runs
 * qkv_post_head on it for every slot, groups of qkv_post_threads(hd) threads taking the
 * (head, slot) pairs in turn (threadFenceReduction pattern: every thread's stores are
 * fenced before the block is counted); it then zeroes the head's counter.  Called by
 * every thread of the block. */
static __device__ __forceinline__ void mvq_post_chunk(const struct mvq_params &p, int ra, int rb,
                                                   int n_slot)
{
    __shared__ int heads[MVQ_POST_HEADS], n_done;
    __shared__ float scratch[STRATA_GPU_MAX_WARP];
    const int hd = p.post.hd;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int nd = 0;
        for (int h = ra / hd; h * hd < rb; h++) { /* at most MVQ_POST_HEADS (the launcher) */
            const int n = min(rb, (h + 1) * hd) - max(ra, h * hd);
            if (atomicAdd(&p.post_cnt[h], n) + n == hd)
                heads[nd++] = h;
        }
        n_done = nd;
    }
    __syncthreads();
    const int nd = n_done;
    if (nd == 0)
        return;
    __threadfence();
    const int gthr = qkv_post_threads(hd), gpb = blockDim.x / gthr;
    const int grp = threadIdx.x / gthr, items = nd * n_slot;
    for (int i0 = 0; i0 < items; i0 += gpb) {
        const int it = i0 + grp, act = grp < gpb && it < items;
        qkv_post_head(p.post, p.rope, act ? heads[it % nd] : 0, act ? it / nd : 0,
                      threadIdx.x % gthr, act,
                      [&](float v) { return qkv_group_sum(v, scratch, gthr); });
    }
    __syncthreads();
    if ((int)threadIdx.x < nd)
        p.post_cnt[heads[threadIdx.x]] = 0;
}

/* The rows of a streamed launch's chunk c: w's chunks first, then those of the second
 * weight (mvq_params.w2, T2 != 0), whose rows follow w's in the output (columns ne1 ..
 * ne1 + ne1_2 - 1). */
struct mvq_chunk_of {
    const uint8_t *w;
    size_t total, ck; /* the weight's bytes, a chunk's bytes */
    int c, col0, ne1; /* chunk index in the weight, its first output column, rows */
    int second;
};

template <int T2>
static __device__ __forceinline__ struct mvq_chunk_of mvq_chunk_at(const struct mvq_params &p,
                                                                   int c, int n1, size_t ck,
                                                                   size_t ck2)
{
    struct mvq_chunk_of q;
    q.second = T2 != 0 && c >= n1;
    q.w = q.second ? p.w2 : p.w;
    q.total = q.second ? (size_t)p.ne1_2 * p.nb1_2 : (size_t)p.ne1 * p.nb1;
    q.ck = q.second ? ck2 : ck;
    q.c = q.second ? c - n1 : c;
    q.col0 = q.second ? p.ne1 : 0;
    q.ne1 = q.second ? p.ne1_2 : p.ne1;
    return q;
}

/* Chunk c into dst by the bulk copy engine, its arrival on bar (one thread) */
template <int T2>
static __device__ __forceinline__ void mvq_chunk_bulk(const struct mvq_params &p, int c, int n1,
                                                      size_t ck, size_t ck2, uint8_t *dst,
                                                      uint64_t *bar)
{
    const struct mvq_chunk_of q = mvq_chunk_at<T2>(p, c, n1, ck, ck2);
    const size_t off = (size_t)q.c * q.ck;
    strata_bulk_copy(dst, q.w + off, (unsigned)min(q.ck, q.total - off), bar);
}

/* The q8 dot products of a lane's units for the RG rows roff of a chunk of type T in wb */
template <int T, int TPR, int RG>
static __device__ __forceinline__ void mvq_stream_sums(const uint8_t *wb, const size_t *roff,
                                                       int gl, int tpr, int nu,
                                                       const uint8_t *xr, float *acc)
{
    float acc2[RG];
    if (T == KT_Q6_K && TPR == 32)
        q6k_sums_words<RG>(wb, roff, gl, nu, xr, acc);
    else
        mvq_lane_sums<T, RG, false>(wb, NULL, roff, gl, tpr, nu, xr, acc, acc2);
}

/* T2: the type of a second weight whose rows follow w's (mvq_params.w2), 0 for none;
 * n_chunk counts both weights' chunks (n1 of them w's), ck / ck2 their chunk bytes, cb
 * a buffer's bytes (the larger, padded) */
template <int T, int TPR, bool NORM, int T2 = 0, int RG = 2>
__global__ void __launch_bounds__(256, RG == 2 ? 4 : 2) mvq_stream_kernel(struct mvq_params p, int n_slot,
                                                            int n_chunk, int n1, size_t ck,
                                                            size_t ck2, size_t cb)
{
    /* NORM: the slots' q8 rows first (n_slot * xq_row bytes), then the two buffers */
    extern __shared__ __align__(16) uint8_t mvq_smem[];
    uint8_t *mvq_sbuf = mvq_smem + (NORM ? (size_t)n_slot * p.xq_row : 0);
    /* TPR (32, the output projection's) known when compiling: a lane's units then keep
     * their place in the super-block, and their offsets reduce to constants */
    const int tpr = TPR ? TPR : p.tpr, gl = threadIdx.x % tpr, grp = threadIdx.x / tpr;
    const int rows = (int)(blockDim.x / tpr) * RG;
    int c = blockIdx.x, buf = 0;
    unsigned long long best = 0; /* the argmax key of this thread's rows (p.amax) */
    /* p.yh: a chunk's rows gathered after the two buffers, then stored together */
    float *yh_s = (float *)(mvq_sbuf + 2 * cb);
    /* p.bulk: one thread asks the bulk copy engine for each chunk, and every thread waits
     * on the buffer's barrier (mbar) instead of copying 16 bytes at a time */
    const bool bulk = STRATA_GPU_BULK && p.bulk;
    __shared__ uint64_t mbar[2];
    if (bulk) {
        if (threadIdx.x == 0) {
            strata_mbar_init(&mbar[0], 1);
            strata_mbar_init(&mbar[1], 1);
            if (c < n_chunk)
                mvq_chunk_bulk<T2>(p, c, n1, ck, ck2, mvq_sbuf, &mbar[0]);
        }
        __syncthreads();
    } else if (c < n_chunk) {
        const struct mvq_chunk_of q = mvq_chunk_at<T2>(p, c, n1, ck, ck2);
        mvq_chunk_copy(mvq_sbuf, q.w, q.c, q.ck, q.total);
    }
    strata_cp_async_commit();
    if (p.ahead && c + (int)gridDim.x < n_chunk) { /* the second chunk to L2 meanwhile */
        const struct mvq_chunk_of q = mvq_chunk_at<T2>(p, c + gridDim.x, n1, ck, ck2);
        strata_prefetch_l2_bytes(q.w + (size_t)q.c * q.ck, min(q.ck, q.total - (size_t)q.c * q.ck),
                                 threadIdx.x, blockDim.x);
    }
    /* the norm weights do not depend on the kernel before either: the first two passes'
     * in registers (a 2,048-value row's all), the rest on their way to L2 */
    norm_wpre<2> wpre;
    if (NORM)
        norm_w_preload<2>(p.inw, 32 * p.nu, &wpre);
    strata_pdl_wait();
    strata_pdl_trigger();
    if (NORM) {
        /* every block normalises the rows itself (blockDim 256: quantize_q8_kernel's
         * order, so its bits); block 0 also leaves them in global memory */
        __shared__ float scratch[STRATA_GPU_MAX_WARP];
        const int ne0 = 32 * p.nu;
        /* the rows' padding zeroed: block 0 copies whole rows out */
        const int used = ne0 + ne0 / 8, pad = (int)p.xq_row - used;
        for (int i = threadIdx.x; i < n_slot * pad; i += blockDim.x)
            mvq_smem[(size_t)(i / pad) * p.xq_row + used + i % pad] = 0;
        for (int s = 0; s < n_slot; s++)
            norm_q8_row<false, false, 2>(p.xin + (int64_t)s * ne0, ne0, 1, p.inw, p.ineps,
                                         blockIdx.x == 0 && p.iny ? p.iny + (int64_t)s * ne0
                                                                  : NULL,
                                         mvq_smem + (size_t)s * p.xq_row, scratch, &wpre);
        __syncthreads();
        if (blockIdx.x == 0 && p.inyq)
            for (size_t i = threadIdx.x; i < (size_t)n_slot * p.xq_row / 16; i += blockDim.x)
                ((uint4 *)p.inyq)[i] = ((const uint4 *)mvq_smem)[i];
    }
    strata_tl_mark(24 + (RG == 4), blockIdx.x == 0);
    for (int it = 0; c < n_chunk; c += gridDim.x, buf ^= 1, it++) {
        if (bulk) {
            /* buffer buf's (it / 2)-th chunk; the other buffer was read before the last
             * iteration's closing barrier */
            if (threadIdx.x == 0 && c + (int)gridDim.x < n_chunk)
                mvq_chunk_bulk<T2>(p, c + gridDim.x, n1, ck, ck2, mvq_sbuf + (buf ^ 1) * cb,
                                   &mbar[buf ^ 1]);
            strata_mbar_wait(&mbar[buf], (unsigned)(it >> 1) & 1);
        } else {
            if (c + (int)gridDim.x < n_chunk) {
                const struct mvq_chunk_of q = mvq_chunk_at<T2>(p, c + gridDim.x, n1, ck, ck2);
                mvq_chunk_copy(mvq_sbuf + (buf ^ 1) * cb, q.w, q.c, q.ck, q.total);
            }
            strata_cp_async_commit();
            strata_cp_async_wait<1>();
            __syncthreads();
        }
        const struct mvq_chunk_of q = mvq_chunk_at<T2>(p, c, n1, ck, ck2);
        const size_t nb1 = q.second ? p.nb1_2 : p.nb1;
        size_t roff[RG];
#pragma unroll
        for (int r = 0; r < RG; r++)
            roff[r] = (size_t)(RG * grp + r) * nb1;
        const uint8_t *wb = mvq_sbuf + buf * cb;
        const int r0 = q.c * rows + RG * grp; /* rows of the chunk's weight */
        /* the slots' q8 rows: slot s reads row s / x_group, counted without a division */
        const uint8_t *xr = NORM ? mvq_smem : p.xq;
        for (int s = 0, sg = 0; s < n_slot; s++) {
            float acc[RG];
#pragma unroll
            for (int r = 0; r < RG; r++)
                acc[r] = 0.0f;
            if (T2 && q.second)
                mvq_stream_sums<T2 ? T2 : T, TPR, RG>(wb, roff, gl, tpr, p.nu, xr, acc);
            else
                mvq_stream_sums<T, TPR, RG>(wb, roff, gl, tpr, p.nu, xr, acc);
            /* two rows' sums in one shuffle tree: row r0 + r2 + h in lanes h tpr / 2 .. */
            const int h = gl >= tpr / 2;
#pragma unroll
            for (int r2 = 0; r2 < RG; r2 += 2) {
                const float a = mvq_group_sum2(acc[r2], acc[r2 + 1], tpr, h);
                const int r = r2 + h, col = q.col0 + r0 + r;
                const int64_t o = (int64_t)s * p.y_stride + col;
                if (gl == h * (tpr / 2) && r0 + r < q.ne1) {
                    const float v = (p.add ? p.add[o] : 0.0f) + a;
                    p.y[o] = v;
                    mvq_store16(p, s, col, v);
                    if (p.amax)
                        best = max(best, strata_argmax_key(v, col));
                    if (p.yh)
                        yh_s[RG * grp + r] = v;
                }
            }
            if (++sg == p.x_group) {
                sg = 0;
                xr += p.xq_row;
            }
        }
        if (p.post_cnt)
            mvq_post_chunk(p, q.col0 + q.c * rows, q.col0 + min((q.c + 1) * rows, q.ne1),
                           n_slot);
        __syncthreads();
        /* yh_s is written again only after the next chunk's barrier */
        if (p.yh && (int)threadIdx.x < rows && q.c * rows + (int)threadIdx.x < q.ne1)
            p.yh[q.col0 + q.c * rows + threadIdx.x] = yh_s[threadIdx.x];
    }
    if (p.amax) { /* the block's best key, then one atomic */
        /* the chunk buffers are free (the loop's last barrier; no copy in flight) */
        strata_cp_async_wait<0>();
        __syncthreads();
        unsigned long long *kb = (unsigned long long *)mvq_sbuf;
        for (int m = warpSize / 2; m > 0; m >>= 1)
            best = max(best, (unsigned long long)STRATA_SHFL_XOR(best, m));
        const int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
        if (lane == 0)
            kb[wid] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 1; i < (int)(blockDim.x / warpSize); i++)
                best = max(best, kb[i]);
            if (best)
                atomicMax(p.amax, best);
        }
    }
    strata_tl_mark(20 + (RG == 4), blockIdx.x == 0);
    strata_tl_mark(22 + (RG == 4), true);
}

/* Threads of a stream block for rows of nb1 bytes with tpr lanes a row (each chunk
 * <= MVQ_STREAM_CHUNK_MAX bytes, a multiple of 16), or 0 when no block size fits. */
static int mvq_stream_threads(size_t nb1, int tpr)
{
    for (int th = 256; th >= 64; th /= 2) {
        const size_t ck = (size_t)(th / tpr) * 2 * nb1;
        if (ck <= MVQ_STREAM_CHUNK_MAX)
            return ck % 16 ? 0 : th; /* chunks start on 16 bytes (cp.async) */
    }
    return 0;
}

/* STRATA_NO_MVQ_STREAM=1: large PLAIN products as mvq_kernel blocks (read once) */
STRATA_K_SWITCH_ON(mvq_stream_on, "STRATA_NO_MVQ_STREAM")

/* STRATA_NO_MVQ_BULK=1: streamed chunks copied 16 bytes a thread, not by the bulk copy
 * engine (read once) */
STRATA_K_SWITCH_ON(mvq_bulk_on, "STRATA_NO_MVQ_BULK")

/* STRATA_NO_MVQ_ROWS4=1: streamed Q6_K products two rows a lane group, not four (read
 * once) */
STRATA_K_SWITCH_ON(mvq_rows4_on, "STRATA_NO_MVQ_ROWS4")

/* Launches of mvq_stream_kernel so far (strata_k_mvq_stream_launches) */
static unsigned long mvq_stream_count;

unsigned long strata_k_mvq_stream_launches(void)
{
    return __atomic_load_n(&mvq_stream_count, __ATOMIC_RELAXED);
}

/* Per device and kernel instance: the dynamic shared memory the kernel was allowed
 * (cudaFuncSetAttribute applies to the current device only), and the blocks a
 * multiprocessor holds for the last (threads, smem) asked. */
#define MVQ_STREAM_DEVS 16
struct mvq_stream_cache {
    size_t smem_set[MVQ_STREAM_DEVS];
    int threads[MVQ_STREAM_DEVS], per[MVQ_STREAM_DEVS];
    size_t smem[MVQ_STREAM_DEVS];
};
static pthread_mutex_t mvq_stream_lock = PTHREAD_MUTEX_INITIALIZER;

/* Launch mvq_stream_kernel<T, TPR, NORM, T2, RG> with threads threads a block and as many
 * blocks as the device holds at once.  *done = 0 (and 0 returned) when the device cannot
 * run it with that shared memory, or holds fewer than min_per blocks a multiprocessor:
 * the caller launches another way. */
template <int T, int TPR, bool NORM, int T2 = 0, int RG = 2>
static int mvq_stream_launch_t(struct strata_gpu_ctx *ctx, const struct mvq_params &p0,
                               int n_slot, int threads, int *done, struct strata_err *err,
                               int min_per = 1)
{
    static struct mvq_stream_cache cache;
    struct mvq_params p = p0;
    const int rows = threads / p.tpr * RG;
    /* each buffer padded by 16 bytes (q6k_sums_words reads 2 past a row's end) */
    const size_t ck = (size_t)rows * p.nb1, ck2 = (size_t)rows * p.nb1_2; /* nb1_2 0: none */
    /* the bulk copy engine takes whole 16-byte pieces from 16-byte aligned addresses:
     * every chunk's, the last included (ck and ck2 are multiples of 16) */
    p.bulk = mvq_bulk_on() && (uintptr_t)p.w % 16 == 0 && (size_t)p.ne1 * p.nb1 % 16 == 0 &&
             (!T2 || ((uintptr_t)p.w2 % 16 == 0 && (size_t)p.ne1_2 * p.nb1_2 % 16 == 0));
    const size_t cb = (T2 && ck2 > ck ? ck2 : ck) + 16;
    const size_t smem = 2 * cb + (p.yh ? sizeof(float) * rows : 0) +
                        (NORM ? (size_t)n_slot * p.xq_row : 0);
    const int n1 = (int)((p.ne1 + rows - 1) / rows);
    const int n_chunk = n1 + (T2 ? (int)((p.ne1_2 + rows - 1) / rows) : 0);
    const int dev = ctx->info.device;
    const void *k = reinterpret_cast<const void *>(mvq_stream_kernel<T, TPR, NORM, T2, RG>);
    *done = 0;
    if (dev < 0 || dev >= MVQ_STREAM_DEVS ||
        (ctx->info.smem_optin && smem > ctx->info.smem_optin))
        return 0;
    int per = 0, ok = 1;
    pthread_mutex_lock(&mvq_stream_lock);
    if (smem > 48 * 1024 && smem > cache.smem_set[dev]) {
        if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            ok = 0;
        } else {
            cache.smem_set[dev] = smem;
        }
    }
    if (ok && (threads != cache.threads[dev] || smem != cache.smem[dev])) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cache.per[dev], k, threads, smem) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            cache.per[dev] = 0;
        }
        cache.threads[dev] = threads;
        cache.smem[dev] = smem;
    }
    if (ok)
        per = cache.per[dev];
    pthread_mutex_unlock(&mvq_stream_lock);
    if (per <= 0 || per < min_per)
        return 0;
    int blocks = per * ctx->info.n_sm;
    if (blocks > n_chunk)
        blocks = n_chunk;
    dim3 grid((unsigned)blocks), block((unsigned)threads);
    strata_k_launch_smem(ctx, mvq_stream_kernel<T, TPR, NORM, T2, RG>, grid, block, smem, p,
                         n_slot, n_chunk, n1, ck, ck2, cb);
    *done = 1;
    __atomic_add_fetch(&mvq_stream_count, 1, __ATOMIC_RELAXED);
    return strata_k_check(ctx, "mvq_stream_kernel", grid, block, err,
                          "type %u ne1=%d n_slot=%d tpr=%d rows=%d smem=%zu", (unsigned)T, p.ne1,
                          n_slot, p.tpr, rows, smem);
}

template <int T>
static int mvq_stream_launch(struct strata_gpu_ctx *ctx, const struct mvq_params &p,
                             int n_slot, int threads, int *done, struct strata_err *err)
{
    /* a second weight: the pairs a K-quant mix gives q/k and v (Q4_K_M, Q5_K_M: v in
     * Q6_K on some layers), with the input norm */
    if (p.w2) {
        *done = 0;
        if (!p.xin || p.w2_type != KT_Q6_K || (T != KT_Q4_K && T != KT_Q5_K))
            return 0;
        constexpr int t = T == KT_Q5_K ? KT_Q5_K : KT_Q4_K;
        return p.tpr == 32
                   ? mvq_stream_launch_t<t, 32, true, KT_Q6_K>(ctx, p, n_slot, threads, done, err)
                   : mvq_stream_launch_t<t, 0, true, KT_Q6_K>(ctx, p, n_slot, threads, done, err);
    }
    /* Q6_K rows of 32 lanes (the output projection): four rows a group, so that a
     * lane's activation part and a chunk's set-up serve twice the rows (fewer
     * instructions, docs/performance.md), in chunks of up to 64 KB: two blocks a
     * multiprocessor (where the device holds fewer, two rows a group) */
    if (T == KT_Q6_K && p.tpr == 32 && !p.post_cnt && threads == 256 &&
        (size_t)threads / 32 * 4 * p.nb1 <= 2 * MVQ_STREAM_CHUNK_MAX && mvq_rows4_on()) {
        const int rc =
            p.xin ? mvq_stream_launch_t<T, 32, true, 0, 4>(ctx, p, n_slot, threads, done, err, 2)
                  : mvq_stream_launch_t<T, 32, false, 0, 4>(ctx, p, n_slot, threads, done, err, 2);
        if (rc || *done)
            return rc;
    }
    if (p.xin)
        return p.tpr == 32 ? mvq_stream_launch_t<T, 32, true>(ctx, p, n_slot, threads, done, err)
                           : mvq_stream_launch_t<T, 0, true>(ctx, p, n_slot, threads, done, err);
    return p.tpr == 32 ? mvq_stream_launch_t<T, 32, false>(ctx, p, n_slot, threads, done, err)
                       : mvq_stream_launch_t<T, 0, false>(ctx, p, n_slot, threads, done, err);
}

static int mvq_tpr_cap = 32; /* strata_k_mvq_set_tpr_cap */

void strata_k_mvq_set_tpr_cap(int cap)
{
    mvq_tpr_cap = cap == 4 || cap == 8 || cap == 16 ? cap : 32;
}

int strata_k_mvq_tpr(int nu, int k)
{
    /* at most the cap, and each lane gets at least two units where the row has them */
    int items = nu * k, tpr = mvq_tpr_cap;
    while (tpr > 4 && 2 * tpr > items)
        tpr /= 2;
    return tpr;
}

int strata_k_matvec_q8_supported(uint32_t type)
{
    return type == KT_Q4_K || type == KT_Q5_K || type == KT_Q6_K || type == KT_Q8_0;
}

template <int T, int MODE, int R, int STAGE = 0>
static void mvq_launch(dim3 grid, dim3 block, const struct strata_gpu_ctx *ctx,
                       const struct mvq_params &p)
{
    strata_k_launch(ctx, mvq_kernel<T, MODE, R, STAGE>, grid, block, p);
}

/* A PLAIN launch's own rows asked for in L2 before its PDL wait (mvq_params.ahead):
 * on unless STRATA_NO_L2_AHEAD=1 (read once) */
STRATA_K_SWITCH_ON(mvq_ahead_on, "STRATA_NO_L2_AHEAD")

/* Staged PLAIN launches (mvq_kernel's STAGE) for the output projection: on unless
 * STRATA_NO_MVQ_STAGE=1 (read once) */
STRATA_K_SWITCH_ON(mvq_stage_on, "STRATA_NO_MVQ_STAGE")

int strata_k_matvec_q8(struct strata_gpu_ctx *ctx, const struct strata_k_mvq_args *a,
                       struct strata_err *err)
{
    const struct strata_k_weight *w = a->w;
    if (!strata_k_matvec_q8_supported(w->type))
        return strata_k_err(err, STRATA_E_UNSUPPORTED,
                            "matvec_q8: weight type %u has no 8-bit-activation kernel", w->type);
    int qk = strata_k_blck(w->type);
    int mode = a->mode;
    if (w->ne0 % qk || w->ne0 <= 0 || w->ne1 <= 0 || w->ne0 > INT32_MAX || w->ne1 > INT32_MAX ||
        a->n_slot <= 0 || a->n_slot > 65535 || a->x_group <= 0 || mode < 0 || mode > 2 ||
        (mode == STRATA_K_MVQ_COMBINE && (a->k <= 0 || !a->ids || !a->cw)))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: bad shape ne0=%lld ne1=%lld (block %d) n_slot=%d "
                            "x_group=%d mode=%d k=%d", (long long)w->ne0, (long long)w->ne1, qk,
                            a->n_slot, a->x_group, mode, a->k);
    if ((uintptr_t)a->xq & 15 || (uintptr_t)a->yq & 15 || (uintptr_t)w->data & 15 ||
        (w->nb1 & 1) || (w->nb2 & 1))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: weights or q8 rows not aligned (nb1=%zu)", w->nb1);
    if (mode == STRATA_K_MVQ_GLU &&
        (!a->up || a->up->type != w->type || a->up->ne0 != w->ne0 || a->up->ne1 != w->ne1 ||
         a->up->nb1 != w->nb1 || a->up->nb2 != w->nb2 || (a->yq && w->ne1 % MVQ_QROWS) ||
         (uintptr_t)a->up->data & 15))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: gate and up weights differ in type or shape, or a q8 "
                            "output of ne1=%lld rows (a multiple of %d)", (long long)w->ne1,
                            MVQ_QROWS);
    if (!a->y && !(mode == STRATA_K_MVQ_GLU && a->yq))
        return strata_k_err(err, STRATA_E_INVALID, "matvec_q8: no output");
    if (a->counter && mode != STRATA_K_MVQ_GLU &&
        (!a->nyq || (uintptr_t)a->nyq & 15 || w->ne1 % 32 || (a->y_stride & 3) ||
         (uintptr_t)a->y & 15 || (a->ny && (uintptr_t)a->ny & 15)))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: the fused RMSNorm needs q8 output rows, ne1=%lld a "
                            "multiple of 32 and 16-byte aligned rows", (long long)w->ne1);
    if ((w->type == KT_Q4_K || w->type == KT_Q5_K) && (w->nb1 & 15 || w->nb2 & 15))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: rows of this type must be 16-byte aligned (nb1=%zu)",
                            w->nb1);
    struct mvq_params p;
    p.w = (const uint8_t *)w->data;
    p.u = mode == STRATA_K_MVQ_GLU ? (const uint8_t *)a->up->data : NULL;
    p.nb1 = w->nb1;
    p.nb2 = w->nb2;
    p.ne1 = (int)w->ne1;
    p.nu = (int)(w->ne0 / 32);
    p.ids = a->ids;
    p.tab = a->ids && mode != STRATA_K_MVQ_PLAIN ? (const uint8_t *const *)a->etab : NULL;
    p.tab_w = mode == STRATA_K_MVQ_GLU ? 0 : 2;
    p.tab_slot = a->etab_slot;
    p.x_group = a->x_group;
    p.k = mode == STRATA_K_MVQ_COMBINE ? a->k : 1;
    p.cw = a->cw;
    p.xq = (const uint8_t *)a->xq;
    p.xq_row = strata_k_q8_row_bytes(w->ne0);
    p.y = a->y;
    p.y_stride = a->y_stride;
    p.add = a->add;
    p.yq = (uint8_t *)a->yq;
    p.yq_row = strata_k_q8_row_bytes(w->ne1);
    p.nw = a->nw;
    p.eps = a->eps;
    p.ny = a->ny;
    p.nyq = (uint8_t *)a->nyq;
    p.counter = mode == STRATA_K_MVQ_GLU ? NULL : a->counter;
    p.xin = NULL;
    p.inw = NULL;
    p.ineps = 0.0f;
    p.iny = NULL;
    p.inyq = NULL;
    p.ahead = mvq_ahead_on();
    p.amax = NULL;
    p.yh = NULL;
    p.y16 = mode == STRATA_K_MVQ_PLAIN ? a->y16 : NULL;
    p.y16_pos = a->y16_pos;
    p.y16_stride = a->y16_stride;
    p.post_cnt = NULL;
    p.w2 = NULL;
    p.nb1_2 = 0;
    p.ne1_2 = 0;
    p.w2_type = 0;
    p.tpr = strata_k_mvq_tpr(p.nu, p.k);
    p.rt_logits = NULL;
    p.rt_n = p.rt_k = p.rt_norm = 0;
    p.rt_scale = 0.0f;
    p.rt_ids = NULL;
    p.rt_w = NULL;
    for (int i = 0; i < 2; i++) {
        p.nl2[i] = (const uint8_t *)a->next_l2[i];
        p.nl2_bytes[i] = a->next_l2_bytes[i];
    }
    if (a->route_logits) {
        if (mode != STRATA_K_MVQ_GLU || !a->ids || a->etab || a->n_slot != a->x_group ||
            a->n_slot > 32 || a->route_n_expert < a->n_slot ||
            a->route_n_expert > ROUTE_MAX_EXPERT || !a->route_w)
            return strata_k_err(err, STRATA_E_INVALID,
                                "matvec_q8: routing in the launch needs a GLU product of one "
                                "token's k <= 32 experts (n_slot=%d x_group=%d n_expert=%d), "
                                "ids and weights to store and no expert table",
                                a->n_slot, a->x_group, a->route_n_expert);
        p.rt_logits = a->route_logits;
        p.rt_n = a->route_n_expert;
        p.rt_k = a->n_slot;
        p.rt_norm = a->route_norm;
        p.rt_scale = a->route_scale;
        p.rt_ids = (int32_t *)a->ids;
        p.rt_w = a->route_w;
    }
    const struct strata_k_weight *w2 = a->w2;
    if (w2 && (!a->w2_done || mode != STRATA_K_MVQ_PLAIN || a->ids ||
               !strata_k_matvec_q8_supported(w2->type) || w2->ne0 != w->ne0 || w2->ne1 <= 0 ||
               w2->ne1 > INT32_MAX - w->ne1 || (w2->nb1 & 1) || (uintptr_t)w2->data & 15 ||
               a->y_stride < w->ne1 + w2->ne1))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: a second weight needs a PLAIN product without ids, the "
                            "same ne0 (%lld, has %lld), aligned rows, room for its rows in y "
                            "and a done flag", (long long)w->ne0, w2 ? (long long)w2->ne0 : 0LL);
    if (w2)
        *a->w2_done = 0;
    if (a->argmax_key && (!a->argmax_done || mode != STRATA_K_MVQ_PLAIN || a->ids ||
                          a->n_slot != 1))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: an argmax key needs a PLAIN product of one slot and "
                            "a done flag (n_slot=%d)", a->n_slot);
    if (a->argmax_key)
        *a->argmax_done = 0;
    if (a->y_host && (!a->y_host_done || mode != STRATA_K_MVQ_PLAIN || a->ids ||
                      a->n_slot != 1 || a->w2))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: a host copy of the output needs a PLAIN product of one "
                            "slot without a second weight and a done flag (n_slot=%d)",
                            a->n_slot);
    if (a->y_host)
        *a->y_host_done = 0;
    const int64_t ne1_all = w->ne1 + (w2 ? w2->ne1 : 0);
    if (a->y16 && (mode != STRATA_K_MVQ_PLAIN || !a->y16_pos || a->y16_stride < ne1_all))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: a half copy of the output needs a PLAIN product, its "
                            "position and a row stride of at least its rows (%lld)",
                            (long long)ne1_all);
    if (a->post) {
        const struct strata_k_qkv_args *q = a->post;
        const int64_t hd = q->hd, heads = q->n_head + 2 * (int64_t)q->n_head_kv;
        if (!a->post_done || !a->post_counters || mode != STRATA_K_MVQ_PLAIN || a->ids ||
            a->x_group != 1 || hd <= 0 || hd > 512 || ne1_all % hd || ne1_all / hd > heads ||
            q->n_tok != a->n_slot ||
            q->q != a->y || q->k != a->y + q->n_head * hd || q->v != q->k + q->n_head_kv * hd ||
            q->q_stride != a->y_stride || q->k_stride != a->y_stride ||
            q->v_stride != a->y_stride || !q->rope || q->rope->n_rot > hd || q->rope->n_rot % 2)
            return strata_k_err(err, STRATA_E_INVALID,
                                "matvec_q8: the q/k/v post needs a PLAIN product of whole heads "
                                "(ne1=%lld, hd=%lld) into the q/k/v rows it names, one slot per "
                                "token, its counters and a done flag", (long long)ne1_all,
                                (long long)hd);
        *a->post_done = 0;
    }
    /* two rows per group share the activation loads of large matrices */
    int R = mode == STRATA_K_MVQ_GLU ? 2 : mode == STRATA_K_MVQ_PLAIN && w->ne1 >= 16384 ? 2 : 1;
    int rows = mode == STRATA_K_MVQ_GLU ? MVQ_QROWS : MVQ_THREADS / p.tpr * R;
    dim3 grid((unsigned)((w->ne1 + rows - 1) / rows), (unsigned)a->n_slot);
    dim3 block((unsigned)(rows / R * p.tpr));
    const int stage = mode == STRATA_K_MVQ_PLAIN && R == 2 && !p.tab && (w->type == KT_Q6_K ||
                                                               w->type == KT_Q8_0) &&
                      !(w->nb1 & 15) && !(w->nb2 & 15) && !((uintptr_t)w->data & 15) &&
                      p.xq_row + (size_t)rows * w->nb1 <= MVQ_STAGE_BYTES &&
                      (a->stage == 1 || (a->stage == 0 && mvq_stage_on()));
    /* large dense products (the output projection; R == 2 picks them), and products
     * that normalise their input themselves: streamed */
    const int sthreads = mvq_stream_threads(w->nb1, p.tpr);
    const int in_norm = a->x_in && a->in_norm;
    if (in_norm && (mode != STRATA_K_MVQ_PLAIN || a->ids || p.counter || a->x_group != 1 ||
                    !a->in_norm->w || !a->in_norm->yq || (uintptr_t)a->in_norm->yq & 15 ||
                    (uintptr_t)a->in_norm->y & 15))
        return strata_k_err(err, STRATA_E_INVALID,
                            "matvec_q8: an input RMSNorm needs a PLAIN product without expert "
                            "ids, one slot per input row and 16-byte aligned q8 (and float) "
                            "output rows");
    /* the input norm inside the launch: 256 threads (quantize_q8_kernel's sum order) */
    const int stream_norm = in_norm && sthreads == 256 && !((uintptr_t)w->data & 15) &&
                            a->stage >= 0 && mvq_stream_on();
    /* else the norm as its own launch first; the product then reads its q8 rows */
    auto norm_first = [&]() {
        p.xin = NULL;
        p.xq = (const uint8_t *)a->in_norm->yq;
        return strata_k_quantize_q8(ctx, a->x_in, w->ne0, (int)w->ne0, a->n_slot, 1,
                                    a->in_norm->w, a->in_norm->eps, a->in_norm->y,
                                    a->in_norm->yq, err);
    };
    if (in_norm && !stream_norm) {
        int rc = norm_first();
        if (rc)
            return rc;
    }
    if (stream_norm) {
        p.xin = a->x_in;
        p.inw = a->in_norm->w;
        p.ineps = a->in_norm->eps;
        p.iny = a->in_norm->y;
        p.inyq = (uint8_t *)a->in_norm->yq;
    }
    if (mode == STRATA_K_MVQ_PLAIN && !a->ids && !p.counter && sthreads &&
        !((uintptr_t)w->data & 15) &&
        (stream_norm || a->stage == 2 || (a->stage == 0 && R == 2 && mvq_stream_on()))) {
        int done = 0, rc = 0;
        /* the q/k/v post where a chunk of rows touches few enough heads */
        const int srows = sthreads / p.tpr * 2;
        if (a->post && (srows + a->post->hd - 1) / a->post->hd + 1 <= MVQ_POST_HEADS &&
            qkv_post_threads(a->post->hd) <= sthreads) {
            p.post_cnt = a->post_counters;
            p.post = *a->post;
            p.rope = *a->post->rope;
        }
        /* the second weight where its rows stream in the same chunks (16-byte pieces) */
        if (w2 && stream_norm && mvq_stream_threads(w2->nb1, p.tpr) == sthreads) {
            p.w2 = (const uint8_t *)w2->data;
            p.nb1_2 = w2->nb1;
            p.ne1_2 = (int)w2->ne1;
            p.w2_type = (int)w2->type;
        }
        p.amax = a->argmax_key;
        p.yh = a->y_host;
        auto stream = [&]() {
            switch (w->type) {
            case KT_Q4_K: return mvq_stream_launch<KT_Q4_K>(ctx, p, a->n_slot, sthreads, &done, err);
            case KT_Q5_K: return mvq_stream_launch<KT_Q5_K>(ctx, p, a->n_slot, sthreads, &done, err);
            case KT_Q6_K: return mvq_stream_launch<KT_Q6_K>(ctx, p, a->n_slot, sthreads, &done, err);
            case KT_Q8_0: return mvq_stream_launch<KT_Q8_0>(ctx, p, a->n_slot, sthreads, &done, err);
            }
            return 0;
        };
        rc = stream();
        if (p.w2 && !done && !rc) {
            /* no kernel for the pair: w alone */
            p.w2 = NULL;
            p.ne1_2 = 0;
            rc = stream();
        }
        if (done && p.w2)
            *a->w2_done = 1;
        if (done && p.post_cnt)
            *a->post_done = 1;
        if (done && p.amax)
            *a->argmax_done = 1;
        if (done && p.yh)
            *a->y_host_done = 1;
        if (done || rc)
            return rc;
        p.post_cnt = NULL;
        p.w2 = NULL;
        p.amax = NULL;
        p.yh = NULL;
        /* the device cannot hold that launch */
        if (stream_norm && (rc = norm_first()))
            return rc;
    }
    switch (w->type) {
#define CASE(T)                                                                               \
    case T:                                                                                   \
        if (mode == STRATA_K_MVQ_GLU)                                                         \
            mvq_launch<T, STRATA_K_MVQ_GLU, 2>(grid, block, ctx, p);                  \
        else if (mode == STRATA_K_MVQ_COMBINE)                                                \
            mvq_launch<T, STRATA_K_MVQ_COMBINE, 1>(grid, block, ctx, p);              \
        else if (R == 2 && stage)                                                             \
            mvq_launch<T, STRATA_K_MVQ_PLAIN, 2, 1>(grid, block, ctx, p);             \
        else if (R == 2)                                                                      \
            mvq_launch<T, STRATA_K_MVQ_PLAIN, 2>(grid, block, ctx, p);                \
        else                                                                                  \
            mvq_launch<T, STRATA_K_MVQ_PLAIN, 1>(grid, block, ctx, p);                \
        break;
        CASE(KT_Q4_K)
        CASE(KT_Q5_K)
        CASE(KT_Q6_K)
        CASE(KT_Q8_0)
#undef CASE
    }
    return strata_k_check(ctx, "mvq_kernel", grid, block, err,
                          "type %u ne0=%lld ne1=%lld n_slot=%d mode=%d k=%d tpr=%d", w->type,
                          (long long)w->ne0, (long long)w->ne1, a->n_slot, mode, p.k, p.tpr);
}
