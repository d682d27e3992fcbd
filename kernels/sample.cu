/* sample.cu - argmax and top-k of logits rows on the device: what sampling needs of a
 * step's logits (greedy: the id; top-k sampling: the k largest), so that a row of a
 * 151,936-token vocabulary (608 KB) need not come back to the host. */
#include "kernels.h"

#include <math.h>

static __device__ void better(float *v, int *i, float ov, int oi)
{
    if (ov > *v || (ov == *v && oi < *i)) {
        *v = ov;
        *i = oi;
    }
}

static __device__ void block_argmax(float *v, int *i, float *sv, int *si)
{
    for (int m = warpSize / 2; m > 0; m >>= 1)
        better(v, i, STRATA_SHFL_XOR(*v, m), STRATA_SHFL_XOR(*i, m));
    int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    __syncthreads();
    if (lane == 0) {
        sv[wid] = *v;
        si[wid] = *i;
    }
    __syncthreads();
    *v = sv[0];
    *i = si[0];
    for (int w = 1; w < (int)(blockDim.x / warpSize); w++)
        better(v, i, sv[w], si[w]);
}

/* Block row: the index of the row's largest logit (the lowest among equal ones);
 * NaN logits never win (they compare false): -1 when no logit is a number. */
__global__ void argmax_kernel(const float *__restrict__ logits, int n, int32_t *__restrict__ ids)
{
    __shared__ float sv[STRATA_GPU_MAX_WARP];
    __shared__ int si[STRATA_GPU_MAX_WARP];
    const float *lr = logits + (int64_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        float x = lr[e];
        if (x > bv || (x == bv && e < bi)) {
            bv = x;
            bi = e;
        }
    }
    block_argmax(&bv, &bi, sv, si);
    if (threadIdx.x == 0)
        ids[blockIdx.x] = bi == 0x7fffffff ? -1 : bi;
}

/* ---- top-k: a sort of 64-bit keys in shared memory, per part of the row, then of
 * the parts' best ----
 * key = (the logit's bits mapped to an unsigned order) << 32 | ~id, so that a larger
 * key is a larger logit, or the lower id of an equal one; -0 is taken as +0 (equal, as
 * the host compares them); NaN is key 0, below every number, like the padding. */
#define TOPK_SORT 4096 /* keys sorted at once: 32 KB of shared memory */
#define TOPK_THREADS 1024

static __device__ __forceinline__ uint64_t topk_key(float v, int i)
{
    return strata_argmax_key(v, i);
}

/* s [m] in descending order (bitonic network; m a power of two, 2..TOPK_SORT; the
 * block's threads share it).  A stage moves every key through shared memory (8 bytes
 * read and written), so its time is about m x 16 bytes over one multiprocessor's
 * shared-memory bandwidth: sort no more keys than there are.  Thread t compares pairs
 * t, t + blockDim.x, ...: at a stride of at most the warp size a warp's pairs lie in
 * 2 x warpSize keys of its own, so such a stage after another needs only the warp's
 * own barrier (50 of the 78 stages for 4,096 keys on a 32-wide warp); the block's is
 * taken around a stage that crosses warps and after the load. */
static __device__ void topk_sort_desc(uint64_t *s, int m)
{
    for (int size = 2; size <= m; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            /* the stage before: (size / 2, 1), or the load (0) before the first */
            const int prev = stride == size >> 1 ? (size == 2 ? 0 : 1) : 2 * stride;
            if (stride > warpSize || prev > warpSize || prev == 0)
                __syncthreads();
            else
                STRATA_SYNC_WARP();
            for (int t = threadIdx.x; t < m / 2; t += blockDim.x) {
                const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
                const uint64_t a = s[lo], b = s[hi];
                if ((a < b) == ((lo & size) == 0)) {
                    s[lo] = b;
                    s[hi] = a;
                }
            }
        }
    __syncthreads();
}

/* the smallest power of two >= x, at least 2 */
static __device__ __forceinline__ int topk_pow2(int x)
{
    int m = 2;
    while (m < x)
        m <<= 1;
    return m;
}

/* ---- the k best of a sort's keys without sorting them all ----
 * Split the keys into G >= k groups; the k-th largest group maximum T is at most the
 * k-th largest key (the k groups whose maximum is >= T hold k keys >= T), so the k best
 * are among the keys >= T.  With logits in no particular order these are a few k of the
 * 4,096, ranked against each other; where more pass (a part in ascending order, many
 * equal logits) the whole sort runs instead.  The same k keys in the same order either
 * way. */
#define TOPK_GROUPS 256 /* group maxima at most */
#define TOPK_CAND 512   /* keys the filter may keep */
struct topk_filter {
    uint64_t gmax[TOPK_GROUPS];
    uint64_t cand[TOPK_CAND];
    uint64_t t;
    int n_cand;
};

/* s [m] (m a power of two, at most 4 blockDim; keys past count are 0): the k largest
 * keys at s [0..k) in descending order (the rest of s undefined), as topk_sort_desc
 * leaves them.  Every thread of the block calls it.  filter 0: the whole sort
 * (STRATA_NO_TOPK_FILTER=1, for measurements). */
static __device__ void topk_select(uint64_t *s, int m, int count, int k, struct topk_filter &f,
                                   int filter)
{
    /* groups of 4 x lanes keys: the most lanes (at most 32) that leave k groups of count */
    int lanes = 1;
    while (lanes < 32 && 8 * lanes * k <= count)
        lanes <<= 1;
    /* groups past count hold only zeros: not ranked */
    const int gs = 4 * lanes, G = (count + gs - 1) / gs, t = threadIdx.x;
    if (!filter || m < 256 || 4 * (int)blockDim.x < m || gs * k > count || G > TOPK_GROUPS ||
        lanes > warpSize) {
        topk_sort_desc(s, m);
        return;
    }
    __syncthreads(); /* s as loaded */
    uint64_t mx = 0;
    if (t < m / 4)
        for (int j = 0; j < 4; j++)
            mx = max(mx, s[4 * t + j]);
    for (int o = 1; o < lanes; o <<= 1)
        mx = max(mx, (uint64_t)STRATA_SHFL_XOR(mx, o));
    if (t < m / 4 && t % lanes == 0 && t / lanes < G)
        f.gmax[t / lanes] = mx;
    if (t == 0)
        f.n_cand = 0;
    __syncthreads();
    if (t < G) { /* the rank of group t's maximum (equal ones, zeros, by index) */
        const uint64_t v = f.gmax[t];
        int r = 0;
        for (int g = 0; g < G; g++) {
            const uint64_t o = f.gmax[g];
            r += o > v || (o == v && g < t);
        }
        if (r == k - 1)
            f.t = v;
    }
    __syncthreads();
    const uint64_t T = f.t;
    if (T == 0) { /* fewer than k groups hold a number */
        topk_sort_desc(s, m);
        return;
    }
    if (t < m / 4)
        for (int j = 0; j < 4; j++) {
            const uint64_t v = s[4 * t + j];
            if (v >= T) {
                const int p = atomicAdd(&f.n_cand, 1);
                if (p < TOPK_CAND)
                    f.cand[p] = v;
            }
        }
    __syncthreads();
    const int nc = f.n_cand;
    if (nc > TOPK_CAND) {
        topk_sort_desc(s, m);
        return;
    }
    /* keys >= T > 0 are distinct: a candidate's place is the number larger than it */
    uint64_t mine = 0;
    int r = k;
    if (t < nc) {
        mine = f.cand[t];
        r = 0;
        for (int i = 0; i < nc; i++)
            r += f.cand[i] > mine;
    }
    if (r < k)
        s[r] = mine;
    __syncthreads();
}

/* the sorted keys s [k] as ids and values at [row * k ..]: a key 0 (no number left)
 * gives id -1 and -inf */
static __device__ void topk_write(const uint64_t *s, int k, int row, int32_t *ids, float *vals)
{
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const uint64_t key = s[j];
        const uint32_t o = (uint32_t)(key >> 32);
        const uint32_t b = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
        if (ids)
            ids[(int64_t)row * k + j] = key ? (int32_t)~(uint32_t)key : -1;
        if (vals)
            vals[(int64_t)row * k + j] = key ? __uint_as_float(b) : -INFINITY;
    }
}

/* Block (b, row): the k best keys of its part of the row (span logits) into
 * part [(row * P + b) * k ..], k <= TOPK_SORT / 2 - or, the row's only part, straight
 * into ids and vals.  A part longer than TOPK_SORT is taken in pieces: the k best so
 * far stay at the front while the rest refills. */
__global__ void topk_part_kernel(const float *__restrict__ logits, int n, int span, int k,
                                 uint64_t *__restrict__ part, int32_t *ids, float *vals,
                                 int filter, float *__restrict__ pmax)
{
    __shared__ uint64_t s[TOPK_SORT];
    __shared__ struct topk_filter f;
    __shared__ float smx[STRATA_GPU_MAX_WARP];
    const float *lr = logits + (int64_t)blockIdx.y * n;
    const int begin = blockIdx.x * span, end = min(n, begin + span);
    const int m = span > TOPK_SORT ? TOPK_SORT : topk_pow2(max(span, k));
    int have = 0;
    float mx = -INFINITY; /* the part's largest number (pmax) */
    for (int pos = begin;;) {
        for (int j = have + threadIdx.x; j < m; j += blockDim.x) {
            const int e = pos + j - have;
            const float v = e < end ? lr[e] : -INFINITY;
            mx = fmaxf(mx, v);
            s[j] = e < end ? topk_key(v, e) : 0;
        }
        const int count = have + max(0, min(m - have, end - pos));
        pos += m - have;
        topk_select(s, m, count, k, f, filter);
        have = k;
        if (pos >= end)
            break;
    }
    if (gridDim.x == 1) {
        topk_write(s, k, blockIdx.y, ids, vals);
        return;
    }
    uint64_t *out = part + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * k;
    for (int j = threadIdx.x; j < k; j += blockDim.x)
        out[j] = s[j];
    if (pmax) {
        mx = strata_block_max(mx, smx);
        if (threadIdx.x == 0)
            pmax[(int64_t)blockIdx.y * gridDim.x + blockIdx.x] = mx;
    }
}

/* The block's sum in double of expf(l - mx) over the numbers l of lr [begin, end)
 * (thread t adds every blockDim-th, then the warps' shuffle trees, then the warps in
 * order), returned to thread 0; ssum: STRATA_GPU_MAX_WARP doubles of shared memory. */
static __device__ double lse_block_sum(const float *lr, int begin, int end, float mx,
                                       double *ssum)
{
    double sum = 0;
    for (int e = begin + threadIdx.x; e < end; e += blockDim.x) {
        const float x = lr[e];
        if (x == x)
            sum += (double)expf(x - mx);
    }
    const int lane = threadIdx.x % warpSize, wid = threadIdx.x / warpSize;
    for (int m = warpSize / 2; m > 0; m >>= 1)
        sum += STRATA_SHFL_XOR(sum, m);
    if (lane == 0)
        ssum[wid] = sum;
    __syncthreads();
    double t = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x / warpSize); w++)
            t += ssum[w];
    return t;
}

/* the largest of a row's parts' maxima (logsumexp_kernel's mx) */
static __device__ __forceinline__ float lse_row_max(const float *pmax, int n_part)
{
    float mx = pmax[0];
    for (int i = 1; i < n_part; i++)
        mx = fmaxf(mx, pmax[i]);
    return mx;
}

/* Block (b, row): the sum in double of expf(l - mx) over the numbers l of its part of
 * the row (span logits), mx the row's largest (its parts' pmax), into
 * psum [row * gridDim.x + b]. */
__global__ void lse_part_kernel(const float *__restrict__ logits, int n, int span,
                                const float *__restrict__ pmax, double *__restrict__ psum)
{
    __shared__ double ssum[STRATA_GPU_MAX_WARP];
    const float *lr = logits + (int64_t)blockIdx.y * n;
    const int begin = blockIdx.x * span, end = min(n, begin + span);
    const float mx = lse_row_max(pmax + (int64_t)blockIdx.y * gridDim.x, gridDim.x);
    const double t = lse_block_sum(lr, begin, end, mx, ssum);
    if (threadIdx.x == 0)
        psum[(int64_t)blockIdx.y * gridDim.x + blockIdx.x] = t;
}

/* Block row: the k best of the row's n_part * k part keys (<= TOPK_SORT) into ids and
 * vals [row * k ..]. */
__global__ void topk_final_kernel(const uint64_t *__restrict__ part, int n_part, int k,
                                  int32_t *__restrict__ ids, float *__restrict__ vals, int filter,
                                  const float *__restrict__ pmax,
                                  const double *__restrict__ psum, double *__restrict__ lse)
{
    if (lse && threadIdx.x == 0) { /* the parts' sums in order (lse_part_kernel) */
        const int64_t r = (int64_t)blockIdx.x * n_part;
        double t = 0;
        for (int i = 0; i < n_part; i++)
            t += psum[r + i];
        lse[blockIdx.x] = (double)lse_row_max(pmax + r, n_part) + log(t);
    }
    __shared__ uint64_t s[TOPK_SORT];
    __shared__ struct topk_filter f;
    const uint64_t *pr = part + (int64_t)blockIdx.x * n_part * k;
    const int m = topk_pow2(n_part * k);
    for (int j = threadIdx.x; j < m; j += blockDim.x)
        s[j] = j < n_part * k ? pr[j] : 0;
    topk_select(s, m, n_part * k, k, f, filter);
    topk_write(s, k, blockIdx.x, ids, vals);
}

/* Block row: log sum_i exp(l_i) of the row, as strata_sampler_log_sum_exp computes it
 * (the largest, plus the log of the float exponentials relative to it summed in
 * double; the sum's order differs) into out[row].  NaN logits are skipped. */
__global__ void logsumexp_kernel(const float *__restrict__ logits, int n, double *out)
{
    __shared__ float smx[STRATA_GPU_MAX_WARP];
    __shared__ double ssum[STRATA_GPU_MAX_WARP];
    const float *lr = logits + (int64_t)blockIdx.x * n;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < n; e += blockDim.x)
        mx = fmaxf(mx, lr[e]);
    mx = strata_block_max(mx, smx);
    const double t = lse_block_sum(lr, 0, n, mx, ssum);
    if (threadIdx.x == 0)
        out[blockIdx.x] = (double)mx + log(t);
}

#ifdef STRATA_GPU_HOST_PASS
int strata_k_logsumexp(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                       double *out, struct strata_err *err)
{
    if (n <= 0 || n_rows <= 0)
        return strata_k_err(err, STRATA_E_INVALID, "logsumexp: bad shape n=%d n_rows=%d", n,
                            n_rows);
    dim3 grid((unsigned)n_rows), block(1024);
    logsumexp_kernel<<<grid, block, 0, ctx->stream>>>(logits, n, out);
    return strata_k_check(ctx, "logsumexp_kernel", grid, block, err, "n=%d n_rows=%d", n,
                          n_rows);
}

/* parts per row: as many TOPK_SORT pieces as the row has, at most what the final sort
 * holds */
static int topk_parts(int n, int k)
{
    int p = (n + TOPK_SORT - 1) / TOPK_SORT, pmax = TOPK_SORT / k;
    return p < pmax ? p : pmax;
}

/* scratch: the parts' keys [n_rows * P * k], then (strata_k_topk_lse) their maxima
 * [n_rows * P] (floats, padded to 8 bytes) and sums [n_rows * P] (doubles) */
size_t strata_k_topk_scratch(int n, int n_rows, int k)
{
    if (n <= 0 || n_rows <= 0 || k <= 0 || k > STRATA_K_TOPK_MAX)
        return 0;
    const size_t np = (size_t)n_rows * (size_t)topk_parts(n, k);
    return np * (size_t)k * sizeof(uint64_t) + (np + 1) / 2 * 8 + np * sizeof(double);
}

int strata_k_topk(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows, int k,
                  void *scratch, int32_t *ids, float *vals, struct strata_err *err)
{
    return strata_k_topk_lse(ctx, logits, n, n_rows, k, scratch, ids, vals, NULL, err);
}

int strata_k_topk_lse(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                      int k, void *scratch, int32_t *ids, float *vals, double *lse,
                      struct strata_err *err)
{
    if (n <= 0 || n_rows <= 0 || k <= 0 || k > STRATA_K_TOPK_MAX || k > n || !scratch)
        return strata_k_err(err, STRATA_E_INVALID, "topk: bad shape n=%d n_rows=%d k=%d (k <= "
                            "%d, scratch %s)", n, n_rows, k, STRATA_K_TOPK_MAX,
                            scratch ? "given" : "missing");
    static int no_filter = -1;
    const int filter = !strata_k_switch_off("STRATA_NO_TOPK_FILTER", &no_filter);
    const int parts = topk_parts(n, k), span = (n + parts - 1) / parts;
    dim3 grid((unsigned)parts, (unsigned)n_rows), block(TOPK_THREADS);
    const size_t np = (size_t)n_rows * (size_t)parts;
    static int no_parts = -1;
    float *pmax = lse && parts > 1 && !strata_k_switch_off("STRATA_NO_LSE_PARTS", &no_parts)
                      ? (float *)((char *)scratch + np * (size_t)k * sizeof(uint64_t))
                      : NULL;
    double *psum = pmax ? (double *)((char *)pmax + (np + 1) / 2 * 8) : NULL;
    topk_part_kernel<<<grid, block, 0, ctx->stream>>>(logits, n, span, k, (uint64_t *)scratch,
                                                       ids, vals, filter, pmax);
    int rc = strata_k_check(ctx, "topk_part_kernel", grid, block, err, "n=%d n_rows=%d k=%d", n,
                            n_rows, k);
    if (!rc && pmax) {
        lse_part_kernel<<<grid, block, 0, ctx->stream>>>(logits, n, span, pmax, psum);
        rc = strata_k_check(ctx, "lse_part_kernel", grid, block, err, "n=%d n_rows=%d parts=%d",
                            n, n_rows, parts);
    }
    if (!rc && parts > 1) { /* (one part: its block wrote the row's k best) */
        dim3 g2((unsigned)n_rows);
        topk_final_kernel<<<g2, block, 0, ctx->stream>>>((const uint64_t *)scratch, parts, k,
                                                          ids, vals, filter, pmax, psum,
                                                          pmax ? lse : NULL);
        rc = strata_k_check(ctx, "topk_final_kernel", g2, block, err,
                            "n_part=%d n_rows=%d k=%d", parts, n_rows, k);
    }
    /* one part, or STRATA_NO_LSE_PARTS=1 (for measurements): the one-block kernel */
    if (!rc && lse && !pmax)
        rc = strata_k_logsumexp(ctx, logits, n, n_rows, lse, err);
    return rc;
}

int strata_k_argmax(struct strata_gpu_ctx *ctx, const float *logits, int n, int n_rows,
                    int32_t *ids, struct strata_err *err)
{
    if (n <= 0 || n_rows <= 0)
        return strata_k_err(err, STRATA_E_INVALID, "argmax: bad shape n=%d n_rows=%d", n,
                            n_rows);
    dim3 grid((unsigned)n_rows), block(1024);
    argmax_kernel<<<grid, block, 0, ctx->stream>>>(logits, n, ids);
    return strata_k_check(ctx, "argmax_kernel", grid, block, err, "n=%d n_rows=%d", n, n_rows);
}
#endif
